"""
Speed and memory of every state-passing scheme side by side, on the device this runs on.

    python tools/bench.py            # classroom preset, all six variants, ~2 min on 2 CPU cores
    python tools/bench.py --model=pythia-70m --layout=1+2R2+1 --block_size=256 --batch_size=8
    python tools/bench.py --compile=true --json=bench.jsonl  # --json: a JSON line a variant
    python tools/bench.py --profile=true --decode=false  # where a CPU train step's time goes

Rounds interleave the variants, so that a busy machine slows them alike: figures are medians.
"""

import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from statistics import median

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, check_ranges, closest, setting  # noqa: E402
from mesh import PRESETS, SCHEMES, Config, ConfigError, RecursiveGPT  # noqa: E402
from support import command, device as devices, files, memory, spawn, tool  # noqa: E402
from support.device import resolve_device  # noqa: E402

VARIANTS = ("vanilla", *SCHEMES)  # vanilla: the layout's compute depth as one unshared stack
NOTES = f"presets: {', '.join(PRESETS)}\nvariants: {', '.join(VARIANTS)}"
PROMPT, NEW_TOKENS, DECODE_BLOCK = 56, 200, 256  # sample.py's decode: a prompt, then new tokens
PROFILE_ROUNDS, PROFILE_STEPS, SEED = 3, 3, 1337  # SEED: the initial weights, the batch
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


@dataclass
class BenchConfig:
    """Speed and memory of every scheme; model fields left at None take the preset's value."""
    model: str = setting("classroom", "a preset of mesh.PRESETS (listed below)")
    layout: str | None = setting(None, "the recursive layout (P+CRN+Q)")
    n_embd: int | None = setting(None, "width D")
    n_head: int | None = setting(None, "attention heads")
    block_size: int | None = setting(None, "training context T")
    vocab_size: int | None = setting(None, "None: the preset's")
    batch_size: int = setting(16, "sequences per train step")
    schemes: str = setting(",".join(VARIANTS), "comma-separated variants to run")
    device: str = setting("auto", "auto: cuda, then mps, then cpu")
    dtype: str = setting("auto", "auto: bfloat16 autocast where the GPU has it, else float32")
    threads: int | None = setting(None, "CPU threads for torch; None: one per core")
    compile: bool = setting(False, "torch.compile every model (training and decoding)")
    grad_checkpoint: bool = setting(False, "recompute activations in backward")
    iters: int = setting(20, "timed rounds, each one train step of every variant")
    warmup: int = setting(3, "untimed steps per variant first")
    decode: bool = setting(True, "also time decoding, with and without the KV cache")
    profile: bool = setting(False, "also profile train steps (CPU): matmuls, attention")
    json: str | None = setting(None, "append JSON lines to this file", path=True)

    def __post_init__(self):
        check_ranges(self, [("iters batch_size threads", lambda v: v >= 1, "at least 1"),
                            ("warmup", lambda v: v >= 0, "0 or more")])


def variants(bc):
    """[(name, Config)] for the requested variants, all at the layout's compute depth."""
    names = list(dict.fromkeys(s.strip() for s in bc.schemes.split(",") if s.strip()))
    if not names:
        raise UsageError(f"--schemes is empty; name some of {', '.join(VARIANTS)}")
    for n in set(names) - set(VARIANTS):
        raise UsageError(f"unknown scheme {n!r} in --schemes{closest(n, VARIANTS)}; "
                         f"expected some of {', '.join(VARIANTS)}")
    try:  # a size, layout or scheme the model cannot take: in mesh.py's words
        cfg = Config.from_preset(bc.model, layout=bc.layout, n_embd=bc.n_embd,
                                 n_head=bc.n_head, block_size=bc.block_size,
                                 vocab_size=bc.vocab_size, scheme="base")
        vanilla = dict(layout=str(cfg.shape.depth))
        return [(n, Config(**{**cfg.to_dict(), **(vanilla if n == "vanilla" else {"scheme": n})}))
                for n in names]
    except ConfigError as e:
        raise UsageError(str(e)) from None


