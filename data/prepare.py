"""
Prepare a text dataset for nanoMeSH: tokenize it into train.bin / val.bin plus meta.json.

    python data/prepare.py --dataset shakespeare_char           # Tiny Shakespeare, characters
    python data/prepare.py --dataset shakespeare                # Tiny Shakespeare, GPT-2 BPE
    python data/prepare.py --dataset pydoc                      # offline: Python's pydoc topics
    python data/prepare.py --dataset mytext --input my.txt [--tokenizer char|gpt2|PATH] [--num_proc 4]
    python data/prepare.py --dataset mytext --input my.txt --tokenizer pythia-160m --format indexed
    python data/prepare.py --indexed data/pile/document --tokenizer pythia-160m/tokenizer.json

Writes OUT_ROOT/NAME/{train.bin,val.bin,meta.json} (OUT_ROOT defaults to this folder).
The .bin files are flat arrays of token ids (uint16, or uint32 when the vocabulary is
larger than 65535); the first 90% of the tokens are train, the last 10% val. meta.json
records the tokenizer, vocab_size, dtype, token counts, the source and its sha256.
--tokenizer PATH is a byte-level BPE tokenizer.json (or a Hugging Face model folder holding
one), e.g. Pythia's GPT-NeoX tokenizer (data/bpe.py); it is copied into NAME/, so the dataset
decodes without the original. --format indexed writes NAME/document.{bin,idx} instead, the
Megatron / GPT-NeoX format (data/indexed.py), in sequences of --seq_len tokens, the last 1% of
them held out for validation. --indexed PATH writes only meta.json (and the tokenizer's copy)
beside an indexed dataset made elsewhere, e.g. Pythia's pre-tokenized Pile: train.py then reads
it where it is. --num_proc N tokenizes in N processes, with the same output as one.

Tiny Shakespeare is downloaded (to OUT_ROOT/NAME/input.txt) and checked against its
known sha256 before use; --url or the NANOMESH_SHAKESPEARE_URL environment variable
replace the address (e.g. a mirror or a file:// URL). --input FILE uses a local copy
instead (its hash is recorded, not enforced). The GPT-2 vocabulary comes from tiktoken;
offline, point TIKTOKEN_CACHE_DIR at a folder holding tiktoken's cached files.

Files of any size are streamed in chunks of about chunk_bytes, cut after a newline, so
memory stays bounded. GPT-2 BPE is applied per chunk, which is what you get by splitting
the text after newlines and encoding the pieces separately. Outputs are staged in a
temporary folder (.NAME.tmp-PID-*) and moved into place at the end, meta.json last, so an
error never leaves a half-written dataset; the staging folders of killed prepares are removed
by the next one. load_split checks the .bin files against meta.json before they are used.
"""
import argparse
import contextlib
import functools
import hashlib
import http.client
import io
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

import numpy as np

if __package__ in (None, ""):  # run as a script (python data/prepare.py): the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.bpe import ByteLevelBPE, TokenizerFileError  # noqa: E402
from data.indexed import IndexedDataset, indexed_prefix, train_sequences, write_index  # noqa: E402

DEFAULT_OUT_ROOT = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DATASETS = {"shakespeare_char": "char", "shakespeare": "gpt2", "pydoc": "char"}  # name -> tokenizer
GPT2_VOCAB_SIZE = 50257  # ids >= this are the model's padding (it rounds up to 50304)
PROGRESS_BYTES = 64 << 20  # one progress line per 64 MiB read
SCAN_BYTES = 1 << 30  # load_split checks every token id of a split up to 1 GiB; beyond, SCAN_PIECES evenly spread
SCAN_PIECES = 256     # pieces of SCAN_PIECE_BYTES (the first and the last included), so a huge dataset starts fast
SCAN_PIECE_BYTES = 1 << 20


class PrepareError(Exception):
    """A problem with the data the user can fix; the CLI prints it as one line."""


class DownloadError(PrepareError):
    """The download itself failed (offline, bad address), as opposed to a bad file."""

    def __init__(self, url, reason, dataset):
        self.url, self.reason = url, reason
        super().__init__(f"could not download {url} ({reason}); prepare it from a local copy with: "
                         f"python data/prepare.py --dataset {dataset} --input FILE")


def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def dtype_for_vocab(vocab_size):
    return "uint16" if vocab_size <= 65535 else "uint32"


