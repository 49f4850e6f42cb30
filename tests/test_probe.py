"""
Tests for probe.py (the paper's diagnostics, the loss after each loop step; routing.py's
predictions after each step) and table1.py's pure parts.

    python -m pytest -q tests/test_probe.py --all  # marked slow: the fast tier leaves it out
"""

import json
import math
import os
import sys

import numpy as np
import pytest
import torch

from tools import probe, routing
from support.capture import capture, readout
from tools import table1
from support.checkpoint import load as load_checkpoint, save as save_checkpoint
from data.dataset import random_windows
from data.meta import Tokenizer
from mesh import SCHEMES, Config, RecursiveGPT
from conftest import listed

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all

# -----------------------------------------------------------------------------
# Metrics


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rbf_cka(X, Y):
    """RBF-kernel CKA between X (T, D1) and Y (T, D2), rows paired by token, as probe() takes it."""
    return probe.cka_from_grams(probe.centered_rbf_gram(X), probe.centered_rbf_gram(Y))


def test_cka_of_a_matrix_with_itself_is_one():
    X = rand(40, 16)
    assert rbf_cka(X, X) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_invariant_to_orthogonal_transform_and_isotropic_scaling():
    X = rand(40, 16)
    Q, _ = torch.linalg.qr(rand(16, 16, seed=1))
    assert rbf_cka(X, X @ Q) == pytest.approx(1.0, abs=1e-9)
    assert rbf_cka(X, 3 * X) == pytest.approx(1.0, abs=1e-12)
    Y = rand(40, 8, seed=2)
    ref = rbf_cka(X, Y)
    assert rbf_cka(X @ Q, Y) == pytest.approx(ref, abs=1e-9)
    assert rbf_cka(X, 0.01 * Y) == pytest.approx(ref, abs=1e-12)


def test_cka_is_symmetric_and_below_one_for_unrelated_matrices():
    X, Y = rand(40, 16), rand(40, 24, seed=3)
    assert rbf_cka(X, Y) == pytest.approx(rbf_cka(Y, X), abs=1e-12)
    assert 0 < rbf_cka(X, Y) < 0.9


def test_cka_bandwidth_is_the_median_distance_of_distinct_rows():
    # points 0, 1, 2, 2 on a line: distinct-pair distances 1, 2, 2, 1, 1, median 1; the duplicate row adds
    # a zero distance that must not move the median.
    X = torch.tensor([[0.0], [1.0], [2.0], [2.0]], dtype=torch.float64)
    Kc = probe.centered_rbf_gram(X, sigma_frac=1.0)
    K = torch.exp(-torch.cdist(X, X) ** 2 / 2)  # sigma = 1 x median(1, 2, 1, 2, 1, 0 excluded) = 1
    H = torch.eye(4, dtype=torch.float64) - 1 / 4
    assert torch.allclose(Kc, H @ K @ H, atol=1e-12)
    assert math.isnan(rbf_cka(torch.ones(5, 3), rand(5, 3)))  # no distances at all: undefined, not 1
    # equal rows whose squared distances are rounding noise of X X^T: as undefined
    assert math.isnan(rbf_cka(rand(1, 16).repeat(5, 1), rand(5, 3)))


def test_relative_update_of_identity_is_zero_and_of_doubling_is_two_thirds():
    h = rand(2, 10, 8)
    assert torch.equal(probe.relative_update(h, h), torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(probe.relative_update(h, 2 * h), torch.full((2,), 2 / 3, dtype=torch.float64))
    assert probe.relative_update(h[0], -h[0]).item() == pytest.approx(2.0)  # the maximum


def test_spectrum_starts_at_one_and_never_increases():
    for T, D, n in ((64, 128, 50), (20, 128, 20), (64, 8, 8)):  # min(k, T, D) values
        s = probe.spectrum(rand(3, T, D))
        assert s.shape == (3, n)
        assert torch.equal(s[:, 0], torch.ones(3, dtype=torch.float64))
        assert (s[:, 1:] <= s[:, :-1]).all() and (s >= 0).all()


# -----------------------------------------------------------------------------
# State capture (probe.capture) feeds the metrics: it must be the model's own computation

TINY = dict(vocab_size=11, block_size=16, n_embd=32, n_head=2)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_captured_states_reproduce_the_normal_logits_exactly(scheme):
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="1+2R3+1", scheme=scheme)).eval()
    idx = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        plain, _ = model(idx)
        with capture(model) as cap:
            captured, _ = model(idx)
        assert torch.equal(plain, captured)
        states = dict(cap["states"])
        assert list(states) == ["h_emb", "h0", "h1", "h2", "h3", "out"]
        assert torch.equal(model.lm_head(model.ln_f(states["out"])), plain)
        blocks = {name: (x, y) for name, x, y in cap["blocks"]}
        assert list(blocks) == ["prelude", "step0", "step1", "step2", "coda"]
        for t in range(3):  # each step's recorded output is its core applied to the recorded input h(t)
            x, y = blocks[f"step{t}"]
            assert torch.equal(x, states[f"h{t}"])
            assert torch.equal(model.run(model.cores[0], x, 0, model.rotary(x.size(1)), None)[0], y)
        assert torch.equal(blocks["coda"][0], states["h3"]) and torch.equal(blocks["coda"][1], states["out"])
        assert [name for name, _, _ in cap["routers"]] == (["cycle", "step0", "step1", "step2"] if scheme == "mesh" else [])


@pytest.mark.parametrize("scheme", ["residual", "anchor", "anchor_emb"])
def test_readout_past_k_is_the_model_given_more_steps_of_its_last_core(scheme):
    """After loop step t > K, the logits of the same weights with t shared steps: the last core run
    on, each step's update the scheme's own (h(0) for anchor, h_emb for anchor_emb)."""
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="1+1+2R2+1", scheme=scheme)).eval()  # K = 3
    idx = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        with capture(model) as cap:
            model(idx)
        logits = list(readout(model, cap))
        assert len(logits) == 7
        for t in range(3, 7):  # schedule 0, 1, 1, ...: t steps
            longer = RecursiveGPT(Config(**TINY, layout=f"1+1+2R{t - 1}+1", scheme=scheme)).eval()
            longer.load_state_dict(model.state_dict())
            assert torch.allclose(logits[t], longer(idx)[0], atol=1e-5), t


