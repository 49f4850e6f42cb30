"""
The one GPU check: on a machine with one CUDA GPU, from a fresh checkout and with nothing to
install (PyTorch with CUDA, Triton, numpy, tiktoken, pytest), in one command of at most 10 minutes:

    python tools/gpu_check.py --out "$OUT"           # report.md and each part's log, all in $OUT
    python tools/gpu_check.py --out DIR --only=tier  # one part again: its files, a report of it
    python tools/gpu_check.py --tiny --out DIR       # every part at a tiny shape, on any machine

Its parts, in the order the first call must bring them back:

1. bench-160m: bench.py, base against mesh (2+4R2+2) at pythia-160m width, bf16, compiled, context
   2048, micro-batch 16: the headline target, mesh's step time at most 1.05x base's.
2. bench-410m: the same at pythia-410m width (4+8R2+4, micro-batch 8): mesh's MFU, target 40%.
3. tier: the CUDA tier, tests/test_cuda.py (GPU against CPU, bf16, compiled kernels, NCCL, FSDP2),
   with CUBLAS_WORKSPACE_CONFIG=:4096:8 set before its process starts (deterministic cuBLAS).
4. profile: torch.profiler's top operators of mesh's compiled step at 410m width, run only where
   its MFU was not measured at 40% or more: the diagnosis of a missed target.

Why this order: the speed parts give numbers that only this machine can give and that every later
decision needs; the tier names its failures test by test, so a part of it still tells; the profile
explains a number already brought back. Both bench parts print peak memory (eager and compiled,
beside plan.py's estimate of eager autograd's activations: the target compares eager with the
plan) and each variant's warm-up, compilation included.

Deadlines: --budget (default 540 s, one 10-minute command less a minute's margin) ends the check.
Each part reserves RESERVE seconds (scaled by --budget / 540) and may run until the budget's end
less what the parts after it reserve: a slow early part takes no later part's reserve, and time an
early part leaves goes to the next. Each part runs in its own process group, its output (stdout and
stderr) into DIR/PART.log. A part that exits non-zero is recorded as failed, one past its deadline
as overran: its process group gets SIGTERM, then SIGKILL GRACE seconds later, and the report keeps
its time and last lines; the check goes on with the next part. After every part the report so far
is written (DIR/report.md) and the part's section printed, so that the output's last 12,000
characters alone tell the story; a SIGTERM, SIGHUP or Ctrl-C ends the running part's group and
writes the report with what did not run. A tier whose every test skipped (no GPU to be seen) is
reported as skipped, never as passed. Exit status: 1 if a part failed, overran, was stopped or
skipped every test, else 0; 2 for bad input, or another check holding DIR (one check per --out).
DIR holds at most 7 files, flat: report.md, PART.log of each part, bench-*.jsonl (bench.py's rows).

For the suite's test of the check itself (tests/test_gpu_check.py): --fail=PART runs, in PART's
place, a command that prints two lines and exits 1; --overrun=PART one that starts a child and
sleeps past any deadline, both ignoring SIGTERM, and prints both process ids (the test checks that
neither outlives the check).

Time, traced (no GPU has run this yet; the report's warm-up and compile figures will replace the
assumed ones). Compiles: 13 (against some 25 before), every other cost is small beside them:
    bench-160m  31.7 TFLOP a step (0.969 GFLOP/token x 32,768 tokens): 134 ms at 30% of the
                H200's measured 790 TFLOP/s; 2 x (3 warm-up + 10 timed + 1 compiled + 1 eager, at
                twice the time) steps = 4 s; 2 compiles x 40 s (assumed, a 12-block step); the
                process's start 10 s: 96 s
    bench-410m  44.7 TFLOP a step (2.727 GFLOP/token x 16,384): 189 ms, 6 s of steps; 2 compiles
                x 55 s (24 blocks; Triton kernels are shared by identical blocks); start: 128 s
    tier        8 tiny compiles x 8 s (3 graphs each for base and mesh, train.py's 2); 21 tests
                on tiny models 20 s; 2 torchrun runs with sample.py and consolidate.py 50 s;
                pytest 8 s: 142 s
    profile     mesh at 410m again, from inductor's on-disk cache that bench-410m filled (graph,
                AOTAutograd): ~15 s, start 10 s, 5 steps: 27 s
    total       ~393 s, under 8 minutes (480 s); of it 269 s are compiles, so it still fits if they
                take 1.3 times as long as assumed. RESERVE gives each part about 1.4x its trace.

MFU: achieved FLOP/s over the chip's dense bf16 peak (spec sheet, machine.PEAK_BF16_FLOPS: 989
TFLOP/s for the H200), FLOPs per token counted as PaLM's appendix and nanoGPT's estimate_mfu count
them: 6 x the matmul parameters of the unrolled compute depth, plus attention's 12 L D T over the
full T x T scores (causal masking not discounted; counting the causal half would lower MFU).
"""

