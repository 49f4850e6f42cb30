"""
Resuming and launching from anywhere: a resume writes only where it read and logs one curve, its
saved settings are read as flags are, torchrun restarts continue the run they restart, a frozen peer
is named, and runs, data and paths resolve the same way from any working folder.

    python -m pytest tests/test_resume_launch.py -q --all
"""

import json
import os
import platform
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import train
from support import checkpoint
from conftest import ROOT, TINY, listed, losses, poison_micro_batch, run, snapshot

pytestmark = pytest.mark.slow  # real training runs and processes: python -m pytest --all


@pytest.fixture(scope="module")
def finished(data_root, tmp_path_factory):  # noqa: F811
    """A finished tiny run (iter 2, checkpoints at 0 and 2); tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert run(["--max_iters=2", "--eval_interval=2"], data_root, out) == 0
    return out


def one_line(capsys, prog="train.py"):
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
    return err


def script(name, *flags, cwd, env=None):
    """python ROOT/name flags, run in the folder cwd: (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, name), *flags], cwd=cwd, text=True,
                       capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def records(out, key):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [r["iter"] for r in map(json.loads, f) if key in r]


def iter_of(out, name="ckpt.pt"):
    return torch.load(os.path.join(out, name), weights_only=True)["iter_num"]


def resave(path, change):
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


# -----------------------------------------------------------------------------
# A resume writes where it read, and its log stays one curve

def test_a_resume_writes_where_it_read_not_where_the_run_was_saved(finished, tmp_path):
    """A copied run (its checkpoint names the folder it came from) resumed with the default --out_dir
    continues in out/, where it read, and leaves the folder it was copied from as it was."""
    before = snapshot(finished)
    work = tmp_path / "work"
    shutil.copytree(finished, work / "out")
    code, out, err = script("train.py", "--init_from=resume", "--max_iters=4", cwd=work)
    assert code == 0, err
    assert iter_of(work / "out") == 4 and records(work / "out", "val_loss") == [0, 2, 4]
    assert snapshot(finished) == before
    assert torch.load(work / "out" / "ckpt.pt", weights_only=True)["train_config"]["out_dir"] == "out"


def test_a_run_killed_before_its_second_checkpoint_logs_one_curve(data_root, tmp_path, monkeypatch):
    """Killed at iter 2 with one checkpoint, iter 0's, and resumed: iter 0 is evaluated (and logged)
    once, not again."""
    out = tmp_path / "run"
    poison_micro_batch(monkeypatch, 3)  # iter 2's
    assert run(["--max_iters=10", "--eval_interval=4"], data_root, out) == 1
    monkeypatch.undo()
    assert iter_of(out) == 0
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 0
    assert records(out, "val_loss") == [0, 4]
    assert records(out, "loss") == [1, 2, 3, 4]


# -----------------------------------------------------------------------------
# Saved settings are read as flags are, and named as the checkpoint's

SAVED_SETTINGS = [  # (setting, its saved value, words of the one-line error)
    ("batch_size", "4", "saved train_config: batch_size is \"4\" (a string), not an integer"),
    ("batch_size", 2.5, "saved train_config: batch_size is 2.5 (a number), not an integer"),
    ("lr", "x", "saved train_config: lr is \"x\" (a string), not a number or null"),
    ("data_order", 5, "saved train_config: data_order is 5 (a number), not text"),
    ("compile", "yes", "saved train_config: compile is \"yes\" (a string), not true or false or null"),
]


@pytest.mark.parametrize("key, value, message", SAVED_SETTINGS, ids=[f"{k}={v!r}" for k, v, _ in SAVED_SETTINGS])
def test_saved_settings_are_read_as_flags_are(key, value, message, finished, tmp_path, capsys):
    out = shutil.copytree(finished, tmp_path / "run")
    resave(out / "ckpt.pt", lambda c: c["train_config"].update({key: value}))
    before = snapshot(out)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    err = one_line(capsys)
    assert f"{out / 'ckpt.pt'}'s {message}; it is damaged or was edited: give --{key}=VALUE to replace it" in err
    assert snapshot(out) == before
    fixed = {"batch_size": "4", "lr": "1e-3", "data_order": "random", "compile": "false"}[key]
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4", f"--{key}={fixed}"]) == 0
    assert iter_of(out) == 4


