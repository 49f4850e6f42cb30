"""
The dataset of a run, opened once: its folder (prepared on first use), its meta.json (read once),
the tokenizer, the train and val tokens, the record a checkpoint keeps (record.py), the vocabulary
the model pads to, the check that a model fits it, and the shared lock that keeps data/prepare.py
off it while a run reads it. And a run's batches of it: get_batch, and the steps the data allows.

    data = Dataset.open(tc, None, distributed=False, master=True)  # a new run's: prepared first
    data.train, data.val, data.tokenizer, data.record, data.vocab_size
    data.check_fits(model.config)     # every token id has a row, each split holds a window
    x, y = get_batch(data.train, tc, block_size, (0, step, micro_batch), "cpu")  # (B, T) each
"""
import os

import torch

from data import DataError, data_root
from data.loader import dataset_folder, load_split, random_windows, sequential_windows
from data.meta import read_meta
from data.record import check_unchanged, dataset_record, trained_folder
from data.tokenizer import Tokenizer
from support import machine, runfiles

PAD_TO = 64  # a subword vocabulary's model rows: a multiple of 64 (faster matmuls)


class Dataset:
    """A prepared dataset folder, read for a run: lock, meta.json, tokenizer, both splits."""

    def __init__(self, folder, name, trained_on=None):
        """trained_on: a resumed run's record of its data, which this data must still match."""
        self.folder, self.name = folder, name
        runfiles.own(folder, "--dataset", note=False, shared=True)  # prepare.py waits for this run
        meta = read_meta(os.path.join(folder, "meta.json"))
        self.record = dataset_record(folder, meta)  # what a checkpoint keeps of it
        if trained_on is not None:
            check_unchanged(folder, name, trained_on, self.record)
        self.tokenizer = Tokenizer.from_meta(meta, folder)
        self.train = load_split(folder, "train", meta)
        self.val = load_split(folder, "val", meta)

    @classmethod
    def open(cls, tc, trained_on, distributed, master):
        """The dataset of TrainConfig tc (--data_root, --dataset). A fresh run's (trained_on None)
        is prepared first where it is not there (by rank 0; offline, shakespeare_char trains on
        pydoc's text, and tc.dataset says so). A resumed run's (trained_on: its checkpoint's record,
        or {}) is the one it trained on, refused by name if it changed since. tc.data_root is made
        absolute (data_root's rule), so that a checkpoint says where its data is, for any folder."""
        tc.data_root = data_root(tc.data_root)
        if trained_on is None:
            tc.dataset = machine.from_rank0(lambda: prepared(tc.data_root, tc.dataset),
                                            distributed, master)
            folder = dataset_folder(tc.data_root, tc.dataset)
        else:
            folder = trained_folder(tc.data_root, tc.dataset)
        return cls(folder, tc.dataset, trained_on)

    @property
    def vocab_size(self):
        """The model's vocabulary for this data: a character set's own size, a subword
        vocabulary's padded to a multiple of PAD_TO."""
        size = self.tokenizer.vocab_size
        if self.tokenizer.kind == "char":
            return size
        return -(-size // PAD_TO) * PAD_TO

    def check_fits(self, cfg):
        """Raise DataError unless the model (its Config) can train on this data: every token id
        has a row in its vocabulary, and each split holds a window of block_size + 1 tokens."""
        tokenizer, name = self.tokenizer, self.name
        if cfg.vocab_size < tokenizer.vocab_size:
            raise DataError(f"dataset {name!r} has {tokenizer.vocab_size} tokens but the model's "
                            f"vocabulary is {cfg.vocab_size}; use a dataset made with the model's "
                            f"tokenizer")
        for split, data in (("training", self.train), ("validation", self.val)):
            if len(data) < cfg.block_size + 1:
                where = f" in {data.filename}" if split == "training" else ""
                raise DataError(f"block_size {cfg.block_size} is longer than the {split} split of "
                                f"{name!r} ({len(data)} tokens{where}); use a smaller --block_size "
                                f"or more text")

    def steps(self, tc, block_size):
        """The optimizer steps the run takes: --max_iters, or with --data_order=sequential at most
        those of its --epochs passes over the training windows of block_size + 1 tokens."""
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
    """(inputs, targets), (B, T) each, from tc.batch_size windows of block_size + 1 tokens, chosen
    by key alone: (0, step, micro-batch) to train, (split code, 0, k) to evaluate. Random: windows
    at starts seeded by (seed, *key); sequential (training): micro-batch m of step it is windows
    (it * grad_accum + m) * batch_size on (Pythia's data in Pythia's steps: data/README.md)."""
    if tc.data_order == "sequential" and key[0] == 0:
        _, it, m = key
        first = (it * tc.grad_accum + m) * tc.batch_size
        rows = sequential_windows(data, block_size + 1, first, tc.batch_size)
    else:
        rows = random_windows(data, block_size + 1, tc.batch_size, [tc.seed, *key])
    xy = torch.from_numpy(rows).to(device, non_blocking=True)  # (B, T+1)
    return xy[:, :-1], xy[:, 1:]


def prepared(root, name):
    """--dataset, prepared first if it is not there (offline, shakespeare_char: pydoc's text)."""
    if dataset_folder(root, name):
        return name
    from data.prepare import ensure_dataset  # the write side, loaded only to make a dataset
    return ensure_dataset(name, root)
