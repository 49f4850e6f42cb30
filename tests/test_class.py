"""
Tests for what a class is shown: tools/draw.py (the model drawn from its Layout), tools/routing.py
(each token's effort and MeSH routing on one sentence), tools/curves.py (any runs' curves), and the
tools pointed at a run still training or stopped early (exercises in any order).

    python -m pytest -q tests/test_class.py
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

import sample
from conftest import ROOT, run
from mesh import Config
from support import checkpoint, command
from support.capture import capture
from tools import curves, draw, probe, routing, table1


# -----------------------------------------------------------------------------
# draw.py: the picture follows mesh.Layout

def test_parts_follow_the_layout_and_mark_the_shared_cores():
    cfg = Config(layout="2+3+2R2+1", scheme="mesh")  # a core of its own, then one core run twice
    assert draw.parts(cfg) == [("prelude", [0, 1], False), ("step 0", [2, 3, 4], False),
                               ("step 1", [5, 6], False), ("step 2", [5, 6], True), ("coda", [7], False)]
    assert draw.routers(cfg) == ["cycle", "step 0", "step 1", "step 2"]
    assert draw.routers(Config(layout="2+3+2R2+1", scheme="mesh", cycle="direct")) == ["step 0", "step 1",
                                                                                       "step 2"]
    assert draw.routers(Config(layout="2+3+2R2+1", scheme="anchor")) == []
    applied = sum(len(blocks) for _, blocks, _ in draw.parts(cfg))
    unique = len({b for _, blocks, _ in draw.parts(cfg) for b in blocks})
    assert (applied, unique) == (cfg.shape.depth, cfg.shape.unique) == (10, 8)


def test_draw_prints_the_text_form_and_the_counts(capsys):
    draw.main(["--layout=3+2R3+3", "--scheme=mesh"])
    out = capsys.readouterr().out
    assert out.startswith("token ids -> embedding h_emb (B, T, 128)\nprelude  [b0][b1][b2]\nstep 0   [b3][b4]\n"
                          "step 1   [b3][b4]  shared: the weights of an earlier step\n")
    assert "buffer: 6 slots m0..m5 (B, T, 6, 128), m0 = h_emb" in out and "cycle, step 0, step 1, step 2" in out
    assert "non-embedding params        1,592,624  (66.93% of vanilla 12-layer: 2,379,520)" in out
    draw.main(["--layout=2+4R2+2", "--scheme=residual"])
    out = capsys.readouterr().out
    assert out.count("h(t+1) = f_t(h(t)) + h(t)") == 2 and "buffer" not in out


def drawn(cfg, monkeypatch, tmp_path):
    """The matplotlib figure draw.draw makes of cfg (kept as it is saved)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.figure
    kept, save = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: kept.append(fig) or save(fig, *a, **k))
    draw.draw(cfg, str(tmp_path / "model.png"))
    return kept[0].axes[0]


@pytest.mark.parametrize("layout, slots, routers", [("2+2R4+2", 7, 5), ("0+2R2+0", 5, 3)])
def test_each_router_is_drawn_against_every_slot(layout, slots, routers, monkeypatch, tmp_path):
    """Every router touches every slot (Eq. 3, 5: a softmax weight for each): the picture draws each write and
    read arrow across all the buffer's lanes, a dot on each, at the step the router belongs to."""
    cfg = Config(layout=layout, scheme="mesh", n_embd=64, n_head=4)
    ax = drawn(cfg, monkeypatch, tmp_path)
    lanes = sorted(p.get_y() + 0.42 * p.get_height() / 0.85 for p in ax.patches
                   if type(p).__name__ == "Rectangle" and p.get_facecolor()[:3] == (0xdd / 255,) * 3)
    assert len(lanes) == cfg.slots == slots
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(dots) == 2 * len(draw.routers(cfg)) == 2 * routers  # a write and a read per router
    assert len({line.get_xdata()[0] for line in dots}) == len(dots)  # each its own place
    for line in dots:  # each crosses every lane, at one x
        assert len(set(line.get_xdata())) == 1
        assert sorted(line.get_ydata()) == pytest.approx(lanes)