import datetime
import math
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, parse_flags, setting  # noqa: E402
from configurator import report as error_line  # noqa: E402
from support import command, files  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
HERE = os.path.dirname(os.path.abspath(__file__))  # this file's folder, for the parts' imports
# from the project folder, where every part runs
BENCH, TIER = "tools/bench.py", "tests/test_cuda.py"
GRACE, TAIL = 3, 15  # seconds from SIGTERM to SIGKILL; last lines kept of a failed or overrun part
FULL = ["--dtype=bfloat16", "--compile=true", "--iters=10", "--warmup=3", "--decode=false"]
SHAPES = {  # part -> bench.py flags: the Pythia widths, their micro-batches, context 2048
    "bench-160m": ["--model=pythia-160m", "--layout=2+4R2+2", "--block_size=2048",
                   "--batch_size=16"],
    "bench-410m": ["--model=pythia-410m", "--layout=4+8R2+4", "--block_size=2048",
                   "--batch_size=8"],
}
TINY = ["--n_embd=64", "--n_head=2", "--block_size=32", "--batch_size=2", "--vocab_size=64",
        "--layout=1+1R2+1", "--iters=2", "--warmup=1", "--decode=false", "--threads=1"]
RESERVE = {"bench-160m": 150, "bench-410m": 170, "tier": 160, "profile": 60}  # seconds of 540
TINY_RESERVE = {"bench-160m": 30, "bench-410m": 30, "tier": 20, "profile": 20}  # of 100, on a CPU
FAIL = "print('an injected failure (--fail)'); print('its last line'); raise SystemExit(1)"
OVERRUN = ("import os, signal, subprocess, sys, time; "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
           "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)']); "
           "print('an injected overrun (--overrun): pids', os.getpid(), c.pid, flush=True); "
           "time.sleep(3600)")


@dataclass
class Outcome:
    """How one part went: status is passed, failed, overran, stopped, skipped, not needed or not
    run."""
    status: str
    seconds: float = 0.0
    deadline: float = 0.0   # seconds from the check's start
    note: str = ""          # the exit status, or why it did not run
    tail: list = field(default_factory=list)


def child(function, *args):
    """A command running this file's `function(args)` in a fresh interpreter (a part's process)."""
    code = (f"import sys; sys.path[:0] = [{ROOT!r}, {HERE!r}]; import gpu_check; "
            f"sys.exit(gpu_check.{function}(sys.argv[1:]))")
    return [sys.executable, "-c", code, *args]


def compiled_line(graphs, seconds, what):
    """The line a part's child prints about its compiles; the report reads it back (COMPILED)."""
    print(f"compiled: {graphs} graphs in {seconds:.1f} s ({what})", flush=True)


COMPILED = re.compile(r"^compiled: (\d+ graphs in [0-9.]+ s \(.*\))$", re.M)


class Part:
    """One part: its command, and the report's section from what it left in --out."""

    def __init__(self, name, tiny):
        self.name, self.tiny = name, tiny

    def command(self, out):
        raise NotImplementedError

    def files(self, out):
        """Files of --out it writes besides its log (removed before it runs: nothing stale)."""
        return []

    def env(self):
        return {}

    def section(self, out):
        """(Markdown lines, its compiles in a few words) from what it left; raises if nothing."""
        raise NotImplementedError

    def needed(self, out):
        """None, or why this part need not run, given what the parts before it left in out."""
        return None

    def skipped(self, out):
        """None, or why a part that exited 0 checked nothing (so it did not pass)."""
        return None


