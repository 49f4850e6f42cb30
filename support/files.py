"""
Files so that nothing is lost: JSON read as plain data with limits, writes a crash never leaves
half done, folders held by one process at a time, killed writers' leftovers cleared, and outputs
that never land on a run's or a dataset's files.

    obj = files.read_json(path)                        # a regular file, size and depth limits
    files.atomic_write(path, lambda f: f.write(data))  # the old file or the new, never half
    files.own(out_dir)                                 # a second run there is refused
"""

import errno
import json
import os
import re
import shutil
import stat
import sqlite3
import time
import uuid

import filelock

from configurator import UsageError

MAX_BYTES = 64 << 20  # larger than any config, meta.json, pointer or result file written here
MAX_DEPTH = 64        # nesting: the project's own files are at most 4 deep
MARK = ".nanomesh.tmp"  # the end of every temporary name the project makes, and of no other
TEMPORARY = re.compile(r"^\..+-(\d+)-[0-9a-f]{12}" + re.escape(MARK) + "$")  # .NAME-PID-HEX{MARK}
RETRIES = (0.1, 0.2, 0.5, 1, 2, 4, 8)  # Windows: a reader (a CRC check, sample.py) is done by then
LOCK = ".nanomesh.lock"  # the lock file a folder held by own() holds
_owned = {}  # this process's locks: real path -> ReadWriteLock (None: no lock could be taken)


# -----------------------------------------------------------------------------
# Reading plain data

class PlainDataError(UsageError):
    """A file that is not the plain data it should be; its reader adds the name and the fix."""


def read_bytes(path, max_bytes=MAX_BYTES):
    """The bytes of the regular file path, at most max_bytes; a FIFO (opened non-blocking: no
    writer cannot hang it), a device or a folder is refused unread. OSError passes through."""
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


def _number(text):  # json's numbers: one past a float's range (1e400, 10**400) is refused
    if abs(float(text)) == float("inf"):
        raise PlainDataError("holds a number past a float's range (write a smaller one)")
    return int(text) if text.lstrip("-").isdigit() else float(text)


# a string (one never closed: to the end of the text), matched in a single pass
STRING, BRACKET = re.compile(r'"(?:[^"\\]+|\\[\s\S]?)*(?:"|\Z)'), re.compile(r"[\[\]{}]")


def parse_json(text, nan=False):
    """text -> its JSON value. Too deep (counted first: json never recurses far), a repeated key,
    a number past a float's range, or NaN / Infinity (unless nan: a log's blown-up loss) is a
    PlainDataError; a JSONDecodeError passes through with its position."""
    depth, deepest = 0, 0
    for m in BRACKET.finditer(STRING.sub("", text)):
        depth += 1 if m[0] in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise PlainDataError(f"is nested more than {MAX_DEPTH} levels deep")
    constant = None if nan else _no_constant  # None: json's own, which reads NaN and Infinity
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=constant,
                      parse_int=_number, parse_float=_number)


def read_json(path):
    try:
        return parse_json(text := read_text(path))
    except json.JSONDecodeError as e:
        comma = " (a comma after the last item?)" if text[:e.pos].rstrip().endswith(",") else ""
        raise PlainDataError(f"is not JSON ({e.msg}, line {e.lineno} column {e.colno}){comma}") \
            from None


def read_config(path):
    """A JSON config file's object of settings: configurator.parse_flags' reader."""
    try:
        values = read_json(path)
    except OSError as e:
        raise UsageError(f"cannot read config file {path!r}: {e.strerror}; fix the path") from None
    except PlainDataError as e:
        raise UsageError(f"config file {path!r} {e}; fix it, or give the settings as flags") \
            from None
    if not isinstance(values, dict):
        raise UsageError(f"config file {path!r} must hold a JSON object of settings")
    return values


def plain_name(value):
    """A file name of the folder itself, no path: what a meta.json or a weight index may name."""
    return (isinstance(value, str) and value not in ("", ".", "..")
            and os.path.basename(value) == value and "\\" not in value)


# -----------------------------------------------------------------------------
# Writing: atomic, and the leftovers of killed writers

def temporary_name(path, folder=False):
    """A new temporary beside path, .NAME-PID-HEX.nanomesh.tmp, made now (an empty file, or a
    folder). A killed writer's are removed by the next process that holds their folder's lock."""
    where, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(where, f".{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}{MARK}")
    if folder:
        os.mkdir(tmp)
    else:  # the mode a plain write gets (not mkstemp's private 0600)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return tmp