def test_derived_settings_are_derived_again_on_resume(data_root, tmp_path, capsys):
    """A run of --max_iters=0 saves lr_decay_iters and warmup_iters as given (None), so that a resume
    to 4 derives them from its own --max_iters; a saved value out of range is named as the checkpoint's."""
    out = tmp_path / "run"
    assert run(["--max_iters=0"], data_root, out) == 0
    saved = torch.load(out / "ckpt.pt", weights_only=True)["train_config"]
    assert (saved["lr_decay_iters"], saved["warmup_iters"], saved["lr"], saved["min_lr"]) == (None,) * 4
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 0
    assert iter_of(out) == 4
    resave(out / "ckpt.pt", lambda c: c["train_config"].update(lr_decay_iters=0))
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=10"]) == 2
    err = one_line(capsys)
    assert err == (f"train.py: error: --lr_decay_iters=0 must be at least 1 (lr_decay_iters: the checkpoint's "
                   f"saved value, in {out / 'ckpt.pt'}; give --lr_decay_iters=VALUE to replace it)\n")
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6", "--lr_decay_iters=6"]) == 0


# -----------------------------------------------------------------------------
# A device this machine does not have is one line

DEVICES = [  # (--device, GPUs the machine shows, words of the one-line error)
    ("cuda:7", 2, "--device=cuda:7 is not a device of this machine (it has 2 GPU(s), cuda:0 to cuda:1); "
     "use --device=cuda or one of those"),
    ("cuda:x", 1, "--device=cuda:x is not a device of this machine (it has 1 GPU(s), cuda:0 to cuda:0)"),
    ("cuda", 0, "--device=cuda is not available on this machine; use --device=auto or --device=cpu"),
    ("cpu:1", 0, "--device=cpu:1 is not a device of this machine; use --device=cpu\n"),
]


@pytest.mark.parametrize("device, gpus, message", DEVICES, ids=[d[0] for d in DEVICES])
@pytest.mark.parametrize("prog", ["train.py", "sample.py"])
def test_a_device_the_machine_lacks_is_one_line(device, gpus, message, prog, finished, data_root, tmp_path,
                                                  capsys, monkeypatch):
    import sample
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    before = snapshot(finished)
    if prog == "train.py":
        assert run([f"--device={device}"], data_root, tmp_path / "out") == 2
    else:
        assert sample.main([f"--out_dir={finished}", f"--device={device}"]) == 2
    assert message in one_line(capsys, prog)
    assert snapshot(finished) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("local", [2, 3])  # local ranks count from 0: rank 2 of 2 GPUs has none
def test_more_torchrun_processes_than_gpus_is_one_line(local, monkeypatch):
    from types import SimpleNamespace
    from configurator import UsageError
    from support.device import Device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", str(local))
    with pytest.raises(UsageError, match=rf"^this process is torchrun's local rank {local}, but this machine has 2 GPU\(s\): "
                                         r"start at most 2 process\(es\) a machine \(--nproc_per_node=2\)$"):
        Device(SimpleNamespace(device="cuda", dist_timeout=5.0), True)


# -----------------------------------------------------------------------------
# A ~ the shell left in a path setting means the home folder

def test_grad_accum_defaults_to_one_micro_batch_a_process(tmp_path):
    """--grad_accum not given (or null): one micro-batch for each of the launch's processes; given:
    as given."""
    from support.run import settings
    got = [settings(train.TrainConfig, None, given, world, str(tmp_path)).grad_accum
           for given, world in [({}, 1), ({}, 3), ({"grad_accum": 6}, 3), ({"grad_accum": None}, 2)]]
    assert got == [1, 3, 6, 2]


def test_a_tilde_in_a_path_setting_is_the_home_folder(data_root, tmp_path):
    """--out_dir=~/runs/x (quoted, or after = where the shell leaves ~) writes into $HOME/runs/x, and no
    folder named ~ appears; a config file's path setting too; text such as sample.py's --start stays as given."""
    import configurator
    import sample
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    config = work / "c.json"
    config.write_text(json.dumps({"data_root": "~/data"}))
    shutil.copytree(data_root, home / "data")
    code, out, err = script("train.py", str(config), *TINY, "--out_dir=~/runs/x", "--max_iters=2", cwd=work,
                            env={"HOME": str(home)})
    assert code == 0, err
    assert iter_of(home / "runs" / "x") == 2 and os.listdir(work) == ["c.json"]
    saved = torch.load(home / "runs" / "x" / "ckpt.pt", weights_only=True)["train_config"]
    assert saved["data_root"] == str(home / "data")
    given = configurator.parse_flags(sample.SampleConfig, ["--start=~/x", "--out_dir=~"], "sample.py")
    assert given == {"start": "~/x", "out_dir": os.path.expanduser("~")}


