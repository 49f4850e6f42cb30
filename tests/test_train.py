"""
End-to-end tests of train.py and sample.py on a tiny prepared dataset: every scheme
trains, resume is exact, 1 vs 2 processes agree, bad input is one line and touches
nothing, and crashes (kill -9, NaN, Ctrl-C) never lose the last good checkpoint.

    python -m pytest tests/test_train.py -q --all  # --all: its slow-marked tests too
"""

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from support import checkpoint, device as machine
import mesh
from tools import probe
import sample
import train
from configurator import DataError, UsageError, parse_flags
from support.files import read_config
from data.dataset import load_split
from data.prepare import prepare
from data.meta import Tokenizer
from conftest import HANG, ROOT, TINY, losses, poison_micro_batch, run, snapshot

def cli(script, args, data_root, out_dir, **kw):
    cmd = [sys.executable, os.path.join(ROOT, script), *TINY, f"--data_root={data_root}", f"--out_dir={out_dir}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)


def tiny_run(data_root, *flags):
    """The TrainConfig, model (as train.py initialises it) and train / val tokens of a tiny run, built apart
    from train.py: what a test compares train.py's own computation with."""
    given = parse_flags(train.TrainConfig, [*TINY, f"--data_root={data_root}", *flags], "train.py")
    tc = train.TrainConfig(**given)
    folder = os.path.join(data_root, "tiny")
    torch.manual_seed(tc.seed)
    model = mesh.RecursiveGPT(train.model_config(tc, Tokenizer.load(folder).vocab_size))
    return tc, model, load_split(folder, "train"), load_split(folder, "val")


@pytest.mark.parametrize("scheme", mesh.SCHEMES)
def test_every_scheme_trains_and_samples(scheme, data_root, tmp_path, capsys):
    out = tmp_path / scheme
    assert run([f"--scheme={scheme}", "--max_iters=8", "--eval_interval=4", "--lr=3e-3"], data_root, out) == 0
    log = losses(out)
    assert [i for i, _ in log] == list(range(1, 9))
    assert log[-1][1] < log[0][1]  # the loss falls
    model, ckpt = checkpoint.load(str(out))
    assert ckpt["iter_num"] == 8 and model.config.scheme == scheme
    assert not any("module." in k or "_orig_mod." in k for k in ckpt["model"])
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--start=Then", "--max_new_tokens=20", "--num_samples=2"]) == 0
    texts = capsys.readouterr().out.split("---------------\n")[:2]
    assert all(t.startswith("Then") and len(t) == len("Then") + 20 + 1 for t in texts)  # + print's newline


def test_resume_is_bit_exact(data_root, tmp_path):
    common = ["--max_iters=10", "--lr_decay_iters=10", "--eval_interval=5", "--dropout=0.1"]
    assert run(common, data_root, tmp_path / "a") == 0
    assert run([*common, "--max_iters=5"], data_root, tmp_path / "b") == 0
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'b'}", "--max_iters=10"]) == 0
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # bit for bit, dropout included
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in "ab")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    vals = losses(tmp_path / "b", "val_loss")
    assert [i for i, _ in vals] == [0, 5, 10]  # the resume does not evaluate iter 5 again
    assert b["best_val_loss"] == a["best_val_loss"] == min(v for _, v in vals)


def test_checkpoint_layout_is_plain_data_and_tensors(data_root, tmp_path):
    """ckpt.pt holds exactly these entries (the format every version of train.py writes and resumes): configs,
    iteration, best val loss and the data record as plain data, model and optimizer states as tensors (no RNG
    state: train.py seeds each micro-batch's dropout)."""
    assert run(["--max_iters=1", "--eval_interval=1"], data_root, tmp_path / "o") == 0
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    assert sorted(ckpt) == ["best_val_loss", "data", "iter_num", "launch", "model", "model_config", "optimizer",
                            "saved_at", "train_config"]  # saved_at: when (which of two formats is the later)
    assert ckpt["launch"] is None  # launch: the torchrun launch that saved it (distributed.launch_id), None outside
    assert json.loads(json.dumps([ckpt[k] for k in ("model_config", "train_config", "data", "iter_num")]))
    assert ckpt["train_config"]["dtype"] == "auto"  # saved as given


def test_a_train_config_without_data_root_passes_the_checks():
    """A run's data_root is optional in a checkpoint (a reader takes its --data_root, else the default)."""
    checkpoint.check_plain({"model_config": {}, "train_config": {"dataset": "tiny"}, "iter_num": 0})


def test_a_config_field_a_checkpoint_lacks_is_noted_once(capsys):
    """A field a checkpoint lacks takes this code's default, which one note says, however often it is read."""
    cfg = mesh.Config(vocab_size=32, block_size=16, n_embd=32, n_head=2).to_dict()
    cfg.pop("slot0")
    checkpoint._noted.clear()
    for _ in range(2):
        assert checkpoint.config_of({"model_config": cfg}, "old.pt").slot0 == "scaled"
    assert capsys.readouterr().err == ("note: old.pt was saved without model_config's slot0; this code's "
                                       "defaults: slot0='scaled'\n")


def test_a_checkpoint_of_an_earlier_version_resumes(data_root, tmp_path):
    """Before checkpoints recorded saved_at (and a sharded one its data and checksums) they held the rest: such a
    ckpt.pt resumes as it always did, onto the same losses as a run never stopped."""
    common = ["--lr_decay_iters=4", "--eval_interval=2"]
    assert run([*common, "--max_iters=4"], data_root, tmp_path / "a") == 0
    assert run([*common, "--max_iters=2"], data_root, tmp_path / "b") == 0
    ckpt = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)
    del ckpt["saved_at"]
    ckpt["rng"] = {"torch": [0] * 8}  # and its generators' states, which no resume reads now
    torch.save(ckpt, tmp_path / "b" / "ckpt.pt")
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'b'}", "--max_iters=4"]) == 0
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_get_batch_windows_reach_the_last_token():
    """Windows of T+1 tokens start anywhere from 0 to len - T - 1: on T+1 tokens the one window is all of them."""
    tc = train.TrainConfig(batch_size=3)
    x, y = train.get_batch(torch.arange(9).numpy(), tc, 8, (0, 0, 0), "cpu")
    assert x.tolist() == [list(range(8))] * 3 and y.tolist() == [list(range(1, 9))] * 3
    starts = {train.get_batch(torch.arange(12).numpy(), tc, 8, (0, it, 0), "cpu")[0][0, 0].item() for it in range(40)}
    assert starts == {0, 1, 2, 3}


