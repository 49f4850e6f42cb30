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

import json
import os
import re
import shlex
import shutil
import zipfile

import torch

import runfiles
from configurator import UsageError
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
    if not os.path.isfile(path) and os.path.isfile(os.path.join(out_dir, POINTER)):
        raise CheckpointError(f"{out_dir} holds a sharded checkpoint ({POINTER}) but no {CKPT}; write one from it "
                              f"with: python fsdp.py {shlex.quote(out_dir)}")
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
