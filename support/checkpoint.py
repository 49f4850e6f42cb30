"""
Checkpoints: the one writer and reader of ckpt.pt and of the sharded format, and which of a run's
checkpoints is its latest, for train.py, sample.py and every tool.

    model, ckpt = checkpoint.load("out")                # OUT_DIR/ckpt.pt: the model, plain data
    model, ckpt = checkpoint.load_latest("out", "cpu")  # the same, unless a sharded one is newer

OUT_DIR/ckpt.pt is a torch.save'd dict of tensors and plain data (configs, iter_num, rng, the data
it trained on), loaded with weights_only=True, its zip CRC-32s verified. A sharded checkpoint
(--fsdp=true) is a folder OUT_DIR/shards-<iter>/ of DCP shards, named by OUT_DIR/ckpt-sharded.json,
written last, with the plain data and a CRC-32 of every file; its .metadata (a pickle) is read by an
unpickler that builds only DCP's classes. --keep_every keeps copies, ckpt_<iter>.pt or ckpt_<iter>/.
torch.distributed.checkpoint is imported only where used (in a DDP process it can hang gloo's exit).
"""

import dataclasses
import os
import pickle
import shlex
import shutil
import sys
import warnings
import zipfile
import zlib

import torch
import torch.distributed as dist

from configurator import UsageError
from support import files
from mesh import Config, ConfigError, RecursiveGPT

# a whole checkpoint; the pointer of a sharded one
CKPT, POINTER = "ckpt.pt", "ckpt-sharded.json"
# sharded checkpoints' folders, kept checkpoints' names (files.py: no output lands on them)
SHARDS, KEPT = files.SHARDS, files.KEPT
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


def load(out_dir, device="cpu", name=CKPT):
    """Load OUT_DIR/name, ckpt.pt or a kept ckpt_ITER.pt (weights_only: loading never runs code)
    -> (model, checkpoint dict). Only bytes that fail their checks are called corrupt."""
    path = os.path.join(out_dir, name)
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
    except Exception as e:  # truncated zip, flipped bits, a foreign file
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint ({cause(e)}); "
                              f"point --out_dir at another run") from None
    try:
        missing = {"model", "model_config", "train_config"} - set(ckpt)
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
        check_plain(ckpt)
        # train.py never saves one; an older or foreign file may hold one, and sampling would crash
        bad = next((k for k, v in ckpt["model"].items()
                    if v.is_floating_point() and not v.isfinite().all()), None)
        if bad:
            raise ValueError(f"weight {bad} is not finite")
    except Exception as e:
        raise CheckpointError(f"{path} parsed, but is not a nanoMeSH checkpoint ({cause(e)}); "
                              f"point --out_dir at another run") from None
    model = RecursiveGPT(config_of(ckpt, path))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise intact(path, cause(e).replace("\n", " ")) from None
    return model.to(device), ckpt


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
    """A checkpoint's model Config, missing fields defaulted; an unknown field or scheme refused."""
    defaults(path, ckpt, "model_config", Config)
    try:
        return Config.from_dict(ckpt["model_config"])
    except ConfigError as e:
        raise intact(path, e) from None


PLAIN = (str, int, float, bool, type(None))  # a setting's value, as JSON holds it


def check_plain(ckpt):
    """The plain data of a checkpoint (ckpt.pt's dict or a pointer) checked before any use: every
    field there has its type (TypeError or ValueError, in words)."""
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
    """The parsed OUT_DIR/ckpt-sharded.json, or None: every field checked before use, and that it
    names a shards-<iter> folder inside OUT_DIR (never a path a save would remove)."""
    path = os.path.join(out_dir, POINTER)
    if not os.path.lexists(path):
        return None
    try:
        meta = files.read_json(path)
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
        if not isinstance(meta.get("checksums", {}), dict):
            raise TypeError("checksums is not a dict")
        check_plain(meta)  # data, saved_at
    except (ValueError, TypeError) as e:  # (json's errors are ValueErrors)
        raise CheckpointError(f"{path} is corrupt ({type(e).__name__}: {e}); move it away (and its "
                              f"shards folder) or point --out_dir at another run") from None
    config_of(meta, path)
    return meta


