"""The support layers of nanoMeSH, each module one idea. train.py reaches them through Run (run.py:
the run's folder, checkpoints, resume), its spread (spread.py, fsdp.py) and a few calls (machine,
plan, guards, hf); sample.py through sampling.py; tools/ through checkpoint.py and the rest.
support/ never imports data/ (data/ uses support/'s files and locks); configurator.py imports
neither."""
