"""
Continuing a run (train.py --init_from=resume, through run.py's Run): the checkpoint it continues
from, every check it must pass first, and the random state it had.

    # the run's latest checkpoint (checkpoint.latest)
    ckpt = resume.load("out", sharded=False)
    # its saved settings, read as flags are, then the flags
    tc = resume.settings(ckpt, TrainConfig, given)
    # any reason it cannot continue: one line, nothing touched
    resume.check(ckpt, tc, given)

A resume continues bit for bit: the same data (a step's batches depend on the step alone), the same
random state, the same AdamW moments. Either format resumes in either mode: a sharded checkpoint
loads whole into one process or DDP, ckpt.pt is cut into shards under FSDP.
"""

import dataclasses
import os

import torch

from support import checkpoint
from support.checkpoint import CheckpointError
from configurator import UsageError, value_of
from mesh import Config, RecursiveGPT


def load(out_dir, sharded):
    """The run in OUT_DIR as the dict a resume continues from: the checkpoint's entries, "model"
    its model and "path" its file. Of ckpt.pt and a sharded checkpoint, the run's latest
    (checkpoint.latest: the one further in training; at the same iteration the one saved later by
    the clock, said in a note, or the sharded one when they were saved together, a consolidated
    ckpt.pt being its copy). sharded (an FSDP launch): a sharded checkpoint gives its plain data
    and a model of its config, whose shards fsdp.Sharded.load reads, each rank its own; otherwise
    it is read whole here."""
    if not out_dir.strip():  # "" would read the working folder's files
        raise UsageError("--out_dir is empty; give the run's folder: "
                         "--init_from=resume --out_dir=OUT_DIR")
    taken, full, meta = checkpoint.latest(out_dir)
    if taken is None:
        raise UsageError(f"--init_from=resume but there is no checkpoint in {out_dir}; "
                         f"start with --init_from=scratch or point --out_dir at a run")
    pointed = checkpoint.saved(meta) if meta else None  # the sharded checkpoint's
    if pointed and full and full[0] == pointed[0] and full[1] != pointed[1]:
        print(f"note: {out_dir} holds two checkpoints of iter {full[0]}, {checkpoint.CKPT} and "
              f"{checkpoint.POINTER}; resuming from {taken}, saved later by the clock", flush=True)
    if taken == checkpoint.CKPT:
        model, ckpt = checkpoint.load(out_dir)
        return {**ckpt, "model": model, "path": os.path.join(out_dir, checkpoint.CKPT)}
    # the sharded format, loaded only for a sharded checkpoint
    from support import sharded as shards
    if not sharded:
        return shards.load_whole(out_dir, meta)
    return {**meta, "rng": shards.rng_from_json(meta["rng"]),
            "model": RecursiveGPT(Config.from_dict(meta["model_config"])),
            "path": os.path.join(out_dir, checkpoint.POINTER)}


# a resume writes where it read; how it spreads the model is the launch's
NOT_KEPT = ("out_dir", "fsdp")


def settings(ckpt, cls, given):
    """The settings (a cls, train.py's TrainConfig) a resume of ckpt continues with: the
    checkpoint's saved ones, each read as a config file's value is (configurator.value_of: "4" or
    2.5 is no integer), then the flags given over them. Not kept: out_dir, for a resume writes
    where it read (a run copied elsewhere keeps another folder's name), and fsdp, the launch's own.
    A saved value that is wrong, or out of range, is named as the checkpoint's, with the flag that
    replaces it."""
    fields, path = {f.name: f for f in dataclasses.fields(cls)}, ckpt["path"]
    saved = {}
    for key, value in ckpt["train_config"].items():
        if key in fields and key not in NOT_KEPT and key not in given:
            try:
                saved[key] = value_of(fields[key], value, f"{path}'s saved train_config")
            except UsageError as e:
                raise CheckpointError(f"{e}; it is damaged or was edited: give --{key}=VALUE to "
                                      f"replace it") from None
    try:
        return cls(**{**saved, **given})
    except UsageError as e:
        named = [key for key in saved if f"--{key}=" in str(e)]
        if not named:
            raise
        flags = " ".join(f"--{key}=VALUE" for key in named)
        raise UsageError(f"{e} ({', '.join(named)}: the checkpoint's saved value, in {path}; "
                         f"give {flags} to replace it)") from None


def check(ckpt, tc, given):
    """Every reason the run in ckpt (load's dict) cannot continue as train.py was asked: something
    it needs is missing or damaged, a model setting given contradicts it, or its AdamW state does
    not fit its model (its dataset, changed since, is data/dataset.py's to refuse). Raises
    CheckpointError or UsageError."""
    path, problem = ckpt["path"], None
    kinds = {"iter_num": int, "best_val_loss": float, "rng": dict,
             **({} if "folder" in ckpt else {"optimizer": dict})}
    missing = [k for k, kind in kinds.items() if not isinstance(ckpt.get(k), kind)]
    if missing:
        problem = f"no valid {', '.join(missing)}"
    elif not torch.is_tensor(ckpt["rng"].get("torch")) or ckpt["rng"]["torch"].dtype != torch.uint8:
        problem = "no torch RNG state"
    # a whole checkpoint: wrong optimizer shapes would crash inside fused AdamW
    elif "folder" not in ckpt:
        problem = _optimizer_mismatch(ckpt["optimizer"],
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
    # windows it x G on
    if tc.data_order == "sequential" and old.get("data_order") == "sequential" and was != now:
        raise UsageError(f"--data_order=sequential: this run has read windows 0-{it * was - 1} "
                         f"({it} steps of {was}); with {now} windows a step it would go on at "
                         f"window {it * now}, not {it * was}; resume with the run's own "
                         f"--batch_size={old['batch_size']} --grad_accum={old['grad_accum']} "
                         f"(or as many windows a step in all)")


def finished(ckpt, tc):
    """Whether the run in ckpt is already at --max_iters, which it then says: it is left as it
    is."""
    if ckpt["iter_num"] < tc.max_iters:
        return False
    print(f"{ckpt['path']} is at iter {ckpt['iter_num']}, already --max_iters={tc.max_iters}: "
          f"nothing to do (raise --max_iters to train further: the cosine stretches to it, "
          f"unless the run was given --lr_decay_iters, past which the learning rate stays at "
          f"min_lr)")
    return True


def _optimizer_mismatch(saved, optimizer):
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


def restore_rng(ckpt, seed, rank, world, device_type):
    """The random state the run had when it saved: rank 0's saved state; every other rank its own
    seed for this step (so that their dropout masks differ)."""
    if rank == 0:
        torch.set_rng_state(ckpt["rng"]["torch"].cpu())
        if "cuda" in ckpt["rng"] and device_type == "cuda":
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"].cpu())
    else:
        torch.manual_seed(seed + rank + world * ckpt["iter_num"])
