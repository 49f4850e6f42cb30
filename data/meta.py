"""
A dataset's files checked before use, where a dataset is, the record a checkpoint keeps of it, and
its tokenizer (the dataset a checkpoint trained on, found again from that record: trained_on.py).

    meta = read_meta("data/shakespeare_char/meta.json")
    folder = dataset_folder("data", "shakespeare_char")  # None until it is prepared
"""
import json
import os
import weakref

import numpy as np

from configurator import DataError
from support.files import plain_name, read_json

KINDS = ("char", "gpt2", "bpe")  # Tokenizer's kinds
SCAN_BYTES = 1 << 30
SCAN_PIECES = 256
SCAN_PIECE_BYTES = 1 << 20
GPT2_VOCAB = 50257  # GPT-2's, without loading tiktoken
STAND_IN = {"shakespeare_char": "pydoc"}  # offline, prepare.py trains on this in its place
PROJECT_DATA = os.path.dirname(os.path.abspath(__file__))  # the project's data/ folder


def data_root(root):
    """The absolute folder a --data_root (or --out_root) names: `data` is the project's data/;
    another relative one is from the working folder, or the project folder where only it exists."""
    if os.path.isabs(root):
        return root
    if os.path.normpath(root) == "data":
        return PROJECT_DATA
    here, there = os.path.abspath(root), os.path.join(os.path.dirname(PROJECT_DATA), root)
    return there if os.path.isdir(there) and not os.path.isdir(here) else here


def dtype_for_vocab(vocab_size, indexed=False):
    """uint16 for up to 65,535 token ids, else uint32 (in the indexed format, Megatron's int32)."""
    if vocab_size <= 65535:
        return "uint16"
    return "int32" if indexed else "uint32"


def read_meta(path):
    """A dataset's meta.json as a dict; a damaged one is a DataError that names it."""
    try:
        meta = read_json(path)
        if not isinstance(meta, dict) or not {"tokenizer", "dtype", "vocab_size"} <= set(meta):
            raise ValueError("no tokenizer, dtype or vocab_size")
        vocab = meta["vocab_size"]
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"vocab_size {vocab!r} is not a positive integer")
        for key in ("train_tokens", "val_tokens"):  # a split's size is checked against them
            if type(meta.get(key, 0)) is not int:
                raise ValueError(f"{key} {meta[key]!r:.40} is not a count of tokens")
        kind = meta["tokenizer"]
        if kind not in KINDS:
            raise ValueError(f"tokenizer {kind!r:.40} is not one of {', '.join(KINDS)}")
        chars = meta.get("chars")
        if kind == "char" and not (isinstance(chars, str) and len(chars) == vocab):
            raise ValueError(f"its {vocab} characters are missing")
        if kind != "char" and "chars" in meta:
            raise ValueError(f"it has a character vocabulary (chars) but says tokenizer {kind!r}")
        if kind == "gpt2" and vocab != GPT2_VOCAB:
            raise ValueError(f"vocab_size {vocab} is not GPT-2's {GPT2_VOCAB}")
        indexed = meta.get("format") == "indexed"
        if indexed:  # any integer dtype of the index that holds every id
            dtype = np.dtype(meta["dtype"])
            fits = np.issubdtype(dtype, np.integer) and np.iinfo(dtype).max >= vocab - 1
        else:  # the one prepare.py writes
            fits = meta["dtype"] == dtype_for_vocab(vocab)
        if not fits:
            raise ValueError(f"dtype {meta['dtype']!r} does not hold a vocabulary of {vocab}, "
                             f"{dtype_for_vocab(vocab, indexed)} does")
        for key in ("tokenizer_file", "prefix"):  # an indexed dataset's prefix: its .idx, .bin
            if (key in meta or indexed and key == "prefix") and not plain_name(meta.get(key)):
                raise ValueError(f"{key} {meta.get(key)!r:.60} is not a file name of the "
                                 f"dataset's own folder")
        return meta
    except (OSError, ValueError, TypeError) as e:
        raise DataError(f"{path} is damaged ({type(e).__name__}: {e}); prepare the dataset again "
                        f"with python data/prepare.py") from None


