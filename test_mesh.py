"""
Tests for mesh.py: parameter counts, the five schemes against an independent implementation of
the paper's equations, weight sharing, the exact reductions of Appendix D, config errors, the
optimizer, generation and the KV cache.

    python -m pytest test_mesh.py -q --all  # --all: its slow-marked tests too

CPU only, fp32, small single-threaded models; about 20 s of CPU time in all.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import mesh
from mesh import Config, KVCache, Layout, RecursiveGPT, parse_layout
from support.capture import capture, readout
from tests.models import CASES, IDS, V, build, small, tokens

ROOT = Path(__file__).resolve().parent

# Each scheme's update rule (the paper's Section 3) written again here, apart from mesh.SCHEMES, for the
# independent implementation below; MeSH's is its buffer (Eq. 2-5), written there slot by slot.
REFERENCE = {"base": lambda h_m, h, h0, h_emb: h_m,
             "residual": lambda h_m, h, h0, h_emb: h_m + h,
             "anchor": lambda h_m, h, h0, h_emb: h_m + h0,
             "anchor_emb": lambda h_m, h, h0, h_emb: h_m + h_emb}


def reference_rule(scheme):
    if scheme not in REFERENCE:
        pytest.fail(f"scheme {scheme!r} of mesh.SCHEMES has no reference formula: add its update rule to REFERENCE "
                    f"in test_mesh.py (written from its equation, not copied from mesh.py)")
    return REFERENCE[scheme]


def vanilla_formula(L, D):
    return L * (12 * D * D + 13 * D) + 2 * D


def run_cli(*args):
    """The summary's command line (tools/draw.py prints mesh.summary, allocating no weights)."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / "draw.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=3600)  # a guard against a hang, not a speed limit


# -----------------------------------------------------------------------------
# Parameter counts, on the meta device (Pythia's shapes; the paper's Table 5)

PYTHIA = {"pythia-14m": 1_189_888, "pythia-31m": 4_739_072, "pythia-70m": 18_915_328,
          "pythia-160m": 85_056_000, "pythia-410m": 302_311_424, "pythia-1b": 805_736_448,
          "pythia-1.4b": 1_208_602_624, "pythia-2.8b": 2_517_652_480, "pythia-6.9b": 6_444_163_072,
          "pythia-12b": 11_327_027_200}


def meta_params(cfg, non_embedding=True):
    with torch.device("meta"):
        return RecursiveGPT(cfg).num_params(non_embedding)


@pytest.mark.parametrize("name", PYTHIA)
def test_pythia_vanilla_param_counts(name):
    cfg = Config.from_preset(name)
    assert cfg.shape.schedule == () and cfg.scheme == "base"
    L, D = cfg.shape.depth, cfg.n_embd
    assert L == mesh.PRESETS[name]["n_layer"]
    assert vanilla_formula(L, D) == PYTHIA[name]
    assert meta_params(cfg) == PYTHIA[name]
    # the embeddings are the untied wte and lm_head, vocab x D each
    assert meta_params(cfg, non_embedding=False) == PYTHIA[name] + 2 * cfg.vocab_size * D


def test_pythia_1_4b_recursive_counts():
    base = Config.from_preset("pythia-1.4b", layout="4+8R2+4")
    m = Config.from_preset("pythia-1.4b", layout="4+8R2+4", scheme="mesh")
    assert (m.n_steps, m.slots) == (2, 5)
    assert meta_params(base) == 805_736_448 == vanilla_formula(16, 2048)
    assert meta_params(m) == 805_797_918
    K, D, B = 2, 2048, 5
    router = (K + 1) * 2 * (D * B + B)
    assert router == 61_470
    with torch.device("meta"):
        model = RecursiveGPT(m)
    assert sum(p.numel() for n, p in model.named_parameters() if n.startswith("routers.")) == router
    assert meta_params(m) - meta_params(base) == router
    # residual / anchor schemes add no parameters
    for scheme in (s for s in mesh.SCHEMES if s not in ("base", "mesh")):
        assert meta_params(Config.from_preset("pythia-1.4b", layout="4+8R2+4", scheme=scheme)) == 805_736_448


def check_summary_text(text):
    assert "805,797,918" in text
    assert "61,470" in text
    assert "compute depth 24, unique layers 16" in text
    assert "1,208,602,624" in text  # the vanilla 24-layer reference


def test_summary():
    check_summary_text(mesh.summary(Config.from_preset("pythia-1.4b", layout="4+8R2+4", scheme="mesh")))
    base = mesh.summary(Config.from_preset("pythia-1.4b", layout="4+8R2+4"))
    assert "805,736,448" in base and "66.67% of vanilla" in base
    assert "router params                       0" in base
    assert "  step 0   core 0: blocks 4-11\n  step 1   core 0: blocks 4-11 (shared)\n" in base


@pytest.mark.parametrize("name", mesh.MESH_CHOICES)
def test_summary_of_each_mesh_choice(name):
    """A MeSH setting off its default still compares with the vanilla model (which takes none)."""
    text = mesh.summary(small("mesh", "1+2R3+1", **{name: mesh.MESH_CHOICES[name][1]}))
    pairs = 3 if name == "cycle" else 4  # cycle="direct": no router pair of its own
    assert f"of vanilla 8-layer: {vanilla_formula(8, 64):,})" in text
    assert text.splitlines()[-1].split() == ["router", "params", f"{pairs * 2 * (64 * 6 + 6):,}"]


@pytest.mark.slow
def test_summary_cli():
    r = run_cli("--model", "pythia-1.4b", "--layout", "4+8R2+4", "--scheme", "mesh")
    assert r.returncode == 0, r.stderr
    check_summary_text(r.stdout)
    assert "5 slots" in r.stdout


@pytest.mark.parametrize("args, needle", [(("--model", "pythia-14b"), "pythia-1.4b"),
                                          (("--layout", "4+xR2+4"), "bad layout")])
