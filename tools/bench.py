"""
Speed of every state-passing scheme, side by side, on whatever device this runs on.

    python tools/bench.py            # classroom preset, all six variants, ~2 min on 2 CPU cores
    python tools/bench.py --model=pythia-70m --layout=1+2R2+1 --block_size=256 --batch_size=8 \
        --iters=5
    python tools/bench.py --compile=true --layout=1+1R2+1 --json=bench.jsonl
    python tools/bench.py --profile=true --decode=false  # also where a CPU train step's time goes

The variants share one compute depth: `vanilla` runs the layout's compute depth as one unshared
stack, the others run --layout with their scheme. For each: train-step time (forward, backward,
AdamW; no clipping), its ratio to vanilla's and to base's (paired per round), tokens/s, achieved
FLOP/s and its share of the device's peak, the peak memory of a train step, and greedy decode speed
with and without the KV cache (generate() as sample.py runs it: 200 new tokens after a 56-token
prompt, batch 1, block_size max(--block_size, 256), no autocast). Sizes take the same presets and
flags as train.py. Prints a Markdown table; --json=FILE also appends one JSON line per variant plus
one for the machine and its peak.
With --compile, training and decoding both run compiled; "recompiles" counts the graphs built
after warm-up (torch._dynamo's counters), which should be 0. With --profile (CPU), torch.profiler
then watches more train steps (PROFILE_ROUNDS rounds that interleave the variants, PROFILE_STEPS
steps each): the share of their time spent in matmuls (mm, addmm, bmm, baddbmm: the operators' own
time) and in attention (the SDPA operators), and the matmuls' FLOP/s there as a share of the peak:
where a step's FLOP/s go.

FLOPs per token (device.flops_per_token, nanoGPT / PaLM accounting), the same for every variant:
    6 * (L * (12 D^2 + 13 D) + D * V) + 12 * L * D * T
L the compute depth (a shared core counts once per application, so this is the unrolled vanilla
model's count), D * V the lm_head, 12 L D T the attention scores and values over the full T x T
(causal masking not discounted). MeSH routers (under 0.5% of it) are not counted.

Peak: on CPU, a 2048 x 2048 fp32 matmul timed once per round between the train steps, so the peak
sees the same load as the steps (median over rounds); on GPUs, the chip's dense bf16 peak from
device.peak_bf16_flops (a measured matmul in --dtype where the chip is not listed or runs float32).
Memory: on CPU, each variant runs 3 train steps in a fresh process (one at a time) and its peak
resident set while stepping (VmHWM) is read; on CUDA, after the timed rounds, one more train step
in this process, with the allocator's peak reset before it, so nothing is compiled a second time
(the allocator counts every tensor exactly; what other variants hold stays constant meanwhile).
"step MB" is what a train step adds to what was held before it; the CUDA peak is that plus the
variant's own weights, buffers and AdamW state. "plan MB" is device.py's estimate of the peak for
the same shape, of eager PyTorch's saved activations (tensors only: on CPU the resident set also
holds the process itself, some 300 MB). With --compile on CUDA, "eager peak MB" is the same step
through the model's uncompiled forward (model.forward, which bypasses the compiled call): the
figure the plan models, beside the compiled one (inductor saves fewer activations and recomputes
some).
"warm-up s" is the warm-up steps' time, compilation included (with --compile, "graphs" the graphs
built meanwhile).
Timing: rounds interleave the variants (one step each, order rotated), medians over rounds, so a
busy machine slows all variants alike; the table reports how many CPUs other processes kept busy
meanwhile (Linux /proc/stat minus this process's own CPU time). Decoding is timed the same way once
the training models are freed: 3 rounds, each decoding with and without the cache for every variant;
the speedup is paired per round. Where the system has no /proc and no resource module (Windows), the
table says which of these it could not measure.
"""

import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from statistics import median

import torch
from torch._dynamo.utils import counters

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, closest, setting  # noqa: E402
from mesh import PRESETS, SCHEMES, Config, ConfigError, RecursiveGPT  # noqa: E402
from support import command, device as devices, files  # noqa: E402
from support.device import (machine_name, peak_bf16_flops, resolve_device,  # noqa: E402
                            resolve_dtype)

VARIANTS = ("vanilla", *SCHEMES)  # vanilla: the layout's compute depth as one unshared stack
NOTES = f"presets: {', '.join(PRESETS)}\nvariants: {', '.join(VARIANTS)}"
PROMPT, NEW_TOKENS, DECODE_BLOCK = 56, 200, 256
PROFILE_ROUNDS, PROFILE_STEPS = 3, 3
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