def atomic_write(path, write, mode="wb"):
    """write(f) into a temporary file beside path, fsync, then os.replace: a crash leaves the old
    file or the new. A failed write removes its temporary and raises OSError saying why in words
    (a full disk, whatever the writer made of ENOSPC); the old file is unchanged. On Windows a
    file another process has open cannot be replaced: tried again for RETRIES' seconds first."""
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        for wait in RETRIES if os.name == "nt" else ():  # a reader's open refuses a replace
            try:
                return os.replace(tmp, path)
            except PermissionError:
                time.sleep(wait)
        os.replace(tmp, path)
    except BaseException as e:
        remove(tmp)
        if isinstance(e, (OSError, RuntimeError)):  # torch's zip writer: RuntimeError
            raise OSError(getattr(e, "errno", None) or errno.EIO,
                          why_write_failed(e, os.path.dirname(tmp))) from None
        raise


def append(path, data, fd):
    """Append the bytes data to the file path through fd, its descriptor, already open, whole or
    not at all: a write that fails (a full disk) or is interrupted (a signal) truncates the file
    back to where it ended; an OSError's strerror then says why in words."""
    end, data = os.lseek(fd, 0, os.SEEK_END), memoryview(data)
    try:
        while data:
            data = data[os.write(fd, data):]
    except BaseException as e:
        os.ftruncate(fd, end)
        if isinstance(e, OSError):
            folder = os.path.dirname(os.path.abspath(path))
            raise OSError(e.errno, why_write_failed(e, folder)) from None
        raise


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, ensure_ascii=False), mode="w")


def why_write_failed(error, folder):
    """Why writing into folder failed, in words; a full disk is said so, with the bytes left."""
    try:
        free = shutil.disk_usage(folder).free
    except (OSError, AttributeError):
        free = None
    if getattr(error, "errno", None) == errno.ENOSPC or (free is not None and free < 1 << 20):
        return "the disk is full" + (f" ({free:,} bytes free)" if free is not None else "")
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


def remove(path):
    """Remove a file or folder if it is there; a symbolic link itself, never followed."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def remove_temporaries(folder):
    """Remove the temporaries that killed writers left in folder, which this process holds (own):
    no other process writes there meanwhile. Only names of exactly that form: look-alikes stay."""
    for name in filter(TEMPORARY.match, os.listdir(folder)):
        remove(os.path.join(folder, name))


# -----------------------------------------------------------------------------
# Locks: folders held by one process at a time (filelock's, on every system)

def own(folder, flag="--out_dir", note=True, shown=None, shared=False, waiting=None):
    """Lock folder for this process, through the lock file LOCK in it (filelock's ReadWriteLock:
    dropped at the process's end, kill -9 included). True: taken now; False: held already (a
    process never waits on itself). Held by another: UsageError, or with waiting, waiting() says so
    and this waits its turn. No lock possible (a read-only folder): a note. shared: a lock many
    readers hold together (live runs on their dataset), refused while a writer holds it."""
    key = os.path.realpath(folder)
    if key in _owned:
        return False
    try:
        lock = filelock.ReadWriteLock(os.path.join(key, LOCK), is_singleton=False)
        take = lock.acquire_read if shared else lock.acquire_write
        try:
            take(blocking=False)
        except filelock.Timeout:
            if not waiting:
                lock.close()
                raise
            waiting()
            take()
    except filelock.Timeout:  # (the constructor's too: the lock's database busy for 5 s)
        what = shown or f"{flag}={folder}"
        if shared:
            raise UsageError(f"{what} is being written (another process holds the folder's lock, "
                             f"as data/prepare.py does); wait for it to end") from None
        raise UsageError(f"another run is using {what} (it holds the folder's lock); wait for it "
                         f"to end, or choose another {flag}") from None
    except (OSError, sqlite3.Error) as e:  # a folder this process cannot write, say
        lock = None
        if note:
            print(f"note: cannot lock {flag}={folder} ({getattr(e, 'strerror', None) or e}); "
                  f"make sure no other run uses it", flush=True)
    _owned[key] = lock
    return True


def disown(folder):
    """Give up the lock own() took on folder."""
    lock = _owned.pop(os.path.realpath(folder), None)
    if lock is not None:
        lock.release()
        lock.close()


def release():
    """Give up every lock this process holds."""
    for folder in list(_owned):
        disown(folder)