def peek(out_dir):
    """OUT_DIR/ckpt.pt memory-mapped, for its plain data: None without one, {} if unreadable."""
    path = os.path.join(out_dir, CKPT)
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception:
        return {}


def launches(out_dir):
    """The torchrun launches (launch_id) that saved OUT_DIR's readable checkpoints."""
    found = [(peek(out_dir) or {}).get("launch")]
    try:
        found.append((read_pointer(out_dir) or {}).get("launch"))
    except CheckpointError:
        pass
    return {launch for launch in found if isinstance(launch, str)}


def saved(ckpt):
    """How far a checkpoint had trained, (iter_num, saved_at): the clock only breaks a tie."""
    try:
        return int(ckpt["iter_num"]), float(ckpt.get("saved_at", 0.0))
    except Exception:
        return -1, -1.0


def latest(out_dir):
    """The rule a resume and every reader share: of ckpt.pt and a sharded one, the further by
    saved(), the sharded at a tie -> (CKPT, POINTER or None, ckpt.pt's saved(), the pointer)."""
    meta, full = read_pointer(out_dir), peek(out_dir)
    full = None if full is None else saved(full)
    if meta is None:
        return (CKPT if full else None), full, None
    if full is not None and full > saved(meta):
        return CKPT, full, meta
    return POINTER, full, meta


def load_latest(out_dir, device, prog="sample.py", kept=None):
    """OUT_DIR/ckpt.pt for sample.py and the tools, or with kept=ITER the one --keep_every kept.
    A newer sharded checkpoint beside it (latest()) is refused, naming consolidate.py."""
    if kept is not None:  # ckpt_ITER.pt, or a sharded one's folder ckpt_ITER/ (a run folder)
        if os.path.isdir(os.path.join(out_dir, f"ckpt_{kept}")):
            return load_latest(os.path.join(out_dir, f"ckpt_{kept}"), device, prog)
        if os.path.isfile(os.path.join(out_dir, f"ckpt_{kept}.pt")):
            return load(out_dir, device, f"ckpt_{kept}.pt")
        found = sorted(int(m[1]) for m in map(KEPT.match, listing(out_dir)) if m)
        raise CheckpointError(f"{out_dir} has no checkpoint of iter {kept} kept ("
                              + (f"it keeps {', '.join(map(str, found))}" if found else
                                 "none: train.py keeps them with --keep_every=N") + ")")
    model, ckpt = load(out_dir, device)
    taken, full, pointer = latest(out_dir)
    if pointer is None:
        return model, ckpt
    full_iter, sharded = full[0], pointer["iter_num"]
    path = os.path.join(out_dir, CKPT)
    pointer_path = os.path.join(out_dir, POINTER)
    if taken == POINTER and full != saved(pointer):
        than = "has trained further than" if sharded > full_iter else "was saved after"
        raise UsageError(f"{pointer_path} (iter {sharded}) {than} {path} (iter "
                         f"{full_iter if full_iter >= 0 else 'unknown'}), which is what {prog} "
                         f"reads; write it from the sharded one first: python "
                         f"tools/consolidate.py {shlex.quote('--out_dir=' + out_dir)}")
    print(f"{prog}: using {path} (iter {full_iter}); the sharded checkpoint beside it "
          f"({pointer_path}, iter {sharded}) has not trained further", file=sys.stderr)
    return model, ckpt


