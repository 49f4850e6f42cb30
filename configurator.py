"""
Command-line settings for the entry points (train.py, sample.py, bench.py), generated from a
dataclass, and what they share: one-line error reports, device and dtype choice.

    python train.py config/pythia-160m_mesh.json --max_iters=2000 --lr=6e-4

Positional arguments are JSON files of plain values (read as data, never
executed); then `--key=value` flags override them. Every field of the dataclass
is a flag, typed by its annotation; `--help` lists them with their defaults. An
unknown key or a value of the wrong type is a UsageError naming the closest key
or the expected type.
"""

import dataclasses
import errno
import inspect
import json
import os
import platform
import re
import sys
import types
import typing

import torch

from mesh import closest


class UsageError(ValueError):
    """Bad input from the command line: the entry points print it as one line and exit 2."""


def report(prog, error, code=2):
    """The one line an entry point prints for an error it can name; returns the exit code."""
    if isinstance(error, OSError) and error.filename:  # e.g. an --out_dir that is a file
        error = f"cannot use {error.filename}: {error.strerror}; check the path"
    elif isinstance(error, OSError):  # no file named, e.g. a full disk met while flushing a write
        error = f"{error.strerror or error}; check the disk (free space, permissions) and try again"
    print(f"{prog}: error: {error}", file=sys.stderr)
    return code


def process_alive(pid):
    """Whether process `pid` still runs on this machine: temporary files and folders carry their writer's
    pid, so that a cleanup removes those of dead processes and never a live one's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True


def why_write_failed(error, folder):
    """In words, why writing into folder failed with `error`: a full disk is said so, with the bytes left,
    whatever the writer made of ENOSPC (torch's zip writer raises a RuntimeError, numpy a short write)."""
    try:
        free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    except OSError:
        free = None
    if getattr(error, "errno", None) == errno.ENOSPC or (free is not None and free < 1 << 20):
        return f"the disk is full ({free:,} bytes free)" if free is not None else "the disk is full"
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


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
            raise UsageError(f"unknown setting {key!r} in {where}{closest(key, fields, flag=True)}; "
                             f"see python {prog} --help")
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


def resolve_dtype(name, device_type):
    """--dtype: 'auto' -> bfloat16 autocast on CUDA GPUs that support it, else float32."""
    if name == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name not in ("float32", "bfloat16"):
        raise UsageError(f"--dtype={name} is not supported; use auto, float32 or bfloat16")
    return name


def machine_name(device="cpu"):
    """The GPU's name for a CUDA device, else the CPU's model name (bench.py and table1.py print it)."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