def test_batches_are_keyed_by_seed_split_step_and_micro_batch():
    """Each key (0, step, micro-batch) to train, (split code, 0, k) to evaluate draws its own windows, and --seed
    others; evaluation draws them at random under --data_order=sequential too (only training reads in order)."""
    data, tc = torch.arange(10000).numpy(), train.TrainConfig(batch_size=4)
    starts = lambda tc, key: tuple(train.get_batch(data, tc, 8, key, "cpu")[0][:, 0].tolist())  # noqa: E731
    keys = [(0, 0, 0), (0, 1, 0), (0, 0, 1), (1, 0, 0), (2, 0, 0)]
    assert len({starts(tc, key) for key in keys}) == len(keys)
    assert starts(train.TrainConfig(batch_size=4, seed=1), (0, 0, 0)) != starts(tc, (0, 0, 0))
    seq = train.TrainConfig(batch_size=4, grad_accum=2, data_order="sequential")
    assert [starts(seq, key) for key in keys[3:]] == [starts(tc, key) for key in keys[3:]]
    assert starts(seq, (0, 1, 1)) == (108, 117, 126, 135)  # step 1's second micro-batch: windows 12-15 of 9 tokens


def test_lr_schedule_is_warmup_then_cosine_to_min_lr():
    """Appendix B (Pythia's schedule): linear warmup, then a cosine from lr down to min_lr at lr_decay_iters, then min_lr."""
    lr = lambda it: train.get_lr(it, lr=1e-3, min_lr=1e-4, warmup=10, decay=110)
    assert lr(0) == pytest.approx(1e-3 / 11) and lr(9) == pytest.approx(1e-3 * 10 / 11)
    assert lr(10) == pytest.approx(1e-3) and lr(60) == pytest.approx(5.5e-4)  # the cosine's middle
    assert lr(85) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(0.75 * math.pi)) * 9e-4)
    assert lr(110) == lr(1000) == 1e-4


def test_train_step_applies_the_recipe(data_root, tmp_path, monkeypatch):
    """One step over --grad_accum=2: clipping (at --grad_clip) sees the mean of the micro-batches'
    gradients, computed here apart from train.py (dropout's masks keyed by seed, step and micro-batch, as
    the batches are), and the log their mean loss; AdamW gets this step's lr (warmup defaults to 1% of
    lr_decay_iters, at least 1 step), betas (0.9, 0.95), weight decay 0.01 on matrices only and the clipped
    gradient; --grad_clip=0 skips clipping."""
    flags = ["--grad_accum=2", "--grad_clip=0.5", "--lr=1e-2", "--lr_decay_iters=300", "--max_iters=1",
             "--dropout=0.1"]
    tc, model, train_data, _ = tiny_run(data_root, *flags)
    params = list(model.parameters())
    expect, loss = [torch.zeros_like(p) for p in params], 0.0
    for m in range(2):
        torch.manual_seed(hash((tc.seed, 0, m)))
        x, y = train.get_batch(train_data, tc, model.config.block_size, (0, 0, m), "cpu")
        micro = model(x, y)[1]
        loss += micro.item() / 2
        for e, g in zip(expect, torch.autograd.grad(micro, params)):
            e += g / 2
    clipped, stepped, norms = [], [], []  # norms: of the gradient AdamW steps on
    real_clip, real_step = torch.nn.utils.clip_grad_norm_, torch.optim.AdamW.step

    def clip(ps, max_norm, *a, **kw):
        ps = list(ps)
        clipped.append(([p.grad.clone() for p in ps], max_norm))
        return real_clip(ps, max_norm, *a, **kw)

    def step(self, *a, **kw):
        stepped.append([dict(g) for g in self.param_groups])
        norms.append(torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]]).norm().item())
        return real_step(self, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    assert run(flags, data_root, tmp_path / "a") == 0
    assert losses(tmp_path / "a") == [(1, pytest.approx(loss, rel=1e-6))]
    (grads, max_norm), = clipped
    assert max_norm == 0.5
    for e, g in zip(expect, grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)
    (groups,) = stepped
    assert [g["lr"] for g in groups] == [pytest.approx(1e-2 / 4)] * 2  # warmup 3 steps: 1e-2 x (0 + 1) / (3 + 1)
    assert all(g["betas"] == (0.9, 0.95) for g in groups)
    assert [(g["weight_decay"], [p.shape for p in g["params"]]) for g in groups] == \
        [(0.01, [p.shape for p in params if p.dim() >= 2]), (0.0, [p.shape for p in params if p.dim() < 2])]
    assert run([*flags, "--grad_clip=0", "--lr_decay_iters=50"], data_root, tmp_path / "b") == 0
    assert len(clipped) == 1 and len(stepped) == 2
    unclipped = torch.cat([e.flatten() for e in expect]).norm().item()
    assert unclipped > 0.5 and norms == [pytest.approx(0.5, rel=1e-5), pytest.approx(unclipped, rel=1e-4)]
    assert stepped[1][0]["lr"] == pytest.approx(1e-2 / 2)  # 1% of 50 steps is 0: 1 step, 1e-2 x 1 / 2


def test_evaluate_uses_the_same_batches_of_each_split(data_root, monkeypatch):
    """evaluate(): the mean loss over eval_iters batches of each split, the same batches at every evaluation,
    shared out over the processes (here two ranks' shares, the last round padded, make the one process's)."""
    tc, model, train_data, val_data = tiny_run(data_root, "--eval_iters=3")
    T, splits = model.config.block_size, {"train": train_data, "val": val_data}

    def direct(data, code):
        with torch.no_grad():
            return sum(model(*train.get_batch(data, tc, T, (code, 0, k), "cpu"))[1].item() for k in range(3)) / 3

    first = train.evaluate(model, splits, tc, "cpu", contextlib.nullcontext())
    assert train.evaluate(model, splits, tc, "cpu", contextlib.nullcontext()) == first
    assert first["train"] == pytest.approx(direct(train_data, 1), rel=1e-6)
    assert first["val"] == pytest.approx(direct(val_data, 2), rel=1e-6) and first["val"] != first["train"]
    seen = []
    model.evaluate = lambda batches, autocast: [seen.append(y.sum().item()) or seen[-1] for _, y in batches]
    monkeypatch.setattr(train.dist, "all_reduce", lambda total: None)  # rank 1 of 2, alone: its own share
    out = train.evaluate(model, {"val": val_data}, tc, "cpu", contextlib.nullcontext(), rank=1, world=2)
    expect = [train.get_batch(val_data, tc, T, (1, 0, k), "cpu")[1].sum().item() for k in (1, 0)]  # 1, then 3 % 3
    assert seen == expect
    assert out == {"val": expect[0]}  # the padding batch's loss (k = 3) left out


def test_the_logged_evaluation_is_each_splits_loss(data_root, tmp_path):
    """An evaluation's record: evaluate()'s loss of the train split as train_loss, of the val split as val_loss."""
    tc, model, train_data, val_data = tiny_run(data_root, "--max_iters=0")
    expect = train.evaluate(model, {"train": train_data, "val": val_data}, tc, "cpu", contextlib.nullcontext())
    assert run(["--max_iters=0"], data_root, tmp_path) == 0
    assert losses(tmp_path, "train_loss") == [(0, expect["train"])] and expect["train"] != expect["val"]
    assert losses(tmp_path, "val_loss") == [(0, expect["val"])]


def test_best_val_loss_is_the_lowest_evaluation(data_root, tmp_path, monkeypatch):
    """The checkpoint's best_val_loss is the lowest val loss evaluated so far, not the latest."""
    vals = iter([2.0, 1.0, 3.0])
    monkeypatch.setattr(train, "evaluate", lambda *a, **kw: {"train": 1.0, "val": next(vals)})
    assert run(["--max_iters=2", "--eval_interval=1"], data_root, tmp_path) == 0
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["best_val_loss"] == 1.0


def test_resume_resolves_lr_dtype_and_compile_afresh(data_root, tmp_path):
    """The checkpoint keeps --dtype, --compile, --lr, --min_lr and the schedule's lengths as given
    (auto / None: resolved again on the machine that resumes, for its flags), so a resume with a
    lower --lr also gets 10% of it as min_lr, and one given --lr_decay_iters keeps it; AdamW's
    weight decay and betas given are the ones it trains with, not the checkpoint's."""
    out = tmp_path / "run"
    assert run(["--max_iters=2", "--eval_interval=2", "--lr=1e-2"], data_root, out) == 0
    saved = torch.load(out / "ckpt.pt", weights_only=True)["train_config"]
    assert (saved["dtype"], saved["compile"], saved["lr"], saved["min_lr"]) == ("auto", None, 1e-2, None)
    assert (saved["lr_decay_iters"], saved["warmup_iters"]) == (None, None)
    args = ["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--lr=1e-3", "--lr_decay_iters=2",
            "--weight_decay=0.5", "--beta1=0.5"]
    assert train.main(args) == 0
    with open(out / "log.jsonl") as f:
        lrs = [r["lr"] for r in map(json.loads, f) if "lr" in r]
    assert lrs[2:] == [1e-4, 1e-4]  # past lr_decay_iters: min_lr, 10% of the new --lr
    groups = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["betas"]) for g in groups] == [(0.5, (0.5, 0.95)), (0.0, (0.5, 0.95))]


