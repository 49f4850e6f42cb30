"""
Reading a prepared dataset: where it is, its meta.json, its train and val tokens, and windows of
them. train.py, sample.py, probe.py, table1.py and lm_eval_mesh.py all read data through these.

    from data.loader import dataset_folder, load_split, random_windows
    folder = dataset_folder("data", "shakespeare_char")   # data/shakespeare_char (prepare.py's)
    val = load_split(folder, "val")                        # memory-mapped token ids, checked first
    x = random_windows(val, 65, 16, seed=[1337, 2, 0, 0])  # (16, 65) int64, the same for a seed

A dataset is a folder with meta.json (tokenizer, vocab_size, dtype, token counts, the source's
sha256) and either train.bin + val.bin (flat token ids) or an indexed dataset, Megatron /
GPT-NeoX's document.bin + document.idx (indexed.py). A run opens its dataset through dataset.py's
Dataset, which also keeps the record a checkpoint holds of it.
"""
import os

import numpy as np

from data import DataError, data_root
from data.meta import check_ids, check_intact, check_split_file, hold, read_meta

DEFAULT_ROOT = os.path.dirname(os.path.abspath(__file__))  # data/, where prepare.py writes


def is_path(dataset):
    """A --dataset that names a path (PATH/document, a folder holding document.{bin,idx}) rather
    than a folder of data_root."""
    return "/" in dataset or os.sep in dataset


def dataset_folder(root, name):
    """The folder of prepared dataset `name` under data_root `root` (data_root's rule), or None; a
    path (is_path): the indexed dataset's folder, or the prepared one it names (dataset_at)."""
    if is_path(name):
        from data.indexed import dataset_at
        return dataset_at(name, os.path.dirname(DEFAULT_ROOT))
    folder = os.path.join(data_root(root), name)
    return folder if os.path.isfile(os.path.join(folder, "meta.json")) else None


def load_split(data_dir, split, meta=None):
    """The train or val tokens of a prepared dataset, memory-mapped (read-only), as one 1-d array,
    checked against its meta.json first (meta.py: its size and token count, every token id below
    the vocabulary size). An indexed dataset's are its sequences back to back: train all but the
    last 1%, val those (indexed.py); its index is checked against its .bin when opened. meta: its
    meta.json, read already."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    if meta is None:
        meta = read_meta(os.path.join(data_dir, "meta.json"))
    name = os.path.basename(os.path.normpath(data_dir))
    fix = f"prepare the dataset again: python data/prepare.py --dataset {name}"
    if meta.get("format") == "indexed":  # the Pile's format: indexed.py
        from data.indexed import split_tokens
        data, path = split_tokens(os.path.join(data_dir, meta["prefix"]), split)
    else:
        path = os.path.join(data_dir, f"{split}.bin")
        check_split_file(path, meta, meta.get(f"{split}_tokens"), fix)
        data = np.memmap(path, dtype=meta["dtype"], mode="r")
    hold(data, path)  # a file that shrinks later is refused before a read (check_intact)
    check_ids(data, meta["vocab_size"], path, fix)
    return data


def random_windows(data, length, n, seed):
    """n windows of `length` consecutive tokens of data (a 1-d array) at starts drawn by
    np.random.default_rng(seed) (an int or a list of ints), any start from 0 to the last that
    fits -> int64 array (n, length). The same arguments give the same windows: train.py's random
    batches (length block_size + 1, seeded by (seed, step, micro-batch)) and probe.py's samples."""
    if len(data) < length:
        raise DataError(f"the split has {len(data)} tokens, fewer than one window of {length}")
    starts = np.random.default_rng(seed).integers(0, len(data) - length + 1, size=n)
    check_intact(data)
    return np.stack([np.asarray(data[s:s + length], dtype=np.int64) for s in starts])


def sequential_windows(data, length, first, n):
    """Windows first ... first+n-1 of data cut into consecutive windows of `length` tokens -> int64
    array (n, length); window k is data[k*length : (k+1)*length]. Past the last whole window the
    count starts again at 0 (a next epoch, same order); the tokens after it are never read. On an
    indexed dataset of sequences of `length` tokens (Pythia's: 2049) window k is sequence k."""
    per_epoch = len(data) // length
    if per_epoch == 0:
        raise DataError(f"the data ({len(data)} tokens) is shorter than one window of {length} "
                        f"tokens")
    check_intact(data)
    return np.stack([np.asarray(data[s:s + length], dtype=np.int64)
                     for s in ((k % per_epoch) * length for k in range(first, first + n))])
