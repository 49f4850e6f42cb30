"""
What fits in memory: the machine's or GPU's memory, and the arithmetic that refuses a run, a model
or a decode that cannot fit before anything is allocated (plan.py prints the same figures).

    check_fits(cfg, batch_size, "cuda:0")      # UsageError where it needs more than the GPU has
    check_run(cfg, tc, device, world)          # train.py's run, on its Device

Bytes of a training step, with P the parameter count and n the processes (FSDP divides weights,
gradients and AdamW by n; DDP keeps all of them on every GPU):

    weights      4P           float32 master weights (autocast computes in bf16 from them)
    gradients    4P           float32
    optimizer    8P           AdamW's exp_avg and exp_avg_sq, float32
    working      DDP:  4P     all-reduce buckets (n > 1), + 2P under bf16 autocast (weight copies)
                 FSDP: 4 P_root + 4 V D + 2 a P_block: the root unit gathered for the whole
                              step, the head's unsharded gradient, two blocks gathered in the
                              compute dtype
    activations  activation_bytes: what eager autograd saves (measured with saved_tensors_hooks and
                 checked against measured peaks in test_plan.py); torch.compile saves fewer, so for
                 a compiled step this is an upper bound
"""

import contextlib
import os
import sys
from pathlib import Path

import torch

from configurator import UsageError

GiB = 2**30
# this process's cgroups ("/" in a container, deeper in a Slurm job) and their folder
CGROUP = ("/proc/self/cgroup", "/sys/fs/cgroup")


def cgroup_limits():
    """The memory limit files (v2, v1: "max" or a huge v1 value if none) of this process's
    cgroups and each one above."""
    with contextlib.suppress(OSError):  # none: no cgroups
        for line in Path(CGROUP[0]).read_text().splitlines():
            names, _, path = line.partition(":")[2].partition(":")
            v1 = "memory" in names.split(",")  # else v2 (""), or another v1 controller
            folder = Path(CGROUP[1], "memory" if v1 else "")
            for part in path.split("/") if v1 or not names else ():
                folder /= part
                yield folder / ("memory.limit_in_bytes" if v1 else "memory.max")


def physical_memory():
    """This machine's memory in bytes (its cgroups' limit if lower: a container's, a job's), or
    None where it cannot be told."""
    try:
        if sys.platform == "win32":
            import ctypes

            class Status(ctypes.Structure):
                _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong)] + [
                    (n, ctypes.c_ulonglong) for n in "total free pt pf vt vf ve".split()]
            status = Status(length=ctypes.sizeof(Status))
            ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
            return status.total
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        for path in cgroup_limits():
            with contextlib.suppress(OSError):  # none there, or unreadable: no limit known
                limit = path.read_text().strip()
                total = min(total, int(limit) if limit.isdigit() else total)
        return total
    except (AttributeError, OSError, ValueError):
        return None


def device_memory(device):
    """(bytes, name): a CUDA GPU's memory; for cpu and mps (whose GPU shares it) the machine's,
    split among the processes torchrun started on it (on CUDA each has its own GPU)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(device).total_memory, device
    n, total = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), physical_memory()
    if n == 1 or not total:
        return total, "this machine"
    return total // n, f"this machine per process ({n} share it)"


def activation_bytes(cfg, batch_size, grad_checkpoint=False, compute_bytes=4):
    """Peak activation memory of one micro-batch's forward and backward, in bytes.

    Per token, with D the width, H the heads, V the vocabulary, L the compute depth (each
    application of a shared core saves its own), K loop steps, S slots, a = compute_bytes (4
    float32, 2 bf16) and r = 4 (the residual stream, LayerNorm statistics and the MeSH buffer stay
    float32 under autocast):

      block     r (D + H + 4) + 16 a D   the block's input, attention's logsumexp (H), the two
                                          LayerNorms' statistics; LayerNorm outputs (2 D), qkv
                                          (3 D), rotated q, k (2 D), attention output (2 D), fc
                                          and GELU (8 D) in the compute dtype
      head      2 r D + 4 r V             ln_f's input and output; the logits, log-softmax and, at
                                          the start of backward, their two gradients
      mesh      r (K + 1) (S D + D + 2 S) each buffer state read (Eq. 5), the routers' input and
                                          their two softmaxes (Eq. 3)
      backward  8 a D                     gradients in flight inside one block

    Without --grad_checkpoint the peak is at the start of backward: L block + head + mesh +
    backward. With it each block keeps only its input and backward recomputes one at a time, after
    the head's gradients are gone: L r D + 2 r D + mesh + max(4 r V, r V + block + backward)."""
    D, H, V, L, S = cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.shape.depth, cfg.slots
    r, a = 4, compute_bytes
    block, backward = r * (D + H + 4) + 16 * a * D, 8 * a * D
    mesh = r * (cfg.n_steps + 1) * (S * D + D + 2 * S) if cfg.scheme == "mesh" else 0
    if grad_checkpoint:
        per_token = L * r * D + 2 * r * D + mesh + max(4 * r * V, r * V + block + backward)
    else:
        per_token = L * block + 2 * r * D + 4 * r * V + mesh + backward
    return batch_size * cfg.block_size * per_token