@pytest.mark.slow
def test_cli_bad_input(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


# -----------------------------------------------------------------------------
# Every scheme: causality, initial loss, gradients, routing weights, capture

@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_causal(scheme, layout):
    model = build(small(scheme, layout), scramble=True)
    idx = tokens()
    with torch.no_grad():
        ref, _ = model(idx)
        for j in (0, 13, 31):
            other = idx.clone()
            other[:, j] = (other[:, j] + 1) % V
            logits, _ = model(other)
            assert torch.equal(logits[:, :j], ref[:, :j]), f"position {j} leaked into earlier logits"
            assert (logits[:, j] - ref[:, j]).abs().amax() > 1e-3, f"token {j} does not affect its own logits"


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_initial_loss_and_gradients(scheme, layout):
    model = build(small(scheme, layout)).train()
    idx = tokens()
    _, loss = model(idx, targets=tokens(seed=2))
    assert abs(loss.item() - math.log(V)) < 0.1  # untrained: close to uniform over the vocabulary
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    if scheme == "mesh":
        assert sum(n.startswith("routers.") for n in names) == 4 * (model.config.n_steps + 1)
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        assert p.grad.abs().sum() > 0, f"{n} got an all-zero gradient"


def test_grad_checkpoint_same_gradients(monkeypatch):
    """Checkpointing recomputes every applied block in backward (one checkpoint() call each, training only)
    and gives the same gradients."""
    calls = []
    real = mesh.checkpoint
    monkeypatch.setattr(mesh, "checkpoint", lambda *a, **kw: calls.append(a[0]) or real(*a, **kw))
    grads = []
    for ckpt in (False, True):
        model = build(small("mesh"), scramble=True).train()
        model.grad_checkpoint = ckpt
        _, loss = model(tokens(), targets=tokens(seed=2))
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    applied = [*model.prelude, *(b for c in model.schedule for b in model.cores[c]), *model.coda]
    assert calls == applied  # none without grad_checkpoint, every applied block with it
    with torch.no_grad():
        model.eval()(tokens())
    assert len(calls) == len(applied)  # not in evaluation
    for n in grads[0]:
        assert grads[1][n] is not None, n
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5), n


def test_routers_see_the_state_before_each_update():
    """The cycle's router reads the prelude output, step t's router reads h(t) (Eq. 3-4), not h_emb or h_m."""
    model = build(small("mesh", "1+2R3+1"), scramble=True)
    with torch.no_grad():
        with capture(model) as cap:
            model(tokens())
        states, blocks = dict((n, h) for n, h in cap["states"]), {n: (i, o) for n, i, o in cap["blocks"]}
        inputs = [blocks["prelude"][1]] + [states[f"h{t}"] for t in range(model.config.n_steps)]
        for router, h, (_, w_write, w_read) in zip(model.routers, inputs, cap["routers"], strict=True):
            expect_write, expect_read = router(h)
            assert torch.equal(w_write, expect_write) and torch.equal(w_read, expect_read)
        assert not torch.equal(model.routers[0](states["h_emb"])[0], cap["routers"][0][1])  # inputs tell apart


def test_every_layernorm_is_neox_eps():
    model = build(small("mesh"))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * model.config.shape.unique + 1 and all(m.eps == 1e-5 for m in norms)


@pytest.mark.parametrize("layout", ["1+2R2+1", "1+1+1R2+1", "2+1R4+1"])
def test_routing_weights_sum_to_one(layout):
    model = build(small("mesh", layout), scramble=True)
    with torch.no_grad():
        with capture(model) as cap:
            model(tokens())
    K, B = model.config.n_steps, model.config.slots
    assert [r[0] for r in cap["routers"]] == ["cycle"] + [f"step{t}" for t in range(K)]
    for name, w_write, w_read in cap["routers"]:
        for w in (w_write, w_read):
            assert w.shape == (2, 32, B)
            assert (w >= 0).all()
            assert torch.allclose(w.sum(-1), torch.ones(2, 32), atol=1e-6), name
    # scrambled routers really route: not uniform over the slots
    assert max((w - 1 / B).abs().amax() for _, ww, wr in cap["routers"] for w in (ww, wr)) > 0.1


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_capture(scheme, layout):
    model = build(small(scheme, layout), scramble=True)
    idx = tokens()
    with torch.no_grad():
        ref, _ = model(idx)
        with capture(model) as cap:
            logits, _ = model(idx)
    assert torch.equal(logits, ref)
    K = model.config.n_steps
    assert [n for n, _ in cap["states"]] == ["h_emb"] + [f"h{t}" for t in range(K + 1)] + ["out"]
    assert [n for n, *_ in cap["blocks"]] == ["prelude"] + [f"step{t}" for t in range(K)] + (["coda"] if K else [])
    assert len(cap["routers"]) == (K + 1 if scheme == "mesh" else 0)


def readout_losses(model, idx, targets):
    """The model's own loss, and the loss of support/capture.py's readout after each loop step."""
    with torch.no_grad():
        with capture(model) as cap:
            _, loss = model(idx, targets)
        steps = [F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1)).item()
                 for logits in readout(model, cap)]
    return loss.item(), steps, cap


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_readout_at_K_is_the_models_loss_and_goes_on_only_without_step_weights(scheme, layout):
    """Entry K is forward's own loss (the same computation); entry 0 is h(0) through the coda's
    blocks applied here one by one; base-like schemes go on to 2K, MeSH stops at K, vanilla is [loss]."""
    model = build(small(scheme, layout), scramble=True)
    K = model.config.n_steps
    loss, steps, cap = readout_losses(model, tokens(), tokens(seed=2))
    assert len(steps) == (1 if K == 0 else K + 1 if scheme == "mesh" else 2 * K + 1)
    assert abs(steps[K] - loss) < 1e-5
    h = dict(cap["states"])["h0"]
    with torch.no_grad():
        for block in model.coda:
            h = block(h, model.rotary(h.size(1)))
        logits = model.lm_head(model.ln_f(h))
    assert steps[0] == pytest.approx(F.cross_entropy(logits.flatten(0, 1), tokens(seed=2).reshape(-1)).item(), abs=1e-5)
    assert len(set(steps)) == len(steps)  # each step's readout its own


@pytest.mark.parametrize("scheme, layout, longer", [
    ("base", "1+2R2+1", "1+2R{}+1"), ("anchor", "1+2R2+1", "1+2R{}+1"),
    ("residual", "1+1+2R2+1", "1+1+2R{}+1"), ("anchor_emb", "1+1+2R2+1", "1+1+2R{}+1")])