@dataclass
class BenchConfig:
    """Settings of a bench run; model fields left at None take the preset's value."""
    model: str = setting("classroom", "a preset of mesh.PRESETS (listed below)")
    layout: str | None = setting(
        None, "the recursive layout; vanilla runs its compute depth as one stack")
    n_embd: int | None = setting(None, "width D")
    n_head: int | None = setting(None, "attention heads")
    block_size: int | None = setting(None, "training context T")
    vocab_size: int | None = setting(
        None, "None: the preset's (65 characters for classroom, 50304 for Pythia)")
    n_slots: int | None = setting(None, "mesh buffer slots; None means K+3")
    batch_size: int = setting(16, "sequences per train step")
    schemes: str = setting(",".join(VARIANTS), "comma-separated variants to run")
    device: str = setting("auto", "auto: cuda, then mps, then cpu")
    dtype: str = setting("auto", "auto: bfloat16 autocast on GPUs that support it, else float32")
    threads: int | None = setting(
        None, "CPU threads for torch; None keeps torch's default (one per core)")
    compile: bool = setting(False, "torch.compile every model (training and decoding)")
    grad_checkpoint: bool = setting(
        False, "recompute block activations in backward (as train.py's flag)")
    iters: int = setting(20, "timed rounds; a round times one train step of every variant")
    warmup: int = setting(3, "untimed steps per variant first")
    decode: bool = setting(True, "also time decoding, with and without the KV cache")
    profile: bool = setting(
        False, "also profile train steps (CPU): time share of matmuls and attention")
    json: str | None = setting(None, "append JSON lines to this file", path=True)
    seed: int = setting(1337, "the initial weights and the random batch")


def variants(bc):
    """[(name, Config)] for the requested variants, all at the layout's compute depth."""
    names = [s.strip() for s in bc.schemes.split(",") if s.strip()]
    for n in names:
        if n not in VARIANTS:
            raise UsageError(f"unknown scheme {n!r} in --schemes{closest(n, VARIANTS)}; expected "
                             f"some of {', '.join(VARIANTS)}")
    if not names:
        raise UsageError(f"--schemes is empty; name some of {', '.join(VARIANTS)}")
    try:
        cfg = Config.from_preset(bc.model, layout=bc.layout, n_embd=bc.n_embd, n_head=bc.n_head,
                                 block_size=bc.block_size, vocab_size=bc.vocab_size,
                                 n_slots=bc.n_slots, scheme="base")
        if not cfg.shape.schedule and set(names) - {"vanilla", "base"}:
            raise UsageError(f"layout {cfg.layout!r} has no loop steps, so only vanilla and base "
                             f"apply; pass a recursive --layout such as 1+2R2+1, or "
                             f"--schemes=vanilla,base")
        vanilla = dict(layout=str(cfg.shape.depth), scheme="base")
        return [(n, Config(**{**cfg.to_dict(), **(vanilla if n == "vanilla" else dict(scheme=n))}))
                for n in names]
    except ConfigError as e:  # a size, layout or scheme the model cannot take, in mesh.py's words
        raise UsageError(str(e)) from None


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # this GPU's queue (with --device=cuda:1, not GPU 0's)
    elif device == "mps":
        torch.mps.synchronize()


def graphs():
    """Graphs torch.compile has built so far in this process; any growth after warm-up is a
    recompile."""
    return counters["stats"]["unique_graphs"]


def matmul_flops(a, b, device):
    """FLOP/s of one square matmul a @ b (2 n^3 FLOPs)."""
    sync(device)
    t0 = time.perf_counter()
    a @ b
    sync(device)
    return 2 * a.size(0) ** 3 / (time.perf_counter() - t0)


def rotated(names, r):
    """The variants in round r's order: rotated by r, so no variant always runs first (or right
    after another)."""
    return names[r % len(names):] + names[: r % len(names)]


