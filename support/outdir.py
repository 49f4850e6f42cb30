"""
OUT_DIR from a run's start to its end: the folder a run holds, which files make it a run, the
checks before a run takes it, taking it (its lock, killed writers' leftovers, its log), and an old
run replaced.

    # through a symbolic link: the folder it names now, for good
    tc.out_dir = outdir.held(tc.out_dir)
    # a scratch run where a run is: refused (unless --overwrite)
    outdir.check_fresh(out_dir, overwrite)
    # all checked: the run takes it
    log = outdir.start_run(out_dir, fresh, overwrite, keep, resumed_at)
    # print text, append record to OUT_DIR/log.jsonl
    log.write(record, text)

A run's files are ckpt.pt, or ckpt-sharded.json and the shards-<iter> folder it names (sharded.py),
and log.jsonl. Nothing a run writes follows a link out of its folder: the folder is held by its
real path, the log is refused when it is a link or not a regular file, checkpoints replace their
file (os.replace) instead of writing through it, and a link where a shards folder would be is
removed, not followed.
"""

import json
import os
import shutil

from configurator import UsageError
from support import console, plain, runfiles
from support.checkpoint import CKPT, POINTER, SHARDS, read_pointer

LOG = "log.jsonl"
MAX_LOG = 1 << 30  # a log.jsonl of a million steps, one line each, is about 150 MB
_logs = []         # this process's open RunLogs, closed by release()


class OutDirError(UsageError):
    """OUT_DIR holds something a run cannot use as it is (a link, a FIFO, a full disk): one line."""


def held(folder):
    """The folder a run holds from start to end: where folder's path passes through a symbolic link,
    the real path of the folder it names now, so that re-pointing the link later cannot send the
    run's writes into another folder (its lock stays on this one)."""
    real = os.path.realpath(folder)
    return folder if real == os.path.abspath(folder) else real


def run_files(out_dir):
    """The files that make OUT_DIR a run, whatever its format: ckpt.pt, ckpt-sharded.json,
    shards-<iter>/."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    return [os.path.join(out_dir, n) for n in sorted(names)
            if n in (CKPT, POINTER) or SHARDS.match(n)]


def remove(path):
    """Remove a run's file or folder, if it is there; a symbolic link is removed itself, never
    followed."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.remove(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def check_log(out_dir):
    """Refuse an OUT_DIR/log.jsonl that is a symbolic link (a run would write where it points,
    outside its folder) or not a regular file (a FIFO would hang the run that reads it)."""
    path = os.path.join(out_dir, LOG)
    if os.path.islink(path):
        raise OutDirError(f"{path} is a symbolic link, and a run writes only inside its folder; "
                          f"remove the link (rm {path}) or choose another --out_dir")
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutDirError(f"{path} is not a regular file (a FIFO, a device or a folder); move it "
                          f"away or choose another --out_dir")


def check_fresh(out_dir, overwrite):
    """A scratch run into out_dir: refused where a run is, in either format (unless --overwrite),
    and where a live one is first of all."""
    if os.path.isdir(out_dir):
        runfiles.own(out_dir)
        check_log(out_dir)
    found = [p for p in run_files(out_dir) if not SHARDS.match(os.path.basename(p))]
    if found and not overwrite:
        raise UsageError(f"{' and '.join(found)} exist{'s' if len(found) == 1 else ''}; "
                         f"continue it with --init_from=resume, or start over with "
                         f"--overwrite=true, or choose another --out_dir")


def start_run(out_dir, fresh, overwrite, keep, resumed_at):
    """The run takes OUT_DIR, everything being checked: its lock, the leftovers of killed writes
    removed, and its log (RunLog) returned. keep: this run's checkpoint (CKPT, or POINTER under
    FSDP). A fresh run over an old one (--overwrite) replaces all of it at its first checkpoint,
    when log.commit() puts its log in place and removes the old run's checkpoints
    (replace_old_run). A resumed run's log drops what the killed run logged past resumed_at."""
    os.makedirs(out_dir, exist_ok=True)
    runfiles.own(out_dir)
    if fresh:
        # again: another run may have finished there in the meantime
        check_fresh(out_dir, overwrite)
    else:
        check_log(out_dir)  # (check_fresh checks it too)
    runfiles.remove_dead_temporaries(out_dir)
    # (an old run being replaced may have a damaged pointer: replace_old_run)
    if not (fresh and overwrite):
        remove_unfinished_shards(out_dir)
    replace = (lambda: replace_old_run(out_dir, keep)) if fresh else None
    return RunLog(out_dir, fresh, replace, None if fresh else resumed_at)


def replace_old_run(out_dir, keep):
    """After a fresh run's first checkpoint (keep: its format's file), the rest of the old run
    goes: the other format's checkpoint, and every shards folder that the (new) pointer does not
    name."""
    named = read_pointer(out_dir)["folder"] if keep == POINTER else None
    for path in run_files(out_dir):
        name = os.path.basename(path)
        if name == (POINTER if keep == CKPT else CKPT) or SHARDS.match(name) and name != named:
            remove(path)