class Bench(Part):
    """bench.py at one width: base and mesh, its JSON rows in DIR/PART.jsonl."""

    def flags(self):
        shape = TINY if self.tiny else [*SHAPES[self.name], *FULL]
        return [*shape, "--schemes=base,mesh"]

    def files(self, out):
        return [os.path.join(out, f"{self.name}.jsonl")]  # bench.py appends: a rerun starts afresh

    def command(self, out):
        return [sys.executable, BENCH, *self.flags(), f"--json={self.files(out)[0]}"]

    def rows(self, out):
        with open(os.path.join(out, f"{self.name}.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        return records[:-1], records[-1]

    def section(self, out):
        rows, info = self.rows(out)
        as_run = "compiled peak" if rows[0]["compile"] else "peak"
        lines = [f"`python {BENCH} {' '.join(self.flags())}`", "",
                 f"| variant | layout | ms/step | vs base | tokens/s | MFU | warm-up | {as_run} "
                 "| eager peak | plan | eager / plan |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            eager = eager_mb(r)
            ratio = None if eager is None else eager / r["plan_mb"]
            lines.append(f"| {r['variant']} | `{r['layout']}` | {r['ms_per_step']:.1f} | "
                         f"{r.get('time_vs_base', 1.0):.3f} | {r['tokens_per_s']:,.0f} | "
                         f"{100 * r['peak_fraction']:.2f}% | {warmup(r)} | "
                         f"{mb(r.get('peak_mb'))} | "
                         f"{mb(eager)} | {mb(r['plan_mb'])} | {shown(ratio, '.2f')} |")
        r = rows[0]
        lines += ["", f"{info['device_name']}, torch {info['torch']}, {r['dtype']}"
                      f"{', compiled' if r['compile'] else ''}, batch {r['batch_size']} x "
                      f"{r['block_size']}; MFU against {info['peak_flops'] / 1e12:.4g} TFLOP/s "
                      f"({info['peak_source']}); memory: {r['memory']} (on CUDA the eager peak is "
                      f"plan.py's like)."]
        return lines, "; ".join(f"{r['variant']} {warmup(r)}" for r in rows)


def mb(value):
    return shown(value, ",.0f", " MB")


def shown(value, spec, unit=""):
    return "-" if value is None else f"{value:{spec}}{unit}"


def warmup(row):
    graphs = "" if row.get("warmup_graphs") is None else f", {row['warmup_graphs']} graphs"
    return f"{row['warmup_s']:.1f} s{graphs}"


def eager_mb(row):
    """A variant's eager peak in MB, what the plan models: CUDA's allocator only (a CPU's resident
    set also holds the process itself): a compiled run's eager step, an uncompiled run's peak."""
    if not row["device"].startswith("cuda"):
        return None
    return row.get("eager_peak_mb") if row["compile"] else row.get("peak_mb")


class Tier(Part):
    """The CUDA tier: pytest on tests/test_cuda.py in one process, then its compiles."""

    def command(self, out):
        return child("tier_main")

    def env(self):
        return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # cuBLAS reads it once: set before the start

    def section(self, out):
        return tier_lines(read_log(out, self.name)), compiles(read_log(out, self.name))

    def skipped(self, out):
        summary = tier_lines(read_log(out, self.name))[0]
        if "skipped" in summary and not re.search(r"\d+ passed", summary):
            reason = re.search(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", read_log(out, self.name), re.M)
            return f"every test skipped{f' ({reason.group(1)[:80]})' if reason else ''}"
        return None


def tier_lines(log):
    """The report's lines of the tier's pytest output: summary, each failure, skip, slow test."""
    lines = log.splitlines()
    summary = next((line.strip("= ") for line in reversed(lines)
                    if re.search(r"\d+ (passed|skipped|failed|error)", line)), "no summary")
    named = [line for line in lines if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    slow = [line for line in lines if re.match(r"[0-9.]+s (call|setup|teardown) ", line)]
    return [f"`python -m pytest {TIER}`: {summary}.", "",
            *(f"- {line}" for line in named),
            *(["", "Slowest:", "", *(f"- {line}" for line in slow)] if slow else [])]


def tier_main(args):
    """The tier's process: pytest, then the graphs torch.compile built, dynamo's compile time."""
    import pytest
    # -vv (pytest.ini's -q less two): each test named as it starts, so a hang's last line names it
    rc = pytest.main(["-vv", "-rfEs", "-p", "no:cacheprovider", "--durations=5", TIER])
    from torch._dynamo.utils import compilation_time_metrics, counters
    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", []))
    compiled_line(counters["stats"]["unique_graphs"], seconds, "torch._dynamo's compile")
    return int(rc)


class Profile(Part):
    """Where mesh's train step at 410m width spends its time."""

    def command(self, out):
        return child("profile_main", *Bench("bench-410m", self.tiny).flags())

    def section(self, out):
        log = read_log(out, self.name)
        table = log.split("top operators:\n", 1)[-1].rstrip().splitlines()
        return ["```", *table, "```"], compiles(log)

    def needed(self, out):
        if self.tiny:
            return None
        try:
            rows, _ = Bench("bench-410m", False).rows(out)
        except (OSError, ValueError, IndexError):
            return None  # not measured: the profile may show why
        mfu = {r["variant"]: r["peak_fraction"] for r in rows}.get("mesh", 0)
        return None if mfu < 0.40 else f"mesh's MFU at 410m width is {100 * mfu:.1f}%, 40% or more"


def profile_main(flags, steps=3):
    """The profile's process: mesh built and (where the flags say) compiled as bench.py does, two
    warm-up steps, then the top operators of `steps` steps by their own device time (on a CPU, CPU
    time)."""
    sys.path.insert(0, os.path.join(ROOT, os.path.dirname(BENCH)))
    import torch
    import bench
    from configurator import parse_flags
    bc = bench.BenchConfig(**parse_flags(bench.BenchConfig, flags, "bench.py"))
    bc.schemes = "mesh"
    device, _, autocast = bench.setup(bc)
    (_, cfg), = bench.variants(bc)
    model, opt = bench.build(cfg, bc, device)
    x, y = torch.randint(cfg.vocab_size, (2, bc.batch_size, cfg.block_size), device=device)
    before, t0 = bench.graphs(), time.perf_counter()
    for _ in range(2):  # warm-up (and compilation)
        bench.train_step(model, opt, x, y, autocast)
    bench.sync(device)
    compiled_line(bench.graphs() - before, time.perf_counter() - t0, "2 warm-up steps")
    P = torch.profiler
    cuda = device.startswith("cuda")
    activities = [P.ProfilerActivity.CPU] + [P.ProfilerActivity.CUDA] * cuda
    with P.profile(activities=activities) as prof:
        for _ in range(steps):
            bench.train_step(model, opt, x, y, autocast)
        bench.sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60)
    print("top operators:\n" + table, flush=True)
    return 0


def compiles(log):
    found = COMPILED.search(log)
    return found.group(1) if found else "-"


def read_log(out, name):
    with open(os.path.join(out, f"{name}.log"), encoding="utf-8", errors="replace") as f:
        return f.read()


PARTS = {"bench-160m": Bench, "bench-410m": Bench, "tier": Tier, "profile": Profile}


def end_group(proc):
    """End a part's process and everything it started: SIGTERM to its process group, SIGKILL GRACE
    seconds later (or as soon as its first process is gone); on Windows its process tree."""
    if os.name == "nt":
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
        proc.wait()
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the group is empty
        if sig == signal.SIGTERM:
            try:
                proc.wait(GRACE)
            except subprocess.TimeoutExpired:
                pass
    proc.wait()


def run_part(cmd, env, log_path, timeout):
    """Run cmd in its own process group, its output into log_path -> (status, note, seconds)."""
    group = (dict(creationflags=subprocess.CREATE_NEW_PROCESS_GROUP) if os.name == "nt"
             else dict(start_new_session=True))
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **group)
        try:
            rc = proc.wait(timeout=max(timeout, 0))
            status, note = ("passed", "") if rc == 0 else ("failed", f"exit {rc}")
        except subprocess.TimeoutExpired:
            status, note = "overran", "ended at its deadline, with its process group"
        except command.Stopped as e:  # recorded, then raised again by the caller
            command.Stop.hold()  # once: the ending itself is not interrupted
            status, note = "stopped", f"the check was stopped by {e.name} while it ran"
        finally:
            end_group(proc)  # after an exit too: nothing it started outlives it
    return status, note, time.time() - t0


class Report:
    """report.md in --out, rewritten whole (atomically) after every part."""

    def __init__(self, a, names, argv):
        self.a, self.names, self.started = a, names, time.time()
        self.command = " ".join(["python", os.path.relpath(__file__, ROOT), *argv])
        self.outcomes = {n: Outcome("not run", note="not reached yet") for n in names}
        self.sections, self.done = {}, False

    def chip(self):
        for name in ("bench-160m", "bench-410m"):
            try:
                return Bench(name, self.a.tiny).rows(self.a.out)[1]["device_name"]
            except (OSError, ValueError, IndexError):
                pass
        return "(no bench part has run)"

    def lines(self):
        chip = self.chip()
        slug = re.sub(r"[^A-Za-z0-9]+", "-", chip).strip("-").lower()
        lines = [f"# GPU check: {chip}", "",
                 f"`{self.command}`, {datetime.date.today()}, {time.time() - self.started:.0f} s "
                 f"{'in all' if self.done else 'so far'} of a {self.a.budget:.0f} s budget; "
                 f"commit as `results/gpu-{slug}.md`.", "",
                 "MFU: FLOPs per token as PaLM's appendix and nanoGPT's estimate_mfu count them "
                 "(6 x the unrolled compute depth's matmul parameters, plus attention over the "
                 "full T x T, causal masking not discounted), over the chip's dense bf16 peak.",
                 "",
                 "| part | status | time | deadline | compiles (warm-up, compilation included) "
                 "| log |", "|---|---|---:|---:|---|---|"]
        for n in self.names:
            o = self.outcomes[n]
            status = o.status + (f": {o.note}" if o.note else "")
            ran = o.status in ("passed", "failed", "overran", "stopped", "skipped")
            cells = [f"{o.seconds:.0f} s", f"{o.deadline:.0f} s"] if ran else ["-", "-"]
            compiled = self.sections.get(n, ([], "-"))[1]
            lines.append(f"| {n} | {status} | {' | '.join(cells)} | {compiled} | "
                         f"{f'`{n}.log`' if ran else '-'} |")
        for n in self.names:
            lines += ["", *self.part_lines(n)]
        lines += ["", "## Targets", ""]
        if self.a.tiny:
            lines += ["(--tiny: the full check's targets, for a GPU at Pythia widths; here they "
                      "only show that the report is whole.)", ""]
        lines += ["| target | measured | met |", "|---|---:|---|"]
        lines += [f"| {what} | {value} | {met} |" for what, value, met in self.targets()]
        return lines

    def part_lines(self, n):
        o = self.outcomes[n]
        lines = [f"## {n}: {o.status}", "", *self.sections.get(n, ([], ""))[0]]
        if o.tail:
            lines += ["" if n in self.sections else None,
                      f"{o.note}, after {o.seconds:.0f} s; its last lines:", "",
                      "```", *o.tail, "```"]
        elif n not in self.sections:
            lines.append(o.note or "-")
        return [line for line in lines if line is not None]

    def targets(self):
        """(what, measured, met) of each target; one a part did not measure names the part."""
        out = []
        for name, width in (("bench-160m", "160m"), ("bench-410m", "410m")):
            if name not in self.sections:  # read back from its rows only where it passed
                status = self.outcomes.get(name, Outcome("not selected")).status
                why = f"not measured: {name} {status}"
                first = ("mesh / base step time (at most 1.05)" if width == "160m" else
                         "mesh's MFU (at least 40%)")
                out += [(f"{what} at {width} width", why, "-")
                        for what in (first, "eager peak memory / plan (within 25%)")]
                continue
            by = {r["variant"]: r for r in Bench(name, self.a.tiny).rows(self.a.out)[0]}
            if width == "160m":
                value = by["mesh"]["time_vs_base"]
                out.append((f"mesh / base step time at {width} width (at most 1.05)",
                            f"{value:.3f}", yes(value <= 1.05)))
            else:
                value = by["mesh"]["peak_fraction"]
                out.append((f"mesh's MFU at {width} width (at least 40%)", f"{100 * value:.2f}%",
                            yes(value >= 0.40)))
            for v, r in by.items():
                ratio = None if eager_mb(r) is None else eager_mb(r) / r["plan_mb"]
                met = "-" if ratio is None else yes(abs(ratio - 1) <= 0.25)
                out.append((f"{v}'s eager peak memory / plan at {width} width (within 25%)",
                            shown(ratio, ".2f"), met))
        tier = self.outcomes.get("tier", Outcome("not selected"))
        out.append(("the CUDA tier passes", tier.status, yes(tier.status == "passed")))
        return out

    def write(self):
        path = os.path.join(self.a.out, "report.md")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(self.lines()) + "\n")
        os.replace(path + ".tmp", path)  # killed mid-write, the check leaves the last whole one


def yes(met):
    return "yes" if met else "no"


def tail(out, name):
    try:
        return [line[:200] for line in read_log(out, name).rstrip().splitlines()[-TAIL:]]
    except OSError:
        return []


@dataclass
class CheckConfig:
    """The one GPU check: bench.py at Pythia widths, the CUDA tier and a profile, each under a
    deadline, reported as it goes."""
    out: str = setting("gpu-check", "folder for every file the check writes", path=True)
    budget: float | None = setting(None, "seconds for the whole check (None: 540; with --tiny 100)")
    tiny: bool = setting(False, "tiny shapes, uncompiled, on whatever device there is")
    only: str | None = setting(None, "comma-separated parts to run (listed below)")
    fail: str | None = setting(None, "parts replaced by a command that fails (the suite's test)")
    overrun: str | None = setting(None, "parts replaced by one that overruns (the suite's test)")


def parse(argv):
    try:
        a = CheckConfig(**parse_flags(CheckConfig, argv, "tools/gpu_check.py",
                                      f"parts: {', '.join(PARTS)}", read_config=files.read_config))
        for flag in ("only", "fail", "overrun"):
            for name in (getattr(a, flag) or "").split(","):
                if name and name not in PARTS:
                    raise UsageError(f"--{flag}={name} is not a part; name one of "
                                     f"{', '.join(PARTS)}")
        if a.budget is not None and not 0 < a.budget < math.inf:
            raise UsageError(f"--budget={a.budget:g} must be a positive number of seconds")
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            raise UsageError(f"--out={a.out} is a file; give a folder (it is created if missing)")
    except UsageError as e:
        raise SystemExit(error_line("gpu_check.py", e)) from None
    return a


def main(argv=None):
    return command.main("tools/gpu_check.py", check, sys.argv[1:] if argv is None else argv)


def check(argv):
    a = parse(argv)
    a.out = os.path.abspath(a.out)  # the parts run in the project folder
    reserve = TINY_RESERVE if a.tiny else RESERVE
    a.budget = a.budget or sum(reserve.values())
    names = [n for n in PARTS if not a.only or n in a.only.split(",")]
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        print(f"gpu_check.py: error: cannot create --out={a.out}: {e.strerror}", file=sys.stderr)
        return 2
    try:  # one check per --out, held to its end: a second would write over its files
        files.own(a.out, flag="--out", note=False)
    except UsageError as e:
        return error_line("gpu_check.py", e)
    report = Report(a, names, argv)
    scale = a.budget / sum(reserve.values())
    end = report.started + a.budget

    # logs whole when a part is killed; no .pyc files written into the project
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    injected = {**dict.fromkeys((a.fail or "").split(","), FAIL),
                **dict.fromkeys((a.overrun or "").split(","), OVERRUN)}
    try:
        for i, name in enumerate(names):
            part = PARTS[name](name, a.tiny)
            why = part.needed(a.out)
            if why:
                report.outcomes[name] = Outcome("not needed", note=why)
            else:
                cmd = ([sys.executable, "-c", injected[name]] if name in injected else
                       part.command(a.out))
                for path in part.files(a.out):
                    if os.path.exists(path):
                        os.remove(path)
                deadline = end - scale * sum(reserve[n] for n in names[i + 1:])
                log = os.path.join(a.out, f"{name}.log")
                status, note, seconds = run_part(cmd, {**env, **part.env()}, log,
                                                 deadline - time.time())
                o = Outcome(status, seconds, deadline - report.started, note,
                            [] if status == "passed" else tail(a.out, name))
                report.outcomes[name] = o
                if status in ("passed", "failed"):  # a failed tier still names its failures
                    try:
                        report.sections[name] = part.section(a.out)
                        # it ran, but checked nothing
                        if status == "passed" and part.skipped(a.out):
                            o.status, o.note = "skipped", part.skipped(a.out)
                    except (OSError, ValueError, KeyError, IndexError) as e:
                        if status == "passed":  # it passed, but left no result
                            o.status, o.note = "failed", f"its result unreadable ({e!r})"
                            o.tail = tail(a.out, name)
                if status == "stopped":
                    raise command.Stopped(command.Stop.name)
            report.write()
            print("\n".join(report.part_lines(name)) + "\n", flush=True)
    except command.Stopped:
        command.Stop.hold()  # once: the ending itself is not interrupted
        for name in names:
            if report.outcomes[name].note == "not reached yet":
                report.outcomes[name] = Outcome("not run", note="the check was stopped before it")
    report.done = True
    report.write()
    lines = report.lines()
    print("\n".join(lines[lines.index("## Targets"):]), flush=True)
    bad = [n + " (every test skipped)" * (report.outcomes[n].status == "skipped") for n in names
           if report.outcomes[n].status in ("failed", "overran", "stopped", "skipped")]
    print(f"wrote {os.path.join(a.out, 'report.md')}: "
          f"{'every part passed' if not bad else 'not passed: ' + ', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
