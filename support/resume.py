"""
A resume: the checkpoint a run continues from, and every check it must pass before anything is
trained or written, and its state restored. resolve() (support/run.py) and train.py import this
only when a run resumes.

    ckpt = resume_from(out_dir, tc.fsdp)  # OUT_DIR's latest checkpoint, its model built
    saved = saved_settings(TrainConfig, ckpt, keep)  # its settings, those keep(key) allows
    check_resumable(ckpt, tc, given)      # damaged, another model, a sequential order changed
    finished(ckpt, tc)                    # at --max_iters already: nothing to do, said so
    restore(run, model, optimizer)  # AdamW's state
"""

import dataclasses
import os

import torch

from configurator import UsageError, value_of
from support import checkpoint
from support.checkpoint import KEPT, SHARDS, CheckpointError

FIXED = ("core_init", "data_order")  # set as the run began: a resume cannot change them
# a checkpoint's fields (rng: earlier code's); any other is another code's, which a resume drops
FIELDS = {"model", "optimizer", "model_config", "train_config", "iter_num", "best_val_loss", "rng",
          "data", "source", "saved_at", "launch", "folder", "path", "checksums"}


def resume_from(out_dir, sharded):
    """OUT_DIR's latest checkpoint as a resume's dict (its entries, "model", "path"; a sharded
    one's "folder"), read whole unless it is sharded and so is the run (sharded)."""
    entry = checkpoint.latest(out_dir, sharded)
    if entry is None:
        raise UsageError(f"--init_from=resume but there is no checkpoint in {out_dir}; "
                         f"start with --init_from=scratch or point --out_dir at a run")
    name, path = entry[2], os.path.join(out_dir, entry[2])
    if KEPT.match(name):  # ckpt.pt is gone: the latest is a kept one
        if os.environ.get("RANK", "0") == "0":
            print(f"note: resuming from {path} (iter {entry[0]}), the run's latest "
                  f"checkpoint", flush=True)
        if os.path.isdir(path):  # a sharded one's run folder
            return resume_from(path, sharded)
    if not SHARDS.match(name):
        ckpt = checkpoint.read(path, mmap=False)  # (the run replaces the file it read)
        return {**ckpt, "model": checkpoint.build(ckpt, path), "path": path}
    if not sharded:
        from support.sharded import read_whole
        return read_whole(entry[3])
    return {**entry[3], "model": checkpoint.RecursiveGPT(
        checkpoint.config_of(entry[3], entry[3]["path"]))}


def saved_settings(cls, ckpt, keep):
    """The settings (fields of the dataclass cls) ckpt was saved with that keep(key) allows, each
    in its field's type; refused where ckpt holds settings or fields this code does not know."""
    path, fields = ckpt["path"], {f.name: f for f in dataclasses.fields(cls)}
    old, saved = ckpt.get("train_config", {}), {}
    unknown = sorted(set(old) - set(fields)) + sorted(set(ckpt) - FIELDS)
    if unknown:
        raise CheckpointError(f"{path} is intact, but this code does not know its "
                              f"{', '.join(unknown)}, which a resume would drop; resume it with "
                              f"the code that wrote it")
    checkpoint.defaults(path, ckpt, "train_config", cls)
    for key, value in old.items():
        if keep(key):
            try:
                saved[key] = value_of(fields[key], value, f"{path}'s saved train_config")
            except UsageError as e:
                raise CheckpointError(f"{e}; it is damaged or was edited: give --{key}=VALUE "
                                      f"to replace it") from None
    return saved


def check_resumable(ckpt, tc, given):
    """Every reason the run in ckpt cannot continue as asked."""
    path, problem = ckpt["path"], None
    kinds = {"best_val_loss": float, **({} if "folder" in ckpt else {"optimizer": dict})}
    missing = [k for k, kind in kinds.items() if not isinstance(ckpt.get(k), kind)]
    if missing:
        problem = f"no valid {', '.join(missing)}"
    elif "folder" not in ckpt:  # wrong optimizer shapes would crash inside fused AdamW
        problem = optimizer_mismatch(ckpt["optimizer"],
                                     ckpt["model"].configure_optimizer(0.0, 1e-3))
    if problem:
        raise CheckpointError(f"{path} cannot be resumed: {problem}; it is damaged or was not "
                              f"written by train.py (sample.py can still use its weights)")
    check_model(ckpt, given)
    old = ckpt["train_config"]
    bs, ga = old.get("batch_size"), old.get("grad_accum")
    it, was = ckpt["iter_num"], bs * ga if type(bs) is type(ga) is int else None
    now = tc.batch_size * tc.grad_accum
    if tc.data_order == "sequential" and old.get("data_order") == "sequential" and was != now:
        if was is None:
            raise CheckpointError(f"{path} lacks its run's batch_size or grad_accum, "
                                  f"which its sequential order needs: put them back")
        raise UsageError(f"--data_order=sequential: this run has read windows 0-{it * was - 1} "
                         f"({it} steps of {was}); with {now} windows a step it would go on at "
                         f"window {it * now}, not {it * was}; resume with the run's own "
                         f"--batch_size={old['batch_size']} --grad_accum={old['grad_accum']} "
                         f"(or as many windows a step in all)")


def check_model(ckpt, given):
    """Refused where the flags given name another model than ckpt's, or change a FIXED setting
    (a plan of a resume checks this too)."""
    old = ckpt["train_config"]
    saved = {"model": old.get("model"), **ckpt["model"].config.to_dict(),
             **{k: old[k] for k in FIXED if type(old.get(k)) is str}}  # (else damaged)
    conflicts = [f"{k}: checkpoint {saved[k]!r} vs given {given[k]!r}" for k in saved
                 if k in given and given[k] != saved[k]]
    if conflicts:
        raise UsageError("the checkpoint's model differs from the flags given: "
                         + "; ".join(conflicts) + "; resume without them")


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


def finished(ckpt, tc):
    """Whether the run in ckpt is at --max_iters already, which it then says."""
    if ckpt["iter_num"] < tc.max_iters:
        return False
    if os.environ.get("RANK", "0") == "0":
        print(f"{ckpt['path']} is at iter {ckpt['iter_num']}, already --max_iters="
              f"{tc.max_iters}: nothing to do (raise --max_iters to train further: the cosine "
              f"stretches to it, unless the run was given --lr_decay_iters, past which the "
              f"learning rate stays at min_lr)")
    return True


def restore(run, model, optimizer):
    """A resumed run's AdamW state (FSDP: weights too); train.py seeds each micro-batch."""
    ckpt = run.resumed
    ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    run.spread.load(ckpt, model, optimizer)
    for group, settings in zip(optimizer.param_groups, ours):  # the flags' weight decay, betas
        group.update(settings)