def test_resume_never_prepares_or_swaps_its_dataset(data_root, tmp_path, capsys, monkeypatch):
    """A run trained on a relative data_root records it absolutely; resumed from another folder after the
    data moved, it says where the dataset is missing and names --data_root; nothing is downloaded, no other
    dataset stands in, nothing is created. Given --data_root, where the data is now, it continues."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    shutil.copytree(data_root, tmp_path / "a" / "mine")
    monkeypatch.chdir(tmp_path / "a")
    out = tmp_path / "run"
    assert train.main([*TINY, "--data_root=mine", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2"]) == 0
    os.rename(tmp_path / "a" / "mine", tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "b")
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4"]) == 2
    err = capsys.readouterr().err
    mine = tmp_path / "a" / "mine"
    assert (f"dataset 'tiny' is not in --data_root={mine} (no {mine}/tiny/meta.json): give "
            f"the folder it moved to with --data_root") in err
    assert snapshot(tmp_path) == before and os.listdir(tmp_path / "b") == []
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--data_root=../moved"]) == 0


@pytest.mark.slow
def test_one_vs_two_processes_and_resume_1_2_1(data_root, tmp_path):
    """Batches and dropout's masks depend only on (seed, step, micro-batch): 1 process and 2 processes (torchrun,
    gloo) see the same global batch, and a run resumed 1 -> 2 -> 1 processes continues the same loss curve."""
    common = ["--grad_accum=4", "--max_iters=6", "--lr_decay_iters=6", "--eval_interval=2",
              "--dropout=0.1"]  # 2 micro-batches a rank
    assert run(common, data_root, tmp_path / "one") == 0
    assert run([*common, "--max_iters=2"], data_root, tmp_path / "mix") == 0
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                os.path.join(ROOT, "train.py"), "--init_from=resume", f"--out_dir={tmp_path / 'mix'}", "--max_iters=4"]
    r = subprocess.run(torchrun, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 process(es)" in r.stdout
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'mix'}", "--max_iters=6"]) == 0
    one, mix = losses(tmp_path / "one"), losses(tmp_path / "mix")
    assert [i for i, _ in mix] == [i for i, _ in one] == list(range(1, 7))
    assert mix[:2] == one[:2]  # same process count: identical
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(one, mix))  # up to float summation order
    one, mix = losses(tmp_path / "one", "val_loss"), losses(tmp_path / "mix", "val_loss")  # evaluation shared out too
    assert [i for i, _ in mix] == [i for i, _ in one] == [0, 2, 4, 6]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(one, mix))


@pytest.mark.slow
def test_two_processes_stop_together_on_a_dataset_error(data_root, tmp_path):
    """Rank 0 settles the dataset; when it cannot, every rank stops with its message (none waits forever)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                os.path.join(ROOT, "train.py"), f"--data_root={data_root}", "--dataset=never_made", "--grad_accum=2",
                f"--out_dir={tmp_path / 'out'}"]
    r = subprocess.run(torchrun, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=HANG)
    assert r.returncode != 0 and r.stderr.count("train.py: error: ") == 2, r.stderr[-2000:]
    assert r.stderr.count("python data/prepare.py --dataset never_made") == 2
    assert not (tmp_path / "out").exists()


BAD_TRAIN_INPUT = [  # (flags, words the one-line error must contain)
    (["--max_iter=5"], "did you mean --max_iters"),
    (["--max_iters=ten"], "--max_iters=ten is not an integer"),
    (["--lr=abc"], "--lr=abc is not a number (or None)"),
    (["--layout=2+4r2+2"], "(segment '4r2' is not 'C' or 'CRN': the R of CRN is upper case, '4R2')"),
    (["--layout=4+xR2+4"], "segment 'xR2'"),
    (["--scheme=mesj"], "did you mean 'mesh'"),
    (["--model=pythia-14b"], "did you mean 'pythia-1.4b'"),
    (["--n_slots=0"], "n_slots=0 must be at least 1"),
    (["--cycle=direkt"], "unknown cycle 'direkt' (did you mean 'direct'?)"),
    (["--scheme=anchor", "--router_init=base"], "router_init='base' is a MeSH setting, but scheme is 'anchor'"),
    (["--scheme=anchor", "--n_slots=5"], "--n_slots is a MeSH setting, but scheme is 'anchor'; drop it"),
    (["--scheme=anchor", "--n_slots=5", "--plan=true"], "--n_slots is a MeSH setting, but scheme is 'anchor'"),
    (["--n_embd=30", "--n_head=4"], "not divisible by n_head=4"),
    (["--dataset=never_made"], "python data/prepare.py --dataset never_made"),
    (["--block_size=8192"], "longer than the validation split"),
    (["--device=cuda"], "not available on this machine"),
    (["--init_from=resume"], "no checkpoint in"),
    (["--init_from=gpt2"], "not one of scratch, resume, vanilla:OUT_DIR, hf:PATH"),
    (["--compile=maybe"], "--compile=maybe is not true or false (or None)"),
    (["--eval_interval=0"], "--eval_interval=0 must be at least 1"),
    (["--log_interval=0"], "--log_interval=0 must be at least 1"),
    (["--batch_size=0"], "--batch_size=0 must be at least 1"),
    (["--max_iters=-1"], "--max_iters=-1 must be 0 or more"),
]


