"""
The one GPU check: on a machine with one CUDA GPU, from a fresh checkout and with nothing to install
(PyTorch with CUDA, Triton, numpy, tiktoken and pytest), in under 8 minutes:

    python tools/gpu_check.py                   # writes gpu-<chip>.md, ready for results/
    python tools/gpu_check.py --tiny            # the same steps at a tiny shape, on any machine (the test suite's)

1. the CUDA tier of the test suite (tests/test_cuda.py; without CUDA it skips, with the reason);
2. bench.py at pythia-160m width (vanilla 12, base and mesh 2+4R2+2) and at pythia-410m width (base and
   mesh 4+8R2+4): bf16, compiled, context 2048, each config's micro-batch (16 and 8); ms/step,
   tokens/s, MFU against the chip's bf16 peak, and peak memory beside train.py --plan=true's estimate;
3. where mesh's MFU at 410m width is under 40%, where its train step's time goes (torch.profiler's top
   operators). The report ends with the targets: mesh at most 1.05x base's step time at 160m width, MFU at
   least 40% at 410m width, peak memory within 25% of the plan.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
SHAPES = {  # name -> bench.py flags (the Pythia configs' widths and micro-batches, context 2048)
    "pythia-160m": ["--model=pythia-160m", "--layout=2+4R2+2", "--block_size=2048", "--batch_size=16",
                    "--schemes=vanilla,base,mesh"],
    "pythia-410m": ["--model=pythia-410m", "--layout=4+8R2+4", "--block_size=2048", "--batch_size=8",
                    "--schemes=base,mesh"],
}
FULL = ["--dtype=bfloat16", "--compile=true", "--iters=10", "--warmup=3", "--decode=false"]
TINY = {"tiny": ["--n_embd=64", "--n_head=2", "--block_size=32", "--batch_size=2", "--vocab_size=64",
                 "--layout=1+1R2+1", "--schemes=vanilla,base,mesh", "--iters=2", "--warmup=1", "--decode=false",
                 "--threads=1"]}


def run(cmd, timeout):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    return r, time.time() - t0


def cuda_tier(timeout):
    """(Markdown lines, ok) of tests/test_cuda.py: its summary line, each failure by name."""
    r, seconds = run([sys.executable, "-m", "pytest", "-rfEs", "-p", "no:cacheprovider", "tests/test_cuda.py"], timeout)
    summary = next((line.strip("= ") for line in reversed(r.stdout.splitlines()) if re.search(r"\d+ (passed|skipped|"
                                                                                               r"failed|error)", line)), "no summary")
    lines = [f"`python -m pytest tests/test_cuda.py`: {summary} ({seconds:.0f} s).", ""]
    lines += [f"- {line}" for line in r.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return lines, r.returncode in (0, 5) and "failed" not in summary and "error" not in summary


def bench_rows(name, flags, timeout):
    """bench.py's JSON rows (variants, then the machine) for one shape."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        r, seconds = run([sys.executable, "tools/bench.py", *flags, f"--json={out}"], timeout)
        if r.returncode:
            raise SystemExit(f"gpu_check.py: error: bench.py at {name} failed (exit {r.returncode}): "
                             f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
        with open(out) as f:
            rows = [json.loads(line) for line in f]
    return rows[:-1], rows[-1], seconds


def bench_table(name, flags, rows, info, seconds):
    lines = [f"### {name} width: `python tools/bench.py {' '.join(flags)}`", "",
             "| variant | layout | ms/step | vs base | tokens/s | MFU | peak memory | plan's estimate | peak / plan |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gib = lambda mb: "-" if mb is None else f"{mb / 1024:.2f} GiB"  # noqa: E731
        ratio = "-" if r.get("peak_mb") is None else f"{r['peak_mb'] / r['plan_mb']:.2f}"
        lines.append(f"| {r['variant']} | `{r['layout']}` | {r['ms_per_step']:.1f} | {r.get('time_vs_base', 1.0):.3f} | "
                     f"{r['tokens_per_s']:,.0f} | {100 * r['peak_fraction']:.1f}% | {gib(r.get('peak_mb'))} | "
                     f"{gib(r['plan_mb'])} | {ratio} |")
    lines += ["", f"{info['device_name']}, torch {info['torch']}, {rows[0]['dtype']}"
                  f"{', compiled' if rows[0]['compile'] else ''}, batch {rows[0]['batch_size']} x {rows[0]['block_size']};"
                  f" MFU against {info['peak_flops'] / 1e12:,.1f} TFLOP/s ({info['peak_source']}); {seconds:.0f} s.", ""]
    return lines


def profile(flags, device, steps=3):
    """The top operators of a mesh train step, by the device time they take (CPU time on a CPU)."""
    sys.path.insert(0, ROOT)
    import torch
    from tools import bench
    from configurator import parse_flags
    bc = bench.BenchConfig(**parse_flags(bench.BenchConfig, [f for f in flags if not f.startswith(("--iters", "--warmup",
                                                                                               "--decode"))], "bench.py"))
    bc.schemes = "mesh"
    device, _, autocast = bench.setup(bc)
    (_, cfg), = bench.variants(bc)
    model, opt = bench.build(cfg, bc, device)
    x, y = torch.randint(cfg.vocab_size, (2, bc.batch_size, cfg.block_size), device=device)
    for _ in range(2):  # warm-up (and compilation)
        bench.train_step(model, opt, x, y, autocast)
    P = torch.profiler
    cuda = device.startswith("cuda")
    activities = [P.ProfilerActivity.CPU] + ([P.ProfilerActivity.CUDA] if cuda else [])
    with P.profile(activities=activities) as prof:
        for _ in range(steps):
            bench.train_step(model, opt, x, y, autocast)
        bench.sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60)


def targets(results):
    """The targets of the report: (what, value, met) from the tables."""
    out = []
    for name, (rows, info) in results.items():
        by = {r["variant"]: r for r in rows}
        if "160m" in name or name == "tiny":
            out.append((f"mesh / base step time at {name} width (at most 1.05)", f"{by['mesh']['time_vs_base']:.3f}",
                        by["mesh"]["time_vs_base"] <= 1.05))
        if "410m" in name or name == "tiny":
            out.append((f"mesh's MFU at {name} width (at least 40%)", f"{100 * by['mesh']['peak_fraction']:.1f}%",
                        by["mesh"]["peak_fraction"] >= 0.40))
        for r in rows:
            if r.get("peak_mb") is not None:
                ratio = r["peak_mb"] / r["plan_mb"]
                out.append((f"{r['variant']} peak memory / plan at {name} width (within 25%)", f"{ratio:.2f}",
                            abs(ratio - 1) <= 0.25))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="The one GPU check: the CUDA tier, then bench.py at Pythia widths.")
    ap.error = lambda msg: ap.exit(2, f"gpu_check.py: error: {msg}\n")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, uncompiled, on whatever device there is")
    ap.add_argument("--report", help="the Markdown report (default: gpu-<chip>.md here)")
    ap.add_argument("--timeout", type=int, default=420, help="seconds for each step (default: %(default)s)")
    a = ap.parse_args(argv)
    started = time.time()
    tier, tier_ok = cuda_tier(a.timeout)
    shapes = TINY if a.tiny else {name: [*flags, *FULL] for name, flags in SHAPES.items()}
    results, tables = {}, []
    for name, flags in shapes.items():
        rows, info, seconds = bench_rows(name, flags, a.timeout)
        results[name] = rows, info
        tables += bench_table(name, flags, rows, info, seconds)
    chip = results[next(iter(results))][1]["device_name"]
    device = results[next(iter(results))][1]["device"]
    where = [(name, flags) for name, flags in shapes.items() if name == "tiny" or
             "410m" in name and {r["variant"]: r for r in results[name][0]}["mesh"]["peak_fraction"] < 0.40]
    prof = [f"### Where mesh's train step spends its time ({where[0][0]} width)", "", "```",
            profile(where[0][1], device), "```", ""] if where else []
    lines = [f"# GPU check: {chip}", "",
             f"`python tools/gpu_check.py{' --tiny' if a.tiny else ''}`, {datetime.date.today()}, "
             f"{time.time() - started:.0f} s in all.", "", "## The CUDA tier", "", *tier, "", "## Speed and memory",
             "", *tables, *prof, "## Targets", "", *(["(--tiny: these are the full check's targets, for a GPU at Pythia "
                                                      "widths; here they only show that the report is whole.)", ""]
                                                    if a.tiny else []),
             "| target | measured | met |", "|---|---:|---|"]
    lines += [f"| {what} | {value} | {'yes' if met else 'no'} |" for what, value, met in targets(results)]
    report = a.report or f"gpu-{re.sub(r'[^A-Za-z0-9]+', '-', chip).strip('-').lower()}.md"
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {report}: the CUDA tier {'passed' if tier_ok else 'FAILED'}")
    return 0 if tier_ok else 1


if __name__ == "__main__":
    sys.exit(main())