def test_an_empty_prelude_or_coda_is_no_block_and_has_no_effort():
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="0+2R2+0", scheme="mesh")).eval()
    with torch.no_grad(), capture(model) as cap:
        model(torch.randint(0, 11, (1, 16)))
    assert [name for name, _, _ in cap["blocks"]] == ["step0", "step1"]
    assert [name for name, _, _ in cap["routers"]] == ["cycle", "step0", "step1"]
    assert [name for name, _ in cap["states"]] == ["h_emb", "h0", "h1", "h2", "out"]


# -----------------------------------------------------------------------------
# probe.py end to end on tiny checkpoints


def make_run(tmp_path, name, layout, scheme, n_slots=None):
    data_root = tmp_path / "data"
    folder = data_root / "tiny_char"
    if not folder.exists():
        folder.mkdir(parents=True)
        tokens = np.random.default_rng(0).integers(0, TINY["vocab_size"], 3000).astype(np.uint16)
        tokens.tofile(folder / "val.bin")
        (folder / "meta.json").write_text(json.dumps(dict(tokenizer="char", chars="abcdefghijk"[:TINY["vocab_size"]],
                                                          vocab_size=TINY["vocab_size"], dtype="uint16")))
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout=layout, scheme=scheme, n_slots=n_slots))
    out_dir = tmp_path / name
    save_checkpoint(dict(model=model.state_dict(), model_config=model.config.to_dict(),
                         train_config=dict(dataset="tiny_char", data_root=str(data_root)),
                         iter_num=0), str(out_dir / "ckpt.pt"))
    return str(out_dir)


def test_probe_end_to_end_writes_the_documented_json(tmp_path, capsys, monkeypatch):
    runs = [make_run(tmp_path, "base", "1+2R2+1", "base"), make_run(tmp_path, "mesh", "1+2R2+1", "mesh", n_slots=4),
            make_run(tmp_path, "vanilla", "4", "base")]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails: the PNG step must say so and go on
    out = tmp_path / "runs" / "probe" / "probe.json"  # as the README's command: its folders made for it
    probe.main([f"--out_dir={d}" for d in runs] + ["--num_samples=10", f"--json={out}", f"--png={tmp_path / 'png'}"])
    printed = capsys.readouterr().out
    assert "probe.py: matplotlib is not installed, so no figures (pip install matplotlib)" in printed
    assert "CKA (RBF, sigma = 0.8 x median distance)" in printed
    assert not (tmp_path / "png").exists()
    results = json.loads(out.read_text())
    assert [r["out_dir"] for r in results] == runs and {r["dataset"] for r in results} == {"tiny_char"}
    base, mesh, vanilla = results
    for r, labels, blocks in ((base, ["h_emb", "h0", "h1", "h2", "out"], ["prelude", "step0", "step1", "coda"]),
                              (mesh, ["h_emb", "h0", "h1", "h2", "out"], ["prelude", "step0", "step1", "coda"]),
                              (vanilla, ["h_emb", "h0", "out"], ["prelude"])):
        assert {"out_dir", "effort", "cka", "spectrum", "routers"} <= set(r)
        assert list(r["effort"]) == blocks
        assert all(len(v) == 2 and 0 <= v[0] <= 2 and v[1] >= 0 for v in r["effort"].values())
        assert r["cka"]["labels"] == labels and r["spectrum"]["labels"] == labels
        m = np.array(r["cka"]["matrix"])
        assert m.shape == (len(labels),) * 2 and np.allclose(np.diag(m), 1) and np.allclose(m, m.T)
        assert all(len(s) == 16 and s[0] == 1 for s in r["spectrum"]["mean"])  # min(50, T=16, D=32)
        assert all(s[0] == 0 for s in r["spectrum"]["std"])
    assert base["routers"] is None and vanilla["routers"] is None
    ro = mesh["routers"]
    assert ro["labels"] == ["cycle", "step0", "step1"] and ro["n_slots"] == 4
    assert ro["max_entropy"] == pytest.approx(math.log(4))
    for key in ("write", "read"):
        assert all(len(w) == 4 and sum(w) == pytest.approx(1) for w in ro[key])
        assert all(0 <= h <= math.log(4) + 1e-12 for h in ro[f"entropy_{key}"])
    assert min(ro["entropy_read"]) > 0.9 * math.log(4)  # near-uniform routers at init (mesh.py's router init)
    # the loss after each loop step: 2K+1 entries for base, K+1 for mesh, [loss] for vanilla, entry K the loss
    for r, n in ((base, 5), (mesh, 3), (vanilla, 1)):
        assert len(r["step_loss"]) == n and r["step_loss"][r["n_steps"]] == pytest.approx(r["loss"], abs=1e-5)
        model, ckpt = load_checkpoint(r["out_dir"])
        idx = probe.validation_windows(ckpt, 16, 10, 0)  # the windows probe.py took
        targets = torch.cat((idx[:, 1:], torch.full((10, 1), -1)), dim=1)  # all ten at once, not by chunks
        with torch.no_grad():
            assert r["loss"] == pytest.approx(model.eval()(idx, targets)[1].item(), abs=1e-6)
    assert "  (MeSH stops at K: a router per step, 4 buffer slots)" in printed  # its --n_slots=4, not K+3
    assert printed.count("; stopped after loop step t = 0, 1, ... (early exit through the coda, not the paper's "
                         "method; * the trained K):\n") == 2
    assert f"loss {vanilla['loss']:.4f}; no loop steps\n" in printed