def test_readout_past_K_is_a_model_built_with_more_steps_of_the_last_core(scheme, layout, longer):
    """Entry K+j equals a model whose last core runs j more times, given the same weights: its own loss."""
    model = build(small(scheme, layout), scramble=True)
    K, idx, targets = model.config.n_steps, tokens(), tokens(seed=2)
    _, steps, _ = readout_losses(model, idx, targets)
    for j in (1, K):
        more = RecursiveGPT(small(scheme, longer.format(len(model.schedule) - model.schedule.index(
            model.schedule[-1]) + j))).eval()
        more.load_state_dict(model.state_dict())  # the same parameters: only the schedule is longer
        assert more.config.n_steps == K + j
        with torch.no_grad():
            assert abs(more(idx, targets)[1].item() - steps[K + j]) < 1e-5, j


def test_buffer_write_read_per_slot():
    """Eq. 5 slot by slot: buffer_write adds w_b h to slot b, buffer_read sums r_b m_b."""
    torch.manual_seed(0)
    mem, h = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 8)
    w_write, w_read = torch.randn(2, 2, 5, 4).softmax(-1).unbind(0)
    written = mesh.buffer_write(mem, w_write, h)
    for b in range(4):
        torch.testing.assert_close(written[..., b, :], mem[..., b, :] + w_write[..., b:b + 1] * h, atol=1e-6, rtol=0)
    slots = sum(w_read[..., b:b + 1] * written[..., b, :] for b in range(4))
    torch.testing.assert_close(mesh.buffer_read(written, w_read), slots, atol=1e-6, rtol=0)


def test_model_loss_is_cross_entropy_of_its_logits():
    model = build(small(), scramble=True).train()
    idx, targets = tokens(), tokens(seed=2)
    targets[0, :5] = -1
    logits, loss = model(idx, targets)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    (g_ours,), (g_ref,) = torch.autograd.grad(loss, logits, retain_graph=True), torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-9)


