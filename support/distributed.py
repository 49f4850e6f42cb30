"""
Training over one process or many: one decision shared by all (from_rank0), and the model spread
whole over them with DDP (Spread; --fsdp=true: support/sharded.py, FSDP2), so that train.py never
asks which. A torchrun job's processes join first (support/torchrun.py).

    name = from_rank0(lambda: prepared(root, name))      # rank 0 decides, every rank gets it
    spread = spread_over(tc.fsdp, launched)              # --fsdp: Sharded, else Spread
    raw_model, model = spread.wrap(model, device, scratch=True)  # model: compiled, in DDP
    with spread.sync(model, last=...): loss.backward()  # DDP all-reduces at the last micro-batch
"""

import inspect
import os
import platform
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import UsageError
from support import checkpoint

# DDP's switch for syncing buffers at every forward: forward_sync_buffers from torch 2.13 on
NO_BUFFER_SYNC = next(k for k in ("forward_sync_buffers", "broadcast_buffers")
                      if k in inspect.signature(DDP).parameters)


# -----------------------------------------------------------------------------
# The processes of a job, and what they agree on

def launch_id():
    """This process's torchrun launch, as checkpoints record it (the run id, or machine:pid)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run is None:
        return None
    return run if run != "none" else f"none@{platform.node()}:{os.getppid()}"


def grouped():
    return dist.is_available() and dist.is_initialized()


def launch(world):
    """How this job was started, as a command to start it again."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == 1 and "RANK" not in os.environ:
        return "python"
    if local == world:
        return f"torchrun --standalone --nproc_per_node={world}"
    return (f"torchrun --nnodes={world // local} --nproc_per_node={local} "
            f"(and this job's rendezvous flags)")


def close():
    """End this process's process group, if it started one."""
    if grouped():
        dist.destroy_process_group()


def from_rank0(fn):
    """fn() on rank 0, its result or one-line error shared by every rank: one decision for all."""
    result, failed = None, None
    if not grouped() or dist.get_rank() == 0:
        try:
            result = fn()
        except UsageError as e:
            failed = e
    if grouped():
        shared = [result, None if failed is None else str(failed)]
        dist.broadcast_object_list(shared, src=0)
        result, failed = shared[0], failed or (shared[1] is not None and UsageError(shared[1]))
    if failed:
        raise failed
    return result


# -----------------------------------------------------------------------------
# How the model is spread: whole (one process, DDP) or sharded (FSDP2)

def spread_over(fsdp, distributed):
    """Sharded with --fsdp=true (support/sharded.py, imported only then), else Spread."""
    if not fsdp:
        return Spread()
    from support.sharded import Sharded
    return Sharded(distributed)


class Spread:
    """The whole model on every process: one process, or DDP under torchrun."""
    name = ""        # the startup line's word for it
    sharded = False  # it saves a whole checkpoint, ckpt.pt
    flag = ""        # what the command that resumes it adds

    def wrap(self, model, device, scratch):
        """(the model on its device, what trains: compiled, in DDP, with rank 0's weights)."""
        raw = model.to(device.name)
        model = torch.compile(raw) if device.compile else raw
        if grouped():  # no buffers to broadcast
            ids = [torch.device(device.name).index] if device.type == "cuda" else None
            model = DDP(model, device_ids=ids, **{NO_BUFFER_SYNC: False})
        return raw, model

    def sync(self, model, last):
        """DDP all-reduces gradients in backward: only at a step's last micro-batch."""
        if isinstance(model, DDP) and not last:
            return model.no_sync()
        return nullcontext()

    def save(self, out_dir, model, optimizer, master, state):
        """OUT_DIR/ckpt.pt, by rank 0: state (plain data), the model's and AdamW's state dicts."""
        if master:
            whole = {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint.save(whole, os.path.join(out_dir, checkpoint.CKPT))

    def load(self, resume, model, optimizer):
        """AdamW's state from the checkpoint (the model came with it)."""
        optimizer.load_state_dict(resume["optimizer"])
