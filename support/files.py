"""
Files read and written so that nothing is lost: every JSON file read as plain data with limits,
writes that a crash never leaves half done, folders held by one process at a time, the leftovers
of killed writers, and output paths that may never land on a run's or a dataset's files.

    obj = files.read_json(path)                        # a regular file, size and depth limits
    files.atomic_write(path, lambda f: f.write(data))  # the old file or the new, never half
    files.own(out_dir)                                 # a second run there is refused
    files.check_writable(path, "json")                 # before a long computation, not after

Every temporary is named .NAME-PID-HEX.nanomesh.tmp beside its destination; the cleaner removes
only names of exactly that form whose writer is dead, so a user's look-alike file survives.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import uuid

from configurator import UsageError

MAX_BYTES = 64 << 20  # larger than any config, meta.json, pointer or result file written here
MAX_DEPTH = 64        # nesting: the project's own files are at most 4 deep
MARK = ".nanomesh.tmp"  # the end of every temporary name the project makes, and of no other
TEMPORARY = re.compile(r"^\..+-(\d+)-[0-9a-f]{12}" + re.escape(MARK) + "$")  # .NAME-PID-HEX{MARK}
_owned = {}  # this process's folder locks: real path -> descriptor (None: no lock could be taken)


# -----------------------------------------------------------------------------
# Reading plain data

class PlainDataError(UsageError):
    """A file that is not the plain data it should be; its reader adds the name and the fix."""


def read_bytes(path, max_bytes=MAX_BYTES):
    """The bytes of the regular file path; a FIFO, a device or a folder is refused before it is
    read (opened non-blocking: a FIFO without a writer cannot hang the open), as is a file over
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


def parse_json(text, max_depth=MAX_DEPTH, nan=False):
    """text -> its JSON value. Nested too deep (checked before parsing, so json never recurses far),
    a repeated key, or NaN / Infinity (unless nan: a log's loss that blew up) is a PlainDataError;
    json.JSONDecodeError passes through with its position."""
    depth = deepest = 0
    for m in BRACKET.finditer(STRING.sub("", text)):
        depth += 1 if m[0] in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > max_depth:
        raise PlainDataError(f"is nested more than {max_depth} levels deep")
    constant = None if nan else _no_constant  # None: json's own, which reads NaN and Infinity
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=constant)


def read_json(path, max_bytes=MAX_BYTES):
    return parse_json(read_text(path, max_bytes))


def read_config(path):
    """A JSON config file's object of settings: configurator.parse_flags' reader."""
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
    """A file name of the folder itself, no path: what a meta.json or a weight index may name."""
    return (isinstance(value, str) and value not in ("", ".", "..")
            and os.path.basename(value) == value and "\\" not in value)


# -----------------------------------------------------------------------------
# Writing: atomic, and the leftovers of killed writers

def temporary_name(path):
    """A fresh temporary name beside path, carrying this process's pid."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}{MARK}")


def atomic_write(path, write, mode="wb"):
    """write(f) into a temporary file beside path, fsync, then os.replace: a crash leaves the old
    file or the new. A failed write removes its temporary and raises OSError whose strerror says
    why in words (a full disk, whatever the writer made of ENOSPC); the old file is unchanged."""
    tmp = temporary_name(path)
    try:  # "x": created afresh, with the mode a plain write gets (not mkstemp's private 0600)
        with open(tmp, mode.replace("w", "x"),
                  **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)):  # torch's zip writer: RuntimeError
            raise OSError(getattr(e, "errno", None) or errno.EIO,
                          why_write_failed(e, os.path.dirname(tmp))) from None
        raise


def write_json(path, obj):  # its folder made first
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, ensure_ascii=False), mode="w")


def why_write_failed(error, folder):
    """Why writing into folder failed, in words; a full disk is said so, with the bytes left."""
    try:
        free = shutil.disk_usage(folder).free
    except (OSError, AttributeError):
        free = None
    if getattr(error, "errno", None) == errno.ENOSPC or (free is not None and free < 1 << 20):
        return f"the disk is full ({free:,} bytes free)" if free is not None else "the disk is full"
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


def process_alive(pid):
    """Whether process pid still runs on this machine."""
    if sys.platform == "win32":  # there os.kill(pid, 0) would send CTRL_C_EVENT
        import ctypes
        kernel = ctypes.windll.kernel32
        handle = kernel.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.GetLastError() == 5  # ERROR_ACCESS_DENIED: alive, another user's
        code = ctypes.c_ulong()
        kernel.GetExitCodeProcess(handle, ctypes.byref(code))
        kernel.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove(path):
    """Remove a file or folder if it is there; a symbolic link itself, never followed."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.remove(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_dead_temporaries(folder):
    """Remove folder's temporaries whose writer is dead, or is this process (which calls this only
    between its writes)."""
    for name in os.listdir(folder):
        m = TEMPORARY.match(name)
        if m and (int(m[1]) == os.getpid() or not process_alive(int(m[1]))):
            remove(os.path.join(folder, name))