def profile_steps(step, steps=PROFILE_STEPS):
    """Run step() once, then `steps` times under torch.profiler -> seconds of those steps: wall
    (timed around step() alone, so not the profiler's bookkeeping between steps), matmul and
    attention (the operators' own time: an addmm's bias copy is not matmul time), and matmul_flops,
    as the profiler counts them (2 m n k per product). The first step only warms the profiler up."""
    P = torch.profiler
    wall = 0.0
    with P.profile(activities=[P.ProfilerActivity.CPU], with_flops=True, acc_events=True,
                   schedule=P.schedule(wait=0, warmup=1, active=steps)) as prof:
        for i in range(1 + steps):
            t0 = time.perf_counter()
            step()
            wall += time.perf_counter() - t0 if i else 0.0
            prof.step()
    events = prof.key_averages()  # times in microseconds
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    attention = sum(e.self_cpu_time_total for e in events if "scaled_dot_product" in e.key)
    return dict(wall=wall, matmul=matmul * 1e-6, attention=attention * 1e-6,
                matmul_flops=sum(e.flops for e in events if e.key in MATMULS))


def build(cfg, bc, device):
    """Model (compiled in place with --compile, so generate() decodes with the compiled forward) and
    AdamW."""
    torch.manual_seed(bc.seed)
    model = RecursiveGPT(cfg).to(device)
    model.grad_checkpoint = bc.grad_checkpoint
    if bc.compile:
        model.compile()
    return model, model.configure_optimizer(0.01, 1e-3, device_type=device.split(":")[0])


def train_step(model, opt, x, y, autocast, eager=False):
    """One AdamW step; eager=True runs a compiled model's original forward (model.forward skips the
    compiled call that model(...) makes), so its memory can be measured without compiling again."""
    with autocast:
        _, loss = (model.forward if eager else model)(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def setup(bc):
    """Settings -> (device, torch dtype, autocast context); also what every process (children too)
    sets."""
    device = resolve_device(bc.device)
    dtype = bc.dtype = resolve_dtype(bc.dtype, device)
    if bc.threads is not None:
        torch.set_num_threads(bc.threads)
    # every variant's graphs share RecursiveGPT's code object
    torch._dynamo.config.recompile_limit = 64
    bf16 = dtype == "bfloat16"
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if bf16 else nullcontext()
    return device, getattr(torch, dtype), autocast


def memory_mb(device, peak):
    """This process's memory in MB, peak or current: the CUDA allocator's, else the resident set
    (VmHWM / VmRSS; without /proc, ru_maxrss, which is always the peak); None where neither can be
    read (Windows)."""
    if device.startswith("cuda"):
        allocated = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
        return allocated(device) / 2**20
    try:  # not ru_maxrss: Linux carries the parent's resident set at fork over into it
        key = "VmHWM:" if peak else "VmRSS:"
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key)) / 2**10
    except (OSError, StopIteration):
        pass
    try:
        import resource
    except ImportError:
        return None
    unit = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / unit


def peak_memory(cfg, bc, conn):
    """In a fresh process: build, then 3 train steps (AdamW's state exists after the first) -> MB
    (peak while stepping, and how much of it the steps add to what the model and optimizer hold)."""
    device, _, autocast = setup(bc)
    model, opt = build(cfg, bc, device)
    x = torch.randint(cfg.vocab_size, (2, bc.batch_size, cfg.block_size), device=device)
    sync(device)
    built = memory_mb(device, peak=False)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # restart the peak at the current resident set (Linux), so the peak is the steps' own
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    for _ in range(3):
        train_step(model, opt, x[0], x[1], autocast)
    sync(device)
    peak = memory_mb(device, peak=True)
    conn.send((peak, None if peak is None else peak - built))


def held_bytes(model, opt):
    """Bytes a model and its optimizer hold between steps: weights, buffers and optimizer state."""
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    tensors = [*model.parameters(), *model.buffers(), *state]
    return sum(t.numel() * t.element_size() for t in tensors)


def cuda_peak_mb(model, opt, x, y, autocast, device, eager=False):
    """On CUDA, in this process: (MB of the variant's peak, MB its train step adds). The step's
    part is the allocator's peak during one step less what was allocated before it; the peak adds
    held_bytes."""
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    train_step(model, opt, x, y, autocast, eager)
    sync(device)
    step = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return held_bytes(model, opt) / 2**20 + step, step