# -----------------------------------------------------------------------------
# Runs and data are found from any folder: one rule for the data root, recorded absolutely

def test_a_run_and_its_data_are_found_from_any_folder(data_root, tmp_path):
    """Trained in folder a on a relative --data_root, the checkpoint records the root absolutely: sample.py and
    probe.py run from folder b find its data. Moved, the data is named with --data_root, which both then take."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    shutil.copytree(data_root, a / "mine")
    code, _, err = script("train.py", *TINY, "--data_root=mine", "--out_dir=run", "--max_iters=2", cwd=a)
    assert code == 0, err
    run_dir = str(a / "run")
    assert torch.load(a / "run" / "ckpt.pt", weights_only=True)["train_config"]["data_root"] == str(a / "mine")
    sampled = ["sample.py", f"--out_dir={run_dir}", "--max_new_tokens=4"]
    probed = ["tools/probe.py", f"--out_dir={run_dir}", "--num_samples=2"]
    for cmd in (sampled, probed):
        code, out, err = script(*cmd, cwd=b)
        assert code == 0 and out, err
    os.rename(a / "mine", tmp_path / "moved")
    before = snapshot(tmp_path)
    for cmd in (sampled, probed):
        code, out, err = script(*cmd, cwd=b)
        assert code == 2 and err.count("\n") == 1, err
        assert (f"dataset 'tiny' is not in --data_root={a / 'mine'} (no {a / 'mine'}/tiny/"
                f"meta.json): give the folder it moved to with --data_root") in err
        code, out, err = script(*cmd, "--data_root=../moved", cwd=b)
        assert code == 0 and out, err
    assert snapshot(tmp_path) == before


def test_the_default_data_root_is_the_projects_from_any_folder(tmp_path):
    """A copy of the project run from another folder: train.py makes its dataset in the project's data/ (as
    prepare.py does, and prepare.py's --out_root=data too), never a data/ in the working folder; sample.py,
    run from a third folder, finds it."""
    clone, work, other = tmp_path / "clone", tmp_path / "work", tmp_path / "other"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", "tests", "results", "dev", "runs",
                                                               "__pycache__", "gpu-check"))
    for leftover in (clone / "data").iterdir():
        if leftover.is_dir() or leftover.name.endswith(".offline"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    work.mkdir(), other.mkdir()
    train_py = str(clone / "train.py")
    p = subprocess.run([sys.executable, train_py, *TINY, "--dataset=pydoc", "--out_dir=run", "--max_iters=1"],
                       cwd=work, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    assert (clone / "data" / "pydoc" / "meta.json").is_file() and listed(work) == ["run"]
    (other / "t.txt").write_text("some text to tokenize, " * 200)
    p = subprocess.run([sys.executable, str(clone / "data" / "prepare.py"), "--dataset=mine", "--input=t.txt",
                        "--out_root=data"], cwd=other, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (clone / "data" / "mine" / "meta.json").is_file() and os.listdir(other) == ["t.txt"]
    p = subprocess.run([sys.executable, str(clone / "sample.py"), f"--out_dir={work / 'run'}", "--max_new_tokens=4"],
                       cwd=other, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout, p.stderr


# -----------------------------------------------------------------------------
# torchrun: a restart continues its launch's run; a frozen peer and a failed join are one line

def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def worker(launcher, local_rank):
    """The pid of the launcher's worker of LOCAL_RANK local_rank."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"LOCAL_RANK={local_rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"no worker of local rank {local_rank} under {launcher}")


def lines_until(p, prefix, seen):
    for line in p.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return
    raise AssertionError("".join(seen))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