def by_hand_cka(X, Y, frac):
    """RBF CKA written out: distances row by row, sigma = frac x the median of the nonzero ones."""
    def gram(A):
        d = ((A[:, None] - A[None]) ** 2).sum(-1).sqrt()
        sigma = frac * d[torch.triu(torch.ones_like(d), 1) > 0].numpy()
        sigma = float(np.median(sigma[sigma > 0]))
        H = torch.eye(len(A), dtype=torch.float64) - 1 / len(A)
        return H @ torch.exp(-d ** 2 / (2 * sigma ** 2)) @ H
    K, L = gram(X.double()), gram(Y.double())
    return (torch.trace(K @ L) / torch.sqrt(torch.trace(K @ K) * torch.trace(L @ L))).item()


def test_probe_numbers_are_each_samples_diagnostics_averaged_over_samples():
    """probe() on 10 sequences (two chunks) against the measures taken by hand, sample by sample."""
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="1+2R2+1", scheme="mesh", n_slots=4)).eval()
    idx = torch.randint(0, 11, (10, 16))
    r = probe.probe(model, idx, sigma_frac=0.5)
    with torch.no_grad(), capture(model) as cap:
        model(idx)
    for name, h, fh in cap["blocks"]:
        h, fh = h.double(), fh.double()
        e = [(2 * (y - x).norm() / (y.norm() + x.norm())).item() for x, y in zip(h, fh)]
        assert r["effort"][name] == pytest.approx([np.mean(e), np.std(e)], rel=1e-6)
    states = [x for _, x in cap["states"]]
    cka = np.mean([[[by_hand_cka(X[b], Y[b], 0.5) for Y in states] for X in states] for b in range(10)], 0)
    assert np.array(r["cka"]["matrix"]) == pytest.approx(cka, abs=1e-6)
    for i, X in enumerate(states):
        s = torch.stack([torch.linalg.svdvals(x.double()) for x in X])
        s = (s / s[:, :1]).numpy()
        assert r["spectrum"]["mean"][i] == pytest.approx(s.mean(0), abs=1e-6)
        assert r["spectrum"]["std"][i] == pytest.approx(s.std(0), abs=1e-6)
    for i, (name, write, read) in enumerate(cap["routers"]):
        for kind, w in (("write", write), ("read", read)):
            w = w.double().flatten(0, 1)  # (B T, S): a token's weights
            assert r["routers"][kind][i] == pytest.approx(w.mean(0).tolist(), abs=1e-6)
            H = -(w * w.log()).sum(-1).mean().item()
            assert r["routers"][f"entropy_{kind}"][i] == pytest.approx(H, abs=1e-6)


def test_probe_cka_leaves_out_only_the_samples_where_a_state_is_degenerate():
    """A sequence of one repeated token has every state's rows equal (no CKA): the matrix is that of
    the other sequences, not all null."""
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="1+2R2+1", scheme="base")).eval()
    idx = torch.randint(0, 11, (3, 16))
    idx[0] = 4
    matrix = np.array(probe.probe(model, idx)["cka"]["matrix"])
    assert matrix == pytest.approx(np.array(probe.probe(model, idx[1:])["cka"]["matrix"]), abs=1e-12)
    assert probe.probe(model, idx[:1])["cka"]["matrix"] == [[None] * 5] * 5


def test_probe_report_prints_each_number_under_its_name():
    r = dict(out_dir="runs/m", state="finished", layout="1+2R2+1", scheme="mesh", num_samples=3, seq_len=16,
             dataset="tiny", n_steps=2, effort={"prelude": [0.5, 0.25], "step0": [0.125, 0.0625]},
             cka={"labels": ["h_emb", "h0", "out"], "sigma_frac": 0.8,
                  "matrix": [[1.0, 0.5, None], [0.5, 1.0, 0.25], [None, 0.25, 1.0]]},
             spectrum={"labels": ["h_emb", "h0", "out"], "std": [[0, 0, 0]] * 3,
                       "mean": [[1.0, 0.5, 0.25], [1.0, 0.75, 0.125], [1.0, 0.375, 0.0625]]},
             routers={"labels": ["cycle", "step0"], "n_slots": 2, "max_entropy": math.log(2),
                      "write": [[0.25, 0.75], [0.5, 0.5]], "read": [[0.125, 0.875], [1.0, 0.0]],
                      "entropy_write": [0.5, 0.25], "entropy_read": [0.125, 0.0]},
             loss=1.5, step_loss=[2.5, 2.0, 1.5])
    assert probe.report(r) == """\
== runs/m: layout 1+2R2+1, scheme mesh, 3 x 16 tokens of tiny ==
effort (relative update, mean +- std):  prelude 0.500+-0.250  step0 0.125+-0.062
CKA (RBF, sigma = 0.8 x median distance):
       h_emb    h0   out
h_emb   1.00  0.50   -  
h0      0.50  1.00  0.25
out      -    0.25  1.00
spectrum sigma_i/sigma_0 (mean) at i = 1, 2:
  h_emb 0.500 0.250
  h0    0.750 0.125
  out   0.375 0.062
routers (mean slot weight; entropy, max ln 2 = 0.693):
  cycle   write [0.25 0.75] H 0.500   read [0.12 0.88] H 0.125
  step0   write [0.50 0.50] H 0.250   read [1.00 0.00] H 0.000
loss 1.5000; stopped after loop step t = 0, 1, ... (early exit through the coda, not the paper's method; \
* the trained K):
  2.5000  2.0000  1.5000*  (MeSH stops at K: a router per step, 2 buffer slots)"""