def test_vanilla_is_drawn_as_blocks_without_a_prelude_or_steps(monkeypatch, tmp_path, capsys):
    cfg = Config(layout="12", n_embd=64, n_head=4)
    assert [name for name, *_ in draw.parts(cfg)] == ["blocks", "coda"]
    draw.main(["--layout=12", "--n_embd=64"])
    out = capsys.readouterr().out
    drawing = out.split("\n\n")[0]  # (mesh.summary's counts follow it)
    assert drawing.startswith("token ids -> embedding h_emb (B, T, 64)\nblocks   [b0][b1]") and "prelude" not in drawing
    texts = [t.get_text() for t in drawn(cfg, monkeypatch, tmp_path).texts]
    assert "blocks" in texts and not any("prelude" in t or "between steps" in t for t in texts)
    assert drawn(cfg, monkeypatch, tmp_path).get_title().startswith("layout 12, vanilla: compute depth 12")


def test_draw_leaves_out_an_empty_part_and_shows_up_to_its_limits(capsys):
    assert draw.text(Config(layout="0+2R2+0", scheme="mesh", n_embd=64, n_head=4)).splitlines() == [
        "token ids -> embedding h_emb (B, T, 64)", "step 0   [b0][b1]",
        "step 1   [b0][b1]  shared: the weights of an earlier step", "-> ln_f -> lm_head -> logits (B, T, vocab)",
        "buffer: 5 slots m0..m4 (B, T, 5, 64), m0 = h_emb, the others 0 at the start; routers (write + read, each "
        "a softmax over the slots): cycle, step 0, step 1"]
    assert draw.main([f"--layout={draw.MAX_DRAWN}"]) == draw.main(["--scheme=mesh", "--n_slots=256"]) == 0
    assert "compute depth 256" in capsys.readouterr().out


