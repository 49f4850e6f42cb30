"""
How the model is spread over the processes, one object whichever way: the whole model in one
process, or on every process under torchrun with DDP (which all-reduces the gradients): Spread;
or its weights, gradients and AdamW state sharded over the processes with FSDP2 (--fsdp=true):
fsdp.py's Sharded, which makes the same calls. train.py takes one at the start and never asks
which it is.

    spread = spread_over(tc, distributed, world)       # --fsdp: Sharded, else Spread
    raw_model, model = spread.wrap(model, device, tc, scratch=True)  # model: compiled, in DDP
    with spread.sync(model, last=...): loss.backward()  # gradients all-reduced at the last one
    spread.save(out_dir, raw_model, optimizer, master, state)  # OUT_DIR/ckpt.pt, by rank 0
    spread.load(ckpt, raw_model, optimizer)             # AdamW's state from a checkpoint
"""

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import UsageError
from support import checkpoint


def spread_over(tc, distributed, world):
    """How this launch spreads the model: Sharded with --fsdp=true (torchrun only), else Spread.
    Either way --grad_accum must share out evenly over the processes."""
    spread = Spread()
    if tc.fsdp:
        from support.fsdp import Sharded  # FSDP2, loaded only when asked for
        spread = Sharded(distributed)
    if tc.grad_accum % world:
        raise UsageError(f"--grad_accum={tc.grad_accum} does not divide by the world size "
                         f"{world}; use a multiple of {world}")
    return spread


class Spread:
    """The whole model on every process: one process, or DDP under torchrun."""
    name = ""                     # the startup line's word for it
    checkpoint = checkpoint.CKPT  # the file it saves, which a resume continues from
    flag = ""                     # what the command that resumes it adds

    def wrap(self, model, device, tc, scratch):
        """(the model on its device, what trains: compiled with --compile, under torchrun in DDP).
        DDP gives every process rank 0's weights when it wraps: a scratch model needs no more."""
        raw = model.to(device)
        model = torch.compile(raw) if tc.compile else raw
        if dist.is_initialized():  # no buffers to broadcast: the rotary tables are the same
            ids = [torch.device(device).index] if device.startswith("cuda") else None
            model = DDP(model, device_ids=ids, broadcast_buffers=False)
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
