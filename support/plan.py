"""
The plan of a training launch, per GPU, before it starts: `python train.py CONFIG --plan=true`.
Nothing is built: the figures are device.py's arithmetic, the same that refuses a run that cannot
fit. For --plan_gpus processes (default: WORLD_SIZE under torchrun, else 8) and GPUs of --gpu_memory
GiB it prints weights, gradients, optimizer state, working buffers and activations, with and
without --grad_checkpoint, under DDP and under FSDP (--fsdp=true), and whether each fits.
"""

import os

from support.device import GiB, memory, param_counts


def plan_gpus(given):
    """The process count to plan for: --plan_gpus, else torchrun's WORLD_SIZE, else one node of
    8."""
    return given if given is not None else int(os.environ.get("WORLD_SIZE", 8))


def plan(tc, cfg):
    """The plan's text for TrainConfig tc (batch_size, dtype, plan_gpus, gpu_memory) and model
    cfg."""
    n = plan_gpus(tc.plan_gpus)
    a = 4 if tc.dtype == "float32" else 2  # auto means bf16 autocast on the GPUs planned for
    P = param_counts(cfg)[0]
    tokens = tc.batch_size * cfg.block_size
    lines = [f"memory plan: {tc.model} layout {cfg.layout} scheme {cfg.scheme}, {P:,} params, "
             f"micro-batch {tc.batch_size} x {cfg.block_size} = {tokens:,} tokens, "
             f"{'float32' if a == 4 else 'bf16 autocast'}, "
             f"{n} GPU(s) of {tc.gpu_memory:g} GiB",
             f"{'GiB per GPU':<18}{'weights':>9}{'grads':>9}{'AdamW':>9}{'working':>9}"
             f"{'activ.':>9}{'total':>9}  fits"]
    for fsdp in (False, True):
        for ckpt in (False, True):
            m = memory(cfg, tc.batch_size, n, fsdp, ckpt, a)
            name = ("FSDP" if fsdp else "DDP") + (" + grad_ckpt" if ckpt else "")
            fits = "yes" if m["total"] <= tc.gpu_memory * GiB else "no"
            lines.append(f"{name:<18}" + "".join(f" {m[k] / GiB:>8.2f}" for k in
                                                  ("weights", "gradients", "optimizer", "working",
                                                   "activations", "total")) + f"  {fits}")
    lines.append("add the CUDA context and allocator slack (about 1-3 GiB); "
                 "torch.compile may save fewer activations")
    return "\n".join(lines)
