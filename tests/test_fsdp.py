"""
train.py --fsdp=true (fsdp.py) on CPU with gloo: 2-process FSDP trains as 1 process does, sharded
checkpoints resume exactly in either mode, consolidate to a ckpt.pt that samples, and fail cleanly.

    python -m pytest tests/test_fsdp.py -q --all  # marked slow: the fast tier leaves it out
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

from tools import consolidate
from support import checkpoint, files as runfiles, resume
from support.sharded import Unpickler
from mesh import Config, RecursiveGPT
from support.checkpoint import CheckpointError
import sample
import train
from data.prepare import prepare
from conftest import HANG, ROOT, TEXT, TINY, listed, losses, run, snapshot

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all
# train.py refuses FSDP2 on a CPU under torch 2.7 (tests/test_versions.py): there these tests skip
TOO_OLD = "FSDP2 on a CPU needs torch 2.7 or later" if torch.__version__ < (2, 7) else ""


COMMON = ["--grad_accum=4", "--eval_interval=2", "--eval_iters=3", "--lr=3e-3", "--lr_decay_iters=8"]


def state(folder):
    """A sharded checkpoint's plain data (its folder's state.json)."""
    return json.loads((folder / "state.json").read_text())


def torchrun(*args, timeout=HANG, nproc=2):
    if TOO_OLD:
        pytest.skip(TOO_OLD)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "train.py"), "--fsdp=true", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def close(a, b):
    assert [i for i, _ in a] == [i for i, _ in b]
    assert all(abs(x - y) < 1e-5 for (_, x), (_, y) in zip(a, b)), (a, b)


def test_fsdp_equals_one_process_and_resumes_across_modes(data_root, tmp_path, capsys):
    """MeSH with a shared core (layout 1+1R2+1: the core block runs twice per forward, so FSDP gathers it twice
    and its gradient sums both applications): 1 process -> 2-process FSDP (from ckpt.pt) -> FSDP again (from its
    own shards, resharded over 1 process) -> 1 process without FSDP (from the shards) follows the 1-process run's
    losses to 1e-5, evaluations included (eval_iters 3 over 2 ranks: FSDP pads the last round)."""
    one, mix = tmp_path / "one", tmp_path / "mix"
    assert run([*COMMON, "--max_iters=8"], data_root, one) == 0
    assert run([*COMMON, "--max_iters=2"], data_root, mix) == 0
    for stop, nproc in ((4, 2), (6, 1)):
        r = torchrun("--init_from=resume", f"--out_dir={mix}", f"--max_iters={stop}", nproc=nproc)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"{nproc} process(es) (FSDP)" in r.stdout
    assert listed(mix) == ["ckpt.pt", "log.jsonl", "shards-00000006"]
    # the consolidated ckpt.pt is the sharded checkpoint, whole; sample.py reads it. DCP's warning that it assumes
    # one process, which is meant, is not said
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert consolidate.main([f"--out_dir={mix}"]) == 0
    assert [str(w.message) for w in said] == []
    model, ckpt = checkpoint.load(str(mix))
    assert ckpt["iter_num"] == 6 and set(ckpt["optimizer"]["state"]) == set(range(len(list(model.parameters()))))
    # AdamW's settings as the 1-process run's ckpt.pt holds them: a resume without --fsdp takes them from here
    ones = torch.load(one / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [(g["betas"], g["weight_decay"]) for g in ckpt["optimizer"]["param_groups"]] == \
        [(g["betas"], g["weight_decay"]) for g in ones]
    capsys.readouterr()
    assert sample.main([f"--out_dir={mix}", "--start=Then", "--max_new_tokens=10"]) == 0
    assert capsys.readouterr().out.startswith("Then")
    os.remove(mix / "ckpt.pt")  # the last leg resumes from the shards themselves
    assert train.main(["--init_from=resume", f"--out_dir={mix}", "--max_iters=8"]) == 0
    close(losses(one), losses(mix))
    close(losses(one, "val_loss"), losses(mix, "val_loss"))
    a, b = (torch.load(d / "ckpt.pt", weights_only=True) for d in (one, mix))
    assert all(torch.allclose(a["model"][k], b["model"][k], atol=1e-5) for k in a["model"])


def test_fsdp_base_with_clipping_and_grad_checkpoint(data_root, tmp_path):
    """A tight --grad_clip (the norm is taken over DTensor shards) and --grad_checkpoint (a block recomputed in
    backward gathers its weights again) under FSDP give the 1-process losses."""
    flags = [*COMMON, "--scheme=base", "--max_iters=3", "--grad_clip=0.05", "--grad_checkpoint=true"]
    assert run(flags, data_root, tmp_path / "one") == 0
    r = torchrun(*TINY, f"--data_root={data_root}", f"--out_dir={tmp_path / 'two'}", *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    close(losses(tmp_path / "one"), losses(tmp_path / "two"))


def test_nan_and_missing_or_corrupt_shards_are_one_line_and_unfinished_writes_are_ignored(data_root, tmp_path, capsys):
    out = tmp_path / "out"
    r = torchrun(*TINY, f"--data_root={data_root}", f"--out_dir={out}", *COMMON, "--max_iters=4", "--lr=1e36",
                 "--warmup_iters=0", "--grad_clip=0")  # the weights blow up: the loss of iter 1 is not finite
    assert r.returncode != 0 and r.stderr.count(f"train.py: error: loss is nan at iter 1; stopped without saving, "
                                                f"so {out / 'shards-00000000'} (iter 0) is the last good checkpoint") == 2, r.stderr[-3000:]
    assert state(out / "shards-00000000")["iter_num"] == 0 and not (out / "ckpt.pt").exists()
    # a write killed before DCP's .metadata: never taken, and removed at a start
    (out / "shards-00000001").mkdir()
    (out / "shards-00000001" / "__0_0.distcp").write_bytes(b"half")
    shards = sorted((out / "shards-00000000").glob("*.distcp"))
    whole = shards[0].read_bytes()
    shards[0].write_bytes(whole[:100])  # truncated
    r = torchrun("--init_from=resume", f"--out_dir={out}", "--max_iters=4", timeout=HANG)
    assert r.returncode != 0 and r.stderr.count("train.py: error: the sharded checkpoint") == 2, r.stderr[-3000:]
    assert "shards-00000000 is incomplete or corrupt" in r.stderr  # not the unfinished shards-00000001
    shards[0].unlink()  # missing, read by one process
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shards-00000000 is incomplete or corrupt" in err
    assert "move it away" not in err  # no ckpt.pt to fall back on: not advised
    assert consolidate.main([f"--out_dir={out}"]) == 2 and not (out / "ckpt.pt").exists()
    metadata = (out / "shards-00000000" / ".metadata").read_bytes()
    (out / "shards-00000000" / ".metadata").write_bytes(b"\x80\x04cos\nsystem\n.")  # a pickle that would run code
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    assert "os.system is not allowed" in capsys.readouterr().err
    shards[0].write_bytes(whole)  # whole again: the resume continues, and its start removes the leftover
    (out / "shards-00000000" / ".metadata").write_bytes(metadata)
    r = torchrun("--init_from=resume", f"--out_dir={out}", "--max_iters=2", "--lr=1e-3", timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    assert listed(out) == ["log.jsonl", "shards-00000002"]


def test_a_first_save_killed_midway_is_no_run_to_continue(data_root, tmp_path, capsys):
    """A new run killed (or its disk full) while it wrote its first sharded checkpoint leaves shards-00000000
    without DCP's .metadata: no checkpoint to resume from, so the same command again is not refused as a run
    to continue with --init_from=resume (which would find none); it starts, removing the leftover."""
    out = tmp_path / "run"
    (out / "shards-00000000").mkdir(parents=True)
    (out / "shards-00000000" / "state.json").write_text("{}")
    (out / "shards-00000000" / "__0_0.distcp").write_bytes(b"half")
    assert run(["--max_iters=2", "--eval_interval=2"], data_root, out) == 0
    assert listed(out) == ["ckpt.pt", "log.jsonl"]
    (out / "shards-00000003").mkdir()  # one left beside a run resumed without FSDP: removed at its start too
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=3"]) == 0
    assert listed(out) == ["ckpt.pt", "log.jsonl"]


def test_fsdp_needs_torchrun(data_root, tmp_path, capsys):
    assert run(["--fsdp=true"], data_root, tmp_path / "out") == 2
    assert "--fsdp=true shards over processes started by torchrun" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


BEST = json.dumps(dict(model_config={}, train_config=dict(dataset="tiny", weight_decay=0.1, beta1=0.9, beta2=0.95),
                       iter_num=3, best_val_loss="low"))


@pytest.mark.parametrize("text, words", [("{", "(PlainDataError: is not JSON (Expecting property name"),
                                         ('{"iter_num": 3}', "(TypeError: model_config is None, not a dict)"),
                                         (BEST, "(TypeError: best_val_loss is 'low', not a float)")],
                         ids=["not JSON", "no model_config", "best_val_loss not a float"])
def test_a_corrupt_sharded_state_is_one_line(text, words, tmp_path, capsys):
    (tmp_path / "shards-00000003").mkdir()
    (tmp_path / "shards-00000003" / ".metadata").write_bytes(b"")
    (tmp_path / "shards-00000003" / "state.json").write_text(text)
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path}"]) == 2
    assert f"{tmp_path / 'shards-00000003' / 'state.json'} is corrupt {words}" in capsys.readouterr().err


@pytest.mark.parametrize("change, words", [(lambda tc: tc.pop("beta1"), "beta1 is None"),
                                            (lambda tc: tc.update(beta2=1.5), "beta2 is 1.5"),
                                            (lambda tc: tc.update(weight_decay="0.1"), "weight_decay is '0.1'")])
def test_a_sharded_state_without_adamws_settings_is_one_line(change, words, tmp_path, capsys):
    """A resume without --fsdp and consolidate.py read the shards whole, into an AdamW built with state.json's
    settings: a hand-edited state.json without them is refused where it is read, in one line."""
    shards = tmp_path / "shards-00000003"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"")
    tc = dict(dataset="tiny", lr=None, weight_decay=0.1, beta1=0.9, beta2=0.95)
    change(tc)
    cfg = Config(vocab_size=32, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1", scheme="mesh").to_dict()
    (shards / "state.json").write_text(json.dumps(dict(model_config=cfg, train_config=tc, iter_num=3,
                                                       best_val_loss=1.0, rng={"torch": [0] * 8})))
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path}"]) == 2
    assert consolidate.main([f"--out_dir={tmp_path}"]) == 2
    line = (f"{shards / 'state.json'} is corrupt (ValueError: train_config's {words}, not AdamW's); move {shards} "
            f"away or point --out_dir at another run\n")
    assert capsys.readouterr().err == f"train.py: error: {line}consolidate.py: error: {line}"


def test_consolidating_nothing_or_behind_a_later_whole_checkpoint_is_one_line(tmp_path, capsys):
    """No sharded checkpoint: one line saying how to train one. A ckpt.pt at the shards' iteration but saved
    after them: refused, ckpt.pt kept; so is a kept ckpt_ITER.pt further on. At a tie (a consolidation's ckpt.pt) the
    shards are read again."""
    assert consolidate.main([f"--out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"consolidate.py: error: no sharded checkpoint in {tmp_path} (no whole "
                                       f"shards-<iter> folder); train one with torchrun ... train.py --fsdp=true "
                                       f"--out_dir={tmp_path}\n")
    (tmp_path / "shards-00000003").mkdir()
    (tmp_path / "shards-00000003" / ".metadata").write_bytes(b"")
    cfg = Config(vocab_size=32, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1", scheme="mesh")
    tc = dict(dataset="tiny", lr=None, weight_decay=0.1, beta1=0.9, beta2=0.95)
    (tmp_path / "shards-00000003" / "state.json").write_text(json.dumps(dict(
        model_config=cfg.to_dict(), train_config=tc, iter_num=3, saved_at=100.0, best_val_loss=1.0, rng={"torch": [0]})))
    checkpoint.save(dict(model=RecursiveGPT(cfg).state_dict(), model_config=cfg.to_dict(), train_config=tc, iter_num=3,
                         saved_at=200.0), str(tmp_path / "ckpt.pt"))
    before = snapshot(tmp_path)
    assert consolidate.main([f"--out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"consolidate.py: error: {tmp_path / 'ckpt.pt'} (iter 3) was saved after the "
                                       f"sharded checkpoint (iter 3), which would replace it; it needs no consolidation\n")
    assert snapshot(tmp_path) == before
    checkpoint.save(dict(model=RecursiveGPT(cfg).state_dict(), model_config=cfg.to_dict(), train_config=tc, iter_num=5,
                         saved_at=300.0), str(tmp_path / "ckpt_5.pt"))  # a kept whole one, further
    assert consolidate.main([f"--out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"consolidate.py: error: {tmp_path / 'ckpt_5.pt'} (iter 5) is further in "
                                       f"training than the sharded checkpoint (iter 3), which would replace it; it "
                                       f"needs no consolidation\n")
    os.remove(tmp_path / "ckpt_5.pt")
    checkpoint.save(dict(model=RecursiveGPT(cfg).state_dict(), model_config=cfg.to_dict(), train_config=tc, iter_num=3,
                         saved_at=100.0), str(tmp_path / "ckpt.pt"))  # a tie, as a consolidation leaves: the shards
    assert consolidate.main([f"--out_dir={tmp_path}"]) == 2
    assert f"the sharded checkpoint {tmp_path / 'shards-00000003'} is incomplete or corrupt" in capsys.readouterr().err


def test_a_shards_folders_own_state_is_read_before_earlier_codes_pointer(tmp_path):
    """A save of this code's beside earlier code's ckpt-sharded.json (not yet removed): its own state.json."""
    shards = tmp_path / "shards-00000004"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"")
    cfg = Config(vocab_size=32, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1", scheme="mesh").to_dict()
    tc = dict(dataset="tiny", weight_decay=0.1, beta1=0.9, beta2=0.95)
    plain = dict(model_config=cfg, train_config=tc, iter_num=4, best_val_loss=1.0, rng={"torch": [0]})
    (shards / "state.json").write_text(json.dumps(plain))
    (tmp_path / checkpoint.POINTER).write_text(json.dumps({**plain, "iter_num": 2, "folder": "shards-00000002"}))
    got = checkpoint.sharded_state(str(tmp_path), shards.name)
    assert (got["path"], got["iter_num"]) == (str(shards / "state.json"), 4)


def test_metadata_unpickler_refuses_names_reached_through_a_dcp_module(tmp_path):
    """A dotted name (protocol 4) would reach os.system through a DCP module's own imports: refused, while plain
    pickle would return it."""
    import io
    import pickle

    def text(t):
        return b"\x8c" + bytes([len(t)]) + t.encode()

    payload = b"\x80\x04" + text("torch.distributed.checkpoint.filesystem") + text("os.system") + b"\x93."
    assert pickle.loads(payload) is os.system
    with pytest.raises(pickle.UnpicklingError, match="os.system is not allowed in checkpoint metadata"):
        Unpickler(io.BytesIO(payload)).load()
    # a class reached so (io.FileIO truncates the file it opens), and torch's functions: refused; its dtypes read.
    # DCP's own functions (torch_save_to_dcp unpickles any file), torch's classes beyond DCP's (_open_file opens
    # a file to write): refused
    for module, name in [("torch.distributed.checkpoint.filesystem", "io.FileIO"), ("torch", "save"),
                         ("torch.distributed.checkpoint.format_utils", "torch_save_to_dcp"),
                         ("torch.serialization", "_open_file")]:
        with pytest.raises(pickle.UnpicklingError, match=f"{module}.{name} is not allowed in checkpoint metadata"):
            Unpickler(io.BytesIO(b"\x80\x04" + text(module) + text(name) + b"\x93.")).load()
    assert Unpickler(io.BytesIO(b"\x80\x04" + text("torch") + text("float32") + b"\x93.")).load() is torch.float32


def test_a_corrupt_shards_folder_beside_a_ckpt_pt_names_the_way_back_to_it(tmp_path):
    """A sharded checkpoint that cannot be read, with a ckpt.pt or a kept one beside it: the one line says to move it
    away, naming the one a resume then takes."""
    from support.sharded import read
    shards = tmp_path / "shards-00000004"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"not a pickle")
    model = RecursiveGPT(Config(vocab_size=8, block_size=4, n_embd=16, n_head=2, layout="1"))
    tc = dict(dataset="tiny", weight_decay=0, beta1=0, beta2=0)  # whole plain data: its shards are what fails
    (shards / "state.json").write_text(json.dumps(dict(model_config=model.config.to_dict(), train_config=tc,
                                                       iter_num=4, best_val_loss=1.0)))
    optimizer = model.configure_optimizer(0.0, 1e-3)
    for beside, advice in [(False, "; point --out_dir"),
                           (True, "; move it away to resume from ckpt.pt beside it, or point")]:
        if beside:
            (tmp_path / "ckpt.pt").write_bytes(b"")
        with pytest.raises(CheckpointError, match=f"checkpoint {shards} is incomplete or corrupt .*{advice}"):
            read(str(shards), model, optimizer, no_dist=True)
    (tmp_path / "ckpt_2").mkdir()  # --keep_every's copy of a sharded one: further than the unreadable ckpt.pt
    with pytest.raises(CheckpointError, match="; move it away to resume from ckpt_2 beside it, or point"):
        read(str(shards), model, optimizer, no_dist=True)


def test_a_whole_shards_folder_without_its_state_is_refused_not_passed_over(tmp_path, capsys):
    """state.json is written before any shard, so a shards folder with DCP's .metadata but no state.json is damaged,
    not unfinished: a resume is refused, naming it, and never goes back to an older ckpt.pt beside it (whose run's
    next save would remove the newer shards)."""
    shards = tmp_path / "shards-00000003"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"")
    cfg = Config(vocab_size=32, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1", scheme="mesh")
    checkpoint.save(dict(model=RecursiveGPT(cfg).state_dict(), model_config=cfg.to_dict(), iter_num=2,
                         train_config=dict(dataset="tiny"), saved_at=100.0), str(tmp_path / "ckpt.pt"))
    before = snapshot(tmp_path)
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path}"]) == 2
    path = shards / "state.json"
    assert capsys.readouterr().err == (f"train.py: error: {path} is corrupt (FileNotFoundError: [Errno 2] No such "
                                       f"file or directory: '{path}'); move {shards} away or point --out_dir at "
                                       f"another run\n")
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def sharded(data_root, tmp_path_factory):
    """A 2-process FSDP run, its checkpoint sharded at iters 0 and 2, ending with a sample (both ranks decode, as
    each gathers the weights with the other); tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    r = torchrun(*TINY, f"--data_root={data_root}", f"--out_dir={out}", *COMMON, "--max_iters=2", "--sample_tokens=8")
    assert r.returncode == 0 and r.stdout.count("---- sample ----") == 1, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_a_sharded_run_owns_its_folder(sharded, data_root, tmp_path):
    """A scratch FSDP run into a sharded run's folder is refused without --overwrite; with it, the old shards are
    replaced whole."""
    out = shutil.copytree(sharded, tmp_path / "run")
    before = snapshot(out)
    r = torchrun(*TINY, f"--data_root={data_root}", f"--out_dir={out}", *COMMON, "--max_iters=2")
    assert r.returncode != 0 and (f"train.py: error: {out} holds a run's checkpoints (shards-00000002); continue from "
                                  f"its latest, shards-00000002 (iter 2), with --init_from=resume") in r.stderr, r.stderr[-3000:]
    assert snapshot(out) == before


def test_the_sharded_checkpoint_records_its_data(sharded, data_root, tmp_path, capsys):
    out = shutil.copytree(sharded, tmp_path / "run")
    meta = state(out / "shards-00000002")
    with open(os.path.join(data_root, "tiny", "meta.json")) as f:
        assert meta["data"]["sha256"] == json.load(f)["sha256"] and isinstance(meta["saved_at"], float)
    data = shutil.copytree(data_root, tmp_path / "data")
    (tmp_path / "new.txt").write_text(TEXT.replace("king", "gink"))
    prepare("tiny", input=str(tmp_path / "new.txt"), out_root=str(data), log=lambda *a: None)
    meta["train_config"]["data_root"] = str(data)
    (out / "shards-00000002" / "state.json").write_text(json.dumps(meta))
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2  # loads it whole: refused
    assert "is not the data the checkpoint was trained on: sha256" in capsys.readouterr().err


def test_consolidation_owns_the_folder_and_never_goes_back(sharded, tmp_path, capsys):
    out = shutil.copytree(sharded, tmp_path / "run")
    runfiles.own(str(out))  # a live run there
    try:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "consolidate.py"), f"--out_dir={out}"], capture_output=True, text=True,
                           timeout=HANG)
    finally:
        runfiles.release()
    assert r.returncode == 2 and r.stderr == (f"consolidate.py: error: another run is using OUT_DIR={out} (it holds the "
                                              f"folder's lock); wait for it to end, or choose another OUT_DIR\n")
    assert not (out / "ckpt.pt").exists()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 0  # a later ckpt.pt (DDP)
    before = snapshot(out)
    assert consolidate.main([f"--out_dir={out}"]) == 2
    assert capsys.readouterr().err == (f"consolidate.py: error: {out / 'ckpt.pt'} (iter 4) is further in training "
                                       f"than the sharded checkpoint (iter 2), which would replace it; it needs no consolidation\n")
    assert snapshot(out) == before


