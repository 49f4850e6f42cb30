"""
The Megatron / GPT-NeoX indexed dataset (MMIDIDX), the format of Pythia's pre-tokenized Pile
(document.bin + document.idx, 146,432,000 sequences of 2049 tokens): PREFIX.bin holds every
sequence's tokens back to back, PREFIX.idx where each starts. Read memory-mapped: nothing copied.

    ds = IndexedDataset("data/x/document")  # or the folder holding document.{bin,idx}
    ds[1]                                   # the tokens of sequence 1, a view of the .bin's map
    ds.tokens                               # every token, one memory-mapped 1-d array

The .idx file, all integers little-endian:

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    uint64    version (1)
    uint8     dtype code of the tokens (8 = uint16, 4 = int32, ...)
    uint64    n: the number of sequences
    uint64    m: the number of entries of the document index
    int32[n]  sizes: tokens in each sequence
    int64[n]  pointers: byte offset of each sequence in the .bin
    int64[m]  document index: the first sequence of each document, then n

Opening checks the header and that the sequences tile the .bin; else a DataError naming the file.
The last 1% of the sequences (at least one) are held out for validation.
"""
import functools
import os
import struct

import numpy as np

from configurator import DataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
FIELDS = "<QBQQ"  # version, dtype code, n, m
HEADER = len(MAGIC) + struct.calcsize(FIELDS)  # 34 bytes
# Megatron's dtype codes; only the integer ones can hold tokens
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
CODES = {np.dtype(t): c for c, t in DTYPES.items()}
CHECK_SLICE = 1 << 20  # sequences checked at a time: bounded memory for any index


def indexed_prefix(path):
    """PATH/document(.idx, .bin), or a folder holding them -> the prefix PATH/document, or None."""
    for prefix in (os.path.join(path, "document"), path,
                   path[:-4] if path.endswith((".idx", ".bin")) else None):
        if prefix and all(os.path.exists(prefix + ext) for ext in (".idx", ".bin")):
            for ext in (".idx", ".bin"):
                if not os.path.isfile(prefix + ext):
                    raise DataError(f"{prefix}{ext} is not a regular file (a folder, a FIFO "
                                    f"or a device?); give the files of an indexed dataset")
            return prefix
    return None


class IndexedDataset:
    def __init__(self, path):
        prefix = indexed_prefix(path)
        if prefix is None:
            raise DataError(f"{path} is not an indexed dataset: no {path}.idx and {path}.bin, "
                            f"nor document.idx and document.bin in it")
        self.prefix, idx = prefix, prefix + ".idx"
        fix = f"{idx} is not a valid MMIDIDX index"
        size = os.path.getsize(idx)
        with open(idx, "rb") as f:
            head = f.read(HEADER)
        if len(head) < HEADER or head[:len(MAGIC)] != MAGIC:
            raise DataError(f"{fix}: it does not start with the magic {MAGIC!r}; give the .idx of "
                            f"a Megatron / GPT-NeoX dataset (or write one with "
                            f"data/prepare.py --format=indexed)")
        version, code, n, m = struct.unpack(FIELDS, head[len(MAGIC):])
        if version != VERSION:
            raise DataError(f"{fix}: version {version}, expected {VERSION}")
        if code not in DTYPES:
            known = ", ".join(f"{c} = {np.dtype(t).name}" for c, t in sorted(DTYPES.items()))
            raise DataError(f"{fix}: dtype code {code} is not an integer token type "
                            f"(known: {known})")
        want = HEADER + 4 * n + 8 * n + 8 * m
        if size != want:
            raise DataError(f"{fix}: its header promises {n} sequences and {m} document entries "
                            f"({want} bytes) but the file has {size} bytes; it is truncated or "
                            f"damaged: download it again")
        self.dtype = np.dtype(DTYPES[code])
        part = lambda t, at: np.memmap(idx, t, "r", at, n) if n else np.zeros(0, t)  # noqa: E731
        self.sizes, self.pointers = part("<i4", HEADER), part("<i8", HEADER + 4 * n)
        self._check(os.path.getsize(prefix + ".bin"))
        self.tokens = (np.memmap(prefix + ".bin", dtype=self.dtype, mode="r") if self.n_tokens
                       else np.zeros(0, self.dtype))

    def _check(self, bin_bytes):
        """The sequences tile the .bin: consecutive pointers, the last ending at the file's end."""
        item, n, end = self.dtype.itemsize, len(self.sizes), 0
        bad = f"{self.prefix}.idx does not match {self.prefix}.bin"
        for lo in range(0, n, CHECK_SLICE):
            sizes = np.asarray(self.sizes[lo:lo + CHECK_SLICE], dtype=np.int64)
            pointers = self.pointers[lo:lo + CHECK_SLICE]
            starts = end + np.cumsum(sizes * item) - sizes * item
            wrong = np.flatnonzero((sizes < 0) | (pointers != starts))
            if len(wrong):
                i = lo + int(wrong[0])
                raise DataError(f"{bad}: sequence {i} has size {int(self.sizes[i])} at byte "
                                f"offset {int(self.pointers[i])}, expected a size >= 0 at offset "
                                f"{starts[wrong[0]]}; the index is damaged: download it again")
            end = int(starts[-1] + sizes[-1] * item)
        if end != bin_bytes:
            raise DataError(f"{bad}: the index covers {end} bytes "
                            f"({end // item} {self.dtype.name} tokens) but the .bin has "
                            f"{bin_bytes}; one of the two is truncated or from another dataset")
        self.n_tokens = end // item

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return self.tokens[self.token_offset(i):self.token_offset(i) + int(self.sizes[i])]

    def token_offset(self, i):  # where sequence i starts in self.tokens
        return int(self.pointers[i]) // self.dtype.itemsize

    def train_tokens(self):
        """How many tokens are train: those of all but the last 1% of the sequences."""
        if len(self) < 2:
            raise DataError(f"{self.prefix} has {len(self)} sequence(s): it needs 2 or more, "
                            f"the last 1% (at least one) being held out for validation")
        return self.token_offset(train_sequences(len(self)))


def write_index(prefix, sizes, dtype):
    """PREFIX.idx for a PREFIX.bin of sequences of `sizes` tokens, each its own document."""
    dtype, sizes = np.dtype(dtype), np.asarray(sizes, dtype="<i4")
    pointers = ((np.cumsum(sizes, dtype=np.int64) - sizes) * dtype.itemsize).astype("<i8")
    doc = np.arange(len(sizes) + 1, dtype="<i8")
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack(FIELDS, VERSION, CODES[dtype], len(sizes), len(doc)))
        for part in (sizes, pointers, doc):
            part.tofile(f)


def train_sequences(n):
    """How many of n sequences are train. Pythia's last 1% (1,464,320) are past the 250B tokens
    (about 122M sequences) that the paper's runs read."""
    return n - max(1, n // 100)


def split_tokens(prefix, split):
    """(a split's tokens of the indexed dataset PREFIX, memory-mapped; its .bin's path; the
    token of the .bin where the split starts)."""
    stamp = tuple((st.st_size, st.st_mtime_ns)
                  for st in (os.stat(prefix + ".idx"), os.stat(prefix + ".bin")))
    ds = _checked(os.path.abspath(prefix), stamp)
    cut = ds.train_tokens()
    tokens, start = (ds.tokens[:cut], 0) if split == "train" else (ds.tokens[cut:], cut)
    return tokens, ds.prefix + ".bin", start


@functools.lru_cache(maxsize=4)
def _checked(prefix, stamp):
    return IndexedDataset(prefix)