@pytest.mark.parametrize("flags, message", BAD_TRAIN_INPUT, ids=[" ".join(f) for f, _ in BAD_TRAIN_INPUT])
def test_bad_train_input_is_one_line_and_touches_nothing(flags, message, data_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # --device=cuda is unavailable even on a GPU machine
    before = snapshot(data_root, tmp_path)
    assert run(flags, data_root, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and err.count("\n") == 1 and message in err, err
    assert snapshot(data_root, tmp_path) == before and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_torchrun_with_defaults_takes_one_micro_batch_a_process(data_root, tmp_path):
    """Without --grad_accum each process takes one micro-batch a step: 2 processes train as 1 process does with
    --grad_accum=2, and the checkpoint keeps the resolved 2 (a resume keeps the run's batch); alone, 1."""
    common = ["--max_iters=3", "--eval_interval=3"]
    assert run([*common, "--grad_accum=2"], data_root, tmp_path / "one") == 0
    assert run(common, data_root, tmp_path / "alone") == 0
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}", f"--out_dir={tmp_path / 'two'}",
                *common]
    r = subprocess.run(torchrun, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=HANG)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 process(es), 128 tokens/step" in r.stdout  # batch 4 x 2 micro-batches x 16 tokens
    saved = {d: torch.load(tmp_path / d / "ckpt.pt", weights_only=True)["train_config"]["grad_accum"]
             for d in ("one", "two", "alone")}
    assert saved == {"one": 2, "two": 2, "alone": 1}
    for key in ("loss", "val_loss"):
        one, two = losses(tmp_path / "one", key), losses(tmp_path / "two", key)
        assert [i for i, _ in two] == [i for i, _ in one] and all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(one, two))