def reference_forward(model, idx):
    """The model's function written again from the equations, independently of mesh.py's code: per-head
    attention with an explicit causal mask and GPT-NeoX's rotate-half rotary, and MeSH's buffer as a list
    of slots with Eq. 5's write and read slot by slot. Reads the model's parameters by name."""
    cfg, P = model.config, dict(model.named_parameters())
    D, H, hd, rot = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.rotary_dims
    T = idx.size(1)

    def linear(x, name, bias=True):
        return x @ P[f"{name}.weight"].T + (P[f"{name}.bias"] if bias else 0)

    def norm(x, name):
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * P[f"{name}.weight"] + P[f"{name}.bias"]

    inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq                # (T, rot/2)
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)

    def rotary(x):  # x (B, H, T, hd): NeoX rotate_half on the first rot dims
        xr, xp = x[..., :rot], x[..., rot:]
        rotated = torch.cat((-xr[..., rot // 2:], xr[..., :rot // 2]), -1)
        return torch.cat((xr * cos + rotated * sin, xp), -1)

    def attention(x, name):
        q, k, v = (t.view(*x.shape[:2], H, hd).transpose(1, 2) for t in linear(x, f"{name}.qkv").split(D, -1))
        scores = rotary(q) @ rotary(k).transpose(-1, -2) / math.sqrt(hd)           # (B, H, T, T)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(*x.shape)
        return linear(y, f"{name}.proj")

    def block(x, name):
        mlp = lambda u: linear(F.gelu(linear(u, f"{name}.mlp.fc")), f"{name}.mlp.proj")  # noqa: E731
        a = attention(norm(x, f"{name}.ln_1"), f"{name}.attn")
        if cfg.parallel_residual:
            return x + a + mlp(norm(x, f"{name}.ln_2"))
        return x + a + mlp(norm(x + a, f"{name}.ln_2"))

    def blocks(x, names):
        for name in names:
            x = block(x, name)
        return x

    def route(h, r):  # Eq. 3
        return [linear(h, f"routers.{r}.{kind}").softmax(-1) for kind in ("write", "read")]

    def write_read(slots, h, w, r):  # Eq. 5, slot by slot
        slots = [m + w[..., b:b + 1] * h for b, m in enumerate(slots)]
        return slots, sum(r[..., b:b + 1] * m for b, m in enumerate(slots))

    s = cfg.shape
    h_emb = P["wte.weight"][idx] * (math.sqrt(D) if cfg.scale_embeddings else 1.0)
    h = blocks(h_emb, [f"prelude.{i}" for i in range(s.prelude)])
    if cfg.scheme == "mesh":
        slot0 = h_emb if cfg.slot0 == "scaled" else P["wte.weight"][idx]
        slots = [slot0] + [torch.zeros_like(h_emb)] * (cfg.slots - 1)             # Eq. 2
        if cfg.cycle == "routed":
            slots, h = write_read(slots, h, *route(h, 0))                         # the transitional cycle
        else:
            slots[1] = h                                                          # direct: h(0) = x, in slot 1
    first = 1 if cfg.cycle == "routed" else 0                                     # the first step's router
    h0 = h
    for t, c in enumerate(s.schedule):
        h_m = blocks(h, [f"cores.{c}.{j}" for j in range(s.cores[c])])            # Eq. 4
        if cfg.scheme == "mesh":
            slots, h = write_read(slots, h_m, *route(h, first + t))
        else:
            h = reference_rule(cfg.scheme)(h_m, h, h0, h_emb)
    out = blocks(h, [f"coda.{i}" for i in range(s.coda)])
    return linear(norm(out, "ln_f"), "lm_head", bias=False)


MESH_ALTERNATIVES = dict(cycle="direct", slot0="unscaled")  # router_init only changes the init: test_router_init


@pytest.mark.parametrize("scheme, layout, parallel, alternatives", [(s, l, True, {}) for s, l in CASES] +
                         [("mesh", "1+2R2+1", False, {}), ("anchor", "2+1R3+1", False, {}),
                          ("mesh", "1+2R3+1", True, MESH_ALTERNATIVES)],
                         ids=IDS + ["mesh-sequential", "anchor-sequential", "mesh-direct-unscaled"])
def test_every_scheme_equals_an_independent_implementation(scheme, layout, parallel, alternatives):
    """Logits, loss and every parameter's gradient equal reference_forward's in float64, to 1e-6 relative
    (||ours - ref|| / ||ref||; the rotary tables are built in float32, so not to float64's last digits)."""
    model = build(small(scheme, layout, parallel_residual=parallel, scale_embeddings=scheme != "anchor",
                        **alternatives), scramble=True).double()
    idx, targets = tokens(), tokens(seed=2)
    logits, loss = model(idx, targets)
    ref = reference_forward(model, idx)
    ref_loss = F.cross_entropy(ref.view(-1, V), targets.view(-1))
    params = [p for _, p in model.named_parameters()]
    ours = [logits, loss, *torch.autograd.grad(loss, params)]
    theirs = [ref, ref_loss, *torch.autograd.grad(ref_loss, params)]
    names = ["logits", "loss"] + [name for name, _ in model.named_parameters()]
    for name, a, b in zip(names, ours, theirs, strict=True):
        assert b.norm() > 0, name
        assert (a - b).norm() / b.norm() < 1e-6, name


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_scheme_update_rules(scheme, layout):
    """Recompute h(1..K) from each step's captured output h_m with the schemes' update rules (Section 3, Eq. 2-5)."""
    cfg = small(scheme, layout)
    model = build(cfg, scramble=True)
    with torch.no_grad():
        with capture(model) as cap:
            model(tokens())
    states = dict(cap["states"])
    h_emb, x = states["h_emb"], cap["blocks"][0][2]  # x = f_pre(h_emb)
    pre = h_emb
    for block in model.prelude:
        pre = block(pre, model.rotary(pre.size(1)))
    assert torch.equal(x, pre)
    if scheme == "mesh":
        routers = [(ww, wr) for _, ww, wr in cap["routers"]]
        mem = [h_emb] + [torch.zeros_like(h_emb)] * (cfg.slots - 1)  # Eq. 2
        ww, wr = routers[0]
        mem = [m + ww[..., b:b + 1] * x for b, m in enumerate(mem)]
        expect = sum(wr[..., b:b + 1] * m for b, m in enumerate(mem))
        assert torch.allclose(states["h0"], expect, atol=1e-5)
    else:
        assert torch.equal(states["h0"], x)
    for t in range(cfg.n_steps):
        _, h_in, h_m = cap["blocks"][t + 1]
        h, nxt = states[f"h{t}"], states[f"h{t + 1}"]
        assert torch.equal(h_in, h)
        if scheme != "mesh":
            expect = reference_rule(scheme)(h_m, h, states["h0"], h_emb)
        else:  # Eq. 5 and the read
            ww, wr = routers[t + 1]
            mem = [m + ww[..., b:b + 1] * h_m for b, m in enumerate(mem)]
            expect = sum(wr[..., b:b + 1] * m for b, m in enumerate(mem))
        assert torch.allclose(nxt, expect, atol=1e-5), f"h{t + 1}"


@pytest.mark.parametrize("scale", [True, False])
def test_embedding_scale(scale):
    model = build(small("mesh", scale_embeddings=scale))
    idx = tokens()
    with torch.no_grad():
        with capture(model) as cap:
            model(idx)
    expect = model.wte(idx) * (8.0 if scale else 1.0)  # sqrt(64) (Appendix B)
    assert torch.equal(dict(cap["states"])["h_emb"], expect)


def test_init():
    """Appendix B: std 0.02, output projections 0.02 / sqrt(2 N) with N the *compute* depth."""
    model = build(small("mesh", "2+4R3+2"))
    N = 16  # unrolled, not the 8 unique blocks
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif ".ln_" in f".{name}":
            assert torch.equal(p, torch.ones_like(p)), name
        else:  # Linear weights (routers included) and wte: normal(0, std), checked to 4 standard errors
            std = 0.02 / math.sqrt(2 * N) if name.endswith("proj.weight") else 0.02
            n = p.numel()
            assert abs(p.std().item() / std - 1) < 4 / math.sqrt(2 * n), name
            assert abs(p.mean().item()) < 4 * std / math.sqrt(n), name


# -----------------------------------------------------------------------------
# Weight sharing and the exact equivalences between layouts

def test_shared_core_runs_n_times_counted_once():
    cfg = small("base", "2+4R3+2")
    model = build(cfg)
    calls = {}
    for name, mod in model.named_modules():
        if isinstance(mod, mesh.Block):
            calls[name] = 0
            mod.register_forward_hook(lambda m, i, o, name=name: calls.__setitem__(name, calls[name] + 1))
    with torch.no_grad():
        model(tokens())
    assert calls == {**{f"prelude.{i}": 1 for i in range(2)}, **{f"cores.0.{i}": 3 for i in range(4)},
                     **{f"coda.{i}": 1 for i in range(2)}}
    applied = [*model.prelude, *(b for c in model.schedule for b in model.cores[c]), *model.coda]
    assert len(applied) == cfg.shape.depth == 16 and len({id(b) for b in applied}) == cfg.shape.unique == 8
    D = cfg.n_embd
    assert model.num_params() == vanilla_formula(8, D)  # 8 unique blocks, each counted once
    assert model.num_params() == build(small("base", "2+4+2")).num_params()
    assert model.num_params() == build(small("base", "8")).num_params()
    assert model.num_params() < build(small("base", "2+4+4+4+2")).num_params() == vanilla_formula(16, D)
    # mesh adds only its (K+1) router pairs
    K, B = 3, 6
    assert build(small("mesh", "2+4R3+2")).num_params() == vanilla_formula(8, D) + (K + 1) * 2 * (D * B + B)


def copy_renamed(src, dst, rename):
    sd = {}
    for k, v in src.state_dict().items():
        for new in rename(k):
            sd[new] = v.clone()
    dst.load_state_dict(sd, strict=True)


def assert_same_logits(a, b, idx):
    """Both models give bit-identical logits on idx; returns them."""
    with torch.no_grad():
        la, _ = a(idx)
        lb, _ = b(idx)
    assert torch.equal(la, lb)
    return la


def test_single_step_base_equals_vanilla():
    """P+CR1+Q under `base` is a plain (P+C+Q)-layer decoder with the same weights, exactly."""
    looped = build(small("base", "2+3R1+1"), scramble=True)
    vanilla = build(small("base", "6"), seed=1)

    def rename(k):  # cores.0.j.* -> prelude.(2+j).*, coda.j.* -> prelude.(5+j).*, the rest unchanged
        m = re.fullmatch(r"(cores\.0|coda)\.(\d+)\.(.*)", k)
        return [f"prelude.{(2 if m[1] == 'cores.0' else 5) + int(m[2])}.{m[3]}"] if m else [k]

    copy_renamed(looped, vanilla, rename)
    assert_same_logits(looped, vanilla, tokens())


def test_shared_core_equals_duplicated_cores():
    looped = build(small("base", "2+3R2+1"), scramble=True)
    unrolled = build(small("base", "2+3+3+1"), seed=1)

    def rename(k):
        if k.startswith("cores.0."):
            return [k, "cores.1." + k[len("cores.0."):]]
        return [k]

    copy_renamed(looped, unrolled, rename)
    idx = tokens()
    a = assert_same_logits(looped, unrolled, idx)
    # and the weights really matter: an unrolled model with different second core differs
    with torch.no_grad():
        unrolled.cores[1][0].mlp.fc.weight.mul_(2)
        c, _ = unrolled(idx)
    assert not torch.allclose(a, c, atol=1e-3)


# -----------------------------------------------------------------------------
# The two exact reductions of Appendix D

def one_hot_router(router, write_slot, read_slot, big=1e4):
    """Zero weights, bias +big on one slot: softmax is exactly one-hot in fp32 (exp(-1e4) == 0)."""
    with torch.no_grad():
        for lin, slot in ((router.write, write_slot), (router.read, read_slot)):
            lin.weight.zero_()
            lin.bias.zero_()
            lin.bias[slot] = big


@pytest.mark.parametrize("target", ["base", "residual"])
def test_mesh_reduces_exactly(target):
    layout = "1+2R3+1"
    m = build(small("mesh", layout), scramble=True)
    K, B = m.config.n_steps, m.config.slots
    assert B >= K + 2
    if target == "base":
        # cycle: write x into fresh slot 1, read it (h0 = x); step t: write h_m into fresh slot t+2, read it
        slots = [1] + [t + 2 for t in range(K)]
    else:
        # every write and read uses slot 1: h0 = x, then slot 1 accumulates h(t+1) = h(t) + h_m
        slots = [1] * (K + 1)
    for router, s in zip(m.routers, slots):
        one_hot_router(router, s, s)
    ref = build(small(target, layout), seed=1)
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("routers.")}, strict=True)
    idx = tokens()
    with torch.no_grad():
        with capture(m) as cap:
            a, _ = m(idx)
        b, _ = ref(idx)
    for _, ww, wr in cap["routers"]:  # the routing really is one-hot
        assert ((ww == 0) | (ww == 1)).all() and ((wr == 0) | (wr == 1)).all()
    assert torch.equal(a, b)


def test_direct_cycle_reduces_exactly_to_base():
    """cycle="direct" has K router pairs (no cycle router) and h(0) = x, the prelude output, in slot 1:
    step routers that write and read the fresh slot t+2 give base exactly, and ones that read slot 1
    return x at every step."""
    layout = "1+2R3+1"
    m = build(small("mesh", layout, cycle="direct"), scramble=True)
    K, B = m.config.n_steps, m.config.slots
    assert len(m.routers) == K
    assert m.num_params() == build(small("mesh", layout)).num_params() - 2 * (64 * B + B)
    for t, router in enumerate(m.routers):
        one_hot_router(router, t + 2, t + 2)
    ref = build(small("base", layout), seed=1)
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("routers.")}, strict=True)
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(m(idx)[0], ref(idx)[0])
        for router in m.routers:
            one_hot_router(router, B - 1, 1)  # write to the scratch slot, read slot 1
        with capture(m) as cap:
            m(idx)
    x = dict((name, out) for name, _, out in cap["blocks"])["prelude"]
    states = dict(cap["states"])
    for t in range(K + 1):
        assert torch.equal(states[f"h{t}"], x), t