class Tokenizer:
    """Character-level, GPT-2 BPE, or a byte-level BPE tokenizer.json (GPT-NeoX / Pythia's; see data/bpe.py),
    (de)serialized as the tokenizer part of meta.json."""

    def __init__(self, kind, chars=None, encoding="gpt2", path=None):
        self.kind = kind
        if kind == "char":
            self.chars = list(chars)
            if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
                raise PrepareError("char vocabulary must be distinct single characters")
            # ids are positions in self.chars; a sorted copy of the code points lets numpy
            # map a whole chunk at once with searchsorted, whatever order chars came in
            cps = np.array([ord(c) for c in self.chars], dtype=np.uint32)
            self._order = np.argsort(cps)
            self._sorted = cps[self._order]
            self.vocab_size = len(self.chars)
        elif kind == "gpt2":
            self.encoding = encoding
            try:
                import tiktoken  # lazily: char-level users never need it
                self._enc = tiktoken.get_encoding(encoding)
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"[:160]  # requests' errors can be very long
                raise PrepareError(
                    f"the GPT-2 vocabulary could not be loaded ({reason}); tiktoken "
                    "downloads it once, so offline set TIKTOKEN_CACHE_DIR to a folder holding "
                    "tiktoken's cached files") from None
            self.vocab_size = self._enc.n_vocab
        elif kind == "bpe":
            try:
                self._bpe = ByteLevelBPE(path)
            except TokenizerFileError as e:
                raise PrepareError(str(e)) from None
            self.path, self.vocab_size = self._bpe.file, self._bpe.vocab_size
        else:
            raise PrepareError(f"unknown tokenizer {kind!r}; use 'char', 'gpt2' or the path of a tokenizer.json "
                               f"(or of a Hugging Face model folder holding one)")

    @classmethod
    def from_meta(cls, meta, folder=None):
        """folder: the dataset folder, where a byte-level BPE's tokenizer.json is kept."""
        if meta["tokenizer"] == "char":
            return cls("char", chars=meta["chars"])
        if meta["tokenizer"] == "bpe":
            tok = cls("bpe", path=os.path.join(folder or ".", meta.get("tokenizer_file", "tokenizer.json")))
            if tok.identity != meta.get("tokenizer_sha256", tok.identity):
                raise PrepareError(f"{tok.path} is not the tokenizer this dataset was made with (its sha256 differs "
                                   f"from meta.json's); prepare the dataset again")
            return tok
        return cls(meta["tokenizer"], encoding=meta.get("encoding", "gpt2"))

    @classmethod
    def load(cls, path):
        """path: a dataset folder or its meta.json."""
        if os.path.isdir(path):
            path = os.path.join(path, "meta.json")
        return cls.from_meta(read_meta(path), os.path.dirname(path))

    def to_meta(self):
        if self.kind == "char":
            return {"tokenizer": "char", "chars": "".join(self.chars), "vocab_size": self.vocab_size}
        if self.kind == "bpe":  # the file itself is copied next to meta.json
            return {"tokenizer": "bpe", "tokenizer_file": "tokenizer.json", "tokenizer_sha256": self.identity,
                    "vocab_size": self.vocab_size}
        return {"tokenizer": "gpt2", "encoding": self.encoding, "vocab_size": self.vocab_size}

    @property
    def identity(self):
        """Equal for two tokenizers that give the same ids: a BPE's fingerprint (data/bpe.py), else its meta."""
        if self.kind == "bpe":
            return self._bpe.fingerprint
        return json.dumps(self.to_meta(), sort_keys=True)

    @property
    def eot_id(self):
        """The end-of-text token's id, or None (character vocabularies have none)."""
        if self.kind == "gpt2":
            return self._enc.eot_token
        return self._bpe.eot_id if self.kind == "bpe" else None

    def spec(self):
        """Keyword arguments that build this tokenizer again (in a worker process)."""
        return {"kind": self.kind, "chars": getattr(self, "chars", None), "encoding": getattr(self, "encoding", "gpt2"),
                "path": getattr(self, "path", None)}

    def encode_array(self, text):
        if self.kind == "gpt2":
            return np.array(self._enc.encode(text, allowed_special={"<|endoftext|>"}), dtype=np.int64)
        if self.kind == "bpe":
            return np.array(self._bpe.encode(text), dtype=np.int64)
        cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        pos = np.minimum(np.searchsorted(self._sorted, cps), len(self._sorted) - 1)
        unknown = self._sorted[pos] != cps
        if unknown.any():
            bad = sorted({chr(c) for c in cps[unknown]})
            more = f", ... ({len(bad)} in all)" if len(bad) > 10 else ""
            raise PrepareError("characters not in the vocabulary: " + ", ".join(map(repr, bad[:10])) + more +
                               f"; this character-level model knows only the {self.vocab_size} characters of its "
                               "training text: leave them out")
        return self._order[pos]

    def encode(self, text):
        return self.encode_array(text).tolist()

    def decode(self, ids):
        # ids outside the vocabulary (the model's padding rows) are dropped
        ids = [int(i) for i in ids]
        if self.kind == "gpt2":
            return self._enc.decode([i for i in ids if 0 <= i < GPT2_VOCAB_SIZE])
        if self.kind == "bpe":
            return self._bpe.decode(ids)
        return "".join(self.chars[i] for i in ids if 0 <= i < self.vocab_size)


