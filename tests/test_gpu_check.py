"""
The GPU check (tools/gpu_check.py) in its tiny mode, on any machine, so that the command a lent GPU
runs cannot rot where there is none: a part made to fail and one made to overrun leave the rest of
the report, every file lands in --out, and nothing the check started outlives it.

    python -m pytest -q tests/test_gpu_check.py --all  # marked slow: the fast tier leaves it out
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import HANG, ROOT, listed
from support import command, tool
from tools import bench, gpu_check

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all

CHECK = os.path.join(ROOT, "tools", "gpu_check.py")
# in a part's place, a command that fails, or one that outlives any deadline with a child, both
# ignoring SIGTERM (ignored through exec too)
FAIL = "echo 'an injected failure'; echo 'its last line'; exit 1"
OVERRUN = "trap '' TERM; sleep 3600 & echo 'an injected overrun: pids' $$ $!; wait"
POSIX = pytest.mark.skipif(os.name != "posix", reason="process groups and SIGTERM are POSIX's")


INJECTED = """\
import json, sys
sys.path.insert(0, sys.argv[1])
from tools import gpu_check
commands, real = json.loads(sys.argv[2]), gpu_check.part_command

def part_command(name, *rest):
    return ["sh", "-c", commands[name]] if name in commands else real(name, *rest)

gpu_check.part_command = part_command
sys.exit(gpu_check.main(sys.argv[3:]))
"""


def injected(commands):
    """The check as a command; with commands (part -> a shell command), those parts replaced."""
    if not commands:
        return [sys.executable, CHECK]
    return [sys.executable, "-c", INJECTED, ROOT, json.dumps(commands)]


def check(tmp_path, *args, inject=None, timeout=HANG):
    """Run the check from an empty folder, which must stay empty -> (exit status, stdout, out)."""
    here, out = tmp_path / "cwd", tmp_path / "out"
    here.mkdir()
    r = subprocess.run([*injected(inject), "--tiny", f"--out={out}", *args],
                       capture_output=True, text=True, cwd=here, timeout=timeout)
    assert r.stderr == "" and list(here.iterdir()) == [], r.stderr[-3000:]
    return r.returncode, r.stdout, out


def pids(log):
    """The two process ids the injected overrun prints: its own and its child's."""
    found = re.search(r"an injected overrun: pids (\d+) (\d+)", log.read_text())
    assert found, log.read_text()
    return [int(found.group(1)), int(found.group(2))]


