"""
The one GPU check, one command of at most 10 minutes on a Linux machine with one CUDA GPU:

    python tools/gpu_check.py --out "$OUT"           # report.md and each part's log, all in $OUT
    python tools/gpu_check.py --out DIR --only=tier  # one part again: its files, a report of it
    python tools/gpu_check.py --tiny --out DIR       # every part at a tiny shape, on any machine

Its parts: bench.py at two Pythia widths (SHAPES), the CUDA tier, and a profile of mesh's step
where its MFU missed 40%. Exit 1 if a part failed, overran, was stopped or skipped every test.
"""

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where every part runs
sys.path.insert(0, ROOT)  # python tools/X.py: the project's modules are one folder up
from configurator import UsageError, check_ranges, parse_flags, setting  # noqa: E402
from support import command, files, tool  # noqa: E402

BENCH, TIER = "tools/bench.py", "tests/test_cuda.py"
GRACE, TAIL = 3, 15  # seconds from SIGTERM to SIGKILL; last lines shown of a failed part
FULL = ["--dtype=bfloat16", "--compile=true", "--iters=10", "--warmup=3", "--decode=false"]
SHAPES = {  # bench part -> bench.py's flags
    "bench-160m": ["--model=pythia-160m", "--layout=2+4R2+2", "--block_size=2048",
                   "--batch_size=16"],
    "bench-410m": ["--model=pythia-410m", "--layout=4+8R2+4", "--block_size=2048",
                   "--batch_size=8"],
}
TARGETS = {  # bench part -> (target, key in mesh's row, format, whether met)
    "bench-160m": ("mesh / base step time at 160m width (at most 1.05)", "time_vs_base", ".3f",
                   lambda v: v <= 1.05),
    "bench-410m": ("mesh's MFU at 410m width (at least 40%)", "peak_fraction", ".2%",
                   lambda v: v >= 0.40),
}
TINY = ["--n_embd=64", "--n_head=2", "--block_size=32", "--batch_size=2", "--vocab_size=64",
        "--layout=1+1R2+1", "--iters=2", "--warmup=1", "--decode=false", "--threads=1"]
RESERVE = {"bench-160m": 150, "bench-410m": 170, "tier": 160, "profile": 60}  # of 540 s
TINY_RESERVE = {"bench-160m": 30, "bench-410m": 30, "tier": 20, "profile": 20}  # of 100 s
PARTS = tuple(RESERVE)  # in the order they run


@dataclass
class CheckConfig:
    """The one GPU check: bench.py, the CUDA tier and a profile (below), reported."""
    out: str = setting("gpu-check", "folder for every file the check writes", path=True)
    budget: float | None = setting(None, "seconds in all (None: 540; --tiny: 100)")
    tiny: bool = setting(False, "tiny shapes, uncompiled, on any device")
    only: str | None = setting(None, "comma-separated parts to run (listed below)")

    def __post_init__(self):
        check_ranges(self, [("budget", lambda v: v > 0, "a positive number of seconds")])
        for name in (self.only or "").split(","):
            if name and name not in PARTS:
                raise UsageError(f"--only={name} is not a part; name one of {', '.join(PARTS)}")
        tool.check_writable(self.out, "out", folder=True)  # a folder, not a run's nor a dataset's


@dataclass
class Outcome:
    """How a part went: passed, failed, overran, stopped, skipped, not needed, not run."""
    status: str
    seconds: float = 0.0
    deadline: float = 0.0   # seconds from the check's start
    note: str = ""          # the exit status, or why it did not run
    section: list = None    # the report's lines of what it left
    last: list = None       # its log's last lines


def flags(name, tiny):
    return [*(TINY if tiny else [*SHAPES[name], *FULL]), "--schemes=base,mesh"]


def part_command(name, tiny, out):
    if name in SHAPES:
        rows_file = os.path.join(out, f"{name}.jsonl")
        return [sys.executable, BENCH, *flags(name, tiny), f"--json={rows_file}"]
    if name == "tier":  # -vv less pytest.ini's -q: a hang's last line names its test
        return [sys.executable, "-m", "pytest", "-vv", "-rfEs", "-p", "no:cacheprovider",
                "--durations=5", TIER]
    return [sys.executable, "-c", "import sys; from tools import gpu_check; "
            "gpu_check.profile_main(sys.argv[1:])", *flags("bench-410m", tiny)]


def read_log(out, name):
    with open(os.path.join(out, f"{name}.log"), encoding="utf-8", errors="replace") as f:
        return f.read()


def rows(out, name):
    """A bench part's rows and the machine's record, from its --json file."""
    records = files.read_text(os.path.join(out, f"{name}.jsonl")).splitlines()
    return [json.loads(r) for r in records[:-1]], json.loads(records[-1])


