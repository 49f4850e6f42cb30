"""
FSDP2 (--fsdp=true): the model's weights, gradients and AdamW state sharded over torchrun's
processes, and its checkpoints in torch.distributed.checkpoint's (DCP's) own convention:

    OUT_DIR/shards-<iter>/   every rank's shards (*.distcp) and rank 0's state.json (the plain
                             data, written first); DCP writes its .metadata last, so the folder
                             is a whole checkpoint once .metadata is there (checkpoint.found)

DCP's .metadata is a pickle: it is read by an unpickler that builds only DCP's classes.
Imported only where used: in a plain DDP process, DCP's import can hang gloo's exit.
"""

import os
import pickle
import warnings
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from configurator import UsageError
from support import checkpoint, files
from support.checkpoint import SHARDS, STATE, CheckpointError
from mesh import RecursiveGPT


class Sharded:
    """The model's weights, gradients and AdamW state sharded over the processes (FSDP2)."""
    name = " (FSDP)"
    sharded = True
    flag = " --fsdp=true"

    def __init__(self, distributed):
        if not distributed:
            raise UsageError("--fsdp=true shards over processes started by torchrun, e.g. "
                             "torchrun --standalone --nproc_per_node=8 train.py ... --fsdp=true "
                             "(one process: --nproc_per_node=1)")

    def wrap(self, model, device, scratch):
        """(the sharded model, what trains: compiled); a scratch model takes rank 0's weights."""
        if device.type != "cuda" and torch.__version__ < (2, 7):  # FSDP2's CPU streams
            raise UsageError(f"--fsdp=true on {device.name} needs torch 2.7 or later (this is "
                             f"{torch.__version__}): upgrade torch, or train without --fsdp (DDP)")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        model = model.to(device.name)  # fully_shard keeps shards in place
        if scratch:
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        # bf16 gathering on GPUs only: CPU autocast runs LayerNorm in the input's dtype, so bf16
        # weights cannot meet a float32 residual stream there (CUDA autocast: LayerNorm in float32)
        bf16 = device.dtype == "bfloat16" and device.type == "cuda"
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        blocks = MixedPrecisionPolicy() if not bf16 else MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
        for block in [*model.prelude, *(b for core in model.cores for b in core), *model.coda]:
            fully_shard(block, mesh=mesh, mp_policy=blocks)
        # the root too frees its gathered weights after a forward
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        return model, torch.compile(model) if device.compile else model

    def sync(self, model, last):
        """FSDP reduce-scatters the gradients at every micro-batch: no rank holds a whole one."""
        return nullcontext()

    def save(self, out_dir, model, optimizer, master, state):
        """Every rank its shards into a new folder; once it is whole, rank 0 removes the others."""
        name = f"shards-{state['iter_num']:08d}"  # (a run never saves twice at one iteration)
        path = os.path.join(out_dir, name)
        if master:
            files.remove(path)  # an interrupted write's, never the latest whole one
            files.write_json(os.path.join(path, STATE), state)
        dist.barrier()
        try:  # collective; returns once every shard and then .metadata are written (and fsynced)
            dcp.save(tensors(model, optimizer), checkpoint_id=path)
        except CheckpointException as e:  # every rank gets it: the last whole checkpoint stays
            full = files.why_write_failed(e, out_dir)
            raise CheckpointError(f"writing the sharded checkpoint {path} failed ("
                                  f"{full if 'disk is full' in full else checkpoint.cause(e)}); "
                                  f"the last whole one, if any, is as it was") from None
        if master:  # only now that the new one is whole (and the pointer earlier code wrote)
            for other in checkpoint.listing(out_dir):
                if SHARDS.match(other) and other != name or other == checkpoint.POINTER:
                    files.remove(os.path.join(out_dir, other))
        dist.barrier()

    def load(self, resume, model, optimizer):
        """A sharded checkpoint's shards, or a whole one's optimizer state cut to this rank's."""
        if "folder" in resume:
            return read(resume["folder"], model, optimizer, no_dist=False)
        from torch.distributed.tensor import distribute_tensor
        whole = resume["optimizer"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {}
        for i, entry in whole["state"].items():
            p = params[int(i)]  # a DTensor: wrap shards every parameter
            state[i] = {k: distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh,
                                             p.placements) if v.shape == p.shape else v
                        for k, v in entry.items()}
        optimizer.load_state_dict({"state": state, "param_groups": whole["param_groups"]})


def tensors(model, optimizer, saved=()):
    """The flat dict of tensors DCP saves and loads: model.<name>, optim.<name>.<state>; where
    `saved` has AdamW's state, it is first made empty in the parameters' sharding, to read into."""
    if hasattr(model, "reshard"):  # the root keeps its weights gathered after a forward
        model.reshard()
    names = {p: n for n, p in model.named_parameters()}
    if any(k.startswith("optim.") for k in saved):
        for p in names:
            optimizer.state[p] = dict(step=torch.zeros((), device=p.device),
                                      exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    out = {f"model.{n}": p for p, n in names.items()}
    for p, entry in optimizer.state.items():
        out.update({f"optim.{names[p]}.{k}": v for k, v in entry.items()})
    return out


class Unpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch sizes, dtypes and paths, nothing else: no code runs."""

    def find_class(self, module, name):
        dcp_module = module.startswith("torch.distributed.checkpoint.") or \
            module == "torch.distributed.tensor.placement_types"
        # no dotted names: they would reach through a module's attributes
        if "." not in name and (
                dcp_module and isinstance(super().find_class(module, name), type)
                or (module, name) in {("torch", "Size"), ("collections", "OrderedDict"),
                                      ("torch.serialization", "_get_layout"),
                                      ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}
                or module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


class Reader(FileSystemReader):
    """DCP's own reader of the folder path, given its .metadata read safely (Unpickler)."""

    def __init__(self, path):
        super().__init__(path)
        with open(os.path.join(path, ".metadata"), "rb") as f:
            self.metadata = Unpickler(f).load()

    def read_metadata(self, *args, **kwargs):
        return self.metadata


def read(path, model, optimizer, no_dist):
    """The sharded checkpoint in folder path into model and optimizer, in place: every rank its
    shards (no_dist: this process all of them); a failure is one CheckpointError on every rank."""
    try:
        reader = Reader(path)
        state = tensors(model, optimizer, reader.metadata.state_dict_metadata)
        with warnings.catch_warnings():  # no_dist is meant: DCP would warn that it is assuming it
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # missing, truncated, or not DCP's
        up, name = os.path.split(path)
        rest = [c for c in checkpoint.found(up) if c[2] != name]
        other = (f"move it away to resume from {max(rest)[2]} beside it, or " if rest else "")
        raise CheckpointError(f"the sharded checkpoint {path} is incomplete or corrupt "
                              f"({checkpoint.cause(e)}); {other}point --out_dir at another "
                              f"run") from None


def read_whole(resume):
    """A sharded checkpoint read whole in one process, as a resume's dict (its "model" built, its
    "optimizer" a state dict): train.py without --fsdp, and consolidate.py."""
    model = RecursiveGPT(checkpoint.config_of(resume, resume["path"]))
    tc = resume["train_config"]  # lr 0: train.py sets it each step
    optimizer = model.configure_optimizer(tc["weight_decay"], 0.0,
                                          (tc["beta1"], tc["beta2"]))
    with torch.no_grad():  # each process by itself, under torchrun too
        read(resume["folder"], model, optimizer, no_dist=True)
    return {**resume, "model": model, "optimizer": optimizer.state_dict()}