def running(pid):
    """Whether pid is a live process (a zombie, ended but not reaped by its new parent, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def assert_ended(pids):
    for _ in range(20):  # SIGKILL is delivered at once; the kernel may take a moment to tear down
        if not any(map(running, pids)):
            return
        time.sleep(0.1)
    assert not [p for p in pids if running(p)], pids


@POSIX
def test_a_failed_and_an_overrun_part_leave_the_rest_of_the_report(tmp_path):
    rc, stdout, out = check(tmp_path, "--budget=100", inject={"bench-160m": FAIL, "tier": OVERRUN})
    assert rc == 1
    assert stdout.endswith(f"wrote {out / 'report.md'}: not passed: bench-160m, tier\n")
    files = listed(out)
    assert files == ["bench-160m.log", "bench-410m.jsonl", "bench-410m.log", "profile.log",
                     "report.md", "tier.log"]
    assert all((out / f).is_file() for f in files) and len(files) <= 8
    report = (out / "report.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4] for line in report.splitlines()
            if line.startswith(tuple(f"| {n} | " for n in gpu_check.PARTS))}
    assert rows["bench-160m"][0] == "failed: exit 1" and rows["bench-410m"][0] == "passed"
    assert rows["tier"][0] == "overran: ended at its deadline, with its process group"
    assert rows["profile"][0] == "passed"
    # the overrun ran to its deadline, the budget's end less the profile's reserve (20 of 100 s),
    # then its process group had GRACE seconds; the parts' times are rounded to seconds
    assert rows["tier"][2] == "80 s"
    ended = sum(float(rows[n][1][:-2]) for n in ("bench-160m", "bench-410m", "tier"))
    assert 80 - 2 <= ended <= 80 + gpu_check.GRACE + 2, rows
    # the failed part's last lines, the overrun's, the other parts' results, the targets
    assert re.search(r"exit 1, after \d+ s; its last lines:\n\n```\n"
                     r"an injected failure\nits last line\n```", report)
    assert "## tier: overran" in report and "an injected overrun: pids" in report
    assert "| mesh | 1+1R2+1 |" in report  # bench.py's table
    assert "\n```\n---" in report.split("## profile: passed")[1]  # the profiler's table
    assert ("| mesh / base step time at 160m width (at most 1.05) | not measured: bench-160m "
            "failed | - |") in report
    assert re.search(r"\| mesh's MFU at 410m width \(at least 40%\) \| [0-9.]+% \| (yes|no) \|",
                     report)
    assert "| the CUDA tier passes | overran | no |" in report
    # each part's section printed as it ended, in order
    ends = (("bench-160m", "failed"), ("bench-410m", "passed"), ("tier", "overran"),
            ("profile", "passed"))
    at = [stdout.index(f"## {name}: {status}") for name, status in ends]
    assert at == sorted(at)
    assert_ended(pids(out / "tier.log"))


def start_overrun(out):
    """A check whose first part overruns, once that part's process and its child run."""
    proc = subprocess.Popen([*injected({"bench-160m": OVERRUN}), "--tiny", f"--out={out}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log, t0 = out / "bench-160m.log", time.time()
    while not (log.exists() and "pids" in log.read_text()) and time.time() - t0 < HANG:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    return proc, log


@POSIX
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_check_ends_its_part_and_says_what_did_not_run(how, tmp_path):
    """SIGTERM, Ctrl-C, or SIGHUP (a closed terminal, an ssh drop): the running part's process group
    ends, and the report says what ran and what did not."""
    out = tmp_path / "out"
    proc, log = start_overrun(out)
    proc.send_signal(getattr(signal, how))
    stdout, stderr = proc.communicate(timeout=HANG)
    assert proc.returncode == 1 and stderr == "", stderr
    report = (out / "report.md").read_text()
    assert f"| bench-160m | stopped: the check was stopped by {how} while it ran |" in report
    for name in ("bench-410m", "tier", "profile"):
        row = f"| {name} | not run: the check was stopped before it | - | - | - |"
        assert row in report, name
    assert listed(out) == ["bench-160m.log", "report.md"]
    assert_ended(pids(log))


@POSIX
def test_a_signal_while_an_overrun_part_is_ended_waits_for_its_end(tmp_path, monkeypatch):
    """A signal in the GRACE seconds between SIGTERM and SIGKILL of a part that overran: the part's
    process group still ends and the part is recorded as overran; the check stops after it."""
    monkeypatch.setattr(command.Stop, "signals", 0)  # put back after: later tests run parts
    command.Stop.install()
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))  # deadline 0.5 s, + GRACE
    try:
        timer.start()
        outcome = gpu_check.run_part(["sh", "-c", OVERRUN], dict(os.environ), tmp_path / "p.log", 0.5)
    except command.Stopped:
        pytest.fail("the signal cut the part's ending short: its process group may live on")
    finally:
        timer.join()
        command.Stop.restore()
    assert outcome[0] == "overran" and command.Stop.signals == 1
    with pytest.raises(command.Stopped):
        tool.release()  # as check() does once the part is recorded
    assert_ended(pids(tmp_path / "p.log"))


