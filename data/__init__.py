"""Data for nanoMeSH. Read: dataset.py (a run's Dataset, its batches), meta.py (a dataset's files
checked; the data a checkpoint trained on), tokenizer.py, bpe.py (tokenizer.json) and indexed.py
(the Pile's format). Written: prepare.py. data/README.md is the reference."""

from configurator import UsageError

import os

PROJECT_DATA = os.path.dirname(os.path.abspath(__file__))  # the project's data/ folder


class DataError(UsageError):
    """A problem with the data the user can fix: one line, exit 2."""


def data_root(root):
    """The absolute folder a --data_root (or --out_root) names: `data` is the project's data/;
    another relative root is from the working folder, or the project folder where only it exists."""
    if os.path.isabs(root):
        return root
    if os.path.normpath(root) == "data":
        return PROJECT_DATA
    here, there = os.path.abspath(root), os.path.join(os.path.dirname(PROJECT_DATA), root)
    return there if os.path.isdir(there) and not os.path.isdir(here) else here