def param_counts(cfg):
    """(all parameters, the root unit's own (outside every block), one block's), from the shapes
    alone (test_plan.py checks them against built models). A block: two LayerNorms (2D each), qkv
    (3D^2 + 3D), attention's output (D^2 + D), fc (4D^2 + 4D), proj (4D^2 + D). The root: wte and
    lm_head (V D each), ln_f (2D), MeSH's router pairs (Table 5: K+1, or K with cycle=direct)."""
    D, V, S = cfg.n_embd, cfg.vocab_size, cfg.slots
    block = 12 * D * D + 13 * D
    pairs = cfg.n_steps + (cfg.cycle == "routed") if cfg.scheme == "mesh" else 0
    root = 2 * V * D + 2 * D + pairs * 2 * (D * S + S)
    return cfg.shape.unique * block + root, root, block


def memory(cfg, batch_size, n, fsdp, grad_checkpoint, compute_bytes):
    """{weights, gradients, optimizer, working, activations, total} in bytes per GPU (the module's
    table); n = 1: one process, without DDP, so without its all-reduce buckets."""
    P, root, block = param_counts(cfg)
    share = n if fsdp else 1
    out = dict(weights=4 * P / share, gradients=4 * P / share, optimizer=8 * P / share)
    out["working"] = (4 * root + 4 * cfg.vocab_size * cfg.n_embd + 2 * compute_bytes * block
                      if fsdp else 4 * P * (n > 1) + (2 * P if compute_bytes == 2 else 0))
    out["activations"] = activation_bytes(cfg, batch_size, grad_checkpoint, compute_bytes)
    out["total"] = sum(out.values())
    return out


def check_fits(cfg, batch_size, device, compute_bytes=4, n=1, fsdp=False, grad_checkpoint=False,
               what="this model", fix="choose a smaller one"):
    """Refuse, before anything is built or written, a training run (memory(), per process) or,
    with batch_size=None, a model alone (its weights twice: a state dict and the model it is loaded
    into) that needs more than the device holds (unknown: no check). Returns cfg."""
    total, where = device_memory(device)
    P = param_counts(cfg)[0]
    need = 8 * P if batch_size is None else \
        memory(cfg, batch_size, n, fsdp, grad_checkpoint, compute_bytes)["total"]
    if total and need > total:
        batch = f", micro-batch {batch_size} x {cfg.block_size}" if batch_size else ""
        raise UsageError(f"{what} (layout {cfg.layout}, n_embd {cfg.n_embd}, "
                         f"{P:,} parameters{batch}) needs about {need / GiB:,.1f} GiB, "
                         f"more than the {total / GiB:,.1f} GiB of {where}; {fix}")
    return cfg


def check_slots(cfg, n_slots):
    """Refuse a --n_slots that cfg's scheme ignores."""
    if cfg.scheme != "mesh" and n_slots is not None:
        raise UsageError(f"--n_slots is a MeSH setting, but scheme "
                         f"is {cfg.scheme!r}; drop it or use --scheme=mesh")


def check_run(cfg, tc, device, world):
    """check_fits for train.py's run: TrainConfig tc on the Device device, over world processes;
    a --n_slots its scheme ignores is refused (a resume's is saved: kept)."""
    if tc.init_from != "resume":
        check_slots(cfg, tc.n_slots)
    return check_fits(cfg, tc.batch_size, device.name, 2 if device.dtype == "bfloat16" else 4,
                      world, tc.fsdp, tc.grad_checkpoint, "the run",
                      "use smaller settings (--plan=true shows where it goes)")