def test_grad_accum_must_divide_world_size(data_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as torchrun sets it
    assert run(["--grad_accum=3"], data_root, tmp_path) == 2
    assert "--grad_accum=3 does not divide by the world size 2" in capsys.readouterr().err


def test_a_resume_refuses_grad_accum_0_as_a_new_run_does(data_root, tmp_path, capsys):
    """--grad_accum=0 on a resume is out of range, as on a new run: never read as "not given" (one micro-batch
    a process), which trained on with a batch other than the run's, silently."""
    out = tmp_path / "run"
    assert run(["--max_iters=2", "--eval_interval=2", "--grad_accum=2"], data_root, out) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--grad_accum=0"]) == 2
    assert capsys.readouterr().err == "train.py: error: --grad_accum=0 must be at least 1\n"
    assert snapshot(out) == before


def test_existing_run_is_protected_and_resume_conflicts_are_listed(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["--max_iters=2", "--eval_interval=2"], data_root, out) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert run(["--max_iters=2"], data_root, out) == 2  # scratch over an existing checkpoint
    assert "--init_from=resume" in capsys.readouterr().err
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--n_embd=64", "--scheme=base"]) == 2
    err = capsys.readouterr().err
    assert "n_embd: checkpoint 32 vs given 64" in err and "scheme: checkpoint 'mesh' vs given 'base'" in err
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--model=pythia-14m", "--max_iters=4"]) == 2
    assert "model: checkpoint 'classroom' vs given 'pythia-14m'" in capsys.readouterr().err
    assert snapshot(out) == before
    assert train.main(["--init_from=resume", f"--out_dir={out}"]) == 0  # already finished: nothing to do
    assert f"{out / 'ckpt.pt'} is at iter 2, already --max_iters=2: nothing to do" in capsys.readouterr().out
    assert snapshot(out) == before


def test_out_dir_that_is_a_file_is_one_line(data_root, tmp_path, capsys):
    (tmp_path / "f").write_text("mine")
    assert run(["--max_iters=1"], data_root, tmp_path / "f") == 2
    assert capsys.readouterr().err == f"train.py: error: {tmp_path / 'f'} is a file; give a run's folder\n"
    assert (tmp_path / "f").read_text() == "mine"


def test_checkpoint_file_gets_the_mode_of_a_plain_save(data_root, tmp_path):
    """Atomic writes go through a temporary file, which still gets the mode a plain save would (umask)."""
    umask = os.umask(0o022)
    try:
        assert run(["--max_iters=1", "--eval_interval=1"], data_root, tmp_path / "o") == 0
    finally:
        os.umask(umask)
    for name in ("ckpt.pt", "log.jsonl"):
        assert os.stat(tmp_path / "o" / name).st_mode & 0o777 == 0o644
    assert not [n for n in os.listdir(tmp_path / "o") if n.endswith(".tmp")]


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("NVIDIA A10G", None), ("NVIDIA H200 NVL", None)])
def test_mfu_peak_by_exact_chip_name(name, peak, monkeypatch):
    """Substrings would mislead ('NVIDIA L40S' contains 'L4'); a chip not listed gets no MFU rather than a wrong one."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert machine.peak_bf16_flops("cuda:0", "bfloat16") == peak
    assert machine.peak_bf16_flops("cuda:0", "float32") is None and machine.peak_bf16_flops("cpu", "bfloat16") is None


def test_auto_dtype_takes_bf16_only_where_the_gpu_computes_it(monkeypatch):
    """--dtype=auto: bf16 autocast on a GPU that computes bf16 (Ampere on), float32 on one that would only emulate
    it (a V100 or T4, where torch.cuda.is_bf16_supported() says True unless told to leave emulation out)."""
    native = {"V100": False, "A100": True}
    for chip, has in native.items():
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: has or including_emulation)
        assert machine.resolve_dtype("auto", "cuda:0") == ("bfloat16" if has else "float32"), chip
        assert machine.resolve_dtype("auto", "cpu") == "float32"


def test_auto_device_prefers_cuda_then_mps_and_compiles_by_default_on_cuda_alone(monkeypatch):
    """--device=auto: cuda where there is one, even beside mps; --compile not given: compiled on CUDA only (an mps
    or CPU run starts at once); --dtype=bfloat16 runs its matmuls under bf16 autocast, float32 does not."""
    from types import SimpleNamespace
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert machine.resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert machine.resolve_device("auto") == "mps"
    tc = SimpleNamespace(device="mps", dtype="float32", compile=None, threads=None)
    assert machine.Device(tc, True).compile is False
    x = torch.ones(2, 2)
    for dtype, computed in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        with machine.Device(SimpleNamespace(device="cpu", dtype=dtype, compile=None, threads=None), True).autocast:
            assert (x @ x).dtype == computed, dtype


def test_mfu_is_the_share_of_every_processs_peak_and_pace_compares_with_the_first_three_windows():
    """mfu: FLOPs a second over world x the chip's peak. pace: a step 3x or more the fastest of the first three
    logged windows is named; a later, faster window does not lower the mark."""
    from types import SimpleNamespace
    device = machine.Device(SimpleNamespace(device="cpu", dtype="float32", compile=None, threads=None), True)
    cfg = mesh.Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1")
    assert device.mfu(cfg, 1000, 2.0, 4) is None  # a CPU: no peak
    device.peak = 1e12
    assert device.mfu(cfg, 1000, 2.0, 4) == machine.flops_per_token(cfg) * 1000 / 2.0 / 4e12
    said = [device.pace(s) for s in (1.0, 1.5, 1.2, 0.1, 2.9, 3.0)]
    assert said[:5] == [""] * 5 and said[5].startswith(", 3x slower than its first steps: other work shares")


@pytest.mark.slow
def test_cli_errors_have_no_traceback(data_root, tmp_path):
    r = cli("train.py", ["--scheme=mesj"], data_root, tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = cli("train.py", ["--scheme=mesj", "--debug=true"], data_root, tmp_path / "o")
    assert r.returncode == 1 and "Traceback" in r.stderr  # --debug shows it


def test_empty_prompt_starts_from_token_0(data_root):
    tok = Tokenizer.load(os.path.join(data_root, "tiny"))
    model = mesh.RecursiveGPT(mesh.Config(vocab_size=tok.vocab_size, block_size=8, n_embd=16, n_head=2, layout="2"))
    assert sample.complete(model, tok, "", 0, num_samples=2) == [tok.decode([0])] * 2


def test_an_empty_prompt_starts_from_endoftext_where_the_vocabulary_has_it():
    """GPT-2's BPE: <|endoftext|>, the token its documents start after (lm_eval_mesh.py's too)."""
    try:
        tok = Tokenizer("gpt2")
    except DataError as e:
        pytest.skip(f"GPT-2 vocabulary unavailable (set TIKTOKEN_CACHE_DIR): {e}")
    model = mesh.RecursiveGPT(mesh.Config(vocab_size=tok.vocab_size, block_size=8, n_embd=16, n_head=2, layout="2"))
    assert sample.complete(model, tok, "", 0) == ["<|endoftext|>"]


def test_bad_sample_input(data_root, tmp_path, capsys):
    assert sample.main([f"--out_dir={tmp_path / 'missing'}"]) == 2  # nothing trains it: train one
    assert capsys.readouterr().err == (f"sample.py: error: no checkpoint at {tmp_path / 'missing' / 'ckpt.pt'}; "
                                       f"train one with: python train.py --out_dir={tmp_path / 'missing'}\n")
    out = tmp_path / "run"
    assert run(["--max_iters=1", "--eval_interval=1"], data_root, out) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--start=Then é and €"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'é'" in err and "'€'" in err and "leave them out" in err
    for flag, message in [("--top_k=0", "--top_k=0 must be at least 1 (or None for no limit)"), ("--temperature=-1", "temperature=-1.0 must be 0"),
                          ("--temperature=nan", "temperature=nan must be 0"),
                          ("--num_samples=0", "--num_samples=0 must be at least 1")]:
        assert sample.main([f"--out_dir={out}", flag]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sample.py: error: ") and err.count("\n") == 1 and message in err, err
    shards = tmp_path / "sharded" / "shards-00000001"  # an FSDP run's folder: no ckpt.pt yet
    shards.mkdir(parents=True)
    (shards / ".metadata").write_bytes(b"")  # DCP's, written last: the folder is whole
    saved = torch.load(out / "ckpt.pt", weights_only=True)
    plain = {k: v for k, v in saved.items() if k not in ("model", "optimizer", "rng")}
    (shards / "state.json").write_text(json.dumps({**plain, "rng": {"torch": [0]}}))
    assert sample.main([f"--out_dir={tmp_path / 'sharded'}"]) == 2
    assert capsys.readouterr().err == (f"sample.py: error: {shards} (iter 1) is the run's latest checkpoint, a "
                                       f"sharded one, and sample.py reads a whole one (ckpt.pt); write it first: "
                                       f"python tools/consolidate.py --out_dir={tmp_path / 'sharded'}\n")
    data = (out / "ckpt.pt").read_bytes()
    (out / "ckpt.pt").write_bytes(data[: len(data) // 2])  # truncated
    assert sample.main([f"--out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ckpt.pt is corrupt" in err


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch EXPLOITED",))


def test_checkpoints_never_run_code(tmp_path):
    torch.save({"model": Exploit()}, tmp_path / "ckpt.pt")
    with pytest.raises(checkpoint.CheckpointError, match="corrupt or not a nanoMeSH checkpoint"):
        checkpoint.load(str(tmp_path))
    torch.save({"model": {}, "model_config": {}}, tmp_path / "ckpt.pt")  # not ours: no train_config
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint \(TypeError: train_config is None, not a dict\)"):
        checkpoint.load(str(tmp_path))
    assert not (tmp_path / "EXPLOITED").exists() and not os.path.exists(os.path.join(ROOT, "EXPLOITED"))
    needle = "torch" + ".load("  # spelled apart so that this scan does not find itself
    for folder in (ROOT, os.path.join(ROOT, "data")):  # and every torch loading in the project is weights_only
        for name in (n for n in os.listdir(folder) if n.endswith(".py")):
            with open(os.path.join(folder, name)) as f:
                for line in f:
                    if needle in line:
                        assert "weights_only=True" in line, (name, line)


def test_ms_per_iter_leaves_evaluation_out(data_root, tmp_path, monkeypatch):
    """On a fake clock where a step takes 1 s and an evaluation 100 s, every logged ms/iter is 1000."""
    clock = [0.0]
    get_batch, evaluate = train.get_batch, train.evaluate

    def batch(data, tc, T, key, device):
        clock[0] += 1.0 if key[0] == 0 else 0.0  # a training batch: one a step (grad_accum 1)
        return get_batch(data, tc, T, key, device)

    def evaluation(*a, **kw):
        clock[0] += 100.0
        return evaluate(*a, **kw)

    monkeypatch.setattr(train.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train, "get_batch", batch)
    monkeypatch.setattr(train, "evaluate", evaluation)
    assert run(["--max_iters=9", "--eval_interval=3", "--log_interval=2"], data_root, tmp_path / "clock") == 0
    with open(tmp_path / "clock" / "log.jsonl") as f:
        logged = [(r["iter"], r["ms"]) for r in map(json.loads, f) if "ms" in r]
    assert logged == [(i, 1000.0) for i in (2, 4, 6, 8, 9)]


@pytest.mark.parametrize("every", [4, 8])  # the last good checkpoint: iter 4's, or iter 0's alone
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(every, data_root, tmp_path, capsys, monkeypatch):
    out, kept = tmp_path / "nan", 6 // every * every
    poison_micro_batch(monkeypatch, 7)  # the 7th training micro-batch: iter 6 (0-based)
    assert run(["--max_iters=10", f"--eval_interval={every}"], data_root, out) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "loss is nan at iter 6" in err
    assert f"{out / 'ckpt.pt'} (iter {kept}) is the last good checkpoint" in err
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == kept and all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.slow
def test_ctrl_c_saves_and_resumes(data_root, tmp_path):
    out = tmp_path / "int"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}", f"--out_dir={out}",
           "--max_iters=100000", "--eval_interval=100000"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:  # wait for training to be under way
        if line.startswith("iter 3:"):
            break
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=HANG)
    assert p.returncode == 130, stderr
    assert "checkpoint saved" in stdout
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] >= 3
    assert train.main(["--init_from=resume", f"--out_dir={out}", f"--max_iters={ckpt['iter_num'] + 2}"]) == 0
    assert losses(out)[-1][0] == ckpt["iter_num"] + 2


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [4, 6], ids=["an evaluation step", "the last step"])
def test_a_stop_evaluates_the_step_it_stops_at(stop_at, data_root, tmp_path, monkeypatch, capsys):
    """SIGTERM during the step that ends at an evaluation (iter 4 of 6, one every 2) or at the run's end (6):
    the step is evaluated as it would have been, then saved; after a resume the log is the uninterrupted run's,
    evaluations included, and a run stopped in its last step is finished, evaluated at its end."""
    whole, out, flags = tmp_path / "whole", tmp_path / "run", ["--eval_interval=2", "--max_iters=6"]
    assert run(flags, data_root, whole) == 0
    get_batch = train.get_batch

    def sigterm_in_the_step(data, tc, T, key, device):
        if key == (0, stop_at - 1, 0):
            os.kill(os.getpid(), signal.SIGTERM)
        return get_batch(data, tc, T, key, device)
    monkeypatch.setattr(train, "get_batch", sigterm_in_the_step)
    assert run(flags, data_root, out) == 130
    monkeypatch.setattr(train, "get_batch", get_batch)
    assert losses(out, "val_loss")[-1][0] == stop_at
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={out}"]) == 0
    assert ("nothing to do" in capsys.readouterr().out) == (stop_at == 6)
    assert losses(out, "val_loss") == losses(whole, "val_loss") and losses(out) == losses(whole)


@pytest.mark.slow
def test_kill_9_during_checkpoint_write_never_corrupts(data_root, tmp_path):
    """Checkpoint every step, then kill -9 the trainer right as a checkpoint write starts (when its
    temporary file appears), a little later, and later still: ckpt.pt always loads, and resumes."""
    out = tmp_path / "kill"
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}", f"--out_dir={out}",
           "--max_iters=100000", "--eval_interval=1", "--eval_iters=1", "--n_embd=128", "--n_head=4"]
    interrupted_writes, last_iter = 0, 0

    def temporaries():
        return {n for n in os.listdir(out) if n.endswith(".tmp")} if out.exists() else set()

    for attempt, delay in enumerate([0.0, 0.002, 0.01, 0.05]):
        old = temporaries()  # left by the previous kill; the trainer removes them when it starts
        p = subprocess.Popen(cmd if attempt == 0 else [*cmd, "--init_from=resume"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not (out / "ckpt.pt").exists() and time.time() < deadline:  # the first checkpoint is done
            time.sleep(0.01)
        old |= temporaries()
        while not temporaries() - old and time.time() < deadline:  # the next write has started
            pass
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        interrupted_writes += bool(temporaries() - old)
        model, ckpt = checkpoint.load(str(out))  # raises if ckpt.pt were torn
        assert ckpt["iter_num"] >= last_iter  # never goes back
        last_iter = ckpt["iter_num"]
    assert interrupted_writes >= 1  # at least one kill landed inside a write
    assert train.main(["--init_from=resume", f"--out_dir={out}", f"--max_iters={ckpt['iter_num'] + 1}",
                       "--eval_interval=1000"]) == 0
    assert not any(n.endswith(".tmp") for n in os.listdir(out))  # leftovers are cleaned on start


def test_help_lists_every_setting_with_default_and_config_files_are_data(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert all(f"--{f}=" in text for f in train.TrainConfig.__dataclass_fields__)
    assert "--grad_accum=None" in text and "micro-batches a step, all processes; None: one each" in text
    cfg = tmp_path / "c.json"
    cfg.write_text('{"max_iters": 7, "scheme": "base"}')
    assert parse_flags(train.TrainConfig, [str(cfg), "--max_iters=9"], "train.py", read_config=read_config) == {"max_iters": 9,
                                                                                              "scheme": "base"}
    assert parse_flags(train.TrainConfig, ["--compile", "--overwrite"], "train.py") == {"compile": True,
                                                                                             "overwrite": True}
    cfg.write_text('{"max_iterz": 7}')
    with pytest.raises(UsageError, match="did you mean 'max_iters'"):
        parse_flags(train.TrainConfig, [str(cfg)], "train.py", read_config=read_config)
    cfg.write_text('{\n  "max_iters": 7,\n}\n')  # a trailing comma: said so, with where
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, [str(cfg)], "train.py", read_config=read_config)
    with pytest.raises(json.JSONDecodeError) as j:  # json's own words and place (Python 3.13 words it anew)
        json.loads(cfg.read_text())
    assert str(e.value) == (f"config file {str(cfg)!r} is not JSON ({j.value.msg}, line {j.value.lineno} column "
                            f"{j.value.colno}) (a comma after the last item?); fix it, or give the settings as flags")
    given = parse_flags(train.TrainConfig, ["--cycle=direct", "--router_init=base", "--slot0=unscaled"], "train.py")
    choices = train.model_config(train.TrainConfig(**given), vocab_size=65)  # MeSH's [choice]s reach the model
    assert (choices.cycle, choices.router_init, choices.slot0) == ("direct", "base", "unscaled")
    for name in os.listdir(os.path.join(ROOT, "config")):  # every shipped config is valid
        given = parse_flags(train.TrainConfig, [os.path.join(ROOT, "config", name)], "train.py",
                            read_config=read_config)
        tc = train.TrainConfig(**given)
        depth = train.model_config(tc, vocab_size=50304).shape.depth  # a recursive model as deep as its Pythia
        assert depth == mesh.PRESETS[tc.model].get("n_layer", depth) and depth in (12, 16, 24, 32)


# -----------------------------------------------------------------------------
# --data_order=sequential on an indexed dataset: which sequences each process reads, step by step

SEQ_TINY = [f for f in TINY if not f.startswith(("--dataset", "--block_size", "--batch_size"))] + [
    "--block_size=7", "--batch_size=2", "--grad_accum=4", "--data_order=sequential", "--eval_interval=2"]
SPY = """
import json, os, sys
sys.path.insert(0, {root!r})
import train
real = train.get_batch
def spy(data, tc, T, key, device):
    x, y = real(data, tc, T, key, device)
    if key[0] == 0:  # a training batch: which sequences (token 7 + i opens sequence i)
        with open({log!r}, "a") as f:
            f.write(json.dumps([int(os.environ.get("RANK", 0)), key[1], key[2], (x[:, 0] - 7).tolist()]) + "\\n")
    return x, y
