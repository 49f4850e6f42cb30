"""
The one command line of every nanoMeSH script, made from a dataclass of settings, and the
project's did-you-mean. Imports no torch (data/prepare.py's tokenizing workers use it too).

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr 6e-4 --compile

Positional arguments are JSON files of plain values (read as data, never executed); flags after
them override, as `--key=value` or `--key value`; a true/false setting alone means true. Each
field of the dataclass is a flag, typed by its annotation and described by setting(); `--help`
lists them. A typo or a value of the wrong type is a UsageError naming the closest key or the type.
"""

import dataclasses
import difflib
import json
import math
import os
import re
import stat
import sys
import types
import typing

LARGEST = 2**63 - 1  # no integer setting may be larger (a seed included: torch takes 64 bits)
WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "text", list: "text"}
JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false",
              dict: "an object", list: "a list", type(None): "null"}
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class UsageError(ValueError):
    """Bad input the project names (a setting, a file, a folder): the entry points print it as one
    line and exit 2. The project's other errors subclass it; any other exception is a bug, and
    keeps its traceback."""


def setting(default, help, path=False):
    """A dataclass field with its one-line description, which --help shows; a list default
    makes a flag that may be given several times. path: a leading ~ means the home folder."""
    metadata = {"help": help, "path": path}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_ranges(settings, ranges):
    """Raise UsageError for the first setting outside its range: ranges holds (names, test, the
    range in words); None (unset) passes, anything else must be finite and pass the test."""
    for names, ok, allowed in ranges:
        for name in names.split():
            value = getattr(settings, name)
            if value is not None and not (math.isfinite(value) and ok(value)):
                raise UsageError(f"--{name}={value} must be {allowed}")


def closest(name, options, flag=False):
    """" (did you mean 'X'?)" for the nearest of options, with --X for a flag; "" for none."""
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return "" if not match else f" (did you mean {'--' + match[0] if flag else repr(match[0])}?)"


def report(prog, error, code=2):
    """The one line an entry point prints for an error it can name; returns the exit code."""
    if isinstance(error, OSError) and error.filename:  # e.g. an --out_dir that is a file
        error = f"cannot use {error.filename}: {error.strerror}; check the path"
    elif isinstance(error, OSError):  # no file named, e.g. a full disk met while flushing a write
        error = (f"{error.strerror or error}; check the disk (free space, permissions) "
                 f"and try again")
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def value_of(field, value, file=None):
    """A setting's value in its field's type (int, float, bool, str, list, or X | None), from
    --key=TEXT, or from a file's JSON value (file: its name in words), which must already be of
    that type ("100" for an integer, or an object for a path, is refused rather than converted)."""
    union = isinstance(field.type, types.UnionType)  # X | None
    origin = typing.get_origin(field.type) or field.type  # list[str] -> list
    accepted = typing.get_args(field.type) if union else (origin,)
    kind, null = next(k for k in accepted if k is not type(None)), type(None) in accepted
    where = f"{file}: {field.name} is " if file else f"--{field.name}="
    bad = UsageError(f"{where}{value} is not {WORDS[kind]}" + (" (or None)" if null else ""))
    if file is not None:  # null, or a value of the field's own type (an integer for a float)
        number = (kind is float and type(value) is int) or (
            kind is int and type(value) is float and value.is_integer())
        if not ((value is None and null) or type(value) is kind or number):
            got = JSON_NAMES.get(type(value), type(value).__name__)
            raise UsageError(f"{where}{json.dumps(value)[:40]} ({got}), not {WORDS[kind]}"
                             + (" or null" if null else ""))
        if kind is float and value is not None and not math.isfinite(value):
            raise UsageError(f"{where}{value}, not a finite number")
        value = value if value is None else kind(value)
    elif null and value.lower() in ("none", "null", ""):
        value = None
    elif kind is bool:
        if value.lower() not in TRUE + FALSE:
            raise bad
        value = value.lower() in TRUE
    elif kind not in (str, list):
        try:
            value = kind(value)
        except ValueError:
            raise bad from None
    if field.metadata.get("path") and isinstance(value, str):  # not a folder named "~"
        value = os.path.expanduser(value)
    if field.metadata.get("path") and isinstance(value, str) and not value.strip():
        raise UsageError(f"--{field.name} is empty; give it a name, e.g. "
                         f"--{field.name}={field.default} (its default)")
    if kind is int and value is not None and abs(value) > LARGEST:
        digits = str(abs(value))
        shown = digits if len(digits) < 24 else f"{digits[:6]}...({len(digits)} digits)"
        sign = "-" if value < 0 else ""
        raise UsageError(f"{where}{sign}{shown}, too large: an integer setting is "
                         f"at most 2**63 - 1")
    return value


def help_text(cls, prog, notes=""):
    """The usage line, cls's docstring, every setting with its default and description, notes."""
    lines = [f"usage: python {prog} [CONFIG.json ...] [--key=value | --key value ...]", "",
             (cls.__doc__ or "").strip(), ""]
    for f in dataclasses.fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if isinstance(default, str) and not default.isprintable():
            default = repr(default)  # a newline default shows as '\n', not as a line break
        flag, text = f"  --{f.name}={default}", f.metadata.get("help", "")
        wrap = "\n" + " " * 34 if len(flag) >= 34 else ""  # a long default: its text below
        lines.append(f"{flag:<34}{wrap} {text}".rstrip())
    return "\n".join(lines + ([""] + notes.splitlines() if notes else []))


# -----------------------------------------------------------------------------
# Plain data read with limits: every JSON file the project reads (a config, meta.json, a pointer,
# a result, a log) comes through here, so that none can hang a run, fill its memory or crash it.

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


def parse_flags(cls, argv, prog, notes=""):
    """argv -> {setting: value} of the settings given, checked against cls's fields. The caller
    merges it over the defaults (or a checkpoint's settings), so it knows what was given."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given, args = {}, list(argv)  # the settings found so far; the arguments left to read

    def put(key, value, where, file=None):
        if key not in fields:
            raise UsageError(f"unknown setting {key!r} in {where}{closest(key, fields, True)}; "
                             f"see python {prog} --help")
        if isinstance(value, str) and "\0" in value:  # (from a file: no command line holds one)
            raise UsageError(f"{key} in {where} holds a NUL byte, which no path or name can; "
                             f"remove it")
        value = value_of(fields[key], value, file and f"config file {file!r}")
        if fields[key].default_factory is not dataclasses.MISSING:  # a list: each adds to it
            value = given.get(key, []) + (value if isinstance(value, list) else [value])
        given[key] = value

    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(help_text(cls, prog, notes))
            raise SystemExit(0)
        if not arg.startswith("--"):
            for key, value in read_config(arg).items():
                put(key, value, arg, arg)
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq:  # --key value, or a true/false setting alone for true
            boolean = key in fields and fields[key].type in (bool, bool | None)
            if boolean and not (args and args[0].lower() in TRUE + FALSE):
                value = "true"
            elif key in fields and args and not args[0].startswith("--"):
                value = args.pop(0)
            elif key in fields:
                raise UsageError(f"flag {arg!r} needs a value: --{key}=VALUE or --{key} VALUE")
        put(key, value, "the command line")
    return given
