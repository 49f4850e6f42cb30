"""
A run's output and the signals around it, with real processes, pipes, a pseudo-terminal and
signals: a stdout that fails (a closed pipe, /dev/full, a terminal gone with its ssh connection)
never stops a run from saving, an encoding without the text's characters never ends one, a SIGHUP
ignored by nohup stays ignored, a Ctrl-C in the closing sample stops it at once, and the scripts
run under PYTHONSAFEPATH=1 and torchrun without a warning.

    python -m pytest tests/test_streams.py -q --all
"""

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ENOSPC, EPIPE, HANG, ROOT, TINY, stdout_note
from support import command

pytestmark = pytest.mark.slow  # real training runs in processes: python -m pytest --all

LOOP = ["--max_iters=100000", "--eval_interval=100000", "--log_interval=100000"]  # quiet after iter 0


def train_cmd(data_root, out, *flags):
    return [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}",
            f"--out_dir={out}", *flags]


def saved_iter(out):
    return torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["iter_num"]


def log_notes(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [r["note"] for r in map(json.loads, f) if "note" in r]


def read_until(read, marker):
    """Read chunks with read() until marker is among them: all that was read."""
    seen = b""
    while marker not in seen:
        chunk = read()
        assert chunk, seen.decode(errors="replace")
        seen += chunk
    return seen


def resumes(data_root, out):
    """The run at out continues two more steps, from its checkpoint."""
    it = saved_iter(out)
    r = subprocess.run(train_cmd(data_root, out, "--init_from=resume", f"--max_iters={it + 2}"),
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0 and saved_iter(out) == it + 2, r.stderr


# -----------------------------------------------------------------------------
# A stdout that fails never stops a run from saving

def reader_closes_early(data_root, out):
    """python train.py | head -c 100: head leaves after the first line; the run trains to its end."""
    p = subprocess.Popen(train_cmd(data_root, out, "--max_iters=6"), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-c", "100"], stdin=p.stdout, stdout=subprocess.PIPE)
    p.stdout.close()  # head holds the pipe's only reading end
    assert len(head.communicate(timeout=HANG)[0]) == 100
    return p.wait(timeout=HANG), p.stderr.read().decode(), 6, EPIPE


def full_device(data_root, out):
    """python train.py > /dev/full: every write of stdout fails (a full disk under a log)."""
    with open("/dev/full", "w") as full:
        r = subprocess.run(train_cmd(data_root, out, "--max_iters=6"), cwd=ROOT, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=HANG)
    return r.returncode, r.stderr, 6, ENOSPC


def reader_gone_then_ctrl_c(data_root, out):
    """python train.py | tee log, then Ctrl-C: tee is gone, and the stop's own print meets the
    broken pipe first (nothing is printed between iter 0 and the stop)."""
    p = subprocess.Popen(train_cmd(data_root, out, *LOOP), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    read_until(lambda: p.stdout.read1(), b"iter 0: train loss")
    p.stdout.close()
    p.send_signal(signal.SIGINT)
    return p.wait(timeout=HANG), p.stderr.read().decode(), None, EPIPE


def terminal_gone_then_sighup(data_root, out):
    """ssh dropped: the terminal of stdout and stderr is gone (EIO), then SIGHUP. Nothing can be
    said on the terminal: the note is in log.jsonl."""
    master, slave = os.openpty()
    p = subprocess.Popen(train_cmd(data_root, out, *LOOP), cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=slave, stderr=slave)
    os.close(slave)
    try:
        read_until(lambda: os.read(master, 4096), b"iter 0: train loss")
    finally:
        os.close(master)
    p.send_signal(signal.SIGHUP)
    return p.wait(timeout=HANG), "", None, "Input/output error: its terminal is gone"


@pytest.mark.parametrize("case", [reader_closes_early, full_device, reader_gone_then_ctrl_c,
                                  terminal_gone_then_sighup], ids=lambda f: f.__name__)
def test_a_failing_stdout_never_stops_a_run_from_saving(case, data_root, tmp_path):
    """The run trains to its end (exit 0), or stops at the signal with its checkpoint (exit 130);
    one note names standard output, on stderr where stderr works, and in log.jsonl; it resumes."""
    out = tmp_path / "run"
    code, stderr, last, why = case(data_root, out)
    note = stdout_note("train.py", why)
    assert code == (0 if last else 130), stderr
    assert stderr == (f"{note}\n" if stderr else ""), stderr  # once, and never "the disk"
    assert log_notes(out)[0].startswith(note), log_notes(out)
    assert saved_iter(out) == last if last else saved_iter(out) >= 1
    resumes(data_root, out)


def test_a_print_from_a_signal_handler_waits_for_the_write_it_interrupts(monkeypatch):
    """A real signal arrives while stdout's buffered writer is in the middle of a write, and its
    handler prints (as Stop's does): a buffered writer refuses that ("reentrant call"), so Stream
    writes the handler's line once the interrupted write is done."""
    from support import command as console

    class Terminal(io.RawIOBase):  # a raw stream that takes its time to write
        data = b""

        def writable(self):
            return True

        def write(self, b):
            if not self.data:
                os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs here, inside this write
            self.data += bytes(b)
            return len(b)

    raw = Terminal()
    monkeypatch.setattr(sys, "stdout", console.Stream(io.TextIOWrapper(io.BufferedWriter(raw)),
                                                       "output", "train.py"))
    previous = signal.signal(signal.SIGUSR1, lambda *_: print("SIGUSR1: stop", flush=True))
    try:
        print("iter 1: loss 2.5", flush=True)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert raw.data == b"iter 1: loss 2.5\nSIGUSR1: stop\n"


def test_a_command_forgets_the_launcher_an_earlier_one_in_its_process_had(monkeypatch):
    """Stop's state is each command's own: a launcher named to one command (and gone) never stops
    the next command main() runs in the same process, which no launcher started."""
    monkeypatch.setenv(command.LAUNCHER, "999999999")  # named, not the parent: gone
    command.Stop.install()
    assert command.Stop.poll().requested()
    command.Stop.restore()
    monkeypatch.delenv(command.LAUNCHER)
    command.Stop.install()
    try:
        assert not command.Stop.poll().requested()
    finally:
        command.Stop.restore()


def test_a_signal_before_the_launchers_end_is_what_stops_the_run(monkeypatch, capsys):
    """SIGTERM came, then the launcher is found gone: the stop is still the signal's, said once."""
    monkeypatch.setenv(command.LAUNCHER, "999999999")  # named, not the parent: gone
    command.Stop.install()
    try:
        stop = command.Stop.poll()
        stop.signals, stop.name = 1, "SIGTERM"  # as _on_signal leaves them
        assert stop.requested() and (stop.signals, stop.name) == (1, "SIGTERM")
    finally:
        command.Stop.restore()
        command.Stop.install()  # (its state put back for the next command)
        command.Stop.restore()
    assert capsys.readouterr().out == ""


def test_a_request_that_came_during_the_last_step_stops_once_it_is_saved():
    """The last step finishes and saves (finished()): a request that came meanwhile stops the
    command then, rather than let its closing sample run; with none, finished() is True."""
    command.Stop.install()
    try:
        stop = command.Stop.poll()
        assert stop.finished() is True and stop.saved
        stop.install()
        stop.poll().signals, stop.name = 1, "SIGTERM"
        with pytest.raises(command.Stopped) as e:
            stop.finished()
        assert e.value.name == "SIGTERM" and stop.saved
    finally:
        command.Stop.restore()
        command.Stop.install()  # (its state put back for the next command)
        command.Stop.restore()


@pytest.mark.parametrize("named", ["\u00b2", "x", ""])
def test_a_launcher_named_by_no_pid_is_none(named, monkeypatch):
    """NANOMESH_LAUNCHER holding no process id (a digit int() does not read, as "\u00b2"): no
    launcher, and no traceback."""
    monkeypatch.setenv(command.LAUNCHER, named)
    command.Stop.install()
    try:
        assert command.Stop.poll().launcher is None and not command.Stop.requested()
    finally:
        command.Stop.restore()


def test_a_text_the_encoding_cannot_hold_is_escaped(tmp_path):
    """PYTHONIOENCODING=ascii and a dataset of accented letters: the closing sample of train.py and
    sample.py print escaped (\\xe9), and both end as they should."""
    from data.prepare import prepare
    src = tmp_path / "accents.txt"
    src.write_text("été à côté, où ça? déjà né.\n" * 400, encoding="utf-8")
    prepare("accents", input=str(src), out_root=str(tmp_path / "data"), log=lambda *a: None)
    out, env = tmp_path / "run", {**os.environ, "PYTHONIOENCODING": "ascii"}
    cmd = train_cmd(tmp_path / "data", out, "--dataset=accents", "--max_iters=2")
    for args in (cmd + ["--sample_tokens=60"],
                 [sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={out}",
                  "--max_new_tokens=60"]):
        r = subprocess.run(args, cwd=ROOT, capture_output=True, env=env, timeout=HANG)
        assert r.returncode == 0 and r.stderr == b"", r.stderr.decode()
        assert r.stdout.isascii() and b"\\x" in r.stdout, r.stdout


# -----------------------------------------------------------------------------
# Signals: nohup's SIGHUP, a Ctrl-C in the closing sample

def test_a_sighup_ignored_by_nohup_stays_ignored(data_root, tmp_path):
    """nohup python train.py &, then the terminal closes (SIGHUP): the run trains on, and a SIGTERM
    later still stops it with a checkpoint."""
    out = tmp_path / "run"
    p = subprocess.Popen(["nohup", *train_cmd(data_root, out, *LOOP, "--log_interval=1")], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    read_until(lambda: p.stdout.read1(), b"iter 0: train loss")
    p.send_signal(signal.SIGHUP)
    read_until(lambda: p.stdout.read1(), b"iter 30: loss")  # a few steps past the SIGHUP
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=HANG)
    assert p.returncode == 130 and b"SIGHUP" not in stdout, stderr.decode()
    assert b"SIGTERM: finishing this step, then saving a checkpoint" in stdout
    assert saved_iter(out) > 30


def test_a_ctrl_c_in_the_closing_sample_stops_it_at_once(data_root, tmp_path):
    """The run is finished and saved; a Ctrl-C in its closing sample (a million tokens: hours)
    stops it at once, saying that nothing is lost."""
    out = tmp_path / "run"
    p = subprocess.Popen(train_cmd(data_root, out, "--max_iters=2", "--sample_tokens=1000000"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("iter 2: train loss"):  # the last evaluation, then the last save
            break
    while not (out / "ckpt.pt").exists() or saved_iter(out) != 2:
        assert p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)  # not the hours its sample would take
    assert p.returncode == 130 and "finishing this step" not in stdout, stdout
    assert stderr == ("\ntrain.py: stopped by SIGINT, after the run finished; its last checkpoint is "
                      "saved, so nothing is lost\n")
    assert saved_iter(out) == 2


# -----------------------------------------------------------------------------
# The scripts as launched: PYTHONSAFEPATH=1, torchrun

def test_the_scripts_run_with_pythonsafepath(data_root, tmp_path):
    """PYTHONSAFEPATH=1 (Python 3.11) leaves the script's folder off sys.path: train.py and
    sample.py still find the project's modules, run from another folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONSAFEPATH"] = "1"
    out = tmp_path / "run"
    for args in (train_cmd(data_root, out, "--max_iters=1"),
                 [sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={out}",
                  "--max_new_tokens=5"]):
        r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=HANG)
        assert r.returncode == 0, r.stderr


def test_a_ddp_launch_prints_no_warning(data_root, tmp_path):
    """Two processes under torchrun (gloo): nothing on stderr warns."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *train_cmd(data_root, tmp_path / "run", "--max_iters=1", "--grad_accum=2")[1:]]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Warning" not in r.stderr, r.stderr[-3000:]
