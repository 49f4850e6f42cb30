"""
Files written so that nothing is lost: a folder owned by one process at a time, writes that a crash
never leaves half done, and the leftovers of killed writers. OUT_DIR's life (outdir.py),
checkpoints, datasets and the tools' results are all written through here.

    # a second run there is refused while this one lives
    runfiles.own(out_dir)
    # the old file or the new one, never half of one
    runfiles.atomic_write(path, lambda f: f.write(data))
    # the .tmp files of writers that were killed
    runfiles.remove_dead_temporaries(out_dir)

Every temporary file or folder is named .NAME-PID-HEX.nanomesh.tmp beside its destination
(HEX: 12 digits): the one cleaner removes only names of exactly that form, a dead writer's (a live
one's are never touched, told by the pid), so a user's file that merely looks like a leftover
(.notes-1-ab.tmp) is never deleted.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import sys
import uuid

from configurator import UsageError

MARK = ".nanomesh.tmp"  # the end of every temporary name the project makes, and of no other
TEMPORARY = re.compile(r"^\..+-(\d+)-[0-9a-f]{12}" + re.escape(MARK) + "$")  # .NAME-PID-HEX{MARK}
# this process's folder locks: real path -> descriptor (or None: no lock could be taken)
_owned = {}


def temporary_name(path):
    """A fresh temporary name beside path, carrying this process's pid."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}{MARK}")


def atomic_write(path, write, mode="wb"):
    """write(f) into a temporary file beside path, fsync, then os.replace: a crash at any moment
    leaves the previous file or the new one. A failed write (a full disk) removes its temporary
    file and raises OSError, the reason in words as its strerror (why_write_failed); the previous
    file is unchanged."""
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
        # torch's zip writer reports a full disk as a RuntimeError
        if isinstance(e, (OSError, RuntimeError)):
            raise OSError(getattr(e, "errno", None) or errno.EIO,
                          why_write_failed(e, os.path.dirname(tmp))) from None
        raise


def write_json(path, obj):
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, ensure_ascii=False), mode="w")


def why_write_failed(error, folder):
    """Why writing into folder failed, in words: a full disk is said so, with the bytes left,
    whatever the writer made of ENOSPC (torch's zip writer raises a RuntimeError, numpy a short
    write)."""
    try:
        free = shutil.disk_usage(folder).free
    except (OSError, AttributeError):  # AttributeError: a POSIX system without os.statvfs
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


def remove_dead_temporaries(folder):
    """Remove the temporaries in folder (files and folders named .NAME-PID-HEX.nanomesh.tmp) whose
    writer is dead, or is this process (none of whose writes is under way when it calls this)."""
    for name in os.listdir(folder):
        m = TEMPORARY.match(name)
        if m and (int(m[1]) == os.getpid() or not process_alive(int(m[1]))):
            path = os.path.join(folder, name)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


def own(folder, flag="--out_dir", note=True, shown=None, shared=False):
    """Lock folder for this process: an exclusive flock on the folder itself, so no file is created
    and the system drops the lock when the process ends, kill -9 included. Held by another run: a
    UsageError. Where no lock can be taken (a file system without flock, or Windows): a one-line
    note, and go on. shared: a lock that many readers hold together (a live run on its dataset),
    refused while a writer owns the folder, and refusing a writer while any reader holds it."""
    key = os.path.realpath(folder)
    if key in _owned:
        return
    _owned[key] = None
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError) as e:  # no fcntl (Windows), or a folder that cannot be opened so
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
    # a file system without flock on folders (some NFS setups): go on, unprotected
    except OSError as e:
        if note:
            print(f"note: cannot lock {flag}={folder} ({e.strerror}); "
                  f"make sure no other run uses it", flush=True)
    _owned[key] = fd


@contextlib.contextmanager
def one_at_a_time(folder, waiting):
    """Hold an exclusive lock on folder for the with-block, waiting for it while another process
    holds it (waiting() is called once, first, to say so): the processes that meet here take turns.
    The lock is the folder's own flock, as own() takes it, so a killed holder never blocks the
    others. Where no lock can be taken (a file system without flock, or Windows): no turns, no
    wait."""
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
        except OSError:  # no flock on folders here (some NFS setups): go on without turns
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
    """Raise UsageError if another process owns folder now (see own); this one keeps no lock."""
    if os.path.realpath(folder) not in _owned:
        own(folder, flag, note=False, shown=shown)
        disown(folder)


def release():
    """Give up the folders this process owns."""
    for fd in filter(None, _owned.values()):
        os.close(fd)
    _owned.clear()


# a run folder's own
RUN_FILES = ("ckpt.pt", "ckpt-sharded.json", "log.jsonl", "result.json", "train.out")
DATA_FILES = ("meta.json", "train.bin", "val.bin", "document.bin", "document.idx", "tokenizer.json",
              "input.txt")


def owner(path):
    """(kind, file) where path (or the file a link there points to) is one of the files of a run's
    folder (kind 'run': it holds a checkpoint or a log) or of a dataset's ('dataset': it holds
    meta.json); else None."""
    for where in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        folder, name = os.path.split(where)
        if name in RUN_FILES and any(os.path.exists(os.path.join(folder, f))
                                     for f in RUN_FILES[:3]):
            return "run", where
        if name in DATA_FILES and os.path.isfile(os.path.join(folder, "meta.json")):
            return "dataset", where
    return None


def check_writable(path, flag):
    """Raise UsageError now, not after a long run, when --flag's output file path cannot be written
    (its folders, where they are not there yet, the writer makes), or is a file of a run or a
    dataset, which an output must never replace or append to."""
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