def test_a_full_disk_during_a_sharded_save_says_so(data_root, tmp_path):
    """On a small real file system (a tmpfs, where this machine lets us mount one), the sharded save's failure
    is named as what it is."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        r = torchrun(*TINY, f"--data_root={data_root}", f"--out_dir={disk / 'run'}", *COMMON, "--max_iters=2")
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert r.returncode != 0 and "writing the sharded checkpoint" in r.stderr and "the disk is full (" in r.stderr, \
        r.stderr[-3000:]


@pytest.mark.skipif(bool(TOO_OLD), reason=TOO_OLD)
def test_the_survivor_of_a_killed_rank_says_so_in_one_line(data_root, tmp_path):
    """kill -9 of one rank of an FSDP job: the other rank's error is one line, not gloo's traceback."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
           "--redirects=3", os.path.join(ROOT, "train.py"), "--fsdp=true", *TINY, f"--data_root={data_root}",
           f"--out_dir={tmp_path / 'run'}", *COMMON, "--max_iters=100000", "--eval_interval=100000"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any('"iter": 3' in f.read_text() for f in tmp_path.glob("run/log.jsonl")):
            time.sleep(0.2)
        rank1 = next(pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if worker(pid, tmp_path, 1))
        os.kill(rank1, signal.SIGKILL)
        p.communicate(timeout=HANG)
    finally:
        p.kill()
    lines = [line.split("]: ", 1)[-1] for line in next(logs.rglob("attempt_0/0/stderr.log")).read_text().splitlines()]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: another process of this torchrun job stopped ("), \
        "\n".join(lines)[-3000:]


def worker(pid, tmp_path, rank):
    """Whether process pid is rank `rank` of the job writing into tmp_path/run."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f, open(f"/proc/{pid}/environ", "rb") as g:
            return str(tmp_path / "run").encode() in f.read() and f"\0RANK={rank}\0".encode() in b"\0" + g.read()
    except OSError:  # gone, or another user's
        return False


def test_a_resume_whose_data_ran_out_saves_nothing_again(data_root, tmp_path):
    """A sequential run resumed after its data ran out is at its end already: it says so, evaluates and saves
    nothing again (a run never saves twice at one iteration), and its sharded checkpoint stays as it was."""
    out, flags = tmp_path / "run", [*TINY, f"--data_root={data_root}", "--data_order=sequential", "--batch_size=64",
                                    "--grad_accum=4", "--eval_interval=2", "--max_iters=10"]
    before = None
    for i in range(2):
        r = torchrun(*flags, f"--out_dir={out}", *(["--init_from=resume"] if i else []), nproc=1)
        assert r.returncode == 0 and "the data ran out at iter 3" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
        assert listed(out) == ["log.jsonl", "shards-00000003"]
        before = before or snapshot(out)
    assert snapshot(out) == before and [i for i, _ in losses(out, "val_loss")] == [0, 2, 3]


def test_which_checkpoint_a_resume_takes_is_decided_by_training_progress(sharded, data_root, tmp_path, capsys):
    """ckpt.pt saved with the clock an hour ahead (an NTP correction, a copy from another machine) but at an earlier
    iteration than the sharded checkpoint: the sharded one is taken. At the same iteration the clock breaks the
    tie; at the same time too (consolidate.py's copy) a resume without --fsdp takes the whole one."""
    out = shutil.copytree(sharded, tmp_path / "run")
    meta = state(out / "shards-00000002")
    assert consolidate.main([f"--out_dir={out}"]) == 0  # ckpt.pt: the same checkpoint, iter 2
    whole = torch.load(out / "ckpt.pt", weights_only=True)
    for iter_num, ahead, taken in ((0, 3600.0, "state.json"), (2, 3600.0, "ckpt.pt"), (2, -3600.0, "state.json"),
                                   (2, 0.0, "ckpt.pt")):
        checkpoint.save({**whole, "iter_num": iter_num, "saved_at": meta["saved_at"] + ahead}, str(out / "ckpt.pt"))
        assert os.path.basename(resume.resume_from(str(out), sharded=False)["path"]) == taken


def test_a_sharded_checkpoint_of_earlier_code_is_still_read(sharded, tmp_path, capsys):
    """Earlier code wrote a sharded checkpoint's plain data into OUT_DIR/ckpt-sharded.json, which named its shards
    folder: read still, by an FSDP resume, by one process and by consolidate.py; the next save replaces both."""
    out = shutil.copytree(sharded, tmp_path / "run")
    shards = out / "shards-00000002"
    (out / "ckpt-sharded.json").write_text(json.dumps({**state(shards), "folder": shards.name}))
    (shards / "state.json").unlink()
    old = shutil.copytree(out, tmp_path / "old")
    r = torchrun("--init_from=resume", f"--out_dir={out}", "--max_iters=4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert listed(out) == ["log.jsonl", "shards-00000004"]
    assert train.main(["--init_from=resume", f"--out_dir={old}", "--max_iters=4"]) == 0
    close(losses(out), losses(old))
    os.remove(old / "ckpt.pt")
    assert consolidate.main([f"--out_dir={old}"]) == 0 and checkpoint.load(str(old))[1]["iter_num"] == 2


def test_a_kept_sharded_checkpoint_is_a_run_folder_later_saves_leave(sharded, tmp_path, capsys):
    """--keep_every under FSDP keeps ckpt_ITER/, a run folder holding its shards folder, that the save after it
    leaves whole; sample.py --ckpt=ITER names consolidate.py, then reads its copy."""
    out = shutil.copytree(sharded, tmp_path / "run")
    r = torchrun("--init_from=resume", f"--out_dir={out}", "--max_iters=6", "--keep_every=4")
    assert r.returncode == 0, r.stderr[-3000:]
    kept = out / "ckpt_4"
    assert listed(out) == ["ckpt_4", "log.jsonl", "shards-00000006"]
    assert listed(kept) == ["shards-00000004"] and state(kept / "shards-00000004")["iter_num"] == 4
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--ckpt=4"]) == 2
    assert f"python tools/consolidate.py --out_dir={kept}" in capsys.readouterr().err
    assert consolidate.main([f"--out_dir={kept}"]) == 0
    assert sample.main([f"--out_dir={out}", "--ckpt=4", "--max_new_tokens=4"]) == 0
    assert checkpoint.load(str(kept))[1]["iter_num"] == 4
    shutil.rmtree(out / "shards-00000006")  # moved away: the kept one is the run's latest, which it consolidates
    os.remove(kept / "ckpt.pt")
    capsys.readouterr()
    assert consolidate.main([f"--out_dir={out}"]) == 0
    assert capsys.readouterr().out == f"wrote {kept / 'ckpt.pt'} (iter 4) from {kept / 'shards-00000004'}\n"
