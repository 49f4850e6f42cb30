"""
A dataset's meta.json, checked before use: what it must hold (tokenizer, vocab_size, a dtype that
holds every id) and what it may name (files of the dataset's own folder only), so that a damaged
or foreign one is one line naming it, never a traceback or a read outside the folder. And its
splits' files, checked as they are read: one that shrank is one line, never a SIGBUS.

    from data.meta import read_meta
    meta = read_meta("data/shakespeare_char/meta.json")
"""
import os
import weakref

import numpy as np

from data import DataError
from support import plain
from support.plain import plain_name

KINDS = ("char", "gpt2", "bpe")  # tokenizer.py's kinds
# check_ids checks every token id of a split up to SCAN_BYTES; beyond, SCAN_PIECES pieces of
# SCAN_PIECE_BYTES evenly spread (the first and the last included): a huge dataset starts fast
SCAN_BYTES = 1 << 30
SCAN_PIECES = 256
SCAN_PIECE_BYTES = 1 << 20
GPT2_VOCAB = 50257  # tiktoken's GPT-2 BPE (bpe.py's GPT2.VOCAB_SIZE, without loading tiktoken)


def dtype_for_vocab(vocab_size, indexed=False):
    """The token dtype of a dataset: uint16 for a vocabulary of up to 65,535, else uint32, or in
    the indexed format (which has no uint32) Megatron's int32."""
    if vocab_size <= 65535:
        return "uint16"
    return "int32" if indexed else "uint32"


def read_meta(path):
    """A dataset's meta.json as a dict; a damaged one is a DataError that names it."""
    try:
        meta = plain.read_json(path)  # a regular file of plain JSON, within size and depth limits
        if not isinstance(meta, dict) or not {"tokenizer", "dtype", "vocab_size"} <= set(meta):
            raise ValueError("no tokenizer, dtype or vocab_size")
        vocab = meta["vocab_size"]
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"vocab_size {vocab!r} is not a positive integer")
        kind = meta["tokenizer"]
        if kind not in KINDS:
            raise ValueError(f"tokenizer {kind!r:.40} is not one of {', '.join(KINDS)}")
        if kind == "char" and len(str(meta.get("chars") or "")) != vocab:
            raise ValueError(f"its {vocab} characters are missing")
        if kind != "char" and "chars" in meta:  # the vocabulary of one kind, the name of another
            raise ValueError(f"it holds a character vocabulary (chars) but says tokenizer {kind!r}")
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
        for key in ("tokenizer_file", "prefix"):
            if key in meta and not plain_name(meta[key]):
                raise ValueError(f"{key} {meta[key]!r:.60} is not a file name of the dataset's "
                                 f"own folder")
        return meta
    except (OSError, ValueError, TypeError) as e:  # TypeError: np.dtype of a thing not a dtype
        raise DataError(f"{path} is damaged ({type(e).__name__}: {e}); prepare the dataset again "
                        f"with python data/prepare.py") from None


def check_split_file(path, meta, expected, fix):
    """Raise DataError, ending with fix, unless path is a split's .bin that meta.json describes:
    a regular file, not empty, of whole tokens of its dtype, `expected` of them (None: any)."""
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
    """Raise DataError, ending with fix, for a token id of data (a split read from path) outside
    the vocabulary: every id up to SCAN_BYTES, past it those of SCAN_PIECES evenly spread pieces."""
    piece = max(1, SCAN_PIECE_BYTES // data.itemsize)
    if data.nbytes <= SCAN_BYTES:
        starts = range(0, len(data), piece)
    else:
        starts = np.linspace(0, max(0, len(data) - piece), SCAN_PIECES).astype(np.int64)
    pieces = [data[s:s + piece] for s in starts if len(data[s:s + piece])]
    top = max((int(p.max()) for p in pieces), default=0)
    signed = np.issubdtype(data.dtype, np.signedinteger)
    low = min((int(p.min()) for p in pieces), default=0) if signed else 0
    if top >= vocab_size or low < 0:
        raise DataError(f"{path} holds token id {top if low >= 0 else low}, outside the "
                        f"vocabulary of {vocab_size}; {fix}")


def hold(data, path):
    """Keep path open beside data, its memory map (closed with it), and its size now, which
    check_intact compares."""
    fd = os.open(path, os.O_RDONLY)
    weakref.finalize(data, os.close, fd)
    data.held = (fd, os.fstat(fd).st_size, path)


def check_intact(data):
    """Raise DataError when the file under a split of load_split's has shrunk since it was opened
    (another program truncated it, or rewrote it in place): a read past its new end would end the
    process with SIGBUS, without a word. Checked before every read of windows, on the file's
    own descriptor: a dataset replaced whole (prepare.py renames new files in) is not mistaken
    for it."""
    fd, size, path = getattr(data, "held", (None, 0, None))
    now = size if fd is None else os.fstat(fd).st_size
    if now < size:
        raise DataError(f"{path} shrank from {size:,} to {now:,} bytes while this process read "
                        f"it (another program truncated or rewrote it); nothing was read past "
                        f"its end: prepare the dataset again (python data/prepare.py) and resume "
                        f"the run")