def listing(folder):  # its names, sorted; none where there is no folder
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def keep(out_dir, iter_num, sharded):
    """Keep the checkpoint just saved, which no later save removes: OUT_DIR/ckpt_ITER.pt, or a
    sharded one as the run folder ckpt_ITER/ (pointer and shards); hard links, else copies."""
    kept = os.path.join(out_dir, f"ckpt_{iter_num}{'' if sharded else '.pt'}")
    tmp = files.temporary_name(kept, folder=sharded)
    try:
        if sharded:
            meta = read_pointer(out_dir)
            shutil.copytree(os.path.join(out_dir, meta["folder"]),
                            os.path.join(tmp, meta["folder"]), copy_function=link)
            files.write_json(os.path.join(tmp, POINTER), meta)
        else:
            os.remove(tmp)  # (made empty) its name, for the link
            link(os.path.join(out_dir, CKPT), tmp)
        files.remove(kept)  # one kept at this iteration before (a run saved again there)
        os.replace(tmp, kept)
    except OSError as e:
        files.remove(tmp)
        raise CheckpointError(f"could not keep {kept}: {files.why_write_failed(e, out_dir)}; "
                              f"the latest checkpoint is saved") from None
    finally:
        files.disown(tmp)


def link(source, copy):
    try:  # a hard link writes nothing twice
        os.link(source, copy)
    except OSError:  # a filesystem without them
        shutil.copyfile(source, copy)


def load_run(out_dir, device, prog, unfinished=False, kept=None):
    """load_latest for a tool, which takes no run in the making unless told to (unfinished): one a
    live process trains (it holds OUT_DIR's lock) or is still to train (it holds the folder above,
    as table1.py does) is waited for, a line saying so; one stopped before its max_iters is refused
    in one line. A kept checkpoint (--ckpt=ITER) is asked for by name: taken as it is.
    -> (model, ckpt, "unfinished at iter N" or "", for the tool's output)."""
    unfinished = unfinished or kept is not None
    above = os.path.dirname(os.path.abspath(out_dir))
    for folder, what in ((out_dir, "is still training"),
                         (above, "is still to be trained by the process holding the folder above")):
        def waiting(what=what):
            print(f"{prog}: {out_dir} {what}; waiting for it (or give --unfinished=true to use "
                  f"it as it is now)", file=sys.stderr, flush=True)
        # its holder's turn first (a folder this process holds is its own: own() says False)
        if not unfinished and os.path.isdir(folder) and files.own(folder, note=False,
                                                                  waiting=waiting):
            files.disown(folder)
        try:
            model, ckpt = load_latest(out_dir, device, prog, kept)
        except CheckpointError:
            if folder == above or unfinished:
                raise
            continue
        at, end = ckpt["iter_num"], ckpt["train_config"].get("max_iters")
        if unfinished or not isinstance(end, int) or at >= end:
            break
    if not isinstance(end, int) or at >= end:
        return model, ckpt, ""
    if not unfinished:
        raise CheckpointError(f"{out_dir} is unfinished (iter {at} of its --max_iters={end}) and "
                              f"nothing trains it now; continue it with python train.py "
                              f"--init_from=resume {shlex.quote('--out_dir=' + out_dir)} (or the "
                              f"table1.py command that trained it), or give --unfinished=true to "
                              f"use it as it is")
    return model, ckpt, f"unfinished at iter {at}"


# -----------------------------------------------------------------------------
# The sharded format

def tensors(model, optimizer):
    """The flat dict of tensors DCP saves and loads: model.<name>, optim.<name>.<state>."""
    # the root keeps its weights gathered after a forward without backward
    if hasattr(model, "reshard"):
        model.reshard()
    names = {p: n for n, p in model.named_parameters()}
    out = {f"model.{n}": p for n, p in model.named_parameters()}
    for p, entry in optimizer.state.items():
        for k, v in entry.items():
            out[f"optim.{names[p]}.{k}"] = v
    return out


