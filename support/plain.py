"""
Plain data read with limits: every JSON file the project reads (a config file, meta.json, a
checkpoint's pointer, a result file, a log) comes through here, so that none of them can hang a
run, fill its memory or crash its parser. configurator.py's parse_flags reads config files with
read_config, which its callers hand it (it imports no project module).

    text = plain.read_text(path)   # a regular file's UTF-8 text, at most MAX_BYTES (read_bytes)
    obj = plain.parse_json(text)   # JSON nested at most MAX_DEPTH deep, no NaN, no duplicate keys
    given = parse_flags(TrainConfig, argv, "train.py", read_config=plain.read_config)

The readers raise PlainDataError (a UsageError) whose message says what is wrong, without the
file's name: callers add it, and their own fix, in the one line they print (read_config does).
"""

import json
import os
import re
import stat

from configurator import UsageError

MAX_BYTES = 64 << 20  # larger than any config, meta.json, pointer or result file written here
MAX_DEPTH = 64        # nesting: the project's own files are at most 4 deep


class PlainDataError(UsageError):
    """A file that is not the plain data it should be: one line, which its reader completes."""


def read_bytes(path, max_bytes=MAX_BYTES):
    """The bytes of the regular file path. A FIFO, a device or a folder is refused before it is read
    (opened non-blocking, so that a FIFO with no writer cannot hang the open); so is a file over
    max_bytes. OSError passes through for the caller to word."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PlainDataError("is not a regular file (a FIFO, a device or a folder)")
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PlainDataError(f"is larger than {max_bytes:,} bytes")
    return data


def read_text(path, max_bytes=MAX_BYTES):
    """The UTF-8 text of the regular file path (read_bytes' checks first)."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlainDataError(f"is not UTF-8 text (byte {e.start})") from None


def _no_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise PlainDataError(f"has the key {key!r:.40} twice")
        obj[key] = value
    return obj


def _no_constant(name):
    raise PlainDataError(f"holds {name}, which JSON does not allow (write a number)")


STRING, BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"'), re.compile(r"[\[\]{}]")


def _depth(text):
    """The deepest nesting of [ and { in text, outside strings: checked before parsing, so that
    json never recurses more than MAX_DEPTH levels."""
    depth = deepest = 0
    for m in BRACKET.finditer(STRING.sub("", text)):
        depth += 1 if m[0] in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_json(text, max_depth=MAX_DEPTH, nan=False):
    """text -> the JSON value it holds. json.JSONDecodeError (a ValueError, with its position)
    passes through for the caller to word; too deep, a repeated key and NaN / Infinity (unless
    nan: a log's record of a loss that blew up) are PlainDataErrors."""
    if _depth(text) > max_depth:
        raise PlainDataError(f"is nested more than {max_depth} levels deep")
    constant = None if nan else _no_constant  # None: json's own, which reads NaN and Infinity
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=constant)


def read_json(path, max_bytes=MAX_BYTES):
    """parse_json(read_text(path)): the plain data of a JSON file."""
    return parse_json(read_text(path, max_bytes))


def read_config(path):
    """A JSON config file's object of settings (plain data, read with the limits above)."""
    try:
        values = parse_json(text := read_text(path))
    except OSError as e:
        raise UsageError(f"cannot read config file {path!r}: {e.strerror}") from None
    except PlainDataError as e:
        raise UsageError(f"config file {path!r} {e}; fix it, or give the settings as flags") \
            from None
    except json.JSONDecodeError as e:
        comma = " (a comma after the last setting?)" if text[:e.pos].rstrip().endswith(",") else ""
        raise UsageError(f"config file {path!r} is not valid JSON: {e.msg} at line {e.lineno}, "
                         f"column {e.colno}{comma}") from None
    if not isinstance(values, dict):
        raise UsageError(f"config file {path!r} must hold a JSON object of settings")
    return values


def plain_name(value):
    """A file name of the folder itself (no path): what meta.json (or a weight index) may name, so
    that nothing read from it reaches outside its folder."""
    return (isinstance(value, str) and value not in ("", ".", "..")
            and os.path.basename(value) == value and "\\" not in value)
