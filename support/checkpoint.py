"""
Checkpoints: the one writer and reader of a run's checkpoints, and which of them is its latest,
for train.py, sample.py and every tool.

    model, ckpt = checkpoint.load("out")          # OUT_DIR/ckpt.pt: the model, its plain data

OUT_DIR/ckpt.pt is a torch.save'd dict of tensors and plain data (configs, iter_num, the data it
trained on), read with weights_only=True, its zip CRC-32s verified. A reader maps the file
(mmap) and builds the model on the meta device, taking the file's tensors as its own
(assign=True): it holds the weights once, and AdamW's state is never read but by a resume. A
sharded checkpoint (--fsdp=true) is a folder shards-<iter>/ (support/sharded.py). --keep_every
keeps copies, ckpt_<iter>.pt or ckpt_<iter>/ (a run folder holding one sharded checkpoint).
"""

import dataclasses
import os
import re
import shlex
import shutil
import sys
import zipfile

import torch

from configurator import UsageError
from support import files
from mesh import Config, ConfigError, Rotary, RecursiveGPT

CKPT, STATE = "ckpt.pt", "state.json"  # a whole checkpoint; a sharded one's plain data
POINTER = "ckpt-sharded.json"  # earlier code's: it named the sharded checkpoint, held its data
SHARDS = re.compile(r"^shards-\d{8}(-1)?$")  # the folders of a run's sharded checkpoints
KEPT = re.compile(r"^ckpt_(\d+)(\.pt)?$")  # --keep_every's: ckpt_<iter>.pt or sharded ckpt_<iter>/
PLAIN = (str, int, float, bool, type(None))  # a setting's value, as JSON holds it
_noted = set()  # (checkpoint, config) whose missing fields were noted: once each


class CheckpointError(UsageError):
    """A checkpoint that is missing, damaged or cannot be used as asked: one line, exit 2."""


def save(obj, path):
    """torch.save(obj) to path, atomically: a crash leaves the old file or the new."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        files.atomic_write(path, lambda f: torch.save(obj, f))
    except OSError as e:
        raise CheckpointError(f"could not write {path}: {e.strerror}; the previous checkpoint "
                              f"there, if any, is unchanged") from None


def read(path, mmap=True):
    """The checkpoint file path as its dict, on the CPU (weights_only: reading never runs code);
    mmap: its tensors read from the file only where used. Only bytes failing checks are corrupt."""
    try:
        # torch.load does not check the zip's CRC-32s: a flipped bit in a tensor loads silently
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        if damaged:
            raise ValueError(f"{damaged} fails its CRC-32 check")
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated zip, flipped bits, a foreign file
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint ({cause(e)}); "
                              f"point --out_dir at another run") from None
    try:
        check_plain(ckpt)
        # train.py never saves one; an older or foreign file may hold one, and sampling would crash
        bad = next((k for k, v in ckpt["model"].items()
                    if v.is_floating_point() and not v.isfinite().all()), None)
        if bad:
            raise ValueError(f"weight {bad} is not finite")
    except Exception as e:
        raise CheckpointError(f"{path} parsed, but is not a nanoMeSH checkpoint ({cause(e)}); "
                              f"point --out_dir at another run") from None
    return ckpt


def build(ckpt, path):
    """The model of a checkpoint dict, built on the meta device (nothing allocated) and given
    the dict's tensors as its own: its weights are held once."""
    with torch.device("meta"):
        model = RecursiveGPT(config_of(ckpt, path))
    try:
        model.load_state_dict(ckpt["model"], assign=True)
    except RuntimeError as e:  # torch's lines: the weights missing, unexpected, of other shapes
        raise intact(path, " ".join(str(e).split())[:300]) from None
    model.rotary = Rotary(model.config)  # not saved: made from the config
    return model


