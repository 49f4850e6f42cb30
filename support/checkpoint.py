"""
Checkpoints: the one writer and loader that train.py, sample.py, probe.py, table1.py and
lm_eval_mesh.py share, a sharded checkpoint's pointer, and which of a run's checkpoints is its
latest.

    # OUT_DIR/ckpt.pt: the model, and the plain data saved with it
    model, ckpt = checkpoint.load("out")
    # OUT_DIR/ckpt-sharded.json, every field checked; or None
    meta = checkpoint.read_pointer("out")

A run's checkpoint is OUT_DIR/ckpt.pt, a torch.save'd dict of tensors and plain data (model_config,
train_config, iter_num, best_val_loss, rng, the data it trained on), or a sharded one (sharded.py):
a folder OUT_DIR/shards-<iter>/ that OUT_DIR/ckpt-sharded.json names. Both are written atomically.
ckpt.pt loads with weights_only=True (loading never runs code), its zip CRC-32s verified, its plain
data checked and its weights finite, so a damaged file is refused, not used. Which of the two is
the run's latest is latest()'s, for every reader; what else a resume checks is resume.py's, the
run's folder outdir.py's, and the dataset a checkpoint trained on data/dataset.py's.
"""

import os
import re
import shlex
import zipfile

import torch

from configurator import UsageError
from support import plain, runfiles
from mesh import Config, RecursiveGPT

# a whole checkpoint; the pointer of a sharded one (sharded.py)
CKPT, POINTER = "ckpt.pt", "ckpt-sharded.json"
# the folders of sharded checkpoints (sharded.shards_folder)
SHARDS = re.compile(r"^shards-\d{8}(-1)?$")


class CheckpointError(UsageError):
    """A checkpoint that is missing, damaged or cannot be used as asked: one line, exit 2."""