def test_probe_same_seed_same_numbers(tmp_path, capsys):
    run = make_run(tmp_path, "mesh", "1+2R2+1", "mesh")
    for name in ("a", "b"):
        assert probe.main([f"--out_dir={run}", "--num_samples=3", "--seed=5", f"--json={tmp_path / name}"]) == 0
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text()
    model, ckpt = load_checkpoint(run)
    idx = probe.validation_windows(ckpt, 16, 3, 5)  # --seed's windows, the loss their model's
    targets = torch.cat((idx[:, 1:], torch.full((3, 1), -1)), dim=1)
    with torch.no_grad():
        loss = model.eval()(idx, targets)[1].item()
    assert json.loads((tmp_path / "a").read_text())[0]["loss"] == pytest.approx(loss, abs=1e-6)
    probe.main([f"--out_dir={run}", "--num_samples=3", "--seed=6", f"--json={tmp_path / 'c'}"])
    assert json.loads((tmp_path / "c").read_text())[0]["loss"] != pytest.approx(loss, abs=1e-6)


def test_probe_refuses_samples_whose_measures_need_over_half_the_memory(tmp_path, capsys, monkeypatch):
    """2 samples of T = 16 and 5 states (K = 2): 2 x 8 x (16 + 2 (50 x 5 + 5^2)) = 9,056 bytes."""
    run = make_run(tmp_path, "mesh", "1+2R2+1", "mesh")
    monkeypatch.setattr(probe, "physical_memory", lambda: 2 * 9056 - 1)
    assert probe.main([f"--out_dir={run}", "--num_samples=2"]) == 2
    assert capsys.readouterr().err == ("probe.py: error: --num_samples=2: its windows and measures need "
                                       "about 0.0 GiB, more than half of this machine's 0.0 GiB; use fewer\n")
    monkeypatch.setattr(probe, "physical_memory", lambda: 2 * 9056)
    assert probe.main([f"--out_dir={run}", "--num_samples=2"]) == 0