@pytest.mark.parametrize("overwrite", [True, False])
def test_a_torchrun_restart_continues_the_run(overwrite, finished, data_root, tmp_path):
    """torchrun --max-restarts=1: a worker killed at iter 55 (checkpoint at 50), the restart continues from
    iter 50, not 0 (with --overwrite its first checkpoint would replace the run), nor refuses the folder
    (without): the run ends at 120 with one curve in its log."""
    out = tmp_path / "run"
    if overwrite:  # an older run there, which this launch replaces as asked
        shutil.copytree(finished, out)
    cmd = torchrun("--max-restarts=1", os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}",
                   f"--out_dir={out}", "--grad_accum=2", "--max_iters=120", "--eval_interval=50",
                   f"--overwrite={str(overwrite).lower()}")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    seen = []
    try:
        lines_until(p, "iter 55:", seen)
        os.kill(worker(p.pid, 1), signal.SIGKILL)
        rest, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = "".join(seen) + rest
    assert p.returncode == 0, text[-3000:]
    assert f"torchrun restart 1 of this launch: continuing its run in {out} from its last checkpoint" in text
    assert iter_of(out) == 120
    assert records(out, "loss") == list(range(1, 121))
    assert records(out, "val_loss") == [0, 50, 100, 120]


def test_a_torchrun_restart_of_another_launch_starts_as_asked(finished, data_root, tmp_path, monkeypatch):
    """A restart (TORCHELASTIC_RESTART_COUNT=1) finding another launch's checkpoint is no continuation: without
    --overwrite the folder is refused as for any scratch run."""
    from support import torchrun
    out = shutil.copytree(finished, tmp_path / "run")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another-launch")
    assert not torchrun.restarted(str(out))
    resave(out / "ckpt.pt", lambda c: c.update(launch=["another-launch"]))  # damaged: no launch's
    assert not torchrun.restarted(str(out))
    resave(out / "ckpt.pt", lambda c: c.update(launch="another-launch"))
    assert torchrun.restarted(str(out))  # its own checkpoint: it resumes, --overwrite or not
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not torchrun.restarted(str(out))


def test_a_resumes_notes_are_printed_once_under_torchrun(finished, tmp_path):
    """A torchrun job's resume says once, not once a process, that it takes a kept checkpoint and that the run
    is at --max_iters already."""
    out = shutil.copytree(finished, tmp_path / "run")
    os.rename(out / "ckpt.pt", out / "ckpt_2.pt")
    p = subprocess.run(torchrun(os.path.join(ROOT, "train.py"), "--init_from=resume", f"--out_dir={out}",
                                "--max_iters=2", "--grad_accum=2"), cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count(f"note: resuming from {out / 'ckpt_2.pt'} (iter 2), the run's latest checkpoint\n") == 1
    assert p.stdout.count("is at iter 2, already --max_iters=2: nothing to do") == 1, p.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
def test_a_frozen_peer_is_named_after_dist_timeout(data_root, tmp_path):
    """Two gloo processes under torchrun, rank 1 frozen by SIGSTOP: rank 0 stops after --dist_timeout=5 with one
    line naming rank 1 and the problem, its checkpoint whole."""
    out = tmp_path / "run"
    cmd = torchrun(os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}", f"--out_dir={out}",
                   "--grad_accum=2", "--max_iters=100000", "--eval_interval=100000", "--dist_timeout=5")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    seen, frozen = [], None
    try:
        lines_until(p, "iter 3:", seen)
        frozen = worker(p.pid, 1)
        os.kill(frozen, signal.SIGSTOP)
        lines_until(p, "train.py: error: ", seen)
    finally:
        if frozen:
            os.kill(frozen, signal.SIGKILL)
        p.communicate(timeout=120)
    assert seen[-1] == ("train.py: error: rank 0: no answer from rank 1 of this torchrun job within --dist_timeout=5 s "
                        "(Timed out waiting 5000ms for recv operation to complete): it is frozen (stopped, or "
                        "swapping) or its machine cannot be reached; the last checkpoint is whole: continue with "
                        "--init_from=resume\n")
    assert p.returncode != 0 and iter_of(out) == 0


