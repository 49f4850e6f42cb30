"""Data for nanoMeSH. The loading side, which train.py, sample.py, probe.py and the other scripts read
datasets with: dataset.py (a run's Dataset, opened once; the dataset a checkpoint trained on), loader.py
(meta.json, splits, windows), tokenizer.py, bpe.py (tokenizer.json files) and indexed.py (the Pile's
format). The write side: prepare.py, the command that makes datasets. data/README.md is the reference.
data/ uses support/'s locks and atomic writes; support/ never imports data/."""

from configurator import UsageError


class DataError(UsageError):
    """A problem with the data that the user can fix (a missing, damaged or changed file, an unknown dataset,
    a tokenizer that cannot be run): the entry points print it as one line and exit 2."""