def save_sharded(out_dir, model, optimizer, master, data):
    """Every rank writes its shards into a new folder; then rank 0 points ckpt-sharded.json at it
    (atomic replace, with data: the plain entries) and removes the previous folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    old = [None]
    if master:
        try:
            old = [read_pointer(out_dir)]
        # a damaged pointer of a run this one replaces (--overwrite): its folders go later
        except CheckpointError:
            pass
    dist.broadcast_object_list(old, src=0)  # every rank writes into the folder rank 0 chose
    old = old[0]
    folder = shards_folder(data["iter_num"], old and old["folder"])
    path = os.path.join(out_dir, folder)
    data = {**data, "rng": rng_to_json(data["rng"])}  # the pointer is JSON
    if master and os.path.lexists(path):  # a leftover of an interrupted write, never the named one
        files.remove(path)
    dist.barrier()
    try:  # collective; returns once every shard is written (and fsynced)
        dcp.save(tensors(model, optimizer), checkpoint_id=path)
    # every rank gets it: stop cleanly, the pointer still names the last good one
    except CheckpointException as e:
        why = (cause(e) if "disk is full" not in (full := files.why_write_failed(e, out_dir))
               else full)
        raise CheckpointError(f"writing the sharded checkpoint {path} failed ({why}); "
                              f"{os.path.join(out_dir, POINTER)} still names "
                              f"the last good one") from None
    # a CRC-32 of every file of the folder, each rank computing its share: checked before any
    # read (verify)
    crcs = [None] * dist.get_world_size()
    dist.all_gather_object(crcs, {name: crc32(os.path.join(path, name)) for name in share(path)})
    if master:
        checksums = {name: crc for part in crcs for name, crc in part.items()}
        files.write_json(os.path.join(out_dir, POINTER),
                            {**data, "folder": folder, "checksums": checksums})
        if old:  # only now that the pointer names the new one
            files.remove(os.path.join(out_dir, old["folder"]))
    dist.barrier()


def shards_folder(iter_num, named):
    """shards-<iter>, or shards-<iter>-1 where the pointer names that already (a run saved again
    at one iteration): the named checkpoint stays whole until the pointer names the new."""
    folder = f"shards-{iter_num:08d}"
    return folder + "-1" if named == folder else folder


def metadata_reader(path):
    """DCP's reader for the folder `path`, its .metadata (a pickle) read by an unpickler that builds
    only DCP's metadata classes, torch sizes, dtypes, layouts and paths: it never runs code."""
    from torch.distributed.checkpoint import FileSystemReader

    class MetadataReader(FileSystemReader):

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                dcp_module = module.startswith("torch.distributed.checkpoint.") or \
                    module == "torch.distributed.tensor.placement_types"
                # no dotted names: they would reach through a module's attributes
                if "." not in name and (
                        # DCP's own classes only
                        dcp_module and isinstance(super().find_class(module, name), type)
                        or (module, name) in {("torch", "Size"), ("collections", "OrderedDict"),
                                              ("torch.serialization", "_get_layout"),
                                              ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}
                        or module == "torch"
                        and isinstance(getattr(torch, name, None), torch.dtype)):
                    return super().find_class(module, name)
                raise pickle.UnpicklingError(f"{module}.{name} is not allowed "
                                             f"in checkpoint metadata")

        def read_metadata(self, *args, **kwargs):
            from torch.distributed.checkpoint.metadata import StorageMeta
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                metadata = self.Unpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return MetadataReader(path)


def cause(e):
    """'Type: first line' of an error; of DCP's CheckpointException, its first rank's failure."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(e, CheckpointException) and e.failures:
        rank, (e, _) = next(iter(sorted(e.failures.items(), key=lambda kv: kv[0])))
        return f"rank {rank}: {cause(e)}"
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def failed(path, e):
    """The sharded checkpoint in folder path cannot be read: say so, and what is left."""
    out_dir = os.path.dirname(path)
    other = (f"move {POINTER} away to resume from {CKPT}, "
             f"the other checkpoint there, or "
             if os.path.isfile(os.path.join(out_dir, CKPT)) else "")
    return CheckpointError(f"the sharded checkpoint {path} is incomplete or corrupt "
                           f"({e if isinstance(e, str) else cause(e)}); "
                           f"{other}point --out_dir at another run")


def crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def share(path, rank=None, world=None):
    """The files of the shards folder path that this rank checksums: every world-th from rank."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    return sorted(os.listdir(path))[rank::world]


