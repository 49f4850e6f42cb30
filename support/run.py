"""
A training run's settings and its folder, OUT_DIR, from start to end:

    tc, ckpt = resolve(TrainConfig, given)     # the settings, and what the run starts from
    run = Run(tc, resumed, spread, device.type)  # built from resolved values, nothing more
    run.start()                # takes OUT_DIR: its lock, killed writers' leftovers, its log
    run.write(record, text)    # print, and append to log.jsonl (RunLog; tool.log_records reads it)
    run.save(model, optimizer, state, losses)  # refused for a model that blew up

resolve() is the one reader of the flags given, and decides everything before anything is
trained or written: torchrun's processes join their group and agree on one OUT_DIR (torchrun.py);
a restart resumes; a resume's saved settings come under the flags given; whatever contradicts the
checkpoint or a pretrained source is refused. A resume continues bit for bit (a step's batches
depend on the step alone).
"""

import json
import math
import os
import shlex
import time

import torch
import torch.distributed as dist

from configurator import UsageError
from support import checkpoint, command, distributed, files
from support.checkpoint import CKPT, KEPT, SHARDS, CheckpointError

NOT_KEPT = ("out_dir", "fsdp", "dist_timeout")  # the launch's, never read from a checkpoint
LAUNCH = (*NOT_KEPT, "init_from", "plan", "debug")  # what a resume is read with
DIVERGED = 10  # an evaluated loss above DIVERGED x ln(vocab): ten times a uniform guess's


def resolve(cls, given):
    """The flags given (a dict) -> (settings: a cls, the checkpoint a resume continues from or
    the pretrained source to loop, or None)."""
    resume = given.get("init_from") == "resume"  # its settings wait for its checkpoint
    tc = cls(**{k: v for k, v in given.items() if k in LAUNCH or not resume})
    from support.tool import check_run_folder  # a checkpoint's or an export's: never trained in
    check_run_folder(tc.out_dir)
    if tc.plan:  # nothing is joined or written; a resume's settings and model, its checkpoint's
        from support.plan import start  # (or the source a run would loop)
        ckpt = start(tc, given)
        return (settings(cls, ckpt, given, None, tc.out_dir) if resume else tc), ckpt
    real = os.path.realpath(tc.out_dir)  # a link re-pointed later moves nothing of this run
    out_dir = tc.out_dir if real == os.path.abspath(tc.out_dir) else real
    rank, world, restarted = 0, 1, False
    if os.environ.get("RANK", "-1") != "-1":  # torchrun's: its processes join first
        from support import torchrun
        rank, world = torchrun.join(tc.dist_timeout)
        torchrun.one_folder(out_dir)
        restarted = distributed.from_rank0(lambda: torchrun.restarted(out_dir))
    if resume or restarted:  # read and checked by support/resume.py, only then
        from support.resume import check_resumable, resume_from
        given = {k: v for k, v in given.items() if k != "overwrite"}
        if rank == 0 and os.path.isdir(out_dir):
            files.own(out_dir)
        ckpt = resume_from(out_dir, tc.fsdp)
        tc = settings(cls, ckpt, {**given, "init_from": "resume"}, world, out_dir)
        check_resumable(ckpt, tc, given)
        return tc, ckpt
    tc, found = settings(cls, None, given, world, out_dir), None
    if tc.init_from != "scratch":  # vanilla:OUT_DIR or hf:PATH, never the run's own folder
        from support import pretrained
        found = pretrained.where(tc.init_from, out_dir)  # read once out_dir is checked
    if rank == 0:
        check_fresh(out_dir, tc.overwrite)
    return tc, found and pretrained.source(found, given)


def settings(cls, ckpt, given, world, out_dir):
    """A resume's saved settings (all but NOT_KEPT), then the flags given, then what this launch
    resolves: the run's folder, and --grad_accum (None: one micro-batch a process of world,
    then kept; world None: a plan's, left None)."""
    saved, path = {}, ckpt and ckpt["path"]
    if ckpt:  # (support/resume.py: read only for a resume)
        from support.resume import saved_settings
        saved = saved_settings(cls, ckpt, lambda key: key not in NOT_KEPT and key not in given)
    merged = {**saved, **given, "out_dir": out_dir}
    if merged.get("grad_accum") is None:  # (0 is refused, as given)
        merged["grad_accum"] = world
    try:
        tc = cls(**merged)
    except UsageError as e:
        named = [key for key in saved if f"--{key}=" in str(e)]
        if not named:
            raise
        flags = " ".join(f"--{key}=VALUE" for key in named)
        raise UsageError(f"{e} ({', '.join(named)}: the checkpoint's saved value, in {path}; "
                         f"give {flags} to replace it)") from None
    if tc.wandb_log:  # refused now, not at the first log line
        from support.mirror import need_wandb
        need_wandb(tc)
    return tc


