"""
Prepare a text dataset for nanoMeSH: tokenize it into OUT_ROOT/NAME/ (OUT_ROOT: this folder).

    python data/prepare.py --dataset shakespeare_char           # Tiny Shakespeare, characters
    python data/prepare.py --dataset pydoc                      # offline: Python's pydoc topics
    python data/prepare.py --dataset mytext --input my.txt [--tokenizer char|gpt2|PATH]
    python data/prepare.py --indexed data/pile/document --tokenizer pythia-160m/tokenizer.json

NAME/ holds train.bin + val.bin (or document.bin + .idx) and meta.json; data/README.md is the
reference. Text streams through a staging folder moved into place, meta.json last.
"""
import codecs
import contextlib
import errno
import hashlib
import http.client
import io
import os
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass
from shlex import quote

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import command, files, spawn  # noqa: E402
from configurator import UsageError, closest, setting  # noqa: E402
from data.indexed import IndexedDataset, train_sequences, write_index  # noqa: E402
from data.trained_on import elsewhere  # noqa: E402
from data.meta import (PROJECT_DATA, STAND_IN, DataError, Tokenizer, check_ids,  # noqa: E402
                       data_root, dataset_folder, dtype_for_vocab, is_path, read_meta)

SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                   "tinyshakespeare/input.txt")
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DATASETS = {"shakespeare_char": "char", "shakespeare": "gpt2", "pydoc": "char"}  # name: tokenizer
OFFLINE = ".shakespeare_char.offline"  # why shakespeare_char fell back on pydoc
REPLACING = ".meta.json.replacing"  # the old meta.json while new files move in
MADE = {"train.bin", "val.bin", "document.bin", "document.idx", "tokenizer.json"}  # any kind's
NAME_BYTES = 200  # its staging folder's name fits in 255


class DownloadError(DataError):
    """The download itself failed (offline, a bad address), as opposed to a bad file."""

    def __init__(self, url, reason, dataset, out_root):
        self.reason = reason
        super().__init__(f"could not download {url} ({reason}); prepare it from a local copy "
                         f"with: python data/prepare.py --dataset {dataset} --input FILE"
                         + elsewhere(out_root))


def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def _read_chunks(source, label, chunk_bytes, sha=None):
    """source's UTF-8 text (a path, or bytes) in pieces of about chunk_bytes, cut before the last
    run of spaces or newlines (or inside a longer word), where GPT-2's pre-tokenizer splits too:
    the ids are those of the whole text. A leading byte order mark is dropped."""
    f = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    decoder, text, offset = codecs.getincrementaldecoder("utf-8-sig")(), "", 0
    with f:
        while True:
            block = f.read(chunk_bytes)
            if sha is not None:
                sha.update(block)
            try:
                text += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:  # e.object ends where block does
                at = offset + len(block) - len(e.object) + e.start
                raise DataError(f"{label} is not UTF-8: invalid byte "
                                f"0x{e.object[e.start]:02x} at byte offset "
                                f"{at}; save it as UTF-8 text") from None
            offset += len(block)
            cut = max(text.rfind("\n"), text.rfind(" "))
            while cut > 0 and text[cut - 1].isspace():
                cut -= 1
            if not block or cut <= 0 and len(text) > chunk_bytes:
                cut = len(text)
            if cut > 0:
                yield text[:cut]
                text = text[cut:]
            if not block:
                return


def _download(url, dest, dataset, out_root, log):
    log(f"prepare: downloading {url}")
    sha = hashlib.sha256()
    with open(dest, "wb") as f:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                while block := r.read(1 << 20):
                    sha.update(block)
                    f.write(block)
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise DownloadError(url, str(getattr(e, "reason", "") or e) or type(e).__name__,
                                dataset, out_root) from None
    if dataset in ("shakespeare", "shakespeare_char") and sha.hexdigest() != SHAKESPEARE_SHA256:
        raise DataError(f"{url} is not the expected file: sha256 expected {SHAKESPEARE_SHA256}, "
                        f"got {sha.hexdigest()}")