def load(out_dir, device="cpu", name=CKPT):
    """OUT_DIR/name (ckpt.pt, or a kept ckpt_ITER.pt) -> (model, checkpoint dict)."""
    path = os.path.join(out_dir, name)
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one with: "
                              f"python train.py {shlex.quote('--out_dir=' + out_dir)}")
    ckpt = read(path, os.name != "nt")  # Windows replaces no mapped file
    return build(ckpt, path).to(device), ckpt  # out of memory: not a corrupt file


def intact(path, why):
    """Bytes that are whole, of a model this code cannot build: other code wrote it."""
    return CheckpointError(f"{path} is intact, but this code cannot build its model ({why}); read "
                           f"it with the code that wrote it")


def defaults(path, ckpt, key, cls):
    """Note once (rank 0) the fields of dataclass cls that ckpt[key] lacks: they take defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    missing = [k for k in fields if k not in ckpt[key]]
    if missing and (path, key) not in _noted and os.environ.get("RANK", "0") == "0":
        _noted.add((path, key))
        print(f"note: {path} was saved without {key}'s {', '.join(missing)}; this code's "
              f"defaults: {', '.join(f'{k}={fields[k]!r}' for k in missing)}", file=sys.stderr)


def config_of(ckpt, path):
    """A checkpoint's model Config, missing fields defaulted; unknown fields or schemes refused."""
    defaults(path, ckpt, "model_config", Config)
    try:
        return Config.from_dict(ckpt["model_config"])
    except (ConfigError, TypeError) as e:  # TypeError: a field of another type
        raise intact(path, e) from None


def check_plain(ckpt):
    """The plain data of a checkpoint (ckpt.pt's dict or a sharded one's state) checked before
    any use: every field there has its type (TypeError or ValueError, in words)."""
    for key in ("model_config", "train_config"):
        if not isinstance(ckpt.get(key), dict):
            raise TypeError(f"{key} is {ckpt.get(key)!r:.40}, not a dict")
    tc, data = ckpt["train_config"], ckpt.get("data", {})
    for key, absent in (("dataset", None), ("data_root", "")):  # a run's data_root: optional
        if not isinstance(tc.get(key, absent), str):
            raise TypeError(f"train_config's {key} is {tc.get(key)!r:.40}, not a name")
    if not isinstance(data, dict):
        raise TypeError(f"data (the dataset record) is a {type(data).__name__}, not a dict")
    bad = next((k for d in (tc, data) for k, v in d.items() if not isinstance(v, PLAIN)), None)
    if bad:
        raise TypeError(f"{bad} is not a plain value")
    if type(ckpt.get("iter_num")) is not int or ckpt["iter_num"] < 0:
        raise ValueError(f"iter_num is {ckpt.get('iter_num')!r:.40}, not a count of steps")
    if "saved_at" in ckpt and not isinstance(ckpt["saved_at"], float):
        raise TypeError("saved_at is not a time")


