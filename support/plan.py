"""
The plan of a training launch: `python train.py CONFIG --plan=true`, from memory.py's arithmetic:
per GPU memory under DDP and FSDP, with and without --grad_checkpoint; the spread to take; days.
"""

import os

from configurator import UsageError
from support import pretrained
from support.device import PEAK_BF16_FLOPS, flops_per_token, resolve_dtype
from support.memory import GiB, check_slots, memory, param_counts
from support.resume import check_model, resume_from

GPUS = {"a100": (80, 312e12), "h100": (80, PEAK_BF16_FLOPS["NVIDIA H100"])}  # GiB, FLOP/s
# [choice] of each GPU's memory a plan leaves free: the CUDA context, the allocator's fragments,
# the activation estimate's error (within 25% of measured peaks: test_plan.py), compile's buffers
HEADROOM = 0.2
MFU = 0.4  # [choice] the model FLOPs utilisation the time assumes: a stated guess, not measured
SPREADS = [("DDP", False, False), ("DDP + grad_ckpt", False, True), ("FSDP", True, False),
           ("FSDP + grad_ckpt", True, True)]  # in the order a run prefers them (choose)


def choose(cfg, batch_size, n, gib, compute_bytes):
    """The spread a run should take, (name, fsdp, grad_checkpoint): the first of SPREADS within
    (1 - HEADROOM) of gib, or None."""
    room = (1 - HEADROOM) * gib * GiB
    return next((s for s in SPREADS
                 if memory(cfg, batch_size, n, *s[1:], compute_bytes)["total"] <= room), None)


def start(tc, given):
    """What a plan's model comes from, read as train.py would read it: a resume's checkpoint, a
    source to loop (vanilla:OUT_DIR or hf:PATH), or None (the flags' model)."""
    if tc.init_from == "resume":
        ckpt = resume_from(tc.out_dir, True)
        check_model(ckpt, given)  # another model's flags: refused, as the run refuses them
        return ckpt
    if tc.init_from != "scratch":
        found = pretrained.where(tc.init_from, tc.out_dir)
        return pretrained.source(found, given, weights=False)  # an hf: source's config alone


def plan(tc, cfg, ckpt=None):
    """Print the plan for TrainConfig tc and model cfg (a source's: looped as the flags say); a
    resume's time is that of the steps its checkpoint ckpt has left."""
    what = tc.model  # the preset's, or the source looped
    if tc.init_from not in ("scratch", "resume"):
        cfg, what = pretrained.looped(cfg, tc), tc.init_from
    if tc.init_from != "resume":  # as train.py refuses it
        check_slots(cfg, tc.n_slots)
    if tc.gpu not in GPUS and not (tc.gpu_memory and tc.gpu_tflops):
        raise UsageError(f"--gpu={tc.gpu} is not one of {', '.join(GPUS)}; name one, or give "
                         f"--gpu_memory=GIB and --gpu_tflops=TFLOPS")
    n = tc.plan_gpus or int(os.environ.get("WORLD_SIZE", 8))
    if tc.grad_accum and tc.grad_accum % n:  # as train.py refuses it on n processes
        raise UsageError(f"--grad_accum={tc.grad_accum} does not divide by the {n} GPU(s) "
                         f"planned for; use a multiple of {n}, or another --plan_gpus")
    gib, peak = GPUS.get(tc.gpu, (0, 0))
    gib, peak = tc.gpu_memory or gib, 1e12 * tc.gpu_tflops if tc.gpu_tflops else peak
    resolve_dtype(tc.dtype, "")  # refused as the run does
    a = 4 if tc.dtype == "float32" else 2  # auto means bf16 autocast on the GPUs planned for
    tokens = tc.batch_size * cfg.block_size
    name = "as given" if tc.gpu_memory or tc.gpu_tflops else tc.gpu
    lines = [f"plan: {what} layout {cfg.layout} scheme {cfg.scheme}, "
             f"{param_counts(cfg)[0]:,} params, micro-batch {tc.batch_size} x {cfg.block_size} = "
             f"{tokens:,} tokens, {'float32' if a == 4 else 'bf16 autocast'}, {n} GPU(s) of "
             f"{gib:g} GiB and {peak / 1e12:g} TFLOPS ({name})",
             f"{'GiB per GPU':<18}{'weights':>9}{'grads':>9}{'AdamW':>9}{'working':>9}"
             f"{'activ.':>9}{'total':>9}  fits"]
    chosen = choose(cfg, tc.batch_size, n, gib, a)
    for spread in SPREADS:
        m = memory(cfg, tc.batch_size, n, *spread[1:], a)
        lines.append(f"{spread[0]:<18}" + "".join(f" {v / GiB:>8.2f}" for v in m.values())
            + ("  yes" if m["total"] <= gib * GiB else "  no")
            + ("  <- the choice" if spread == chosen else ""))
    lines.append(f"the choice: the first within {1 - HEADROOM:.0%} of {gib:g} GiB (the rest: the "
                 f"CUDA context, the allocator, the estimate's error){'' if chosen else ': none'}")
    accum = tc.grad_accum or n  # not given: one micro-batch a process
    step = flops_per_token(cfg) * tokens * accum
    again = 4 / 3 if tc.grad_checkpoint else 1  # grad_ckpt: each block's forward runs again
    done = ckpt["iter_num"] if tc.init_from == "resume" else 0
    left = max(0, tc.max_iters - done)
    days = step * left * again / (n * peak * MFU) / 86400
    lines.append(f"time, as set: {step:.3g} FLOPs a step ({flops_per_token(cfg):.3g} a token), "
                 f"{left:,} steps" + (f" (of {tc.max_iters:,}, from iter {done})" if done else "")
                 + f": {days:,.1f} days on {n} GPU(s) at {MFU:.0%} MFU "
                 f"({days * 24 * n:,.0f} GPU-hours"
                 + (", x 4/3 for grad_ckpt's recompute)" if again > 1 else ")"))
    if os.environ.get("RANK", "0") == "0":  # torchrun's processes: one table
        print("\n".join(lines))
