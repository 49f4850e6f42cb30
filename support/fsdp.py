"""
Past one GPU's memory: train.py --fsdp=true shards weights, gradients and AdamW state over the
processes with FSDP2 (torch.distributed.fsdp.fully_shard); its checkpoints are sharded too
(sharded.py's format), and tools/consolidate.py turns one into a ckpt.pt:

    torchrun --standalone --nproc_per_node=8 train.py config/pythia-6.9b_mesh.json --fsdp=true
    python tools/consolidate.py --out_dir=OUT_DIR  # OUT_DIR's sharded checkpoint -> OUT_DIR/ckpt.pt

Units: one per unique block, plus the root (embedding, routers, final LayerNorm, head). A shared
core's blocks run K times per forward; FSDP gathers their weights at each application (and again
for each in backward) and accumulates the K gradients into the one sharded gradient.
Precision on GPUs (--dtype=bfloat16): blocks gather their weights in bf16 and reduce gradients in
float32 (MixedPrecisionPolicy); the root and the blocks' inputs stay float32 and autocast is on as
under DDP, so the residual stream, the MeSH buffer, LayerNorms and the loss are float32 as there.
(On CPU the weights are gathered in float32 and bf16 autocast does the rest.)

train.py holds the model through Sharded, which makes spread.py's calls (wrap, sync, save and
load, with its name and checkpoint file). Either format resumes in either mode, at any number of
processes: a DDP checkpoint is cut into shards here (load), a sharded one loads whole under DDP
(resume.py).
"""

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from support import sharded
from support.checkpoint import POINTER
from support.spread import Spread
from configurator import UsageError

# torch.distributed's checkpoint, tensor and fsdp packages are imported in the functions that use
# them: loaded into a DDP process (train.py imports this file), they make gloo's shutdown hang at
# exit now and then


# -----------------------------------------------------------------------------
# Sharding the model

def unique_blocks(model):
    return [*model.prelude, *(b for core in model.cores for b in core), *model.coda]


def shard(model, device_type, bf16):
    """fully_shard every unique block, then the root, over all processes (in place); returns the
    model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=False) if bf16 else MixedPrecisionPolicy()
    for block in unique_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=blocks)
    # the root too frees its gathered weights after a forward: an evaluation (no backward) leaves
    # none behind
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


def shard_optimizer_state(state_dict, optimizer):
    """A whole (ckpt.pt) optimizer state dict -> the same with every tensor of a sharded parameter
    cut to this rank's shard, ready for optimizer.load_state_dict. Ids follow the order of the
    optimizer's groups."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for i, entry in state_dict["state"].items():
        p = params[int(i)]
        state[i] = {k: distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh,
                                         p.placements)
                    if isinstance(p, DTensor) and v.shape == p.shape else v
                    for k, v in entry.items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


# -----------------------------------------------------------------------------
# The calls train.py makes (spread.py's Spread makes them for the whole model)

class Sharded(Spread):
    """The model's weights, gradients and AdamW state sharded over the processes (FSDP2)."""
    name = " (FSDP)"       # the startup line's word for it
    checkpoint = POINTER   # the file it saves, which a resume continues from
    flag = " --fsdp=true"  # what the command that resumes it adds

    def __init__(self, distributed):
        if not distributed:
            raise UsageError("--fsdp=true shards over processes started by torchrun, e.g. torchrun "
                             "--standalone --nproc_per_node=8 train.py ... --fsdp=true (one "
                             "process: --nproc_per_node=1)")

    def wrap(self, model, device, tc, scratch):
        """(the sharded model, what trains: the same, compiled with --compile). A scratch model
        takes rank 0's initial weights first, as DDP does, so that every shard comes from the same
        model."""
        model = model.to(device)  # NCCL broadcasts GPU tensors; fully_shard keeps shards in place
        if scratch:
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        # bf16 gathering on GPUs only: CPU autocast runs LayerNorm in the input's dtype, so bf16
        # weights cannot meet a float32 residual stream there (CUDA autocast: LayerNorm in float32)
        cuda = device.startswith("cuda")
        shard(model, device.split(":")[0], bf16=tc.dtype == "bfloat16" and cuda)
        return model, torch.compile(model) if tc.compile else model

    def sync(self, model, last):
        """FSDP reduce-scatters the gradients at every micro-batch: no rank holds a whole one."""
        return nullcontext()

    def save(self, out_dir, model, optimizer, master, state):
        """A sharded checkpoint (sharded.py's format): each rank writes its shards, rank 0 the
        pointer."""
        sharded.save(out_dir, model, optimizer, master, state)

    def load(self, resume, model, optimizer):
        """Into the sharded model and its AdamW: a sharded checkpoint's shards (each rank its own),
        or a whole checkpoint's optimizer state cut to this rank's shards (its weights came with
        the model)."""
        if "folder" in resume:
            sharded.load_sharded(os.path.dirname(resume["path"]), resume, model, optimizer)
        else:
            optimizer.load_state_dict(shard_optimizer_state(resume["optimizer"], optimizer))
