"""The support layers of nanoMeSH: each module one idea, reached from train.py and sample.py by one call."""
