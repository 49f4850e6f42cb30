"""Data for nanoMeSH. The reading side: dataset.py (a run's Dataset, its splits and batches),
meta.py (a dataset's files checked; the data a checkpoint trained on), tokenizer.py, bpe.py
(tokenizer.json files) and indexed.py (the Pile's format). The writing side: prepare.py, the command
that makes datasets. data/README.md is the reference. data/ uses support/'s locks and atomic
writes; support/ never imports data/."""

from configurator import UsageError

import os

PROJECT_DATA = os.path.dirname(os.path.abspath(__file__))  # the project's data/ folder


class DataError(UsageError):
    """A problem with the data that the user can fix (a missing, damaged or changed file, an
    unknown dataset, a tokenizer that cannot be run): the entry points print it as one line and
    exit 2."""


def data_root(root):
    """The absolute folder a --data_root names, by one rule for every script (train.py, sample.py,
    prepare.py's --out_root, the tools) from whatever folder it runs in: `data`, the default, is
    the project's data/ folder; another relative root is from the working folder, or from the
    project folder where only that one exists; an absolute one is itself. A checkpoint records the
    result."""
    if os.path.isabs(root):
        return root
    if os.path.normpath(root) == "data":
        return PROJECT_DATA
    here, there = os.path.abspath(root), os.path.join(os.path.dirname(PROJECT_DATA), root)
    return there if os.path.isdir(there) and not os.path.isdir(here) else here