def setup(bc):
    """Settings -> (device, torch dtype, autocast context): train.py's Device, in every process."""
    device = devices.Device(bc, master=False)
    bc.dtype = device.dtype
    torch._dynamo.config.recompile_limit = 64  # every variant's graphs share forward's code
    return device.name, getattr(torch, device.dtype), device.autocast


def build(cfg, bc, device):
    """Model (compiled in place with --compile: generate() decodes compiled too) and AdamW."""
    torch.manual_seed(SEED)
    model = RecursiveGPT(cfg).to(device)
    model.grad_checkpoint = bc.grad_checkpoint
    if bc.compile:
        model.compile()
    return model, model.configure_optimizer(0.01, 1e-3, device_type=device.split(":")[0])


def train_step(model, opt, x, y, autocast, eager=False):
    """One AdamW step, no clipping; eager: nothing compiles again."""
    with autocast:
        _, loss = (model.forward if eager else model)(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def graphs():
    """Graphs torch.compile has built so far in this process (after warm-up: recompiles)."""
    return counters["stats"]["unique_graphs"]


def timed(fn, device):
    """(seconds fn() takes, its device's queue drained; graphs torch.compile built meanwhile)."""
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)  # this GPU's queue (cuda:1's, not GPU 0's)
        elif device == "mps":
            torch.mps.synchronize()
    before = graphs()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0, graphs() - before


def rounds(fns, n, measure):
    """{key: [measure(fn), a round each]}: n rounds, the order rotated each round."""
    out, keys = {key: [] for key in fns}, list(fns)
    for r in range(n):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            out[key].append(measure(fns[key]))
    return out


def profile_steps(step, steps=PROFILE_STEPS):
    """step() once, then `steps` times under torch.profiler -> seconds of wall, matmul and
    attention, and matmul_flops as the profiler counts them."""
    P, wall = torch.profiler, 0.0
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
    flops = sum(e.flops for e in events if e.key in MATMULS)
    return dict(wall=wall, matmul=matmul / 1e6, attention=attention / 1e6, matmul_flops=flops)