def test_probe_writes_pngs_when_matplotlib_is_installed(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib (optional) is not installed")
    runs = [make_run(tmp_path, "base", "1+2R2+1", "base"), make_run(tmp_path, "mesh", "1+2R2+1", "mesh")]
    probe.main([f"--out_dir={d}" for d in runs] + ["--num_samples=2", f"--png={tmp_path / 'png'}"])
    assert listed(tmp_path / "png") == ["cka.png", "effort.png", "routers.png", "spectrum.png",
                                                    "steps.png"]


def test_probe_steps_png_draws_each_scheme_in_its_colour_of_every_figure(tmp_path, monkeypatch):
    """steps.png: mesh in red and base in blue, curves.COLOURS's, whatever order they come in."""
    to_hex = pytest.importorskip("matplotlib.colors").to_hex
    runs = [make_run(tmp_path, s, "1+2R2+1", s) for s in ("mesh", "base")]
    drawn = {}
    monkeypatch.setattr(probe, "save_figure", lambda plt, fig, path: drawn.update({path: fig}))
    probe.main([f"--out_dir={d}" for d in runs] + ["--num_samples=2", f"--png={tmp_path}"])
    lines = drawn[os.path.join(str(tmp_path), "steps.png")].axes[0].lines
    assert {ln.get_label(): to_hex(ln.get_color()) for ln in lines} == {
        "mesh 1+2R2+1": to_hex("tab:red"), "base 1+2R2+1": to_hex("tab:blue"), "trained K": "#000000"}
    assert {ln.get_label(): ln.get_marker() for ln in lines} == {  # a layout's marker, whatever the scheme
        "mesh 1+2R2+1": "o", "base 1+2R2+1": "o", "trained K": "*"}


def test_routing_predicts_after_each_step_what_a_model_stopped_there_predicts(tmp_path):
    """Base's prediction after loop step t is that of a base model given t loop steps and the same weights;
    MeSH's after its last step is its own; each shown as its token's text."""
    a = routing.RoutingConfig(text="abcabcd")
    opened = lambda s: probe.opened(make_run(tmp_path, s, "1+2R2+1", s), a, "routing.py")
    base, mesh = (routing.routing_checkpoint(opened(s), a)
                  for s in ("base", "mesh"))
    idx = torch.tensor([base["ids"]])
    model = load_checkpoint(str(tmp_path / "base"))[0]
    assert len(base["predicted"]) == 5 and len(mesh["predicted"]) == 3
    for t, predicted in enumerate(base["predicted"]):
        stopped = RecursiveGPT(Config(**TINY, layout=f"1+2R{t}+1" if t else "1+1", scheme="base")).eval()
        assert not stopped.load_state_dict(model.state_dict(), strict=False).missing_keys  # t = 0: no core
        with torch.no_grad():
            assert predicted == stopped(idx)[0][0].argmax(-1).tolist(), t
    assert len({tuple(p) for p in base["predicted"]}) > 1  # the steps do change the prediction
    assert base["predicted_tokens"] == [["abcdefghijk"[i] for i in ids] for ids in base["predicted"]]
    assert routing.token_text(Tokenizer("char", chars="ab"), 2) == "<pad>"  # a padded vocabulary's extra ids
    model = load_checkpoint(str(tmp_path / "mesh"))[0].eval()
    with torch.no_grad():
        assert mesh["predicted"][-1] == model(idx)[0][0].argmax(-1).tolist()


@pytest.mark.parametrize("args, message", [
    (["--out_dir=nowhere"], "probe.py: error: no checkpoint at nowhere/ckpt.pt; train one with: python train.py --out_dir=nowhere\n"),
    (["--out_dir=x", "--num_samples=0"], "probe.py: error: --num_samples=0 must be at least 1\n"),
    ([], "probe.py: error: give a run's folder: --out_dir=OUT_DIR (again to compare several)\n"),
    (["--out_dir=x", "--sigma_frac=0"], "probe.py: error: --sigma_frac=0.0 must be a positive finite number\n"),
    (["--out_dir=x", "--sigma_frac=inf"], "probe.py: error: --sigma_frac=inf must be a positive finite number\n"),
    (["--out_dir=x", "--sigma_frac=1e300"], "probe.py: error: --sigma_frac=1e+300 must be at most 1e6\n"),
    (["--out_dir=x", "--seed=-1"], "probe.py: error: --seed=-1 must be 0 or more\n"),  # numpy takes no other
    (["--out_dir=nowhere", "--json=/tmp"], "probe.py: error: --json=/tmp is a folder; give a file name\n"),
    (["--out_dir=nowhere", "--png=README.md"], "probe.py: error: --png=README.md is a file; give a folder\n"),
])
def test_probe_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code = probe.main(args)
    assert code == 2 and capsys.readouterr().err == message
    if "--seed=-1" in args:  # routing.py's windows too
        assert routing.main(args) == 2 and capsys.readouterr().err == message.replace("probe", "routing")


def test_a_later_run_that_cannot_be_opened_is_refused_before_any_work(tmp_path, capsys):
    run, nowhere = make_run(tmp_path, "mesh", "1+2R2+1", "mesh"), tmp_path / "nowhere"
    for main, prog in ((probe.main, "probe.py"), (routing.main, "routing.py")):
        assert main([f"--out_dir={run}", f"--out_dir={nowhere}", f"--json={tmp_path / 'r.json'}"]) == 2
        assert capsys.readouterr() == ("", f"{prog}: error: no checkpoint at {nowhere}/ckpt.pt; train one with: "
                                           f"python train.py --out_dir={nowhere}\n")


def test_each_run_is_opened_once(tmp_path, monkeypatch):
    run = make_run(tmp_path, "mesh", "1+2R2+1", "mesh")
    opened, load_run = [], probe.tool.load_run
    monkeypatch.setattr(probe.tool, "load_run", lambda d, *a: opened.append(d) or load_run(d, *a))
    for main, more in ((probe.main, ["--num_samples=2"]), (routing.main, [])):
        assert main([f"--out_dir={run}", f"--out_dir={run}", *more]) == 0
    assert opened == [str(run)] * 4


def test_probe_names_a_missing_validation_split(tmp_path, capsys):
    run = make_run(tmp_path, "mesh", "1+2R2+1", "mesh")
    os.remove(tmp_path / "data" / "tiny_char" / "val.bin")
    code = probe.main([f"--out_dir={run}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err == (f"probe.py: error: {tmp_path}/data/tiny_char/val.bin is missing; prepare the dataset again: "
                   f"python data/prepare.py --dataset tiny_char\n")  # data/loader.py's load_split, as train.py


# -----------------------------------------------------------------------------
# table1.py: plan, log parsing, aggregation and the Markdown table (no training)


def test_table1_plan_shares_the_default_buffer_run_and_passes_identical_settings():
    runs = table1.plan(list(table1.VARIANTS), [0, 1, 2], table1.ablation_slots(table1.LOOP_LAYOUT))
    names = [r["name"] for r in runs]
    assert len(names) == len(set(names)) == 6 * 3 + 3  # B = K+3 = 5 is mesh_s0 itself
    assert names[-3:] == ["mesh_B3_s0", "mesh_B4_s0", "mesh_B6_s0"]
    cmds = {r["name"]: table1.train_command(r, f"runs/{r['name']}", 1200)[2:] for r in runs}
    assert cmds["mesh_B3_s0"] == ["--out_dir=runs/mesh_B3_s0", "--dataset=shakespeare_char", "--batch_size=16",
                                  "--lr=0.001", "--eval_iters=20", "--sample_tokens=0", "--n_embd=128", "--n_head=4",
                                  "--block_size=64", "--max_iters=1200", "--eval_interval=300", "--layout=2+4R2+2", "--scheme=mesh",
                                  "--n_slots=3", "--seed=0", "--device=cpu", "--data_root=data", "--overwrite=true"]
    strip = lambda cmd: [c for c in cmd if not c.startswith(("--out_dir", "--layout", "--scheme", "--n_slots"))]
    assert all(strip(cmds[n]) == strip(cmds["vanilla_s0"]) for n in names if n.endswith("_s0"))


def test_table1_ms_per_iter_is_the_median_of_logged_iterations(tmp_path, capsys):
    log = tmp_path / "log.jsonl"  # as train.py writes it: an evaluation at 0, then a timing line every 10 steps
    lines = [dict(iter=0, train_loss=4.2, val_loss=4.2), dict(iter=10, loss=4.0, lr=1e-3, ms=900.0)]  # warm-up
    lines += [dict(iter=i, loss=3.0, lr=1e-3, ms=ms) for i, ms in zip(range(20, 60, 10), (10.0, 25.0, 20.0, 500.0))]
    huge = '{"iter": 70, "ms": 1' + "0" * 400 + "}\n"  # past a float's range: a damaged line, left out
    log.write_text("".join(json.dumps(line) + "\n" for line in lines) + huge)
    assert table1.ms_per_iter(str(log)) == 25.0
    with log.open("a") as f:  # a text ms is no timing: progress's eta takes the last number
        f.write('{"iter": 80, "ms": "x"}\n{"iter": 90, "val_loss": 2.5}\n')
    watch = table1.progress("mesh_s0", str(tmp_path), 100, 80)
    watch()
    watch()  # called again while the run goes on: each evaluation is said once
    assert capsys.readouterr().out == "mesh_s0: iter 90/100, val loss 2.5000, eta 0.1 min\n"


def test_table1_val_loss_is_the_token_mean_cross_entropy_of_the_batches():
    torch.manual_seed(0)
    model = RecursiveGPT(Config(**TINY, layout="1+2R2+1", scheme="mesh"))
    data = np.random.default_rng(1).integers(0, TINY["vocab_size"], 500).astype(np.uint16)
    batches = torch.from_numpy(random_windows(data, 17, 3 * 4, seed=7)).view(3, 4, 17)
    assert torch.equal(batches, torch.from_numpy(random_windows(data, 17, 12, seed=7)).view(3, 4, 17))  # the same
    with torch.no_grad():
        logits, _ = model(batches.view(12, 17)[:, :-1])
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, TINY["vocab_size"]), batches.view(12, 17)[:, 1:].reshape(-1))
    assert table1.val_loss(model, batches) == pytest.approx(ref.item(), rel=1e-5)


