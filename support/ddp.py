"""
The whole model on every process: how train.py holds it without --fsdp, in one process or under torchrun
with DDP (which all-reduces the gradients). fsdp.py offers the same calls for a model sharded over the
processes, wrap, sync, save and load, with NAME and CHECKPOINT; train.py picks one of the two once.

    raw_model, model = ddp.wrap(model, device, tc, scratch=True)  # model: compiled (--compile), in DDP
    with ddp.sync(model, last=...): loss.backward()               # gradients all-reduced at the last micro-batch
    ddp.save(out_dir, raw_model, optimizer, master, state)       # OUT_DIR/ckpt.pt, written by rank 0
"""

import inspect
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from support import checkpoint

NAME, CHECKPOINT = "", checkpoint.CKPT  # the startup line's word for it; the file a resume continues from
# DDP's switch for syncing buffers at every forward: forward_sync_buffers from torch 2.13 on (where
# broadcast_buffers, before it, warns of its deprecation at every launch)
NO_BUFFER_SYNC = next(k for k in ("forward_sync_buffers", "broadcast_buffers")
                      if k in inspect.signature(DDP).parameters)


def wrap(model, device, tc, scratch):
    """(the model on its device, what trains: compiled with --compile, under torchrun in DDP). DDP gives every
    process rank 0's weights when it wraps, so a scratch model needs nothing more."""
    raw = model.to(device)
    model = torch.compile(raw) if tc.compile else raw
    if dist.is_initialized():  # no buffers to sync: the rotary tables are the same on every rank
        model = DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None,
                    **{NO_BUFFER_SYNC: False})
    return raw, model


def sync(model, last):
    """DDP all-reduces gradients in backward: only at the last micro-batch of a step, not before it."""
    return model.no_sync() if isinstance(model, DDP) and not last else nullcontext()


def save(out_dir, model, optimizer, master, state):
    """OUT_DIR/ckpt.pt: state (the plain data) with the model's and AdamW's state dicts, by rank 0."""
    if master:
        checkpoint.save({**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                        os.path.join(out_dir, checkpoint.CKPT))


def load(resume, model, optimizer):
    """AdamW's state from the checkpoint (the model came with it)."""
    optimizer.load_state_dict(resume["optimizer"])
