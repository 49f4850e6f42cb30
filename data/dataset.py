"""
The dataset of a run, opened once (its tokens, tokenizer and record), and its batches (get_batch).

    data = Dataset.open("data", "shakespeare_char", None)  # a new run's: prepared first
    data.root, data.name, data.train, data.val, data.tokenizer, data.record, data.vocab_size
    data.check_fits(model.config)     # every token id has a row, each split holds a window
    x, y = get_batch(data.train, tc, block_size, (0, step, micro_batch), "cpu")  # (B, T) each

A dataset is a folder with meta.json and train.bin + val.bin, or document.bin + .idx (indexed.py).
"""
import os

import numpy as np
import torch

from data.meta import (DataError, Tokenizer, check_ids, check_split_file, data_root,
                       dataset_folder, dataset_record, hold, read_meta, read_tokens)
from support import files
from support.distributed import from_rank0

PAD_TO = 64  # a subword vocabulary's model rows: a multiple of 64 (faster matmuls)


class Dataset:
    """A prepared dataset folder, read for a run: lock, meta.json, tokenizer, both splits."""

    def __init__(self, root, name, folder, trained_on=None):
        """trained_on: a resumed run's record of its data, which this data must still match."""
        self.root, self.name = root, name
        files.own(folder, "--dataset", note=False, shared=True)
        meta = read_meta(os.path.join(folder, "meta.json"))
        self.record = dataset_record(folder, meta)  # what a checkpoint keeps of it
        if trained_on is not None:  # (a resume's: data/trained_on.py, imported only then)
            from data.trained_on import check_unchanged
            check_unchanged(folder, name, trained_on, self.record)
        self.tokenizer = Tokenizer.from_meta(meta, folder)
        self.train = load_split(folder, "train", meta)
        self.val = load_split(folder, "val", meta)

    @classmethod
    def open(cls, root, name, trained_on):
        """--dataset `name` of --data_root `root`: a fresh run's (trained_on None) prepared first,
        by rank 0 under torchrun (offline, Tiny Shakespeare is replaced by its stand-in); a resumed
        run's the data it trained on (its record), refused if it changed since."""
        root = data_root(root)
        if trained_on is None:  # data/prepare.py's: the dataset as it is, or prepared now
            from data.prepare import ensure_dataset
            name = from_rank0(lambda: ensure_dataset(name, root))
            return cls(root, name, dataset_folder(root, name))
        from data.trained_on import trained_folder
        return cls(root, *trained_folder(root, name, trained_on), trained_on)

    @property
    def vocab_size(self):
        """The model's vocabulary: a character set's size, a subword one's padded to PAD_TO."""
        size = self.tokenizer.vocab_size
        if self.tokenizer.kind == "char":
            return size
        return -(-size // PAD_TO) * PAD_TO

    def check_fits(self, cfg):
        """Raise DataError unless the model (its Config) can train on this data."""
        tokenizer, name = self.tokenizer, self.name
        if cfg.vocab_size < tokenizer.vocab_size:
            raise DataError(f"dataset {name!r} has {tokenizer.vocab_size} tokens but the model's "
                            f"vocabulary is {cfg.vocab_size}; use a dataset made with the model's "
                            f"tokenizer")
        for split, data in (("training", self.train), ("validation", self.val)):
            if len(data) < cfg.block_size + 1:
                where = f" in {data.filename}" if split == "training" else ""
                raise DataError(f"block_size {cfg.block_size} + 1 is longer than the {split} "
                                f"split of {name!r} ({len(data)} tokens{where}); use a smaller "
                                f"--block_size or more text")

    def steps(self, tc, block_size):
        """The optimizer steps: --max_iters, or with sequential data at most --epochs passes."""
        if tc.data_order != "sequential":
            return tc.max_iters
        windows = len(self.train) // (block_size + 1)
        return min(tc.max_iters, tc.epochs * windows // (tc.batch_size * tc.grad_accum))

    def ran_out(self, iter_num, tc, block_size):
        """The note of a --data_order=sequential run whose --epochs passes are read."""
        window = block_size + 1
        windows = len(self.train) // window
        seen = iter_num * tc.batch_size * tc.grad_accum
        return (f"the data ran out at iter {iter_num} (--max_iters={tc.max_iters}): "
                f"{seen / windows:.3f} epoch(s) of {windows:,} windows of {window} tokens read "
                f"in order, {seen * window:,} tokens seen; allow more passes with "
                f"--init_from=resume --epochs={tc.epochs + 1}")


def get_batch(data, tc, block_size, key, device):
    """(inputs, targets), (B, T) each, windows chosen by key alone: (0, step, micro-batch) to
    train, (split code, 0, k) to evaluate; sequential: Pythia's order (data/README.md)."""
    if tc.data_order == "sequential" and key[0] == 0:
        _, it, m = key
        first = (it * tc.grad_accum + m) * tc.batch_size
        rows = sequential_windows(data, block_size + 1, first, tc.batch_size)
    else:
        rows = random_windows(data, block_size + 1, tc.batch_size, [tc.seed, *key])
    xy = torch.from_numpy(rows).to(device, non_blocking=True)  # (B, T+1)
    return xy[:, :-1], xy[:, 1:]


def load_split(data_dir, split, meta=None):
    """A split's tokens, memory-mapped as one 1-d array, checked against meta.json first."""
    if meta is None:
        meta = read_meta(os.path.join(data_dir, "meta.json"))
    name = os.path.basename(os.path.normpath(data_dir))
    fix = f"prepare the dataset again: python data/prepare.py --dataset {name}"
    if meta.get("format") == "indexed":  # the Pile's format: indexed.py
        from data.indexed import split_tokens
        data, path, first = split_tokens(os.path.join(data_dir, meta["prefix"]), split)
    else:
        path = os.path.join(data_dir, f"{split}.bin")
        check_split_file(path, meta, meta.get(f"{split}_tokens"), fix)
        data, first = np.memmap(path, dtype=meta["dtype"], mode="r"), 0
    hold(data, path, first)  # windows are read from the file: a shrunk file is one line
    check_ids(data, meta["vocab_size"], path, fix)
    return data


def random_windows(data, length, n, seed):
    """n windows of `length` tokens of data at starts drawn by default_rng(seed) -> int64 array
    (n, length); the same arguments give the same windows."""
    if len(data) < length:
        raise DataError(f"the split has {len(data)} tokens, fewer than one window of {length}")
    starts = np.random.default_rng(seed).integers(0, len(data) - length + 1, size=n)
    return np.stack([read_tokens(data, int(s), length) for s in starts])


def sequential_windows(data, length, first, n):
    """Windows first ... first+n-1 of data cut into windows of `length` -> int64 (n, length);
    past the last whole window the count starts again at 0 (a next epoch)."""
    per_epoch = len(data) // length
    if per_epoch == 0:
        raise DataError(f"the data ({len(data)} tokens) is shorter than one window of {length} "
                        f"tokens")
    return np.stack([read_tokens(data, (k % per_epoch) * length, length)
                     for k in range(first, first + n)])