def test_windows_reach_the_last_start_and_mean_std_is_over_the_population():
    data = np.arange(20, dtype=np.uint16)
    assert random_windows(data, 20, 3, seed=0).tolist() == [list(range(20))] * 3  # the one window that fits
    assert set(random_windows(data, 18, 200, seed=1)[:, 0].tolist()) == {0, 1, 2}
    mean, std = probe.mean_std([[1.0, 2.0], [3.0, 6.0]])
    assert mean.tolist() == [2.0, 4.0] and std.tolist() == [1.0, 2.0]  # ddof 0: the spread of these rows


def fake_result(variant, seed, loss, params, ms, n_slots=None, layout=table1.LOOP_LAYOUT):
    name = table1.run_name(variant, layout, seed, None if n_slots in (None, table1.steps(layout) + 3) else n_slots)
    return dict(name=name, variant=variant, layout=table1.DEPTH_LAYOUT if variant == "vanilla" else layout,
                scheme=table1.SCHEME[variant], seed=seed, params=params, n_slots=n_slots, val_loss=loss, ms_per_iter=ms)


def test_table1_aggregates_seeds_and_writes_the_markdown_table():
    results = [fake_result("vanilla", s, l, 2_379_520, 100.0) for s, l in ((0, 1.50), (1, 1.52), (2, 1.54))]
    results += [fake_result("mesh", s, l, 1_590_302, 90.0, n_slots=5) for s, l in ((0, 1.40), (1, 1.44))]
    results += [fake_result("mesh", 0, 1.47, 1_588_750, 85.0, n_slots=3)]
    vanilla = table1.vanilla_params()
    assert vanilla == 12 * (12 * 128**2 + 13 * 128) + 2 * 128  # L (12 D^2 + 13 D) + 2 D, a vanilla GPT-NeoX
    rows = table1.aggregate(results, vanilla, [0, 1, 2])
    assert [r["variant"] for r in rows] == ["vanilla", "mesh"]  # the B=3 run is not a mesh seed
    only_1 = table1.aggregate(results, vanilla, [1])  # --seeds=1 with the ablation: its mesh_s0 is not a seed
    assert [(r["variant"], r["seeds"], r["val_loss"]) for r in only_1] == [("vanilla", [1], 1.52), ("mesh", [1], 1.44)]
    assert rows[0]["val_loss"] == pytest.approx(1.52) and rows[0]["val_loss_std"] == pytest.approx(0.02)
    assert rows[1]["seeds"] == [0, 1] and rows[1]["share"] == pytest.approx(1_590_302 / vanilla)
    abl = table1.ablation_rows(results)
    assert [r["n_slots"] for r in abl] == [3, 5]
    md = table1.markdown(rows, abl, 1200, "test cpu", "shakespeare_char")
    assert "| vanilla | `12` | - | 2,379,520 | 100.0% | 1.5200 ± 0.0200 (3) | - | - | 100 |" in md
    # paired with vanilla seed by seed: 1.40 - 1.50 and 1.44 - 1.52; no base runs to pair with
    assert "| mesh | `2+4R2+2` | 2 | 1,590,302 | 66.8% | 1.4200 ± 0.0283 (2) | - | -0.0900 ± 0.0141 | 90 |" in md
    assert "| 3 | 1,588,750 | 1.4700 | 85 |" in md and "| 5 | 1,590,302 | 1.4000 | 90 |" in md
    assert "same 100 validation batches (102,400 tokens) for every run" in md  # 100 x 16 x 64
    assert "Buffer size B (mesh `2+4R2+2`, K = 2, seed 0; the default is B = K+3 = 5):" in md
    assert "Machine: test cpu." in md and "1200 iterations" in md and md.startswith("Tiny Shakespeare (characters), ")
    offline = table1.markdown(rows, abl, 1200, "test cpu", "pydoc")  # the fallback says so: not Tiny Shakespeare
    assert offline.startswith("Python's pydoc text (characters; Tiny Shakespeare could not be downloaded), ")


