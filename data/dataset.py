"""
The dataset of a run, opened once: its folder (prepared on first use), its meta.json (read once),
the tokenizer, the train and val tokens, the record a checkpoint keeps, the vocabulary the model
pads to, the check that a model fits it, and the shared lock that keeps data/prepare.py off it
while a run reads it. train.py opens one; the scripts that read a checkpoint find its data with
checkpoint_dataset.

    data = Dataset.open(tc, None, distributed=False, master=True)  # a new run's: prepared first
    data.train, data.val, data.tokenizer, data.record, data.vocab_size
    data.check_fits(model.config)     # every token id has a row, each split holds a window
    folder = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"))  # refused if it changed
"""
import os

from data import DataError, data_root
from data.loader import dataset_folder, is_path, load_split
from data.meta import read_meta
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


def dataset_record(folder, meta=None):
    """What a checkpoint records of its training data: the tokenizer and its vocabulary, dtype,
    token counts and the source's sha256, from the dataset's meta.json (or meta, read already)."""
    if meta is None:
        meta = read_meta(os.path.join(folder, "meta.json"))
    keys = ("tokenizer", "encoding", "chars", "vocab_size", "dtype", "train_tokens", "val_tokens",
            "sha256", "tokenizer_sha256", "sequences")
    return {k: meta[k] for k in keys if k in meta}


def prepared(root, name):
    """--dataset, prepared first if it is not there (offline, shakespeare_char: pydoc's text)."""
    if dataset_folder(root, name):
        return name
    from data.prepare import ensure_dataset  # the write side, loaded only to make a dataset
    return ensure_dataset(name, root)


def checkpoint_dataset(train_config, trained_on=None, root=None):
    """The prepared folder of the dataset a checkpoint was (or is being) trained on; train_config:
    the TrainConfig saved in it, as a dict. trained_on: the checkpoint's record of that data
    (dataset_record); a folder whose meta.json now says otherwise is refused by name. root: a
    --data_root given, where the data is now, instead of the saved one (absolute since it is saved
    so; an older checkpoint's relative one is found by data_root's rule)."""
    name = train_config["dataset"]
    root = data_root(root or train_config.get("data_root", "data"))
    folder = trained_folder(root, name)
    check_unchanged(folder, name, trained_on, dataset_record(folder))
    return folder


def trained_folder(root, name):
    """The folder of the dataset a checkpoint trained on (data_root, dataset), or a DataError."""
    folder = dataset_folder(root, name)
    if folder is None and is_path(name):
        raise DataError(f"the checkpoint's dataset {name} is not there (no {name}.idx + .bin, nor "
                        f"{os.path.join(name, 'document')}.idx + .bin)")
    if folder is None:
        raise DataError(f"the checkpoint's dataset {name!r} is not in its --data_root={root} (no "
                        f"{os.path.join(root, name)}/meta.json): give the folder it moved to with "
                        f"--data_root, or prepare it with: python data/prepare.py --dataset {name}")
    return folder


def check_unchanged(folder, name, trained_on, now):
    """Refuse the dataset in folder, whose record is now, by name where it is not the data of a
    checkpoint's record trained_on (nothing to compare when it kept none)."""
    then = trained_on or {}
    changed = [k for k in sorted(set(then) | set(now)) if then and then.get(k) != now.get(k)]
    if changed:
        raise DataError(f"{os.path.join(folder, 'meta.json')} is not the data the checkpoint was "
                        f"trained on: " + ", ".join(_difference(k, then.get(k), now.get(k))
                                                    for k in changed)
                        + f"; prepare {name!r} again from its original text, or train a new run "
                        f"on this data")


def _difference(key, then, now):
    """One field of two dataset records that differ, in words (a vocabulary as the characters
    it gained or lost)."""
    if key == "chars" and isinstance(then, str) and isinstance(now, str):
        added, lost = "".join(sorted(set(now) - set(then))), "".join(sorted(set(then) - set(now)))
        words = ([f"{added!r} added"] if added else []) + ([f"{lost!r} removed"] if lost else [])
        return "characters " + (", ".join(words) or "in another order")
    short = lambda v: repr(v) if len(repr(v)) <= 20 else repr(v)[:17] + "..."  # noqa: E731
    return f"{key} {short(then)} then, {short(now)} now"