def check_split_file(path, meta, expected, fix):
    """Raise DataError, ending with fix, unless path is a split's .bin as meta.json describes."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise DataError(f"{path} is not a regular file (a folder, a FIFO or a device?); {fix}")
    if not os.path.isfile(path):
        raise DataError(f"{path} is missing; {fix}")
    size, item = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize
    if size == 0:
        raise DataError(f"{path} is empty; {fix}")
    if size % item:
        raise DataError(f"{path} has {size} bytes, not a whole number of {meta['dtype']} "
                        f"tokens; {fix}")
    if expected is not None and size // item != expected:
        raise DataError(f"{path} holds {size // item:,} tokens but meta.json says "
                        f"{expected:,}; {fix}")


def check_ids(data, vocab_size, path, fix):
    """Raise DataError, ending with fix, for a token id of data outside the vocabulary."""
    piece = max(1, SCAN_PIECE_BYTES // data.itemsize)
    if data.nbytes <= SCAN_BYTES:
        starts = range(0, len(data), piece)
    else:
        starts = np.linspace(0, max(0, len(data) - piece), SCAN_PIECES).astype(np.int64)
    pieces = [data[s:s + piece] for s in starts]
    top = max((int(p.max()) for p in pieces), default=0)
    signed = np.issubdtype(data.dtype, np.signedinteger)
    low = min((int(p.min()) for p in pieces), default=0) if signed else 0
    if top >= vocab_size or low < 0:
        raise DataError(f"{path} holds token id {top if low >= 0 else low}, outside the "
                        f"vocabulary of {vocab_size}; {fix}")


def hold(data, path, first):
    """Keep path open beside data, its memory map of the file's tokens from token `first` on,
    until it closes; the file's size now (read_tokens)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    weakref.finalize(data, os.close, fd)
    data.held = (fd, os.fstat(fd).st_size, path, first * data.itemsize)


def read_tokens(data, start, n):
    """data[start:start + n] as int64. A held split is read from its file, not through its map:
    a file cut short under the run then reads short (DataError), where a read through the map
    would stop the process with a SIGBUS, and no check before the read could close that race."""
    held = getattr(data, "held", None)
    if held is None:
        return np.asarray(data[start:start + n], dtype=np.int64)
    fd, size, path, at = held
    want = n * data.itemsize
    os.lseek(fd, at + start * data.itemsize, os.SEEK_SET)
    raw = os.read(fd, want)
    if len(raw) < want:  # a regular file reads short only at its end
        raise DataError(f"{path} shrank from {size:,} to {os.fstat(fd).st_size:,} bytes while "
                        f"this process read it (another program truncated or rewrote it); "
                        f"nothing was read past its end: prepare the dataset again "
                        f"(python data/prepare.py) and resume the run")
    return np.frombuffer(raw, dtype=data.dtype).astype(np.int64)


# -----------------------------------------------------------------------------
# Where a dataset is, and the record a checkpoint keeps of it

def is_path(dataset):
    """A --dataset that names a path (PATH/document, a folder), not a folder of data_root."""
    return "/" in dataset or os.sep in dataset


def dataset_folder(root, name):
    """The folder of dataset `name` under data_root `root`, or None; a --dataset path (is_path) is
    tried from the working folder, then from the project folder."""
    if not is_path(name):
        folder = os.path.join(data_root(root), name)
        return folder if os.path.isfile(os.path.join(folder, "meta.json")) else None
    from data.indexed import indexed_prefix  # (the Pile's format: read only for a path)
    bases = [name, os.path.join(os.path.dirname(PROJECT_DATA), name)]  # join keeps absolute names
    prefix = next((p for p in map(indexed_prefix, bases) if p), None)
    if prefix is None:  # a prepared folder of either format, given by its path
        return next((b for b in bases if os.path.isfile(os.path.join(b, "meta.json"))), None)
    folder = os.path.dirname(prefix)
    if not os.path.isfile(os.path.join(folder, "meta.json")):
        raise DataError(f"{prefix} has no meta.json beside it to name its tokenizer; write one "
                        f"with: python data/prepare.py --indexed {prefix} --tokenizer TOKENIZER "
                        f"(for Pythia's Pile: the tokenizer.json of any Pythia model)")
    meta = read_meta(os.path.join(folder, "meta.json"))
    if meta.get("prefix") != os.path.basename(prefix):
        raise DataError(f"{os.path.join(folder, 'meta.json')} describes {meta.get('prefix')!r}, "
                        f"not {os.path.basename(prefix)!r}; write it again with: python "
                        f"data/prepare.py --indexed {prefix} --tokenizer TOKENIZER")
    return folder


