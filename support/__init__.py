"""The support layers of nanoMeSH, each module one idea. train.py reaches them through three
objects, the Run (run.py: the run's folder, checkpoints, resume), the Spread (spread.py, fsdp.py)
and the Device (machine.py), and a few named calls (machine.process_group, plan, guards, hf);
sample.py through sampling.py and guards.command; tools/ through checkpoint.py and the rest.
support/ never imports data/ (data/ uses support/'s files and locks); configurator.py imports
neither."""
