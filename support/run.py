"""
A training run's own folder, OUT_DIR, from start to end: resume, checks, lock, log, checkpoints:

    run = Run(TrainConfig, given, master)  # the settings' class, the flags given
    given = run.resume(given)              # --init_from=resume: its latest checkpoint, run.ckpt
    tc = run.settings(given)               # a resume's saved settings, then the flags given
    if not run.check(tc, given, spread):   # everything checked; a finished run is left alone
        return 0
    run.start(tc, device.type)             # the run takes OUT_DIR
    run.write(record, text)                # print, and append to log.jsonl
    run.save(model, optimizer, state, losses)  # refused for a model that blew up

A resume continues bit for bit (a step's batches depend on the step alone).
"""

import dataclasses
import math
import os
import shlex
import time

import torch
import torch.distributed as dist

from configurator import UsageError, value_of
from support import checkpoint, distributed, files
from support.checkpoint import CKPT, KEPT, POINTER, SHARDS, CheckpointError
from support.log import RunLog, check_log, need_wandb
from mesh import RecursiveGPT

NOT_KEPT = ("out_dir", "fsdp")  # the launch's, not the checkpoint's
# train.py resolves or derives these (auto, None): a checkpoint keeps them as given
DERIVED = ("dtype", "compile", "lr", "min_lr", "warmup_iters", "lr_decay_iters")
DIVERGED = 10  # an evaluated loss above DIVERGED x ln(vocab): ten times a uniform guess's