def remove_unfinished_shards(out_dir):
    """Remove the shards folders that ckpt-sharded.json does not name: sharded writes that were
    killed, or the previous checkpoint's, left by a kill after the pointer moved on. Only by a run
    that owns OUT_DIR."""
    meta = read_pointer(out_dir)
    for name in os.listdir(out_dir):
        if SHARDS.match(name) and (meta is None or name != meta["folder"]):
            remove(os.path.join(out_dir, name))


def log_lines(path):
    """(line number, the line's bytes, its record or None for a damaged line) for each line of the
    log.jsonl at path: a regular file (a FIFO would hang the reader) of records {"iter": int,
    ...}."""
    try:
        data = plain.read_bytes(path, MAX_LOG)
    except plain.PlainDataError as e:
        raise OutDirError(f"{path} {e}; move it away, then resume the run") from None
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            # a loss that blew up is logged
            record = plain.parse_json(line.decode("utf-8"), nan=True)
            if not isinstance(record, dict) or type(record.get("iter", 0)) is not int:
                raise ValueError("not a record of an iteration")
        except ValueError:  # UnicodeDecodeError and json's errors included
            record = None
        yield number, line, record


def log_records(path):
    """The whole records of the log.jsonl at path, a damaged line left out (for a reader: nothing
    moves)."""
    return [record for _, _, record in log_lines(path) if record is not None]


def read_log(path, upto):
    """The lines of log.jsonl at path whose records are of iterations up to upto, as bytes. A
    damaged line (half a line left by a kill or a full disk, bytes that are not a JSON record)
    never blocks a resume: it is moved into log.jsonl.damaged (or .damaged-2, ...), which one note
    names."""
    kept, bad = [], []
    for number, line, record in log_lines(path):
        if record is None:
            bad.append((number, line))
        elif record.get("iter", 0) <= upto:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    if bad:
        aside, n = path + ".damaged", 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{path}.damaged-{n}"
        runfiles.atomic_write(aside, lambda f: f.writelines(line for _, line in bad))
        lines = ", ".join(str(number) for number, _ in bad[:5]) + (", ..." if len(bad) > 5 else "")
        print(f"note: {path} has {len(bad)} damaged line(s) (line {lines}: not whole JSON records, "
              f"as a kill or a full disk leaves); moved into {aside}, the rest of the log goes on",
              flush=True)
    return b"".join(kept)


class RunLog:
    """OUT_DIR/log.jsonl, one JSON record a line. A resumed run appends. A fresh run over an old
    one (--overwrite) writes into a temporary file until commit(), at its first checkpoint: until
    then the old log.jsonl still matches the old checkpoint, and a run that saves nothing leaves it
    as it was. A record is appended whole or not at all: a write that fails (a full disk) takes its
    half line back."""

    def __init__(self, out_dir, fresh, on_commit=None, resumed_at=None):
        """on_commit: called at the first commit (a fresh run's: the old run's files go).
        resumed_at: a resumed run's iteration; records past it (the killed run's last steps, which
        this run does again) are dropped, so that a plot of the log is one curve."""
        self.path, self.on_commit = os.path.join(out_dir, LOG), on_commit
        self.pending = (runfiles.temporary_name(self.path) if fresh and os.path.exists(self.path)
                        else None)
        if resumed_at is not None and os.path.exists(self.path):
            kept = read_log(self.path, resumed_at)
            runfiles.atomic_write(self.path, lambda f: f.write(kept))
        self.fd = self._open(self.pending or self.path, fresh)
        _logs.append(self)

    @staticmethod
    def _open(path, fresh):  # O_NOFOLLOW: never through a link (where the system has it)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        return os.open(path, flags | (os.O_TRUNC if fresh else 0) | getattr(os, "O_BINARY", 0),
                       0o666)

    def write(self, record, text):
        """Print text, and append record to the log."""
        print(text, flush=True)
        stream_lost = console.note()  # stdout given up: said in the log too, for a lost terminal
        record = {**record, "note": stream_lost} if stream_lost else record
        line = memoryview((json.dumps(record) + "\n").encode())
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            while line:
                line = line[os.write(self.fd, line):]
        except OSError as e:
            os.ftruncate(self.fd, end)  # the log stays whole records, for the resume
            why = runfiles.why_write_failed(e, os.path.dirname(self.path))
            raise OutDirError(f"could not append to {self.path} ({why}), so the run stopped; "
                              f"its last checkpoint is whole: free some space, then continue it "
                              f"with --init_from=resume") from None

    def commit(self):
        """The run has saved a checkpoint: a fresh run's log takes the old one's place (and
        on_commit runs)."""
        if self.pending:  # closed first: Windows cannot replace a file that is open
            os.close(self.fd)
            os.replace(self.pending, self.path)
            self.pending, self.fd = None, self._open(self.path, fresh=False)
        if self.on_commit:
            self.on_commit, done = None, self.on_commit
            done()

    def close(self):
        os.close(self.fd)
        if self.pending:
            os.remove(self.pending)


def release():
    """Close this process's run logs (an uncommitted one is removed) and give up the folders it
    owns."""
    while _logs:
        _logs.pop().close()
    runfiles.release()
