"""What keeps nanoMeSH's promises (nothing lost, bad input in one line, exact resume, scale), one
idea a module, each reached by one named call (README.md lists them); a first reading of train.py
can skip all of them. support/ never imports data/; configurator.py imports neither."""