def test_the_words_of_a_launch_its_id_and_a_lost_peer(monkeypatch):
    """A launch with run id "none" (torchrun without --rdzv_id) is told apart by machine and agent pid, so that one
    restarting is not taken for another's; the command that continues a job is the one that started it; a peer
    that times out is named as rank 1 - rank in a pair, as one of the others in a larger job."""
    from support import distributed, torchrun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert distributed.launch_id() == f"none@{platform.node()}:{os.getppid()}"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert distributed.launch_id() is None and distributed.launch(1) == "python"
    monkeypatch.setenv("RANK", "0")
    assert distributed.launch(1) == "torchrun --standalone --nproc_per_node=1"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.launch(4) == "torchrun --nnodes=2 --nproc_per_node=2 (and this job's rendezvous flags)"
    monkeypatch.setattr(torchrun, "_timeout", [5.0])
    monkeypatch.setattr(torchrun.dist, "get_rank", lambda: 1)
    for world, peer in ((2, "rank 0"), (3, "one of the other 2 processes")):
        monkeypatch.setattr(torchrun.dist, "get_world_size", lambda: world)
        assert torchrun.lost_peer(RuntimeError("[c10d.cpp:1] Timed out waiting")).startswith(
            f"rank 1: no answer from {peer} of this torchrun job within --dist_timeout=5 s (Timed out waiting): ")
    assert torchrun.lost_peer(RuntimeError("[gloo.cc:2] Connection closed by peer\nmore")) == (
        "another process of this torchrun job stopped (Connection closed by peer); its own output says why")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_process_that_cannot_join_its_job_is_one_line(rank, data_root, tmp_path):
    """A torchrun process whose peers never come (one failed before joining, or an elastic restart's rank that
    fails in init_process_group): rank 0 waiting for them, rank 1 unable to reach rank 0; one line each."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    code, out, err = script("train.py", *TINY, f"--data_root={data_root}", "--out_dir=run", "--grad_accum=2",
                            "--dist_timeout=3", cwd=tmp_path, env=env)
    # (torch's C++ side may log its own retries first: no Python traceback, and this line last)
    assert code == 2 and "Traceback" not in err and not os.path.exists(tmp_path / "run"), err
    last = err.splitlines()[-1]
    assert err.count("train.py: error: ") == 1 and last.startswith(
        "train.py: error: could not join the other processes of this torchrun job ("), err
    assert last.endswith("): one failed before joining (its own output says why), or did not come within "
                         "--dist_timeout=3 s")


# -----------------------------------------------------------------------------
# Kept checkpoints: every N-th iteration's, besides the latest, read by the tools with --ckpt=ITER

def test_kept_checkpoints_outlive_later_saves_and_the_tools_read_them(data_root, tmp_path, capsys):
    """--keep_every=4 (checkpoints every 2): ckpt_4.pt beside ckpt.pt, still there after the saves at 6 and 8; a
    resume continues from the latest; sample.py, probe.py and routing.py with --ckpt=4 read what the same tools
    read from a folder whose ckpt.pt is iter 4's (taken as unfinished: a kept one is asked for by name)."""
    from tools import probe, routing
    import sample
    out, alone = tmp_path / "run", tmp_path / "alone"
    assert run(["--max_iters=6", "--eval_interval=2", "--keep_every=4"], data_root, out) == 0
    assert listed(out) == ["ckpt.pt", "ckpt_4.pt", "log.jsonl"] and iter_of(out) == 6
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=8", "--keep_every=4"]) == 0
    assert listed(out) == ["ckpt.pt", "ckpt_4.pt", "ckpt_8.pt", "log.jsonl"]
    assert (iter_of(out), iter_of(out, "ckpt_4.pt"), iter_of(out, "ckpt_8.pt")) == (8, 4, 8)
    assert records(out, "val_loss") == [0, 2, 4, 6, 8]  # the resume took the latest, iter 6's
    alone.mkdir()
    shutil.copy(out / "ckpt_4.pt", alone / "ckpt.pt")
    capsys.readouterr()
    outputs = []
    for folder, kept in ((out, ["--ckpt=4"]), (alone, ["--unfinished=true"])):  # iter 4 of 6, both
        assert sample.main([f"--out_dir={folder}", *kept, "--max_new_tokens=20"]) == 0
        for tool in (probe, routing):
            assert tool.main([f"--out_dir={folder}", *kept, f"--json={tmp_path / tool.__name__}.json"]) == 0
        shown = capsys.readouterr().out.replace(str(folder), "FOLDER")
        numbers = [json.loads((tmp_path / f"{tool.__name__}.json").read_text()) for tool in (probe, routing)]
        outputs.append((shown, [[{**r, "out_dir": None} for r in rs] for rs in numbers]))
    assert outputs[0] == outputs[1] and "---------------" in outputs[0][0]
    assert sample.main([f"--out_dir={out}", "--ckpt=6"]) == 2
    assert one_line(capsys, "sample.py") == f"sample.py: error: {out} has no checkpoint of iter 6 (it has 4, 8)\n"
    assert sample.main([f"--out_dir={alone}", "--ckpt=5"]) == 2
    assert one_line(capsys, "sample.py") == f"sample.py: error: {alone} has no checkpoint of iter 5 (it has 4)\n"
    assert run(["--max_iters=6", "--eval_interval=2", "--keep_every=3"], data_root, tmp_path / "other") == 2
    assert one_line(capsys) == ("train.py: error: --keep_every=3 keeps checkpoints, which are saved every "
                                "--eval_interval=2 steps: give a multiple\n")
    assert run(["--max_iters=2", "--overwrite=true"], data_root, out) == 0  # a new run replaces all of the old
    assert listed(out) == ["ckpt.pt", "log.jsonl"]


