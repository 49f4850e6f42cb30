"""
Tests of a recursive model from a pretrained vanilla one (support/pretrained.py's loop, train.py
--init_from=vanilla:OUT_DIR): which source layer each block starts as, K = 1 giving back the source
exactly, bad sources in one line, and a resume that continues the uptraining bit for bit. The
hf: source's own tests are in tests/test_hf.py.

    python -m pytest tests/test_uptrain.py -q --all
"""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import sample
import train
from configurator import parse_flags
from mesh import Config, RecursiveGPT
from support import checkpoint, pretrained
from conftest import ROOT, TINY, losses, run, snapshot


def blocks(layout, L, core_init="stepwise"):
    return pretrained.core_layers(Config(layout=layout).shape, L, core_init)


def test_core_layers_stepwise_and_average():
    """The prelude is the first P layers, the coda the last Q; a core's block j stepwise the layer
    at j/C of its span, average the mean of the layers of every position it runs at."""
    ends = {"prelude.0": [0], "prelude.1": [1], "coda.0": [10], "coda.1": [11]}
    assert blocks("2+4R2+2", 12) == {**ends, "cores.0.0": [2], "cores.0.1": [4], "cores.0.2": [6],
                                     "cores.0.3": [8]}
    assert blocks("2+4R2+2", 12, "average") == {**ends, "cores.0.0": [2, 6], "cores.0.1": [3, 7],
                                                "cores.0.2": [4, 8], "cores.0.3": [5, 9]}
    three = {f"prelude.{i}": [i] for i in range(3)} | {f"coda.{i}": [9 + i] for i in range(3)}
    assert blocks("3+2R3+3", 12) == {**three, "cores.0.0": [3], "cores.0.1": [6]}
    assert blocks("3+2R3+3", 12, "average") == {**three, "cores.0.0": [3, 5, 7],
                                                "cores.0.1": [4, 6, 8]}
    # K = 1 with P + C + Q = L, and unshared cores: each block is the layer at its own depth
    for init in ("stepwise", "average"):
        assert blocks("1+2R1+1", 4, init) == {"prelude.0": [0], "cores.0.0": [1], "cores.0.1": [2],
                                              "coda.0": [3]}
        assert blocks("1+2+2+1", 6, init) == {"prelude.0": [0], "cores.0.0": [1], "cores.0.1": [2],
                                              "cores.1.0": [3], "cores.1.1": [4], "coda.0": [5]}
    # fewer unrolled positions than middle layers: each stands for its share of them
    assert blocks("1+1R2+1", 6) == {"prelude.0": [0], "cores.0.0": [1], "coda.0": [5]}
    assert blocks("1+1R2+1", 6, "average") == {"prelude.0": [0], "cores.0.0": [1, 2, 3, 4],
                                               "coda.0": [5]}
    # more unrolled positions than middle layers: each position stands for the layer at its depth
    assert blocks("1+2R3+1", 4) == {"prelude.0": [0], "cores.0.0": [1], "cores.0.1": [2], "coda.0": [3]}
    assert blocks("1+2R3+1", 4, "average") == {"prelude.0": [0], "cores.0.0": [1, 1, 2],
                                               "cores.0.1": [1, 2, 2], "coda.0": [3]}


def test_where_reads_an_iteration_of_vanilla_sources_only(tmp_path):
    """vanilla:OUT_DIR@ITER names OUT_DIR's checkpoint of ITER; any other @ is the path's own (hf: too)."""
    out = str(tmp_path / "out")
    assert pretrained.where("vanilla:runs/a@12", out) == ("vanilla:runs/a@12", "vanilla", "runs/a", 12)
    assert pretrained.where("vanilla:runs/a@b", out)[2:] == ("runs/a@b", None)
    assert pretrained.where("vanilla:runs@2/a@12", out)[2:] == ("runs@2/a", 12)
    assert pretrained.where("hf:models/pythia@1000", out)[1:] == ("hf", "models/pythia@1000", None)