def verify(out_dir, meta, no_dist=False):
    """Every file of the sharded checkpoint against its pointer's CRC-32s before any read (each rank
    its share; no_dist: all here); a mismatch is one CheckpointError on every rank."""
    path = os.path.join(out_dir, meta["folder"])
    if "checksums" not in meta:
        return
    names = share(path, 0, 1) if no_dist else share(path)
    problem = next((f"{name} is not one of its files" if name not in meta["checksums"] else
                    f"{name} fails its CRC-32 check" for name in names
                    if not os.path.isfile(os.path.join(path, name))
                    or meta["checksums"].get(name) != crc32(os.path.join(path, name))), None)
    missing = [n for n in meta["checksums"] if not os.path.isfile(os.path.join(path, n))]
    problem = problem or (f"{missing[0]} is missing" if missing else None)
    if not no_dist:  # one rank's finding is every rank's
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, problem)
        problem = next((p for p in found if p), None)
    if problem:
        raise failed(path, problem)


def stored_keys(out_dir, meta):
    """The names of the tensors in the sharded checkpoint (from its .metadata)."""
    from torch.distributed.checkpoint.api import CheckpointException
    path = os.path.join(out_dir, meta["folder"])
    try:
        return set(metadata_reader(path).read_metadata().state_dict_metadata)
    except (Exception, CheckpointException) as e:  # missing, truncated, or not DCP's
        raise failed(path, e) from None


def dcp_load(state, out_dir, meta, no_dist=False):
    """DCP-load `state` (tensors, filled in place) from the folder `meta` names; any failure is one
    CheckpointError on every rank. no_dist: this process reads everything by itself."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    path = os.path.join(out_dir, meta["folder"])
    try:
        with warnings.catch_warnings():  # no_dist is meant: DCP would warn that it is assuming it
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=metadata_reader(path), no_dist=no_dist)
    except (Exception, CheckpointException) as e:
        raise failed(path, e) from None


def load_sharded(out_dir, meta, model, optimizer):
    """Into a sharded model and its optimizer, in place: each rank reads only its own shards."""
    verify(out_dir, meta)
    names = dict(model.named_parameters())
    # AdamW's state, made empty in the parameters' sharding, then read into
    for p in names.values():
        optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                              "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    # saved before the first step
    if not any(k.startswith("optim.") for k in stored_keys(out_dir, meta)):
        optimizer.state.clear()
    dcp_load(tensors(model, optimizer), out_dir, meta)


def load_whole(out_dir, meta):
    """A sharded checkpoint read whole in one process, as a resume's dict (run.load's)."""
    verify(out_dir, meta, no_dist=True)
    model = RecursiveGPT(config_of(meta, os.path.join(out_dir, POINTER)))
    tc = meta["train_config"]
    optimizer = model.configure_optimizer(tc["weight_decay"], tc["lr"] or 0.0,
                                          (tc["beta1"], tc["beta2"]))
    if any(k.startswith("optim.") for k in stored_keys(out_dir, meta)):
        for p in model.parameters():
            optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32),
                                  "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}
    with torch.no_grad():  # under torchrun too, each process reads the whole checkpoint by itself
        dcp_load(tensors(model, optimizer), out_dir, meta, no_dist=True)
    ckpt = {k: v for k, v in meta.items() if k not in ("folder", "rng", "checksums")}
    return {**ckpt, "model": model, "optimizer": optimizer.state_dict(),
            "rng": rng_from_json(meta["rng"]), "path": os.path.join(out_dir, POINTER)}


def rng_to_json(rng):
    return {k: v.tolist() for k, v in rng.items()}


def rng_from_json(rng):
    return {k: torch.tensor(v, dtype=torch.uint8) for k, v in rng.items()}
