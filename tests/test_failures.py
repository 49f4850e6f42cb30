"""
When things go wrong: one table-driven test per class of failure, with real processes, a real full
filesystem (where the machine allows mounting one) and a real kill -9 of torchrun. The promise under
test: nothing is lost (no bad checkpoint replaces a good one, no run spoils another's files), and
every bad input is one line naming the problem and the fix, exit 2, with nothing touched.

    python -m pytest tests/test_failures.py -q --all  # marked slow: the fast tier leaves it out
"""

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest
import torch

from support import checkpoint, command, tool
import configurator
from data.meta import dataset_record
import data.dataset as loader
import data.meta as data_meta
from support import run as guards
import mesh
from tools import probe
from support import files as runfiles
import sample
import train
from data.meta import DataError
from data.prepare import prepare
from conftest import HANG, ROOT, TEXT, TINY, copy_with_a_bug, listed, poison_micro_batch, run, small_disk, snapshot

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all


@pytest.fixture(scope="module")
def finished(data_root, tmp_path_factory):  # noqa: F811
    """A finished tiny run (iter 4, checkpoints at 0, 2 and 4); tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert run(["--max_iters=4", "--eval_interval=2"], data_root, out) == 0
    return out


def copy_of(folder, tmp_path, name="run"):
    return shutil.copytree(folder, tmp_path / name)


def one_line(capsys, prog="train.py"):
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
    return err


def python(*args):
    return [sys.executable, *args]


def train_cmd(data_root, out, *flags):  # noqa: F811
    return python(os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}", f"--out_dir={out}", *flags)


def wait_for_line(p, prefix, seen):
    """Read p's stdout until a line starts with prefix (lines kept in seen)."""
    for line in p.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return
    raise AssertionError("".join(seen) + p.stderr.read())


# -----------------------------------------------------------------------------
# Settings: every number has a range, checked before anything is written