def tiny_source(layers=6, seed=0):
    """A random vanilla model whose weights are far from their init, as a vanilla run's would be."""
    torch.manual_seed(seed)
    model = RecursiveGPT(Config(vocab_size=37, block_size=16, n_embd=32, n_head=2,
                                layout=str(layers))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def looped(source, *flags):
    given = parse_flags(train.TrainConfig, ["--init_from=vanilla:src", *flags], "train.py")
    torch.manual_seed(1)
    return pretrained.loop({"model": source}, train.TrainConfig(**given)).eval()


def test_loop_takes_the_source_weights_and_fresh_routers():
    source = tiny_source()
    theirs = source.state_dict()
    model = looped(source, "--layout=1+2R2+1", "--scheme=mesh", "--router_init=base")
    ours = model.state_dict()
    pairs = {"prelude.0": [0], "cores.0.0": [1], "cores.0.1": [3], "coda.0": [5]}
    for key, value in ours.items():
        block = next((b for b in pairs if key.startswith(b + ".")), None)
        if block:
            assert torch.equal(value, theirs[f"prelude.{pairs[block][0]}{key[len(block):]}"]), key
        elif not key.startswith("routers."):
            assert torch.equal(value, theirs[key]), key  # embeddings, final norm, head
    torch.manual_seed(1)  # the routers: as a model of this config starts them (router_init)
    fresh = RecursiveGPT(model.config).state_dict()
    assert all(torch.equal(v, fresh[k]) for k, v in ours.items() if k.startswith("routers."))
    assert ours["routers.0.write.bias"][1] == fresh["routers.0.write.bias"][1] > 3  # base's start
    cfg = model.config
    assert (cfg.layout, cfg.scheme, cfg.router_init, cfg.vocab_size, cfg.scale_embeddings) == (
        "1+2R2+1", "mesh", "base", 37, True)  # the rest is the source's, its init scale too
    average = looped(source, "--layout=1+2R2+1", "--core_init=average").state_dict()
    for k in ("attn.qkv.weight", "ln_2.bias"):
        assert torch.allclose(average[f"cores.0.1.{k}"],
                              (theirs[f"prelude.2.{k}"] + theirs[f"prelude.4.{k}"]) / 2)


@pytest.mark.parametrize("layout", ["1+4R1+1", "2+1+1+2", "6"])
def test_one_step_of_every_layer_is_the_source(layout):
    """K = 1 and P + C + Q = L: the looped model is the source, logits equal; for either init."""
    source = tiny_source()
    idx = torch.randint(0, 37, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = source(idx)[0]
        for init in ("stepwise", "average"):
            model = looped(source, f"--layout={layout}", "--scheme=base", f"--core_init={init}")
            got = model(idx)[0]
            assert want.abs().max() > 1 and (got - want).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def vanilla(data_root, tmp_path_factory):
    """A tiny vanilla run of 4 layers, trained a few steps on the tiny dataset."""
    out = tmp_path_factory.mktemp("vanilla") / "run"
    flags = ["--layout=4", "--scheme=base", "--max_iters=4", "--eval_interval=4", "--lr=3e-3"]
    assert run(flags, data_root, out) == 0
    return str(out)


def test_a_run_looped_at_k1_is_the_run(vanilla, data_root, tmp_path):
    """train.py --init_from=vanilla:OUT_DIR with K = 1 over its 4 layers: its checkpoint at iter 0
    is the run's model (logits to 1e-5) and records where it came from."""
    out = tmp_path / "k1"
    assert run([f"--init_from=vanilla:{vanilla}", "--layout=1+2R1+1", "--max_iters=0"],
               data_root, out) == 0
    source, ckpt = checkpoint.load(vanilla)
    model, mine = checkpoint.load(str(out))
    assert model.config.layout == "1+2R1+1" and mine["iter_num"] == 0
    assert mine["source"] == {"init_from": f"vanilla:{os.path.abspath(vanilla)}",
                              "model_config": ckpt["model_config"], "iter_num": 4}
    idx = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (model.eval()(idx)[0] - source.eval()(idx)[0]).abs().max().item() < 1e-5


@pytest.mark.slow
def test_uptraining_resumes_bit_for_bit_without_its_source(vanilla, data_root, tmp_path, capsys):
    """A resume continues the uptraining from its checkpoint, never converting again (its source
    may be gone): the same losses and weights as a run never stopped; sample.py reads it."""
    source = tmp_path / "source"
    shutil.copytree(vanilla, source)
    up = [f"--init_from=vanilla:{source}", "--layout=1+1R2+1", "--scheme=mesh", "--dropout=0.1",
          "--lr_decay_iters=6", "--eval_interval=3"]
    assert run([*up, "--max_iters=6"], data_root, tmp_path / "a") == 0
    assert run([*up, "--max_iters=3"], data_root, tmp_path / "b") == 0
    shutil.rmtree(source)
    assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'b'}", "--max_iters=6"]) == 0
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in "ab")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert b["source"] == a["source"] and b["source"]["init_from"] == f"vanilla:{source}"
    assert b["train_config"]["init_from"] == "resume"  # so only "source" says where it began
    capsys.readouterr()
    assert sample.main([f"--out_dir={tmp_path / 'b'}", "--start=Then", "--max_new_tokens=5"]) == 0
    assert capsys.readouterr().out.startswith("Then")