def test_table1_machine_names_the_gpu_its_runs_trained_on(monkeypatch):
    """The table's Machine line: the CPU (cores, threads), and with --device=cuda the GPU too."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "NVIDIA" not in table1.machine(2)
    assert f" cores and NVIDIA H100 80GB HBM3 (cuda:1), torch {torch.__version__}, 1 run(s) at a time" in \
        table1.machine(1, "cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # runs reused where no GPU is: no crash
    assert "NVIDIA" not in table1.machine(1, "cuda")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # more runs at once than cores: a thread each, not 0
    assert table1.machine(4).endswith(", 4 run(s) at a time with 1 thread(s) each")


def test_table1_names_the_one_dataset_its_runs_trained_on():
    runs = [dict(fake_result("vanilla", s, 1.5, 1, 1.0), dataset="pydoc", data_sha256="ab" * 32) for s in (0, 1)]
    assert table1.trained_on(runs) == "pydoc"
    runs[1].update(dataset="shakespeare_char", data_sha256="cd" * 32)
    with pytest.raises(table1.UsageError) as e:
        table1.trained_on(runs)
    assert str(e.value) == ("the runs trained on different data, which one table cannot compare: vanilla_s0 on "
                            "'pydoc' (sha256 abababababab); vanilla_s1 on 'shakespeare_char' (sha256 cdcdcdcdcdcd); "
                            "train them again on one dataset (delete their result.json) or use another --root")


def test_table1_depth_sweep_names_runs_by_layout_and_pairs_seeds():
    layouts = ["2+4R2+2", "3+1R6+3"]
    runs = table1.plan(["vanilla", "base", "mesh"], [0, 1], (), layouts)
    assert [r["name"] for r in runs] == ["vanilla_s0", "vanilla_s1", "base_s0", "base_s1", "mesh_s0", "mesh_s1",
                                         "base_3+1R6+3_s0", "base_3+1R6+3_s1", "mesh_3+1R6+3_s0", "mesh_3+1R6+3_s1"]
    assert {r["layout"] for r in runs if r["variant"] == "vanilla"} == {"12"}
    results = [fake_result("vanilla", s, l, 1, 1.0) for s, l in ((0, 1.50), (1, 1.60))]
    results += [fake_result(v, s, l, 1, 1.0, layout=lay) for v, lay, s, l in
                [("base", "2+4R2+2", 0, 1.55), ("base", "2+4R2+2", 1, 1.66), ("mesh", "2+4R2+2", 0, 1.52),
                 ("mesh", "2+4R2+2", 1, 1.61), ("base", "3+1R6+3", 0, 1.58), ("base", "3+1R6+3", 1, 1.70),
                 ("mesh", "3+1R6+3", 0, 1.53), ("mesh", "3+1R6+3", 1, 1.64)]]
    rows = table1.aggregate(results, 1, [0, 1], layouts)
    assert [(r["variant"], r["layout"], r["K"]) for r in rows] == [
        ("vanilla", "12", 0), ("base", "2+4R2+2", 2), ("mesh", "2+4R2+2", 2), ("base", "3+1R6+3", 6), ("mesh", "3+1R6+3", 6)]
    mesh6 = rows[4]
    assert mesh6["vs_base"] == pytest.approx(-0.055) and mesh6["vs_base_std"] == pytest.approx(0.0071, abs=1e-4)
    assert mesh6["vs_vanilla"] == pytest.approx(0.035)  # (0.03 + 0.04) / 2
    assert rows[1]["vs_base"] is None and rows[1]["vs_vanilla"] == pytest.approx(0.055)
    assert rows[0]["vs_base"] is None and rows[0]["vs_vanilla"] is None  # vanilla: the reference, not compared


def test_table1_choices_change_one_mesh_setting_and_pair_with_mesh():
    runs = table1.plan(["mesh", "mesh_direct", "mesh_base_init", "mesh_unscaled"], [0], (), ["2+2R4+2"])
    cmds = {r["name"]: table1.train_command(r, "out", 1200)[2:] for r in runs}
    mesh = cmds.pop("mesh_2+2R4+2_s0")
    assert {name: sorted(set(cmd) - set(mesh)) for name, cmd in cmds.items()} == {
        "mesh_direct_2+2R4+2_s0": ["--cycle=direct"], "mesh_base_init_2+2R4+2_s0": ["--router_init=base"],
        "mesh_unscaled_2+2R4+2_s0": ["--slot0=unscaled"]}
    assert all(len(cmd) == len(mesh) + 1 for cmd in cmds.values())  # one flag added, none changed
    both = table1.plan(["mesh_direct_base_init"], [0], (), ["2+2R4+2"])[0]
    assert sorted(set(table1.train_command(both, "out", 1200)[2:]) - set(mesh)) == [
        "--cycle=direct", "--router_init=base"]
    lay = "2+2R4+2"
    results = [fake_result(v, s, l, 1, 1.0, layout=lay) for v, s, l in
               [("base", 0, 1.60), ("base", 1, 1.62), ("mesh", 0, 1.55), ("mesh", 1, 1.58),
                ("mesh_direct", 0, 1.56), ("mesh_direct", 1, 1.61)]]
    results += [fake_result("vanilla", s, 1.5, 1, 1.0) for s in (0, 1)]
    rows = table1.aggregate(results, 1, [0, 1], [lay])
    assert [r["variant"] for r in rows] == ["vanilla", "base", "mesh", "mesh_direct"]
    direct = rows[3]
    assert direct["vs_mesh"] == pytest.approx(0.02) and direct["vs_mesh_std"] == pytest.approx(0.0141, abs=1e-4)
    assert direct["vs_base"] == pytest.approx(-0.025) and rows[2]["vs_mesh"] is None  # mesh: the reference
    md = table1.markdown(rows, [], 1200, "test cpu", "shakespeare_char")
    assert "| val loss (mean ± std, seeds) | - base | - vanilla | - mesh | ms/iter |" in md
    assert "| mesh_direct | `2+2R4+2` | 4 | 1 | 100.0% | 1.5850 ± 0.0354 (2) | -0.0250 ± 0.0212 | +0.0850 ± 0.0354 " \
           "| +0.0200 ± 0.0141 | 1 |" in md
    assert "MeSH's [choice]s (mesh.py) changed, by row: mesh_direct: cycle=direct." in md
    assert "- mesh" not in table1.markdown(rows[:3], [], 1200, "test cpu", "shakespeare_char")  # no choices, no column


def test_table1_bad_flags_are_one_line(capsys, tmp_path, monkeypatch):
    code = table1.main(["--only=mesh,anchr"])
    assert code == 2
    assert capsys.readouterr().err == ("table1.py: error: --only: unknown 'anchr' (did you mean 'anchor'?); expected "
                                       "some of vanilla, base, residual, anchor, anchor_emb, mesh, mesh_direct, "
                                       "mesh_base_init, mesh_unscaled, mesh_direct_base_init, "
                                       "ablation\n")
    code = table1.main(["--jobs=0"])
    assert code == 2 and capsys.readouterr().err == "table1.py: error: --jobs=0 must be at least 1\n"
    (tmp_path / "res").write_text("mine")  # --results a file: refused before any run trains
    monkeypatch.setattr(table1, "train_all", lambda *a: pytest.fail("a run trained"))
    code = table1.main([f"--results={tmp_path / 'res'}", f"--root={tmp_path / 'root'}", "--only=vanilla"])
    assert code == 2 and capsys.readouterr().err == f"table1.py: error: --results={tmp_path / 'res'} is a file; " \
                                                    f"give a folder\n"
    assert sorted(os.listdir(tmp_path)) == ["res"]
    with pytest.raises(SystemExit) as e:  # its tables go under runs/, never over the committed results/
        table1.main(["--help"])
    assert e.value.code == 0 and "--results=runs/table1 table1.json, table1.md and the figures go here" in \
        " ".join(capsys.readouterr().out.split())


def test_cycle_table_pairs_direct_with_routed_by_seed(tmp_path, capsys):
    """Each share closed is of the gap on the variant's own seeds; K = 2's base and mesh have no vanilla to pair."""
    from tools import cycle
    sweep = [dict(variant=v, layout=lay, seed=s, val_loss=x) for v, lay, s, x in [
        ("vanilla", "12", 0, 1.79), ("vanilla", "12", 1, 1.82), ("base", "3+2R3+3", 0, 1.84),
        ("base", "3+2R3+3", 1, 1.86), ("mesh", "3+2R3+3", 0, 1.81), ("mesh", "3+2R3+3", 1, 1.84),
        ("base", "2+4R2+2", 2, 1.90), ("mesh", "2+4R2+2", 2, 1.88)]]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": sweep}))
    (tmp_path / "choices.json").write_text(json.dumps({"runs": [dict(variant="mesh_direct_base_init",
                                                                     layout="3+2R3+3", seed=0, val_loss=1.82)]}))
    run = tmp_path / "runs" / "mesh_direct_3+2R3+3_s1"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps(dict(variant="mesh_direct", layout="3+2R3+3", seed=1,
                                                     val_loss=1.83)))
    out = tmp_path / "out"
    cycle.main([f"--sweep={tmp_path / 'sweep.json'}", f"--choices={tmp_path / 'choices.json'}",
                f"--root={tmp_path / 'runs'}", f"--results={out}"])
    k2, k3 = [r for r in json.loads((out / "cycle.json").read_text()) if r["K"] in (2, 3)]
    assert k3["base_vs_vanilla"] == pytest.approx([0.045, 0.00707, 2], abs=1e-5)
    assert k3["mesh_vs_base"][:2] == pytest.approx([-0.025, 0.00707], abs=1e-5)
    assert k3["mesh_direct_vs_mesh"] == pytest.approx([-0.01, None, 1])  # seed 1 only: 1.83 - 1.84
    assert k3["mesh_direct_closes"] == pytest.approx(0.75)  # -(1.83 - 1.86) / (1.86 - 1.82): its seed
    assert (k2["mesh_vs_base"], k2["mesh_closes"]) == (pytest.approx([-0.02, None, 1]), None)
    md = (out / "cycle.md").read_text()
    assert "| 3 | `3+2R3+3` | +0.0450 ± 0.0071 (2) | -0.0250 ± 0.0071 (2) | -0.0300 (1) | -0.0100 (1) " \
           "| 56% | 75% |" in md
    assert "| 2 | `2+4R2+2` | - | -0.0200 (1) | - | - | - | - |" in md
    assert "K = 3, cycle=direct with router_init=base: -0.0200 (1) against base, +0.0100 (1) against routed " \
           "mesh (40% of the gap closed)." in md  # -(1.82 - 1.84) / (1.84 - 1.79)
    assert capsys.readouterr().out == md + f"wrote {out}/cycle.md and cycle.json\n"


def test_cycle_table_leaves_out_the_buffer_ablations_runs(tmp_path):
    """A table1.json with the B ablation holds more runs of variant mesh, seed 0 (mesh_B3_s0...):
    they are not routed mesh's, whose row is that of its own runs, in the table1.json or a --root."""
    from tools import cycle
    runs = [dict(name=n, variant=n.split("_")[0], layout="12" if n[0] == "v" else "3+2R3+3", seed=int(n[-1]),
                 val_loss=x) for n, x in [("vanilla_s0", 1.80), ("base_3+2R3+3_s0", 1.84),
                                          ("mesh_3+2R3+3_s0", 1.81), ("mesh_3+2R3+3_B4_s0", 1.90)]]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs}))
    (tmp_path / "choices.json").write_text(json.dumps({"runs": []}))
    run = tmp_path / "runs" / "mesh_3+2R3+3_B5_s0"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps(dict(runs[-1], name=run.name, val_loss=1.95)))
    cycle.main([f"--sweep={tmp_path / 'sweep.json'}", f"--choices={tmp_path / 'choices.json'}",
                f"--root={tmp_path / 'runs'}", f"--results={tmp_path / 'out'}"])
    k3 = next(r for r in json.loads((tmp_path / "out" / "cycle.json").read_text()) if r["K"] == 3)
    assert k3["mesh_vs_base"] == pytest.approx([-0.03, None, 1])  # 1.81 - 1.84
    assert k3["mesh_closes"] == pytest.approx(0.75)


def test_cycle_writes_under_runs_never_over_the_committed_results(tmp_path, monkeypatch):
    """Run with its defaults at the repository's root (here a copy's): cycle.md goes under runs/, as
    table1.py's tables do; results/cycle/, the committed table of runs this clone lacks, is kept."""
    from tools import cycle
    for table in ("depth_sweep", "choices"):
        (tmp_path / "results" / table).mkdir(parents=True)
        (tmp_path / "results" / table / "table1.json").write_text(json.dumps({"runs": []}))
    (tmp_path / "results" / "cycle").mkdir()
    (tmp_path / "results" / "cycle" / "cycle.md").write_text("the committed table\n")
    monkeypatch.chdir(tmp_path)
    assert cycle.main([]) == 0
    assert (tmp_path / "results" / "cycle" / "cycle.md").read_text() == "the committed table\n"
    assert (tmp_path / "runs" / "cycle" / "cycle.md").read_text().startswith("| K | layout |")