BAD_SETTINGS = [  # (flags, environment, words of the one-line error)
    (["--min_lr=-1"], {}, "--min_lr=-1.0 must be a finite number, 0 or more"),
    (["--grad_clip=-1"], {}, "--grad_clip=-1.0 must be a finite number, 0 or more (0 disables clipping)"),
    (["--lr=inf"], {}, "--lr=inf must be a finite number above 0"),
    (["--lr=0"], {}, "--lr=0.0 must be a finite number above 0"),
    (["--weight_decay=nan"], {}, "--weight_decay=nan must be a finite number, 0 or more"),
    (["--beta1=1"], {}, "--beta1=1.0 must be in [0, 1)"),
    (["--beta2=-0.5"], {}, "--beta2=-0.5 must be in [0, 1)"),
    (["--dropout=1"], {}, "dropout=1.0 must be in [0, 1)"),  # mesh.Config's own check
    (["--warmup_iters=-1"], {}, "--warmup_iters=-1 must be 0 or more"),
    (["--lr_decay_iters=0"], {}, "--lr_decay_iters=0 must be at least 1"),
    (["--seed=-1"], {}, "--seed=-1 must be 0 or more"),
    (["--lr=1e-3", "--min_lr=1e-2"], {}, "--min_lr=0.01 is above --lr=0.001"),
    (["--min_lr=1e-2"], {}, "--min_lr=0.01 is above --lr=0.001, the classroom preset's; the cosine decays"),
    (["--warmup_iters=20", "--lr_decay_iters=10"], {}, "--warmup_iters=20 ends after the cosine does "
     "(--lr_decay_iters=10); warm up for at most 10 steps, or raise --lr_decay_iters"),
    (["--out_dir="], {}, "--out_dir is empty; give "),
    (["--data_root= "], {}, "--data_root is empty; give it a name, e.g. --data_root=data (its default)"),
    ([], {"RANK": "0"}, "RANK=0 needs WORLD_SIZE"),
    ([], {"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 needs WORLD_SIZE, with 0 <= RANK < WORLD_SIZE (got WORLD_SIZE=2)"),
]


@pytest.mark.parametrize("how", ["overwrite", "resume"])
@pytest.mark.parametrize("flags, env, message", BAD_SETTINGS, ids=[" ".join(f) or str(e) for f, e, _ in BAD_SETTINGS])
def test_bad_settings_touch_nothing(flags, env, message, how, finished, data_root, capsys, monkeypatch):  # noqa: F811
    """Over an existing run, with --overwrite=true or resuming it: one line, exit 2, log.jsonl and ckpt.pt intact."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = snapshot(finished, data_root)
    if how == "overwrite":
        assert run([*flags, "--overwrite=true", "--max_iters=8"], data_root, finished) == 2
    else:
        assert train.main(["--init_from=resume", f"--out_dir={finished}", "--max_iters=8", *flags]) == 2
    assert message in one_line(capsys)
    assert snapshot(finished, data_root) == before


@pytest.mark.parametrize("fails", [True, False], ids=["fails before its first checkpoint", "saves"])
def test_overwrite_replaces_the_old_run_at_the_new_ones_first_checkpoint(fails, finished, data_root, tmp_path,  # noqa: F811
                                                                         capsys, monkeypatch):
    """A run that fails before its first checkpoint (here its first evaluation is NaN) leaves the run it was
    to overwrite as it was, log.jsonl included; one that saves replaces ckpt.pt and log.jsonl together."""
    out = copy_of(finished, tmp_path)
    before = snapshot(out)
    if fails:
        monkeypatch.setattr(train, "evaluate", lambda *a: {"train": float("nan"), "val": float("nan")})
    assert run(["--overwrite=true", "--max_iters=3", "--eval_interval=3", "--seed=7"], data_root, out) == \
        (1 if fails else 0)
    if fails:
        assert "this run saved no checkpoint" in one_line(capsys) and snapshot(out) == before
    else:
        with open(out / "log.jsonl") as f:
            assert [r["iter"] for r in map(json.loads, f)] == [0, 1, 2, 3, 3]  # the new run's records only
        assert torch.load(out / "ckpt.pt", weights_only=True)["train_config"]["seed"] == 7
        assert listed(out) == ["ckpt.pt", "log.jsonl"]


# -----------------------------------------------------------------------------
# A blown-up model is never saved

def test_unsaveable_names_what_is_not_finite():
    model = mesh.RecursiveGPT(mesh.Config(vocab_size=20, block_size=8, n_embd=16, n_head=2, layout="1"))
    opt = model.configure_optimizer(0.01, 1e-3, (0.9, 0.95), "cpu")
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward()
    opt.step()
    ok = {"train": 3.0, "val": 3.1}
    assert guards.unsaveable(model, opt, ok) is None
    assert guards.unsaveable(model, opt, {"train": 3.0, "val": float("nan")}) == "val loss is nan"
    limit = 10 * np.log(20)
    assert guards.unsaveable(model, opt, {"train": 1e11, "val": 3.0}) == \
        f"train loss is 1e+11 (above {limit:.4g}, 10 x ln(vocab_size))"
    assert guards.unsaveable(model, opt, {"train": limit, "val": 3.0}) is None  # at the limit: saved
    assert guards.unsaveable(model, opt, {"train": 3.0, "val": limit + 1e-9}).startswith("val loss is 29.96 (above")
    opt.state[model.ln_f.weight]["exp_avg_sq"][3] = float("nan")
    assert guards.unsaveable(model, opt, ok) == "optimizer exp_avg_sq of ln_f.weight is not finite"
    with torch.no_grad():
        model.lm_head.weight[2, 1] = float("inf")
    assert guards.unsaveable(model, opt, ok) == "weight lm_head.weight is not finite"


EXPLOSIONS = [  # (how, flags, words of the one-line error, the iteration ckpt.pt keeps)
    ("resume --lr=1e6, evaluating every step", ["--lr=1e6", "--eval_interval=1"], "train loss is", 4),
    ("resume --lr=1e6, evaluating every 3 steps", ["--lr=1e6", "--eval_interval=3"], "loss is nan at iter", 4),
    ("scratch, the first evaluation is NaN", [], "train loss is nan at iter 0; stopped without saving, so this "
                                                 "run saved no checkpoint", None),
]


@pytest.mark.parametrize("how, flags, message, kept", EXPLOSIONS, ids=[e[0] for e in EXPLOSIONS])
def test_a_blown_up_model_is_never_saved(how, flags, message, kept, finished, data_root, tmp_path, capsys,  # noqa: F811
                                         monkeypatch):
    if how.startswith("scratch"):
        out = tmp_path / "new"
        evaluate = train.evaluate
        monkeypatch.setattr(train, "evaluate", lambda *a: {**evaluate(*a), "train": float("nan")})
        assert run(["--max_iters=4", "--eval_interval=2"], data_root, out) == 1
        assert not (out / "ckpt.pt").exists()
        with open(out / "log.jsonl") as f:  # what it logged stays, though no checkpoint commits it
            assert [r["iter"] for r in map(json.loads, f)] == [0]
    else:
        out = copy_of(finished, tmp_path)
        good = (out / "ckpt.pt").read_bytes()
        assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=12", *flags]) == 1
        assert (out / "ckpt.pt").read_bytes() == good
    err = one_line(capsys)
    assert message in err
    if kept is not None:
        assert f"{out / 'ckpt.pt'} (iter {kept}) is the last good checkpoint" in err
        assert sample.main([f"--out_dir={out}", "--max_new_tokens=5"]) == 0  # the kept checkpoint still samples


# -----------------------------------------------------------------------------
# A run owns its out_dir while it lives

def test_a_live_run_owns_its_out_dir(data_root, tmp_path):  # noqa: F811
    """While a run trains, a second run there (scratch or resume) is refused in one line and touches nothing;
    the lock goes with the run (SIGTERM here; kill -9 in test_train's kill test), and the next resume works."""
    out = tmp_path / "live"
    a = subprocess.Popen(train_cmd(data_root, out, "--max_iters=100000", "--eval_interval=1", "--eval_iters=1"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(a, "iter 2:", [])
        others = [subprocess.Popen(train_cmd(data_root, out, "--max_iters=3", *flags), cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                  for flags in (["--overwrite=true"], ["--init_from=resume"], [])]
        for b in others:
            _, stderr = b.communicate(timeout=120)
            assert b.returncode == 2 and stderr == (f"train.py: error: another run is using --out_dir={out} (it "
                                                    f"holds the folder's lock); wait for it to end, or choose "
                                                    f"another --out_dir\n"), (b.args, stderr)
        assert a.poll() is None  # still training, its temporary checkpoint files untouched
        a.send_signal(signal.SIGTERM)
        stdout, stderr = a.communicate(timeout=60)
        assert a.returncode == 130, stderr
    finally:
        a.kill()
    with open(out / "log.jsonl") as f:
        iters = [r["iter"] for r in map(json.loads, f) if "loss" in r]
    assert iters == list(range(1, len(iters) + 1))  # one run's records, none spliced in
    last = torch.load(out / "ckpt.pt", weights_only=True)["iter_num"]
    assert train.main(["--init_from=resume", f"--out_dir={out}", f"--max_iters={last + 1}"]) == 0


def windows_replace(monkeypatch):
    """os.replace as Windows' MoveFileEx: no file a reader holds open or memory-mapped is replaced (which,
    /proc/self says)."""
    replace = os.replace

    def windows(source, target):
        held = open("/proc/self/maps").read().split()
        held += [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
        if os.path.realpath(target) in held:
            raise PermissionError(13, "Access is denied")
        replace(source, target)
    monkeypatch.setattr(os, "replace", windows)


def test_a_reader_of_a_live_run_never_stops_its_next_save(finished, tmp_path, monkeypatch):  # noqa: F811
    """sample.py --unfinished=true on Windows (stood in for) holds a live run's model while the run goes on:
    its next save replaces ckpt.pt all the same (the reader maps the file only where that is no hold)."""
    out = copy_of(finished, tmp_path)
    with monkeypatch.context() as windows:
        windows.setattr(os, "name", "nt")
        model, ckpt, state = tool.load_run(str(out), "cpu", "sample.py", unfinished=True)
    windows_replace(monkeypatch)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 0
    assert checkpoint.peek(str(out / "ckpt.pt"))["iter_num"] == 6 and state == ""
    assert torch.equal(model.lm_head.weight, ckpt["model"]["lm_head.weight"])  # held still


def test_two_runs_started_together_one_wins(data_root, tmp_path):  # noqa: F811
    """Two scratch runs (--overwrite=true, which alone would let both through) started at once on a fresh
    out_dir: one trains, the other stops in one line; the winner's log holds its records only."""
    out = tmp_path / "race"
    procs = [subprocess.Popen(train_cmd(data_root, out, "--max_iters=100000", "--eval_interval=5", "--overwrite=true"),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.time() + 120
        while all(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.05)
        loser, = [p for p in procs if p.poll() is not None]
        winner, = [p for p in procs if p is not loser]
        assert loser.returncode == 2 and loser.stderr.read() == (
            f"train.py: error: another run is using --out_dir={out} (it holds the folder's lock); wait for it to "
            f"end, or choose another --out_dir\n")
        while not (out / "log.jsonl").exists() or '"loss"' not in (out / "log.jsonl").read_text():
            assert time.time() < deadline and winner.poll() is None  # training, its signal handlers set
            time.sleep(0.05)
        winner.send_signal(signal.SIGTERM)
        assert winner.wait(timeout=60) == 130
    finally:
        for p in procs:
            p.kill()
    with open(out / "log.jsonl") as f:
        iters = [r["iter"] for r in map(json.loads, f) if "loss" in r]
    assert iters == list(range(1, len(iters) + 1))


# a writer that makes its temporary (a file, or a folder as prepare.py's staging) as every writer does, says its
# name, and waits
WRITER = ("import sys, time; from support import files; "
          "print(files.temporary_name(sys.argv[1], folder=sys.argv[2] == 'folder'), flush=True); time.sleep(600)")


def start_writer(path, folder):
    p = subprocess.Popen(python("-c", WRITER, str(path), "folder" if folder else "file"), cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    return p, os.path.basename(p.stdout.readline().strip())


@pytest.mark.parametrize("kind", ["checkpoint temporary file", "prepare staging folder"])
def test_cleanup_removes_only_what_dead_writers_left(kind, tmp_path):
    """The process that holds a folder (own) removes every temporary a writer left there, a killed
    writer's as well as this process's own it let go: no other process writes there meanwhile. A user's
    file or folder that only looks like a leftover stays."""
    folder = kind == "prepare staging folder"
    dead, dead_name = start_writer(tmp_path / "log.jsonl", folder)
    dead.kill()
    dead.wait()
    let_go = runfiles.temporary_name(str(tmp_path / "meta.json"), folder)  # this process's, done
    mark = runfiles.MARK
    lookalikes = {f".notes-{dead.pid}-a1b2c3.tmp", f".ckpt.pt-{dead.pid}-0123abcd4567.tmp",
                  f".x-{dead.pid}-0123abcd.nanomesh.tmp", f".y-{dead.pid}-0123abcd4567ef.nanomesh.tmp",
                  f"keep-{dead.pid}-a1b2c3d4e5f6{mark}"}  # (not hidden: not ours)
    for name in lookalikes:
        if folder:
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_bytes(b"partial")
    try:
        assert runfiles.own(str(tmp_path))
        runfiles.remove_temporaries(str(tmp_path))
        assert set(os.listdir(tmp_path)) == {*lookalikes, runfiles.LOCK}
        assert dead_name not in lookalikes and os.path.basename(let_go) not in lookalikes
    finally:
        runfiles.release()



def test_a_lock_whose_database_stays_busy_is_a_live_run(tmp_path, monkeypatch):
    """filelock's constructor waits 5 s for the lock's database, then raises Timeout itself:
    another process holds it, the same one line as a lock held, and nothing is kept."""
    def busy(path, **kwargs):
        raise runfiles.filelock.Timeout(path)
    monkeypatch.setattr(runfiles.filelock, "ReadWriteLock", busy)
    with pytest.raises(configurator.UsageError, match="^another run is using --out_dir="):
        runfiles.own(str(tmp_path))
    assert os.path.realpath(tmp_path) not in runfiles._owned

NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]  # its command runs as PID 1


def in_namespace_works():
    try:
        return subprocess.run([*NAMESPACE, "true"], capture_output=True).returncode == 0
    except OSError:  # no unshare command
        return False


def wait_for_name(folder, prefix):
    while not os.path.isdir(folder) or not [n for n in os.listdir(folder) if n.startswith(prefix)]:
        time.sleep(0.1)
    return next(n for n in os.listdir(folder) if n.startswith(prefix))


@pytest.mark.skipif(not in_namespace_works(), reason="no PID namespaces here (unshare needs root)")
def test_a_staging_folder_is_its_writers_in_any_pid_namespace(tmp_path):
    """Two data/prepare.py in one data root, each PID 1 of its own PID namespace (as in two containers): each
    stages inside its own dataset's folder, which it holds, so the second leaves the first's live staging
    folder alone, and the first finishes. A third, killed by kill -9 while it downloads, leaves a staging
    folder named with PID 1, a live process (init) here: the next prepare of that dataset removes it all the
    same."""
    root, text, fifo = tmp_path / "data", write_text(tmp_path / "t.txt", TEXT), tmp_path / "download"
    root.mkdir()
    os.mkfifo(fifo)  # a download that waits for this test to write it
    def downloading(name):  # a prepare in a namespace of its own, its download waiting on the FIFO
        return subprocess.Popen([*NAMESPACE, *python("data/prepare.py", f"--dataset={name}",
                                                     f"--url={fifo.as_uri()}", f"--out_root={root}")],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True)
    def local(name):  # a prepare of a local file, in a namespace of its own
        return subprocess.run([*NAMESPACE, *python("data/prepare.py", f"--dataset={name}", f"--input={text}",
                                                   f"--out_root={root}")], cwd=ROOT, capture_output=True, text=True)
    first = third = None
    try:
        first = downloading("first")
        stage = wait_for_name(root / "first", ".staging-1-")
        r = local("second")
        assert r.returncode == 0 and (root / "first" / stage).is_dir(), r.stderr
        with open(fifo, "w") as f:
            f.write(TEXT)
        assert first.wait(timeout=HANG) == 0 and (root / "first" / "meta.json").is_file(), first.stderr.read()
        third = downloading("third")
        with open(fifo, "w") as f:  # half a download: 4 MB written, then the downloader is killed
            f.write("x" * (4 << 20))
            f.flush()
            stage = wait_for_name(root / "third", ".staging-1-")
            third.kill()  # (unshare --kill-child: its PID 1 dies with it)
            third.wait()
    finally:
        for p in filter(None, (first, third)):
            p.kill()
            p.wait()
    assert (root / "third" / stage).is_dir()
    assert local("third").returncode == 0
    assert listed(root / "third") == ["meta.json", "train.bin", "val.bin"]


def test_a_run_whose_data_root_is_its_out_dir_never_waits_on_itself(tmp_path):
    """train.py --out_dir=. --data_root=. on a dataset not prepared yet: it holds the folder as its run's, so it
    prepares the dataset there at once rather than wait for itself."""
    flags = [f for f in TINY if not f.startswith("--dataset")]
    r = subprocess.run(python(os.path.join(ROOT, "train.py"), *flags, "--dataset=pydoc", "--out_dir=.",
                              "--data_root=.", "--max_iters=1"), cwd=tmp_path, capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 0 and "waiting" not in r.stderr, r.stderr
    assert listed(tmp_path) == ["ckpt.pt", "log.jsonl", "pydoc"]


def test_a_read_only_data_root_names_the_fix(tmp_path):
    """A data root on a read-only file system (a real one, where this machine lets us mount it; else a folder
    without write permission, which root ignores) and a dataset not prepared there: one line naming both fixes,
    exit 2, nothing written."""
    root = tmp_path / "shared"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(root)],
                             capture_output=True).returncode == 0
    if not mounted:
        root.chmod(0o555)
        if os.access(root, os.W_OK):
            pytest.skip("cannot mount a read-only file system here, and permissions do not stop this user")
    try:
        why = os.strerror(errno.EROFS if mounted else errno.EACCES)
        r = subprocess.run(train_cmd(str(root), tmp_path / "out", "--dataset=pydoc", "--max_iters=1"), cwd=tmp_path,
                           capture_output=True, text=True, timeout=HANG)
        assert r.returncode == 2 and r.stderr == (
            f"train.py: error: cannot write dataset 'pydoc' in --data_root={root} ({why}); give a --data_root you "
            f"can write to, or have it prepared there by someone who can: python data/prepare.py --dataset pydoc "
            f"--out_root {root}\n")
        r = subprocess.run(python("data/prepare.py", "--dataset=pydoc", f"--out_root={root}"), cwd=ROOT,
                           capture_output=True, text=True, timeout=HANG)
        assert r.returncode == 2 and r.stderr == (f"prepare.py: error: cannot write dataset 'pydoc' in "
                                                  f"--out_root={root} ({why}); give a --out_root you can write to\n")
        assert os.listdir(root) == [] and not (tmp_path / "out").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=True)
        root.chmod(0o755)


def test_a_users_lookalike_of_a_leftover_survives_a_real_run(data_root, tmp_path):  # noqa: F811
    """A file of the user's named like the temporaries of old (.NAME-PID-HEX.tmp, its writer long gone)
    survives a real train.py run and a real prepare, both of which clean their folders' leftovers."""
    dead = subprocess.Popen(python("-c", "pass"))
    dead.wait()
    out, data = tmp_path / "out", copy_of(data_root, tmp_path, "data")
    out.mkdir()
    mine = {out / f".ckpt.pt-{dead.pid}-0123abcd.tmp", data / f".notes-{dead.pid}-beef.tmp"}
    for path in mine:
        path.write_text("my notes")
    (data / "t.txt").write_text("a b c\n" * 300)
    subprocess.run(python("data/prepare.py", "--dataset=t", "--input", str(data / "t.txt"),
                          f"--out_root={data}"), check=True, cwd=ROOT, capture_output=True, timeout=HANG)
    subprocess.run(train_cmd(str(data), out, "--max_iters=1"), check=True, cwd=ROOT, capture_output=True,
                   timeout=HANG)
    assert (out / "ckpt.pt").is_file() and all(path.read_text() == "my notes" for path in mine)


# -----------------------------------------------------------------------------
# Workers stop, with a checkpoint, when torchrun is gone

def kill_strays(marker):
    """kill -9 every process whose command line holds marker (workers a failed test left behind)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def test_workers_stop_with_a_checkpoint_when_torchrun_is_killed(data_root, tmp_path):  # noqa: F811
    out = tmp_path / "orphans"
    cmd = python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 *train_cmd(data_root, out, "--grad_accum=2", "--max_iters=100000", "--eval_interval=100000")[1:])
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = []
    try:
        wait_for_line(p, "iter 3:", seen)
        p.send_signal(signal.SIGKILL)  # the launcher only: its workers are re-parented and go on
        p.wait()
        reader = threading.Thread(target=lambda: seen.extend(p.stdout))  # until the workers close the pipe
        reader.start()
        reader.join(timeout=120)
        assert not reader.is_alive(), "the workers did not stop"
    finally:
        kill_strays(str(out))
    text = "".join(seen)
    assert "the process that launched this one (pid" in text and "checkpoint saved" in text, text[-3000:]
    assert f"Continue with torchrun --standalone --nproc_per_node=2 train.py --init_from=resume --out_dir={out}\n" in text
    stopped = int(text.split("stopped at iter ")[1].split(";")[0])
    _, ckpt = checkpoint.load(str(out))
    assert ckpt["iter_num"] == stopped >= 3


def test_a_run_whose_named_launcher_is_not_its_parent_stops_with_a_checkpoint(data_root, tmp_path):  # noqa: F811
    """A tool names itself to the process it starts (NANOMESH_LAUNCHER); named but not the parent, the
    process was re-parented before it polled: its launcher is gone, so it saves and stops at once."""
    gone = subprocess.Popen(python("-c", "pass"))
    gone.wait()
    out = tmp_path / "orphan"
    r = subprocess.run(train_cmd(data_root, out, "--max_iters=100000", "--eval_interval=100000"), cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, command.LAUNCHER: str(gone.pid)})
    assert r.returncode == 130, r.stdout + r.stderr
    assert f"the process that launched this one (pid {gone.pid}) is gone: finishing this step" in r.stdout
    assert "stopped at iter 1; checkpoint saved" in r.stdout, r.stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 1


# -----------------------------------------------------------------------------
# A checkpoint records the data it was trained on

def test_checkpoint_records_its_data(finished, data_root):  # noqa: F811
    ckpt = torch.load(finished / "ckpt.pt", weights_only=True)
    with open(os.path.join(data_root, "tiny", "meta.json")) as f:
        meta = json.load(f)
    assert ckpt["data"] == {k: meta[k] for k in ("tokenizer", "chars", "vocab_size", "dtype", "train_tokens",
                                                 "val_tokens", "sha256")}


CHANGED_DATA = [  # (the text the dataset is prepared again from, what differs, by name)
    (TEXT.replace("queen", "quail"), "characters 'al' added, sha256 '"),  # another vocabulary
    (TEXT.replace("king", "gink"), "sha256 '"),                      # the same characters, another text
]


@pytest.mark.parametrize("tool", ["sample", "resume", "probe"])
@pytest.mark.parametrize("text, changed", CHANGED_DATA, ids=["vocabulary", "text"])
def test_a_changed_dataset_is_refused_by_name(text, changed, tool, finished, data_root, tmp_path, capsys):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    (tmp_path / "new.txt").write_text(text)
    prepare("tiny", input=str(tmp_path / "new.txt"), out_root=str(data), log=lambda *a: None)
    out = copy_of(finished, tmp_path)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["train_config"]["data_root"] = str(data)
    torch.save(ckpt, out / "ckpt.pt")
    before = snapshot(out, data)
    if tool == "sample":
        assert sample.main([f"--out_dir={out}"]) == 2
    elif tool == "probe":
        code = probe.main([f"--out_dir={out}"])
        assert code == 2
    else:
        assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 2
    err = one_line(capsys, {"sample": "sample.py", "probe": "probe.py", "resume": "train.py"}[tool])
    assert f"{data / 'tiny' / 'meta.json'} is not the data the checkpoint was trained on: " in err
    assert changed in err and "prepare 'tiny' again from its original text" in err
    assert snapshot(out, data) == before


# -----------------------------------------------------------------------------
# Data is checked against meta.json before the first step

def edit_meta(**changes):
    def edit(folder):
        with open(folder / "meta.json") as f:
            meta = json.load(f)
        meta.update(changes)
        for k in [k for k, v in changes.items() if v is None]:
            del meta[k]
        (folder / "meta.json").write_text(json.dumps(meta))
    return edit


def edit_bin(split, fn):
    def edit(folder):
        path = folder / f"{split}.bin"
        path.write_bytes(fn(path.read_bytes()))
    return edit


def set_token(split, value):
    def fn(data):
        ids = np.frombuffer(data, dtype=np.uint16).copy()
        ids[len(ids) // 2] = value
        return ids.tobytes()
    return edit_bin(split, fn)


def shorten_train(folder, n=10):
    (folder / "train.bin").write_bytes((folder / "train.bin").read_bytes()[:2 * n])
    edit_meta(train_tokens=n)(folder)


DAMAGED_DATA = [  # (name, damage, words of the one-line error)
    ("meta dtype uint8", edit_meta(dtype="uint8"), "meta.json is damaged (ValueError: dtype 'uint8' does not hold "
                                                   "a vocabulary of 26, uint16 does)"),
    ("meta without chars", edit_meta(chars=None), "meta.json is damaged (ValueError: its 26 characters are missing)"),
    ("meta chars a number", edit_meta(chars=10**25), "meta.json is damaged (ValueError: its 26 characters are missing)"),
    ("meta without vocab_size", edit_meta(vocab_size=None), "no tokenizer, dtype or vocab_size"),
    ("meta indexed without prefix", edit_meta(format="indexed"), "meta.json is damaged (ValueError: prefix None is "
                                                                 "not a file name of the dataset's own folder)"),
    ("meta train_tokens text", edit_meta(train_tokens="10"), "meta.json is damaged (ValueError: train_tokens '10' "
                                                             "is not a count of tokens)"),
    ("meta says gpt2", edit_meta(tokenizer="gpt2"), "meta.json is damaged (ValueError: it has a character "
                                                    "vocabulary (chars) but says tokenizer 'gpt2')"),
    ("meta says gpt2, no chars", edit_meta(tokenizer="gpt2", chars=None), "vocab_size 26 is not GPT-2's 50257"),
    ("meta says another kind", edit_meta(tokenizer="wordpiece"), "tokenizer 'wordpiece' is not one of char, "
                                                                 "gpt2, bpe"),
    ("id at the vocabulary", set_token("train", 26), "train.bin holds token id 26, outside the vocabulary of 26"),
    ("id far above it", set_token("val", 60000), "val.bin holds token id 60000, outside the vocabulary of 26"),
    ("empty train.bin", edit_bin("train", lambda d: b""), "train.bin is empty"),
    ("odd size", edit_bin("train", lambda d: d[:-1]), "train.bin has 30563 bytes, not a whole number of uint16 tokens"),
    ("a token short", edit_bin("val", lambda d: d[:-2]), "val.bin holds 1,697 tokens but meta.json says 1,698"),
    ("shorter than a block", shorten_train, "block_size 16 + 1 is longer than the training split of 'tiny' (10 tokens in"),
    ("a block, not one more", lambda folder: shorten_train(folder, 16),
     "block_size 16 + 1 is longer than the training split of 'tiny' (16 tokens in"),
]


@pytest.mark.parametrize("name, damage, message", DAMAGED_DATA, ids=[d[0] for d in DAMAGED_DATA])
def test_damaged_data_is_refused_before_the_first_step(name, damage, message, data_root, tmp_path, capsys):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    damage(data / "tiny")
    before = snapshot(data)
    assert run(["--max_iters=2"], str(data), tmp_path / "out") == 2
    err = one_line(capsys)
    assert message in err and str(data / "tiny") in err and ("python data/prepare.py" in err or "--block_size" in err)
    assert snapshot(data) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where, found", [(0, True), (-1, True), (100, False)], ids=["first", "last", "between"])
def test_huge_splits_are_scanned_in_spread_pieces(where, found, data_root, tmp_path, monkeypatch):  # noqa: F811
    """Over SCAN_BYTES, load_split scans SCAN_PIECES pieces spread evenly, the first and last included:
    here 4 pieces of 8 tokens over the 1,698 validation tokens."""
    data = copy_of(data_root, tmp_path, "data")
    ids = np.fromfile(data / "tiny" / "val.bin", dtype=np.uint16)
    ids[where] = 26  # token 100 lies between the pieces at 0, 563, 1126 and 1690
    ids.tofile(data / "tiny" / "val.bin")
    monkeypatch.setattr(data_meta, "SCAN_BYTES", 0)
    monkeypatch.setattr(data_meta, "SCAN_PIECES", 4)
    monkeypatch.setattr(data_meta, "SCAN_PIECE_BYTES", 16)
    if found:
        with pytest.raises(DataError, match="val.bin holds token id 26, outside the vocabulary"):
            loader.load_split(str(data / "tiny"), "val")
    else:
        assert len(loader.load_split(str(data / "tiny"), "val")) == len(ids)


# -----------------------------------------------------------------------------
# Damaged checkpoints are refused on load, in one line

def flip_a_bit(record):
    """Flip one bit in the middle of a record of a torch.save zip, leaving its CRC as it was: record "tensor"
    (the largest tensor's storage, archive/data/N) or "pickle" (archive/data.pkl, the structure)."""
    return lambda path: flip_bit_in(path, record)


def flip_bit_in(path, record):
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if ("/data/" in i.filename) == (record == "tensor")
                    and (record == "tensor" or i.filename.endswith("data.pkl"))), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    data[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    return info.filename


def resave(change):
    def edit(path):
        ckpt = torch.load(path, weights_only=True)
        change(ckpt)
        torch.save(ckpt, path)
    return edit


def shrink_exp_avg(ckpt):
    entry = next(iter(ckpt["optimizer"]["state"].values()))
    entry["exp_avg"] = entry["exp_avg"][..., :1].clone()


DAMAGED_CHECKPOINTS = [  # (name, damage, the tools that refuse it, words of the one-line error)
    ("a flipped bit in a tensor", flip_a_bit("tensor"), ("sample", "resume"), "(ValueError: archive/data/"),
    ("a flipped bit in data.pkl", flip_a_bit("pickle"), ("sample", "resume"), "archive/data.pkl fails its CRC-32 check"),
    ("non-finite weights", resave(lambda c: c["model"]["lm_head.weight"].fill_(float("nan"))), ("sample", "resume"),
     "(ValueError: weight lm_head.weight is not finite)"),
    ("no optimizer", resave(lambda c: c.pop("optimizer")), ("resume",), "cannot be resumed: no valid optimizer"),
    ("no best_val_loss", resave(lambda c: c.pop("best_val_loss")), ("resume",), "cannot be resumed: no valid best_val_loss"),
    ("no iter_num", resave(lambda c: c.pop("iter_num")), ("sample", "resume"),
     "(ValueError: iter_num is None, not a count of steps)"),
    ("optimizer state of the wrong shape", resave(shrink_exp_avg), ("resume",), "the optimizer's exp_avg of parameter"),
    ("optimizer for another model", resave(lambda c: c["optimizer"]["param_groups"][0]["params"].pop()), ("resume",),
     "the optimizer's parameter groups differ from the model's"),
    ("optimizer state flattened", resave(lambda c: c["optimizer"]["state"][0].update(
        exp_avg=c["optimizer"]["state"][0]["exp_avg"].flatten())), ("resume",),
     "the optimizer's exp_avg of parameter 0 has shape (832,), the parameter (26, 32)"),
    ("optimizer with a parameter group fewer", resave(lambda c: c["optimizer"]["param_groups"].pop()),
     ("resume",), "the optimizer's parameter groups differ from the model's"),
    ("optimizer state a list", resave(lambda c: c["optimizer"].update(state=[])), ("resume",),
     "cannot be resumed: the optimizer state has no param_groups or state"),
    ("optimizer state of a parameter not a dict", resave(lambda c: c["optimizer"]["state"].update({0: 5})),
     ("resume",), "cannot be resumed: optimizer state for an unknown parameter 0"),
    ("optimizer state for a parameter the model lacks", resave(lambda c: c["optimizer"]["state"].update({999: {}})),
     ("resume",), "cannot be resumed: optimizer state for an unknown parameter 999"),
    ("a negative iter_num", resave(lambda c: c.update(iter_num=-3)), ("sample", "resume"),
     "(ValueError: iter_num is -3, not a count of steps)"),
    ("train_config without its dataset", resave(lambda c: c["train_config"].pop("dataset")), ("sample", "resume"),
     "(TypeError: train_config's dataset is None, not a name)"),
    ("a data_root that is a number", resave(lambda c: c["train_config"].update(data_root=5)), ("sample", "resume"),
     "(TypeError: train_config's data_root is 5, not a name)"),
    ("train_config a list", resave(lambda c: c.update(train_config=[])), ("sample", "resume"),
     "(TypeError: train_config is [], not a dict)"),
    ("a data record that is a string", resave(lambda c: c.update(data="tiny")), ("sample", "resume"),
     "(TypeError: data (the dataset record) is a str, not a dict)"),
    ("a setting that is not a plain value", resave(lambda c: c["train_config"].update(lr=[1])), ("sample", "resume"),
     "(TypeError: lr is not a plain value)"),
    ("a weight missing", resave(lambda c: c["model"].pop("wte.weight")), ("sample", "resume"),
     'cannot build its model (Error(s) in loading state_dict for RecursiveGPT: Missing key(s) in state_dict: '
     '"wte.weight".'),
    ("a weight of another shape", resave(lambda c: c["model"].update({"ln_f.bias": torch.zeros(3)})),
     ("sample", "resume"), "size mismatch for ln_f.bias: copying a param with shape torch.Size([3])"),
]


@pytest.mark.parametrize("name, damage, tools, message", DAMAGED_CHECKPOINTS, ids=[d[0] for d in DAMAGED_CHECKPOINTS])
def test_damaged_checkpoints_are_refused(name, damage, tools, message, finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    damage(out / "ckpt.pt")
    before = snapshot(out)
    for tool in tools:
        if tool == "sample":
            assert sample.main([f"--out_dir={out}"]) == 2
        else:
            assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 2
        err = one_line(capsys, f"{tool.replace('resume', 'train')}.py")
        assert f"{out / 'ckpt.pt'}" in err and message in err, err
    assert snapshot(out) == before


# -----------------------------------------------------------------------------
# A full disk while a checkpoint is written

def test_a_full_disk_keeps_the_last_checkpoint(finished, data_root, tmp_path, capsys, monkeypatch):  # noqa: F811
    """On a real full filesystem (a small tmpfs, where this machine lets us mount one; else a simulated
    ENOSPC from the write, as the kernel would raise it): one line naming ckpt.pt, exit 2, ckpt.pt as it
    was and no temporary file left; prepare.py on that disk says so plainly too."""
    size = os.path.getsize(finished / "ckpt.pt")
    disk, mounted = small_disk(tmp_path, 3 * size)
    try:
        out = shutil.copytree(finished, disk / "run")
        if mounted:  # leave half a checkpoint free: log.jsonl still fits, the next checkpoint does not
            free = shutil.disk_usage(disk).free
            (disk / "filler").write_bytes(b"\0" * (free - size // 2))
        else:
            def full(*a, **kw):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            monkeypatch.setattr(checkpoint.torch, "save", full)
        good = (out / "ckpt.pt").read_bytes()
        assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 2
        err = one_line(capsys)
        assert err.startswith(f"train.py: error: could not write {out / 'ckpt.pt'}: the disk is full (") and \
            err.endswith("bytes free); the previous checkpoint there, if any, is unchanged\n"), err
        assert (out / "ckpt.pt").read_bytes() == good and not [n for n in os.listdir(out) if n.endswith(".tmp")]
        if mounted:
            (tmp_path / "big.txt").write_text(TEXT * 20)
            r = subprocess.run(python("data/prepare.py", "--dataset", "big", "--input", str(tmp_path / "big.txt"),
                                      "--out_root", str(disk)), cwd=ROOT, capture_output=True, text=True)
            assert r.returncode == 2 and "None" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert r.stderr.startswith(f"prepare.py: error: could not write dataset 'big' in {disk}: the disk is "
                                       f"full (") and r.stderr.endswith("bytes free); the dataset was not written\n")
            assert not [n for n in os.listdir(disk) if n.startswith(".big")]  # its staging folder is gone
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


# -----------------------------------------------------------------------------
# Clear words

def test_clear_words(data_root, tmp_path, capsys, monkeypatch):  # noqa: F811
    # a finished run on a text without "\n" exits 0: its closing sample starts from token 0
    (tmp_path / "flat.txt").write_text(TEXT.replace("\n", " "))
    prepare("flat", input=str(tmp_path / "flat.txt"), out_root=str(tmp_path / "data"), log=lambda *a: None)
    args = [a for a in TINY if not a.startswith(("--dataset", "--sample_tokens"))]
    assert train.main([*args, "--dataset=flat", f"--data_root={tmp_path / 'data'}", f"--out_dir={tmp_path / 'f'}",
                       "--max_iters=2", "--sample_tokens=10"]) == 0
    assert "---- sample ----" in capsys.readouterr().out
    assert sample.main([f"--out_dir={tmp_path / 'f'}", "--max_new_tokens=5"]) == 0  # sample.py's default prompt too
    text = capsys.readouterr().out
    assert text[0] == " " and len(text) == 1 + 5 + len("\n---------------\n")  # token 0 (a space), then 5 tokens
    # the resume hint quotes a path with spaces, so that it can be pasted
    out = tmp_path / "with space"
    get_batch = train.get_batch

    def ctrl_c_in_step_1(data, tc, T, key, device):
        if key == (0, 1, 0):
            os.kill(os.getpid(), signal.SIGINT)
        return get_batch(data, tc, T, key, device)

    monkeypatch.setattr(train, "get_batch", ctrl_c_in_step_1)
    assert run(["--max_iters=10"], data_root, out) == 130
    hint = f"python train.py --init_from=resume {shlex.quote(f'--out_dir={out}')}"
    assert hint in capsys.readouterr().out and shlex.split(hint)[-1] == f"--out_dir={out}"
    # where a file system cannot lock folders (some NFS setups), a run trains and says it is unprotected
    def no_lock(*args, **kwargs):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(runfiles.filelock, "ReadWriteLock", no_lock)
    monkeypatch.setattr(train, "get_batch", get_batch)
    assert run(["--max_iters=1"], data_root, tmp_path / "nfs") == 0
    assert f"note: cannot lock --out_dir={tmp_path / 'nfs'} (No locks available); make sure no other run uses it" \
        in capsys.readouterr().out
    # an OSError that names no file is not "cannot use None: None"
    assert configurator.report("prepare.py", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) == 2
    assert capsys.readouterr().err == ("prepare.py: error: No space left on device; check the disk (free space, "
                                       "permissions) and try again\n")


ERRORS = [  # what a command's function raised: its exit code, and the one line on stderr
    ("usage", configurator.UsageError("--x=1 is bad"), 2, "x.py: error: --x=1 is bad"),
    ("oserror", NotADirectoryError(errno.ENOTDIR, "Not a directory", "f"), 2,
     "x.py: error: cannot use f: Not a directory; check the path"),
    ("blown_up", FloatingPointError("loss is nan"), 1, "x.py: error: loss is nan"),
    ("lost_peer", RuntimeError("[gloo] Connection reset by peer"), 1, "x.py: error: rank 1 is gone"),
    ("signal", command.Stopped("SIGTERM"), 130, "\nx.py: stopped by SIGTERM, so at once: a file being "
     "written, if any, was dropped, the one before it is as it was"),
]


@pytest.mark.parametrize("name, error, code, line", ERRORS, ids=[e[0] for e in ERRORS])
def test_a_commands_error_is_one_line_with_its_exit_code(name, error, code, line, capsys, monkeypatch):
    from support import distributed, torchrun
    monkeypatch.setattr(distributed, "grouped", lambda: True)  # a torchrun job's process
    monkeypatch.setattr(distributed, "close", lambda: None)
    monkeypatch.setattr(torchrun, "lost_peer", lambda e: "rank 1 is gone")

    def fails(argv):
        raise error
    assert command.main("x.py", fails, []) == code
    assert capsys.readouterr().err == line + "\n"


def test_debug_shows_the_traceback_of_a_signal_too(capsys):
    def stopped(given):
        raise command.Stopped("SIGINT")
    with pytest.raises(command.Stopped):
        command.main("sample.py", stopped, ["--debug=true"], sample.SampleConfig)
    assert command.main("sample.py", stopped, [], sample.SampleConfig) == 130


def test_a_command_gives_back_its_signal_handlers_locks_and_streams(tmp_path):
    signums = [getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]
    streams, mine = (sys.stdout, sys.stderr), lambda signum, frame: None
    before = [signal.signal(signum, mine) for signum in signums]  # the caller's own handlers

    def holds(argv):
        runfiles.own(str(tmp_path))
        command.Stop.poll()  # a loop that polls: its first signal would be a request
        assert sys.stdout is not streams[0] and runfiles._owned
    try:
        assert command.main("x.py", holds, []) == 0
        assert [signal.getsignal(signum) for signum in signums] == [mine] * len(signums)
    finally:
        for signum, handler in zip(signums, before):
            signal.signal(signum, handler)
    assert runfiles._owned == {} and (sys.stdout, sys.stderr) == streams


# -----------------------------------------------------------------------------
# A folder holding a run, whatever its format, is the run's

def fake_sharded(folder):
    """A sharded checkpoint's files (its shards folder, whole but damaged), as far as ownership rules look."""
    (folder / "shards-00000002").mkdir(parents=True)
    for name, content in (("__0_0.distcp", b"shard"), (".metadata", b""), ("state.json", b"{}")):
        (folder / "shards-00000002" / name).write_bytes(content)


def test_a_sharded_run_is_refused_and_replaced_whole(data_root, tmp_path, capsys):  # noqa: F811
    """A scratch run into a folder of a sharded run is refused; --overwrite replaces all of it at its first
    checkpoint (the old shards go, however damaged), so a resume continues the new run."""
    out = tmp_path / "run"
    fake_sharded(out)
    (out / checkpoint.POINTER).write_text("{}")  # earlier code's pointer: it goes too
    before = snapshot(out)
    assert run(["--max_iters=2"], data_root, out) == 2
    assert one_line(capsys) == (f"train.py: error: {out} holds a run's checkpoints ({checkpoint.POINTER}, "
                                f"shards-00000002); continue it "
                                f"with --init_from=resume, or start over with --overwrite=true (which replaces all of "
                                f"them), or choose another --out_dir\n")
    assert snapshot(out) == before
    assert run(["--max_iters=2", "--eval_interval=2", "--overwrite=true"], data_root, out) == 0
    assert listed(out) == ["ckpt.pt", "log.jsonl"]
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=3"]) == 0


def test_an_interrupted_sharded_save_is_no_run(data_root, tmp_path):  # noqa: F811
    """A shards folder without DCP's .metadata (a save killed midway) is no checkpoint: a new run there goes
    ahead, and removes it."""
    out = tmp_path / "run"
    (out / "shards-00000002").mkdir(parents=True)
    (out / "shards-00000002" / "__0_0.distcp").write_bytes(b"shard")
    assert run(["--max_iters=1"], data_root, out) == 0
    assert listed(out) == ["ckpt.pt", "log.jsonl"]


def test_a_sharded_save_without_its_state_is_refused_in_one_line(data_root, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    (out / "shards-00000002").mkdir(parents=True)
    (out / "shards-00000002" / ".metadata").write_bytes(b"")  # finished, but its state.json is gone
    assert run(["--max_iters=1"], data_root, out) == 2
    assert f"{out} holds a run's checkpoints (shards-00000002); continue it with --init_from=resume, or " \
        in one_line(capsys)


@pytest.mark.parametrize("taken", ["checkpoint", "log"])
def test_a_refused_run_prepares_no_dataset(taken, tmp_path, capsys, monkeypatch):
    """A run refused for its --out_dir (a run's checkpoint there, a
    linked log.jsonl) is refused before its dataset, prepared on first
    use, is prepared: nothing is written under --data_root."""
    text = tmp_path / "input.txt"
    text.write_text(TEXT)
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", text.as_uri())
    out, root = tmp_path / "run", tmp_path / "data"
    root.mkdir()
    if taken == "checkpoint":
        fake_sharded(out)
    else:
        out.mkdir()
        os.symlink(text, out / "log.jsonl")
    flags = [f for f in TINY if not f.startswith("--dataset=")]
    assert train.main([*flags, "--dataset=shakespeare_char",
                       f"--data_root={root}", f"--out_dir={out}"]) == 2
    said = {"checkpoint": f"{out} holds a run's checkpoints",
            "log": f"{out / 'log.jsonl'} is a symbolic link"}[taken]
    assert one_line(capsys).startswith(f"train.py: error: {said}")
    assert listed(root) == []


def test_a_second_table1_on_a_live_root_touches_nothing(tmp_path):  # noqa: F811
    """table1.py beside a live run of its --root (here its folder's lock, held by this process) stops before it
    deletes, truncates or trains anything there."""
    live = tmp_path / "root" / "vanilla_s0"
    live.mkdir(parents=True)
    for name in ("log.jsonl", "ckpt.pt", "train.out"):
        (live / name).write_text(f"the live run's {name}")
    before = snapshot(live)
    runfiles.own(str(live))
    try:
        r = subprocess.run(python(os.path.join(ROOT, "tools", "table1.py"), "--only=vanilla", "--seeds=0", "--max_iters=2",
                                  f"--root={tmp_path / 'root'}", f"--results={tmp_path / 'res'}"),
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    finally:
        runfiles.release()
    assert r.returncode == 2 and r.stderr == (f"table1.py: error: another run is using {live} (it holds the folder's "
                                              f"lock); wait for it to end, or choose another --root\n")
    assert snapshot(live) == before and not (tmp_path / "res").exists()


def test_two_prepares_of_one_dataset_never_mix(tmp_path):
    """While one data/prepare.py writes a dataset (here: its folder's lock, held by this process), a second one
    of the same name stops in one line and writes nothing."""
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "data" / "tiny").mkdir(parents=True)
    runfiles.own(str(tmp_path / "data" / "tiny"))
    try:
        r = subprocess.run(python(os.path.join(ROOT, "data", "prepare.py"), "--dataset", "tiny", "--input",
                                  str(tmp_path / "a.txt"), "--out_root", str(tmp_path / "data")),
                           capture_output=True, text=True, timeout=120)
    finally:
        runfiles.release()
    assert r.returncode == 2 and r.stderr == (f"prepare.py: error: dataset 'tiny' in {tmp_path / 'data'} is in use: a "
                                              f"live train.py run reads it, or another data/prepare.py writes it "
                                              f"({tmp_path / 'data' / 'tiny'} is locked); wait for it to end, or "
                                              f"prepare it under another name\n")
    assert listed(tmp_path / "data") == ["tiny"] and listed(tmp_path / "data" / "tiny") == []


def test_a_run_on_a_dataset_being_prepared_is_refused_in_one_line(data_root, tmp_path):  # noqa: F811
    """While data/prepare.py writes a dataset (here: its folder's lock, held by this process), a run on it
    stops in one line and trains nothing."""
    data = copy_of(data_root, tmp_path, "data")
    runfiles.own(str(data / "tiny"))
    try:
        r = subprocess.run(train_cmd(data, tmp_path / "out", "--max_iters=1"), cwd=ROOT, capture_output=True,
                           text=True, timeout=HANG)
    finally:
        runfiles.release()
    assert r.returncode == 2 and r.stderr == (f"train.py: error: --dataset={data / 'tiny'} is being written "
                                              f"(another process holds the folder's lock, as data/prepare.py "
                                              f"does); wait for it to end\n")
    assert not (tmp_path / "out" / "ckpt.pt").exists()


# -----------------------------------------------------------------------------
# Nothing read from a file that names a path reaches outside its own folder

def test_a_crafted_pointer_can_neither_read_nor_delete_elsewhere(finished, tmp_path, capsys):  # noqa: F811
    """Earlier code's ckpt-sharded.json is read only for the shards folder of its own run it names by name: one
    crafted to name a folder elsewhere is never read, nor is it deleted; the resume takes the run's ckpt.pt."""
    victim = tmp_path / "other_run" / "shards-00000001"
    victim.mkdir(parents=True)
    (victim / "__0_0.distcp").write_bytes(b"someone else's")
    (victim / ".metadata").write_bytes(b"someone else's")
    good = json.loads(json.dumps(dict(model_config=torch.load(finished / "ckpt.pt", weights_only=True)["model_config"],
                                      train_config={}, iter_num=9, best_val_loss=1.0, rng={"torch": [0] * 8})))
    for folder in (str(victim), "../other_run/shards-00000001"):
        out = copy_of(finished, tmp_path, f"run{len(folder)}")
        (out / "ckpt-sharded.json").write_text(json.dumps({**good, "folder": folder}))
        assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 0
        assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4
        assert (victim / "__0_0.distcp").read_bytes() == b"someone else's"


PATHS_IN_META = [("tokenizer_file", "../../secret.json"), ("tokenizer_file", "/etc/passwd"), ("prefix", "../document")]


@pytest.mark.parametrize("key, value", PATHS_IN_META, ids=[f"{k}={v}" for k, v in PATHS_IN_META])
def test_meta_json_names_only_its_own_files(key, value, data_root, tmp_path, capsys):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    edit_meta(**{key: value})(data / "tiny")
    assert run(["--max_iters=1"], str(data), tmp_path / "out") == 2
    assert f"meta.json is damaged (ValueError: {key} {value!r} is not a file name of the dataset's own folder)" in \
        one_line(capsys)


# -----------------------------------------------------------------------------
# A damaged or foreign file, a value out of its type's reach: one line naming the file and the field, exit 2

def byte_bpe():
    """A hand-written byte-level BPE tokenizer.json: the 256 bytes, one merge ('a' + 'b'), <|endoftext|>."""
    from data.bpe import bytes_to_unicode
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    vocab["ab"] = 256
    return {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
            "added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": True}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}, "decoder": {"type": "ByteLevel"}}


def tokenizer_case(change):
    def case(tmp, finished):
        spec = byte_bpe()
        change(spec)
        (tmp / "tokenizer.json").write_text(json.dumps(spec))
        (tmp / "in.txt").write_text(TEXT)
        return "prepare", ["--dataset", "bpe", "--input", str(tmp / "in.txt"), "--tokenizer", str(tmp / "tokenizer.json"),
                           "--out_root", str(tmp / "data")]
    return case


def config_case(text):
    def case(tmp, finished):
        (tmp / "c.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        return "train", [str(tmp / "c.json"), f"--out_dir={tmp / 'out'}"]
    return case


def sharded_case(change, text=None):
    def case(tmp, finished):
        out = shutil.copytree(finished, tmp / "run")
        state = dict(model_config=torch.load(out / "ckpt.pt", weights_only=True)["model_config"],
                     train_config={"dataset": "tiny"}, iter_num=9, best_val_loss=1.0, rng={"torch": [0] * 8})
        if change:
            change(state)
        (out / "shards-00000009").mkdir()
        (out / "shards-00000009" / ".metadata").write_bytes(b"")  # DCP's, written last: a whole one
        (out / "shards-00000009" / "state.json").write_text(text or json.dumps(state))
        return "train", ["--init_from=resume", f"--out_dir={out}", "--max_iters=12"]
    return case


def hf_case(config=None, files=()):
    def case(tmp, finished):
        path = tmp / "pythia"
        path.mkdir()
        hf = {**dict(model_type="gpt_neox", hidden_size=32, num_attention_heads=2, num_hidden_layers=1, vocab_size=32,
                     max_position_embeddings=16, intermediate_size=128), **(config or {})}
        (path / "config.json").write_text(json.dumps(hf))
        for name, content in files:
            if name.endswith(".bin") and content is None:
                torch.save({"gpt_neox.embed_in.weight": Exploit()}, path / name)  # unpickling it would run code
            else:
                (path / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        return "hf", [str(path)]
    return case


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch EXPLOITED",))


BAD_FILES = [  # (name, case(tmp, finished) -> (tool, args), words of the one-line error)
    ("config: 1e999 for an integer", config_case('{"max_iters": 1e999}'),
     "c.json' holds a number past a float's range (write a smaller one); fix it"),
    ("config: a 100-digit integer", config_case('{"max_iters": 1' + "0" * 100 + '}'),
     "c.json': max_iters is 100000...(101 digits), too large: an integer setting is at most 2**63 - 1"),
    ("config: an integer past a float's range", config_case('{"lr": 1' + "0" * 400 + '}'),
     "c.json' holds a number past a float's range (write a smaller one); fix it"),
    ("config: an object for a path", config_case('{"out_dir": {"a": 1}}'), "c.json': out_dir is {\"a\": 1} (an object), not text"),
    ("config: a string for an integer", config_case('{"max_iters": "100"}'), "c.json': max_iters is \"100\" (a string), not an integer"),
    ("config: a float lr of 1e999", config_case('{"lr": 1e999}'),
     "c.json' holds a number past a float's range (write a smaller one); fix it"),
    ("config: nested 100,000 deep", config_case("[" * 100_000 + "]" * 100_000),
     "c.json' is nested more than 64 levels deep; fix it, or give the settings as flags"),
    ("config: a key twice", config_case('{"lr": 1e-3, "lr": 2e-3}'), "c.json' has the key 'lr' twice; fix it"),
    ("config: NaN", config_case('{"lr": NaN}'), "c.json' holds NaN, which JSON does not allow (write a number)"),
    ("config: not UTF-8", config_case(b'{"out_dir": "caf\xe9"}'), "c.json' is not UTF-8 text (byte 16); fix it"),
    ("config: a NUL byte in a path", config_case('{"out_dir": "a\\u0000b"}'),
     "c.json holds a NUL byte, which no path or name can; remove it"),
    ("sharded state nested 100,000 deep", sharded_case(None, "[" * 100_000 + "]" * 100_000),
     "state.json is corrupt (PlainDataError: is nested more than 64 levels deep)"),
    ("sharded state without the dataset", sharded_case(lambda m: m["train_config"].clear()),
     "is corrupt (TypeError: train_config's dataset is None, not a name)"),
    ("--seed above 2**64", lambda tmp, f: ("train", ["--seed=18446744073709551617", f"--out_dir={tmp / 'o'}"]),
     "--seed=18446744073709551617, too large: an integer setting is at most 2**63 - 1"),
    ("--gpu_memory=inf", lambda tmp, f: ("train", ["--plan=true", "--gpu_memory=inf"]),
     "--gpu_memory=inf must be a finite number of GiB above 0"),
    ("sharded state with settings as text", sharded_case(lambda m: m.update(train_config="lr=1")),
     "is corrupt (TypeError: train_config is 'lr=1', not a dict)"),
    ("sharded state with a string iteration", sharded_case(lambda m: m.update(iter_num="9")),
     "is corrupt (ValueError: iter_num is '9', not a count of steps)"),
    ("tokenizer: two tokens on one id", tokenizer_case(lambda s: s["model"]["vocab"].update(ab=5)),
     "tokenizer.json is not a tokenizer nanoMeSH can run: model.vocab gives 'ą' and 'ab' the same id 5"),
    ("tokenizer: a 3-part merge", tokenizer_case(lambda s: s["model"].update(merges=["a b c"])),
     "model.merges holds 'a b c', not a pair of tokens"),
    ("tokenizer: a merge of unknown tokens", tokenizer_case(lambda s: s["model"].update(merges=["a zz"])),
     "the merge 'a zz' uses or makes 'zz', which model.vocab lacks"),
    ("tokenizer: an added token without id", tokenizer_case(lambda s: s["added_tokens"][0].pop("id")),
     "added_tokens holds {'content': '<|endoftext|>', 'special': True}, not a content string with an id from 0"),
    ("tokenizer: a bool for an id", tokenizer_case(lambda s: s["model"]["vocab"].update(ab=True)),
     "model.vocab gives 'ab' the id True, not an integer from 0 to 16,777,215"),
    ("tokenizer: a merge with an empty side", tokenizer_case(lambda s: s["model"].update(merges=["a "])),
     "model.merges holds 'a ', not a pair of tokens"),
    ("tokenizer: a merge making an unknown token", tokenizer_case(lambda s: s["model"].update(merges=["a c"])),
     "the merge 'a c' uses or makes 'ac', which model.vocab lacks"),
    ("tokenizer: an added token on a token's id", tokenizer_case(  # 256 tokens: tokenizers gives it 256 too
        lambda s: (s["model"]["vocab"].pop("q"), s["added_tokens"][0].update(id=256))),
     "the added token '<|endoftext|>' has id 256, which is 'ab''s"),
    ("tokenizer: a decoder as text", tokenizer_case(lambda s: s.update(decoder="ByteLevel")),
     "tokenizer.json is not a tokenizer nanoMeSH can run: decoder is 'ByteLevel', not an object"),
    ("tokenizer: not BPE", tokenizer_case(lambda s: s["model"].update(type="WordPiece")),
     "model.type is 'WordPiece', not 'BPE' (byte-level BPE tokenizers such as GPT-NeoX's only)"),
    ("tokenizer: a pre_tokenizer as text", tokenizer_case(lambda s: s.update(pre_tokenizer="ByteLevel")),
     "tokenizer.json is not a tokenizer nanoMeSH can run: pre_tokenizer is 'ByteLevel', not an object"),
    ("tokenizer: an id of 2,000,000,000", tokenizer_case(lambda s: s["model"]["vocab"].update(ab=2_000_000_000)),
     "model.vocab gives 'ab' the id 2000000000, not an integer from 0 to 16,777,215"),
    ("hf: a code-executing pytorch_model.bin", hf_case(files=[("pytorch_model.bin", None)]),
     "pytorch_model.bin is not a file of weights nanoMeSH reads (it holds objects other than tensors; loading never "
     "runs code)"),
    ("hf: ten million layers", hf_case(config=dict(num_hidden_layers=10**7)),
     "its config.json's model (layout 10000000, n_embd 32, 127,040,002,112 parameters) needs about 946.5 GiB, more "
     "than the "),
    ("hf: a config.json nested too deep", hf_case(config=dict(x=eval("[" * 100 + "]" * 100))),
     "no GPT-NeoX config.json there (PlainDataError: is nested more than 64 levels deep)"),
    ("hf: a string hidden_size", hf_case(config=dict(hidden_size="32")), "config.json's hidden_size is \"32\", not an integer"),
    ("hf: an index naming a file elsewhere", hf_case(files=[("pytorch_model.bin.index.json",
                                                             {"weight_map": {"x": "../elsewhere.bin"}})]),
     "pytorch_model.bin.index.json names '../elsewhere.bin', not a file of"),
    ("probe: more samples than memory", lambda tmp, f: ("probe", [f"--out_dir={f}", "--num_samples=1000000000000"]),
     "--num_samples=1000000000000: its windows and measures need about"),
]
try:
    import safetensors  # noqa: F401
    BAD_FILES.append(("hf: random bytes as model.safetensors", hf_case(files=[("model.safetensors", os.urandom(64))]),
                      "model.safetensors is not a file of weights nanoMeSH reads ("))
except ImportError:  # without safetensors, model.safetensors is never read
    pass


@pytest.mark.parametrize("name, case, message", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_files_and_values_are_one_line(name, case, message, finished, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    tool, args = case(tmp_path, finished)
    before = snapshot(tmp_path, finished)
    if tool == "train":
        code = train.main(args)
    elif tool == "prepare":
        import data.prepare
        code = data.prepare.main(args)
    elif tool == "probe":
        code = probe.main(args)
        code = code
    else:  # what train.py --init_from=hf:PATH and lm_eval_mesh.py read it with
        from support import pretrained as hf
        with pytest.raises(checkpoint.CheckpointError) as e:
            hf.load_hf(args[0])
        code, err = 2, f"hf.py: error: {e.value}\n"
    err = err if tool == "hf" else one_line(capsys, f"{tool}.py")
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert snapshot(tmp_path, finished) == before and not (tmp_path / "EXPLOITED").exists()


def test_int32_indexed_data_trains_and_a_negative_id_is_refused(tmp_path, capsys):
    """Megatron writes int32 token ids; those datasets train, and an id below 0 is refused like one too large."""
    from conftest import write_indexed
    from data.prepare import describe_indexed
    rng = np.random.default_rng(0)
    (tmp_path / "pile").mkdir()
    write_indexed(str(tmp_path / "pile" / "document"), [rng.integers(0, 100, 40) for _ in range(30)], np.int32)
    (tmp_path / "tok.json").write_text(json.dumps(byte_bpe()))
    describe_indexed(str(tmp_path / "pile" / "document"), str(tmp_path / "tok.json"), log=lambda *a: None)
    flags = [*TINY[:-1], f"--dataset={tmp_path}/pile/document", "--max_iters=2", "--eval_interval=2"]
    assert train.main([*flags, f"--out_dir={tmp_path / 'o'}"]) == 0
    ids = np.memmap(tmp_path / "pile" / "document.bin", dtype=np.int32, mode="r+")
    ids[5] = -3
    ids.flush()
    assert train.main([*flags, f"--out_dir={tmp_path / 'o2'}"]) == 2
    assert "document.bin holds token id -3, outside the vocabulary of 258" in one_line(capsys)


# -----------------------------------------------------------------------------
# Clearer words

def test_a_second_ctrl_c_while_saving_is_one_line(data_root, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Ctrl-C in a step asks for a checkpoint; a second one while it is written stops at once, in one line, and
    leaves the checkpoint before it as it was (the one being written is dropped, its temporary file too)."""
    out = tmp_path / "run"
    get_batch, save = train.get_batch, torch.save

    def ctrl_c(data, tc, T, key, device):
        if key == (0, 2, 0):
            os.kill(os.getpid(), signal.SIGINT)
        return get_batch(data, tc, T, key, device)

    def interrupted_save(obj, f):
        if obj["iter_num"] == 3:  # the save the first Ctrl-C asked for, its temporary file open
            os.kill(os.getpid(), signal.SIGINT)
        return save(obj, f)

    monkeypatch.setattr(train, "get_batch", ctrl_c)
    monkeypatch.setattr(checkpoint.torch, "save", interrupted_save)
    assert run(["--max_iters=10", "--eval_interval=2"], data_root, out) == 130
    err = capsys.readouterr().err
    assert err == ("\ntrain.py: stopped by SIGINT, so at once: a checkpoint being written, if any, was dropped, the "
                   "one before it is as it was\n")
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 2
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_sighup_saves_as_sigterm_does(data_root, tmp_path):  # noqa: F811
    out = tmp_path / "hup"
    p = subprocess.Popen(train_cmd(data_root, out, "--max_iters=100000", "--eval_interval=100000"), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    wait_for_line(p, "iter 3:", seen)
    p.send_signal(signal.SIGHUP)
    stdout, _ = p.communicate(timeout=60)
    assert p.returncode == 130 and "SIGHUP: finishing this step, then saving a checkpoint" in stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] >= 3


def test_the_log_of_a_resumed_run_is_one_curve(data_root, tmp_path, monkeypatch):  # noqa: F811
    """A run killed after logging past its last checkpoint (here: iters 5 and 6 logged, the checkpoint at 4) and
    resumed from that checkpoint logs those steps again, once: log.jsonl keeps the new ones only."""
    out = tmp_path / "run"
    poison_micro_batch(monkeypatch, 7)  # iter 6's
    assert run(["--max_iters=10", "--eval_interval=4"], data_root, out) == 1
    monkeypatch.undo()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=8"]) == 0
    with open(out / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["iter"] for r in records if "loss" in r] == list(range(1, 9))
    assert [r["iter"] for r in records if "val_loss" in r] == [0, 4, 8]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("what", ["a FIFO", "/dev/zero"])
def test_a_bin_that_is_not_a_file_is_called_so(what, data_root, tmp_path, capsys):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    os.remove(data / "tiny" / "val.bin")
    os.mkfifo(data / "tiny" / "val.bin") if what == "a FIFO" else os.symlink("/dev/zero", data / "tiny" / "val.bin")
    assert run(["--max_iters=1"], str(data), tmp_path / "out") == 2
    assert (f"{data / 'tiny' / 'val.bin'} is not a regular file (a folder, a FIFO or a device?); prepare the dataset "
            f"again") in one_line(capsys)


# -----------------------------------------------------------------------------
# A run holds its folder, writes nothing through a link, and its log never blocks a resume

def test_a_run_holds_its_folder_when_its_link_is_pointed_elsewhere(finished, data_root, tmp_path):  # noqa: F811
    """--out_dir a symbolic link, pointed at another run's folder while the run lives: the run goes on saving
    into the folder it started in, and the other run's files are untouched."""
    mine, other, link = tmp_path / "mine", copy_of(finished, tmp_path, "other"), tmp_path / "link"
    mine.mkdir()
    os.symlink(mine, link)
    before, seen = snapshot(other), []
    p = subprocess.Popen(train_cmd(data_root, link, "--max_iters=40", "--eval_interval=10"), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(p, "iter 1:", seen)  # its first checkpoint (iter 0) is saved
    os.remove(link)
    os.symlink(other, link)
    stdout, stderr = p.communicate(timeout=HANG)
    assert p.returncode == 0, stderr
    assert snapshot(other) == before
    assert torch.load(mine / "ckpt.pt", weights_only=True)["iter_num"] == 40
    with open(mine / "log.jsonl") as f:
        assert [r["iter"] for r in map(json.loads, f) if "val_loss" in r] == [0, 10, 20, 30, 40]


@pytest.mark.parametrize("how", ["scratch", "resume"])
def test_a_log_that_is_a_link_is_refused(how, finished, data_root, tmp_path, capsys):  # noqa: F811
    """A log.jsonl that is a symbolic link, even a dangling one, would have the run write where it points:
    refused in one line before anything is written, and the file it points at never made."""
    out, outside = (tmp_path / "run", tmp_path / "outside.txt")
    if how == "resume":
        copy_of(finished, tmp_path)
        os.remove(out / "log.jsonl")
    else:
        out.mkdir()
    os.symlink(outside, out / "log.jsonl")
    before = listed(out), (out / "ckpt.pt").read_bytes() if how == "resume" else None
    flags = ["--init_from=resume", "--max_iters=6"] if how == "resume" else ["--max_iters=2"]
    assert run(flags, data_root, out) == 2
    assert one_line(capsys) == (f"train.py: error: {out / 'log.jsonl'} is a symbolic link, and a run writes only "
                                f"inside its folder; remove the link (rm {out / 'log.jsonl'}) or choose another "
                                f"--out_dir\n")
    assert not os.path.lexists(outside) and os.path.islink(out / "log.jsonl")
    assert (listed(out), (out / "ckpt.pt").read_bytes() if how == "resume" else None) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_log_that_is_a_fifo_is_refused_without_hanging(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    os.remove(out / "log.jsonl")
    os.mkfifo(out / "log.jsonl")
    r = subprocess.run(python(os.path.join(ROOT, "train.py"), "--init_from=resume", f"--out_dir={out}",
                              "--max_iters=6"), cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and r.stderr == (f"train.py: error: {out / 'log.jsonl'} is not a regular file (a FIFO, "
                                              f"a device or a folder); move it away or choose another --out_dir\n")
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 4


def test_a_damaged_log_is_set_aside_and_the_run_resumes(finished, data_root, tmp_path, capsys):  # noqa: F811
    """Half a line (a kill or a full disk mid-write), bytes that are not UTF-8 and a line nested too deep: the
    resume goes on, names them in one note, and keeps them in log.jsonl.damaged; the log is whole records."""
    out = copy_of(finished, tmp_path)
    whole = (out / "log.jsonl").read_bytes()
    junk = [b"\xff\xfe binary\n", b"[" * 100 + b"]" * 100 + b"\n", b'{"iter": 5, "lo']
    with open(out / "log.jsonl", "ab") as f:
        f.writelines(junk)
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 0
    n = whole.count(b"\n")
    assert (f"note: {out / 'log.jsonl'} has 3 damaged line(s) (line {n + 1}, {n + 2}, {n + 3}: not whole JSON "
            f"records, as a kill or a full disk leaves); moved into {out / 'log.jsonl.damaged'}, the rest of the "
            f"log goes on") in capsys.readouterr().out
    assert (out / "log.jsonl.damaged").read_bytes() == b"".join(junk)
    log = (out / "log.jsonl").read_bytes()
    assert log.startswith(whole) and [json.loads(line)["iter"] for line in log.splitlines()][-1] == 6
    from tools import table1  # a reader of a damaged log (its curve, its times) leaves the bad lines out
    with open(out / "log.jsonl", "ab") as f:
        f.writelines(junk)
    assert table1.val_curve(str(out / "log.jsonl")) == [[r["iter"], r["val_loss"]] for r in map(
        json.loads, log.splitlines()) if "val_loss" in r]


def test_each_resume_sets_its_damaged_lines_aside_in_a_file_of_its_own(tmp_path, capsys):
    """An iteration that is not an integer is a damaged line; the last whole record gets back its newline;
    the note names the first five lines; a second damaged log goes beside the first .damaged, not over it."""
    log = tmp_path / "log.jsonl"
    good = [b'{"iter": 0, "loss": 4.0}\n', b'{"iter": 1, "loss": 3.5}']  # the last one without its newline
    bad = [b'{"iter": "2"}\n', b'{"iter": 2.5}\n'] + [b"junk %d\n" % i for i in range(5)]
    for aside in (tmp_path / "log.jsonl.damaged", tmp_path / "log.jsonl.damaged-2"):
        log.write_bytes(good[0] + b"".join(bad) + good[1])
        assert tool.read_log(str(log), upto=1) == good[0] + good[1] + b"\n"
        assert aside.read_bytes() == b"".join(bad)
        assert capsys.readouterr().out == (f"note: {log} has 7 damaged line(s) (line 2, 3, 4, 5, 6, ...: not whole "
                                           f"JSON records, as a kill or a full disk leaves); moved into {aside}, the "
                                           f"rest of the log goes on\n")


def test_a_full_disk_while_logging_leaves_no_half_line(finished, tmp_path, capsys, monkeypatch):
    """A log append that meets a full disk, on a real one (a small tmpfs, where this machine lets us mount one:
    the kernel writes what fits of the line, then ENOSPC) or else simulated so: the half line is taken back, one
    line says so, and once there is room the run resumes."""
    size = os.path.getsize(finished / "ckpt.pt")
    disk, mounted = small_disk(tmp_path, 3 * size)
    try:
        out, flags = shutil.copytree(finished, disk / "run"), ["--max_iters=6"]
        whole, real_write = (out / "log.jsonl").read_bytes(), os.write
        if mounted:  # room for the log the resume rewrites, and a page more: appends soon meet the end
            free = shutil.disk_usage(disk).free
            (disk / "filler").write_bytes(b"\0" * (free - len(whole) - 2 * 4096))
            flags = ["--max_iters=100000", "--eval_interval=100000"]
        else:
            def full(fd, data):
                if bytes(data[:8]) != b'{"iter":':  # only the log's records meet the full disk
                    return real_write(fd, data)
                real_write(fd, bytes(data[:len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            monkeypatch.setattr(os, "write", full)
        assert train.main(["--init_from=resume", f"--out_dir={out}", *flags]) == 2
        monkeypatch.undo()
        err = one_line(capsys)
        assert err.startswith(f"train.py: error: could not append to {out / 'log.jsonl'} (the disk is full") and \
            err.endswith("so the run stopped; its last checkpoint is whole: free some space, then continue it "
                         "with --init_from=resume\n"), err
        log = (out / "log.jsonl").read_bytes()
        assert log.startswith(whole) and log.endswith(b"\n") and all(json.loads(line) for line in log.splitlines())
        assert mounted or log == whole
        if mounted:
            os.remove(disk / "filler")
        assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=6"]) == 0
        assert "damaged" not in capsys.readouterr().out
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def test_a_torchrun_environment_left_in_the_shell_is_named(data_root, tmp_path, capsys, monkeypatch):  # noqa: F811
    """RANK and WORLD_SIZE left from an earlier torchrun, then a plain python train.py: one line at once (gloo
    would wait 30 minutes for the peer), nothing written."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert run(["--max_iters=2"], data_root, tmp_path / "out") == 2
    assert one_line(capsys) == ("train.py: error: RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 set, "
                                "but not by torchrun (no TORCHELASTIC_RUN_ID): left in this shell by an earlier job? "
                                "unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT, or launch with torchrun (another "
                                "launcher: set TORCHELASTIC_RUN_ID to say they are meant)\n")
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# A run's data is the data it read: not replaced under it, and what its checkpoints record

def test_a_dataset_a_live_run_reads_is_not_replaced(data_root, tmp_path):  # noqa: F811
    """data/prepare.py of the dataset a live run trains on: refused in one line, the files untouched; the run's
    checkpoints record the data it read."""
    data = copy_of(data_root, tmp_path, "data")
    (tmp_path / "other.txt").write_text(TEXT.upper())
    before, seen = snapshot(data), []
    p = subprocess.Popen(train_cmd(data, tmp_path / "out", "--max_iters=100000", "--eval_interval=10"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the run trains until stopped, so it is live whatever the machine's speed
        wait_for_line(p, "iter 1:", seen)
        r = subprocess.run(python(os.path.join(ROOT, "data", "prepare.py"), "--dataset", "tiny", "--input",
                                  str(tmp_path / "other.txt"), "--out_root", str(data)), cwd=ROOT,
                           capture_output=True, text=True, timeout=HANG)
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=HANG)
    finally:
        p.kill()
    assert r.returncode == 2 and r.stderr.startswith(f"prepare.py: error: dataset 'tiny' in {data} is in use: "
                                                     f"a live train.py run reads it"), r.stderr
    assert p.returncode == 130 and snapshot(data) == before
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert ckpt["data"] == dataset_record(str(data / "tiny"))


def test_a_checkpoint_records_the_data_its_run_read(data_root, tmp_path, monkeypatch):  # noqa: F811
    """Where the folder cannot be locked (some NFS setups) and the dataset is prepared again mid-run, the run
    trains on the tokens it loaded, and its checkpoints say so: the record of the data it read, not the new."""
    data = copy_of(data_root, tmp_path, "data")
    read = dataset_record(str(data / "tiny"))
    (tmp_path / "other.txt").write_text(TEXT.upper())
    get_batch = train.get_batch

    def prepare_again_at_step_2(d, tc, T, key, device):
        if key == (0, 2, 0):
            prepare("tiny", input=str(tmp_path / "other.txt"), out_root=str(data), log=lambda *a: None)
        return get_batch(d, tc, T, key, device)

    def no_lock(*args, **kwargs):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(runfiles.filelock, "ReadWriteLock", no_lock)
    monkeypatch.setattr(train, "get_batch", prepare_again_at_step_2)
    assert run(["--max_iters=4", "--eval_interval=2"], str(data), tmp_path / "out") == 0
    assert dataset_record(str(data / "tiny")) != read
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["data"] == read


def test_a_meta_json_nested_too_deep_is_one_line(data_root, tmp_path, capsys):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    (data / "tiny" / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    assert run(["--max_iters=1"], str(data), tmp_path / "out") == 2
    assert one_line(capsys) == (f"train.py: error: {data / 'tiny' / 'meta.json'} is damaged (PlainDataError: is "
                                f"nested more than 64 levels deep); prepare the dataset again with python "
                                f"data/prepare.py\n")


# -----------------------------------------------------------------------------
# Sizes that cannot fit: refused from the settings (plan.py's arithmetic) before anything is built or written

TOO_LARGE = [  # (flags, words of the one-line error)
    (["--n_embd=1000000", "--n_head=1"], "the run (layout 1+1R2+1, n_embd 1000000, 36,000,123,000,030 parameters, "
                                         "micro-batch 4 x 16) needs about "),
    (["--n_slots=1000000"], "the run (layout 1+1R2+1, n_embd 32, 198,039,840 parameters, micro-batch 4 x 16) needs"),
    (["--batch_size=1000000"], "micro-batch 1000000 x 16) needs about"),
    (["--layout=1000000", "--scheme=base"], "the run (layout 1000000, n_embd 32, 12,704,001,728 parameters"),
    (["--layout=1+1R1000000+1"], "the run (layout 1+1R1000000+1, n_embd 32, 66,000,264,040,038 parameters"),
]


@pytest.mark.parametrize("flags, message", TOO_LARGE, ids=[" ".join(f) for f, _ in TOO_LARGE])
def test_a_size_that_cannot_fit_is_refused_before_anything_is_built(flags, message, data_root, tmp_path, capsys,
                                                                     monkeypatch):  # noqa: F811
    monkeypatch.setattr(train, "RecursiveGPT", None)  # never reached: building would allocate
    assert run([*flags, "--max_iters=1"], data_root, tmp_path / "out") == 2
    err = one_line(capsys)
    assert message in err and "GiB of this machine; use smaller settings (--plan=true shows where it goes)" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("init_from", ["resume", "vanilla"])
def test_a_run_from_a_checkpoint_that_cannot_fit_is_refused_before_it_moves(init_from, data_root, tmp_path, capsys,
                                                                           monkeypatch):  # noqa: F811
    """A resumed or looped run is checked as one from scratch is: on a machine too small for its step (or with a
    larger --batch_size) it is one line, and nothing is written."""
    from support import memory
    src = tmp_path / "src"
    assert run(["--max_iters=2", "--scheme=base", "--layout=4"], data_root, src) == 0
    out = src if init_from == "resume" else tmp_path / "out"
    before, _ = snapshot(src, tmp_path), capsys.readouterr()
    monkeypatch.setattr(memory, "device_memory", lambda device: (1 << 10, "this machine"))
    flags = ["--scheme=base", "--layout=4"] if init_from == "resume" else []
    assert run([*flags, f"--init_from={'resume' if init_from == 'resume' else f'vanilla:{src}'}",
                "--max_iters=4"], data_root, out) == 2
    err = one_line(capsys)
    assert "micro-batch 4 x 16) needs about " in err and "GiB of this machine; use smaller settings" in err
    assert snapshot(src, tmp_path) == before


def test_the_plan_and_bench_count_sizes_no_machine_holds(capsys):
    """--plan counts parameters from the shapes: a width of 10^9 is a table of numbers, not an overflow; bench.py
    refuses a vocabulary of 10^10 before it builds anything."""
    assert train.main(["--plan=true", "--n_embd=1000000000", "--n_head=1"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:6]
    assert [row.split()[-1] for row in rows] == ["no"] * 4
    from tools import bench
    assert bench.main(["--vocab_size=10000000000", "--schemes=base"]) == 2
    err = one_line(capsys, "bench.py")
    assert "scheme base (layout 2+4R2+2, n_embd 128, 2,560,001,586,432 parameters, micro-batch 16 x 64) needs" in err


def test_a_students_bug_shows_its_traceback_and_a_bad_flag_stays_one_line(data_root, tmp_path):  # noqa: F811
    """A bug planted in a copy of mesh.py (the loss's targets cut short: PyTorch's ValueError) is the
    student's own: train.py's output is the traceback, naming the copy's file and the planted line. Only
    the project's errors are one line, as a misspelt flag still is."""
    copy, planted = copy_with_a_bug(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's modules, not ROOT's
    command = [*TINY, f"--data_root={data_root}", f"--out_dir={tmp_path / 'out'}", "--max_iters=2"]
    r = subprocess.run(python("train.py", *command), cwd=copy, env=env, capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.startswith("Traceback (most recent call last):"), r.stderr[-3000:]
    assert f'File "{copy / "mesh.py"}", line {planted}, in forward' in r.stderr, r.stderr[-3000:]
    assert "ValueError: Expected input batch_size" in r.stderr.splitlines()[-1]
    r = subprocess.run(python("train.py", *command, "--max_itres=2"), cwd=copy, env=env,
                       capture_output=True, text=True, timeout=HANG)
    assert (r.returncode, r.stderr) == (2, "train.py: error: unknown setting 'max_itres' in the command "
                                           "line (did you mean --max_iters?); see python train.py --help\n")


# -----------------------------------------------------------------------------
# Another tool's data is never written over, nor into

def nanogpt_data(root):
    """A data/ folder as nanoGPT leaves it: each dataset's train.bin, val.bin, meta.pkl and its scripts."""
    for name in ("shakespeare", "shakespeare_char"):
        (root / name).mkdir(parents=True)
        for file, content in (("train.bin", b"\x01\x00" * 40), ("val.bin", b"\x02\x00" * 8),
                              ("meta.pkl", b"\x80\x04}q\x00."), ("prepare.py", b"# nanoGPT's\n")):
            (root / name / file).write_bytes(content)
    return root


OFFLINE_ENV = {"NANOMESH_SHAKESPEARE_URL": "file:///nonexistent/input.txt"}  # the download fails at once
FOREIGN = [  # (flags, words of the one-line error)
    (["--dataset=shakespeare"], "holds another tool's datasets (shakespeare, shakespeare_char: folders without "
                                "meta.json), where nanoMeSH makes none on its own; give another --data_root"),
    (["--dataset=shakespeare_char"], "holds another tool's datasets (shakespeare, shakespeare_char"),
    (["--dataset=pydoc"], "holds another tool's datasets (shakespeare, shakespeare_char"),
    (["--dataset={root}/shakespeare"], "shakespeare has no meta.json, by which nanoMeSH reads a dataset (its "
                                       "train.bin, val.bin, meta.pkl: another tool's format, nanoGPT's?)"),
]


@pytest.mark.parametrize("flags, words", FOREIGN, ids=[f[0] for f, _ in FOREIGN])
def test_another_projects_data_root_is_never_written(flags, words, tmp_path):
    root = nanogpt_data(tmp_path / "nanoGPT" / "data")
    before = snapshot(root)
    flags = [f.format(root=root) for f in flags]
    r = subprocess.run(train_cmd(str(root), tmp_path / "out", "--max_iters=1", *flags), cwd=tmp_path,
                       env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr and str(root) in r.stderr, r.stderr
    assert snapshot(root) == before and listed(root) == ["shakespeare", "shakespeare_char"]
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_a_dataset_folder_of_another_tool_and_reuses_its_own(tmp_path):
    root = nanogpt_data(tmp_path / "data")
    text = write_text(tmp_path / "t.txt", TEXT)
    before = snapshot(root)
    r = subprocess.run(python("data/prepare.py", "--dataset=shakespeare", f"--input={text}", f"--out_root={root}"),
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (f"{root / 'shakespeare'} holds files that data/prepare.py did not make (meta.pkl, prepare.py, "
            f"train.bin, ... (4 in all)) and no meta.json: another tool's dataset, which nanoMeSH never writes "
            f"over; give another --out_root, or move those files away") in r.stderr
    assert snapshot(root) == before and listed(root) == ["shakespeare", "shakespeare_char"]
    (root / "three").mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):  # three: all named, no "..."
        (root / "three" / name).write_text(name)
    with pytest.raises(DataError, match=r"three holds files that data/prepare.py did not make \(a.txt, b.txt, "
                                        r"c.txt\) and no meta.json"):
        prepare("three", input=text, out_root=str(root), log=lambda *a: None)
    # a folder of its own is prepared again: an empty one, one prepared, one whose replacement was cut short,
    # one whose first prepare was killed (kill -9: its staging folder left, no meta.json)
    (root / "empty").mkdir()
    folder = prepare("empty", input=text, out_root=str(root), log=lambda *a: None)
    prepare("empty", input=text, out_root=str(root), log=lambda *a: None)
    os.replace(os.path.join(folder, "meta.json"), os.path.join(folder, ".meta.json.replacing"))
    prepare("empty", input=text, out_root=str(root), log=lambda *a: None)
    assert listed(folder) == ["meta.json", "train.bin", "val.bin"]
    (root / "killed").mkdir()
    runfiles.temporary_name(str(root / "killed" / "staging"), folder=True)
    folder = prepare("killed", input=text, out_root=str(root), log=lambda *a: None)
    assert listed(folder) == ["meta.json", "train.bin", "val.bin"]


def write_text(path, text):
    path.write_text(text)
    return str(path)


# -----------------------------------------------------------------------------
# A dataset's name: refused up front by its rule, or a suggestion that works

@pytest.mark.parametrize("name", ["..", ".hidden", "x" * 240, "é" * 125], ids=["..", ".hidden", "240 bytes", "250 bytes"])
@pytest.mark.parametrize("tool", ["train.py", "data/prepare.py"])
def test_a_dataset_name_that_cannot_be_a_folder_is_refused_by_its_rule(name, tool, tmp_path):
    root, text = tmp_path / "data", write_text(tmp_path / "t.txt", TEXT)
    root.mkdir()
    cmd = (train_cmd(str(root), tmp_path / "out", "--max_iters=1", f"--dataset={name}") if tool == "train.py"
           else python("data/prepare.py", f"--dataset={name}", f"--input={text}", f"--out_root={root}"))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "invalid dataset name" in r.stderr and ("a dataset's name is a plain folder name, not starting with "
                                                    "'.', without '/' or '\\', at most 200 bytes") in r.stderr
    assert os.listdir(root) == [] and not (tmp_path / "out").exists()


def test_the_prepare_command_train_suggests_runs_and_names_the_data_root(tmp_path):
    root, text = tmp_path / "moved", write_text(tmp_path / "t.txt", TEXT)
    r = subprocess.run(train_cmd(str(root), tmp_path / "out", "--max_iters=1", "--dataset=mine"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"dataset 'mine' is not in --data_root={root} (no mine/meta.json there); give the --data_root" in r.stderr
    suggested = r.stderr.split("prepare it with: ")[1].strip()
    assert suggested == f"python data/prepare.py --dataset mine --input FILE --out_root {root}"
    argv = [sys.executable if a == "python" else text if a == "FILE" else a for a in shlex.split(suggested)]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=HANG)
    r = subprocess.run(train_cmd(str(root), tmp_path / "out", "--max_iters=1", "--dataset=mine"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0 and (tmp_path / "out" / "ckpt.pt").is_file(), r.stderr


# -----------------------------------------------------------------------------
# A split truncated under a live run: one line, never a SIGBUS

@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_truncated_under_a_live_run_is_one_line(split, data_root, tmp_path):  # noqa: F811
    data = copy_of(data_root, tmp_path, "data")
    p = subprocess.Popen(train_cmd(str(data), tmp_path / "out", "--max_iters=100000", "--eval_interval=50"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(p, "iter 1:", [])
        size = os.path.getsize(data / "tiny" / f"{split}.bin")
        os.truncate(data / "tiny" / f"{split}.bin", 64)  # in place, as a program rewriting it would
        err = p.communicate(timeout=HANG)[1]
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 2, (p.returncode, err)  # not -SIGBUS
    assert err.strip().splitlines()[-1] == (
        f"train.py: error: {data / 'tiny' / f'{split}.bin'} shrank from {size:,} to 64 "
        f"bytes while this process read it (another program truncated or rewrote it); nothing was read past its "
        f"end: prepare the dataset again (python data/prepare.py) and resume the run"), err