def test_only_runs_the_parts_it_names(tmp_path):
    """The tier alone, into an --out holding no more. Where no GPU is seen every CUDA test skips,
    saying why: the tier is reported as skipped, and the check as not passed."""
    import torch
    rc, stdout, out = check(tmp_path, "--only=tier")
    assert listed(out) == ["report.md", "tier.log"]
    report = (out / "report.md").read_text()
    assert re.search(r"`python -m pytest tests/test_cuda.py`: \d+ (passed|skipped)", report)
    assert "| bench-160m |" not in report
    assert ("| mesh / base step time at 160m width (at most 1.05) | not measured: bench-160m "
            "not selected") in report
    if torch.cuda.is_available():
        assert rc == 0 and "| tier | passed |" in report
        assert stdout.endswith("every part passed\n")
        return
    assert rc == 1 and "| tier | skipped: every test skipped (no CUDA GPU on this machine) |" in report
    assert "- SKIPPED [" in report and "| the CUDA tier passes | skipped | no |" in report
    assert stdout.endswith(f"wrote {out / 'report.md'}: not passed: tier (every test skipped)\n")


@POSIX
def test_a_tier_that_failed_where_the_rest_skipped_is_reported_as_failed(tmp_path, monkeypatch):
    """A tier whose tests that ran failed and whose others skipped did not "skip every test"."""
    log = ("FAILED tests/test_cuda.py::test_a - AssertionError\n"
           "SKIPPED [2] tests/test_cuda.py:41: needs two GPUs\n"
           "=== 1 failed, 2 skipped in 3.1s ===")
    monkeypatch.setattr(gpu_check, "part_command",
                        lambda *_: ["sh", "-c", f"printf '%s\\n' '{log}'; exit 1"])
    a = gpu_check.CheckConfig(out=str(tmp_path), budget=100, tiny=True)
    o = gpu_check.run("tier", a, gpu_check.Report(a, ["tier"], []), time.time() + HANG)
    assert (o.status, o.note) == ("failed", "exit 1")
    assert o.section[0] == "`python -m pytest tests/test_cuda.py`: 1 failed, 2 skipped in 3.1s."


@POSIX
def test_a_failed_part_shows_the_last_lines_of_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "part_command", lambda *_: ["sh", "-c", "seq 20; exit 1"])
    a = gpu_check.CheckConfig(out=str(tmp_path), budget=100, tiny=True)
    o = gpu_check.run("profile", a, gpu_check.Report(a, ["profile"], []), time.time() + HANG)
    assert (o.status, o.last) == ("failed", [str(i) for i in range(21 - gpu_check.TAIL, 21)])


@POSIX
def test_a_second_check_on_one_out_is_refused_and_touches_nothing(tmp_path):
    out = tmp_path / "out"
    first, log = start_overrun(out)
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        second = subprocess.run([sys.executable, CHECK, "--tiny", f"--out={out}", "--only=tier"],
                                capture_output=True, text=True, timeout=HANG)
        assert second.returncode == 2 and second.stdout == "" and second.stderr == (
            f"gpu_check.py: error: another run is using --out={out} (it holds the folder's lock); "
            f"wait for it to end, or choose another --out\n")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=HANG)
    assert first.returncode == 1 and "| bench-160m | stopped:" in (out / "report.md").read_text()
    assert_ended(pids(log))


@pytest.mark.parametrize("args, needle", [
    (["--only=bench"], "--only=bench is not a part; name one of bench-160m, bench-410m, tier, "
                       "profile"),
    (["--only=tier,prof"], "--only=prof is not a part"),
    (["--budget=0"], "--budget=0.0 must be a positive number of seconds"),
    (["--budget=soon"], "--budget=soon is not a number (or None)"),
])
def test_bad_input_is_one_line(args, needle, capsys):
    assert gpu_check.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check.py: error: ") and needle in err
    assert len(err.strip().splitlines()) == 1


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert gpu_check.main([f"--out={tmp_path / 'f'}"]) == 2
    assert f"--out={tmp_path / 'f'} is a file; give a folder" in capsys.readouterr().err


