"""Data for nanoMeSH. Read: dataset.py (a run's Dataset, its batches), meta.py (a dataset's files
checked, where it is, the data a checkpoint trained on), tokenizer.py, bpe.py (tokenizer.json) and
indexed.py (the Pile's format). Written: prepare.py. data/README.md is the reference."""