def _worker(tok, conn):
    """A --num_proc process: the ids of each text it is sent, until it is ended (or its parent)."""
    spawn.helper()  # a Ctrl-C, a SIGTERM: prepare.py's to answer, by ending it
    with contextlib.suppress(EOFError, BrokenPipeError):
        while True:
            conn.send(tok.encode_array(conn.recv()))


def _encoded(chunks, tok, num_proc):
    """Each chunk's token ids, in order; num_proc > 1: that many processes, same output."""
    if num_proc == 1:
        yield from map(tok.encode_array, chunks)
        return
    import itertools
    import multiprocessing
    # a pipe each, no pool: a pool hangs on a worker killed holding its lock (a group's SIGTERM)
    pipes = [multiprocessing.Pipe() for _ in range(num_proc)]
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker, args=(tok, end)) for _, end in pipes]
    unblock = spawn.start(procs)  # the signals held until each ignores them
    try:
        for _, end in pipes:
            end.close()  # so that a worker's end reads as EOF here
        unblock()
        while batch := list(itertools.islice(chunks, num_proc)):
            try:
                for (conn, _), text in zip(pipes, batch):
                    conn.send(text)
                ids = [conn.recv() for conn, _ in pipes[:len(batch)]]
            except (EOFError, OSError):
                raise DataError("a --num_proc process ended (killed: out of memory? or its error "
                                "above); prepare again with a smaller --num_proc") from None
            yield from ids
    finally:  # at once: a worker holds no lock of ours
        for p in procs:
            p.kill()
            p.join()
        unblock()


def _tokenize(source, label, tok, stage, chunk_bytes, fmt, seq_len, num_proc):
    """Stream source into stage/{train,val}.bin (or document.{bin,idx}); returns meta.
    tok None: a char vocabulary, scanned first."""
    sha, scan = hashlib.sha256(), tok is None
    if scan:  # a first pass collects the character set (and hashes the source)
        chars = set()
        for text in _read_chunks(source, label, chunk_bytes, sha):
            chars.update(text)
        tok = Tokenizer("char", sorted(chars))
    dtype = dtype_for_vocab(tok.vocab_size, indexed=fmt == "indexed")
    all_path = os.path.join(stage, "document.bin" if fmt == "indexed" else "train.bin")
    with open(all_path, "wb") as f:  # all tokens; flat: val moved out below
        chunks = _read_chunks(source, label, chunk_bytes, None if scan else sha)
        if tok.kind == "bpe" and tok._bpe.backend == "tokenizers":
            chunks = iter(["".join(chunks)])  # not GPT-2's cuts
        for ids in _encoded(chunks, tok, num_proc):
            ids.astype(dtype).tofile(f)
        n = f.tell() // np.dtype(dtype).itemsize
    meta = {**tok.to_meta(), "dtype": dtype}
    if tok.kind == "bpe":  # the dataset keeps its own copy
        shutil.copyfile(tok.path, os.path.join(stage, "tokenizer.json"))
    if fmt == "indexed":
        sizes = np.diff(np.append(np.arange(0, n, seq_len), n))
        if len(sizes) < 2:
            raise DataError(f"{label} is too small: {n} tokens make fewer than 2 sequences of "
                            f"{seq_len} (one is held out for validation); use a smaller --seq_len "
                            f"or more text")
        write_index(os.path.join(stage, "document"), sizes, dtype)
        n_train = int(sizes[:train_sequences(len(sizes))].sum())
        meta.update(format="indexed", prefix="document", sequences=len(sizes))
    else:
        n_train = n * 9 // 10
        if not 0 < n_train < n:
            raise DataError(f"{label} is too small: {n} tokens cannot "
                            "be split into train and val; give more text")
        # train is a prefix of all tokens: the tail copied out, then cut off
        with open(all_path, "rb") as f, open(os.path.join(stage, "val.bin"), "wb") as val:
            cut = f.seek(n_train * np.dtype(dtype).itemsize)
            shutil.copyfileobj(f, val)
        os.truncate(all_path, cut)
    return {**meta, "train_tokens": n_train, "val_tokens": n - n_train, "sha256": sha.hexdigest()}


