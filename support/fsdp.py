"""
Past one GPU's memory: train.py --fsdp=true shards weights, gradients and AdamW state over the
processes with FSDP2 (torch.distributed.fsdp.fully_shard), and saves sharded checkpoints with
torch.distributed.checkpoint (DCP); tools/consolidate.py turns one into a ckpt.pt:

    torchrun --standalone --nproc_per_node=8 train.py config/pythia-6.9b_mesh.json --fsdp=true
    python tools/consolidate.py --out_dir=OUT_DIR   # OUT_DIR's sharded checkpoint -> OUT_DIR/ckpt.pt (sample.py, probe.py, ...)

Units: one per unique block, plus the root (embedding, routers, final LayerNorm, head). A shared
core's blocks run K times per forward; FSDP gathers their weights at each application (and again
for each in backward) and accumulates the K gradients into the one sharded gradient.
Precision on GPUs (--dtype=bfloat16): blocks gather their weights in bf16 and reduce gradients in
float32 (MixedPrecisionPolicy); the root and the blocks' inputs stay float32 and autocast is on as
under DDP, so the residual stream, the MeSH buffer, LayerNorms and the loss are float32 as there.
(On CPU the weights are gathered in float32 and bf16 autocast does the rest.)

A sharded checkpoint is a DCP folder OUT_DIR/shards-<iter>/ (each rank writes its own shards: no
rank ever holds the whole model) plus OUT_DIR/ckpt-sharded.json, written last and atomically,
which names the folder and holds the plain data (configs, iteration, RNG state). A folder that
ckpt-sharded.json does not name is an unfinished write and is removed at the next start.
Resume takes the newer of ckpt.pt and the sharded checkpoint, in either mode: a DDP checkpoint
resumes under FSDP and a sharded one under DDP (loaded whole), at any number of processes.

train.py holds the model through this file's calls under --fsdp=true, and through ddp.py's, the
same calls, otherwise: wrap, sync, save, load (and check_launch, here only).
"""

import os
import pickle
import warnings
import zlib
from contextlib import nullcontext

import torch
import torch.distributed as dist

from support import checkpoint, outdir, runfiles
from support.checkpoint import POINTER, CheckpointError
from configurator import UsageError
from mesh import Config, RecursiveGPT

NAME, CHECKPOINT = " (FSDP)", POINTER  # the startup line's word for it; the file a resume continues from
# torch.distributed's checkpoint, tensor and fsdp packages are imported in the functions that use them: loaded
# into a DDP process (train.py imports this file), they make gloo's shutdown hang at exit now and then


# -----------------------------------------------------------------------------
# Sharding the model

def unique_blocks(model):
    return [*model.prelude, *(b for core in model.cores for b in core), *model.coda]


def shard(model, device_type, bf16):
    """fully_shard every unique block, then the root, over all processes (in place); returns the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=False) if bf16 else MixedPrecisionPolicy()
    for block in unique_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=blocks)
    # the root too frees its gathered weights after a forward: an evaluation (no backward) leaves none behind
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


def shard_optimizer_state(state_dict, optimizer):
    """A whole (ckpt.pt) optimizer state dict -> the same with every tensor of a sharded parameter cut to this
    rank's shard, ready for optimizer.load_state_dict. Ids follow the order of the optimizer's groups."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for i, entry in state_dict["state"].items():
        p = params[int(i)]
        state[i] = {k: distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh, p.placements)
                    if isinstance(p, DTensor) and v.shape == p.shape else v for k, v in entry.items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


# -----------------------------------------------------------------------------
# The calls train.py makes (ddp.py has the same for the whole model)

def check_launch(distributed):
    if not distributed:
        raise UsageError("--fsdp=true shards over processes started by torchrun, e.g. torchrun --standalone "
                         "--nproc_per_node=8 train.py ... --fsdp=true (one process: --nproc_per_node=1)")


def wrap(model, device, tc, scratch):
    """(the sharded model, what trains: the same, compiled with --compile). A scratch model takes rank 0's
    initial weights first, as DDP does, so that every shard comes from the same model."""
    model = model.to(device)  # NCCL broadcasts GPU tensors; fully_shard keeps the shards where they are
    if scratch:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    # bf16 gathering on GPUs only: CPU autocast runs LayerNorm in the input's dtype, so bf16 weights cannot meet
    # a float32 residual stream there (CUDA autocast computes LayerNorm in float32)
    cuda = device.startswith("cuda")
    shard(model, device.split(":")[0], bf16=tc.dtype == "bfloat16" and cuda)
    return model, torch.compile(model) if tc.compile else model