class Run:
    """OUT_DIR of one training run, as rank 0 (master) or another rank sees it."""

    def __init__(self, cls, given, master):
        self.cls, self.master = cls, master  # the settings' dataclass
        self.out_dir = given.get("out_dir", cls.out_dir)
        self.ckpt = None        # the checkpoint a resume continues from
        self.log = None         # OUT_DIR/log.jsonl (rank 0's), once the run has started
        self.spread = None      # how the model is spread: what it saves, and how
        self.saved_iter = None  # the last good checkpoint's iteration
        self.as_given = {}      # the settings a checkpoint keeps as they were given
        self.device_type = None  # whose random state a checkpoint keeps

    def resume(self, given):
        """--init_from=resume (or a torchrun restart): the latest checkpoint."""
        distributed.one_folder(self.out_dir, given.get("dist_timeout", self.cls.dist_timeout))
        given = distributed.restarted(given, self.out_dir, self.master)
        if given.get("init_from") != "resume":
            return given
        if self.master and os.path.isdir(self.out_dir):
            files.own(self.out_dir)
        self.ckpt = load(self.out_dir, sharded=bool(given.get("fsdp")))
        return given

    def settings(self, given):
        """A resume's saved settings (all but NOT_KEPT), then the flags given."""
        saved, path, cls = {}, self.ckpt and self.ckpt["path"], self.cls
        fields = {f.name: f for f in dataclasses.fields(cls)}
        old = (self.ckpt or {}).get("train_config", {})
        unknown = sorted(set(old) - set(fields))
        if unknown:
            raise CheckpointError(f"{path} is intact, but this code has no setting "
                                  f"{', '.join(unknown)}, which its run was trained with; resume "
                                  f"it with the code that wrote it")
        if self.ckpt:
            checkpoint.defaults(path, self.ckpt, "train_config", cls)
        for key, value in old.items():
            if key not in NOT_KEPT and key not in given:
                try:
                    saved[key] = value_of(fields[key], value, f"{path}'s saved train_config")
                except UsageError as e:
                    raise CheckpointError(f"{e}; it is damaged or was edited: give "
                                          f"--{key}=VALUE to replace it") from None
        try:
            tc = cls(**{**saved, **given})
        except UsageError as e:
            named = [key for key in saved if f"--{key}=" in str(e)]
            if not named:
                raise
            flags = " ".join(f"--{key}=VALUE" for key in named)
            raise UsageError(f"{e} ({', '.join(named)}: the checkpoint's saved value, in {path}; "
                             f"give {flags} to replace it)") from None
        self.as_given = {k: getattr(tc, k) for k in DERIVED}
        return tc

    @property
    def model_config(self):
        """A resumed run's model Config, or None."""
        return self.ckpt["model"].config if self.ckpt else None

    @property
    def trained_on(self):
        """A resumed run's record of its data ({} when it kept none), or None for a fresh run."""
        return (self.ckpt.get("data") or {}) if self.ckpt else None

    def check(self, tc, given, spread):
        """Everything before the run touches OUT_DIR; False for a finished resumed run."""
        real = os.path.realpath(tc.out_dir)
        self.out_dir = tc.out_dir = tc.out_dir if real == os.path.abspath(tc.out_dir) else real
        self.spread = spread
        if tc.wandb_log:  # refused early: no wandb, or settings it refuses
            need_wandb(tc)
        if tc.keep_every % tc.eval_interval:
            raise UsageError(f"--keep_every={tc.keep_every} keeps checkpoints, which are saved "
                             f"every --eval_interval={tc.eval_interval} steps: give a multiple")
        if self.ckpt:
            check_resumable(self.ckpt, tc, given)
            self.saved_iter = self.ckpt["iter_num"]
            return not finished(self.ckpt, tc)
        if tc.init_from == "scratch" and self.master:
            check_fresh(self.out_dir, tc.overwrite)
        return True

    def start(self, tc, device_type):
        """Rank 0 takes OUT_DIR (lock, leftovers, log)."""
        self.device_type, self.keep_every = device_type, tc.keep_every
        if not self.master:
            return
        out_dir, fresh = self.out_dir, self.ckpt is None
        os.makedirs(out_dir, exist_ok=True)
        files.own(out_dir)
        if fresh:
            check_fresh(out_dir, tc.overwrite)  # again: another run may have ended there
        check_log(out_dir)
        files.remove_dead_temporaries(out_dir)
        if not (fresh and tc.overwrite):
            remove_unfinished_shards(out_dir)
        replace = (lambda: replace_old_run(out_dir, self.spread.checkpoint)) if fresh else None
        self.log = RunLog(out_dir, fresh, replace, None if fresh else self.ckpt["iter_num"],
                          tc if tc.wandb_log else None)

    def restore(self, model, optimizer, seed, rank, world, device_type):
        """A resumed run's AdamW state (FSDP: weights too) and random state (others: seeded)."""
        self.spread.load(self.ckpt, model, optimizer)
        if rank == 0:
            torch.set_rng_state(self.ckpt["rng"]["torch"].cpu())
            if "cuda" in self.ckpt["rng"] and device_type == "cuda":
                torch.cuda.set_rng_state(self.ckpt["rng"]["cuda"].cpu())
        else:
            torch.manual_seed(seed + rank + world * self.ckpt["iter_num"])

    def write(self, record, text):
        """Print text and log record (rank 0)."""
        if self.master:
            self.log.write(record, text)

    def save(self, model, optimizer, state, losses):
        """Save state, the model and AdamW unless the model blew up; commit the log."""
        check_saveable(model, optimizer, losses, state["iter_num"], self.last_good)
        rng = {"torch": torch.get_rng_state()}
        if self.device_type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        state = {**state, "rng": rng, "saved_at": time.time(), "launch": distributed.launch_id()}
        state["train_config"] = {**state["train_config"], **self.as_given}
        self.spread.save(self.out_dir, model, optimizer, self.master, state)
        self.saved_iter = it = state["iter_num"]
        if self.master and self.keep_every and it and it % self.keep_every == 0:
            checkpoint.keep(self.out_dir, it, self.spread.checkpoint == POINTER)
        if self.master:
            self.log.commit()

    def last_good(self):
        """The checkpoint a run that blew up leaves (or none), in words."""
        if self.saved_iter is None:
            return "this run saved no checkpoint (start again with a lower --lr)"
        path = os.path.join(self.out_dir, self.spread.checkpoint)
        return (f"{path} (iter {self.saved_iter}) is the last good checkpoint (resume with "
                f"--init_from=resume and a lower --lr)")

    def stopped(self, iter_num, world):
        """The last line of a run stopped by a signal: the command that continues it (rank 0)."""
        if self.master:
            again = shlex.quote("--out_dir=" + self.out_dir) + self.spread.flag
            print(f"stopped at iter {iter_num}; checkpoint saved. Continue with "
                  f"{distributed.launch(world)} train.py --init_from=resume {again}")