def test_a_loops_dropout_of_0_is_kept_over_its_sources():
    """--dropout=0 looping a source trained with dropout: the looped model has none."""
    old = Config(layout="4", n_embd=32, n_head=2, vocab_size=65, block_size=16, dropout=0.1)
    tc = train.TrainConfig(init_from="vanilla:x", dropout=0.0, layout="1+1R2+1")
    assert pretrained.looped(old, tc).dropout == 0.0


def test_bad_sources_are_one_line_and_touch_nothing(vanilla, data_root, tmp_path, capsys):
    looped_run = tmp_path / "looped"
    assert run([f"--init_from=vanilla:{vanilla}", "--max_iters=0"], data_root, looped_run) == 0
    coda_run = tmp_path / "coda"  # no loop, but blocks apart from its prelude: no vanilla source
    assert run([f"--init_from=vanilla:{vanilla}", "--layout=2+2", "--scheme=base", "--max_iters=0"], data_root,
               coda_run) == 0
    other = tmp_path / "other"
    os.makedirs(other / "tiny2")
    (tmp_path / "t.txt").write_text("zyx wvu\n" * 400)
    from data.prepare import prepare
    prepare("tiny2", input=str(tmp_path / "t.txt"), out_root=str(other), log=lambda *a: None)
    v = f"--init_from=vanilla:{vanilla}"
    cases = [
        ([f"--init_from=vanilla:{looped_run}"], f"--init_from=vanilla:{looped_run} is a 1+1R2+1 "
         f"base model, not a vanilla one (a plain layout such as 12, scheme base); loop a vanilla "
         f"run"),
        ([f"--init_from=vanilla:{coda_run}"], f"--init_from=vanilla:{coda_run} is a 2+2 base model, not a "
         f"vanilla one (a plain layout such as 12, scheme base); loop a vanilla run"),
        ([v, "--layout=2+2R2+1"], f"--layout=2+2R2+1 needs 5 unique blocks, but {v} has 4 "
         f"layers; loop fewer unique blocks"),
        ([v, "--n_embd=64"], f"{v} has n_embd=32, not --n_embd=64: the width and heads are the "
         f"source's; drop --n_embd"),
        ([v, "--n_head=4"], f"{v} has n_head=2, not --n_head=4: the width and heads are the "
         f"source's; drop --n_head"),
        ([v, "--n_slots=5"], "--n_slots is a MeSH setting, but scheme is 'base'; drop it or use "
         "--scheme=mesh"),  # the source's scheme, not the preset's (mesh)
        ([v, "--slot0=unscaled"], "slot0='unscaled' is a MeSH setting, but scheme is 'base'; drop it or use "
         "scheme 'mesh'"),  # checked against the source's scheme; the preset's (mesh) takes it
        ([v, "--core_init=lower"], "--core_init=lower is not stepwise or average"),
        ([v, "--data_root=" + str(other), "--dataset=tiny2"], f"dataset 'tiny2' is not tokenized "
         f"as the run in {vanilla} (chars differs); uptrain on data made with its tokenizer, as "
         f"its own dataset 'tiny' was"),
        ([f"--init_from=vanila:{vanilla}"], f"--init_from=vanila:{vanilla} is not one of scratch, "
         f"resume, vanilla:OUT_DIR, hf:PATH"),
        ([f"--init_from=vanilla:{tmp_path / 'none'}"], f"no checkpoint at "
         f"{tmp_path / 'none' / 'ckpt.pt'}; train one with: python train.py "
         f"--out_dir={tmp_path / 'none'}"),
    ]
    before = snapshot(vanilla, looped_run)
    for flags, words in cases:
        capsys.readouterr()
        assert run(flags, data_root, tmp_path / "o") == 2, flags
        assert capsys.readouterr().err == f"train.py: error: {words}\n"
        assert not (tmp_path / "o").exists()
    # a --model (as config/pythia-*.json give) of another width or heads: its preset's, not given
    flags = [f for f in TINY if not f.startswith(("--n_embd", "--n_head"))]
    for shape, words in [([], "n_embd=32, not --model=pythia-14m's 128"),
                         (["--n_embd=32"], "n_head=2, not --model=pythia-14m's 4")]:
        assert train.main([*flags, v, "--model=pythia-14m", *shape, f"--data_root={data_root}",
                           f"--out_dir={tmp_path / 'o'}"]) == 2
        assert capsys.readouterr().err == (f"train.py: error: {v} has {words}: the width and heads "
                                           f"are the source's; drop --model\n")
        assert not (tmp_path / "o").exists()
    assert snapshot(vanilla, looped_run) == before