class Run:
    """OUT_DIR of one training run, as rank 0 (master) or another rank sees it."""

    def __init__(self, tc, resumed, spread, device_type):
        self.out_dir, self.spread, self.device_type = tc.out_dir, spread, device_type
        self.master = not distributed.grouped() or dist.get_rank() == 0
        self.resumed = resumed  # the checkpoint a resume continues from, or None
        self.saved_iter = self.resumed and self.resumed["iter_num"]  # the last good checkpoint's
        self.overwrite, self.keep_every = tc.overwrite, tc.keep_every
        self.wandb = tc if tc.wandb_log else None  # the settings wandb records
        self.log = None  # OUT_DIR/log.jsonl (rank 0's), once the run has started

    def start(self):
        """Rank 0 takes OUT_DIR (lock, leftovers, log)."""
        if not self.master:
            return
        out_dir, fresh = self.out_dir, self.resumed is None
        os.makedirs(out_dir, exist_ok=True)
        files.own(out_dir)
        if fresh:
            check_fresh(out_dir, self.overwrite, note=True)  # again: another run may have ended
        check_log(out_dir)
        files.remove_temporaries(out_dir)
        for name in checkpoint.listing(out_dir):  # an interrupted sharded save's
            if SHARDS.match(name) and not os.path.isfile(os.path.join(out_dir, name, ".metadata")):
                files.remove(os.path.join(out_dir, name))
        replace = (lambda: replace_old_run(out_dir, self.spread.sharded)) if fresh else None
        self.log = RunLog(out_dir, fresh, replace, None if fresh else self.saved_iter, self.wandb)

    def write(self, record, text):
        """Print text and log record (rank 0)."""
        if self.master:
            self.log.write(record, text)

    def save(self, model, optimizer, state, losses):
        """Save state, the model and AdamW unless the model blew up; commit the log."""
        reason = unsaveable(model, optimizer, losses)
        if dist.is_initialized():  # every rank saves its part, or none does
            flag = torch.tensor(float(reason is not None), device=model.lm_head.weight.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if not reason and flag.item():
                reason = "a weight or optimizer state on another rank is not finite"
        if reason:
            raise FloatingPointError(f"{reason} at iter {state['iter_num']}; stopped without "
                                     f"saving, so {self.last_good()}")
        state = {**state, "saved_at": time.time(), "launch": distributed.launch_id()}
        self.spread.save(self.out_dir, model, optimizer, self.master, state)
        self.saved_iter = it = state["iter_num"]
        if self.master and self.keep_every and it and it % self.keep_every == 0:
            checkpoint.keep(self.out_dir, it, self.spread.sharded)
        if self.master:
            self.log.commit()

    def last_good(self):
        """The checkpoint a run that blew up leaves (or none), in words."""
        if self.saved_iter is None:
            return "this run saved no checkpoint (start again with a lower --lr)"
        entry = checkpoint.latest(self.out_dir, self.spread.sharded)
        return (f"{os.path.join(self.out_dir, entry[2])} (iter {self.saved_iter}) is the last "
                f"good checkpoint (resume with --init_from=resume and a lower --lr)")

    def stopped(self, iter_num, world):
        """The last line of a run stopped by a signal: the command that continues it (rank 0)."""
        if self.master:
            again = shlex.quote("--out_dir=" + self.out_dir) + self.spread.flag
            print(f"stopped at iter {iter_num}; checkpoint saved. Continue with "
                  f"{distributed.launch(world)} train.py --init_from=resume {again}")


# -----------------------------------------------------------------------------
# OUT_DIR's checkpoints: a fresh run is refused over an old one, which --overwrite replaces

def check_fresh(out_dir, overwrite, note=False):
    """A run from scratch into out_dir: refused where a run is (a live one first), unless
    --overwrite, which is said (note) of every checkpoint it replaces, kept ones included."""
    if os.path.isdir(out_dir):
        files.own(out_dir)
        check_log(out_dir)
    names = ", ".join(n for n in checkpoint.listing(out_dir) if n in (CKPT, checkpoint.POINTER)
                      or KEPT.match(n) or SHARDS.match(n) and os.path.isfile(
                          os.path.join(out_dir, n, ".metadata")))
    if names and not overwrite:
        try:  # (a damaged one is said so by a resume: a new run may replace it)
            at, _, latest, _ = checkpoint.latest(out_dir)
            how = f"continue from its latest, {latest} (iter {at}), with --init_from=resume"
        except (CheckpointError, TypeError):
            how = "continue it with --init_from=resume"
        raise UsageError(f"{out_dir} holds a run's checkpoints ({names}); {how}, or start over "
                         f"with --overwrite=true (which replaces all of them), or choose another "
                         f"--out_dir")
    if names and note:
        print(f"note: --overwrite=true: this run's first checkpoint replaces {names} in "
              f"{out_dir}", flush=True)


def replace_old_run(out_dir, sharded):
    """After a fresh run's first checkpoint (sharded or not) the old run's checkpoints go."""
    for name in checkpoint.listing(out_dir):
        if (name == CKPT) == sharded and (name == CKPT or SHARDS.match(name)) or KEPT.match(name) \
                or name == checkpoint.POINTER:
            files.remove(os.path.join(out_dir, name))


# -----------------------------------------------------------------------------
# A model that blew up is never saved

def unsaveable(model, optimizer, losses):
    """Why this model must not be saved (a loss or tensor not finite, a loss blown up), or None."""
    limit = DIVERGED * math.log(model.config.vocab_size)
    for split, loss in losses.items():
        if not math.isfinite(loss):
            return f"{split} loss is {loss}"
        if loss > limit:
            return f"{split} loss is {loss:.4g} (above {limit:.4g}, {DIVERGED} x ln(vocab_size))"
    tensors = {f"weight {k}": v for k, v in model.state_dict().items() if v.is_floating_point()}
    names = {p: name for name, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        owner = names.get(p, "a parameter")
        for k, v in state.items():
            if torch.is_tensor(v) and v.is_floating_point():
                tensors[f"optimizer {k} of {owner}"] = v
    # each tensor whole, or under FSDP (a DTensor) this rank's shard of it
    finite = torch.stack([torch.isfinite(v.to_local() if hasattr(v, "to_local") else v).all()
                          for v in tensors.values()]).tolist()
    return next((f"{name} is not finite" for name, ok in zip(tensors, finite) if not ok), None)


# -----------------------------------------------------------------------------
# The run's log, OUT_DIR/log.jsonl: one JSON record a line, appended whole or not at all; a resume
# drops what a killed run logged past its checkpoint (support/tool.py reads a log back).
# --wandb_log=true mirrors it to wandb (support/mirror.py).

LOG = "log.jsonl"
_open = []  # this process's open RunLogs, closed by close()


def check_log(out_dir):
    """Refuse an OUT_DIR/log.jsonl that is a symbolic link or not a regular file."""
    path = os.path.join(out_dir, LOG)
    if os.path.islink(path):
        raise UsageError(f"{path} is a symbolic link, and a run writes only inside its folder; "
                         f"remove the link (rm {path}) or choose another --out_dir")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"{path} is not a regular file (a FIFO, a device or a folder); move it "
                         f"away or choose another --out_dir")


class RunLog:
    """OUT_DIR/log.jsonl, appended to; --overwrite writes a temporary file until commit(), so
    that until then the old log still matches the old checkpoint."""

    def __init__(self, out_dir, fresh, on_commit=None, resumed_at=None, wandb=None):
        """on_commit: called at the first commit (a fresh run's: the old run's files go).
        resumed_at: a resumed run's iteration, past which the killed run's records are dropped.
        wandb: the run's TrainConfig, to mirror the log to Weights & Biases."""
        self.path, self.on_commit = os.path.join(out_dir, LOG), on_commit
        self.pending = (files.temporary_name(self.path) if fresh and os.path.exists(self.path)
                        else None)
        if resumed_at is not None and os.path.exists(self.path):
            from support.tool import read_log
            kept = read_log(self.path, resumed_at)
            files.atomic_write(self.path, lambda f: f.write(kept))
        self.fd, self.wandb = self._open(self.pending or self.path), None
        _open.append(self)
        if wandb:  # mirrored (support/mirror.py, imported only then), as the resumed run was
            from support import mirror
            self.wandb = mirror.start(wandb, self, resumed_at)

    @staticmethod
    def _open(path):  # O_NOFOLLOW: never through a link (where the system has it)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        return os.open(path, flags | getattr(os, "O_BINARY", 0), 0o666)

    def write(self, record, text):
        """Print text, and append record to the log."""
        print(text, flush=True)
        stream_lost = command.note()  # stdout given up: said in the log too
        record = {**record, "note": stream_lost} if stream_lost else record
        try:  # whole records only, for the resume
            files.append(self.path, (json.dumps(record) + "\n").encode(), self.fd)
        except OSError as e:
            raise UsageError(f"could not append to {self.path} ({e.strerror}), so the run "
                             f"stopped; its last checkpoint is whole: free some space, then "
                             f"continue it with --init_from=resume") from None
        if self.wandb:
            self.wandb.log(record)

    def commit(self):
        """The run saved a checkpoint: a fresh run's log takes the old one's place."""
        if self.pending:  # closed first: Windows cannot replace a file that is open
            os.close(self.fd)
            os.replace(self.pending, self.path)
            self.pending, self.fd = None, self._open(self.path)
        if self.on_commit:
            self.on_commit, done = None, self.on_commit
            done()

    def close_one(self):
        if self.wandb:
            self.wandb.finish()
        os.close(self.fd)
        if self.pending:
            os.remove(self.pending)


def close():
    """Close this process's run logs (an uncommitted one is removed)."""
    while _open:
        _open.pop().close_one()