# -----------------------------------------------------------------------------
# A resume: the checkpoint it continues from, and every check it must pass

def load(out_dir, sharded):
    """The latest checkpoint in OUT_DIR as a resume's dict (its entries, "model", "path")."""
    if not out_dir.strip():  # "" would read the working folder's files
        raise UsageError("--out_dir is empty; give the run's folder: "
                         "--init_from=resume --out_dir=OUT_DIR")
    taken, full, meta = checkpoint.latest(out_dir)
    if taken is None:
        raise UsageError(f"--init_from=resume but there is no checkpoint in {out_dir}; "
                         f"start with --init_from=scratch or point --out_dir at a run")
    pointed = checkpoint.saved(meta) if meta else None
    if pointed and full and full[0] == pointed[0] and full[1] != pointed[1]:
        print(f"note: {out_dir} holds two checkpoints of iter {full[0]}, {CKPT} and {POINTER}; "
              f"resuming from {taken}, saved later by the clock", flush=True)
    if taken == CKPT:
        model, ckpt = checkpoint.load(out_dir)
        return {**ckpt, "model": model, "path": os.path.join(out_dir, CKPT)}
    if not sharded:
        return checkpoint.load_whole(out_dir, meta)
    return {**meta, "rng": checkpoint.rng_from_json(meta["rng"]),
            "model": RecursiveGPT(checkpoint.config_of(meta, os.path.join(out_dir, POINTER))),
            "path": os.path.join(out_dir, POINTER)}


def check_resumable(ckpt, tc, given):
    """Every reason the run in ckpt cannot continue as asked."""
    path, problem = ckpt["path"], None
    kinds = {"iter_num": int, "best_val_loss": float, "rng": dict,
             **({} if "folder" in ckpt else {"optimizer": dict})}
    missing = [k for k, kind in kinds.items() if not isinstance(ckpt.get(k), kind)]
    if missing:
        problem = f"no valid {', '.join(missing)}"
    elif not torch.is_tensor(ckpt["rng"].get("torch")) or ckpt["rng"]["torch"].dtype != torch.uint8:
        problem = "no torch RNG state"
    elif "folder" not in ckpt:  # wrong optimizer shapes would crash inside fused AdamW
        problem = optimizer_mismatch(ckpt["optimizer"],
                                     ckpt["model"].configure_optimizer(0.0, 1e-3))
    if problem:
        raise CheckpointError(f"{path} cannot be resumed: {problem}; it is damaged or was not "
                              f"written by train.py (sample.py can still use its weights)")
    saved = {"model": ckpt["train_config"].get("model"), **ckpt["model"].config.to_dict()}
    conflicts = [f"{k}: checkpoint {saved[k]!r} vs given {given[k]!r}" for k in saved
                 if k in given and given[k] != saved[k]]
    if conflicts:
        raise UsageError("the checkpoint's model differs from the flags given: "
                         + "; ".join(conflicts))
    old, it = ckpt["train_config"], ckpt["iter_num"]
    was, now = old.get("batch_size", 0) * old.get("grad_accum", 0), tc.batch_size * tc.grad_accum
    if tc.data_order == "sequential" and old.get("data_order") == "sequential" and was != now:
        raise UsageError(f"--data_order=sequential: this run has read windows 0-{it * was - 1} "
                         f"({it} steps of {was}); with {now} windows a step it would go on at "
                         f"window {it * now}, not {it * was}; resume with the run's own "
                         f"--batch_size={old['batch_size']} --grad_accum={old['grad_accum']} "
                         f"(or as many windows a step in all)")


def finished(ckpt, tc):
    """Whether the run in ckpt is at --max_iters already, which it then says."""
    if ckpt["iter_num"] < tc.max_iters:
        return False
    print(f"{ckpt['path']} is at iter {ckpt['iter_num']}, already --max_iters={tc.max_iters}: "
          f"nothing to do (raise --max_iters to train further: the cosine stretches to it, "
          f"unless the run was given --lr_decay_iters, past which the learning rate stays at "
          f"min_lr)")
    return True