def cpu_seconds():
    """(CPU seconds all processes were busy, None without /proc/stat; of which this process)."""
    own = sum(os.times()[:4])
    try:
        with open("/proc/stat") as f:  # cpu user nice system idle iowait ... in clock ticks
            ticks = [int(v) for v in f.readline().split()[1:8]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own
    except (OSError, ValueError):
        return None, own


@torch.no_grad()
def decode_speeds(models, device, bc, reps=3):
    """{name: (tokens/s of greedy generate() with the KV cache, without, speedup, graphs)}."""
    vocab_size = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(vocab_size, (1, PROMPT), device=device)
    fns = {}
    for name, model in models.items():
        model.eval()
        for cache in (True, False):  # warm-up; compiled, every shape it will meet
            generate = partial(model.generate, prompt, temperature=0, use_cache=cache)
            generate(NEW_TOKENS if bc.compile else 8)
            fns[name, cache] = partial(generate, NEW_TOKENS)
    times = rounds(fns, reps, partial(timed, device=device))
    out = {}
    for name in models:
        cached, full = ([t for t, _ in times[name, c]] for c in (True, False))
        built = sum(g for c in (True, False) for _, g in times[name, c])
        speedup = median(f / c for c, f in zip(cached, full))
        out[name] = NEW_TOKENS / median(cached), NEW_TOKENS / median(full), speedup, built
    return out


def peak_mb(device):
    """This process's peak memory in MB: the CUDA allocator's, else VmHWM (None without /proc)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:  # not ru_maxrss: on Linux a child starts with its parent's
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        return None


def held_bytes(model, opt):
    """Bytes a model and AdamW hold between steps: weights, buffers, optimizer state."""
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    tensors = [*model.parameters(), *model.buffers(), *state]
    return sum(t.numel() * t.element_size() for t in tensors)


def step_memory(model, opt, x, y, autocast, device, steps=1, eager=False):
    """(MB at the peak of `steps` train steps, MB of it they add to what was held before)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # VmHWM is now the resident set
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    before = peak_mb(device)
    timed(lambda: [train_step(model, opt, x, y, autocast, eager) for _ in range(steps)], device)
    if (peak := peak_mb(device)) is None:
        return None, None
    if device.startswith("cuda"):
        return held_bytes(model, opt) / 2**20 + peak - before, peak - before
    return peak, peak - before


def peak_memory(cfg, bc, conn):
    """In a fresh process: build, then step_memory of 3 steps."""
    spawn.helper()  # Ctrl-C, a hang-up: bench.py's to answer
    device, _, autocast = setup(bc)
    model, opt = build(cfg, bc, device)
    x = torch.randint(cfg.vocab_size, (2, bc.batch_size, cfg.block_size), device=device)
    conn.send(step_memory(model, opt, x[0], x[1], autocast, device, steps=3))


def in_fresh_process(fn, *args):
    """fn(*args, conn) in a new interpreter -> what it sends, or (None, None) if it dies."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=fn, args=(*args, send))
    unblock = spawn.start([child])  # the signals held until it ignores them
    send.close()  # so that a child that dies reads as EOF here
    try:
        unblock()  # a signal held meanwhile: raised here, which ends the child
        return recv.recv()
    except EOFError:
        return None, None
    except BaseException:  # a signal: the measurement is dropped with the child (deaf to it)
        child.kill()
        raise
    finally:
        child.join()


def run(bc):
    """Time every variant -> (a row per variant, the machine's record)."""
    device, dtype, autocast = setup(bc)
    cuda, todo = device.startswith("cuda"), variants(bc)
    B, T, V = bc.batch_size, todo[0][1].block_size, todo[0][1].vocab_size
    for name, cfg in todo:  # refused before anything is built where it cannot fit
        memory.check_fits(cfg, B, device, dtype.itemsize, grad_checkpoint=bc.grad_checkpoint,
                           what=f"scheme {name}", fix="use smaller settings")
    torch.manual_seed(SEED)
    x, y = torch.randint(V, (2, B, T), device=device)
    models = {name: build(cfg, bc, device) for name, cfg in todo}
    print(f"bench.py: timing {len(models)} variant(s), {bc.warmup} warm-up step(s) and "
          f"{bc.iters} round(s) each", file=sys.stderr, flush=True)
    steps = {n: (lambda n=n: train_step(*models[n], x, y, autocast)) for n in models}
    warm = {n: timed(lambda: [steps[n]() for _ in range(bc.warmup)], device) for n in models}
    # the peak: a square matmul timed once a round, between the steps, under their load
    side = 8192 if cuda else 2048
    a, b = torch.randn(2, side, side, device=device, dtype=dtype)
    a @ b  # warm-up
    (busy0, own0), t_start = cpu_seconds(), time.perf_counter()
    times = rounds({**steps, "peak": lambda: a @ b}, bc.iters, partial(timed, device=device))
    (busy1, own1), elapsed = cpu_seconds(), time.perf_counter() - t_start
    others = None if busy0 is None else max(0, busy1 - busy0 - own1 + own0) / elapsed
    seconds = {key: [t for t, _ in times[key]] for key in times}
    # profiled after the timed rounds, which the profiler would slow
    profiles = rounds(steps, PROFILE_ROUNDS if bc.profile else 0, profile_steps)
    peak = devices.peak_bf16_flops(device, bc.dtype)
    source = "spec sheet, dense bf16"
    if not peak:
        peak = median(2 * side**3 / t for t in seconds["peak"])
        source = (f"measured {bc.dtype} {side}^2 matmul, median of {bc.iters} rounds "
                  f"between the steps")

    rows = []
    for name, cfg in todo:
        dt, fpt = median(seconds[name]), devices.flops_per_token(cfg)
        row = dict(kind="variant", variant=name, scheme=cfg.scheme, layout=cfg.layout,
                   compute_depth=cfg.shape.depth,
                   non_embedding_params=models[name][0].num_params(),
                   n_slots=cfg.slots if cfg.scheme == "mesh" else None,
                   n_embd=cfg.n_embd, n_head=cfg.n_head, vocab_size=V, block_size=T,
                   batch_size=B, device=device, dtype=bc.dtype, compile=bc.compile,
                   ms_per_step=1000 * dt, tokens_per_s=B * T / dt,
                   flops_per_token=fpt, flops_per_s=fpt * B * T / dt,
                   warmup_s=warm[name][0], warmup_graphs=None, recompiles=None)
        row["peak_fraction"] = row["flops_per_s"] / peak
        if bc.compile:  # graphs built in warm-up, and after it (none, where all is well)
            row.update(warmup_graphs=warm[name][1], recompiles=sum(g for _, g in times[name]))
        if bc.profile:
            p = {key: sum(q[key] for q in profiles[name]) for key in profiles[name][0]}
            row.update(matmul_share=p["matmul"] / p["wall"],
                       attention_share=p["attention"] / p["wall"],
                       matmul_peak_fraction=p["matmul_flops"] / p["matmul"] / peak)
        for ref in ("vanilla", "base"):  # paired: both ran moments apart, under one load
            if ref in seconds:
                ratios = (t / r for t, r in zip(seconds[name], seconds[ref]))
                row[f"time_vs_{ref}"] = median(ratios)
        # memory: on a GPU here, with the eager step's, which the plan models; on a CPU, the
        # resident set of a fresh process (with the process itself, some 300 MB)
        if cuda:
            memory_of = partial(step_memory, *models[name], x, y, autocast, device)
            row["peak_mb"], row["step_mb"] = memory_of()
            row["eager_peak_mb"] = row["peak_mb"]
            if bc.compile:  # one step more, through the model's own forward
                row["eager_peak_mb"] = memory_of(eager=True)[0]
        else:
            row["peak_mb"], row["step_mb"] = in_fresh_process(peak_memory, cfg, bc)
        plan = memory.memory(cfg, B, 1, False, bc.grad_checkpoint, dtype.itemsize)
        row["plan_mb"] = plan["total"] / 2**20  # train.py --plan's estimate of the peak
        rows.append(row)
        del models[name]  # its last reference: decoding runs with no training model left

    if bc.decode:
        block = dict(block_size=max(T, DECODE_BLOCK))
        speeds = decode_speeds({n: build(Config(**{**cfg.to_dict(), **block}), bc, device)[0]
                                for n, cfg in todo}, device, bc)
        for row in rows:
            cached, full, speedup, built = speeds[row["variant"]]
            row.update(decode_tok_s_cache=cached, decode_tok_s_no_cache=full,
                       decode_speedup=speedup)
            if bc.compile:
                row["recompiles"] += built
    return rows, dict(kind="machine", torch=torch.__version__, device=device,
                      device_name=tool.machine_name(device),
                      threads=torch.get_num_threads(), peak_flops=peak, peak_source=source,
                      cpus=os.cpu_count(), other_processes_cpus=others,
                      settings=dataclasses.asdict(bc))


COLUMNS = [  # (heading, key, format); a column the run did not measure is left out
    ("variant", "variant", "s"), ("layout", "layout", "s"),
    ("non-emb params", "non_embedding_params", ",d"), ("ms/step", "ms_per_step", ".1f"),
    ("vs vanilla", "time_vs_vanilla", ".3f"), ("vs base", "time_vs_base", ".3f"),
    ("tok/s", "tokens_per_s", ",.0f"), ("GFLOP/s", "flops_per_s", ".1f"),
    ("% of peak", "peak_fraction", ".1f"), ("% matmul", "matmul_share", ".0f"),
    ("matmul % of peak", "matmul_peak_fraction", ".0f"),
    ("% attention", "attention_share", ".0f"), ("peak MB", "peak_mb", ".0f"),
    ("step MB", "step_mb", ".1f"), ("eager peak MB", "eager_peak_mb", ".0f"),
    ("plan MB", "plan_mb", ".0f"), ("decode tok/s, cache", "decode_tok_s_cache", ".0f"),
    ("no cache", "decode_tok_s_no_cache", ".0f"), ("speedup", "decode_speedup", ".2f"),
    ("warm-up s", "warmup_s", ".1f"), ("graphs", "warmup_graphs", "d"),
    ("recompiles", "recompiles", "d")]
SCALE = {"flops_per_s": 1e-9, "peak_fraction": 100, "matmul_share": 100,
         "matmul_peak_fraction": 100, "attention_share": 100}


def table(rows, info):
    """A Markdown table, a row a variant, and what it ran on."""
    cols = [c for c in COLUMNS if any(r.get(c[1]) is not None for r in rows)]
    peak = "CUDA peak MB" if info["device"].startswith("cuda") else "peak RSS MB"
    heads = [peak if key == "peak_mb" else heading for heading, key, _ in cols]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = ["-" if r.get(key) is None else format(r[key] * SCALE.get(key, 1), spec)
                 for _, key, spec in cols]
        lines.append("| " + " | ".join(cells) + " |")
    r, others = rows[0], info["other_processes_cpus"]
    lines.append(f"\n{info['device_name']} ({info['device']}, torch threads {info['threads']}, "
                 f"torch {info['torch']}), {r['dtype']}{', compiled' if r['compile'] else ''}; "
                 f"batch {r['batch_size']} x {r['block_size']} tokens, D={r['n_embd']}, "
                 f"V={r['vocab_size']}; peak {info['peak_flops'] / 1e9:,.1f} GFLOP/s "
                 f"({info['peak_source']})")
    if others is not None:  # where Linux's /proc/stat tells
        lines.append(f"Other processes kept {others:.2f} of the {info['cpus']} CPUs busy "
                     f"during the timed steps.")
    missing = [what for what, gone in (
        ("peak memory (no /proc/self/status)", r.get("peak_mb") is None),
        ("how busy other processes kept the CPUs (no /proc/stat)", others is None)) if gone]
    if missing:  # said, not left to guess from a missing column
        lines.append(f"Not measured on this system: {'; '.join(missing)}.")
    return "\n".join(lines)


def main(argv):
    stopped = "before the table was done; nothing was printed or written"
    return command.main("tools/bench.py", lambda given: measure(given, argv), argv,
                        BenchConfig, NOTES, stopped=stopped)


def measure(given, argv):
    bc = BenchConfig(**given)
    if bc.profile and (device := resolve_device(bc.device)) != "cpu":
        raise UsageError(f"--profile times CPU operators, but --device={bc.device} runs on "
                         f"{device}; use --device=cpu (on a GPU, Nsight or torch.profiler)")
    if bc.json:  # now, not after the whole run
        tool.check_writable(bc.json, "json")
    rows, info = run(bc)
    info["command"] = " ".join(["python tools/bench.py", *argv])
    tool.hold()  # measured: the table and its records go out whole
    print(table(rows, info))
    if bc.json:
        os.makedirs(os.path.dirname(os.path.abspath(bc.json)), exist_ok=True)
        records = "".join(json.dumps(record) + "\n" for record in rows + [info])
        try:
            with open(bc.json, "ab") as f:
                files.append(bc.json, records.encode(), f.fileno())
        except OSError as e:
            raise UsageError(f"could not append to --json={bc.json}: {e.strerror}; it is as "
                             f"it was: free some space, then run again") from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
