"""
A run's log, OUT_DIR/log.jsonl: one JSON record a line, appended whole or not at all; a resume
drops what a killed run logged past its checkpoint. --wandb_log=true mirrors it to Weights & Biases.

    log = RunLog(out_dir, fresh=True)   # (run.py's Run opens it; wandb=tc to mirror it)
    log.write({"iter": 100, "loss": 2.1}, "iter 100: loss 2.1000")  # printed, then appended
    records = log_records("out/log.jsonl")                           # the whole records
"""

import dataclasses
import json
import os

from support import command, files

LOG = "log.jsonl"
MAX_LOG = 1 << 30  # a log.jsonl of a million steps, one line each, is about 150 MB
_open = []         # this process's open RunLogs, closed by close()


class LogError(command.UsageError):
    """A log that cannot be read or appended to as it is: one line."""


def log_lines(path):
    """(line number, bytes, record or None if damaged) for each line of the log at path."""
    try:
        data = files.read_bytes(path, MAX_LOG)
    except files.PlainDataError as e:
        raise LogError(f"{path} {e}; move it away, then resume the run") from None
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            record = files.parse_json(line.decode("utf-8"), nan=True)  # NaN: a loss that blew up
            if not isinstance(record, dict) or type(record.get("iter", 0)) is not int:
                raise ValueError("not a record of an iteration")
        except ValueError:  # UnicodeDecodeError and json's errors included
            record = None
        yield number, line, record


def log_records(path):
    """The whole records of the log at path, a damaged line left out."""
    return [record for _, _, record in log_lines(path) if record is not None]


def read_log(path, upto):
    """The log's lines of iterations up to upto, as bytes; a damaged line is moved into
    log.jsonl.damaged, which one note names."""
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
        files.atomic_write(aside, lambda f: f.writelines(line for _, line in bad))
        lines = ", ".join(str(number) for number, _ in bad[:5]) + (", ..." if len(bad) > 5 else "")
        print(f"note: {path} has {len(bad)} damaged line(s) (line {lines}: not whole JSON records, "
              f"as a kill or a full disk leaves); moved into {aside}, the rest of the log goes on",
              flush=True)
    return b"".join(kept)


def check_log(out_dir):
    """Refuse an OUT_DIR/log.jsonl that is a symbolic link or not a regular file."""
    path = os.path.join(out_dir, LOG)
    if os.path.islink(path):
        raise LogError(f"{path} is a symbolic link, and a run writes only inside its folder; "
                       f"remove the link (rm {path}) or choose another --out_dir")
    if os.path.exists(path) and not os.path.isfile(path):
        raise LogError(f"{path} is not a regular file (a FIFO, a device or a folder); move it "
                       f"away or choose another --out_dir")


class RunLog:
    """OUT_DIR/log.jsonl, appended to; --overwrite writes a temporary file until commit(), so
    that until then the old log still matches the old checkpoint."""

    def __init__(self, out_dir, fresh, on_commit=None, resumed_at=None, wandb=None):
        """on_commit: called at the first commit (a fresh run's: the old run's files go).
        resumed_at: a resumed run's iteration, past which the killed run's records are dropped.
        wandb: the run's TrainConfig, to mirror the log to Weights & Biases (wandb_run)."""
        self.path, self.on_commit = os.path.join(out_dir, LOG), on_commit
        self.pending = (files.temporary_name(self.path) if fresh and os.path.exists(self.path)
                        else None)
        if resumed_at is not None and os.path.exists(self.path):
            kept = read_log(self.path, resumed_at)
            files.atomic_write(self.path, lambda f: f.write(kept))
        self.fd, self.wandb = self._open(self.pending or self.path, fresh), None
        _open.append(self)
        if wandb:
            self.wandb = wandb_run(self, wandb, resumed_at)

    @staticmethod
    def _open(path, fresh):  # O_NOFOLLOW: never through a link (where the system has it)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        return os.open(path, flags | (os.O_TRUNC if fresh else 0) | getattr(os, "O_BINARY", 0),
                       0o666)

    def write(self, record, text):
        """Print text, and append record to the log."""
        print(text, flush=True)
        stream_lost = command.note()  # stdout given up: said in the log too
        record = {**record, "note": stream_lost} if stream_lost else record
        try:  # whole records only, for the resume
            files.append(self.path, (json.dumps(record) + "\n").encode(), self.fd)
        except OSError as e:
            raise LogError(f"could not append to {self.path} ({e.strerror}), so the run stopped; "
                           f"its last checkpoint is whole: free some space, then continue it "
                           f"with --init_from=resume") from None
        if self.wandb:
            self.wandb.log(record)

    def commit(self):
        """The run saved a checkpoint: a fresh run's log takes the old one's place."""
        if self.pending:  # closed first: Windows cannot replace a file that is open
            os.close(self.fd)
            os.replace(self.pending, self.path)
            self.pending, self.fd = None, self._open(self.path, fresh=False)
        if self.on_commit:
            self.on_commit, done = None, self.on_commit
            done()

    def close_one(self):
        if self.wandb:
            self.wandb.finish()
        os.close(self.fd)
        if self.pending:
            os.remove(self.pending)


def need_wandb(tc):
    """The wandb module, its settings checked before the run touches
    OUT_DIR; or a one-line refusal saying what to install or fix."""
    try:
        import wandb
        from pydantic import ValidationError  # of wandb's settings
    except ImportError:
        raise LogError("--wandb_log=true needs wandb, which is not installed: pip install wandb "
                       "(or pip install -r requirements-optional.txt)") from None
    try:
        wandb.Settings(project=tc.wandb_project).update_from_env_vars(dict(os.environ))
    except ValidationError as e:  # as WANDB_MODE=ofline
        raise LogError("wandb refuses {loc[0]}={input!r} from the environment ({msg}); fix that "
                       "WANDB_ variable (WANDB_MODE: online, offline or disabled)".format(
                           **e.errors()[0])) from None
    except wandb.Error as e:  # as a '/' in a project's name
        raise LogError(f"wandb refuses its settings ({e}); fix --wandb_project, or the WANDB_ "
                       f"variable named") from None
    return wandb


def wandb_run(log, tc, resumed_at):
    """A wandb run mirroring the log into OUT_DIR/wandb; its id, kept in the log, lets a resume
    continue the same wandb run."""
    wandb, out_dir = need_wandb(tc), os.path.dirname(log.path)
    ids = [r["wandb_run_id"] for r in log_records(log.path) if "wandb_run_id" in r
           ] if resumed_at is not None else []
    name = tc.wandb_run_name or os.path.basename(os.path.abspath(out_dir))
    try:  # console off: wandb would wrap stdout, which command.py guards
        run = wandb.init(project=tc.wandb_project, name=name, dir=out_dir, resume="allow",
                         id=ids[-1] if ids else None, config=dataclasses.asdict(tc),
                         settings=wandb.Settings(console="off"))
    except wandb.Error as e:
        raise LogError(f"wandb could not start a run ({str(e).strip().splitlines()[0]}); log "
                       f"in with `wandb login`, or log offline: WANDB_MODE=offline") from None
    run.define_metric("*", step_metric="iter")
    if not ids:
        log.write({"iter": resumed_at or 0, "wandb_run_id": run.id},
                  f"wandb: run {run.id} of project {tc.wandb_project}, named {name}")
    return run


def close():
    """Close this process's run logs (an uncommitted one is removed)."""
    while _open:
        _open.pop().close_one()
