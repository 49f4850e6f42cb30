"""
Checkpoints: a run's files in OUT_DIR, the one writer and loader that train.py, sample.py, probe.py,
table1.py and lm_eval_mesh.py share, and every check a resume makes.

    model, ckpt = checkpoint.load("out")      # OUT_DIR/ckpt.pt: the model, and the plain data saved with it

A run's checkpoint is OUT_DIR/ckpt.pt, a torch.save'd dict of tensors and plain data (model_config,
train_config, iter_num, best_val_loss, rng, the data it trained on), or a sharded one (fsdp.py): a
folder OUT_DIR/shards-<iter>/ that OUT_DIR/ckpt-sharded.json names. Both are written atomically.
ckpt.pt loads with weights_only=True (loading never runs code), its zip CRC-32s verified and its
weights checked finite, so a damaged file is refused, not used.
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import zipfile

import torch

import runfiles
from configurator import UsageError
from data.loader import checkpoint_dataset
from mesh import Config, RecursiveGPT

CKPT, POINTER = "ckpt.pt", "ckpt-sharded.json"  # a whole checkpoint; the pointer of a sharded one (fsdp.py)
SHARDS = re.compile(r"^shards-\d{8}$")          # the folders of sharded checkpoints


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged or cannot be used as asked: one line, exit 2."""


def save(obj, path):
    """torch.save(obj) to path, atomically (runfiles.atomic_write): a crash leaves the old file or the new."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        runfiles.atomic_write(path, lambda f: torch.save(obj, f))
    except OSError as e:
        raise CheckpointError(f"could not write {path}: {e.strerror}; the previous checkpoint there, if any, is "
                              f"unchanged") from None


def load(out_dir, device="cpu"):
    """Load OUT_DIR/ckpt.pt (weights_only: loading never runs code) -> (model, checkpoint dict)."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one with: "
                              f"python train.py {shlex.quote('--out_dir=' + out_dir)}")
    try:
        # torch.load does not check the zip's CRC-32s: a flipped bit in a tensor would load silently
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        if damaged:
            raise ValueError(f"{damaged} fails its CRC-32 check")
        ckpt = torch.load(path, map_location=device, weights_only=True)
        missing = {"model", "model_config", "train_config"} - set(ckpt)
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
        model = RecursiveGPT(Config.from_dict(ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        bad = next((k for k, v in ckpt["model"].items() if v.is_floating_point() and not v.isfinite().all()), None)
        if bad:  # train.py never saves one; an older or foreign file may hold one, and sampling would crash
            raise ValueError(f"weight {bad} is not finite")
    except Exception as e:  # truncated zip, foreign file, missing keys, ...
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                              f"delete it or point --out_dir at another run") from None
    return model.to(device), ckpt


def read_pointer(out_dir):
    """The parsed OUT_DIR/ckpt-sharded.json of a sharded checkpoint, or None when there is none."""
    path = os.path.join(out_dir, POINTER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        Config.from_dict(meta["model_config"])
        meta["iter_num"], meta["train_config"], meta["folder"]  # noqa: B018 (present)
        return meta
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is corrupt ({type(e).__name__}: {e}); delete it (and its shards folder) "
                              f"or point --out_dir at another run") from None


def _iter_of_full(out_dir):
    """iter_num of OUT_DIR/ckpt.pt without reading its tensors (memory-mapped), or None."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, mmap=True, weights_only=True, map_location="cpu")["iter_num"]
    except Exception:
        return -1  # corrupt: load() will say so, unless the sharded checkpoint is taken


def newest(out_dir):
    """Which checkpoint a resume takes: "sharded" or "full" (ckpt.pt), the one at the later iteration, the
    sharded one on a tie (a consolidated ckpt.pt is its copy). None there: a UsageError."""
    meta, full = read_pointer(out_dir), _iter_of_full(out_dir)
    if meta is None and full is None:
        raise UsageError(f"--init_from=resume but there is no checkpoint in {out_dir}; "
                         f"start with --init_from=scratch or point --out_dir at a run")
    return "full" if meta is None or full is not None and full > meta["iter_num"] else "sharded"


def load_full_for_resume(out_dir):
    """OUT_DIR/ckpt.pt as the dict a resume continues from: its plain data, "model" the loaded model."""
    model, ckpt = load(out_dir)
    return {**ckpt, "model": model, "path": os.path.join(out_dir, CKPT)}


def check_fresh(out_dir, overwrite):
    """A scratch run into out_dir: refused where a run is (unless --overwrite), and a live one first of all."""
    if os.path.isdir(out_dir):
        runfiles.own(out_dir)
    path = os.path.join(out_dir, CKPT)
    if os.path.exists(path) and not overwrite:
        raise UsageError(f"{path} exists; continue it with --init_from=resume, or start over "
                         f"with --overwrite=true, or choose another --out_dir")


def start_run(out_dir, fresh, overwrite):
    """The run takes OUT_DIR, everything being checked: its lock, the leftovers of killed writes removed, and
    its log (runfiles.RunLog) returned."""
    os.makedirs(out_dir, exist_ok=True)
    runfiles.own(out_dir)
    if fresh:
        check_fresh(out_dir, overwrite)  # again: another run may have finished there in the meantime
    runfiles.remove_dead_temporaries(out_dir)
    remove_unfinished_shards(out_dir)
    return runfiles.RunLog(out_dir, fresh)


def remove_unfinished_shards(out_dir):
    """Remove the shards folders that ckpt-sharded.json does not name: sharded writes that were killed, or the
    previous checkpoint's, left by a kill after the pointer moved on. Only by a run that owns OUT_DIR."""
    meta = read_pointer(out_dir)
    for name in os.listdir(out_dir):
        if SHARDS.match(name) and (meta is None or name != meta["folder"]):
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)


