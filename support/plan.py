"""
The memory plan of a training run, per GPU, before launch: `python train.py CONFIG --plan=true`.

Nothing is built: parameters are counted from the shapes (param_counts). check_fits uses the same
arithmetic to refuse, before anything is allocated, a run or a model that cannot fit. For
--plan_gpus processes (default: WORLD_SIZE under torchrun, else 8) and a GPU of --gpu_memory GiB,
it prints weights, gradients, optimizer state, working buffers and activations, with and without
--grad_checkpoint, under DDP and under FSDP (--fsdp=true), and whether each fits.

Bytes, with P the parameter count and n the number of processes:

    weights      4P           float32 master weights (autocast computes in bf16 from them)
    gradients    4P           float32
    optimizer    8P           AdamW's exp_avg and exp_avg_sq, float32
    working      DDP:  4P     the all-reduce buckets (DDP copies the gradients into them)
                       + 2P   under bf16 autocast: the bf16 copy of every weight kept for backward
                 FSDP: 4 P_root + 4 V D + 2 a P_block
                              the root unit (embedding, head, final LayerNorm, routers) gathered in
                              float32 for the whole step, the head's unsharded gradient (ready at
                              the start of backward, reduced at its end), and two blocks gathered
                              in the compute dtype (the one running and the one prefetched)
    activations  see activation_bytes
    FSDP divides weights, gradients and optimizer by n; DDP keeps all of them on every GPU.

The activation formula counts the tensors eager PyTorch's autograd saves for backward (measured
with torch.autograd.graph.saved_tensors_hooks on this model) and is checked against the measured
peak memory of train steps in test_plan.py. It does not model torch.compile: inductor fuses
elementwise operations and its partitioner recomputes cheap ones in backward instead of saving
them, so a compiled step saves fewer activations and the plan is an upper bound for it. bench.py
on CUDA measures a compiled step's peak and the same model's eager one; the GPU check holds the
plan to the eager peak (like with like) and shows the compiled one beside it.
"""

import os

from configurator import UsageError

GiB = 2**30


def activation_bytes(cfg, batch_size, grad_checkpoint=False, compute_bytes=4):
    """Peak activation memory of one micro-batch's forward and backward, in bytes.

    Per token (N = batch_size x block_size tokens), with D the width, H the heads, V the vocabulary,
    L the compute depth (a shared core counts once per application: each application saves its own
    activations), K loop steps, S buffer slots, a = compute_bytes (4 float32, 2 bf16) and r = 4 (the
    residual stream, LayerNorm statistics and the MeSH buffer stay float32 under autocast):

      block     r (D + H + 4) + 16 a D   the block's input, attention's logsumexp (H) and the two
                                          LayerNorms' mean and rstd, then 16 D in the compute dtype:
                                          LayerNorm outputs (2 D), qkv (3 D), rotated q and k (2 D),
                                          attention output and its reshape (2 D), fc and GELU (8 D)
      head      2 r D + 4 r V             ln_f's input and output; the logits and log-softmax, and
                                          at the start of backward their two gradients (float32:
                                          the loss is computed in float32)
      mesh      r (K + 1) (S D + D + 2 S) each of the K + 1 buffer states read (Eq. 5, S D), the
                                          routers' input and their two softmaxes (Eq. 3)
      backward  8 a D                     gradients in flight inside one block
                                          (fc's and GELU's outputs)

    Without --grad_checkpoint the peak is at the start of backward, when everything saved is still
    held and the head's gradients appear: L block + head + mesh + backward.
    With it, each block keeps only its input (r D) and backward recomputes one block at a time,
    after the head's gradients are gone (only the logits, r V, are still held by the caller):
    L r D + 2 r D + mesh + max(4 r V, r V + block + backward).
    Gradients of parameters are counted separately (gradients in memory())."""
    D, H, V, L = cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.shape.depth
    r, a = 4, compute_bytes
    block, backward = r * (D + H + 4) + 16 * a * D, 8 * a * D
    mesh = (r * (cfg.n_steps + 1) * (cfg.slots * D + D + 2 * cfg.slots) if cfg.scheme == "mesh"
            else 0)
    if grad_checkpoint:
        per_token = L * r * D + 2 * r * D + mesh + max(4 * r * V, r * V + block + backward)
    else:
        per_token = L * block + 2 * r * D + 4 * r * V + mesh + backward
    return batch_size * cfg.block_size * per_token