def in_fresh_process(fn, *args):
    """fn(*args, conn) in a new interpreter (spawn, not fork: nothing of this process's memory comes
    along); returns what it sends, or (None, None) if it dies. Stopped meanwhile (a signal), the
    child ends first."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=in_child, args=(fn, *args, send))
    child.start()
    send.close()  # so that a child that dies reads as EOF here
    try:
        return recv.recv()
    except EOFError:
        return None, None
    except BaseException:  # Ctrl-C, SIGTERM: the measurement is dropped with the child
        child.terminate()
        raise
    finally:
        child.join()


def in_child(fn, *args):
    """A fresh process's start: the terminal's Ctrl-C is the parent's to answer (it ends this
    child)."""
    command.ignore_ctrl_c()
    fn(*args)


@torch.no_grad()
def decode_speeds(models, device, bc, reps=3):
    """{name: (new tokens/s of greedy generate() with the KV cache, without, speedup, graphs built
    while timed)}. Like the train steps, rounds interleave the variants (order rotated) and each
    round times every variant with and without the cache, so a slow spell of the machine slows all
    alike; the speedup is paired per round, medians over rounds."""
    vocab_size = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(vocab_size, (1, PROMPT), device=device)
    for model in models.values():
        model.eval()
        for use_cache in (True, False):  # warm-up; compiled models see every shape they will meet
            model.generate(prompt, NEW_TOKENS if bc.compile else 8, temperature=0,
                           use_cache=use_cache)
    times = {name: {True: [], False: []} for name in models}
    built = dict.fromkeys(models, 0)
    names = list(models)
    for r in range(reps):
        for name in rotated(names, r):
            for use_cache in (True, False):
                before = graphs()
                sync(device)
                t0 = time.perf_counter()
                models[name].generate(prompt, NEW_TOKENS, temperature=0, use_cache=use_cache)
                sync(device)
                times[name][use_cache].append(time.perf_counter() - t0)
                built[name] += graphs() - before
    return {name: (NEW_TOKENS / median(t[True]), NEW_TOKENS / median(t[False]),
                   median(full / cached for cached, full in zip(t[True], t[False])), built[name])
            for name, t in times.items()}


def cpu_seconds():
    """(CPU seconds all processes have spent busy, or None without Linux's /proc/stat; of which this
    process and its finished children)."""
    own = sum(os.times()[:4])  # user and system time, this process's and its children's
    try:
        # cpu user nice system idle iowait irq softirq ... in clock ticks
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:8]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own
    except (OSError, ValueError):
        return None, own


def run(bc):
    device, dtype, autocast = setup(bc)
    cuda = device.startswith("cuda")
    todo = variants(bc)
    cfg0 = todo[0][1]
    B, T = bc.batch_size, cfg0.block_size
    torch.manual_seed(bc.seed)
    x, y = torch.randint(cfg0.vocab_size, (2, B, T), device=device)
    for name, cfg in todo:  # each refused before anything is built where its train step cannot fit
        devices.check_fits(cfg, B, device, 2 if dtype == torch.bfloat16 else 4,
                           what=f"scheme {name}", fix="use smaller settings")
    models = {name: build(cfg, bc, device) for name, cfg in todo}
    print(f"bench.py: timing {len(models)} variant(s), {bc.warmup} warm-up step(s) and "
          f"{bc.iters} round(s) each", file=sys.stderr, flush=True)

    # ---- training: warm-up (with --compile, compilation: timed, its graphs counted), then rounds
    # that interleave the variants and the peak matmul
    warm = {}
    for name in models:
        before = graphs()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(bc.warmup):
            train_step(*models[name], x, y, autocast)
        sync(device)
        warm[name] = time.perf_counter() - t0, graphs() - before
    steps = {name: [] for name in models}
    recompiles = dict.fromkeys(models, 0)
    side = 8192 if cuda else 2048
    mm = torch.randn(2, side, side, device=device, dtype=dtype).unbind(0)
    matmul_flops(*mm, device)  # warm-up
    peaks = []
    names = list(models)
    (busy0, own0), t_start = cpu_seconds(), time.perf_counter()
    for r in range(bc.iters):
        if not cuda:
            peaks.append(matmul_flops(*mm, device))
        for name in rotated(names, r):
            before = graphs()
            sync(device)
            t0 = time.perf_counter()
            train_step(*models[name], x, y, autocast)
            sync(device)
            steps[name].append(time.perf_counter() - t0)
            recompiles[name] += graphs() - before
    (busy1, own1), elapsed = cpu_seconds(), time.perf_counter() - t_start
    profiles = {}
    # after the timed rounds, which the profiler's own overhead would slow; rounds again, summed
    if bc.profile:
        profiles = {name: Counter() for name in names}
        for r in range(PROFILE_ROUNDS):
            for name in rotated(names, r):
                profiles[name].update(profile_steps(
                    lambda: train_step(*models[name], x, y, autocast)))
    others = None  # CPUs other processes kept busy
    if busy0 is not None:
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed
    spec = peak_bf16_flops(device, bc.dtype)
    if spec:
        peak, peak_source = spec, "spec sheet, dense bf16"
    elif cuda:
        peak = median(matmul_flops(*mm, device) for _ in range(5))
        peak_source = f"measured {bc.dtype} 8192^2 matmul"
    else:
        peak = median(peaks)
        peak_source = (f"measured {bc.dtype} 2048^2 matmul, median of {len(peaks)} rounds between "
                       f"the steps")

    rows = []
    for name, cfg in todo:
        ms = 1000 * median(steps[name])
        fpt = devices.flops_per_token(cfg)
        row = dict(kind="variant", variant=name, scheme=cfg.scheme, layout=cfg.layout,
                   compute_depth=cfg.shape.depth,
                   non_embedding_params=models[name][0].num_params(),
                   n_slots=cfg.slots if cfg.scheme == "mesh" else None,
                   n_embd=cfg.n_embd, n_head=cfg.n_head, vocab_size=cfg.vocab_size, block_size=T,
                   batch_size=B, device=device, dtype=bc.dtype, compile=bc.compile,
                   ms_per_step=ms, tokens_per_s=B * T / ms * 1000,
                   flops_per_token=fpt, flops_per_s=fpt * B * T / ms * 1000,
                   warmup_s=warm[name][0], warmup_graphs=warm[name][1] if bc.compile else None)
        row["peak_fraction"] = row["flops_per_s"] / peak
        if name in profiles:
            p = profiles[name]
            row.update(matmul_share=p["matmul"] / p["wall"],
                       attention_share=p["attention"] / p["wall"],
                       matmul_peak_fraction=p["matmul_flops"] / p["matmul"] / peak)
        # paired per round: both steps ran moments apart, under the same load
        for ref in ("vanilla", "base"):
            if ref in steps:
                row[f"time_vs_{ref}"] = median(a / b for a, b in zip(steps[name], steps[ref]))
        if cuda:  # here, so nothing compiles twice; where compiled, eager too (the plan's like)
            row["peak_mb"], row["step_mb"] = cuda_peak_mb(*models[name], x, y, autocast, device)
            if bc.compile:
                eager = cuda_peak_mb(*models[name], x, y, autocast, device, eager=True)
                row["eager_peak_mb"], row["eager_step_mb"] = eager
        else:
            row["peak_mb"], row["step_mb"] = in_fresh_process(peak_memory, cfg, bc)
        compute_bytes = 2 if bc.dtype == "bfloat16" else 4
        planned = devices.memory(cfg, B, 1, False, bc.grad_checkpoint, compute_bytes, ddp=False)
        row["plan_mb"] = planned["total"] / 2**20  # train.py --plan=true's estimate of peak_mb
        row["memory"] = ("CUDA allocator peak, in this process" if cuda else
                         "peak resident set of a fresh process")
        rows.append(row)
        # the last reference: decoding below runs with no training model or optimizer left
        del models[name]

    # ---- decoding (after the training models are freed): rounds interleave the variants again
    if bc.decode:
        block = dict(block_size=max(T, DECODE_BLOCK))
        speeds = decode_speeds({name: build(Config(**{**cfg.to_dict(), **block}), bc, device)[0]
                                for name, cfg in todo}, device, bc)
        for row in rows:
            cached, full, speedup, built = speeds[row["variant"]]
            row.update(decode_tok_s_cache=cached, decode_tok_s_no_cache=full,
                       decode_speedup=speedup)
            recompiles[row["variant"]] += built
    for row in rows:
        row["recompiles"] = recompiles[row["variant"]] if bc.compile else None

    info = dict(kind="machine", torch=torch.__version__, device=device,
                device_name=machine_name(device), threads=torch.get_num_threads(),
                peak_flops=peak, peak_source=peak_source,
                cpus=os.cpu_count(), other_processes_cpus=others, settings=dataclasses.asdict(bc))
    return rows, info


def table(rows, info):
    """A Markdown table, one row per variant; columns that the run did not measure are left out."""
    mem = "CUDA peak MB" if info["device"].startswith("cuda") else "peak RSS MB"
    cols = [("variant", "variant", "s"), ("layout", "layout", "s"),
            ("non-emb params", "non_embedding_params", ",d"),
            ("ms/step", "ms_per_step", ".1f"), ("vs vanilla", "time_vs_vanilla", ".3f"),
            ("vs base", "time_vs_base", ".3f"),
            ("tok/s", "tokens_per_s", ",.0f"), ("GFLOP/s", "flops_per_s", ".1f"),
            ("% of peak", "peak_fraction", ".1f"),
            ("% matmul", "matmul_share", ".0f"),
            ("matmul % of peak", "matmul_peak_fraction", ".0f"),
            ("% attention", "attention_share", ".0f"), (mem, "peak_mb", ".0f"),
            ("step MB", "step_mb", ".1f"), ("eager peak MB", "eager_peak_mb", ".0f"),
            ("plan MB", "plan_mb", ".0f"), ("decode tok/s, cache", "decode_tok_s_cache", ".0f"),
            ("no cache", "decode_tok_s_no_cache", ".0f"), ("speedup", "decode_speedup", ".2f"),
            ("warm-up s", "warmup_s", ".1f"), ("graphs", "warmup_graphs", "d"),
            ("recompiles", "recompiles", "d")]
    cols = [c for c in cols if any(r.get(c[1]) is not None for r in rows)]
    percent = ("peak_fraction", "matmul_share", "matmul_peak_fraction", "attention_share")
    scale = {"flops_per_s": 1e-9, **dict.fromkeys(percent, 100)}
    def cell(r, key, spec):
        return "-" if r.get(key) is None else format(r[key] * scale.get(key, 1), spec)

    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r, key, spec) for _, key, spec in cols) + " |" for r in rows]
    r = rows[0]
    lines.append(f"\n{info['device_name']} ({info['device']}, torch threads {info['threads']}, "
                 f"torch {info['torch']}), {r['dtype']}{', compiled' if r['compile'] else ''}; "
                 f"batch {r['batch_size']} x {r['block_size']} tokens, D={r['n_embd']}, "
                 f"V={r['vocab_size']}; peak {info['peak_flops'] / 1e9:,.1f} GFLOP/s "
                 f"({info['peak_source']})")
    others, missing = info["other_processes_cpus"], []
    if all(r.get("peak_mb") is None for r in rows):
        missing.append("peak memory (no /proc/self/status, no resource module)")
    if others is None:
        missing.append("how busy other processes kept the CPUs (no /proc/stat)")
    if missing:
        lines.append(f"Not measured on this system: {'; '.join(missing)}.")
    if others is not None:
        lines.append(f"Other processes kept {others:.2f} of the {info['cpus']} CPUs busy during "
                     f"the timed steps.")
        if not info["device"].startswith("cuda") and others > 0.1 * info["cpus"]:
            lines.append("warning: times are unreliable on a busy machine; rerun on an idle one "
                         "(on a shared one, --threads=1 avoids threads spinning on busy cores)")
    return "\n".join(lines)


def main(argv):
    """bench.py's command: its exit code. Ctrl-C, SIGTERM and SIGHUP stop it at once, in one line,
    exit 130, nothing written."""
    return command.main("tools/bench.py", lambda given: measure(given, argv), argv, BenchConfig, NOTES,
                        stopped="before the table was done; nothing was printed or written")


def measure(given, argv):
    bc = BenchConfig(**given)
    threads = 1 if bc.threads is None else bc.threads
    if min(bc.iters, bc.batch_size, threads) < 1 or bc.warmup < 0:
        raise UsageError("--iters, --batch_size and --threads must be at least 1, --warmup at "
                         "least 0")
    if bc.profile and (device := resolve_device(bc.device)) != "cpu":
        raise UsageError(f"--profile times CPU operators, but --device={bc.device} runs on "
                         f"{device}; use --device=cpu (on a GPU, Nsight or torch.profiler)")
    if bc.json:  # find out now, not after the whole run
        files.check_writable(bc.json, "json")
    rows, info = run(bc)
    info["command"] = " ".join(["python tools/bench.py", *argv])
    command.Stop.hold()  # measured: the table and its records go out whole
    print(table(rows, info))
    if bc.json:
        os.makedirs(os.path.dirname(os.path.abspath(bc.json)), exist_ok=True)
        with open(bc.json, "a") as f:
            f.write("".join(json.dumps(record) + "\n" for record in rows + [info]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