train.get_batch = spy
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def seq_root(tmp_path_factory):
    """An indexed dataset (document.bin + .idx) of 100 sequences of 8 characters; sequence i starts with its own
    character (token id 7 + i), then 'abcdefg'. The last 1% (sequence 99) is held out: 99 train windows."""
    root = tmp_path_factory.mktemp("seqdata")
    (root / "seq.txt").write_text("".join(chr(0x100 + i) + "abcdefg" for i in range(100)))
    prepare("seq", input=str(root / "seq.txt"), out_root=str(root), format="indexed", seq_len=8, log=lambda *a: None)
    return str(root)


def read_spy(path):
    """{step: {micro-batch: (rank, sequences)}} from the spy's log."""
    steps = {}
    with open(path) as f:
        for rank, it, m, seqs in map(json.loads, f):
            assert m not in steps.setdefault(it, {})  # every micro-batch read once
            steps[it][m] = (rank, seqs)
    return steps


def spy_in_process(monkeypatch, log):
    real = train.get_batch

    def spy(data, tc, T, key, device):
        x, y = real(data, tc, T, key, device)
        if key[0] == 0:
            with open(log, "a") as f:
                f.write(json.dumps([0, key[1], key[2], (x[:, 0] - 7).tolist()]) + "\n")
        return x, y
    monkeypatch.setattr(train, "get_batch", spy)