def optimizer_mismatch(saved, optimizer):
    """What in a saved optimizer state_dict does not fit `optimizer`'s parameters, or None."""
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        return "the optimizer state has no param_groups or state"
    ours = optimizer.param_groups
    if len(groups) != len(ours) or any(len(g.get("params", ())) != len(o["params"])
                                       for g, o in zip(groups, ours)):
        return "the optimizer's parameter groups differ from the model's"
    params = {i: p for g, o in zip(groups, ours) for i, p in zip(g["params"], o["params"])}
    for i, entry in state.items():
        if i not in params or not isinstance(entry, dict):
            return f"optimizer state for an unknown parameter {i!r}"
        for k, v in entry.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.shape != params[i].shape:
                return (f"the optimizer's {k} of parameter {i} has shape {tuple(v.shape)}, "
                        f"the parameter {tuple(params[i].shape)}")
    return None


# -----------------------------------------------------------------------------
# OUT_DIR's checkpoints: a fresh run is refused over an old one, which --overwrite replaces

def run_files(out_dir):
    """The files that make OUT_DIR a run: ckpt.pt, ckpt-sharded.json, shards-<iter>/, kept ones."""
    return [os.path.join(out_dir, n) for n in checkpoint.listing(out_dir)
            if n in (CKPT, POINTER) or SHARDS.match(n) or KEPT.match(n)]


def check_fresh(out_dir, overwrite):
    """A scratch run into out_dir: refused where a run is (unless --overwrite), a live one first."""
    if os.path.isdir(out_dir):
        files.own(out_dir)
        check_log(out_dir)
    found = [p for p in run_files(out_dir) if not SHARDS.match(os.path.basename(p))]
    if found and not overwrite:
        raise UsageError(f"{' and '.join(found)} exist{'s' if len(found) == 1 else ''}; "
                         f"continue it with --init_from=resume, or start over with "
                         f"--overwrite=true, or choose another --out_dir")


def replace_old_run(out_dir, keep):
    """After a fresh run's first checkpoint (keep: its format's file) the old run's files go."""
    named = checkpoint.read_pointer(out_dir)["folder"] if keep == POINTER else None
    for path in run_files(out_dir):
        name = os.path.basename(path)
        if name == (POINTER if keep == CKPT else CKPT) or SHARDS.match(name) and name != named \
                or KEPT.match(name):
            files.remove(path)


def remove_unfinished_shards(out_dir):
    """Remove the shards folders ckpt-sharded.json does not name."""
    meta = checkpoint.read_pointer(out_dir)
    for name in os.listdir(out_dir):
        if SHARDS.match(name) and (meta is None or name != meta["folder"]):
            files.remove(os.path.join(out_dir, name))


# -----------------------------------------------------------------------------
# A model that blew up is never saved

def _local(v):
    """This rank's shard of a tensor under FSDP (a DTensor), else the tensor itself."""
    return v.to_local() if hasattr(v, "to_local") else v


def unsaveable(model, optimizer, losses):
    """Why this model must not be saved (a loss or tensor not finite, a loss blown up), or None."""
    limit = DIVERGED * math.log(model.config.vocab_size)
    for split, loss in losses.items():
        if not math.isfinite(loss):
            return f"{split} loss is {loss}"
        if loss > limit:
            return f"{split} loss is {loss:.4g} (above {limit:.4g}, {DIVERGED} x ln(vocab_size))"
    tensors = {f"weight {k}": _local(v) for k, v in model.state_dict().items()
               if v.is_floating_point()}
    names = {p: name for name, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        owner = names.get(p, "a parameter")
        for k, v in state.items():
            if torch.is_tensor(v) and v.is_floating_point():
                tensors[f"optimizer {k} of {owner}"] = _local(v)
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).tolist()
    return next((f"{name} is not finite" for name, ok in zip(tensors, finite) if not ok), None)


def check_saveable(model, optimizer, losses, iter_num, last_good):
    """FloatingPointError, naming the last good checkpoint, unless every rank may save its part."""
    reason = unsaveable(model, optimizer, losses)
    if dist.is_initialized():
        flag = torch.tensor(float(reason is not None), device=model.lm_head.weight.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not reason and flag.item():
            reason = "a weight or optimizer state on another rank is not finite"
    if reason:
        raise FloatingPointError(f"{reason} at iter {iter_num}; stopped without saving, "
                                 f"so {last_good()}")