def dataset_record(folder, meta=None):
    """What a checkpoint records of its data, from the dataset's meta.json (or meta)."""
    if meta is None:
        meta = read_meta(os.path.join(folder, "meta.json"))
    keys = ("tokenizer", "encoding", "chars", "vocab_size", "dtype", "train_tokens", "val_tokens",
            "sha256", "tokenizer_sha256", "sequences")
    return {k: meta[k] for k in keys if k in meta}


# -----------------------------------------------------------------------------
# Text <-> token ids for every kind of dataset, from its meta.json: "char", "gpt2" (tiktoken's)
# and "bpe" (a tokenizer.json such as Pythia's, bpe.py)

class Tokenizer:
    """Character-level, or a subword vocabulary of bpe.py; to_meta() is its part of meta.json."""

    def __init__(self, kind, chars=None, encoding="gpt2", path=None):
        self.kind = kind
        if kind in ("gpt2", "bpe"):
            from data.bpe import GPT2, ByteLevelBPE
            self._bpe = GPT2(encoding) if kind == "gpt2" else ByteLevelBPE(path)
            self.vocab_size, self.path = self._bpe.vocab_size, getattr(self._bpe, "file", None)
        else:  # "char"
            self.chars = list(chars)
            if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
                raise DataError("char vocabulary must be distinct single characters")
            # ids are positions in self.chars; a sorted copy of the code points lets numpy
            # map a whole chunk at once with searchsorted, whatever order chars came in
            cps = np.array([ord(c) for c in self.chars], dtype=np.uint32)
            self._order = np.argsort(cps)
            self._sorted = cps[self._order]
            self.vocab_size = len(self.chars)

    @classmethod
    def from_meta(cls, meta, folder=None):
        """folder: the dataset folder, where a byte-level BPE's tokenizer.json is kept."""
        if meta["tokenizer"] == "char":
            return cls("char", chars=meta["chars"])
        if meta["tokenizer"] == "bpe":
            file = meta.get("tokenizer_file", "tokenizer.json")
            tok = cls("bpe", path=os.path.join(folder or ".", file))
            if tok.identity != meta.get("tokenizer_sha256", tok.identity):
                raise DataError(f"{tok.path} is not the tokenizer this dataset was made with (its "
                                f"sha256 differs from meta.json's); prepare the dataset again")
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
            return {"tokenizer": "char", "chars": "".join(self.chars),
                    "vocab_size": self.vocab_size}
        return {**self._bpe.to_meta(), "vocab_size": self.vocab_size}

    @property
    def identity(self):
        """Equal for tokenizers that give the same ids: a subword vocabulary's fingerprint."""
        if self.kind == "bpe":
            return self._bpe.fingerprint
        return json.dumps(self.to_meta(), sort_keys=True)

    @property
    def eot_id(self):
        """The end-of-text token's id, or None (character vocabularies have none)."""
        return None if self.kind == "char" else self._bpe.eot_id

    @property
    def default_prompt(self):
        """A new line, where the training text has one; else the empty prompt (token 0)."""
        return "\n" if self.kind != "char" or "\n" in self.chars else ""

    def encode_array(self, text):
        if self.kind != "char":
            return np.array(self._bpe.encode(text), dtype=np.int64)
        cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        pos = np.minimum(np.searchsorted(self._sorted, cps), len(self._sorted) - 1)
        unknown = self._sorted[pos] != cps
        if unknown.any():
            bad = sorted({chr(c) for c in cps[unknown]})
            more = f", ... ({len(bad)} in all)" if len(bad) > 10 else ""
            raise DataError("characters not in the vocabulary: " + ", ".join(map(repr, bad[:10]))
                            + more + f"; this character-level model knows only the "
                            f"{self.vocab_size} characters of its training text: leave them out")
        return self._order[pos]

    def encode(self, text):
        return self.encode_array(text).tolist()

    def decode(self, ids):  # ids past the vocabulary (the model pads it) dropped
        ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        if self.kind != "char":
            return self._bpe.decode(ids)
        return "".join(self.chars[i] for i in ids)