def _size(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _read_chunks(source, label, chunk_bytes, log, what, sha=None):
    """Yield the text of `source` (a path or bytes) in pieces of about chunk_bytes, cut after
    a newline (or, in a line longer than a chunk, between characters); checks it is UTF-8."""
    f = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    total = len(source) if isinstance(source, bytes) else os.path.getsize(source)
    carry, offset, done, mark = b"", 0, 0, PROGRESS_BYTES
    with f:
        while True:
            block = f.read(chunk_bytes)
            done += len(block)
            if sha is not None:
                sha.update(block)
            buf = carry + block
            if not buf:
                return
            cut = len(buf)
            if block:  # not at the end: keep the last partial line for the next chunk
                cut = buf.rfind(b"\n") + 1
                if cut == 0 and len(buf) > chunk_bytes:  # a line longer than a chunk: cut
                    cut = len(buf) - 1                   # before its last character's first byte
                    while cut > max(0, len(buf) - 4) and buf[cut] & 0xC0 == 0x80:
                        cut -= 1
            piece, carry = buf[:cut], buf[cut:]
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PrepareError(f"{label} is not UTF-8: invalid byte 0x{piece[e.start]:02x} "
                                   f"at byte offset {offset + e.start}") from None
            offset += len(piece)
            if done >= mark:
                log(f"prepare: {what} {_size(done)} / {_size(total)}")
                mark += PROGRESS_BYTES
            if text:
                yield text


def _download(url, dest, expected_sha256, dataset, log):
    log(f"prepare: downloading {url}")
    sha = hashlib.sha256()
    with open(dest, "wb") as f:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                while block := r.read(1 << 20):
                    sha.update(block)
                    f.write(block)
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise DownloadError(url, str(getattr(e, "reason", "") or e) or type(e).__name__, dataset) from None
    got = sha.hexdigest()
    if expected_sha256 and got != expected_sha256:
        os.remove(dest)
        raise PrepareError(f"{url} is not the expected file: sha256 expected {expected_sha256}, got {got}")


def _pydoc_text():
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise PrepareError("pydoc_data.topics is missing from this Python installation") from None
    return "\n\n".join(topics[k] for k in sorted(topics))


_worker_tokenizer = None


def _start_worker(spec):
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(**spec)


def _encode_in_worker(text, dtype):
    return _worker_tokenizer.encode_array(text).astype(dtype)


def _encoded(chunks, tok, dtype, num_proc):
    """The token ids of each text chunk, in order. With num_proc > 1 the chunks are encoded in that many
    processes, at most 2 x num_proc chunks in flight (bounded memory); the output is the same."""
    if num_proc == 1:
        for text in chunks:
            yield tok.encode_array(text).astype(dtype)
        return
    import collections
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(num_proc, _start_worker, (tok.spec(),)) as pool:
        pending = collections.deque()
        for text in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (text, dtype)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _tokenize(source, label, tok, stage, chunk_bytes, log, fmt="flat", seq_len=2049, num_proc=1):
    """Stream source into stage/{train,val}.bin (fmt flat) or stage/document.{bin,idx} (fmt indexed: sequences
    of seq_len tokens, the last one shorter); tok=None builds a char vocabulary. Returns meta."""
    sha, scan = hashlib.sha256(), tok is None
    if scan:  # char: a first pass collects the character set (and hashes the source)
        chars = set()
        for text in _read_chunks(source, label, chunk_bytes, log, "scanning", sha):
            chars.update(text)
        tok = Tokenizer("char", sorted(chars))
    dtype = dtype_for_vocab(tok.vocab_size)
    n = 0
    all_path = os.path.join(stage, "document.bin" if fmt == "indexed" else "train.bin")
    with open(all_path, "wb") as f:  # all tokens; for flat, the val tail is moved out below
        chunks = _read_chunks(source, label, chunk_bytes, log, "encoding", None if scan else sha)
        for ids in _encoded(chunks, tok, dtype, num_proc):
            ids.tofile(f)
            n += len(ids)
    meta = {**tok.to_meta(), "dtype": dtype}
    if tok.kind == "bpe":  # the dataset keeps its own copy: it decodes without the original path
        shutil.copyfile(tok.path, os.path.join(stage, "tokenizer.json"))
    if fmt == "indexed":
        sizes = np.full(n // seq_len + (n % seq_len > 0), seq_len, dtype=np.int32)
        if len(sizes):
            sizes[-1] = n - seq_len * (len(sizes) - 1)
        if len(sizes) < 2:
            raise PrepareError(f"{label} is too small: {n} tokens make fewer than 2 sequences of {seq_len} "
                               f"(one is held out for validation); use a smaller --seq_len or more text")
        write_index(os.path.join(stage, "document"), sizes, dtype)
        n_train = int(sizes[:train_sequences(len(sizes))].sum())
        return {**meta, "format": "indexed", "prefix": "document", "sequences": len(sizes), "seq_len": seq_len,
                "train_tokens": n_train, "val_tokens": n - n_train, "sha256": sha.hexdigest()}
    n_train = n * 9 // 10
    if n_train == 0 or n_train == n:
        raise PrepareError(f"{label} is too small: {n} tokens cannot be split into train and val")
    # train is a prefix of all tokens: copy the tail out through a memmap, then truncate
    tokens = np.memmap(all_path, dtype=dtype, mode="r", shape=(n,))
    with open(os.path.join(stage, "val.bin"), "wb") as f:
        for i in range(n_train, n, 1 << 24):
            tokens[i:min(i + (1 << 24), n)].tofile(f)
    del tokens  # close the map before truncating the file under it
    os.truncate(all_path, n_train * np.dtype(dtype).itemsize)
    return {**meta, "train_tokens": n_train, "val_tokens": n - n_train, "sha256": sha.hexdigest()}


def tokenizer_kind(tokenizer):
    """--tokenizer: 'char', 'gpt2', or a path (a tokenizer.json or a model folder holding one) -> 'bpe'."""
    return tokenizer if tokenizer in (None, "char", "gpt2") else "bpe"


def prepare(dataset, input=None, url=None, tokenizer=None, out_root=DEFAULT_OUT_ROOT,
            chunk_bytes=1 << 20, log=_stderr, format="flat", seq_len=2049, num_proc=1):
    """Tokenize a dataset into OUT_ROOT/dataset/ and return that folder's path. tokenizer: 'char', 'gpt2' or
    the path of a byte-level BPE tokenizer.json (or a model folder holding one); format: 'flat' (train.bin +
    val.bin) or 'indexed' (document.bin + document.idx, sequences of seq_len tokens, data/indexed.py)."""
    if not dataset or dataset.startswith(".") or os.sep in dataset or "/" in dataset:
        raise PrepareError(f"invalid dataset name {dataset!r}; use a plain folder name")
    if input is not None and url is not None:
        raise PrepareError("pass either --input or --url, not both")
    if format not in ("flat", "indexed"):
        raise PrepareError(f"unknown format {format!r}; use 'flat' or 'indexed'")
    if seq_len < 2 or num_proc < 1:
        raise PrepareError(f"--seq_len={seq_len} must be at least 2 and --num_proc={num_proc} at least 1")
    kind = DATASETS.get(dataset, "char")
    if tokenizer and dataset in DATASETS and tokenizer_kind(tokenizer) != kind:
        raise PrepareError(f"dataset {dataset!r} uses the {kind} tokenizer; "
                           f"pick another --dataset name for a {tokenizer} version")
    kind = tokenizer_kind(tokenizer) or kind
    is_shakespeare = dataset.startswith("shakespeare") and dataset in DATASETS
    # resolve the source first, so a bad name or missing file is reported before any work
    if input is not None:
        if not os.path.isfile(input):
            raise PrepareError(f"input file {input} does not exist")
        source, label = input, input
    elif is_shakespeare or url is not None:
        url = url or (os.environ.get("NANOMESH_SHAKESPEARE_URL") or SHAKESPEARE_URL)
        source, label = None, url  # downloaded below, into the staging folder
    elif dataset == "pydoc":
        source, label = _pydoc_text().encode("utf-8"), "pydoc_data.topics"
    else:
        from mesh import closest  # here: tokenizing worker processes start without torch
        raise PrepareError(f"unknown dataset {dataset!r}{closest(dataset, DATASETS)}; known datasets: "
                           f"{', '.join(sorted(DATASETS))} (any other name needs --input FILE)")
    if input is not None and os.path.getsize(input) == 0:
        raise PrepareError(f"{label} is empty")
    # fail early if the vocabulary is missing
    tok = Tokenizer("gpt2") if kind == "gpt2" else Tokenizer("bpe", path=tokenizer) if kind == "bpe" else None

    final = os.path.join(out_root, dataset)
    started = time.perf_counter()
    created_root = not os.path.isdir(out_root)
    os.makedirs(out_root, exist_ok=True)
    remove_stale_stages(out_root)
    stage = tempfile.mkdtemp(prefix=f".{dataset}.tmp-{os.getpid()}-", dir=out_root)
    try:
        if source is None:  # download into the stage; it lands next to the .bin files as input.txt
            source = os.path.join(stage, "input.txt")
            _download(url, source, SHAKESPEARE_SHA256 if is_shakespeare else None, dataset, log)
            if os.path.getsize(source) == 0:
                raise PrepareError(f"{label} is empty")
        meta = _tokenize(source, label, tok, stage, chunk_bytes, log, format, seq_len, num_proc)
        meta = {"dataset": dataset, **meta, "source": os.path.abspath(input) if input else label}
        with open(os.path.join(stage, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, ensure_ascii=False)
        # commit: drop the old meta.json first so a crash midway never pairs it with new .bin
        # files, then move everything in, meta.json last (its presence marks a complete dataset)
        os.makedirs(final, exist_ok=True)
        if os.path.exists(os.path.join(final, "meta.json")):
            os.remove(os.path.join(final, "meta.json"))
        for name in sorted(os.listdir(stage), key=lambda name: name == "meta.json"):
            os.replace(os.path.join(stage, name), os.path.join(final, name))
    except OSError as e:  # a full disk, most often: numpy reports it as a short write, naming no file
        from configurator import why_write_failed
        raise PrepareError(f"could not write dataset {dataset!r} in {out_root}: {why_write_failed(e, out_root)}; "
                           f"the dataset was not written") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created_root and not os.path.isdir(final):
            with contextlib.suppress(OSError):
                os.rmdir(out_root)  # we made it: leave no empty folder behind either
    n, seconds = meta['train_tokens'] + meta['val_tokens'], time.perf_counter() - started
    log(f"prepare: {dataset}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
        f"vocab {meta['vocab_size']}, {meta['dtype']} -> {final} ({seconds:.1f} s, {n / seconds:,.0f} tokens/s, "
        f"{num_proc} process(es))")
    return final


def remove_stale_stages(out_root):
    """Remove the staging folders (.NAME.tmp-PID-*) that a killed prepare left in out_root: only those of
    processes that are dead, never a live one's."""
    from configurator import process_alive
    for name in os.listdir(out_root):
        pid = name.rpartition(".tmp-")[2].split("-")[0]
        if name.startswith(".") and ".tmp-" in name and pid.isdigit() and not process_alive(int(pid)) \
                and os.path.isdir(os.path.join(out_root, name)):
            shutil.rmtree(os.path.join(out_root, name), ignore_errors=True)


def ensure_dataset(dataset, out_root=DEFAULT_OUT_ROOT, log=_stderr):
    """Return the name of the dataset folder to train on, preparing a named dataset if needed (one already
    prepared is found as dataset_folder finds it; a path is an indexed dataset's). Offline, shakespeare_char falls back to the 'pydoc'
    corpus so training still runs."""
    if dataset_folder(out_root, dataset):
        return dataset
    if is_path(dataset):
        raise PrepareError(f"there is no indexed dataset at {dataset} (neither {dataset}.idx + .bin nor "
                           f"{os.path.join(dataset, 'document')}.idx + .bin); put Pythia's pre-tokenized Pile there "
                           f"(README: Reproduce the paper) or make one with data/prepare.py --format=indexed")
    if dataset not in DATASETS:
        raise PrepareError(f"dataset {dataset!r} was never prepared (no {dataset}/meta.json in {out_root}); "
                           f"prepare it with: python data/prepare.py --dataset {dataset} --input FILE")
    try:
        prepare(dataset, out_root=out_root, log=log)
    except DownloadError as e:
        if dataset != "shakespeare_char":
            raise
        log(f"prepare: Tiny Shakespeare could not be downloaded ({e.reason}); "
            "training on the offline 'pydoc' corpus instead")
        return ensure_dataset("pydoc", out_root, log)
    return dataset


def is_path(dataset):
    """A --dataset that names a path (PATH/document, a folder holding document.{bin,idx}) rather than a
    folder of data_root."""
    return "/" in dataset or os.sep in dataset


def dataset_folder(root, name):
    """The folder of prepared dataset `name` under data_root `root`, or None. A relative root is tried
    from the working folder, then from the project folder (where this script puts datasets by
    default), so train/sample/probe/lm_eval run from anywhere. A path (is_path) to an indexed dataset
    gives the folder holding it, which must hold its meta.json too (data/prepare.py --indexed writes it); a path
    to a prepared folder gives that folder."""
    if is_path(name):
        bases = [name] if os.path.isabs(name) else [name, os.path.join(os.path.dirname(DEFAULT_OUT_ROOT), name)]
        prefix = next((p for p in map(indexed_prefix, bases) if p), None)
        if prefix is None:  # a prepared folder of either format, given by its path
            return next((b for b in bases if os.path.isfile(os.path.join(b, "meta.json"))), None)
        folder = os.path.dirname(prefix)
        if not os.path.isfile(os.path.join(folder, "meta.json")):
            raise PrepareError(f"{prefix} has no meta.json beside it to name its tokenizer; write one with: python "
                               f"data/prepare.py --indexed {prefix} --tokenizer TOKENIZER (for Pythia's Pile: the "
                               f"tokenizer.json of any Pythia model)")
        meta = read_meta(os.path.join(folder, "meta.json"))
        if meta.get("prefix") != os.path.basename(prefix):
            raise PrepareError(f"{os.path.join(folder, 'meta.json')} describes {meta.get('prefix')!r}, not "
                               f"{os.path.basename(prefix)!r}; write it again with: python data/prepare.py "
                               f"--indexed {prefix} --tokenizer TOKENIZER")
        return folder
    folders = [os.path.join(root, name)]
    if not os.path.isabs(root):
        folders.append(os.path.join(os.path.dirname(DEFAULT_OUT_ROOT), root, name))
    return next((f for f in folders if os.path.isfile(os.path.join(f, "meta.json"))), None)


def checkpoint_dataset(train_config, trained_on=None):
    """The prepared folder of the dataset a checkpoint was (or is being) trained on; train_config: the
    TrainConfig saved in it, as a dict. trained_on: the checkpoint's record of that data (dataset_record);
    a folder whose meta.json now says otherwise (another text, another vocabulary) is refused by name."""
    root, name = train_config.get("data_root", "data"), train_config["dataset"]
    folder = dataset_folder(root, name)
    if folder is None and is_path(name):
        raise PrepareError(f"the checkpoint's dataset {name} is not there (no {name}.idx + .bin, nor "
                           f"{os.path.join(name, 'document')}.idx + .bin)")
    if folder is None:
        raise PrepareError(f"the checkpoint's dataset {name!r} is not prepared (no {os.path.join(root, name)}"
                           f"/meta.json); prepare it with: python data/prepare.py --dataset {name}")
    now = dataset_record(folder)
    changed = [k for k in sorted(set(trained_on or {}) | set(now)) if trained_on and trained_on.get(k) != now.get(k)]
    if changed:
        raise PrepareError(f"{os.path.join(folder, 'meta.json')} is not the data the checkpoint was trained on: "
                           + ", ".join(_difference(k, trained_on.get(k), now.get(k)) for k in changed)
                           + f"; prepare {name!r} again from its original text, or train a new run on this data")
    return folder


def _difference(key, then, now):
    """One field of two dataset records that differ, in words (a vocabulary as the characters it gained or lost)."""
    if key == "chars" and isinstance(then, str) and isinstance(now, str):
        added, lost = "".join(sorted(set(now) - set(then))), "".join(sorted(set(then) - set(now)))
        return "characters " + (", ".join(([f"{added!r} added"] if added else []) + ([f"{lost!r} removed"] if lost else []))
                                or "in another order")
    short = lambda v: repr(v) if len(repr(v)) <= 20 else repr(v)[:17] + "..."  # noqa: E731
    return f"{key} {short(then)} then, {short(now)} now"


def dataset_record(folder):
    """What a checkpoint records of its training data: the tokenizer and its vocabulary, dtype, token counts
    and the source's sha256, from the dataset's meta.json."""
    meta = read_meta(os.path.join(folder, "meta.json"))
    keys = ("tokenizer", "encoding", "chars", "vocab_size", "dtype", "train_tokens", "val_tokens", "sha256",
            "tokenizer_sha256", "sequences")
    return {k: meta[k] for k in keys if k in meta}


def open_indexed(prefix):
    """IndexedDataset(prefix), checked once per process however many splits are read from it (while its two
    files stay as they are)."""
    stamp = tuple((st.st_size, st.st_mtime_ns) for st in (os.stat(prefix + ".idx"), os.stat(prefix + ".bin")))
    return _open_indexed(os.path.abspath(prefix), stamp)


@functools.lru_cache(maxsize=4)
def _open_indexed(prefix, stamp):
    return IndexedDataset(prefix)


def load_split(data_dir, split):
    """The train or val tokens of a prepared dataset, memory-mapped (read-only), as one 1-d array, checked
    against its meta.json first: size, token count, and every token id below the vocabulary size (for a
    split over SCAN_BYTES, the ids of SCAN_PIECES evenly spread pieces, its first and last included). An
    indexed dataset's (format 'indexed') are its sequences back to back: train all but the last 1% of them,
    val those (data/indexed.py train_sequences); its index is checked against its .bin when opened."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    meta = read_meta(os.path.join(data_dir, "meta.json"))
    fix = f"prepare the dataset again: python data/prepare.py --dataset {os.path.basename(os.path.normpath(data_dir))}"
    if meta.get("format") == "indexed":
        ds = open_indexed(os.path.join(data_dir, meta["prefix"]))
        if len(ds) < 2:
            raise PrepareError(f"{ds.prefix} has {len(ds)} sequence(s): it needs 2 or more, the last 1% (at least "
                               f"one) being held out for validation")
        cut = ds.token_offset(train_sequences(len(ds)))
        data, path = (ds.tokens[:cut] if split == "train" else ds.tokens[cut:]), ds.prefix + ".bin"
    else:
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise PrepareError(f"{path} is missing; {fix}")
        size, item, expected = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize, meta.get(f"{split}_tokens")
        if size == 0:
            raise PrepareError(f"{path} is empty; {fix}")
        if size % item:
            raise PrepareError(f"{path} has {size} bytes, not a whole number of {meta['dtype']} tokens; {fix}")
        if expected is not None and size // item != expected:
            raise PrepareError(f"{path} holds {size // item:,} tokens but meta.json says {expected:,}; {fix}")
        data = np.memmap(path, dtype=meta["dtype"], mode="r")
    piece = max(1, SCAN_PIECE_BYTES // data.itemsize)
    starts = range(0, len(data), piece) if data.nbytes <= SCAN_BYTES else \
        np.linspace(0, max(0, len(data) - piece), SCAN_PIECES).astype(np.int64)
    top = max((int(data[s:s + piece].max()) for s in starts if len(data[s:s + piece])), default=0)
    if top >= meta["vocab_size"]:
        raise PrepareError(f"{path} holds token id {top}, outside the vocabulary of {meta['vocab_size']}; {fix}")
    return data


def random_windows(data, length, n, seed):
    """n windows of `length` consecutive tokens of data (a 1-d array) at starts drawn by
    np.random.default_rng(seed) (an int or a list of ints), every start from 0 to the last that fits
    -> int64 array (n, length). The same arguments always give the same windows: train.py's random
    batches (length block_size + 1, seeded by (seed, step, micro-batch)) and probe.py's samples."""
    starts = np.random.default_rng(seed).integers(0, len(data) - length + 1, size=n)
    return np.stack([np.asarray(data[s:s + length], dtype=np.int64) for s in starts])


def sequential_windows(data, length, first, n):
    """Windows first ... first+n-1 of data cut into consecutive, non-overlapping windows of `length` tokens
    -> int64 array (n, length); window k is data[k*length : (k+1)*length]. Past the last whole window the
    count starts again at 0 (a next epoch, same order); the tokens after it are never read. On an indexed
    dataset of sequences of `length` tokens (Pythia's: 2049) window k is sequence k."""
    per_epoch = len(data) // length
    if per_epoch == 0:
        raise PrepareError(f"the data ({len(data)} tokens) is shorter than one window of {length} tokens")
    return np.stack([np.asarray(data[s:s + length], dtype=np.int64)
                     for s in ((k % per_epoch) * length for k in range(first, first + n))])


def read_meta(path):
    """A dataset's meta.json as a dict; a damaged one is a PrepareError that names it."""
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or not {"tokenizer", "dtype", "vocab_size"} <= set(meta):
            raise ValueError("no tokenizer, dtype or vocab_size")
        if not isinstance(meta["vocab_size"], int) or meta["vocab_size"] < 1:
            raise ValueError(f"vocab_size {meta['vocab_size']!r} is not a positive integer")
        if meta["tokenizer"] == "char" and len(str(meta.get("chars") or "")) != meta["vocab_size"]:
            raise ValueError(f"its {meta['vocab_size']} characters are missing")
        if meta["dtype"] != dtype_for_vocab(meta["vocab_size"]):
            raise ValueError(f"dtype {meta['dtype']!r} does not hold a vocabulary of {meta['vocab_size']}, "
                             f"{dtype_for_vocab(meta['vocab_size'])} does")
        return meta
    except (OSError, ValueError) as e:
        raise PrepareError(f"{path} is damaged ({type(e).__name__}: {e}); prepare the dataset again with "
                           f"python data/prepare.py") from None


def describe_indexed(path, tokenizer, log=_stderr):
    """Write meta.json (and the tokenizer's copy) beside an existing indexed dataset, e.g. Pythia's Pile, so that
    train.py can read it where it is: nothing is copied or converted. Returns the folder."""
    if not tokenizer:
        raise PrepareError("--indexed needs --tokenizer: 'gpt2', or a tokenizer.json or model folder (for Pythia's "
                           "Pile: the tokenizer.json of any Pythia model)")
    if tokenizer_kind(tokenizer) == "char":
        raise PrepareError("--indexed needs a BPE tokenizer: 'gpt2' or a tokenizer.json (a character vocabulary "
                           "is only known from its text)")
    ds = IndexedDataset(path)
    tok = Tokenizer("bpe", path=tokenizer) if tokenizer_kind(tokenizer) == "bpe" else Tokenizer("gpt2")
    head = np.asarray(ds.tokens[:1 << 24])
    if head.size and (head.min() < 0 or head.max() >= tok.vocab_size):
        raise PrepareError(f"{ds.prefix}.bin holds token id {int(head.max())}, past the tokenizer's {tok.vocab_size} "
                           f"ids: it was made with another tokenizer")
    if len(ds) < 2:
        raise PrepareError(f"{ds.prefix} has {len(ds)} sequence(s): it needs 2 or more, one held out for validation")
    folder, train = os.path.dirname(os.path.abspath(ds.prefix)), train_sequences(len(ds))
    n_train = ds.token_offset(train)
    meta = {"dataset": os.path.basename(folder), **tok.to_meta(), "dtype": ds.dtype.name, "format": "indexed",
            "prefix": os.path.basename(ds.prefix), "sequences": len(ds), "train_tokens": n_train,
            "val_tokens": ds.n_tokens - n_train, "source": os.path.abspath(ds.prefix)}
    if tok.kind == "bpe":
        kept = os.path.join(folder, "tokenizer.json")
        if os.path.exists(kept) and not os.path.samefile(kept, tok.path) and Tokenizer("bpe", path=kept).identity != tok.identity:
            raise PrepareError(f"{kept} exists and is another tokenizer; move it away first")
        if not os.path.exists(kept):
            shutil.copyfile(tok.path, kept + ".tmp")
            os.replace(kept + ".tmp", kept)
    with open(os.path.join(folder, "meta.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
    os.replace(os.path.join(folder, "meta.json.tmp"), os.path.join(folder, "meta.json"))
    log(f"prepare: {ds.prefix}: {len(ds):,} sequences, {n_train:,} train + {ds.n_tokens - n_train:,} val tokens, "
        f"vocab {tok.vocab_size}, {ds.dtype.name}; wrote {os.path.join(folder, 'meta.json')}")
    return folder


def main(argv=None):
    from configurator import report  # here: tokenizing worker processes start without torch
    p = argparse.ArgumentParser(description="Tokenize a text dataset into train.bin/val.bin/meta.json "
                                            "(or document.bin/document.idx/meta.json).")
    p.add_argument("--dataset", help=f"output folder name; known: {', '.join(sorted(DATASETS))}")
    p.add_argument("--input", help="local text file (UTF-8) to use instead of downloading")
    p.add_argument("--url", help="download address (default: the canonical Tiny Shakespeare)")
    p.add_argument("--tokenizer", help="char, gpt2, or a tokenizer.json / Hugging Face model folder holding one "
                                       "(a byte-level BPE such as Pythia's); default: the dataset's, or char")
    p.add_argument("--out_root", default=DEFAULT_OUT_ROOT, help="where NAME/ is written (default: %(default)s)")
    p.add_argument("--format", default="flat", help="flat (train.bin + val.bin) or indexed (Megatron / GPT-NeoX "
                                                    "document.bin + document.idx, sequences of --seq_len tokens)")
    p.add_argument("--seq_len", type=int, default=2049, help="tokens per sequence of --format=indexed "
                                                             "(default %(default)s, Pythia's)")
    p.add_argument("--num_proc", type=int, default=1, help="processes that tokenize (same output as one)")
    p.add_argument("--indexed", metavar="PATH", help="instead of tokenizing: write meta.json beside the existing "
                                                     "indexed dataset PATH (PATH.idx + PATH.bin), with --tokenizer")
    args = p.parse_args(argv)
    try:
        if args.indexed:
            if args.dataset or args.input or args.url:
                raise PrepareError("--indexed describes an existing dataset: drop --dataset, --input and --url")
            describe_indexed(args.indexed, args.tokenizer)
            return 0
        if not args.dataset:
            raise PrepareError("--dataset NAME is required (or --indexed PATH)")
        prepare(args.dataset, input=args.input, url=args.url, tokenizer=args.tokenizer, out_root=args.out_root,
                format=args.format, seq_len=args.seq_len, num_proc=args.num_proc)
    except (PrepareError, OSError) as e:  # OSError: e.g. an --out_root that is a file
        return report("prepare.py", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