@pytest.mark.parametrize("cycle", ["routed", "direct"])
def test_router_init_base_starts_near_the_base_scheme(cycle):
    """router_init="base": with the router weights zeroed, the cycle (routed) writes and reads slot 1 and
    loop step t slot t+2 with weight exactly 0.9, the rest 0.1 / (B-1) each; "uniform" gives 1/B."""
    layout = "1+2R3+1"
    for init in ("base", "uniform"):
        m = build(small("mesh", layout, cycle=cycle, router_init=init))
        B = m.config.slots
        with torch.no_grad():
            for router in m.routers:
                router.write.weight.zero_()
                router.read.weight.zero_()
            with capture(m) as cap:
                m(tokens())
        targets = ([1] if cycle == "routed" else []) + [t + 2 for t in range(m.config.n_steps)]
        assert len(cap["routers"]) == len(targets)
        for (name, w_write, w_read), slot in zip(cap["routers"], targets, strict=True):
            expect = torch.full((B,), 0.1 / (B - 1)) if init == "base" else torch.full((B,), 1 / B)
            if init == "base":
                expect[slot] = 0.9
            for w in (w_write, w_read):
                assert torch.allclose(w, expect.expand_as(w), rtol=1e-6, atol=0), (name, init)


@pytest.mark.parametrize("slot0", ["scaled", "unscaled"])
def test_slot0_holds_the_scaled_or_unscaled_embedding(slot0):
    """Slot 0 starts as h_emb = wte(idx) * sqrt(D) or as wte(idx): reading only slot 0 at the cycle gives it."""
    m = build(small("mesh", slot0=slot0))
    one_hot_router(m.routers[0], 1, 0)
    idx = tokens()
    with torch.no_grad():
        with capture(m) as cap:
            m(idx)
    assert torch.equal(dict(cap["states"])["h0"], m.wte(idx) * (8.0 if slot0 == "scaled" else 1.0))


def test_reductions_are_distinct():
    """base and residual differ on the same weights, so the reduction test can tell them apart."""
    layout = "1+2R3+1"
    base = build(small("base", layout), scramble=True)
    res = build(small("residual", layout), seed=1)
    res.load_state_dict(base.state_dict())
    idx = tokens()
    with torch.no_grad():
        assert not torch.allclose(base(idx)[0], res(idx)[0], atol=1e-2)


# -----------------------------------------------------------------------------
# Configs and layouts

@pytest.mark.parametrize("text, expect", [
    ("4+8R2+4", Layout(4, (8,), (0, 0), 4)),
    ("4+8+8+4", Layout(4, (8, 8), (0, 1), 4)),
    ("24", Layout(24, (), (), 0)),
    ("3+6R3+3", Layout(3, (6,), (0, 0, 0), 3)),
    ("2+4R2+3+1", Layout(2, (4, 3), (0, 0, 1), 1)),
    ("0+2R2+0", Layout(0, (2,), (0, 0), 0)),
])
def test_parse_layout(text, expect):
    assert parse_layout(text) == expect