@pytest.mark.slow
def test_sequential_order_1_vs_2_processes_and_resume(seq_root, tmp_path, monkeypatch):
    """Step it reads windows it*8 ... it*8+7 (batch 2 x grad_accum 4), micro-batch m the pair (it*4+m)*2 + {0, 1},
    whatever the number of processes: rank r reads micro-batches r, r+2. A resume continues with the next ones."""
    flags = [*SEQ_TINY, f"--data_root={seq_root}", "--dataset=seq", "--lr_decay_iters=4"]
    spy_in_process(monkeypatch, str(tmp_path / "one.jsonl"))
    assert train.main([*flags, f"--out_dir={tmp_path / 'one'}", "--max_iters=4"]) == 0
    one = read_spy(tmp_path / "one.jsonl")
    assert one == {it: {m: (0, [(it * 4 + m) * 2, (it * 4 + m) * 2 + 1]) for m in range(4)} for it in range(4)}
    (tmp_path / "spy.py").write_text(SPY.format(root=ROOT, log=str(tmp_path / "two.jsonl")))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                str(tmp_path / "spy.py"), *flags, f"--out_dir={tmp_path / 'two'}", "--max_iters=2"]
    r = subprocess.run(torchrun, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=HANG)
    assert r.returncode == 0, r.stderr[-2000:]
    spy_in_process(monkeypatch, str(tmp_path / "two.jsonl"))  # resumed by one process
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'two'}", "--max_iters=4"]) == 0
    two = read_spy(tmp_path / "two.jsonl")
    assert {it: {m: s for m, (_, s) in ms.items()} for it, ms in two.items()} == \
        {it: {m: s for m, (_, s) in ms.items()} for it, ms in one.items()}
    assert {(it, m): rank for it in (0, 1) for m, (rank, _) in two[it].items()} == \
        {(it, m): m % 2 for it in (0, 1) for m in range(4)}  # the two processes shared each step
    one_losses, two_losses = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [i for i, _ in two_losses] == [1, 2, 3, 4] and all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(one_losses, two_losses))


@pytest.mark.slow
def test_sequential_stops_when_the_data_runs_out(seq_root, tmp_path, monkeypatch, capsys):
    """99 train windows, 8 a step: 12 steps, then the run says so; --epochs=2 continues into a second pass."""
    flags = [*SEQ_TINY, f"--data_root={seq_root}", "--dataset=seq", f"--out_dir={tmp_path / 'run'}", "--eval_interval=100"]
    assert train.main([*flags, "--max_iters=20"]) == 0
    out = capsys.readouterr().out
    assert ("the data ran out at iter 12 (--max_iters=20): 0.970 epoch(s) of 99 windows of 8 tokens read in order, "
            "768 tokens seen; allow more passes with --init_from=resume --epochs=2") in out
    assert [i for i, _ in losses(tmp_path / "run")][-1] == 12
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["iter_num"] == 12
    assert sample.main([f"--out_dir={tmp_path / 'run'}", "--max_new_tokens=4"]) == 0  # done
    spy_in_process(monkeypatch, str(tmp_path / "spy.jsonl"))
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'run'}", "--epochs=2", "--max_iters=14"]) == 0
    steps = read_spy(tmp_path / "spy.jsonl")
    assert steps[12] == {0: (0, [96, 97]), 1: (0, [98, 0]), 2: (0, [1, 2]), 3: (0, [3, 4])}  # the second pass begins
    assert sorted(steps) == [12, 13] and "ran out" not in capsys.readouterr().out