def test_draw_writes_a_png_or_says_why_not(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    draw.main(["--layout=3+2R3+3", "--scheme=mesh", f"--png={tmp_path / 'a' / 'model.png'}"])
    assert (tmp_path / "a" / "model.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    draw.main(["--layout=12", f"--png={tmp_path / 'b.png'}"])
    assert not (tmp_path / "b.png").exists()
    assert capsys.readouterr().out.endswith("draw.py: matplotlib is not installed, so no picture, only the text "
                                            "above (pip install matplotlib)\n")


@pytest.mark.parametrize("args, message", [
    (["--layout=3+2R"], "draw.py: error: bad layout '3+2R'"),
    (["--layout=12", "--scheme=mesh"], "draw.py: error: scheme 'mesh' needs loop steps"),
    (["--schem=mesh"], "draw.py: error: unknown setting 'schem' in the command line (did you mean --scheme?)"),
    (["--scheme=anchor", "--n_slots=5"], "draw.py: error: --n_slots is a MeSH setting, but scheme is 'anchor'; "
                                         "drop it or use --scheme=mesh"),
    (["--layout=12", "--n_slots=5"], "draw.py: error: --n_slots is a MeSH setting, but scheme is 'base'"),
])
def test_draw_bad_input_is_one_line(args, message, capsys):
    assert draw.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


# -----------------------------------------------------------------------------
# routing.py: per token, on real checkpoints

@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """Tiny trained base and mesh checkpoints of the same layout."""
    root = tmp_path_factory.mktemp("runs")
    for scheme in ("base", "mesh"):
        assert run([f"--scheme={scheme}", "--max_iters=2", "--eval_interval=2"], data_root,
                   str(root / scheme)) == 0
    return str(root / "base"), str(root / "mesh")


def test_routing_numbers_are_the_captured_states_token_by_token(runs):
    """Each token's effort is the relative update of its own state (recomputed here from the capture by
    the formula), and each router's weights are its softmaxes, every token's summing to 1."""
    model, ckpt = checkpoint.load(runs[1], "cpu")
    idx = torch.tensor([[1, 5, 9, 2, 7, 3]])
    r = routing.routing(model, idx)
    with capture(model) as cap, torch.no_grad():
        model(idx)
    for name, h, fh in cap["blocks"]:
        h, fh = h[0].double(), fh[0].double()  # (T, D)
        expected = 2 * (fh - h).norm(dim=-1) / (fh.norm(dim=-1) + h.norm(dim=-1))
        assert r["effort"][name] == pytest.approx(expected.tolist(), rel=1e-12)
    assert list(r["routers"]) == ["cycle", "step0", "step1"]
    for name, w_write, w_read in cap["routers"]:  # each kind its own router's softmax
        assert r["routers"][name] == {"write": w_write[0].double().tolist(), "read": w_read[0].double().tolist()}
    for weights in r["routers"].values():
        for kind in ("write", "read"):
            assert len(weights[kind]) == 6 and all(sum(w) == pytest.approx(1, abs=1e-6) for w in weights[kind])
            assert all(len(w) == model.config.slots for w in weights[kind])
    assert routing.routing(checkpoint.load(runs[0], "cpu")[0], idx)["routers"] is None


def test_routing_end_to_end_writes_the_json_and_the_figure(runs, tmp_path, capsys):
    out = tmp_path / "view"
    assert routing.main([f"--out_dir={runs[0]}", f"--out_dir={runs[1]}", "--text=the king",
                         f"--json={out / 'routing.json'}", f"--png={out / 'routing.png'}"]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "routing.json").read_text(encoding="utf-8"))
    assert [r["scheme"] for r in saved] == ["base", "mesh"]
    assert saved[1]["tokens"] == ["t", "h", "e", "␣", "k", "i", "n", "g"]
    assert list(saved[0]["effort"]) == ["prelude", "step0", "step1", "coda"] and saved[0]["n_slots"] is None
    assert printed.count("token             t    h    e    ␣    k    i    n    g") == 2
    mesh_write = ["m" + str(max(range(5), key=w.__getitem__)) for w in saved[1]["routers"]["step1"]["write"]]
    assert "  step1 write " + "".join(f"{m:>5}" for m in mesh_write) in printed
    try:
        import matplotlib  # noqa: F401
        assert (out / "routing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    except ImportError:
        assert "routing.py: matplotlib is not installed, so no figure" in printed
    a = routing.RoutingConfig(tokens=5)  # no --text: a validation window
    window = lambda: routing.routing_checkpoint(probe.opened(runs[1], a, "routing.py"), a)
    assert len(window()["tokens"]) == 5 and window() == window()
    assert window()["tokens"][0].isalpha()  # a line's first letter, not the newline before it
    assert routing.main([f"--out_dir={runs[1]}", "--text=" + ("the king " * 2)[:16]]) == 0  # block_size: 16


def test_routing_without_matplotlib_writes_the_numbers_and_says_so(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    routing.main([f"--out_dir={runs[1]}", f"--json={tmp_path / 'r.json'}", f"--png={tmp_path / 'r.png'}"])
    assert (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()
    assert ("routing.py: matplotlib is not installed, so no figure, only the numbers (pip install matplotlib)\n"
            in capsys.readouterr().out)


@pytest.mark.parametrize("args, message", [
    ([], "routing.py: error: give a run's folder: --out_dir=OUT_DIR (again to compare several)"),
    (["--text=" + "the king " * 3], "routing.py: error: --text is 27 tokens; give 1 to 16 (the model's block_size)"),
    (["--text=the QUEEN"], "routing.py: error: characters not in the vocabulary: 'E', 'N', 'Q', 'U'"),
    (["--tokens=0"], "routing.py: error: --tokens=0 must be at least 1"),
])
def test_routing_bad_input_is_one_line(runs, args, message, capsys):
    assert routing.main([f"--out_dir={runs[1]}"] * bool(args) + args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


# -----------------------------------------------------------------------------
# table1.py --lesson: one class period's settings, which flags after it override

def test_table1_lesson_is_six_runs_at_width_64_and_flags_override_it(capsys):
    from tools import table1
    table1.main(["--lesson", "--dry_run"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("--out_dir=")[1].split()[0] for line in lines] == [
        "runs/lesson/vanilla_s0", "runs/lesson/vanilla_s1", "runs/lesson/base_3+2R3+3_s0",
        "runs/lesson/base_3+2R3+3_s1", "runs/lesson/mesh_3+2R3+3_s0", "runs/lesson/mesh_3+2R3+3_s1"]
    assert all("--lr=0.002 " in line and "--n_embd=64 " in line and "--max_iters=700 " in line for line in lines)
    table1.main(["--lesson", "--dry_run", "--max_iters=8", "--layouts=2+2R4+2", "--only=mesh", "--seeds=3"])
    share = max(1, (os.cpu_count() or 1) // 2)  # two runs at once: each its half of the cores
    assert capsys.readouterr().out.split()[1:] == [
        "--out_dir=runs/lesson/mesh_2+2R4+2_s3", "--dataset=shakespeare_char", "--batch_size=16", "--lr=0.002",
        "--eval_iters=20", "--sample_tokens=0", "--n_embd=64", "--n_head=4", "--block_size=64", "--max_iters=8",
        "--eval_interval=2", "--layout=2+2R4+2", "--scheme=mesh", "--seed=3", "--device=cpu", "--data_root=data",
        f"--threads={share}", "--overwrite=true"]


def test_table1_dry_run_prints_what_each_run_would_do(tmp_path, capsys):
    """A finished run is reused and a stopped one continued: never a command that would overwrite either."""
    from tools import table1
    fresh, done, stopped = table1.plan(["vanilla", "base", "mesh"], [0], ())
    for run in (done, stopped):
        (tmp_path / run["name"]).mkdir()
    (tmp_path / done["name"] / "result.json").write_text(json.dumps(dict(
        name=done["name"], seed=0, max_iters=5, params=1, val_loss=1.5, ms_per_iter=None, dataset="pydoc",
        data_sha256=None, val_curve=[])))
    torch.save(dict(iter_num=2, train_config=dict(max_iters=5)), tmp_path / stopped["name"] / "ckpt.pt")
    table1.main([f"--root={tmp_path}", "--max_iters=5", "--seeds=0", "--only=vanilla,base,mesh", "--dry_run"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1] == f"# {done['name']}: done, reused"
    assert lines[0].endswith("--overwrite=true") and lines[2].endswith("--init_from=resume")
    assert [line.split("--out_dir=")[1].split()[0] for line in (lines[0], lines[2])] == [
        str(tmp_path / fresh["name"]), str(tmp_path / stopped["name"])]


def test_table1_reuses_a_finished_run_only_at_the_same_width_and_lr(tmp_path, monkeypatch):
    from configurator import UsageError
    from tools import table1
    run = table1.plan(["mesh"], [0], ())[0]
    (tmp_path / run["name"]).mkdir()
    done = dict(name=run["name"], seed=0, max_iters=5, params=1, val_loss=1.5, ms_per_iter=None, dataset="pydoc",
                data_sha256=None, val_curve=[])  # written at width 128, lr 1e-3 (the defaults)
    (tmp_path / run["name"] / "result.json").write_text(json.dumps(done))
    assert table1.run_one(run, str(tmp_path), 5)["val_loss"] == 1.5  # the defaults: reused
    started = []
    monkeypatch.setattr(table1, "run_child", lambda cmd, *a, **kw: started.append(cmd) or 1)
    for flag, train in (("--n_embd=128, not --n_embd=64", dict(table1.TRAIN, n_embd=64)),
                        ("--lr=0.001, not --lr=0.002", dict(table1.TRAIN, lr=2e-3))):
        with pytest.raises(UsageError, match=f"holds a finished run of {flag}, which table1.py never replaces"):
            table1.run_one(run, str(tmp_path), 5, train=train)
    assert started == []  # refused before anything trains


def test_table1_trains_again_a_run_of_another_rule_and_resumes_only_its_own_settings(tmp_path):
    """A result trained with an update rule other than mesh.py's now is trained again; a checkpoint is continued
    only where its settings are the table's, else (unfinished) the run starts afresh."""
    from tools import table1
    run = table1.plan(["base"], [0], ())[0]
    folder = tmp_path / run["name"]
    folder.mkdir()
    done = dict(name=run["name"], seed=0, max_iters=5, params=1, val_loss=1.5, ms_per_iter=None, dataset="pydoc",
                data_sha256=None, val_curve=[], rule="lambda h_m, h, h0, h_emb: h_m + h")
    (folder / "result.json").write_text(json.dumps(done))
    assert table1.stage(run, str(folder), 5) == ("again", "lambda h_m, h, h0, h_emb: h_m + h")
    (folder / "result.json").unlink()
    for max_iters, at, stage in ((5, 5, ("resume", 5)), (10, 3, ("fresh", None))):
        torch.save({"train_config": dict(max_iters=max_iters, n_embd=128, lr=1e-3), "iter_num": at},
                   folder / "ckpt.pt")
        assert table1.stage(run, str(folder), 5) == stage


def test_table1_names_a_failed_runs_last_words(tmp_path, monkeypatch):
    from configurator import UsageError
    from tools import table1

    def fails(cmd, watch, env, stdout, stderr):
        stdout.write("iter 0: loss 4.2\nTraceback (most recent call last):\nValueError: boom\n")
        return 1

    run = table1.plan(["base"], [0], ())[0]
    monkeypatch.setattr(table1, "run_child", fails)
    with pytest.raises(UsageError) as e:
        table1.run_one(run, str(tmp_path), 5)
    assert str(e.value) == (f"{run['name']} failed (exit 1); its last words: ValueError: boom (full output in "
                            f"{tmp_path / run['name']}/train.out)")


def test_table1_starts_no_run_once_stopped(tmp_path, monkeypatch, capsys):
    """Ctrl-C while two runs train: the third, which the pool takes up as they stop, never starts: no
    line saying it trains, no folder."""
    run = table1.plan(["mesh"], [0], ())[0]
    monkeypatch.setattr(command.Stop, "signals", 1)
    monkeypatch.setattr(command.Stop, "name", "SIGINT", raising=False)
    with pytest.raises(command.Stopped):
        table1.run_one(run, str(tmp_path), 5)
    assert capsys.readouterr().out == "" and os.listdir(tmp_path) == []


# -----------------------------------------------------------------------------
# curves.py: any runs' curves, a colour per variant in every figure

def plotted(monkeypatch):
    """The panels curves.plot draws, kept (and drawn on)."""
    kept, plot = [], curves.plot
    monkeypatch.setattr(curves, "plot", lambda panels, *a: kept.append(panels) or plot(panels, *a))
    return kept


def test_curves_draws_train_and_val_loss_of_any_runs_a_colour_per_variant(runs, tmp_path, capsys, monkeypatch):
    kept = plotted(monkeypatch)
    png = tmp_path / "figs" / "curves.png"
    assert command.main("curves.py", curves.run, [f"--out_dir={runs[0]}", f"--out_dir={runs[1]}", f"--png={png}"],
                        curves.CurvesConfig) == 0
    (_, lines), = kept[0]
    logged = [[r for r in map(json.loads, open(os.path.join(d, "log.jsonl"))) if "val_loss" in r] for d in runs]
    assert [(ln["label"], ln["colour"], ln["style"][1:]) for ln in lines] == [
        ("base (base) val", "tab:blue", "-"), ("train", "tab:blue", "--"),
        ("mesh (mesh) val", "tab:red", "-"), ("train", "tab:red", "--")]
    for (val, train), records in zip((lines[:2], lines[2:]), logged):  # the log's own evaluations
        assert val["x"] == train["x"] == [r["iter"] for r in records]
        assert val["y"] == [r["val_loss"] for r in records] and train["y"] == [r["train_loss"] for r in records]
    try:
        import matplotlib  # noqa: F401
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and capsys.readouterr().out == f"wrote {png}\n"
    except ImportError:
        assert "curves.py: matplotlib is not installed, so no figures" in capsys.readouterr().out


def test_curves_of_two_runs_of_one_variant_share_its_colour_a_marker_each(runs, tmp_path, monkeypatch):
    kept = plotted(monkeypatch)
    twin = shutil.copytree(runs[1], tmp_path / "twin")
    command.main("curves.py", curves.run, [f"--out_dir={runs[1]}", f"--out_dir={twin}",
                                           f"--png={tmp_path / 'c.png'}"], curves.CurvesConfig)
    (_, lines), = kept[0]
    assert lines[0]["colour"] == lines[2]["colour"] == "tab:red" and lines[0]["style"] != lines[2]["style"]


def test_curves_of_a_sharded_run_name_its_scheme(runs, tmp_path, monkeypatch):
    """A run trained with FSDP keeps shards-ITER/ (support/sharded.py), no ckpt.pt: its scheme is read there."""
    kept = plotted(monkeypatch)
    sharded = shutil.copytree(runs[1], tmp_path / "sharded", ignore=shutil.ignore_patterns("ckpt.pt"))
    saved = torch.load(os.path.join(runs[1], "ckpt.pt"), weights_only=True)
    (sharded / "shards-00000002").mkdir()
    (sharded / "shards-00000002" / ".metadata").write_bytes(b"")
    (sharded / "shards-00000002" / "state.json").write_text(json.dumps(
        {**{k: v for k, v in saved.items() if k not in ("model", "optimizer", "rng")}, "rng": {"torch": [0]}}))
    command.main("curves.py", curves.run, [f"--out_dir={sharded}", f"--png={tmp_path / 'c.png'}"], curves.CurvesConfig)
    (_, lines), = kept[0]
    assert (lines[0]["label"], lines[0]["colour"]) == ("sharded (mesh) val", "tab:red")
    state = json.loads((sharded / "shards-00000002" / "state.json").read_text())
    state["model_config"].update(layout="3", scheme="base")  # no loop steps: vanilla, in its own colour
    (sharded / "shards-00000002" / "state.json").write_text(json.dumps(state))
    command.main("curves.py", curves.run, [f"--out_dir={sharded}", f"--png={tmp_path / 'c.png'}"], curves.CurvesConfig)
    (_, lines), = kept[1]
    assert (lines[0]["label"], lines[0]["colour"]) == ("sharded (vanilla) val", "black")


def test_curves_without_matplotlib_says_so_in_one_line(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    command.main("curves.py", curves.run, [f"--out_dir={runs[0]}", f"--png={tmp_path / 'c.png'}"], curves.CurvesConfig)
    assert capsys.readouterr().out == "curves.py: matplotlib is not installed, so no figures (pip install matplotlib)\n"
    assert not (tmp_path / "c.png").exists()


def test_curves_draws_what_it_can_and_names_what_it_skipped(tmp_path, capsys, monkeypatch):
    """Evaluations with an infinite or NaN loss, or without train_loss or val_loss, are left out in
    one line; the rest is drawn. A run folder without log.jsonl is one line, exit 2, nothing written."""
    kept = plotted(monkeypatch)
    (tmp_path / "run").mkdir()
    log, png = tmp_path / "run" / "log.jsonl", tmp_path / "c.png"
    good = [dict(iter=0, train_loss=4.5, val_loss=4.6), dict(iter=20, train_loss=3, val_loss=3.25)]
    bad = ['{"iter": 10, "train_loss": 3.5, "val_loss": Infinity}',
           '{"iter": 30, "train_loss": NaN, "val_loss": 3}', '{"iter": 40, "val_loss": 2.9}',
           '{"iter": 50, "train_loss": 2.8}', '{"train_loss": 2, "val_loss": 2}',
           '{"iter": 60, "train_loss": "2.5", "val_loss": 2.5}',
           '{"iter": 70, "train_loss": 1' + "0" * 400 + ', "val_loss": 2}']  # a damaged line: left out
    log.write_text("\n".join([json.dumps(good[0]), *bad[:3], json.dumps(good[1]), *bad[3:],
                              '{"iter": 70, "loss": 2.0}']) + "\n")
    assert command.main("curves.py", curves.run, [f"--out_dir={log.parent}", f"--png={png}"],
                        curves.CurvesConfig) == 0
    (_, lines), = kept[0]
    assert [(ln["x"], ln["y"]) for ln in lines] == [([0, 20], [4.6, 3.25]), ([0, 20], [4.5, 3])]
    assert (lines[0]["label"], lines[0]["colour"]) == ("run (no checkpoint) val", "tab:gray")  # its scheme unknown
    out = capsys.readouterr().out
    assert out.startswith(f"curves.py: skipped 6 records of {log}: a train_loss or val_loss missing or not a "
                          f"finite number\n")
    try:
        import matplotlib  # noqa: F401
        assert out.endswith(f"wrote {png}\n") and png.read_bytes()[:4] == b"\x89PNG"
        png.unlink()
    except ImportError:
        assert out.endswith("so no figures (pip install matplotlib)\n")
    (tmp_path / "empty").mkdir()
    assert command.main("curves.py", curves.run, [f"--out_dir={tmp_path / 'empty'}", f"--png={png}"],
                        curves.CurvesConfig) == 2
    assert capsys.readouterr() == ("", f"curves.py: error: cannot use {tmp_path / 'empty' / 'log.jsonl'}: No such "
                                       f"file or directory; check the path\n")
    assert sorted(os.listdir(tmp_path)) == ["empty", "run"] and os.listdir(tmp_path / "empty") == []


def test_table1_curves_name_vanilla_only_when_drawn_and_end_on_the_tables_loss(monkeypatch):
    """Exercise 5 (base, half, mesh): no vanilla line, so its title names none; each variant in its
    colour (curves.COLOURS), a star at the end: the table's val loss, not train.py's last one."""
    kept = []
    monkeypatch.setattr(table1, "plot", lambda panels, *a: kept.append(panels))
    curve = {"base": [[0, 4.2], [4, 2.0]], "mesh": [[0, 4.2], [4, 1.9]], "vanilla": [[0, 4.2], [4, 1.8]]}
    results = [dict(name=table1.run_name(v, "3+2R3+3", 0), variant=v, seed=0, params=1, val_loss=1.5,
                    ms_per_iter=None, scheme=table1.SCHEME[v], val_curve=curve[v]) for v in curve]
    for drawn_, title in ((results[:2], "3+2R3+3 on pydoc\n"), (results, "3+2R3+3 against vanilla 12 on pydoc\n")):
        rows = table1.aggregate(drawn_, 10, [0], ["3+2R3+3"])
        table1.write_curves(drawn_, rows, ["3+2R3+3"], "c.png", "pydoc")
        (name, lines), = kept.pop()
        assert name.startswith(title)
    assert [(ln["colour"], ln["y"][-1]) for ln in lines] == [
        ("black", 1.8), ("black", 1.5), ("tab:blue", 2.0), ("tab:blue", 1.5), ("tab:red", 1.9), ("tab:red", 1.5)]
    assert [ln.get("style") for ln in lines[:2]] == [None, "*"]


def test_every_table1_variant_has_a_colour_of_its_own():
    """table1.py's variants (every scheme, vanilla, the four [choice]s of mesh) drawn in one
    figure: no two share a colour, and none is the gray of a run whose scheme is unknown."""
    colours = [curves.colour(v) for v in table1.SCHEME]
    assert len(set(colours)) == len(colours) == len(table1.SCHEME) and "tab:gray" not in colours


def test_a_scheme_of_ones_own_is_never_drawn_in_a_named_schemes_colour():
    """OTHERS (the colours of schemes of one's own, by name) are none of COLOURS' nor the gray
    of a run whose scheme is unknown, and no two alike."""
    named = {*curves.COLOURS.values(), "tab:gray"}
    assert len(set(curves.OTHERS) - named) == len(curves.OTHERS)


@pytest.mark.parametrize("args, message", [
    ([], "curves.py: error: give a run's folder: --out_dir=OUT_DIR (again for more runs)"),
    (["--out_dir=nowhere"], "curves.py: error: cannot use nowhere/log.jsonl: No such file or directory; check the path"),
])
def test_curves_bad_input_is_one_line(args, message, tmp_path, capsys):
    assert command.main("curves.py", curves.run, args + [f"--png={tmp_path / 'c.png'}"], curves.CurvesConfig) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


# -----------------------------------------------------------------------------
# Exercises in any order: a run still training is waited for, one stopped early is said so

@pytest.fixture
def stopped_early(runs, tmp_path):
    """A copy of the mesh run whose checkpoint says it stopped at iter 2 of --max_iters=6."""
    out = shutil.copytree(runs[1], tmp_path / "stopped")
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["train_config"]["max_iters"] = 6
    checkpoint.save(ckpt, str(out / "ckpt.pt"))
    return str(out)


def test_a_run_stopped_early_is_refused_in_one_line_or_used_as_it_is_when_told(stopped_early, tmp_path, capsys):
    refusal = (f"is unfinished (iter 2 of its --max_iters=6) and nothing trains it now; continue it with python "
               f"train.py --init_from=resume --out_dir={stopped_early} (or the table1.py command that trained it), "
               f"or give --unfinished=true to use it as it is\n")
    for prog, main in (("probe.py", probe.main), ("routing.py", routing.main), ("sample.py", sample.main)):
        assert main([f"--out_dir={stopped_early}"]) == 2
        assert capsys.readouterr().err == f"{prog}: error: {stopped_early} {refusal}"
    assert probe.main([f"--out_dir={stopped_early}", "--unfinished=true", "--num_samples=2",
                       f"--json={tmp_path / 'p.json'}"]) == 0
    assert f"== {stopped_early} (unfinished at iter 2): layout" in capsys.readouterr().out
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved[0]["state"] == "unfinished at iter 2" and probe.title(saved[0]).startswith("stopped (unfinished at")
    assert routing.main([f"--out_dir={stopped_early}", "--unfinished=true", "--text=the king"]) == 0
    assert f"== {stopped_early} (unfinished at iter 2): layout" in capsys.readouterr().out
    assert sample.main([f"--out_dir={stopped_early}", "--unfinished=true", "--max_new_tokens=4"]) == 0
    assert capsys.readouterr().out.startswith(f"sample.py: from {stopped_early}, unfinished at iter 2\n")


def hold(folder, then=""):
    """A process holding folder's lock (as a training run or table1.py does) for 3 s, then running `then`
    (Python) before it lets go; returns it once it holds the lock."""
    code = ("import os, sys, time, shutil\nfrom support import files\nfiles.own(sys.argv[1])\n"
            "print('held', flush=True)\ntime.sleep(3)\n" + then)
    p = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT)
    assert p.stdout.readline() == "held\n"
    return p


def test_a_tool_waits_for_a_run_still_training_and_says_so(runs, tmp_path, capsys):
    out = shutil.copytree(runs[1], tmp_path / "training")
    held = hold(out, then=f"open({str(out / 'done')!r}, 'w').close()")  # the run's last act before it ends
    try:
        assert routing.main([f"--out_dir={out}", "--text=the king"]) == 0
        assert (out / "done").exists()  # it waited for the run to end
    finally:
        held.wait()
    captured = capsys.readouterr()
    assert captured.err == (f"routing.py: {out} is still training; waiting for it (or give --unfinished=true to "
                            f"use it as it is now)\n")
    assert f"== {out}: layout" in captured.out  # finished: no mark


def test_a_tool_waits_for_a_run_table1_has_still_to_train(runs, tmp_path, capsys):
    """Exercise 3 before exercise 2 ends: the run's folder is not there yet, but table1.py holds the folder
    above it; the tool waits for it (here the holder makes the run, then ends) instead of advising training."""
    root = tmp_path / "lesson"
    root.mkdir()
    held = hold(root, then=f"shutil.copytree({runs[0]!r}, {str(root / 'base_s0')!r})")
    try:
        assert probe.main([f"--out_dir={root / 'base_s0'}", "--num_samples=2"]) == 0
    finally:
        held.wait()
    captured = capsys.readouterr()
    assert captured.err == (f"probe.py: {root / 'base_s0'} is yet to be trained by the process holding the folder "
                            f"above; waiting for it (or give --unfinished=true to use it as it is now)\n")
    assert "train one with" not in captured.err + captured.out
