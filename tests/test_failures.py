"""
When things go wrong: one table-driven test per class of failure, with real processes, a real full
filesystem (where the machine allows mounting one) and a real kill -9 of torchrun. The promise under
test: nothing is lost (no bad checkpoint replaces a good one, no run spoils another's files), and
every bad input is one line naming the problem and the fix, exit 2, with nothing touched.

    python -m pytest tests/test_failures.py -q
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

import checkpoint
import configurator
import data.loader as loader
import guards
import mesh
import probe
import runfiles
import sample
import train
from data import DataError
from data.prepare import prepare
from test_train import ROOT, TEXT, TINY, data_root, run, snapshot  # noqa: F401 (data_root is a fixture)


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
        assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"]


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


@pytest.mark.parametrize("kind", ["checkpoint temporary file", "prepare staging folder"])
def test_cleanup_removes_only_what_dead_processes_left(kind, tmp_path):
    """A cleanup removes the leftovers of a dead process (and of its own), never those of a live one."""
    live = subprocess.Popen(python("-c", "import time; time.sleep(60)"))
    dead = subprocess.Popen(python("-c", "pass"))
    dead.wait()
    try:
        if kind == "checkpoint temporary file":
            names = {pid: (f".ckpt.pt-{pid}-0123abcd.tmp", f".log.jsonl-{pid}-4567ef.tmp")
                     for pid in (live.pid, dead.pid, os.getpid())}
            for name in sum(names.values(), ()):
                (tmp_path / name).write_bytes(b"partial")
            runfiles.remove_dead_temporaries(str(tmp_path))
            assert set(os.listdir(tmp_path)) == set(names[live.pid])
        else:
            names = {pid: f".tiny-{pid}-a1b2c3.tmp" for pid in (live.pid, dead.pid)}
            for name in names.values():
                (tmp_path / name).mkdir()
                (tmp_path / name / "train.bin").write_bytes(b"12")
            (tmp_path / f"keep-{dead.pid}-a1.tmp").mkdir()  # not hidden: not ours
            runfiles.remove_dead_temporaries(str(tmp_path))
            assert set(os.listdir(tmp_path)) == {names[live.pid], f"keep-{dead.pid}-a1.tmp"}
    finally:
        live.kill()
        live.wait()


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
    assert "the torchrun launcher (pid" in text and "checkpoint saved" in text, text[-3000:]
    stopped = int(text.split("stopped at iter ")[1].split(";")[0])
    _, ckpt = checkpoint.load(str(out))
    assert ckpt["iter_num"] == stopped >= 3


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
        with pytest.raises(SystemExit) as e:
            probe.main([f"--out_dir={out}"])
        assert e.value.code == 2
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


def shorten_train(folder):
    (folder / "train.bin").write_bytes((folder / "train.bin").read_bytes()[:20])
    edit_meta(train_tokens=10)(folder)


DAMAGED_DATA = [  # (name, damage, words of the one-line error)
    ("meta dtype uint8", edit_meta(dtype="uint8"), "meta.json is damaged (ValueError: dtype 'uint8' does not hold "
                                                   "a vocabulary of 26, uint16 does)"),
    ("meta without chars", edit_meta(chars=None), "meta.json is damaged (ValueError: its 26 characters are missing)"),
    ("meta without vocab_size", edit_meta(vocab_size=None), "no tokenizer, dtype or vocab_size"),
    ("id at the vocabulary", set_token("train", 26), "train.bin holds token id 26, outside the vocabulary of 26"),
    ("id far above it", set_token("val", 60000), "val.bin holds token id 60000, outside the vocabulary of 26"),
    ("empty train.bin", edit_bin("train", lambda d: b""), "train.bin is empty"),
    ("odd size", edit_bin("train", lambda d: d[:-1]), "train.bin has 30563 bytes, not a whole number of uint16 tokens"),
    ("a token short", edit_bin("val", lambda d: d[:-2]), "val.bin holds 1,697 tokens but meta.json says 1,698"),
    ("shorter than a block", shorten_train, "block_size 16 is longer than the training split of 'tiny' (10 tokens in"),
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
    monkeypatch.setattr(loader, "SCAN_BYTES", 0)
    monkeypatch.setattr(loader, "SCAN_PIECES", 4)
    monkeypatch.setattr(loader, "SCAN_PIECE_BYTES", 16)
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
    ("no iter_num", resave(lambda c: c.pop("iter_num")), ("resume",), "cannot be resumed: no valid iter_num"),
    ("no rng", resave(lambda c: c.pop("rng")), ("resume",), "cannot be resumed: no valid rng"),
    ("optimizer state of the wrong shape", resave(shrink_exp_avg), ("resume",), "the optimizer's exp_avg of parameter"),
    ("optimizer for another model", resave(lambda c: c["optimizer"]["param_groups"][0]["params"].pop()), ("resume",),
     "the optimizer's parameter groups differ from the model's"),
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
    disk = tmp_path / "disk"
    disk.mkdir()
    size = os.path.getsize(finished / "ckpt.pt")
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={3 * size}", "tmpfs", str(disk)],
                                 capture_output=True).returncode == 0
    except OSError:  # no mount command
        mounted = False
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
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    import fcntl
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(train, "get_batch", get_batch)
    assert run(["--max_iters=1"], data_root, tmp_path / "nfs") == 0
    assert f"note: cannot lock --out_dir={tmp_path / 'nfs'} (No locks available); make sure no other run uses it" \
        in capsys.readouterr().out
    # an OSError that names no file is not "cannot use None: None"
    assert configurator.report("prepare.py", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) == 2
    assert capsys.readouterr().err == ("prepare.py: error: No space left on device; check the disk (free space, "
                                       "permissions) and try again\n")
