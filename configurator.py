"""
The one command line of every nanoMeSH script, made from a dataclass of settings, and the
project's did-you-mean. Imports no torch (data/prepare.py's tokenizing workers use it too).

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr 6e-4 --compile

Positional arguments are JSON files of plain values (never executed); flags after them override,
as `--key=value` or `--key value`; a true/false setting alone means true. A typo or a value of the
wrong type is a UsageError naming the closest key or the type.
"""

import dataclasses
import difflib
import json
import math
import os
import sys
import typing

LARGEST = 2**63 - 1  # torch takes 64 bits
WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "text"}
JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false",
              dict: "an object", list: "a list", type(None): "null"}
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class UsageError(ValueError):
    """Bad input the project names: printed as one line, exit 2. Any other exception is a bug."""


class DataError(UsageError):
    """A problem with the data (a dataset, a tokenizer) the user can fix: one line, exit 2."""


def setting(default, help, path=False, choices=None):
    """A dataclass field with its one-line description, which --help shows; a list default
    makes a flag that may be given several times. path: a leading ~ means the home folder.
    choices: the values it takes (check_ranges)."""
    metadata = {"help": help, "path": path, "choices": choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_ranges(settings, ranges=()):
    """Raise UsageError for the first setting outside its range (ranges holds (names, test, the
    range in words)) or not among its choices."""
    for f in dataclasses.fields(settings):
        value, choices = getattr(settings, f.name), f.metadata.get("choices")
        if choices and value not in choices:
            raise UsageError(f"--{f.name}={value} is not {', '.join(choices[:-1])} or "
                             f"{choices[-1]}")
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
    elif isinstance(error, OSError):  # no file named: a full disk, say
        error = (f"{error.strerror or error}; check the disk (free space, permissions) "
                 f"and try again")
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def value_of(field, value, file=None):
    """A setting's value in its field's type, from --key=TEXT or a file's JSON value (already of
    that type: "100" for an integer is refused)."""
    accepted = typing.get_args(field.type) or (field.type,)  # X | None; list[str]: each a str
    kind, null = next(k for k in accepted if k is not type(None)), type(None) in accepted
    where = f"{file}: {field.name} is " if file else f"--{field.name}="
    bad = UsageError(f"{where}{value} is not {WORDS[kind]}" + (" (or None)" if null else ""))
    if file is not None:  # null, or of the field's type
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
    elif kind is not str:
        try:
            value = kind(value)
        except ValueError:
            raise bad from None
    if field.metadata.get("path") and isinstance(value, str):  # not a folder named "~"
        value = os.path.expanduser(value)
        if not value.strip():
            default = field.default  # a name, or MISSING: a list's is made by a factory
            named = isinstance(default, str) and default
            example = f", e.g. --{field.name}={default} (its default)" if named else ""
            raise UsageError(f"--{field.name} is empty; give it a name{example}")
    if kind is int and value is not None and abs(value) > LARGEST:
        digits = str(abs(value))
        shown = digits if len(digits) < 24 else f"{digits[:6]}...({len(digits)} digits)"
        sign = "-" if value < 0 else ""
        raise UsageError(f"{where}{sign}{shown}, too large: an integer setting is "
                         f"at most 2**63 - 1")
    return value


def help_text(cls, prog, notes):
    """--help: the usage line, cls's docstring, every setting, notes."""
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


def parse_flags(cls, argv, prog, notes="", read_config=None):
    """argv -> {setting: value} of the settings given, checked against cls's fields.
    read_config(path) -> a JSON config file's settings (None: no files)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given, args = {}, list(argv)  # the settings found so far; the arguments left to read

    def put(key, value, where, file=None):
        if key not in fields:
            raise UsageError(f"unknown setting {key!r} in {where}{closest(key, fields, not file)}"
                             f"; see python {prog} --help")
        # a command line's bytes that are not UTF-8 reach Python as lone surrogates: a path may
        # hold what the file system takes, any other text must be UTF-8
        encode = os.fsencode if fields[key].metadata.get("path") else str.encode
        values = value if isinstance(value, list) else [value]
        for text in (v for v in values if isinstance(v, str)):
            if "\0" in text:
                raise UsageError(f"{key} in {where} holds a NUL byte, which no path or name can; "
                                 f"remove it")
            try:
                encode(text)
            except UnicodeEncodeError:
                raise UsageError(f"--{key}={text!r:.60} is not UTF-8 text (it holds bytes no "
                                 f"UTF-8 text has); give it in UTF-8") from None
        file = file and f"config file {file!r}"
        if fields[key].default_factory is not dataclasses.MISSING:  # a list: each adds to it
            given[key] = given.get(key, []) + [value_of(fields[key], v, file) for v in values]
        else:
            given[key] = value_of(fields[key], value, file)

    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(help_text(cls, prog, notes))
            raise SystemExit(0)
        if not arg.startswith("--"):
            if read_config is None:
                raise UsageError(f"{prog} reads no config file ({arg!r}); give its settings as "
                                 f"flags: --key=value")
            if any(a.startswith("--") for a in argv[:len(argv) - len(args)]):
                raise UsageError(f"config file {arg!r} must come before the flags")
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