def test_kept_checkpoints_are_checkpoints_to_a_resume_and_to_a_fresh_run(data_root, tmp_path, capsys):
    """A run whose ckpt.pt is gone but whose kept ckpt_2.pt and ckpt_4.pt remain: a fresh run there is refused,
    naming them and the latest to continue from; the resume continues from ckpt_4.pt, saying so, as the run never
    stopped would; --overwrite says which checkpoints it replaces, and replaces them at its first checkpoint."""
    out, whole = tmp_path / "run", tmp_path / "whole"
    flags = ["--eval_interval=2", "--keep_every=2", "--lr_decay_iters=6"]
    assert run([*flags, "--max_iters=6"], data_root, whole) == 0
    assert run([*flags, "--max_iters=4"], data_root, out) == 0
    os.remove(out / "ckpt.pt")
    before = snapshot(out)
    assert "note:" not in capsys.readouterr().out  # new folders: nothing replaced, nothing noted
    assert run([*flags, "--max_iters=4"], data_root, out) == 2
    assert one_line(capsys) == (f"train.py: error: {out} holds a run's checkpoints (ckpt_2.pt, ckpt_4.pt); "
                                f"continue from its latest, ckpt_4.pt (iter 4), with --init_from=resume, or start "
                                f"over with --overwrite=true (which replaces all of them), or choose another "
                                f"--out_dir\n")
    assert snapshot(out) == before
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 0
    assert f"note: resuming from {out / 'ckpt_4.pt'} (iter 4), the run's latest checkpoint" in capsys.readouterr().out
    assert records(out, "val_loss") == records(whole, "val_loss") == [0, 2, 4, 6]
    assert torch.equal(*(torch.load(d / "ckpt.pt", weights_only=True)["model"]["lm_head.weight"] for d in (out, whole)))
    assert run([*flags, "--max_iters=1", "--overwrite=true"], data_root, out) == 0
    assert (f"note: --overwrite=true: this run's first checkpoint replaces ckpt.pt, ckpt_2.pt, ckpt_4.pt, ckpt_6.pt "
            f"in {out}") in capsys.readouterr().out
    assert listed(out) == ["ckpt.pt", "log.jsonl"]


def test_a_resume_keeps_what_the_run_did(finished, tmp_path, capsys):
    """How the run began (--core_init), and the order it reads its data in, cannot change on resume (a switch
    to sequential would skip the windows before the step's), and a field of the checkpoint this code does not
    know (as "source" is to older code) is named rather than dropped: one line each, the run as it was."""
    out = shutil.copytree(finished, tmp_path / "run")
    before = snapshot(out)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--core_init=average"]) == 2
    assert one_line(capsys) == ("train.py: error: the checkpoint's model differs from the flags given: core_init: "
                                "checkpoint 'stepwise' vs given 'average'; resume without them\n")
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--data_order=sequential"]) == 2
    assert one_line(capsys) == ("train.py: error: the checkpoint's model differs from the flags given: data_order: "
                                "checkpoint 'random' vs given 'sequential'; resume without them\n")
    (tmp_path / "c.json").write_text('{"core_init": "average"}')  # a config file's value is given too
    assert train.main([str(tmp_path / "c.json"), "--init_from=resume", f"--out_dir={out}"]) == 2
    assert one_line(capsys).endswith("given 'average'; resume without them\n")
    assert snapshot(out) == before
    resave(out / "ckpt.pt", lambda c: c.update(teacher={"name": "big"}))
    before = snapshot(out)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    assert one_line(capsys) == (f"train.py: error: {out / 'ckpt.pt'} is intact, but this code does not know its "
                                f"teacher, which a resume would drop; resume it with the code that wrote it\n")
    assert snapshot(out) == before


