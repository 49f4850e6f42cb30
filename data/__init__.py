"""Data for nanoMeSH. Read: dataset.py (a run's Dataset, its batches), meta.py (a dataset's files
checked, where it is, its Tokenizer), trained_on.py (the data a checkpoint trained on), bpe.py
(tokenizer.json), indexed.py (the Pile's format). Written: prepare.py. See data/README.md."""