def check_resumable(ckpt, tc, given):
    """Every reason the run in ckpt (a load_resume dict) cannot continue as train.py was asked: something it
    needs is missing or damaged, a model setting given contradicts it, its AdamW state does not fit its model,
    or its dataset has changed since. Raises CheckpointError or UsageError; returns the dataset's folder."""
    path, problem = ckpt["path"], None
    kinds = {"iter_num": int, "best_val_loss": float, "rng": dict, **({} if "folder" in ckpt else {"optimizer": dict})}
    missing = [k for k, kind in kinds.items() if not isinstance(ckpt.get(k), kind)]
    if missing:
        problem = f"no valid {', '.join(missing)}"
    elif not torch.is_tensor(ckpt["rng"].get("torch")) or ckpt["rng"]["torch"].dtype != torch.uint8:
        problem = "no torch RNG state"
    elif "folder" not in ckpt:  # a whole checkpoint: wrong optimizer shapes would crash inside fused AdamW
        problem = _optimizer_mismatch(ckpt["optimizer"], ckpt["model"].configure_optimizer(0.0, 1e-3))
    if problem:
        raise CheckpointError(f"{path} cannot be resumed: {problem}; it is damaged or was not written by "
                              f"train.py (sample.py can still use its weights)")
    saved = {"model": ckpt["train_config"].get("model"), **ckpt["model"].config.to_dict()}
    conflicts = [f"{k}: checkpoint {saved[k]!r} vs given {given[k]!r}" for k in saved
                 if k in given and given[k] != saved[k]]
    if conflicts:
        raise UsageError("the checkpoint's model differs from the flags given: " + "; ".join(conflicts))
    return checkpoint_dataset(dataclasses.asdict(tc), ckpt.get("data"))


def _optimizer_mismatch(saved, optimizer):
    """What in a saved optimizer state_dict does not fit `optimizer`'s parameters, or None."""
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        return "the optimizer state has no param_groups or state"
    ours = optimizer.param_groups
    if len(groups) != len(ours) or any(len(g.get("params", ())) != len(o["params"]) for g, o in zip(groups, ours)):
        return "the optimizer's parameter groups differ from the model's"
    params = {i: p for g, o in zip(groups, ours) for i, p in zip(g["params"], o["params"])}
    for i, entry in state.items():
        if i not in params or not isinstance(entry, dict):
            return f"optimizer state for an unknown parameter {i!r}"
        for k, v in entry.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.shape != params[i].shape:
                return (f"the optimizer's {k} of parameter {i} has shape {tuple(v.shape)}, the parameter "
                        f"{tuple(params[i].shape)}")
    return None


def restore_rng(ckpt, seed, rank, world, device_type):
    """The random state the run had when it saved: rank 0's saved state; every other rank its own seed for
    this step (so that their dropout masks differ)."""
    if rank == 0:
        torch.set_rng_state(ckpt["rng"]["torch"].cpu())
        if "cuda" in ckpt["rng"] and device_type == "cuda":
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"].cpu())
    else:
        torch.manual_seed(seed + rank + world * ckpt["iter_num"])
