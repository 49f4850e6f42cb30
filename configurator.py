"""
The command line of the entry points (train.py, sample.py, bench.py), generated from a dataclass, and
the project's one did-you-mean. Imports no torch: data/prepare.py's tokenizing workers use it too.

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr=6e-4

Positional arguments are JSON files of plain values (read as data, never executed); then
`--key=value` flags override them. Every field of the dataclass is a flag, typed by its annotation;
`--help` lists them with their defaults and comments. An unknown key or a value of the wrong type is
a UsageError naming the closest key or the expected type.
"""

import dataclasses
import difflib
import inspect
import json
import math
import re
import sys
import types
import typing


class UsageError(ValueError):
    """Bad input from the command line: the entry points print it as one line and exit 2."""


def closest(name, options, flag=False):
    """" (did you mean 'X'?)" for the nearest of options, " (did you mean --X?)" for a flag, or "" when none is
    close."""
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return "" if not match else f" (did you mean --{match[0]}?)" if flag else f" (did you mean {match[0]!r}?)"


def report(prog, error, code=2):
    """The one line an entry point prints for an error it can name; returns the exit code."""
    if isinstance(error, OSError) and error.filename:  # e.g. an --out_dir that is a file
        error = f"cannot use {error.filename}: {error.strerror}; check the path"
    elif isinstance(error, OSError):  # no file named, e.g. a full disk met while flushing a write
        error = f"{error.strerror or error}; check the disk (free space, permissions) and try again"
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def check_ranges(settings, ranges):
    """Raise UsageError for the first setting outside its range: ranges is a list of (space-separated names,
    test, the range in words); a value of None (unset) passes, anything else must be finite and pass."""
    for names, ok, allowed in ranges:
        for name in names.split():
            value = getattr(settings, name)
            if value is not None and not (math.isfinite(value) and ok(value)):
                raise UsageError(f"--{name}={value} must be {allowed}")


def _kinds(field):
    """The types a field accepts: (int,) for `int`, (bool, NoneType) for `bool | None`."""
    return typing.get_args(field.type) if isinstance(field.type, types.UnionType) else (field.type,)


LARGEST = 2**63 - 1  # no integer setting may be larger (a seed included: torch takes 64 bits)
WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


def _parse_value(field, text, where=None):
    """The value of a setting in the field's type (int, float, bool, str, or X | None): from the text of
    --key=value, or (where: a config file's name) a JSON value, which must already be of that type, so that
    "100" for an integer or an object for a path is refused rather than converted."""
    kinds = _kinds(field)
    kind = next(k for k in kinds if k is not type(None))
    if where is not None:  # JSON: null, or a value of the field's own type (an integer also for a float)
        ok = text is None and type(None) in kinds or kind is float and type(text) in (int, float) or \
            type(text) is kind or kind is int and type(text) is float and text.is_integer()
        if not ok:
            raise UsageError(f"config file {where!r}: {field.name} is {json.dumps(text)[:40]} "
                             f"({JSON_NAMES.get(type(text), type(text).__name__)}), not {WORDS[kind]}"
                             + (" or null" if type(None) in kinds else ""))
        value = None if text is None else kind(text)
        if kind is float and value is not None and not math.isfinite(value):
            raise UsageError(f"config file {where!r}: {field.name} is {text}, not a finite number")
    elif type(None) in kinds and text.lower() in ("none", "null", ""):
        return None
    elif kind is bool and text.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        value = text.lower() in ("1", "true", "yes", "on")
    else:
        try:
            value = kind(text) if kind is not bool else None
        except ValueError:
            value = None
        if value is None:
            raise UsageError(f"--{field.name}={text} is not {WORDS[kind]}" + (" (or None)" if type(None) in kinds else ""))
    if kind is int and value is not None and abs(value) > LARGEST:
        digits = str(abs(value))
        shown = digits if len(digits) < 24 else f"{digits[:6]}...({len(digits)} digits)"
        shown = f"{'-' if value < 0 else ''}{shown}"
        raise UsageError((f"config file {where!r}: {field.name} is {shown}" if where else f"--{field.name}={shown}")
                         + ", too large: an integer setting is at most 2**63 - 1")
    return value


JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false", dict: "an object",
              list: "a list", type(None): "null"}


def help_text(cls, prog):
    """Every field with its default and the comment that follows it in the dataclass's source; a {NAME} in a
    comment lists the names in NAME, a table of the dataclass's module (train.py's {SCHEMES}: mesh.SCHEMES)."""
    module = vars(sys.modules[cls.__module__])
    fill = lambda m: ", ".join(module[m[1]]) if m[1] in module else m[0]  # noqa: E731
    notes = {k: re.sub(r"\{(\w+)\}", fill, v)
             for k, v in re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", inspect.getsource(cls), flags=re.M)}
    lines = [f"usage: python {prog} [CONFIG.json ...] [--key=value ...]", "", (cls.__doc__ or "").strip(), ""]
    for f in dataclasses.fields(cls):
        shown = repr(f.default) if isinstance(f.default, str) and not f.default.isprintable() else f.default
        flag = f"  --{f.name}={shown}"  # a newline default shows as '\n', not as a line break
        lines.append(f"{flag:<34} {notes.get(f.name, '')}".rstrip())
    return "\n".join(lines)


def parse_flags(cls, argv, prog):
    """argv -> (settings dict of explicitly given values, validated against cls's fields).

    The caller merges the dict over defaults (or over a checkpoint's settings when resuming),
    so it can tell which settings the user actually gave."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {}

    def put(key, value, where, file=None):
        if key not in fields:
            raise UsageError(f"unknown setting {key!r} in {where}{closest(key, fields, flag=True)}; "
                             f"see python {prog} --help")
        given[key] = _parse_value(fields[key], value, file)

    for arg in argv:
        if arg in ("-h", "--help"):
            print(help_text(cls, prog))
            raise SystemExit(0)
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq:
                if key in fields and bool in _kinds(fields[key]):
                    value = "true"  # a bare --compile means --compile=true
                else:
                    raise UsageError(f"flag {arg!r} needs a value: --{key}=VALUE")
            put(key, value, "the command line")
        else:
            try:
                with open(arg, encoding="utf-8") as f:
                    text = f.read()
                values = json.loads(text)
            except OSError as e:
                raise UsageError(f"cannot read config file {arg!r}: {e.strerror}") from None
            except json.JSONDecodeError as e:
                comma = " (a comma after the last setting?)" if text[:e.pos].rstrip().endswith(",") else ""
                raise UsageError(f"config file {arg!r} is not valid JSON: {e.msg} at line {e.lineno}, column "
                                 f"{e.colno}{comma}") from None
            if not isinstance(values, dict):
                raise UsageError(f"config file {arg!r} must hold a JSON object of settings")
            for key, value in values.items():
                put(key, value, arg, arg)
    return given