def test_a_gpu_runs_report_from_its_rows(tmp_path):
    """What only a GPU run's rows hold, rendered as the full check would: compiled and eager peaks
    beside the plan (bench.py's table), the targets comparing eager with the plan, and the profile
    not needed once mesh's MFU at 410m width is 40% or more."""
    def row(variant, vs_base, mfu, eager):
        return dict(variant=variant, layout="2+4R2+2", non_embedding_params=85_000_000,
                    ms_per_step=100.0, time_vs_base=vs_base, tokens_per_s=327680.0,
                    flops_per_s=mfu * 989e12, peak_fraction=mfu, warmup_s=41.5, warmup_graphs=2,
                    recompiles=0, peak_mb=9000.0, step_mb=4000.0, eager_peak_mb=eager,
                    plan_mb=10000.0, compile=True, device="cuda", dtype="bfloat16", batch_size=16,
                    block_size=2048, n_embd=768, vocab_size=50304)
    machine = dict(kind="machine", device="cuda", device_name="NVIDIA H200", torch="2.11.0",
                   threads=16, cpus=16, other_processes_cpus=0.0, peak_flops=989e12,
                   peak_source="spec sheet, dense bf16")
    for name, mfu in (("bench-160m", 0.38), ("bench-410m", 0.45)):
        rows = [row("base", 1.0, mfu, 12000.0), row("mesh", 1.02, mfu, 13000.0)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                        for r in rows + [machine]))
        (tmp_path / f"{name}.log").write_text("bench.py: timing\n" + bench.table(rows, machine))
    report = gpu_check.Report(gpu_check.CheckConfig(out=str(tmp_path), budget=540),
                              list(gpu_check.PARTS), ["--out", "OUT"])
    for name in ("bench-160m", "bench-410m"):
        section = gpu_check.section(name, str(tmp_path), False)
        report.outcomes[name] = gpu_check.Outcome("passed", 90.0, 230.0, section=section)
    text = "\n".join(report.lines())
    assert text.startswith("# GPU check: NVIDIA H200\n") and "`results/gpu-nvidia-h200.md`" in text
    assert "| CUDA peak MB | step MB | eager peak MB | plan MB | warm-up s | graphs |" in text
    assert ("| mesh | 2+4R2+2 | 85,000,000 | 100.0 | 1.020 | 327,680 | 445050.0 | 45.0 | 9000 "
            "| 4000.0 | 13000 | 10000 | 41.5 | 2 | 0 |") in text
    assert "| bench-410m | passed | 90 s | 230 s | `bench-410m.log` |" in text
    for target in ("| mesh / base step time at 160m width (at most 1.05) | 1.020 | yes |",
                   "| mesh's MFU at 410m width (at least 40%) | 45.00% | yes |",
                   "| base's eager peak memory / plan at 410m width (within 25%) | 1.20 | yes |",
                   "| mesh's eager peak memory / plan at 160m width (within 25%) | 1.30 | no |",
                   "| the CUDA tier passes | not run | no |"):
        assert target in text, target
    why = "mesh's MFU at 410m width is 45.0%, 40% or more"
    assert gpu_check.not_needed("profile", str(tmp_path), False) == why
    (tmp_path / "bench-410m.jsonl").unlink()
    assert gpu_check.not_needed("profile", str(tmp_path), False) is None  # not measured: it runs