def test_an_offline_run_of_tiny_shakespeare_resumes_with_the_command_that_began_it(tmp_path, capsys, monkeypatch):
    """Offline, --dataset=shakespeare_char trains on its stand-in, pydoc's text, which the checkpoint records; the
    same command with --init_from=resume (as table1.py gives it) continues on that data, as the run never stopped
    would; a dataset of that name that is not there is named as the one asked for."""
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", (tmp_path / "offline").as_uri())  # no download here
    root, flags = tmp_path / "data", [f for f in TINY if not f.startswith("--dataset")]
    common = [*flags, "--dataset=shakespeare_char", f"--data_root={root}", "--eval_interval=2"]
    assert train.main([*common, f"--out_dir={tmp_path / 'whole'}", "--max_iters=4"]) == 0
    assert train.main([*common, f"--out_dir={tmp_path / 'run'}", "--max_iters=2"]) == 0
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["train_config"]["dataset"] == "pydoc"
    assert train.main([*common, f"--out_dir={tmp_path / 'run'}", "--max_iters=4", "--init_from=resume"]) == 0
    assert losses(tmp_path / "run") == losses(tmp_path / "whole")
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["train_config"]["dataset"] == "pydoc"
    capsys.readouterr()
    assert train.main([*common[:-3], "--dataset=nope", f"--data_root={root}", f"--out_dir={tmp_path / 'run'}",
                       "--max_iters=6", "--init_from=resume"]) == 2
    assert one_line(capsys).startswith(f"train.py: error: dataset 'nope' is not in --data_root={root} (no ")


# -----------------------------------------------------------------------------
# Checkpoints of other versions of the code: a missing field takes its default, an unknown one is named

OLD = [  # (what differs, the change to the checkpoint, the one line of each reader, or None: it reads it)
    ("missing fields", lambda c: (c["model_config"].pop("slot0"), c["train_config"].pop("keep_every")), None),
    ("unknown field", lambda c: c["model_config"].update(depth_scale=2.0),
     "is intact, but this code cannot build its model (unknown config field(s) depth_scale; expected "),
    ("unknown scheme", lambda c: c["model_config"].update(scheme="half"),
     "is intact, but this code cannot build its model (unknown scheme 'half'; expected one of "),
    ("field of another type", lambda c: c["model_config"].update(n_head=None),
     "is intact, but this code cannot build its model ('<' not supported between instances of 'NoneType' "),
]


@pytest.mark.parametrize("what, change, message", OLD, ids=[w for w, _, _ in OLD])
def test_checkpoints_of_other_code_are_read_or_named_never_called_corrupt(what, change, message, finished, tmp_path,
                                                                           capsys):
    """A checkpoint saved before a field with a default existed loads with that default, which one note says;
    one with a config field or a scheme this code does not know is refused by name, as intact, by sample.py,
    probe.py, routing.py and a resume alike, and left as it is."""
    from tools import probe, routing
    import sample
    out = shutil.copytree(finished, tmp_path / "run")
    resave(out / "ckpt.pt", change)
    before = snapshot(out)
    readers = [("sample.py", sample.main, ["--max_new_tokens=4"]), ("probe.py", probe.main, ["--num_samples=2"]),
               ("routing.py", routing.main, []), ("train.py", train.main, ["--init_from=resume", "--max_iters=4"])]
    for prog, main, flags in readers:
        capsys.readouterr()
        checkpoint._noted.clear()  # each command notes once: here they share one process
        code = main([f"--out_dir={out}", *flags])
        err = capsys.readouterr().err
        if message is None:
            assert code == 0, err
            notes = [line for line in err.splitlines() if line.startswith("note:")]
            note = f"note: {out / 'ckpt.pt'} was saved without "
            assert notes[0] == note + "model_config's slot0; this code's defaults: slot0='scaled'"
            assert notes[1:] == ([note + "train_config's keep_every; this code's defaults: keep_every=0"]
                                 if prog == "train.py" else [])
        else:
            assert code == 2 and err.count("\n") == 1 and "corrupt" not in err, err
            assert err.startswith(f"{prog}: error: {out / 'ckpt.pt'} {message}") and err.endswith(
                "); read it with the code that wrote it\n"), err
            assert snapshot(out) == before
    assert message is not None or iter_of(out) == 4