def section(name, out, tiny):
    """The report's lines of what a part left; raises where nothing is readable."""
    log = read_log(out, name)
    if name == "tier":
        return tier_lines(log)
    if name == "profile":
        return ["```", *log.split("top operators:\n", 1)[-1].rstrip().splitlines(), "```"]
    rows(out, name)  # whole, as the targets read them
    table = log[log.index("| variant |"):].rstrip().splitlines()  # bench.py's own
    return [f"`python {BENCH} {' '.join(flags(name, tiny))}`", "", *table]


def not_needed(name, out, tiny):
    """Why a part need not run (the profile, once mesh's MFU at 410m met 40%), or None."""
    if name != "profile" or tiny:
        return None
    try:
        mfu = {r["variant"]: r["peak_fraction"] for r in rows(out, "bench-410m")[0]}.get("mesh", 0)
    except (OSError, ValueError, IndexError):
        return None  # not measured: the profile may show why
    return None if mfu < 0.40 else f"mesh's MFU at 410m width is {100 * mfu:.1f}%, 40% or more"


def tier_lines(log):
    """The report's lines of the tier's pytest output: summary, failures, skips, slowest."""
    lines = log.splitlines()
    summary = next((line.strip("= ") for line in reversed(lines)
                    if re.search(r"\d+ (passed|skipped|failed|error)", line)), "no summary")
    named = [line for line in lines if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    slow = [line for line in lines if re.match(r"[0-9.]+s (call|setup|teardown) ", line)]
    return [f"`python -m pytest {TIER}`: {summary}.", "",
            *(f"- {line}" for line in named),
            *(["", "Slowest:", "", *(f"- {line}" for line in slow)] if slow else [])]


def profile_main(args, steps=3):
    """The top operators of mesh's `steps` steps by their own device time."""
    import torch
    from tools import bench
    bc = bench.BenchConfig(**parse_flags(bench.BenchConfig, [*args, "--schemes=mesh"], BENCH))
    device, _, autocast = bench.setup(bc)
    (_, cfg), = bench.variants(bc)
    model, opt = bench.build(cfg, bc, device)
    x, y = torch.randint(cfg.vocab_size, (2, bc.batch_size, cfg.block_size), device=device)
    step = (lambda: bench.train_step(model, opt, x, y, autocast))
    bench.timed(lambda: [step(), step()], device)  # warm-up, compilation
    P, cuda = torch.profiler, device.startswith("cuda")
    with P.profile(activities=[P.ProfilerActivity.CPU] + [P.ProfilerActivity.CUDA] * cuda) as p:
        bench.timed(lambda: [step() for _ in range(steps)], device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = p.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60)
    print("top operators:\n" + table, flush=True)


def run_part(cmd, env, log_path, timeout):
    """cmd in its own process group, output into log_path -> (status, note)."""
    with open(log_path, "w", encoding="utf-8") as log:
        tool.hold()  # a signal waits until the part is started and watched
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            tool.release()
            rc = proc.wait(timeout=max(timeout, 0))
            return ("passed", "") if rc == 0 else ("failed", f"exit {rc}")
        except subprocess.TimeoutExpired:
            return "overran", "ended at its deadline, with its process group"
        except command.Stopped as e:  # recorded, then the check stops
            return "stopped", f"the check was stopped by {e.name} while it ran"
        finally:  # SIGTERM to the group, SIGKILL GRACE s later (or once its leader ends)
            tool.hold()  # a signal waits until the part is recorded (check() releases)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(GRACE)
                except ProcessLookupError:
                    break  # the group is empty
                except subprocess.TimeoutExpired:
                    pass
            proc.wait()


class Report:
    """DIR/report.md, rewritten whole (atomically) after every part."""

    def __init__(self, a, names, argv):
        self.a, self.started, self.done = a, time.time(), False
        self.command = " ".join(["python tools/gpu_check.py", *argv])
        self.outcomes = {n: Outcome("not run", note="not reached yet") for n in names}

    def chip(self):
        """The GPU's name, from the first bench part that left its rows."""
        for name in SHAPES:
            try:
                return rows(self.a.out, name)[1]["device_name"]
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
                 "MFU: device.flops_per_token (PaLM's count) over the chip's dense bf16 peak.", "",
                 "| part | status | time | deadline | log |", "|---|---|---:|---:|---|"]
        for n, o in self.outcomes.items():
            ran = o.status not in ("not run", "not needed")
            cells = f"{o.seconds:.0f} s | {o.deadline:.0f} s | `{n}.log`" if ran else "- | - | -"
            lines.append(f"| {n} | {o.status}{f': {o.note}' if o.note else ''} | {cells} |")
        for n in self.outcomes:
            lines += ["", *self.part_lines(n)]
        lines += ["", "## Targets", "", "| target | measured | met |", "|---|---:|---|"]
        return lines + [f"| {what} | {value} | {'-' if met is None else 'yes' if met else 'no'} |"
                        for what, value, met in self.targets()]

    def part_lines(self, n):
        o = self.outcomes[n]
        lines = [f"## {n}: {o.status}", "", *(o.section or [])]
        if o.last and o.status in ("failed", "overran", "stopped"):
            lines += [""] * bool(o.section) + [
                f"{o.note}, after {o.seconds:.0f} s; its last lines:", "", "```",
                *(line[:200] for line in o.last), "```"]
        elif not o.section:
            lines.append(o.note or "-")
        return lines

    def targets(self):
        """(what, measured, met: True, False or None) of each target, or why not measured."""
        out = []
        for name, (what, key, spec, ok) in TARGETS.items():
            memory = f"eager peak memory / plan at {name[6:]} width (within 25%)"
            o = self.outcomes.get(name, Outcome("not selected"))
            if not o.section:  # read back from its rows only where it left them
                out += [(w, f"not measured: {name} {o.status}", None) for w in (what, memory)]
                continue
            by = {r["variant"]: r for r in rows(self.a.out, name)[0]}
            out.append((what, format(by["mesh"][key], spec), ok(by["mesh"][key])))
            for v, r in by.items():  # the plan models the eager step; on a GPU, exactly
                ratio = r["eager_peak_mb"] / r["plan_mb"] if r.get("eager_peak_mb") else None
                out.append((f"{v}'s {memory}", "-" if ratio is None else f"{ratio:.2f}",
                            None if ratio is None else abs(ratio - 1) <= 0.25))
        tier = self.outcomes.get("tier", Outcome("not selected"))
        return out + [("the CUDA tier passes", tier.status, tier.status == "passed")]

    def write(self):
        text = "\n".join(self.lines()) + "\n"
        files.atomic_write(os.path.join(self.a.out, "report.md"), lambda f: f.write(text), "w")


