"""
The dataset a checkpoint trained on, found again from the record it keeps (meta.dataset_record) and
refused where it changed since: for a resume (Dataset.open) and every reader of a checkpoint.

    folder = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"))  # refused if it changed
"""
import os
from shlex import quote

from configurator import DataError
from data.meta import PROJECT_DATA, STAND_IN, data_root, dataset_folder, dataset_record, is_path


def checkpoint_dataset(train_config, trained_on=None, root=None):
    """The folder of the dataset a checkpoint trained on, refused where it no longer matches."""
    root = data_root(root or train_config.get("data_root", "data"))
    name, folder = trained_folder(root, train_config["dataset"], trained_on)
    check_unchanged(folder, name, trained_on, dataset_record(folder))
    return folder


def trained_folder(root, name, trained_on):
    """(name, folder) of the dataset a run trained on, asked for by `name` under `root`: offline
    a run of Tiny Shakespeare trained on its stand-in (prepare.py), which a name still means."""
    folder, stand_in = dataset_folder(root, name), STAND_IN.get(name)
    stand_in_folder = folder is None and stand_in and dataset_folder(root, stand_in)
    if stand_in_folder and trained_on == dataset_record(stand_in_folder):
        return stand_in, stand_in_folder
    if folder is None and is_path(name):
        raise DataError(f"dataset {name} is not there (no {name}.idx + .bin, nor "
                        f"{os.path.join(name, 'document')}.idx + .bin)")
    if folder is None:
        raise DataError(f"dataset {name!r} is not in --data_root={root} (no "
                        f"{os.path.join(root, name)}/meta.json): give the folder it moved to with "
                        f"--data_root or prepare it with: python data/prepare.py --dataset {name}"
                        f"{elsewhere(root)}")
    return name, folder


def elsewhere(out_root):  # a suggested prepare command's --out_root
    return "" if out_root in ("data", PROJECT_DATA) else f" --out_root {quote(out_root)}"


def check_unchanged(folder, name, trained_on, now):
    """Refuse the dataset in folder where it is not the one trained_on records."""
    then = trained_on or {}
    changed = [k for k in sorted(set(then) | set(now)) if then and then.get(k) != now.get(k)]
    if changed:
        raise DataError(f"{os.path.join(folder, 'meta.json')} is not the data the checkpoint was "
                        f"trained on: " + ", ".join(_difference(k, then.get(k), now.get(k))
                                                    for k in changed)
                        + f"; prepare {name!r} again from its original text, or train a new run "
                        f"on this data")


def _difference(key, then, now):
    """One field of two dataset records that differ, in words (characters gained or lost)."""
    if key == "chars" and isinstance(then, str) and isinstance(now, str):
        added, lost = "".join(sorted(set(now) - set(then))), "".join(sorted(set(then) - set(now)))
        words = ([f"{added!r} added"] if added else []) + ([f"{lost!r} removed"] if lost else [])
        return "characters " + (", ".join(words) or "in another order")
    short = lambda v: repr(v) if len(repr(v)) <= 20 else repr(v)[:17] + "..."  # noqa: E731
    return f"{key} {short(then)} then, {short(now)} now"