def test_the_targets_are_met_at_their_bounds(tmp_path):
    """At most 1.05, at least 40%, within 25%: a figure on the bound meets its target (and a 410m MFU of 40% needs
    no profile); a tiny check always profiles."""
    rows = [dict(variant="base", time_vs_base=1.0, peak_fraction=0.3, eager_peak_mb=7500.0, plan_mb=10000.0),
            dict(variant="mesh", time_vs_base=1.05, peak_fraction=0.40, eager_peak_mb=12500.0, plan_mb=10000.0)]
    for name in ("bench-160m", "bench-410m"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [{}]))
    report = gpu_check.Report(gpu_check.CheckConfig(out=str(tmp_path), budget=540), list(gpu_check.PARTS), [])
    for name in ("bench-160m", "bench-410m"):
        report.outcomes[name] = gpu_check.Outcome("passed", section=["its table"])
    assert report.targets()[:6] == [
        ("mesh / base step time at 160m width (at most 1.05)", "1.050", True),
        ("base's eager peak memory / plan at 160m width (within 25%)", "0.75", True),
        ("mesh's eager peak memory / plan at 160m width (within 25%)", "1.25", True),
        ("mesh's MFU at 410m width (at least 40%)", "40.00%", True),
        ("base's eager peak memory / plan at 410m width (within 25%)", "0.75", True),
        ("mesh's eager peak memory / plan at 410m width (within 25%)", "1.25", True)]
    assert gpu_check.not_needed("profile", str(tmp_path), False) == "mesh's MFU at 410m width is 40.0%, 40% or more"
    assert gpu_check.not_needed("profile", str(tmp_path), True) is None
    (tmp_path / "bench-410m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:1] + [{}]))
    assert gpu_check.not_needed("profile", str(tmp_path), False) is None  # no mesh row: not measured


def test_the_reports_sections_say_how_each_part_went(tmp_path):
    """Its header, a row per part, and each part's section: what it left, else its last lines (200 characters of
    each) where it failed, overran or was stopped, else why it did not run."""
    report = gpu_check.Report(gpu_check.CheckConfig(out=str(tmp_path), budget=540), list(gpu_check.PARTS),
                              ["--out", "OUT"])
    o = report.outcomes
    o["bench-160m"] = gpu_check.Outcome("stopped", 12.4, 150.0, "the check was stopped by SIGTERM while it ran",
                                        last=["x" * 300, "its last line"])
    o["bench-410m"] = gpu_check.Outcome("failed", 3.0, 320.0, "exit 1", last=["boom"])
    o["profile"] = gpu_check.Outcome("not needed", note="mesh's MFU at 410m width is 45.0%, 40% or more")
    lines = report.lines()
    assert re.fullmatch(r"`python tools/gpu_check.py --out OUT`, \d{4}-\d\d-\d\d, \d+ s so far of a 540 s budget; "
                        r"commit as `results/gpu-no-bench-part-has-run.md`.", lines[2]), lines[2]
    assert lines[6:12] == ["| part | status | time | deadline | log |", "|---|---|---:|---:|---|",
                           "| bench-160m | stopped: the check was stopped by SIGTERM while it ran | 12 s | 150 s "
                           "| `bench-160m.log` |",
                           "| bench-410m | failed: exit 1 | 3 s | 320 s | `bench-410m.log` |",
                           "| tier | not run: not reached yet | - | - | - |",
                           "| profile | not needed: mesh's MFU at 410m width is 45.0%, 40% or more | - | - | - |"]
    report.done = True
    assert " s in all of a 540 s budget; " in report.lines()[2]
    assert report.part_lines("bench-160m") == [
        "## bench-160m: stopped", "", "the check was stopped by SIGTERM while it ran, after 12 s; its last lines:",
        "", "```", "x" * 200, "its last line", "```"]
    o["bench-410m"].section = ["its table"]  # a failed tier's summary
    assert report.part_lines("bench-410m") == [
        "## bench-410m: failed", "", "its table", "", "exit 1, after 3 s; its last lines:", "", "```", "boom", "```"]
    assert report.part_lines("tier") == ["## tier: not run", "", "not reached yet"]


def test_the_tiers_section_names_its_errors_and_slowest_tests():
    log = ("ERROR tests/test_cuda.py - ImportError: no\n12.01s setup    tests/test_cuda.py::test_a\n"
           "==== 1 error in 13.5s ====")
    assert gpu_check.tier_lines(log) == [
        "`python -m pytest tests/test_cuda.py`: 1 error in 13.5s.", "", "- ERROR tests/test_cuda.py - ImportError: no",
        "", "Slowest:", "", "- 12.01s setup    tests/test_cuda.py::test_a"]
