"""
Tests for what a class is shown: tools/draw.py (the model drawn from its Layout) and tools/routing.py
(each token's effort and MeSH routing on one sentence).

    python -m pytest -q tests/test_class.py
"""

import json
import os
import sys

import pytest
import torch

from conftest import run
from mesh import Config
from support import checkpoint
from support.capture import capture
from tools import draw, routing


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
    window = routing.routing_checkpoint(runs[1], None, 5, 0, "cpu")  # no --text: a validation window
    assert len(window["tokens"]) == 5 and window == routing.routing_checkpoint(runs[1], None, 5, 0, "cpu")


def test_routing_without_matplotlib_writes_the_numbers_and_says_so(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    routing.main([f"--out_dir={runs[1]}", f"--json={tmp_path / 'r.json'}", f"--png={tmp_path / 'r.png'}"])
    assert (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()
    assert ("routing.py: matplotlib is not installed, so no figure, only the numbers (pip install matplotlib)\n"
            in capsys.readouterr().out)


@pytest.mark.parametrize("args, message", [
    ([], "routing.py: error: give a checkpoint folder: --out_dir=OUT_DIR (again to compare several)"),
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
    assert capsys.readouterr().out.split()[1:] == [
        "--out_dir=runs/lesson/mesh_2+2R4+2_s3", "--dataset=shakespeare_char", "--batch_size=16", "--lr=0.002",
        "--eval_iters=20", "--sample_tokens=0", "--n_embd=64", "--n_head=4", "--block_size=64", "--max_iters=8",
        "--eval_interval=2", "--layout=2+2R4+2", "--scheme=mesh", "--seed=3", "--device=cpu", "--data_root=data",
        "--overwrite=true"]


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
    monkeypatch.setattr(table1.CHILDREN, "run", lambda cmd, **kw: started.append(cmd) or 1)
    for flag, train in (("--n_embd=128, not --n_embd=64", dict(table1.TRAIN, n_embd=64)),
                        ("--lr=0.001, not --lr=0.002", dict(table1.TRAIN, lr=2e-3))):
        with pytest.raises(UsageError, match=f"holds a finished run of {flag}, which table1.py never replaces"):
            table1.run_one(run, str(tmp_path), 5, train=train)
    assert started == []  # refused before anything trains