def test_a_source_is_never_the_output_and_an_unfinished_one_is_named(vanilla, data_root, tmp_path, capsys):
    """--out_dir the source itself is refused, --overwrite or not, the source as it was; a source stopped before
    its --max_iters is refused, naming how to loop it as is (@ITER), which the looped run then records; one
    still training is waited for, a line saying so."""
    v = f"--init_from=vanilla:{vanilla}"
    before = snapshot(vanilla)
    for extra in ([], ["--overwrite=true"]):
        assert run([v, *extra], data_root, vanilla) == 2
        assert capsys.readouterr().err == (f"train.py: error: --out_dir={vanilla} is the source {v}, which a run "
                                           f"never writes over; choose another --out_dir\n")
    assert snapshot(vanilla) == before
    early = shutil.copytree(vanilla, tmp_path / "early")
    ckpt = torch.load(early / "ckpt.pt", weights_only=True)
    ckpt["train_config"]["max_iters"] = 8  # stopped at iter 4 of 8
    checkpoint.save(ckpt, str(early / "ckpt.pt"))
    assert run([f"--init_from=vanilla:{early}", "--max_iters=0"], data_root, tmp_path / "o") == 2
    assert capsys.readouterr().err == (
        f"train.py: error: {early} is unfinished (iter 4 of its --max_iters=8) and nothing trains it now; continue "
        f"it with python train.py --init_from=resume --out_dir={early} (or the table1.py command that trained it), "
        f"or loop it as is: --init_from=vanilla:{early}@4\n")
    assert run([f"--init_from=vanilla:{early}@4", "--max_iters=0"], data_root, tmp_path / "o") == 0
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["source"]["iter_num"] == 4
    # an @ not followed by an iteration is the path's own: one line, not int()'s traceback
    assert run([f"--init_from=vanilla:{early}@four", "--max_iters=0"], data_root, tmp_path / "o2") == 2
    assert capsys.readouterr().err == (f"train.py: error: no checkpoint at {early}@four/ckpt.pt; train one with: "
                                       f"python train.py --out_dir={early}@four\n")
    assert run(["--init_from=vanilla:@4", "--max_iters=0"], data_root, tmp_path / "o2") == 2  # no OUT_DIR before @
    assert capsys.readouterr().err == ("train.py: error: no checkpoint at @4/ckpt.pt; train one with: "
                                       "python train.py --out_dir=@4\n")
    code = ("import sys, time\nfrom support import files\nfiles.own(sys.argv[1])\nprint('held', flush=True)\n"
            "time.sleep(3)\n")
    live = subprocess.Popen([sys.executable, "-c", code, vanilla], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert live.stdout.readline() == "held\n"
    capsys.readouterr()
    try:  # the command again into its own run's folder: refused at once, the source not waited for
        assert run([v, "--max_iters=0"], data_root, tmp_path / "o") == 2 and live.poll() is None
        said = capsys.readouterr().err
        assert said.startswith(f"train.py: error: {tmp_path / 'o'} holds a run's checkpoints")
        assert run([v, "--max_iters=0"], data_root, tmp_path / "after") == 0
        assert live.poll() is not None  # it waited for the run to end
    finally:
        live.wait()
    assert capsys.readouterr().err == (f"train.py: {vanilla} is still training; waiting for it (or loop it as "
                                       f"is: {v}@ITER now)\n")


def test_the_source_model_is_not_held_while_uptraining(vanilla, data_root, tmp_path, monkeypatch):
    """The vanilla model a run loops is freed once looped, not held while it trains (at Pythia's
    sizes, gigabytes a process)."""
    import gc
    import weakref
    sources, alive, loop, evaluate = [], [], pretrained.loop, train.evaluate

    def looping(start, *args):
        sources.append(weakref.ref(start["model"]))
        return loop(start, *args)

    def evaluating(*args):
        gc.collect()
        alive.append(sources[0]() is not None)
        return evaluate(*args)
    monkeypatch.setattr(pretrained, "loop", looping)
    monkeypatch.setattr(train, "evaluate", evaluating)
    assert run([f"--init_from=vanilla:{vanilla}", "--max_iters=0"], data_root, tmp_path / "o") == 0
    assert alive == [False]


def test_a_plan_of_a_looped_run_plans_the_model_the_loop_makes(vanilla, data_root, tmp_path, capsys):
    """--plan=true with --init_from=vanilla:OUT_DIR: the source's width, heads and vocabulary,
    looped to --layout and --scheme, as the run would build it; its bad flags refused alike."""
    from support import memory
    source, _ = checkpoint.load(vanilla)
    v, out = f"--init_from=vanilla:{vanilla}", f"--out_dir={tmp_path / 'o'}"
    plan = [v, "--layout=1+2R2+1", "--scheme=mesh", "--plan=true", "--plan_gpus=1", out]
    assert train.main(plan) == 0  # no model flags: the classroom preset's would be 128 wide
    want = source.config.to_dict() | dict(layout="1+2R2+1", scheme="mesh")
    P = memory.param_counts(Config(**want))[0]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"plan: {v[12:]} layout 1+2R2+1 scheme mesh, {P:,} params, "
                            f"micro-batch 16 x 16 = 256 tokens")
    assert train.main([*plan, "--layout=2+2R2+1"]) == 2
    assert capsys.readouterr().err == (f"train.py: error: --layout=2+2R2+1 needs 5 unique blocks, "
                                       f"but {v} has 4 layers; loop fewer unique blocks\n")
    assert train.main([v, "--n_slots=5", "--plan=true", out]) == 2  # the source's scheme: base
    assert capsys.readouterr().err == ("train.py: error: --n_slots is a MeSH setting, but scheme "
                                       "is 'base'; drop it or use --scheme=mesh\n")
    assert not (tmp_path / "o").exists()


