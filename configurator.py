"""
The one command line of every nanoMeSH script, made from a dataclass of settings, and the
project's did-you-mean. Imports no torch (data/prepare.py's tokenizing workers use it too).

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr 6e-4 --compile

Positional arguments are JSON files of plain values (read as data, never executed); then flags
override them, as `--key=value` or `--key value`; a true/false setting alone (`--compile`) means
true. Every field of the dataclass is a flag, typed by its annotation and described by setting():
`--help` lists them all with their defaults. An unknown key or a value of the wrong type is a
UsageError naming the closest key or the expected type.
"""

import dataclasses
import difflib
import json
import math
import sys
import types
import typing

LARGEST = 2**63 - 1  # no integer setting may be larger (a seed included: torch takes 64 bits)
WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "text", list: "text"}
JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false",
              dict: "an object", list: "a list", type(None): "null"}
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class UsageError(ValueError):
    """Bad input from the command line: the entry points print it as one line and exit 2."""


def setting(default, help, **field):
    """A dataclass field with its one-line description, which --help shows."""
    if isinstance(default, list):  # a flag that may be given several times
        return dataclasses.field(default_factory=lambda: list(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help}, **field)


def closest(name, options, flag=False):
    """" (did you mean 'X'?)" for the nearest of options (" (did you mean --X?)" for a flag),
    or "" when none is close."""
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    if not match:
        return ""
    return f" (did you mean --{match[0]}?)" if flag else f" (did you mean {match[0]!r}?)"


def report(prog, error, code=2):
    """The one line an entry point prints for an error it can name; returns the exit code."""
    if isinstance(error, OSError) and error.filename:  # e.g. an --out_dir that is a file
        error = f"cannot use {error.filename}: {error.strerror}; check the path"
    elif isinstance(error, OSError):  # no file named, e.g. a full disk met while flushing a write
        error = f"{error.strerror or error}; check the disk (free space, permissions) and try again"
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def check_ranges(settings, ranges):
    """Raise UsageError for the first setting outside its range. ranges: a list of (space-separated
    names, test, the range in words); None (unset) passes, anything else must be finite and pass."""
    for names, ok, allowed in ranges:
        for name in names.split():
            value = getattr(settings, name)
            if value is not None and not (math.isfinite(value) and ok(value)):
                raise UsageError(f"--{name}={value} must be {allowed}")


def kinds(field):
    """The types a field accepts: (int,) for `int`, (bool, NoneType) for `bool | None`."""
    union = isinstance(field.type, types.UnionType)
    return typing.get_args(field.type) if union else (typing.get_origin(field.type) or field.type,)


def from_json(field, value, where):
    """A config file's value, which must already be of the field's type: "100" for an integer,
    or an object for a path, is refused rather than converted."""
    accepted = kinds(field)
    kind = next(k for k in accepted if k is not type(None))
    ok = (value is None and type(None) in accepted or type(value) is kind
          or kind is float and type(value) is int
          or kind is int and type(value) is float and value.is_integer())
    if not ok:
        null = " or null" if type(None) in accepted else ""
        got = JSON_NAMES.get(type(value), type(value).__name__)
        raise UsageError(f"config file {where!r}: {field.name} is {json.dumps(value)[:40]} "
                         f"({got}), not {WORDS[kind]}{null}")
    if kind is float and value is not None and not math.isfinite(value):
        raise UsageError(f"config file {where!r}: {field.name} is {value}, not a finite number")
    return value if value is None else kind(value)


def from_text(field, text):
    """The value of --key=TEXT in the field's type (int, float, bool, str, or X | None)."""
    accepted = kinds(field)
    kind = next(k for k in accepted if k is not type(None))
    if type(None) in accepted and text.lower() in ("none", "null", ""):
        return None
    if kind is bool and text.lower() in TRUE + FALSE:
        return text.lower() in TRUE
    if kind in (str, list):
        return text
    if kind is not bool:
        try:
            return kind(text)
        except ValueError:
            pass
    raise UsageError(f"--{field.name}={text} is not {WORDS[kind]}"
                     + (" (or None)" if type(None) in accepted else ""))


def check_size(name, value, where=None):
    """Refuse an integer beyond LARGEST, shown short when it has many digits."""
    if type(value) is not int or abs(value) <= LARGEST:
        return value
    digits = str(abs(value))
    shown = ("-" if value < 0 else "") + (digits if len(digits) < 24
                                          else f"{digits[:6]}...({len(digits)} digits)")
    said = f"config file {where!r}: {name} is {shown}" if where else f"--{name}={shown}"
    raise UsageError(f"{said}, too large: an integer setting is at most 2**63 - 1")


def help_text(cls, prog, notes=""):
    """The usage line, cls's docstring, every setting with its default and description, notes."""
    lines = [f"usage: python {prog} [CONFIG.json ...] [--key=value | --key value ...]", "",
             (cls.__doc__ or "").strip(), ""]
    for f in dataclasses.fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        shown = repr(default) if isinstance(default, str) and not default.isprintable() else default
        flag, text = f"  --{f.name}={shown}", f.metadata.get("help", "")
        lines.append(f"{flag:<34} {text}".rstrip() if len(flag) < 34 else f"{flag}\n{'':<34} {text}")
    return "\n".join(lines + ([""] + notes.splitlines() if notes else []))


def read_config(path):
    """A JSON config file's object of settings."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        values = json.loads(text)
    except OSError as e:
        raise UsageError(f"cannot read config file {path!r}: {e.strerror}") from None
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
    fields, given, args = {f.name: f for f in dataclasses.fields(cls)}, {}, list(argv)

    def put(key, value, where, file=None):
        if key not in fields:
            raise UsageError(f"unknown setting {key!r} in {where}{closest(key, fields, True)}; "
                             f"see python {prog} --help")
        field = fields[key]
        value = from_json(field, value, file) if file else from_text(field, value)
        if list in kinds(field):  # given several times: each one adds to the list
            value = given.get(key, []) + (value if isinstance(value, list) else [value])
        given[key] = check_size(key, value, file)

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
        if not eq:  # --key value, or --flag alone for true
            if key not in fields:
                put(key, None, "the command line")  # raises: an unknown setting, its closest name
            if bool in kinds(fields[key]) and not (args and args[0].lower() in TRUE + FALSE):
                value = "true"
            elif args and not args[0].startswith("--"):
                value = args.pop(0)
            else:
                raise UsageError(f"flag {arg!r} needs a value: --{key}=VALUE or --{key} VALUE")
        put(key, value, "the command line")
    return given