def test_layout_depths():
    assert (parse_layout("4+8R2+4").depth, parse_layout("4+8R2+4").unique) == (24, 16)
    assert (parse_layout("4+8+8+4").depth, parse_layout("4+8+8+4").unique) == (24, 24)
    assert (parse_layout("24").depth, parse_layout("24").unique) == (24, 24)
    assert (parse_layout("3+6R3+3").depth, parse_layout("3+6R3+3").unique) == (24, 12)


BAD = [
    ("layout-bad-segment", dict(layout="4+xR2+4"), r"bad layout '4\+xR2\+4'.*segment 'xR2' is not 'C' or 'CRN'"),
    ("layout-zero-steps", dict(layout="4+8R0+4"), r"segment '8R0' needs at least one block and one step"),
    ("layout-zero-core", dict(layout="4+0+4"), r"segment '0' needs at least one block"),
    ("layout-lowercase-r", dict(layout="4+8r2+4"), r"segment '8r2' is not"),
    ("layout-empty-ends", dict(layout="+8R2+"), r"bad layout '\+8R2\+'.*empty segment"),
    ("layout-empty", dict(layout=""), r"bad layout ''.*empty segment"),
    ("layout-zero", dict(layout="0"), r"bad layout '0'.*one positive block count"),
    ("layout-word", dict(layout="twelve"), r"bad layout 'twelve'"),
    ("layout-loop-coda", dict(layout="4+8R2"), r"prelude and coda are plain block counts"),
    ("layout-superscript", dict(layout="\u00b2"), r"bad layout '\u00b2'.*one positive block count"),
    ("layout-superscript-coda", dict(layout="2+4R2+\u00b2"), r"prelude and coda are plain block"),
    ("scheme", dict(scheme="mesj"), r"unknown scheme 'mesj' \(did you mean 'mesh'\?\)"),
    ("mesh-vanilla", dict(scheme="mesh", layout="12"), r"scheme 'mesh' needs loop steps.*'12'"),
    ("anchor-vanilla", dict(scheme="anchor", layout="12"), r"scheme 'anchor' needs loop steps"),
    ("residual-vanilla", dict(scheme="residual", layout="12"), r"scheme 'residual' needs loop steps"),
    ("anchor_emb-vanilla", dict(scheme="anchor_emb", layout="12"), r"scheme 'anchor_emb' needs loop steps"),
    ("n_slots", dict(n_slots=0), r"n_slots=0 must be at least 1"),
    ("cycle", dict(cycle="routd"), r"unknown cycle 'routd' \(did you mean 'routed'\?\); expected one of routed, direct"),
    ("slot0-base", dict(scheme="base", slot0="unscaled"), r"slot0='unscaled' is a MeSH setting, but scheme is 'base'"),
    ("router_init-slots", dict(router_init="base", n_slots=3), r"router_init='base' .* needs n_slots >= K\+2 = 4, not 3"),
    ("direct-slots", dict(cycle="direct", n_slots=1), r"cycle='direct' .* needs n_slots >= 2, not 1"),
    ("heads", dict(n_embd=64, n_head=5), r"n_embd=64 is not divisible by n_head=5"),
    ("rotary-odd", dict(n_embd=80, n_head=4), r"rotary dims .* = 5 must be even"),
    ("vocab", dict(vocab_size=0), r"vocab_size=0 must be a positive integer"),
    ("dropout", dict(dropout=1.0), r"dropout=1.0 must be in \[0, 1\)"),
    ("rotary-over", dict(rotary_pct=1.5), r"rotary_pct=1.5 must be in \[0, 1\]"),
    ("rotary-negative", dict(rotary_pct=-0.25), r"rotary_pct=-0.25 must be in \[0, 1\]"),
]