def named_tokenizer(name):
    """--tokenizer -> None for 'char', else the Tokenizer of 'gpt2' or of a path."""
    if name in ("char", "gpt2"):
        return Tokenizer("gpt2") if name == "gpt2" else None
    if not os.path.exists(name):
        raise DataError(f"--tokenizer {name}: there is no such file or folder here; "
                        f"give char, gpt2, or the path of a tokenizer.json or of a downloaded "
                        f"Hugging Face model folder holding one (nothing is downloaded)")
    return Tokenizer("bpe", path=name)


def foreign_files(folder):
    """The files of a dataset folder prepare.py did not make (no meta.json): nanoGPT's, say."""
    if not os.path.isdir(folder) or any(os.path.isfile(os.path.join(folder, n))
                                        for n in ("meta.json", REPLACING)):
        return []
    return sorted(n for n in os.listdir(folder)
                  if not files.TEMPORARY.match(n) and n != files.LOCK)


def described(folder):
    """Whether folder's meta.json is --indexed's (no text read: no sha256)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # none, damaged: ours
        meta = files.read_json(os.path.join(folder, "meta.json"))
        return meta.get("format") == "indexed" and "sha256" not in meta
    return False


def check_name(dataset):
    if (not dataset or dataset.startswith(".") or any(c in dataset for c in "/\\\0")
            or len(dataset.encode("utf-8", "surrogatepass")) > NAME_BYTES):
        raise DataError(f"invalid dataset name {dataset!r:.50}: a dataset's name is a plain "
                        f"folder name, not starting with '.', without '/' or '\\', at most "
                        f"{NAME_BYTES} bytes; choose another --dataset")


def make_folder(folder, dataset, out_root, root_flag):
    """os.makedirs(folder), an unwritable root a DataError; returns whether it made it."""
    made = not os.path.isdir(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        if e.errno == errno.EEXIST:  # a file is in the way
            raise DataError(f"{folder} is a file; move it, or give "
                            f"another --dataset or {root_flag}") from None
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        there = (f", or have it prepared there by someone who can: python data/prepare.py "
                 f"--dataset {dataset} --out_root {quote(out_root)}"
                 if root_flag == "--data_root" else "")
        raise DataError(f"cannot write dataset {dataset!r} in {root_flag}={out_root} "
                        f"({e.strerror}); give a {root_flag} you can write to{there}") from None
    return made


def _source(dataset, input, url):
    """(source, label): a path or bytes (None: url's, downloaded later), and its name."""
    if input is not None:
        if os.path.exists(input) and not os.path.isfile(input):
            raise DataError(f"input file {input} is not a regular file "
                            "(a folder or a device); give one text file "
                            "(a folder's: cat them into one)")
        if not os.path.isfile(input):
            raise DataError(f"input file {input} does not exist")
        if not os.access(input, os.R_OK):
            raise DataError(f"input file {input} cannot be read (permission denied)")
        if os.path.getsize(input) == 0:
            raise DataError(f"{input} is empty; give a file of text")
        return input, input
    if dataset in ("shakespeare", "shakespeare_char") or url is not None:
        return None, url or os.environ.get("NANOMESH_SHAKESPEARE_URL") or SHAKESPEARE_URL
    if dataset == "pydoc":
        from pydoc_data.topics import topics
        return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8"), "pydoc_data.topics"
    raise DataError(f"unknown dataset {dataset!r}{closest(dataset, DATASETS)}; known datasets: "
                    f"{', '.join(sorted(DATASETS))} (any other name needs --input FILE)")


def prepare(dataset, input=None, url=None, tokenizer=None, out_root=PROJECT_DATA,
            chunk_bytes=1 << 20, log=_stderr, format="flat", seq_len=2049, num_proc=1,
            root_flag="--out_root"):
    """Tokenize a dataset into OUT_ROOT/dataset/ and return that folder."""
    check_name(dataset)
    if input is not None and url is not None:
        raise DataError("pass either --input or --url, not both")
    if format not in ("flat", "indexed"):
        raise DataError(f"unknown format {format!r}; use 'flat' or 'indexed'")
    if seq_len < 2 or num_proc < 1:
        raise DataError(f"--seq_len={seq_len} must be at least 2 "
                        f"and --num_proc={num_proc} at least 1")
    if tokenizer and DATASETS.get(dataset, tokenizer) != tokenizer:
        raise DataError(f"dataset {dataset!r} uses the {DATASETS[dataset]} tokenizer; "
                        f"pick another --dataset name for a {tokenizer} version")
    source, label = _source(dataset, input, url)  # a bad name or file, before any work
    final = os.path.join(out_root, dataset)
    if foreign := foreign_files(final):
        more = f", ... ({len(foreign)} in all)" if len(foreign) > 3 else ""
        raise DataError(f"{final} holds files that data/prepare.py did not make "
                        f"({', '.join(foreign[:3])}{more}) and no meta.json: another tool's "
                        f"dataset, which nanoMeSH never writes over; give another {root_flag}, "
                        f"or move those files away")
    if described(final):
        raise DataError(f"{final} holds data made elsewhere (its meta.json is --indexed's), "
                        f"which nanoMeSH never writes over; give another --dataset")
    tok = named_tokenizer(tokenizer or DATASETS.get(dataset, "char"))
    started = time.perf_counter()
    made = [f for f in (out_root, final) if make_folder(f, dataset, out_root, root_flag)]
    try:  # one prepare of a dataset at a time: two would mix their files
        took = files.own(final, flag="--dataset", note=False)
    except UsageError:  # a live run's shared lock, or another prepare's
        raise DataError(f"dataset {dataset!r} in {out_root} is in use: a live train.py run "
                        f"reads it, or another data/prepare.py writes it ({final} is locked); "
                        f"wait for it to end, or prepare it under another name") from None
    files.remove_temporaries(final)  # the staging folders of killed prepares
    stage = files.temporary_name(os.path.join(final, "staging"), folder=True)
    try:
        if source is None:  # downloaded into the stage: it lands beside the .bin files
            source = os.path.join(stage, "input.txt")
            _download(label, source, dataset, out_root, log)
            if os.path.getsize(source) == 0:
                raise DataError(f"{label} is empty")
        meta = _tokenize(source, label, tok, stage, chunk_bytes, format, seq_len, num_proc)
        files.write_json(os.path.join(stage, "meta.json"), {
            "dataset": dataset, **meta, "source": os.path.abspath(input) if input else label})
        # commit: the old meta.json set aside, old files the new lack gone, meta.json in last
        if os.path.exists(os.path.join(final, "meta.json")):
            os.replace(os.path.join(final, "meta.json"), os.path.join(final, REPLACING))
        for name in MADE - set(os.listdir(stage)):
            files.remove(os.path.join(final, name))
        for name in sorted(os.listdir(stage), key=lambda name: name == "meta.json"):
            os.replace(os.path.join(stage, name), os.path.join(final, name))
        files.remove(os.path.join(final, REPLACING))
    except OSError as e:  # a full disk, most often (numpy's short write names no file)
        raise DataError(f"could not write dataset {dataset!r} in {out_root}: "
                        f"{files.why_write_failed(e, out_root)}; "
                        f"the dataset was not written") from None
    finally:
        files.remove(stage)
        if took:
            files.disown(final)
        for folder in reversed(made):
            remove_if_empty(folder)
    if dataset == "shakespeare_char":  # downloaded after all: no more falling back
        files.remove(os.path.join(out_root, OFFLINE))
    n, seconds = meta['train_tokens'] + meta['val_tokens'], time.perf_counter() - started
    log(f"prepare: {dataset}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
        f"vocab {meta['vocab_size']}, {meta['dtype']} -> {final} "
        f"({seconds:.1f} s, {n / seconds:,.0f} tokens/s, {num_proc} process(es))")
    return final


def remove_if_empty(folder):
    """Remove a folder this process made, if nothing but its lock file came into it."""
    with contextlib.suppress(OSError):
        if os.listdir(folder) == [files.LOCK]:
            os.remove(os.path.join(folder, files.LOCK))
        os.rmdir(folder)


def check_root_ours(out_root):
    """Refuse a data root of another project's (nanoGPT's data/) for first-use preparing."""
    if not os.path.isdir(out_root) or os.path.samefile(out_root, PROJECT_DATA):
        return
    if foreign := [n for n in sorted(os.listdir(out_root))
                   if not n.startswith(".") and foreign_files(os.path.join(out_root, n))]:
        raise DataError(f"--data_root={out_root} holds another tool's datasets "
                        f"({', '.join(foreign[:3])}: folders without meta.json), where nanoMeSH "
                        f"makes none on its own; give another --data_root, or prepare one there "
                        f"on purpose: python data/prepare.py --dataset NAME --out_root {out_root}")


def ensure_dataset(dataset, out_root=PROJECT_DATA, log=_stderr):
    """The dataset to train on, a known one prepared first (under OUT_ROOT's lock).
    Offline, shakespeare_char falls back on 'pydoc' and remembers why (OFFLINE)."""
    folder = dataset_folder(out_root, dataset)
    if folder and is_path(dataset):  # absolute: a run finds it again from anywhere
        prefix = read_meta(os.path.join(folder, "meta.json")).get("prefix", "")
        return os.path.abspath(os.path.join(folder, prefix))
    if folder:
        return dataset
    if os.path.isfile(dataset) and dataset not in DATASETS:
        raise DataError(f"{dataset} is a file, not a dataset; prepare its text with: python "
                        f"data/prepare.py --dataset NAME --input {quote(dataset)}"
                        f"{elsewhere(out_root)}, then train with --dataset=NAME")
    if is_path(dataset) and (foreign := foreign_files(dataset)):  # nanoGPT's?
        kept = [n for n in ("train.bin", "val.bin", "meta.pkl") if n in foreign]
        other = f" (its {', '.join(kept)}: another tool's format, nanoGPT's?)" if kept else ""
        raise DataError(f"{dataset} has no meta.json, by which nanoMeSH reads a dataset{other}; "
                        f"prepare its text with: "
                        f"python data/prepare.py --dataset NAME --input FILE")
    if is_path(dataset):
        raise DataError(f"there is no indexed dataset at {dataset} (neither {dataset}.idx + .bin "
                        f"nor {os.path.join(dataset, 'document')}.idx + .bin); put Pythia's "
                        f"pre-tokenized Pile there (README: Reproduce the paper) or make one with "
                        f"data/prepare.py --format=indexed")
    check_name(dataset)  # what is suggested below, prepare.py accepts
    if dataset not in DATASETS:
        raise DataError(f"dataset {dataset!r} is not in --data_root={out_root} "
                        f"(no {dataset}/meta.json there); give the --data_root that holds it, "
                        f"or prepare it with: python data/prepare.py "
                        f"--dataset {dataset} --input FILE{elsewhere(out_root)}")
    check_root_ours(out_root)
    made = make_folder(out_root, dataset, out_root, "--data_root")
    took = files.own(out_root, "--data_root", note=False, waiting=lambda: log(
        f"prepare: another process holds {out_root} (preparing data there, or a run whose "
        f"--out_dir it is); waiting for it"))
    try:
        return _first_use(dataset, out_root, log)
    finally:
        if took:
            files.disown(out_root)
        if made:
            remove_if_empty(out_root)


def _first_use(dataset, out_root, log):
    """ensure_dataset's work, under OUT_ROOT's lock."""
    if dataset_folder(out_root, dataset):
        return dataset
    offline, stand_in = os.path.join(out_root, OFFLINE), STAND_IN.get(dataset)
    if stand_in and os.path.isfile(offline):
        with open(offline, encoding="utf-8") as f:
            log(f"prepare: training on the offline 'pydoc' corpus: {f.read().strip()}; "
                f"python data/prepare.py --dataset shakespeare_char{elsewhere(out_root)} "
                "tries the download again")
        return _first_use(stand_in, out_root, log)
    try:
        prepare(dataset, out_root=out_root, log=log, root_flag="--data_root")
    except DownloadError as e:
        if not stand_in:
            raise
        log(f"prepare: Tiny Shakespeare could not be downloaded ({e.reason}); "
            "training on the offline 'pydoc' corpus instead")
        fallback = _first_use(stand_in, out_root, log)
        why = (f"Tiny Shakespeare could not be downloaded on {time.strftime('%Y-%m-%d %H:%M')} "
               f"({e.reason})")
        files.atomic_write(offline, lambda f: f.write(why), mode="w")
        return fallback
    return dataset


def describe_indexed(path, tokenizer, log=_stderr):
    """Write meta.json beside an indexed dataset made elsewhere (Pythia's Pile); returns it."""
    tok = named_tokenizer(tokenizer or "char")
    if tok is None:
        raise DataError("--indexed needs a BPE tokenizer: 'gpt2' or a tokenizer.json "
                        "(a character vocabulary is only known from its text)")
    ds = IndexedDataset(path)
    check_ids(ds.tokens, tok.vocab_size, ds.prefix + ".bin", "it was made with another tokenizer")
    folder, n_train = os.path.dirname(os.path.abspath(ds.prefix)), ds.train_tokens()
    made = os.path.join(folder, "meta.json")
    if os.path.exists(made) and not described(folder):
        raise DataError(f"{made} is data/prepare.py's, "
                        f"which --indexed never writes over; "
                        f"train on the dataset as it is, "
                        f"or remove {made} first")
    files.own(folder, "--indexed", shown=folder)  # held to the end: no live run reads it
    meta = {"dataset": os.path.basename(folder), **tok.to_meta(), "dtype": ds.dtype.name,
            "format": "indexed", "prefix": os.path.basename(ds.prefix), "sequences": len(ds),
            "train_tokens": n_train, "val_tokens": ds.n_tokens - n_train,
            "source": os.path.abspath(ds.prefix)}
    if tok.kind == "bpe":
        kept = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(kept):
            with open(tok.path, "rb") as src:
                files.atomic_write(kept, lambda f: shutil.copyfileobj(src, f))
        elif Tokenizer("bpe", path=kept).identity != tok.identity:
            raise DataError(f"{kept} exists and is another tokenizer; move it away first")
    files.write_json(os.path.join(folder, "meta.json"), meta)
    log(f"prepare: {ds.prefix}: {len(ds):,} sequences, {n_train:,} train + "
        f"{ds.n_tokens - n_train:,} val tokens, "
        f"vocab {tok.vocab_size}, {ds.dtype.name}; wrote {os.path.join(folder, 'meta.json')}")
    return folder


@dataclass
class PrepareConfig:
    """Tokenize text into NAME/train.bin, val.bin and meta.json (or document.bin/.idx)."""
    dataset: str | None = setting(None, "the output folder's name (known names below)")
    input: str | None = setting(None, "a local text file (UTF-8) to use instead of downloading",
                                path=True)
    url: str | None = setting(None, "the download address (default: $NANOMESH_SHAKESPEARE_URL, "
                              "or the canonical Tiny Shakespeare's)")
    tokenizer: str | None = setting(None, "char, gpt2, or a tokenizer.json (or a model folder "
                                    "holding one); default: the dataset's, or char", path=True)
    out_root: str = setting("data", "where NAME/ is written", path=True)
    format: str = setting("flat", "flat (train.bin + val.bin) or indexed (document.bin + .idx)")
    seq_len: int = setting(2049, "tokens per sequence of --format=indexed (Pythia's)")
    num_proc: int = setting(1, "processes that tokenize (the same output as one)")
    indexed: str | None = setting(None, "instead of tokenizing: write meta.json beside an indexed "
                                  "dataset PATH (PATH.idx + .bin), with --tokenizer", path=True)


def run(given):
    args = PrepareConfig(**given)
    if args.indexed:
        if args.dataset or args.input or args.url:
            raise DataError("--indexed describes an existing dataset: "
                            "drop --dataset, --input and --url")
        describe_indexed(args.indexed, args.tokenizer)
        return 0
    if not args.dataset:
        raise DataError("--dataset NAME is required (or --indexed PATH)")
    if "seq_len" in given and args.format != "indexed":  # a flat dataset is one stream of ids
        raise DataError("--seq_len is the indexed format's; add --format indexed, or drop it")
    prepare(args.dataset, input=args.input, url=args.url, tokenizer=args.tokenizer,
            out_root=data_root(args.out_root), format=args.format, seq_len=args.seq_len,
            num_proc=args.num_proc)
    return 0


def main(argv):
    return command.main("data/prepare.py", run, argv, PrepareConfig,
                        f"known datasets: {', '.join(sorted(DATASETS))}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
