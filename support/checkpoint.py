"""
Checkpoints: the one writer and reader of ckpt.pt and of the sharded format, and which of a run's
checkpoints is its latest, for train.py, sample.py and every tool.

    model, ckpt = checkpoint.load("out")                # OUT_DIR/ckpt.pt: the model, plain data
    model, ckpt = checkpoint.load_latest("out", "cpu")  # the same, unless a sharded one is newer
    meta = checkpoint.read_pointer("out")               # OUT_DIR/ckpt-sharded.json, or None

OUT_DIR/ckpt.pt is a torch.save'd dict of tensors and plain data (model_config, train_config,
iter_num, best_val_loss, rng, the data it trained on), loaded with weights_only=True (loading never
runs code), its zip CRC-32s verified, its plain data checked and its weights finite. A sharded
checkpoint (train.py --fsdp=true) is a folder OUT_DIR/shards-<iter>/ that each rank writes its
shards into with torch.distributed.checkpoint (DCP), and OUT_DIR/ckpt-sharded.json, written last,
which names it and holds the plain data and a CRC-32 of every file of the folder. The folder's
.metadata (a pickle PyTorch writes) is read by an unpickler that builds only DCP's own classes.
Both formats are written atomically; torch.distributed's checkpoint package is imported only where
it is used (loaded into a DDP process, it makes gloo's shutdown hang now and then).
"""

import os
import pickle
import re
import shlex
import sys
import warnings
import zipfile
import zlib

import torch
import torch.distributed as dist

from configurator import UsageError
from support import files
from mesh import Config, RecursiveGPT

# a whole checkpoint; the pointer of a sharded one
CKPT, POINTER = "ckpt.pt", "ckpt-sharded.json"
# the folders of sharded checkpoints (sharded.shards_folder)
SHARDS = re.compile(r"^shards-\d{8}(-1)?$")


class CheckpointError(UsageError):
    """A checkpoint that is missing, damaged or cannot be used as asked: one line, exit 2."""


def save(obj, path):
    """torch.save(obj) to path, atomically (files.atomic_write): a crash leaves the old file or
    the new."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        files.atomic_write(path, lambda f: torch.save(obj, f))
    except OSError as e:
        raise CheckpointError(f"could not write {path}: {e.strerror}; the previous checkpoint "
                              f"there, if any, is unchanged") from None


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


def load_latest(out_dir, device, prog="sample.py"):
    """load(out_dir): OUT_DIR/ckpt.pt, which sample.py and tools/probe.py read. Where a
    sharded checkpoint (ckpt-sharded.json) stands beside it, the run's latest (checkpoint.latest,
    the rule a resume follows) is read: a sharded one is refused, naming consolidate.py, which
    writes ckpt.pt from it, unless ckpt.pt is its copy; otherwise a line on stderr says which one
    is used."""
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


def load_run(out_dir, device, prog, unfinished=False):
    """load_latest for a tool, which takes no run in the making unless told to (unfinished): one a
    live process trains (it holds OUT_DIR's lock) or is still to train (it holds the folder above,
    as table1.py does) is waited for, a line saying so; one stopped before its max_iters is refused
    in one line. -> (model, ckpt, "unfinished at iter N" or "", for the tool's output)."""
    above = os.path.dirname(os.path.abspath(out_dir))
    for folder, what in ((out_dir, "is still training"),
                         (above, "is still to be trained by the process holding the folder above")):
        try:  # (a folder this process holds is free to it)
            if not unfinished and os.path.isdir(folder):
                files.check_free(folder)
        except UsageError:
            print(f"{prog}: {out_dir} {what}; waiting for it (or give --unfinished=true to use "
                  f"it as it is now)", file=sys.stderr, flush=True)
            with files.one_at_a_time(folder, lambda: None):
                pass
        try:
            model, ckpt = load_latest(out_dir, device, prog)
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
    """The flat dict of tensors DCP saves and loads: model.<name> and
    optim.<name>.<exp_avg|exp_avg_sq|step> (only tensors: the plain data goes to the JSON
    pointer)."""
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
    """Every rank writes its shards into a new folder (shards_folder); then rank 0 points
    ckpt-sharded.json at it (atomic replace) and removes the previous folder. `data`: the
    checkpoint's plain entries (configs, iter_num, ...)."""
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
    """The folder a sharded checkpoint of iter_num is written into: shards-<iter>, or
    shards-<iter>-1 when the pointer names shards-<iter> already (a run saved again at the same
    iteration, as a sequential run resumed after its data ran out does), so that the checkpoint the
    pointer names stays whole until it names the new."""
    folder = f"shards-{iter_num:08d}"
    return folder + "-1" if named == folder else folder


def metadata_reader(path):
    """DCP's reader for the folder `path`, but its .metadata (a pickle written by PyTorch) is read
    by an unpickler that builds only DCP's own metadata classes, torch sizes, dtypes and layouts,
    and paths: loading never runs code."""
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
    """'Type: first line' of an error; for DCP's CheckpointException (a BaseException that gathers
    every rank's failure), of the first rank's."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(e, CheckpointException) and e.failures:
        rank, (e, _) = next(iter(sorted(e.failures.items(), key=lambda kv: kv[0])))
        return f"rank {rank}: {cause(e)}"
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def failed(path, e):
    """The sharded checkpoint in folder path cannot be read: say so, and what is left (without
    losing anything)."""
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
    """The files of the shards folder path that this rank checksums: every world-th, from its rank
    on."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    return sorted(os.listdir(path))[rank::world]


def verify(out_dir, meta, no_dist=False):
    """Every file of the sharded checkpoint against the CRC-32 its pointer records, before anything
    is read (each rank its share; no_dist: this process all of them); a mismatch is one
    CheckpointError on every rank. Sharded checkpoints written before checksums were recorded are
    read unchecked."""
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
    """DCP-load `state` (a dict of tensors, each filled in place) from the folder `meta` names; any
    failure (a missing, truncated or foreign shard) is one CheckpointError, raised on every rank
    (DCP gathers one rank's failure to all). no_dist: this process reads everything by itself."""
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
    """A sharded checkpoint in one process, as the dict a resume continues from (resume.load's:
    ckpt.pt's entries, "model" the model): for DDP and single-process resumes and for
    consolidation."""
    verify(out_dir, meta, no_dist=True)
    model = RecursiveGPT(Config.from_dict(meta["model_config"]))
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