def test_a_setting_this_code_does_not_know_is_named_on_resume(finished, tmp_path, capsys):
    import sample
    out = shutil.copytree(finished, tmp_path / "run")
    resave(out / "ckpt.pt", lambda c: (c["train_config"].update(router_lr=0.1), c.update(ema={})))  # and a field
    before = snapshot(out)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    assert one_line(capsys) == (f"train.py: error: {out / 'ckpt.pt'} is intact, but this code does not know its "
                                f"router_lr, ema, which a resume would drop; resume it with the code that wrote it\n")
    assert snapshot(out) == before
    assert sample.main([f"--out_dir={out}", "--max_new_tokens=4"]) == 0  # the model needs none of it


def test_no_message_advises_deleting_a_checkpoint():
    """Nothing that reads or writes checkpoints tells anyone to delete one (a message or otherwise)."""
    names = ["train.py", "sample.py", *(f"support/{n}" for n in os.listdir(os.path.join(ROOT, "support"))),
             "tools/probe.py", "tools/routing.py", "tools/consolidate.py", "tools/lm_eval_mesh.py"]
    found = [name for name in names if name.endswith(".py") and "delete" in open(os.path.join(ROOT, name)).read()]
    assert found == []


# -----------------------------------------------------------------------------
# Several nodes: one out_dir that every node sees, or every node stops with one line

def two_nodes(folders, *flags, kill_at=None):
    """Two torchrun 'nodes' of one process each on this machine (static rendezvous on a free port), each started
    in its own folder with the same flags: their (exit code, output) pairs. kill_at: node 1's worker is killed
    once node 0 prints that line, and each node may restart once (--max-restarts=1)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                               f"--node_rank={rank}", "--master_addr=127.0.0.1", f"--master_port={port}",
                               f"--max-restarts={int(kill_at is not None)}", os.path.join(ROOT, "train.py"), *flags], cwd=folder, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              start_new_session=True) for rank, folder in enumerate(folders)]
    seen = []
    try:
        if kill_at:
            lines_until(nodes[0], kill_at, seen)
            os.kill(worker(nodes[1].pid, 0), signal.SIGKILL)
        return [(p.wait(timeout=600), "".join(seen) * (not i) + p.stdout.read()) for i, p in enumerate(nodes)]
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def test_two_nodes_without_one_shared_out_dir_both_stop_in_one_line(finished, data_root, tmp_path):
    """Each node with its own copy of the run (no shared filesystem): both stop with the line that names the cause,
    nothing written; where today rank 0 would find its copy finished and leave, the other waiting for it. With one
    folder for both (the same path), the same resume runs."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        shutil.copytree(finished, node / "run")
    before = snapshot(*nodes)
    flags = [*TINY, f"--data_root={data_root}", "--out_dir=run", "--grad_accum=2", "--init_from=resume",
             "--max_iters=2", "--dist_timeout=60"]
    for code, output in two_nodes(nodes, *flags):
        errors = [line for line in output.splitlines() if "train.py: error: " in line]
        assert code != 0 and errors == [
            "train.py: error: --out_dir=run is not one folder for all processes: rank 1 (on "
            f"{platform.node()}) does not see the file rank 0 wrote there; several nodes need one out_dir on a "
            "filesystem every node sees, at the same path"], output[-3000:]
    assert snapshot(*nodes) == before
    results = two_nodes([nodes[0], nodes[0]], *flags[:-2], "--max_iters=4", "--dist_timeout=60")
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert iter_of(nodes[0] / "run") == 4 and records(nodes[0] / "run", "val_loss") == [0, 2, 4]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
def test_a_torchrun_restart_on_two_nodes_continues_the_run_on_both(data_root, tmp_path):
    """Two nodes' torchruns (static rendezvous: run id "none", so each node's launch id is its own machine:pid),
    node 1's worker killed at iter 15 (checkpoint at 10): rank 0 alone finding its launch's checkpoint must not
    resume while rank 1 starts afresh (they would wait on each other); both continue from iter 10."""
    flags = [*TINY, f"--data_root={data_root}", "--out_dir=run", "--grad_accum=2", "--max_iters=30",
             "--eval_interval=10", "--dist_timeout=30"]
    results = two_nodes([tmp_path, tmp_path], *flags, kill_at="iter 15:")
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert "torchrun restart 1 of this launch: continuing its run in run from its last checkpoint" in results[0][1]
    assert records(tmp_path / "run", "loss") == list(range(1, 31))
    assert records(tmp_path / "run", "val_loss") == [0, 10, 20, 30]