def sync(model, last):
    """FSDP reduce-scatters the gradients at every micro-batch, so that no rank holds a whole gradient."""
    return nullcontext()


def load(resume, model, optimizer):
    """Into the sharded model and its AdamW: a sharded checkpoint's shards (each rank its own), or a whole
    checkpoint's optimizer state cut to this rank's shards (its weights came with the model)."""
    if "folder" in resume:
        load_sharded(os.path.dirname(resume["path"]), resume, model, optimizer)
    else:
        optimizer.load_state_dict(shard_optimizer_state(resume["optimizer"], optimizer))


# -----------------------------------------------------------------------------
# Sharded checkpoints

def tensors(model, optimizer):
    """The flat dict of tensors DCP saves and loads: model.<name> and optim.<name>.<exp_avg|exp_avg_sq|step>
    (only tensors: the plain data goes to the JSON pointer)."""
    if hasattr(model, "reshard"):  # the root keeps its weights gathered after a forward without backward
        model.reshard()
    names = {p: n for n, p in model.named_parameters()}
    out = {f"model.{n}": p for n, p in model.named_parameters()}
    for p, entry in optimizer.state.items():
        for k, v in entry.items():
            out[f"optim.{names[p]}.{k}"] = v
    return out


def save(out_dir, model, optimizer, master, data):
    """Every rank writes its shards into a new folder (shards_folder); then rank 0 points ckpt-sharded.json at
    it (atomic replace) and removes the previous folder. `data`: the checkpoint's plain entries (configs, iter_num, ...)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    old = [None]
    if master:
        try:
            old = [checkpoint.read_pointer(out_dir)]
        except CheckpointError:  # a damaged pointer of a run this one replaces (--overwrite): its folders go later
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
    except CheckpointException as e:  # every rank gets it: stop cleanly, the pointer still names the last good one
        why = cause(e) if "disk is full" not in (full := runfiles.why_write_failed(e, out_dir)) else full
        raise CheckpointError(f"writing the sharded checkpoint {path} failed ({why}); "
                              f"{os.path.join(out_dir, POINTER)} still names the last good one") from None
    # a CRC-32 of every file of the folder, each rank computing its share: checked before any read (verify)
    crcs = [None] * dist.get_world_size()
    dist.all_gather_object(crcs, {name: crc32(os.path.join(path, name)) for name in share(path)})
    if master:
        checksums = {name: crc for part in crcs for name, crc in part.items()}
        runfiles.write_json(os.path.join(out_dir, POINTER), {**data, "folder": folder, "checksums": checksums})
        if old:  # only now that the pointer names the new one
            outdir.remove(os.path.join(out_dir, old["folder"]))
    dist.barrier()


def shards_folder(iter_num, named):
    """The folder a sharded checkpoint of iter_num is written into: shards-<iter>, or shards-<iter>-1 when the
    pointer names shards-<iter> already (a run saved again at the same iteration, as a sequential run resumed
    after its data ran out does), so that the checkpoint the pointer names stays whole until it names the new."""
    folder = f"shards-{iter_num:08d}"
    return folder + "-1" if named == folder else folder


def metadata_reader(path):
    """DCP's reader for the folder `path`, but its .metadata (a pickle written by PyTorch) is read by an unpickler
    that builds only DCP's own metadata classes, torch sizes, dtypes and layouts, and paths: loading never runs
    code."""
    from torch.distributed.checkpoint import FileSystemReader

    class MetadataReader(FileSystemReader):

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                dcp_module = module.startswith("torch.distributed.checkpoint.") or \
                    module == "torch.distributed.tensor.placement_types"
                if "." not in name and (  # no dotted names: they would reach through a module's attributes
                        dcp_module and isinstance(super().find_class(module, name), type)  # DCP's own classes only
                        or (module, name) in {("torch", "Size"), ("collections", "OrderedDict"),
                                              ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                                              ("pathlib", "WindowsPath")}
                        or module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                    return super().find_class(module, name)
                raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")

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
    """'Type: first line' of an error; for DCP's CheckpointException (a BaseException that gathers every rank's
    failure), of the first rank's."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(e, CheckpointException) and e.failures:
        rank, (e, _) = next(iter(sorted(e.failures.items(), key=lambda kv: kv[0])))
        return f"rank {rank}: {cause(e)}"
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def failed(path, e):
    """The sharded checkpoint in folder path cannot be read: say so, and what is left (without losing anything)."""
    out_dir = os.path.dirname(path)
    other = (f"move {POINTER} away to resume from {checkpoint.CKPT}, the other checkpoint there, or "
             if os.path.isfile(os.path.join(out_dir, checkpoint.CKPT)) else "")
    return CheckpointError(f"the sharded checkpoint {path} is incomplete or corrupt ({e if isinstance(e, str) else cause(e)}); "
                           f"{other}point --out_dir at another run")


def crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def share(path, rank=None, world=None):
    """The files of the shards folder path that this rank checksums: every world-th, from its rank on."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    return sorted(os.listdir(path))[rank::world]


def verify(out_dir, meta, no_dist=False):
    """Every file of the sharded checkpoint against the CRC-32 its pointer records, before anything is read
    (each rank its share; no_dist: this process all of them); a mismatch is one CheckpointError on every rank.
    Sharded checkpoints written before checksums were recorded are read unchecked."""
    path = os.path.join(out_dir, meta["folder"])
    if "checksums" not in meta:
        return
    names = share(path, 0, 1) if no_dist else share(path)
    problem = next((f"{name} is not one of its files" if name not in meta["checksums"] else
                    f"{name} fails its CRC-32 check" for name in names if not os.path.isfile(os.path.join(path, name))
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
    """DCP-load `state` (a dict of tensors, each filled in place) from the folder `meta` names; any failure
    (a missing, truncated or foreign shard) is one CheckpointError, raised on every rank (DCP gathers one
    rank's failure to all). no_dist: this process reads everything by itself."""
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
    for p in names.values():  # AdamW's state, made empty in the parameters' sharding, then read into
        optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                              "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    if not any(k.startswith("optim.") for k in stored_keys(out_dir, meta)):  # saved before the first step
        optimizer.state.clear()
    dcp_load(tensors(model, optimizer), out_dir, meta)


def load_whole(out_dir, meta):
    """A sharded checkpoint in one process, as the dict a resume continues from (resume.load's: ckpt.pt's
    entries, "model" the model): for DDP and single-process resumes and for consolidation."""
    verify(out_dir, meta, no_dist=True)
    model = RecursiveGPT(Config.from_dict(meta["model_config"]))
    tc = meta["train_config"]
    optimizer = model.configure_optimizer(tc["weight_decay"], tc["lr"] or 0.0, (tc["beta1"], tc["beta2"]))
    if any(k.startswith("optim.") for k in stored_keys(out_dir, meta)):
        for p in model.parameters():
            optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}
    with torch.no_grad():  # under torchrun too, each process reads the whole checkpoint by itself
        dcp_load(tensors(model, optimizer), out_dir, meta, no_dist=True)
    ckpt = {k: v for k, v in meta.items() if k not in ("folder", "rng", "checksums")}
    return {**ckpt, "model": model, "optimizer": optimizer.state_dict(), "rng": rng_from_json(meta["rng"]),
            "path": os.path.join(out_dir, POINTER)}


def rng_to_json(rng):
    return {k: v.tolist() for k, v in rng.items()}


def rng_from_json(rng):
    return {k: torch.tensor(v, dtype=torch.uint8) for k, v in rng.items()}


def consolidate(out_dir):
    """OUT_DIR's sharded checkpoint -> OUT_DIR/ckpt.pt (written atomically), the file sample.py, probe.py,
    table1.py and lm_eval_mesh.py read. Needs the whole model and its AdamW state in this machine's memory.
    It owns OUT_DIR while it writes (never beside a live run), and never replaces a ckpt.pt saved later."""
    if os.path.isdir(out_dir):
        runfiles.own(out_dir, flag="OUT_DIR")
    meta = checkpoint.read_pointer(out_dir)
    if meta is None:
        raise CheckpointError(f"no sharded checkpoint in {out_dir} (no {POINTER}); train one with "
                              f"torchrun ... train.py --fsdp=true --out_dir={out_dir}")
    path = os.path.join(out_dir, checkpoint.CKPT)
    if os.path.isfile(path):
        full = checkpoint.saved_full(out_dir)
        if full > checkpoint.saved(meta):
            than = "is further in training than" if full[0] > meta["iter_num"] else "was saved after"
            raise CheckpointError(f"{path} (iter {full[0]}) {than} the sharded checkpoint (iter "
                                  f"{meta['iter_num']}), which would replace it; it needs no consolidation")
    ckpt = load_whole(out_dir, meta)
    del ckpt["path"]
    checkpoint.save({**ckpt, "model": ckpt["model"].state_dict()}, os.path.join(out_dir, checkpoint.CKPT))
    return ckpt["iter_num"]
