"""
The sharded checkpoint format (train.py --fsdp=true): each rank writes its own shards of the
weights and AdamW's state with torch.distributed.checkpoint (DCP), and reads them back safely.

    sharded.save(out_dir, model, optimizer, master, data)  # collective: every rank its shards
    sharded.load_sharded(out_dir, meta, model, optimizer)  # into a sharded model, each rank its own
    ckpt = sharded.load_whole(out_dir, meta)               # the whole of it in one process

A sharded checkpoint is a DCP folder OUT_DIR/shards-<iter>/ (no rank ever holds the whole model)
plus OUT_DIR/ckpt-sharded.json, written last and atomically, which names the folder and holds the
plain data (configs, iteration, RNG state) and a CRC-32 of every file of the folder, checked before
any read. The folder's .metadata (a pickle PyTorch writes) is read by an unpickler that builds only
DCP's own classes, so loading never runs code. A folder that the pointer does not name is an
unfinished write, removed at the next start (outdir.py).
"""

import os
import pickle
import warnings
import zlib

import torch
import torch.distributed as dist

from support import checkpoint, outdir, runfiles
from support.checkpoint import POINTER, CheckpointError
from mesh import Config, RecursiveGPT

# torch.distributed's checkpoint and tensor packages are imported in the functions that use them:
# loaded into a DDP process, they make gloo's shutdown hang at exit now and then



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


def save(out_dir, model, optimizer, master, data):
    """Every rank writes its shards into a new folder (shards_folder); then rank 0 points
    ckpt-sharded.json at it (atomic replace) and removes the previous folder. `data`: the
    checkpoint's plain entries (configs, iter_num, ...)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    old = [None]
    if master:
        try:
            old = [checkpoint.read_pointer(out_dir)]
        # a damaged pointer of a run this one replaces (--overwrite): its folders go later
        except CheckpointError:
            pass
    dist.broadcast_object_list(old, src=0)  # every rank writes into the folder rank 0 chose
    old = old[0]
    folder = shards_folder(data["iter_num"], old and old["folder"])
    path = os.path.join(out_dir, folder)
    data = {**data, "rng": rng_to_json(data["rng"])}  # the pointer is JSON
    if master and os.path.lexists(path):  # a leftover of an interrupted write, never the named one
        outdir.remove(path)
    dist.barrier()
    try:  # collective; returns once every shard is written (and fsynced)
        dcp.save(tensors(model, optimizer), checkpoint_id=path)
    # every rank gets it: stop cleanly, the pointer still names the last good one
    except CheckpointException as e:
        why = (cause(e) if "disk is full" not in (full := runfiles.why_write_failed(e, out_dir))
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
        runfiles.write_json(os.path.join(out_dir, POINTER),
                            {**data, "folder": folder, "checksums": checksums})
        if old:  # only now that the pointer names the new one
            outdir.remove(os.path.join(out_dir, old["folder"]))
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
    other = (f"move {POINTER} away to resume from {checkpoint.CKPT}, "
             f"the other checkpoint there, or "
             if os.path.isfile(os.path.join(out_dir, checkpoint.CKPT)) else "")
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