def cause(e):
    """'Type: first line' of an error; of DCP's CheckpointException, its first rank's failure."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (error, trace)}
    if isinstance(failures, dict) and failures:
        rank, (e, _) = min(failures.items(), key=lambda kv: kv[0])
        return f"rank {rank}: {cause(e)}"
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


# -----------------------------------------------------------------------------
# A run's checkpoints, and its latest

def listing(folder):  # its names, sorted; none where there is no folder
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def sharded_state(out_dir, name):
    """The plain data of the sharded checkpoint OUT_DIR/name, checked before use: its state.json
    (or earlier code's pointer that names it), with "folder" its path; None while DCP's .metadata
    is missing (a save not finished)."""
    folder = os.path.join(out_dir, name)
    path = os.path.join(folder, STATE)
    if not os.path.isfile(os.path.join(folder, ".metadata")):
        return None
    pointer = os.path.join(out_dir, POINTER)
    if not os.path.lexists(path) and os.path.lexists(pointer):
        path = pointer
    try:
        state = files.read_json(path)
        if not isinstance(state, dict):
            raise TypeError("not a JSON object")
        check_plain(state)
        if not isinstance(best := state.get("best_val_loss"), float):
            raise TypeError(f"best_val_loss is {best!r:.40}, not a float")
        tc = state["train_config"]  # read_whole's AdamW settings
        for key, top in ("weight_decay", float("inf")), ("beta1", 1), ("beta2", 1):
            if not (type(tc.get(key)) in (int, float) and 0 <= tc[key] < top):
                raise ValueError(f"train_config's {key} is {tc.get(key)!r:.40}, not AdamW's")
    except (OSError, ValueError, TypeError) as e:  # (json's errors are ValueErrors)
        raise CheckpointError(f"{path} is corrupt ({cause(e)}); move {folder} away or point "
                              f"--out_dir at another run") from None
    if path.endswith(POINTER) and state.get("folder") != name:
        return None  # earlier code's pointer names another folder: this one was not finished
    config_of(state, path)
    return {**state, "folder": folder, "path": path}


def peek(path):
    """A whole checkpoint's plain data, memory-mapped (no tensor read); {} where unreadable."""
    try:
        return torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception:
        return {}


def found(out_dir):
    """OUT_DIR's checkpoints as (iter_num, saved_at, name, plain data): ckpt.pt, each whole
    shards-<iter>/, each kept ckpt_<iter>.pt or ckpt_<iter>/ (their saved_at -1: a kept copy
    is the latest only where nothing has trained further)."""
    out = []
    for name in listing(out_dir):
        if name == CKPT:
            state = peek(os.path.join(out_dir, name))
        elif SHARDS.match(name):
            state = sharded_state(out_dir, name)
        elif KEPT.match(name):
            state = {"iter_num": int(KEPT.match(name)[1]), "saved_at": -1.0}
        else:
            continue
        if state is not None:
            try:
                out.append((int(state["iter_num"]), float(state.get("saved_at", 0.0)), name,
                            state))
            except Exception:  # a foreign ckpt.pt: taken last, and called corrupt if read
                out.append((-1, -1.0, name, {}))
    return out


def latest(out_dir, sharded=False, iter_num=None):
    """The run's latest checkpoint (of iter_num, if given), the rule a resume and every reader
    share: the furthest trained, then the last saved; at a tie the whole one (sharded: the
    sharded one). -> (iter_num, saved_at, name, plain data), or None."""
    def key(entry):
        return entry[:2] + ((SHARDS.match(entry[2]) is not None) == sharded,)
    return max((e for e in found(out_dir) if iter_num in (None, e[0])), key=key, default=None)


def keep(out_dir, iter_num, sharded):
    """Keep the checkpoint just saved, which no later save removes: OUT_DIR/ckpt_ITER.pt, or a
    sharded one as the run folder ckpt_ITER/ holding its shards folder; hard links, else copies."""
    kept = os.path.join(out_dir, f"ckpt_{iter_num}{'' if sharded else '.pt'}")
    tmp = files.temporary_name(kept, folder=sharded)
    try:
        if sharded:
            name = next(n for n in listing(out_dir) if SHARDS.match(n))  # just saved: the only one
            shutil.copytree(os.path.join(out_dir, name), os.path.join(tmp, name),
                            copy_function=link)
        else:
            os.remove(tmp)  # (made empty) its name, for the link
            link(os.path.join(out_dir, CKPT), tmp)
        files.remove(kept)  # one kept at this iteration before (a run saved again there)
        os.replace(tmp, kept)
    except OSError as e:
        files.remove(tmp)
        raise CheckpointError(f"could not keep {kept}: {files.why_write_failed(e, out_dir)}; "
                              f"the latest checkpoint is saved") from None


def link(source, copy):
    try:  # a hard link writes nothing twice
        os.link(source, copy)
    except OSError:  # a filesystem without them
        shutil.copyfile(source, copy)
