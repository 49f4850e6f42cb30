"""
What a checkpoint keeps of the data it trained on, and the check that the data has not changed
since: a resume, sample.py and the tools that read a checkpoint find its dataset through here, and
a dataset prepared again from other text is refused by name rather than read as if it were the same.

    record = dataset_record("data/shakespeare_char")  # tokenizer, vocabulary, counts, sha256
    folder = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"))  # refused if it changed
"""
import os

from data import DataError, data_root
from data.loader import dataset_folder, is_path
from data.meta import read_meta


def dataset_record(folder, meta=None):
    """What a checkpoint records of its training data: the tokenizer and its vocabulary, dtype,
    token counts and the source's sha256, from the dataset's meta.json (or meta, read already)."""
    if meta is None:
        meta = read_meta(os.path.join(folder, "meta.json"))
    keys = ("tokenizer", "encoding", "chars", "vocab_size", "dtype", "train_tokens", "val_tokens",
            "sha256", "tokenizer_sha256", "sequences")
    return {k: meta[k] for k in keys if k in meta}


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
