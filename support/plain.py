"""
Plain data read with limits: every JSON file the project reads (a config, meta.json, a checkpoint's
pointer, a result file, a log) comes through here, so that none of them can hang a run, fill its
memory or crash its parser. The readers live in configurator.py, the lowest file (it reads config
files with them); the rest of the project reads through this module.

    text = plain.read_text(path)   # a regular file's UTF-8 text, at most MAX_BYTES (read_bytes)
    obj = plain.parse_json(text)   # JSON nested at most MAX_DEPTH deep, no NaN, no duplicate keys

Both raise PlainDataError (a UsageError) whose message says what is wrong, without the file's name:
callers add it, and their own fix, in the one line they print.
"""

import os

from configurator import (MAX_BYTES, MAX_DEPTH, PlainDataError, parse_json, read_bytes, read_json,
                          read_text)

__all__ = ["MAX_BYTES", "MAX_DEPTH", "PlainDataError", "parse_json", "plain_name", "read_bytes",
           "read_json", "read_text"]


def plain_name(value):
    """A file name of the folder itself (no path): what meta.json (or a weight index) may name, so
    that nothing read from it reaches outside its folder."""
    return (isinstance(value, str) and value not in ("", ".", "..")
            and os.path.basename(value) == value and "\\" not in value)