def main(argv):
    return command.main("tools/gpu_check.py", lambda given: check(given, argv), argv,
                        CheckConfig, f"parts: {', '.join(PARTS)}")


def check(given, argv):
    a = CheckConfig(**given)
    a.out = os.path.abspath(a.out)  # the parts run in the project folder
    reserve = TINY_RESERVE if a.tiny else RESERVE
    a.budget = a.budget or sum(reserve.values())
    names = [n for n in PARTS if not a.only or n in a.only.split(",")]
    os.makedirs(a.out, exist_ok=True)
    files.own(a.out, flag="--out", note=False)  # one check per --out at a time
    report = Report(a, names, argv)
    scale, end = a.budget / sum(reserve.values()), report.started + a.budget
    try:
        for i, name in enumerate(names):
            if why := not_needed(name, a.out, a.tiny):
                report.outcomes[name] = Outcome("not needed", note=why)
            else:
                # its deadline: the budget's end less what the parts after it reserve
                deadline = end - scale * sum(reserve[n] for n in names[i + 1:])
                report.outcomes[name] = run(name, a, report, deadline)
            report.write()
            print("\n".join(report.part_lines(name)) + "\n", flush=True)
            tool.release()  # a signal that stopped or came as the part ended: stop now
    except command.Stopped:
        tool.hold()  # once: the ending itself is not interrupted
        for o in report.outcomes.values():
            if o.note == "not reached yet":
                o.note = "the check was stopped before it"
    report.done = True
    report.write()
    lines = report.lines()
    print("\n".join(lines[lines.index("## Targets"):]), flush=True)
    bad = [n + " (every test skipped)" * (report.outcomes[n].status == "skipped") for n in names
           if report.outcomes[n].status not in ("passed", "not needed")]
    print(f"wrote {os.path.join(a.out, 'report.md')}: "
          f"{'every part passed' if not bad else 'not passed: ' + ', '.join(bad)}", flush=True)
    return 1 if bad else 0


def run(name, a, report, deadline):
    """A part, until its deadline -> its Outcome (stopped by a signal: the check stops after)."""
    cmd = part_command(name, a.tiny, a.out)
    if name in SHAPES:  # bench.py appends: a rerun starts afresh
        files.remove(os.path.join(a.out, f"{name}.jsonl"))
    # logs whole when a part is killed; no .pyc files written into the project
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if name == "tier":  # cuBLAS reads it once: set before the process starts
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    t0 = time.time()
    status, note = run_part(cmd, env, os.path.join(a.out, f"{name}.log"), deadline - t0)
    o = Outcome(status, time.time() - t0, deadline - report.started, note,
                last=read_log(a.out, name).rstrip().splitlines()[-TAIL:])
    if status in ("passed", "failed"):  # a failed tier still names its failures
        try:
            o.section = section(name, a.out, a.tiny)
            summary = o.section[0]  # a tier that checked nothing (no GPU seen) did not pass
            if name == "tier" and status == "passed" and not re.search(r"\d+ passed", summary):
                why = [line.split(": ", 1)[-1] for line in o.section if "- SKIPPED [" in line]
                o.status, o.note = "skipped", f"every test skipped ({(why or ['-'])[0][:80]})"
        except (OSError, ValueError, KeyError, IndexError) as e:
            if status == "passed":
                o.status, o.note = "failed", f"its result unreadable ({e!r})"
    return o


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