def test_a_plan_of_a_resume_plans_its_checkpoints_model(vanilla, capsys):
    """--plan=true --init_from=resume: the model the run's checkpoint holds, under its preset."""
    from support import memory
    P = memory.param_counts(checkpoint.load(vanilla)[0].config)[0]
    assert train.main(["--init_from=resume", f"--out_dir={vanilla}", "--plan=true",
                       "--plan_gpus=1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"plan: classroom layout 4 scheme base, {P:,} params, "
                            "micro-batch 4 x 16 = 64 tokens, bf16 autocast, 1 GPU(s) ")
    # its time: the steps the checkpoint (iter 4) has left, not all of --max_iters
    assert train.main(["--init_from=resume", f"--out_dir={vanilla}", "--plan=true",
                       "--plan_gpus=1", "--max_iters=10"]) == 0
    assert ", 6 steps (of 10, from iter 4): " in capsys.readouterr().out
    assert train.main(["--init_from=resume", f"--out_dir={vanilla}", "--plan=true",
                       "--plan_gpus=1", "--max_iters=2"]) == 0  # past it: none left, no time
    assert ", 0 steps (of 2, from iter 4): 0.0 days on 1 GPU(s) at " in capsys.readouterr().out
    days = []  # the time of the steps left: 6 take twice 3's (a slow GPU: many days to compare)
    for max_iters in (10, 7):
        assert train.main(["--init_from=resume", f"--out_dir={vanilla}", "--plan=true", "--plan_gpus=1",
                           f"--max_iters={max_iters}", "--gpu_tflops=1e-12"]) == 0
        days.append(float(re.search(r"\): ([\d,.]+) days", capsys.readouterr().out)[1].replace(",", "")))
    assert days[0] == pytest.approx(2 * days[1], rel=1e-3) and days[1] > 100
    for flag, words in [("--n_embd=64", "n_embd: checkpoint 32 vs given 64"),
                        ("--scheme=mesh", "scheme: checkpoint 'base' vs given 'mesh'"),
                        ("--model=pythia-14m", "model: checkpoint 'classroom' vs given 'pythia-14m'")]:
        assert train.main(["--init_from=resume", f"--out_dir={vanilla}", "--plan=true", flag]) == 2
        assert capsys.readouterr().err == (f"train.py: error: the checkpoint's model differs "
                                           f"from the flags given: {words}; resume without them\n")