def save(obj, path):
    """torch.save(obj) to path, atomically (runfiles.atomic_write): a crash leaves the old file or
    the new."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        runfiles.atomic_write(path, lambda f: torch.save(obj, f))
    except OSError as e:
        raise CheckpointError(f"could not write {path}: {e.strerror}; the previous checkpoint "
                              f"there, if any, is unchanged") from None


def rng_state(device_type):
    """The random state a checkpoint keeps, so that a resume draws what the run would have drawn."""
    state = {"torch": torch.get_rng_state()}
    if device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def load(out_dir, device="cpu"):
    """Load OUT_DIR/ckpt.pt (weights_only: loading never runs code) -> (model, checkpoint dict)."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.isfile(path) and os.path.isfile(os.path.join(out_dir, POINTER)):
        raise CheckpointError(f"{out_dir} holds a sharded checkpoint ({POINTER}) but no {CKPT}; "
                              f"write one from it with: python tools/consolidate.py "
                              f"{shlex.quote('--out_dir=' + out_dir)}")
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
        check_plain(ckpt)
        model = RecursiveGPT(Config.from_dict(ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        bad = next((k for k, v in ckpt["model"].items()
                    if v.is_floating_point() and not v.isfinite().all()), None)
        # train.py never saves one; an older or foreign file may hold one, and sampling would crash
        if bad:
            raise ValueError(f"weight {bad} is not finite")
    except Exception as e:  # truncated zip, foreign file, missing keys, ...
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                              f"delete it or point --out_dir at another run") from None
    return model.to(device), ckpt


PLAIN = (str, int, float, bool, type(None))  # a setting's value, as JSON holds it


def check_plain(ckpt):
    """The plain data of a checkpoint (a ckpt.pt dict or a pointer), before anything uses it: its
    configs are objects, train_config names its dataset, and every field that is there has its type
    (TypeError or ValueError, in words). resume.check asks more of a checkpoint it continues."""
    for key in ("model_config", "train_config"):
        if not isinstance(ckpt[key], dict):
            raise TypeError(f"{key} is a {type(ckpt[key]).__name__}, not a dict")
    tc, data = ckpt["train_config"], ckpt.get("data", {})
    if not isinstance(tc.get("dataset"), str) or not isinstance(tc.get("data_root", ""), str):
        raise TypeError(f"train_config's dataset is {tc.get('dataset')!r:.40}, not a name")
    if not isinstance(data, dict):
        raise TypeError(f"data (the dataset record) is a {type(data).__name__}, not a dict")
    bad = next((k for d in (tc, data) for k, v in d.items() if not isinstance(v, PLAIN)), None)
    if bad:
        raise TypeError(f"{bad} is not a plain value")
    if "iter_num" in ckpt and (type(ckpt["iter_num"]) is not int or ckpt["iter_num"] < 0):
        raise ValueError(f"iter_num is {ckpt['iter_num']!r:.40}, not a count of steps")
    if "saved_at" in ckpt and not isinstance(ckpt["saved_at"], float):
        raise TypeError("saved_at is not a time")


# and, written since they were added: "data", "saved_at" and "checksums"
POINTER_FIELDS = {"model_config": dict, "train_config": dict, "iter_num": int,
                  "best_val_loss": float, "rng": dict, "folder": str}


def read_pointer(out_dir):
    """The parsed OUT_DIR/ckpt-sharded.json of a sharded checkpoint, or None when there is none.
    Everything in it is checked before it is used: every field and its type, and that the folder it
    names is a shards-<iter> folder inside OUT_DIR (never a path elsewhere, which a resume would
    read and a save would delete)."""
    path = os.path.join(out_dir, POINTER)
    if not os.path.lexists(path):
        return None
    try:
        meta = plain.read_json(path)
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
        for key, kind in POINTER_FIELDS.items():
            if not isinstance(meta.get(key), kind) or isinstance(meta[key], bool):
                raise TypeError(f"{key} is {meta.get(key)!r:.40}, not a {kind.__name__}")
        if not SHARDS.match(meta["folder"]) or int(meta["folder"][7:15]) != meta["iter_num"]:
            raise ValueError(f"folder {meta['folder']!r:.60} is not "
                             f"the shards-<iter> folder of iter_num")
        if not all(isinstance(v, list) and all(isinstance(b, int) and 0 <= b < 256 for b in v)
                   for v in meta["rng"].values()) or "torch" not in meta["rng"]:
            raise ValueError("rng is not a list of bytes for torch (and cuda)")
        for key, kind in (("data", dict), ("saved_at", float), ("checksums", dict)):
            if key in meta and not isinstance(meta[key], kind):
                raise TypeError(f"{key} is not a {kind.__name__}")
        check_plain(meta)
        Config.from_dict(meta["model_config"])
        return meta
    except (ValueError, TypeError) as e:  # (json's errors are ValueErrors)
        raise CheckpointError(f"{path} is corrupt ({type(e).__name__}: {e}); move it away (and its "
                              f"shards folder) or point --out_dir at another run") from None


def launches(out_dir):
    """The torchrun launches (machine.launch_id) that saved OUT_DIR's checkpoints, ckpt.pt and the
    sharded one; an unreadable one is left out (a resume says what is wrong with it)."""
    found, path = [], os.path.join(out_dir, CKPT)
    try:
        if os.path.isfile(path):
            found.append(torch.load(path, mmap=True, weights_only=True,
                                    map_location="cpu").get("launch"))
    except Exception:  # a damaged file: not this launch's to continue
        pass
    try:
        found.append((read_pointer(out_dir) or {}).get("launch"))
    except CheckpointError:
        pass
    return {launch for launch in found if isinstance(launch, str)}


def saved(ckpt):
    """How far a checkpoint (a ckpt.pt dict or a sharded one's pointer) had trained, as a key to
    compare: (iter_num, saved_at). Training progress decides; the clock, which may have been set
    back or copied from another machine, only breaks a tie (checkpoints that do not record it count
    as saved at time 0)."""
    return int(ckpt["iter_num"]), float(ckpt.get("saved_at", 0.0))


def saved_full(out_dir):
    """saved() of OUT_DIR/ckpt.pt, read without its tensors (memory-mapped); None without one, and
    the earliest possible for a corrupt one (load() will say so, unless the sharded checkpoint is
    taken)."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.isfile(path):
        return None
    try:
        return saved(torch.load(path, mmap=True, weights_only=True, map_location="cpu"))
    except Exception:
        return -1, -1.0


def latest(out_dir):
    """Which of OUT_DIR's checkpoints, ckpt.pt and a sharded one, is the run's latest: the one rule
    that a resume, sample.py, tools/probe.py and tools/consolidate.py share. The one further in
    training (saved()); at the same iteration the one saved later by the clock, or the sharded one
    when they were saved together (a consolidated ckpt.pt is its copy). -> (CKPT, POINTER or None
    when there is neither, ckpt.pt's saved() or None, the sharded checkpoint's pointer or None)."""
    meta, full = read_pointer(out_dir), saved_full(out_dir)
    if meta is None:
        return (CKPT if full else None), full, None
    if full is not None and full > saved(meta):
        return CKPT, full, meta
    return POINTER, full, meta
