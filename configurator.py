"""
Command-line settings for the entry points (train.py, sample.py, bench.py), generated from a
dataclass, and the process setup they share (device choice, CPU allocator thresholds).

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr=6e-4

Positional arguments are JSON files of plain values (read as data, never
executed); then `--key=value` flags override them. Every field of the dataclass
is a flag, typed by its annotation; `--help` lists them with their defaults. An
unknown key or a value of the wrong type is a UsageError naming the closest key
or the expected type.
"""

import ctypes
import dataclasses
import difflib
import inspect
import json
import os
import re
import sys
import types
import typing

import torch


class UsageError(ValueError):
    """Bad input from the command line: the entry points print it as one line and exit 2."""


def report(prog, error, code=2):
    """The one line an entry point prints for an error it can name; returns the exit code."""
    if isinstance(error, OSError) and error.filename:  # e.g. an --out_dir that is a file, a full disk
        error = f"cannot use {error.filename}: {error.strerror}; check the path"
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def check_writable(path, flag):
    """Raise UsageError now, not after a long run, when the output file `path` of --flag cannot be written.
    Creates nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--{flag}={path} is a folder; give a file name")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise UsageError(f"cannot write --{flag}={path}: no such folder or no permission")


def _kinds(field):
    """The types a field accepts: (int,) for `int`, (bool, NoneType) for `bool | None`."""
    return typing.get_args(field.type) if isinstance(field.type, types.UnionType) else (field.type,)


def _parse_value(field, text):
    """Turn the text of --key=value into the field's type (int, float, bool, str, or X | None)."""
    kinds = _kinds(field)
    if type(None) in kinds and str(text).lower() in ("none", "null", ""):
        return None
    kind = next(k for k in kinds if k is not type(None))
    if kind is bool:
        if isinstance(text, bool):
            return text
        if str(text).lower() in ("1", "true", "yes", "on"):
            return True
        if str(text).lower() in ("0", "false", "no", "off"):
            return False
    else:
        try:
            if isinstance(text, bool):
                raise ValueError
            value = kind(text)
            if kind is int and isinstance(text, float) and value != text:
                raise ValueError
            return value
        except (TypeError, ValueError):
            pass
    type_name = " | ".join(getattr(k, "__name__", str(k)) for k in kinds)
    raise UsageError(f"--{field.name}={text} is not a valid {type_name}")


def help_text(cls, prog):
    """Every field with its default and the comment that follows it in the dataclass's source."""
    notes = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", inspect.getsource(cls), flags=re.M))
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

    def put(key, value, where):
        if key not in fields:
            match = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean --{match[0]}?" if match else f"; see python {prog} --help"
            raise UsageError(f"unknown setting {key!r} in {where}{hint}")
        given[key] = _parse_value(fields[key], value)

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
                with open(arg) as f:
                    values = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"cannot read config file {arg!r}: {e}") from None
            if not isinstance(values, dict):
                raise UsageError(f"config file {arg!r} must hold a JSON object of settings")
            for key, value in values.items():
                put(key, value, arg)
    return given


def resolve_device(name):
    """'auto' -> cuda, then mps, then cpu; an explicit device that is not available is a UsageError."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    kind = name.split(":")[0]
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if kind not in available:
        raise UsageError(f"unknown --device={name}; expected auto, cpu, cuda, cuda:N or mps")
    if not available[kind]:
        raise UsageError(f"--device={name} is not available on this machine; use --device=auto or --device=cpu")
    return name


def fix_malloc_thresholds(mmap=32 << 20, trim=64 << 20):
    """On Linux with glibc: serve tensors under 32 MB from the heap and keep up to 64 MB of freed
    heap memory, from the first step on. glibc starts both thresholds at 128 KB and raises them
    toward these ceilings only as it frees mapped blocks (to the largest so far, and twice that);
    until then a CPU train step of a small model gives its activations back to the kernel and
    faults them in again, zeroed page by page (test_train.py counts a classroom step's faults:
    over 10,000 with the starting thresholds held, under 1,000 with these). Larger tensors (a
    50k-vocabulary model's logits) are still mapped afresh each time: keeping those in the heap
    too gave no clear gain and a higher peak resident set (README, Speed). mmap and trim are the
    two thresholds in bytes. Returns whether it applied."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap) and libc.mallopt(M_TRIM_THRESHOLD, trim))
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows): leave the allocator alone
        return False