@pytest.mark.parametrize("kw, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config(kw, match):
    with pytest.raises(mesh.ConfigError, match=match) as e:  # not int()'s ValueError
        small(**kw)
    assert "\n" not in str(e.value)


def test_rotary_even_is_fine():
    assert small(n_embd=96, n_head=4).rotary_dims == 6


@pytest.mark.parametrize("n_embd, n_head, pct", [(64, 4, 0.25), (96, 4, 0.25), (64, 2, 1.0), (64, 4, 0.0)])
def test_rotary_rotates_pairs_by_position_and_passes_the_rest(n_embd, n_head, pct):
    """Rotary, dim by dim: the pair (j, j + rot/2) of a head turns by the angle pos * base^(-2j/rot), the dims
    past rot pass through unchanged, and q . k depends only on the distance between positions."""
    cfg = small(n_embd=n_embd, n_head=n_head, rotary_pct=pct, block_size=16)
    rot, hd = cfg.rotary_dims, cfg.head_dim
    pos = torch.tensor([0, 3, 15])
    x = torch.randn(2, n_head, 3, hd)
    y = mesh.apply_rotary(x, *mesh.Rotary(cfg)(3, pos))
    assert torch.equal(y[..., rot:], x[..., rot:])
    for j in range(rot // 2):
        angle = pos.double() * cfg.rotary_base ** (-2 * j / rot)
        c, s = angle.cos().float(), angle.sin().float()
        a, b = x[..., j], x[..., j + rot // 2]
        torch.testing.assert_close(y[..., j], a * c - b * s, atol=1e-5, rtol=0)
        torch.testing.assert_close(y[..., j + rot // 2], b * c + a * s, atol=1e-5, rtol=0)
    q, k = torch.randn(hd), torch.randn(hd)
    tables = mesh.Rotary(cfg)(4, torch.tensor([2, 5, 9, 12]))
    rq, rk = (mesh.apply_rotary(t.expand(4, hd), *tables) for t in (q, k))
    torch.testing.assert_close((rq[1] * rk[0]).sum(), (rq[3] * rk[2]).sum(), atol=1e-4, rtol=0)  # both 3 apart


def test_cache_needs_positions():
    model = build(small())
    cache = KVCache(model, 1, model.config.block_size)
    with pytest.raises(ValueError, match="decoding with a KVCache needs pos"):
        model(tokens(1, 4), cache=cache)


@pytest.mark.parametrize("call, match", [
    (lambda: Config.from_preset("pythia-14b"), r"unknown preset 'pythia-14b' \(did you mean 'pythia-1.4b'\?\)"),
    (lambda: Config.from_preset("classroom", scheme="mesj"), r"did you mean 'mesh'"),
    (lambda: Config.from_dict({"n_embd": 64, "n_heads": 4}), r"unknown config field\(s\) n_heads"),
    (lambda: Config.from_preset("pythia-160m", nlayer=3), r"unknown config field\(s\) nlayer"),
], ids=["preset", "preset-scheme", "from_dict-field", "override-field"])
def test_bad_names(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_from_preset_overrides():
    cfg = Config.from_preset("pythia-160m", layout="2+4R2+2", scheme="mesh", block_size=256, vocab_size=None)
    assert (cfg.n_embd, cfg.n_head, cfg.layout, cfg.scheme, cfg.block_size) == (768, 12, "2+4R2+2", "mesh", 256)
    assert cfg.vocab_size == 50304  # None means "keep the default"
    assert Config.from_preset("pythia-160m").layout == "12"
    assert Config.from_preset("pythia-6.9b").vocab_size == 50432
    assert Config.from_preset("pythia-12b").vocab_size == 50688
    c = Config.from_preset("classroom")
    assert (c.layout, c.scheme, c.vocab_size, c.block_size) == ("2+4R2+2", "mesh", 65, 64)
    assert Config.from_preset("classroom", layout="2+4+2").layout == "2+4+2"


def test_config_round_trip():
    for cfg in (Config.from_preset("classroom"), small("mesh", "1+1+1R2+1", n_slots=7, dropout=0.1)):
        d = cfg.to_dict()
        assert json.loads(json.dumps(d)) == d  # plain data
        back = Config.from_dict(d)
        assert back == cfg and back.shape == cfg.shape and back.slots == cfg.slots


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_dropout_only_in_training(p):
    model = build(small("mesh", dropout=p))
    idx = tokens()
    with torch.no_grad():
        model.train()
        torch.manual_seed(0)
        a, _ = model(idx)
        torch.manual_seed(1)
        b, _ = model(idx)
        model.eval()
        c, _ = model(idx)
        plain, _ = build(small("mesh"))(idx)  # the same weights without dropout
    assert torch.equal(a, b) == (p == 0.0)  # p > 0 drops different units on each call
    assert torch.equal(a, c) == (p == 0.0)  # eval never drops
    assert torch.equal(c, plain)


def test_dropout_drops_each_branch_of_a_block():
    """Dropout acts in attention and on each residual branch: with attention's off, a block in training is
    x + dropout(attn(ln_1 x)) + dropout(mlp(ln_2 x)), the masks drawn in that order."""
    cfg = small(dropout=0.3)
    block = mesh.Block(cfg).train()
    block.attn.dropout = 0.0
    x, rope = torch.randn(2, 8, cfg.n_embd), mesh.Rotary(cfg)(8)
    torch.manual_seed(0)
    out = block(x, rope)
    torch.manual_seed(0)
    a = F.dropout(block.attn(block.ln_1(x), rope), 0.3)
    assert torch.equal(out, x + a + F.dropout(block.mlp(block.ln_2(x)), 0.3))


def test_evaluate_is_each_batchs_eval_loss_and_keeps_the_mode():
    """evaluate(): each batch's loss in eval mode (no dropout), the model left in the mode it was in."""
    model = build(small("mesh", dropout=0.3), scramble=True)
    plain = build(small("mesh"), scramble=True)
    batches = [(tokens(seed=s), tokens(seed=s + 1)) for s in (1, 3)]
    with torch.no_grad():
        expect = [plain(x, y)[1].item() for x, y in batches]
    for training in (True, False):
        model.train(training)
        assert model.evaluate(batches) == expect
        assert model.training == training


# -----------------------------------------------------------------------------
# Optimizer

def test_optimizer_groups():
    model = build(small("mesh"))
    opt = model.configure_optimizer(weight_decay=0.1, lr=1e-3)
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())  # each exactly once
    assert len(seen) == len(set(seen))
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    for n, p in model.named_parameters():
        assert wd[id(p)] == (0.1 if p.dim() >= 2 else 0.0), n
    assert wd[id(model.routers[0].write.weight)] == 0.1 and wd[id(model.routers[0].write.bias)] == 0.0
    assert all(g["lr"] == 1e-3 and g["betas"] == (0.9, 0.95) for g in opt.param_groups)  # Appendix B


@pytest.mark.parametrize("scheme", ["residual", "mesh"])
def test_state_stream_stays_float32_under_bf16_autocast(scheme):
    """[choice] Under bf16 autocast MeSH's buffer and the states read from it stay float32, as the residual
    stream of the other schemes does; its logits are as close to float32's as the baselines' are."""
    model = build(small(scheme), scramble=True)
    idx = tokens(2, 16)
    with torch.no_grad():
        ref, _ = model(idx)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with capture(model) as cap:
                low, _ = model(idx)
    assert [t.dtype for _, t in cap["states"]] == [torch.float32] * len(cap["states"])
    base = build(small("base"), scramble=True)  # bf16 rounds inside the blocks, as base's do (by kernels
    with torch.no_grad():                        # whose rounding differs by torch version)
        base_ref, _ = base(idx)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            base_low, _ = base(idx)
    gap, base_gap = ((a.float() - b).abs().max() for a, b in ((low, ref), (base_low, base_ref)))
    assert 0 < gap < 1.5 * base_gap < 0.05
    mem, w, h = torch.randn(2, 3, 4, 8), torch.softmax(torch.randn(2, 3, 4), -1), torch.randn(2, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = mesh.buffer_write(mem, w, h), mesh.buffer_read(mem, w)
    assert all(o.dtype == torch.float32 for o in outs)
    assert torch.equal(outs[0], mesh.buffer_write(mem, w, h))  # the very float32 op, not a rounded one


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_cache_under_bf16_autocast(scheme):
    """Under autocast the rotary tables and the KV cache come in autocast's dtype (compute_dtype): the cache
    holds the blocks' bf16 keys as they are, and prefill plus one-token steps give the full forward's logits
    up to bf16 rounding."""
    model = build(small(scheme), scramble=True)
    seq = tokens(2, 20)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.compute_dtype("cpu") == torch.bfloat16 and model.compute_dtype("cuda") == torch.float32
        assert [t.dtype for t in model.rotary(4, dtype=model.compute_dtype("cpu"))] == [torch.bfloat16] * 2
        full, _ = model(seq)
        cache = KVCache(model, 2, model.config.block_size)
        assert cache.k.dtype == cache.v.dtype == cache.mask.dtype == torch.bfloat16
        steps = [model(seq[:, :12], pos=torch.arange(12), cache=cache)[0]]
        steps += [model(seq[:, t:t + 1], pos=torch.tensor([t]), cache=cache)[0] for t in range(12, 20)]
    assert cache.k.abs().amax(dim=(1, 2, 4))[:, :20].all()  # every position of every layer written
    assert (torch.cat(steps, dim=1).float() - full.float()).abs().max() < 0.05
    assert KVCache(model, 2, 16).k.dtype == model.compute_dtype("cpu") == torch.float32


@pytest.mark.slow
def test_compiled_equals_uncompiled_without_recompiles():
    """torch.compile (Dynamo and AOT autograd; the aot_eager backend, so no C++ kernels to build here) traces
    the model: loss, gradients and cached greedy decoding equal the uncompiled model's, and another train
    step and a longer decode (every cache position a new value, not a new shape) build no new graph."""
    torch._dynamo.reset()
    eager = build(small("mesh", "1+1R2+1", n_embd=32), scramble=True).train()
    compiled = build(small("mesh", "1+1R2+1", n_embd=32), scramble=True).train()
    compiled.compile(backend="aot_eager")
    idx, targets = tokens(2, 16), tokens(2, 16, seed=2)
    losses = [model(idx, targets)[1] for model in (eager, compiled)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0, msg=name)
    prompt = idx[:1, :4]
    assert torch.equal(compiled.generate(prompt, 3, temperature=0), eager.generate(prompt, 3, temperature=0))
    graphs = lambda: counters["stats"]["unique_graphs"]  # noqa: E731 (tools/bench.py's count too)
    built = graphs()
    compiled(idx, targets)[1].backward()
    assert torch.equal(compiled.generate(prompt, 12, temperature=0), eager.generate(prompt, 12, temperature=0))
    assert graphs() == built
    with torch.no_grad():  # full recompute (no cache) at every length: one graph, T dynamic
        for T in range(5, 12):
            compiled.eval()(idx[:, :T])
    assert graphs() <= built + 1


def test_forward_refuses_sequences_longer_than_block_size():
    model = build(small(block_size=16))
    with pytest.raises(ValueError, match=r"idx has 17 positions but block_size is 16; pass at most the last 16"):
        model(tokens(1, 17))
    assert model(tokens(1, 16))[0].shape == (1, 16, model.config.vocab_size)


def test_sample_draws_from_softmax_of_logits_over_temperature(monkeypatch):
    """What sample() hands torch.multinomial: softmax(logits / T), with all but the top_k zeroed."""
    seen = []
    real = torch.multinomial
    monkeypatch.setattr(torch, "multinomial", lambda p, **kw: seen.append(p) or real(p, **kw))
    logits = torch.tensor([[2.0, 0.0, -1.0, 1.0]])
    mesh.sample(logits, 0.5)
    mesh.sample(logits, 2.0, top_k=2)
    torch.testing.assert_close(seen[0], torch.softmax(logits / 0.5, -1))
    torch.testing.assert_close(seen[1], torch.softmax(torch.tensor([[1.0, -float("inf"), -float("inf"), 0.5]]), -1))


def test_sample_tiny_temperature_is_greedy():
    """The maximum is shifted to 0 before dividing by the temperature: 1e-40 gives argmax, not inf/inf = nan."""
    logits = torch.tensor([[10.0, 0.0, 9.0], [-5.0, 3.0, 2.0]])
    assert mesh.sample(logits, 1e-40).tolist() == [[0], [1]]
    assert mesh.sample(logits, 1e-40, top_k=2).tolist() == [[0], [1]]
    assert mesh.sample(logits, 1e-320).tolist() == [[0], [1]]  # 0 as float32: greedy, not 0/0
    assert mesh.sample(logits * 10, 1e-37).tolist() == [[0], [1]]  # unshifted, 100 / 1e-37 is inf: nan


# -----------------------------------------------------------------------------
# Generation and the KV cache

def test_generate_shape_and_determinism():
    model = build(small("mesh"), scramble=True)
    idx = tokens(2, 5)
    out = model.generate(idx, 7, temperature=0)
    assert out.shape == (2, 12) and out.dtype == idx.dtype
    assert torch.equal(out[:, :5], idx)
    assert torch.equal(out, model.generate(idx, 7, temperature=0))
    torch.manual_seed(3)
    a = model.generate(idx, 7, temperature=1.0, top_k=5)
    torch.manual_seed(3)
    assert torch.equal(a, model.generate(idx, 7, temperature=1.0, top_k=5))
    assert torch.equal(model.generate(idx, 7, temperature=1.0, top_k=1), out)  # top-1 sampling is greedy


@pytest.mark.parametrize("kw, match", [(dict(temperature=-1.0), "temperature=-1.0 must be 0"),
                                       (dict(temperature=math.nan), "temperature=nan must be 0"),
                                       (dict(top_k=0), "top_k=0 at least 1")])
def test_generate_refuses_a_negative_temperature_and_top_k_0(kw, match):
    """A negative temperature would sample the least likely tokens, top_k=0 none: both refused by name."""
    with pytest.raises(mesh.ConfigError, match=re.escape(match)):
        build(small()).generate(tokens(1, 4), 1, **kw)


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_cache_greedy_matches_recompute(scheme, layout):
    model = build(small(scheme, layout, block_size=16), scramble=True)
    idx = tokens(2, 10)
    with_cache = model.generate(idx, 20, temperature=0, use_cache=True)  # runs past block_size 16
    without = model.generate(idx, 20, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 30)
    assert torch.equal(with_cache, without)
    assert len(set(with_cache[0, 10:].tolist())) > 1  # not a degenerate constant sequence


@pytest.mark.parametrize("scheme, layout, parallel", [(s, l, True) for s, l in CASES] +
                         [("base", "4", False), ("mesh", "1+2R2+1", False)],
                         ids=IDS + ["base-4-sequential", "mesh-1+2R2+1-sequential"])
def test_cache_logits_match_full_forward(scheme, layout, parallel):
    model = build(small(scheme, layout, parallel_residual=parallel), scramble=True)
    seq = tokens(2, 20)
    P = 12
    with torch.no_grad():
        full, _ = model(seq)
        cache = KVCache(model, 2, model.config.block_size)
        assert cache.k.shape[0] == model.config.shape.depth  # one entry per applied block
        pre, _ = model(seq[:, :P], pos=torch.arange(P), cache=cache)
        torch.testing.assert_close(pre, full[:, :P], atol=1e-5, rtol=0)
        for t in range(P, seq.size(1)):
            step, _ = model(seq[:, t:t + 1], pos=torch.tensor([t]), cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=0)