def param_counts(cfg):
    """(all parameters, the root unit's own (outside every block), one block's), from the shapes
    alone: nothing is built, so a size no machine could hold is counted as fast as a small one
    (test_plan.py checks the formula against built models). A GPT-NeoX block: two LayerNorms (2D
    each), qkv (3D^2 + 3D), attention's output (D^2 + D), fc (4D^2 + 4D), proj (4D^2 + D). The
    root: wte and the untied lm_head (V D each), ln_f (2D), and MeSH's router pairs
    (two Linear(D, S) each; Table 5: K+1, or K with cycle=direct)."""
    D, V, S = cfg.n_embd, cfg.vocab_size, cfg.slots
    block = 12 * D * D + 13 * D
    pairs = cfg.n_steps + (cfg.cycle == "routed") if cfg.scheme == "mesh" else 0
    root = 2 * V * D + 2 * D + pairs * 2 * (D * S + S)
    return cfg.shape.unique * block + root, root, block


def check_fits(cfg, batch_size, device, compute_bytes=4, n=1, fsdp=False, grad_checkpoint=False,
               what="this model", fix="choose a smaller one"):
    """Refuse, before anything is built or written, a training run (memory(), per process) or, with
    batch_size=None, a model alone (its weights twice: a state dict and the model it is loaded
    into) that needs more than the device holds (support/memory.py; unknown: no check). Returns
    cfg."""
    from support.memory import device_memory
    total = device_memory(device)
    P = param_counts(cfg)[0]
    need = 8 * P if batch_size is None else \
        memory(cfg, batch_size, n, fsdp, grad_checkpoint, compute_bytes, ddp=n > 1)["total"]
    if total and need > total:
        where = device if str(device).startswith("cuda") else "this machine"
        batch = f", micro-batch {batch_size} x {cfg.block_size}" if batch_size else ""
        raise UsageError(f"{what} (layout {cfg.layout}, n_embd {cfg.n_embd}, "
                         f"{P:,} parameters{batch}) needs about {need / GiB:,.1f} GiB, "
                         f"more than the {total / GiB:,.1f} GiB of {where}; {fix}")
    return cfg


def check_run(cfg, tc, device, world):
    """check_fits for train.py's run: TrainConfig tc on device, over world processes."""
    return check_fits(cfg, tc.batch_size, device, 2 if tc.dtype == "bfloat16" else 4, world,
                      tc.fsdp, tc.grad_checkpoint, "the run",
                      "use smaller settings (--plan=true shows where it goes)")


def memory(cfg, batch_size, n, fsdp, grad_checkpoint, compute_bytes, ddp=True):
    """{weights, gradients, optimizer, working, activations, total} in bytes per GPU (see the
    module doc); ddp=False: one process without DDP (bench.py), so without the all-reduce
    buckets."""
    P, root, block = param_counts(cfg)
    share = n if fsdp else 1
    out = dict(weights=4 * P / share, gradients=4 * P / share, optimizer=8 * P / share)
    if fsdp:
        out["working"] = 4 * root + 4 * cfg.vocab_size * cfg.n_embd + 2 * compute_bytes * block
    else:
        out["working"] = 4 * P * ddp + (2 * P if compute_bytes == 2 else 0)
    out["activations"] = activation_bytes(cfg, batch_size, grad_checkpoint, compute_bytes)
    out["total"] = sum(out.values())
    return out


def plan_gpus(given):
    """The process count to plan for: --plan_gpus, else torchrun's WORLD_SIZE, else one node
    of 8."""
    return given if given is not None else int(os.environ.get("WORLD_SIZE", 8))


def plan(tc, cfg):
    """The plan's text for TrainConfig tc (its batch_size, dtype, plan_gpus, gpu_memory) and model
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