def test_sequential_logs_its_last_step_and_its_eta_counts_to_it(seq_root, tmp_path, monkeypatch, capsys):
    """The data runs out at step 12 of --max_iters=20: step 12 is logged, and on a clock where a step takes a
    minute the eta at step 5 is the 7 steps left, not 15."""
    clock, get_batch = [0.0], train.get_batch

    def batch(data, tc, T, key, device):
        clock[0] += 15.0 if key[0] == 0 else 0.0  # 4 micro-batches a step
        return get_batch(data, tc, T, key, device)

    monkeypatch.setattr(train.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train, "get_batch", batch)
    assert train.main([*SEQ_TINY, f"--data_root={seq_root}", "--dataset=seq", f"--out_dir={tmp_path / 'run'}",
                       "--eval_interval=100", "--log_interval=5", "--max_iters=20"]) == 0
    assert [i for i, _ in losses(tmp_path / "run")] == [5, 10, 12]
    assert "eta 7.0 min" in capsys.readouterr().out


@pytest.mark.slow
def test_sequential_order_never_skips_data_when_the_batch_changes(seq_root, tmp_path, capsys):
    """3 steps of 2 x 4 windows read windows 0-23; at 16 windows a step the next step would begin at window 48:
    refused, with the numbers, rather than leaving 24-47 unread."""
    flags = [*SEQ_TINY, f"--data_root={seq_root}", "--dataset=seq", f"--out_dir={tmp_path / 'run'}"]
    assert train.main([*flags, "--max_iters=3"]) == 0
    before = snapshot(tmp_path)
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'run'}", "--max_iters=5", "--batch_size=4"]) == 2
    assert capsys.readouterr().err == (
        "train.py: error: --data_order=sequential: this run has read windows 0-23 (3 steps of 8); with 16 windows a "
        "step it would go on at window 48, not 24; resume with the run's own --batch_size=2 --grad_accum=4 (or as "
        "many windows a step in all)\n")
    assert snapshot(tmp_path) == before
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'run'}", "--max_iters=4", "--batch_size=4",
                       "--grad_accum=2"]) == 0  # 8 windows a step again: it goes on at window 24
    rand = tmp_path / "random"  # a run that read its windows at random has no order to keep: any batch goes on
    assert train.main([*flags, f"--out_dir={rand}", "--data_order=random", "--max_iters=1"]) == 0
    assert train.main(["--init_from=resume", f"--out_dir={rand}", "--max_iters=2", "--batch_size=4"]) == 0
    # (a resume cannot switch the order: test_resume_launch.py's test_a_resume_keeps_what_the_run_did)
    path = tmp_path / "run" / "ckpt.pt"  # edited: without batch_size, where the order goes on is unknown
    ckpt = torch.load(path, weights_only=True)
    del ckpt["train_config"]["batch_size"]
    torch.save(ckpt, path)
    capsys.readouterr()
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'run'}", "--max_iters=6"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (  # was a KeyError's traceback
        f"train.py: error: {path} lacks its run's batch_size or grad_accum, which its sequential order needs: "
        f"put them back")


def test_a_dataset_path_from_the_working_folder_is_found_from_any_other(seq_root, tmp_path, monkeypatch, capsys):
    """A relative --dataset=PATH/document, from the working folder: the run keeps where it is, so that its resume and
    sample.py find it from another folder (data/README.md)."""
    out = tmp_path / "run"
    monkeypatch.chdir(seq_root)
    assert train.main([*SEQ_TINY, "--dataset=seq/document", f"--out_dir={out}", "--max_iters=2"]) == 0
    monkeypatch.chdir(tmp_path)
    assert train.main(["--init_from=resume", f"--out_dir={out}", "--max_iters=3"]) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--start=abc", "--max_new_tokens=5"]) == 0
    assert capsys.readouterr().out.startswith("abc")


def test_dataset_given_as_a_path(seq_root, data_root, tmp_path, capsys):
    """--dataset=PATH/document reads an indexed dataset where it is; sample.py finds its tokenizer through the run."""
    out = tmp_path / "run"
    assert train.main([*SEQ_TINY, f"--dataset={seq_root}/seq/document", f"--out_dir={out}", "--max_iters=2"]) == 0
    assert "792 train tokens, sequential order" in capsys.readouterr().out  # 99 sequences of 8
    assert sample.main([f"--out_dir={out}", "--start=abc", "--max_new_tokens=5"]) == 0
    assert capsys.readouterr().out.startswith("abc")
    a = probe.ProbeConfig(num_samples=2)
    probed = [probe.probe_checkpoint(probe.opened(str(out), a, "probe.py"), a)]  # the indexed validation split
    assert probed[0]["seq_len"] == 7 and probed[0]["num_samples"] == 2 and "step1" in probed[0]["effort"]
    flat = [f for f in TINY if not f.startswith("--dataset")]
    assert train.main([*flat, f"--dataset={data_root}/tiny", f"--out_dir={tmp_path / 'flat'}", "--max_iters=1"]) == 0
    assert f"dataset {data_root}/tiny (" in capsys.readouterr().out  # a prepared folder, also given by its path
    before = snapshot(tmp_path)
    assert train.main([*SEQ_TINY, f"--dataset={tmp_path}/nothing/document", f"--out_dir={tmp_path / 'o'}"]) == 2
    assert capsys.readouterr().err == (f"train.py: error: there is no indexed dataset at {tmp_path}/nothing/document "
                                       f"(neither {tmp_path}/nothing/document.idx + .bin nor "
                                       f"{tmp_path}/nothing/document/document.idx + .bin); put Pythia's pre-tokenized "
                                       f"Pile there (README: Reproduce the paper) or make one with data/prepare.py "
                                       f"--format=indexed\n")
    assert snapshot(tmp_path) == before


def test_damaged_index_stops_training_with_one_line(seq_root, tmp_path, capsys):
    import shutil
    shutil.copytree(os.path.join(seq_root, "seq"), tmp_path / "seq")
    with open(tmp_path / "seq" / "document.bin", "ab") as f:
        f.write(b"\0\0")
    before = snapshot(tmp_path)
    assert train.main([*SEQ_TINY, f"--data_root={tmp_path}", "--dataset=seq", f"--out_dir={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and \
        "document.idx does not match" in err and "covers 1600 bytes (800 uint16 tokens) but the .bin has 1602" in err
    assert snapshot(tmp_path) == before
    assert train.main([*SEQ_TINY, f"--data_root={seq_root}", "--dataset=seq", "--data_order=shuffled"]) == 2
    assert "--data_order=shuffled is not random or sequential" in capsys.readouterr().err


def test_compile_on_a_cpu_says_what_it_costs_and_goes_on(data_root, tmp_path, capsys):
    assert run(["--compile", "--max_iters=0"], data_root, tmp_path / "c") == 0  # compiles lazily
    out = capsys.readouterr().out
    assert out.count("note: --compile on a CPU compiles for minutes before the first step") == 1
    assert run(["--max_iters=0"], data_root, tmp_path / "d") == 0
    assert "note: --compile" not in capsys.readouterr().out