# -----------------------------------------------------------------------------
# Folders held by one process at a time

def own(folder, flag="--out_dir", note=True, shown=None, shared=False):
    """Lock folder for this process: a flock on the folder itself, so no file is made and the
    system drops it when the process ends, kill -9 included. Held by another: UsageError. No lock
    possible (no flock, Windows): a one-line note. shared: a lock many readers hold together (live
    runs on their dataset), refused while a writer holds it and refusing a writer meanwhile."""
    key = os.path.realpath(folder)
    if key in _owned:
        return
    _owned[key] = None
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError) as e:
        if note:
            print(f"note: cannot lock {flag}={folder} "
                  f"({getattr(e, 'strerror', None) or 'no flock on this system'}); "
                  f"make sure no other run uses it", flush=True)
        return
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        del _owned[key]
        if shared:
            raise UsageError(f"{shown or f'{flag}={folder}'} is being written (another process "
                             f"holds the folder's lock, as data/prepare.py does); "
                             f"wait for it to end") from None
        raise UsageError(f"another run is using {shown or f'{flag}={folder}'} "
                         f"(it holds the folder's lock); wait for it to end, "
                         f"or choose another {flag}") from None
    except OSError as e:  # no flock on folders (some NFS setups): go on, unprotected
        if note:
            print(f"note: cannot lock {flag}={folder} ({e.strerror}); "
                  f"make sure no other run uses it", flush=True)
    _owned[key] = fd


@contextlib.contextmanager
def one_at_a_time(folder, waiting):
    """Hold an exclusive flock on folder for the with-block, waiting while another process holds it
    (waiting() says so, once): processes meeting here take turns; a killed holder blocks nobody.
    No lock possible: no turns, no wait."""
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # no flock on folders here: go on without turns
            pass
        yield
    finally:
        os.close(fd)  # (closing the descriptor drops the lock)


def disown(folder):
    """Give up the lock own() took on folder."""
    fd = _owned.pop(os.path.realpath(folder), None)
    if fd is not None:
        os.close(fd)


def check_free(folder, flag="--out_dir", shown=None):
    """Raise UsageError if another process owns folder now; this one keeps no lock."""
    if os.path.realpath(folder) not in _owned:
        own(folder, flag, note=False, shown=shown)
        disown(folder)


def release():
    """Give up every folder this process owns."""
    for fd in filter(None, _owned.values()):
        os.close(fd)
    _owned.clear()


# -----------------------------------------------------------------------------
# Output paths: never a run's or a dataset's file

RUN_FILES = ("ckpt.pt", "ckpt-sharded.json", "log.jsonl", "result.json", "train.out")
DATA_FILES = ("meta.json", "train.bin", "val.bin", "document.bin", "document.idx", "tokenizer.json",
              "input.txt")


def owner(path):
    """(kind, file) where path (or what a link there points to) is a file of a run's folder ('run':
    it holds a checkpoint or a log) or of a dataset's ('dataset': it holds meta.json); else None."""
    for where in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        folder, name = os.path.split(where)
        if name in RUN_FILES and any(os.path.exists(os.path.join(folder, f))
                                     for f in RUN_FILES[:3]):
            return "run", where
        if name in DATA_FILES and os.path.isfile(os.path.join(folder, "meta.json")):
            return "dataset", where
    return None


def check_writable(path, flag):
    """Raise UsageError now, not after a long run, when --flag's output file cannot be written (its
    missing folders the writer makes), or is a run's or a dataset's file, which an output must
    never replace or append to."""
    if os.path.isdir(path):
        raise UsageError(f"--{flag}={path} is a folder; give a file name")
    if owner(path):
        kind, (folder, name) = owner(path)[0], os.path.split(owner(path)[1])
        raise UsageError(f"--{flag}={path} is the {name} of the {kind} in {folder}, "
                         f"which this would write over; give another file name")
    there = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(there):  # folders the writer will make: the nearest one there decides
        there = os.path.dirname(there)
    if not os.path.isdir(there) or not os.access(there, os.W_OK) or \
            os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"cannot write --{flag}={path}: no permission, or a file where a folder "
                         f"should be")
