"""
Tests for the Hugging Face bridges: hf.load_hf (GPT-NeoX / Pythia import) and the
lm-evaluation-harness model in lm_eval_mesh.py. Each part is skipped, with the reason, when its
optional package (transformers, lm_eval) is missing; CI installs both.

    python -m pytest -q tests/test_hf.py --all  # marked slow: the fast tier leaves it out
"""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from support.checkpoint import CheckpointError
from support.checkpoint import load as load_checkpoint
from support.checkpoint import save as save_checkpoint
from support.pretrained import load_hf
from conftest import HANG, ROOT, train_bpe
from mesh import Config, RecursiveGPT

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all


# -----------------------------------------------------------------------------
# GPT-NeoX import: logits of a random (perturbed) HF model equal ours after conversion


def hf_neox(tmp_path, parallel, **overrides):
    """A small random GPTNeoXForCausalLM whose LayerNorms and biases are far from their init, saved to disk."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(**{**dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                               intermediate_size=256, vocab_size=101, max_position_embeddings=64,
                                               rotary_pct=0.25, use_parallel_residual=parallel), **overrides})
    cfg._attn_implementation = "eager"
    hf = transformers.GPTNeoXForCausalLM(cfg).eval()
    with torch.no_grad():  # LayerNorm weights around 1, all biases nonzero, matrices ~ 1/sqrt(fan_in)
        for name, p in hf.named_parameters():
            norm = "layernorm" in name or "layer_norm" in name
            p.copy_(1 + 0.3 * torch.randn_like(p) if norm and name.endswith("weight") else
                    0.1 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) / math.sqrt(p.size(1)))
    path = str(tmp_path / ("parallel" if parallel else "sequential"))
    hf.save_pretrained(path)
    return hf, path


@pytest.mark.parametrize("parallel", [True, False])
def test_from_pretrained_matches_transformers_logits(tmp_path, parallel):
    hf, path = hf_neox(tmp_path, parallel)
    model = load_hf(path).eval()
    cfg = model.config
    assert isinstance(cfg, Config) and Config.from_dict(cfg.to_dict()) == cfg  # a plain, saveable Config
    assert (cfg.layout, cfg.scheme, cfg.scale_embeddings, cfg.parallel_residual) == ("2", "base", False, parallel)
    assert (cfg.vocab_size, cfg.block_size, cfg.n_embd, cfg.n_head, cfg.rotary_dims) == (101, 64, 64, 4, 4)
    idx = torch.randint(0, 101, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        ours, _ = model(idx)
    assert ref.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    assert (ours - ref).abs().max().item() < 1e-4


def test_from_pretrained_rotary_settings(tmp_path):
    """A rotary share and base other than Pythia's come through the import (config.json, either spelling)."""
    hf, path = hf_neox(tmp_path, True, rotary_pct=0.5, rotary_emb_base=500)
    model = load_hf(path).eval()
    assert (model.config.rotary_dims, model.config.rotary_base) == (8, 500.0)
    idx = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() < 1e-4


def test_from_pretrained_reads_pytorch_bin(tmp_path, monkeypatch):
    """A .bin (old Pythia uploads) is read with weights_only=True; extra buffers in it are ignored; torch's
    warnings while it loads are said."""
    hf, path = hf_neox(tmp_path, True)
    from safetensors.torch import load_file
    sd = load_file(os.path.join(path, "model.safetensors"))
    sd["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)  # as in old GPT-NeoX saves
    torch.save(sd, os.path.join(path, "pytorch_model.bin"))
    os.remove(os.path.join(path, "model.safetensors"))
    idx = torch.arange(30).view(1, 30)
    with torch.no_grad():
        assert (load_hf(path)(idx)[0] - hf(idx).logits).abs().max().item() < 1e-4
        torch.save(hf.state_dict(), os.path.join(path, "pytorch_model.bin"))  # transformers 5's names: lm_head
        assert (load_hf(path)(idx)[0] - hf(idx).logits).abs().max().item() < 1e-4
    load = torch.load

    def warns(*args, **kwargs):
        warnings.warn("torch says so", UserWarning)
        return load(*args, **kwargs)
    monkeypatch.setattr(torch, "load", warns)
    with pytest.warns(UserWarning, match="^torch says so$"):
        load_hf(path)


def test_from_pretrained_tied_embeddings(tmp_path):
    hf, path = hf_neox(tmp_path, True, tie_word_embeddings=True)
    model = load_hf(path)
    assert torch.equal(model.lm_head.weight, model.wte.weight)
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()  # untied from here on, as Pythia's


def test_from_pretrained_builds_on_the_device_asked(tmp_path):
    """load_hf(path, device): every weight on device, as its rotary tables (lm_eval_mesh.py's
    pretrained= with --device cuda); meta stands in for a GPU here."""
    hf, path = hf_neox(tmp_path, True, tie_word_embeddings=True)
    model = load_hf(path, "meta")
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}


@pytest.mark.parametrize("field, value", [("layer_norm_eps", 1e-6), ("intermediate_size", 100),
                                          ("hidden_act", "gelu_new"), ("attention_bias", False),
                                          ("rope_type", "linear")])
def test_from_pretrained_refuses_unsupported_config(tmp_path, field, value):
    _, path = hf_neox(tmp_path, True)
    with open(os.path.join(path, "config.json")) as f:
        hf_cfg = json.load(f)
    (hf_cfg.setdefault("rope_parameters", {}) if field == "rope_type" else hf_cfg)[field] = value  # transformers 5
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_cfg, f)
    with pytest.raises(CheckpointError, match=f"{field}={value!r} is not supported"):
        load_hf(path)


def test_from_pretrained_refuses_bad_folders(tmp_path):
    with pytest.raises(CheckpointError, match="no GPT-NeoX config.json"):
        load_hf(str(tmp_path))
    _, path = hf_neox(tmp_path, True)
    with open(os.path.join(path, "config.json")) as f:
        hf_cfg = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**hf_cfg, "vocab_size": 100}, f)
    with pytest.raises(CheckpointError, match=r"gpt_neox.embed_in.weight has shape \(101, 64\), not \(100, 64\) "
                                              r"as config.json gives: the weights are of another model$"):
        load_hf(path)
    from safetensors.torch import load_file, save_file
    weights = os.path.join(path, "model.safetensors")
    gone = ("embed_out.weight", "gpt_neox.final_layer_norm.bias")  # the head named as the file names it
    save_file({k: v for k, v in load_file(weights).items() if k not in gone}, weights)
    with pytest.raises(CheckpointError, match=r": 2 weight\(s\) missing, e.g. embed_out.weight$"):
        load_hf(path)
    os.remove(weights)
    with pytest.raises(CheckpointError, match="no weights; expected model.safetensors"):
        load_hf(path)


def test_pythias_spelling_defaults_and_float16_are_read_as_transformers_reads_them(tmp_path):
    """A folder as Pythia's on the Hub: float16 weights, config.json in transformers 4's names (a
    rotary_pct of 1.0: all of a head rotates), then without the fields transformers defaults: the
    import is float32 with transformers' logits. A config.json without model_type is refused."""
    from safetensors.torch import load_file, save_file
    transformers = pytest.importorskip("transformers")
    _, path = hf_neox(tmp_path, False)
    weights, config_json = os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
    save_file({k: v.half() for k, v in load_file(weights).items()}, weights)
    with open(config_json) as f:
        config = json.load(f)
    for k in ("rope_parameters", "max_position_embeddings", "use_parallel_residual"):
        del config[k]
    idx = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    for old in [dict(rotary_pct=1.0, rotary_emb_base=500), {}]:
        with open(config_json, "w") as f:
            json.dump({**config, **old}, f)
        hf = transformers.GPTNeoXForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
        model = load_hf(path).eval()
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert model.config.block_size == hf.config.max_position_embeddings
        with torch.no_grad():
            assert (model(idx)[0] - hf(idx).logits).abs().max().item() < 1e-4
    del config["model_type"]
    with open(config_json, "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match="model_type=None is not supported"):
        load_hf(path)


def test_gpt2_data_on_an_import_without_its_tokenizer_is_noted_by_rank_0_alone(tmp_path, capsys, monkeypatch):
    """A GPT-NeoX folder without tokenizer.json (Pythia's weights alone) fine-tuned on GPT-2 data: one note
    that the ids mean other tokens to it, from rank 0 only; data of another tokenizer: nothing said."""
    from types import SimpleNamespace as NS
    from support.pretrained import check_tokens
    note = ("note: Pythia checkpoints use the GPT-NeoX tokenizer, not GPT-2's; the ids of a GPT-2 dataset mean "
            "other tokens to them\n")
    for kind, rank, said in [("gpt2", "0", note), ("char", "0", ""), ("gpt2", "1", "")]:
        monkeypatch.setenv("RANK", rank)
        check_tokens({"source": {"init_from": f"hf:{tmp_path}"}},
                     NS(tokenizer=NS(kind=kind, identity=kind), name="d", record={}))
        assert capsys.readouterr().out == said


@pytest.fixture(scope="module")
def neox_folder(tmp_path_factory):
    return hf_neox(tmp_path_factory.mktemp("neox"), True)[1]


def nan_at(i):
    return lambda w: w.flatten().index_fill(0, torch.tensor([i]), math.nan).view(w.shape)


FIELD, ABOVE_0, NOT_FINITE = "config.json's", "a finite number above 0", "holds NaN, inf or non-float values"
BROKEN_HF = [  # (a field of config.json, or a weight: its new value, or a change of it; the words of the one line)
    ("rope_parameters", [10000], f"{FIELD} rope_parameters is [10000], not an object"),
    ("rope_parameters", "default", f'{FIELD} rope_parameters is "default", not an object'),
    ("rope_parameters.partial_rotary_factor", None, f"{FIELD} rope_parameters.partial_rotary_factor is null, "
                                                    f"not a number from 0 to 1"),
    ("rope_parameters.partial_rotary_factor", "0.25", f'{FIELD} rope_parameters.partial_rotary_factor is "0.25", '
                                                      f'not a number from 0 to 1'),
    ("rope_parameters.rope_theta", -10000, f"{FIELD} rope_parameters.rope_theta is -10000, not {ABOVE_0}"),
    ("rope_parameters.rope_theta", 0, f"{FIELD} rope_parameters.rope_theta is 0, not {ABOVE_0}"),
    ("rope_parameters.rope_theta", None, f"{FIELD} rope_parameters.rope_theta is null, not {ABOVE_0}"),
    ("rope_parameters.rope_theta", "1e4", f'{FIELD} rope_parameters.rope_theta is "1e4", not {ABOVE_0}'),
    ("rope_parameters.rope_type", None, "rope_type=None is not supported (nanoMeSH has rope_type='default')"),
    ("rotary_emb_base", -1.5, f"{FIELD} rotary_emb_base is -1.5, not {ABOVE_0}"),
    ("rotary_pct", True, f"{FIELD} rotary_pct is true, not a number from 0 to 1"),
    ("hidden_act", ["gelu"], "hidden_act=['gelu'] is not supported (nanoMeSH has hidden_act='gelu')"),
    ("layer_norm_eps", "1e-5", f'{FIELD} layer_norm_eps is "1e-5", not {ABOVE_0}'),
    ("use_parallel_residual", "false", f'{FIELD} use_parallel_residual is "false", not true or false'),
    ("tie_word_embeddings", 0, f"{FIELD} tie_word_embeddings is 0, not true or false"),
    ("attention_bias", None, f"{FIELD} attention_bias is null, not true or false"),
    ("num_hidden_layers", 0, f"{FIELD} num_hidden_layers is 0, not an integer above 0"),
    ("hidden_size", True, f"{FIELD} hidden_size is true, not an integer above 0"),  # a bool is no number
    ("gpt_neox.layers.1.mlp.dense_h_to_4h.weight", lambda w: w[:, :32],
     "gpt_neox.layers.1.mlp.dense_h_to_4h.weight has shape (256, 32), not (256, 64) as config.json gives: "
     "the weights are of another model"),
    ("gpt_neox.layers.0.attention.query_key_value.weight", lambda w: w[:100],
     "gpt_neox.layers.0.attention.query_key_value.weight has shape (100, 64), not (192, 64) as config.json "
     "gives: the weights are of another model"),
    ("gpt_neox.layers.0.attention.dense.bias", nan_at(3),
     f"gpt_neox.layers.0.attention.dense.bias (torch.float32) {NOT_FINITE}; download the weights again"),
    ("embed_out.weight", lambda w: w.half().index_fill(0, torch.tensor([7]), math.inf),
     f"embed_out.weight (torch.float16) {NOT_FINITE}; download the weights again"),
    ("gpt_neox.final_layer_norm.bias", lambda w: w.long(),
     f"gpt_neox.final_layer_norm.bias (torch.int64) {NOT_FINITE}; download the weights again"),
]


@pytest.mark.parametrize("key, value, words", BROKEN_HF, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BROKEN_HF)])
def test_broken_hf_folders_are_one_line(neox_folder, data_root, tmp_path, capsys, key, value, words):
    """A config.json field of the wrong JSON type or range, a weight of another shape or not finite: train.py
    --init_from=hf:PATH names it in one line, exit 2, before anything is written."""
    import shutil
    import train
    from safetensors.torch import load_file, save_file
    from conftest import snapshot
    path = shutil.copytree(neox_folder, tmp_path / "neox")
    if callable(value):
        sd = load_file(path / "model.safetensors")
        save_file({**sd, key: value(sd[key]).contiguous()}, path / "model.safetensors")
    else:
        config = json.loads((path / "config.json").read_text())
        *within, field = key.split(".")
        (config[within[0]] if within else config)[field] = value
        (path / "config.json").write_text(json.dumps(config))
    before = snapshot(tmp_path, data_root)
    capsys.readouterr()
    assert train.main([f"--init_from=hf:{path}", f"--data_root={data_root}", "--dataset=tiny",
                       f"--out_dir={tmp_path / 'out'}", "--max_iters=2"]) == 2
    assert capsys.readouterr().err == f"train.py: error: cannot import {path}: {words}\n"
    assert snapshot(tmp_path, data_root) == before


def test_a_refused_bin_says_no_torch_warning(neox_folder, data_root, tmp_path):
    """A pytorch_model.bin pickled with protocol 4: torch warns of the protocol, then refuses it; the
    refusal alone is said. A warning of a file that loads is still said (support/pretrained.py)."""
    import pickle
    import shutil
    path = tmp_path / "neox"
    path.mkdir()
    shutil.copy(os.path.join(neox_folder, "config.json"), path)
    with open(path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"gpt_neox.embed_in.weight": torch.zeros(3)}, f, protocol=4)
    r = subprocess.run([sys.executable, "train.py", f"--init_from=hf:{path}", f"--data_root={data_root}",
                        "--dataset=tiny", f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=HANG)
    assert (r.returncode, r.stderr) == (2, f"train.py: error: cannot import {path}: {path}/pytorch_model.bin is "
                                           f"not a file of weights nanoMeSH reads (it holds objects other than "
                                           f"tensors; loading never runs code)\n")
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# lm-evaluation-harness: the `mesh` model's numbers equal direct computations with the model

CHARS = "\n abcdefghijklmnopqrstuvwxyz?.,"


@pytest.fixture(scope="module")
def mesh_lm(tmp_path_factory):
    """A MeshLM over a small random MeSH checkpoint trained (nominally) on a character dataset."""
    pytest.importorskip("lm_eval", reason="lm_eval is not installed: pip install lm_eval")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")  # everything below is local
    from tools import lm_eval_mesh
    root = tmp_path_factory.mktemp("lm_eval")
    os.makedirs(root / "data" / "tiny")
    with open(root / "data" / "tiny" / "meta.json", "w") as f:
        json.dump({"tokenizer": "char", "chars": CHARS, "vocab_size": len(CHARS), "dtype": "uint16"}, f)
    torch.manual_seed(0)
    cfg = Config(vocab_size=len(CHARS), block_size=16, n_embd=32, n_head=4, layout="1+1R2+1", scheme="mesh")
    model = RecursiveGPT(cfg)
    with torch.no_grad():  # far from uniform predictions, so greedy checks and accuracies mean something
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    save_checkpoint({"model": model.state_dict(), "model_config": cfg.to_dict(), "iter_num": 0,
                     "train_config": {"dataset": "tiny", "data_root": str(root / "data")}},
                    str(root / "out" / "ckpt.pt"))
    lm = lm_eval_mesh.MeshLM(out_dir=str(root / "out"), batch_size=3)
    return lm, model.eval(), root


def enc(text):
    return [CHARS.index(c) for c in text]


def direct_loglikelihood(model, context, continuation):
    """Sum of log p(continuation token | everything before it), one unpadded sequence, the last
    block_size tokens as the model's window; an empty context is conditioned on a newline."""
    ctx, cont = enc(context or "\n"), enc(continuation)
    tokens = (ctx + cont)[-(model.config.block_size + 1):]
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens[:-1]]))
    logp = F.log_softmax(logits[0], dim=-1)
    n = len(tokens) - len(cont)
    return sum(logp[n - 1 + j, c].item() for j, c in enumerate(cont)), logp[n - 1:].argmax(-1).tolist() == cont


def requests(kind, *args):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def test_loglikelihood_equals_direct_sum(mesh_lm):
    lm, model, _ = mesh_lm
    with torch.no_grad():
        best = model(torch.tensor([enc("the cat")]))[0][0, -1].argmax().item()  # greedy next character
    pairs = [("the cat", " sat on the mat."), ("a", "b"), ("", "hello"), ("the cat", CHARS[best]),
             ("why is the sky blue? because of light scattering", ", mostly."),  # 58 chars > block_size 16
             ("xyz", " qq"), ("xyz", "")]
    got = lm.loglikelihood(requests("loglikelihood", *pairs))
    for (context, continuation), (ll, greedy) in zip(pairs, got):
        want, want_greedy = direct_loglikelihood(model, context, continuation)
        assert ll == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    assert got[3][1] is True and got[0][1] is False
    assert lm.loglikelihood(requests("loglikelihood", ("a", ""))) == [(0.0, True)]  # a batch of an empty row
    with pytest.raises(ValueError, match="continuation of 17 tokens cannot be scored in a 16-token window"):
        lm.loglikelihood(requests("loglikelihood", ("a", "b" * 17)))


def test_loglikelihood_rolling_equals_model_loss(mesh_lm):
    lm, model, _ = mesh_lm
    L = model.config.block_size
    short, long = "the cat sat.", "the quick brown fox jumps over the lazy dog, twice."  # 12 and 51 = 3L + 3
    t = torch.tensor(enc(short))
    with torch.no_grad():  # one window: the newline prefix predicts the first token
        loss = model(torch.cat([torch.tensor(enc("\n")), t[:-1]])[None], t[None])[1].item()
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (short,)))
    assert got[0] == pytest.approx(-loss * len(t), abs=1e-4)
    # three full disjoint windows, then a last one with a full window of context that scores 3 new tokens
    t = torch.tensor(enc(long))
    x = [torch.cat([torch.tensor(enc("\n")), t[:L - 1]]), t[L - 1:2 * L - 1], t[2 * L - 1:3 * L - 1], t[-L - 1:-1]]
    y = [t[:L], t[L:2 * L], t[2 * L:3 * L], torch.cat([torch.full((L - 3,), -1), t[-3:]])]  # -1: not scored
    with torch.no_grad():
        want = -sum(model(xi[None], yi[None])[1].item() * int((yi >= 0).sum()) for xi, yi in zip(x, y))
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (long,), (short,)))
    assert got[0] == pytest.approx(want, abs=1e-3) and got[1] == pytest.approx(-loss * len(enc(short)), abs=1e-4)


def test_generate_until_is_greedy_and_stops(mesh_lm):
    lm, model, _ = mesh_lm
    with torch.no_grad():
        ids = model.generate(torch.tensor([enc("the cat")]), 9, temperature=0, use_cache=False)[0, 7:].tolist()
    full = "".join(CHARS[i] for i in ids)
    stop = full[4]
    out = lm.generate_until(requests("generate_until", ("the cat", {"until": ["@@"], "max_gen_toks": 9}),
                                     ("the cat", {"until": [stop], "max_gen_toks": 9})))
    assert out == [full, full.split(stop)[0]]  # 7 + 9 = block_size: the whole context is kept
    one = {"until": full[0] + "@", "max_gen_toks": 9}  # a string: one stop, not a stop per character
    assert lm.generate_until(requests("generate_until", ("the cat", one))) == [full]
    # a longer context: its last block_size - max_gen_toks tokens, so the answer stays in the window
    context = "a b c d e f g h i j k"
    with torch.no_grad():
        ids = model.generate(torch.tensor([enc(context[-7:])]), 9, temperature=0)[0, 7:].tolist()
    assert lm.generate_until(requests("generate_until", (context, {"until": ["@@"], "max_gen_toks": 9}))) == [
        "".join(CHARS[i] for i in ids)]
    from configurator import UsageError
    with pytest.raises(UsageError, match=r"^the task's temperature=-1.0 must be a finite number"):
        lm.generate_until(requests("generate_until", ("the cat", {"do_sample": True,
                                                                 "temperature": -1})))


def test_each_result_goes_to_lm_evals_cache_as_returned(mesh_lm, monkeypatch):
    """lm_eval --use_cache: every answer is handed to the cache hook under its request."""
    lm, _, _ = mesh_lm
    kept = []
    monkeypatch.setattr(lm, "cache_hook", type("Hook", (), {"add_partial": lambda _, *a: kept.append(a)})())
    ll = lm.loglikelihood(requests("loglikelihood", ("the", " cat")))
    rolling = lm.loglikelihood_rolling(requests("loglikelihood_rolling", ("the cat sat.",)))
    until = ("the cat", {"until": ["@@"], "max_gen_toks": 3})
    text = lm.generate_until(requests("generate_until", until))
    assert kept == [("loglikelihood", ("the", " cat"), ll[0]), ("loglikelihood_rolling", ("the cat sat.",), rolling[0]),
                    ("generate_until", until, text[0])]


def test_a_dtype_is_the_models_and_an_empty_context_needs_a_prefix(mesh_lm, monkeypatch):
    from configurator import UsageError
    from data.meta import Tokenizer
    from tools import lm_eval_mesh
    lm, _, root = mesh_lm
    for dtype in ("bfloat16", "float16"):
        half = lm_eval_mesh.MeshLM(out_dir=str(root / "out"), dtype=dtype)
        assert {p.dtype for p in half.model.parameters()} == {getattr(torch, dtype)}
    monkeypatch.setattr(lm, "tokenizer", Tokenizer("char", chars="ab"))  # no newline, no <|endoftext|>
    with pytest.raises(UsageError) as e:
        lm.loglikelihood(requests("loglikelihood", ("", "ab")))
    assert str(e.value) == ("this tokenizer has neither <|endoftext|> nor a newline to condition an empty "
                            "context on; give every request a non-empty context")


def test_simple_evaluate_local_multiple_choice(mesh_lm):
    lm, model, root = mesh_lm
    import lm_eval
    from lm_eval.tasks import TaskManager
    docs = [{"question": "the cat sat on the", "choices": ["mat", "sky", "why"], "answer": 0},
            {"question": "a b c d", "choices": ["e", "z", "q"], "answer": 0},
            {"question": "is it blue?", "choices": ["yes", "no"], "answer": 1},
            {"question": "one two three", "choices": ["four", "six", "ten", "one"], "answer": 2}]
    with open(root / "tiny.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    (root / "tasks").mkdir()
    (root / "tasks" / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'tiny.jsonl'}\n"
        f"  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    results = lm_eval.simple_evaluate(model="mesh", model_args=f"out_dir={root / 'out'}", tasks=["tiny_mc"],
                                      batch_size=2, task_manager=TaskManager(include_path=str(root / "tasks"),
                                                                             include_defaults=False))
    # acc: the choice with the highest log-likelihood, " " + choice after the question, is the answer
    want = np.mean([max(range(len(d["choices"])), key=lambda c: direct_loglikelihood(
        model, d["question"], " " + d["choices"][c])[0]) == d["answer"] for d in docs])
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(want)


def test_cli_is_lm_evals_with_the_mesh_model(mesh_lm):
    """The command line: lm_eval's, --model mesh filled in; a local task scored on the run as directly."""
    _, model, root = mesh_lm
    docs = [{"question": "the cat sat on the", "choices": ["mat", "sky", "why"], "answer": 0},
            {"question": "is it blue?", "choices": ["yes", "no"], "answer": 1}]
    (root / "cli").mkdir()
    (root / "cli" / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "cli" / "cli_mc.yaml").write_text(
        f"task: cli_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'cli' / 'docs.jsonl'}\n"
        f"  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    r = subprocess.run([sys.executable, "tools/lm_eval_mesh.py", "--model_args", f"out_dir={root / 'out'}", "--tasks",
                        "cli_mc", "--include_path", str(root / "cli"), "--device", "cpu", "--output_path",
                        str(root / "cli" / "results")], cwd=ROOT, capture_output=True, text=True, timeout=HANG,
                       env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    (path,) = (root / "cli" / "results").glob("**/results_*.json")
    results = json.loads(path.read_text())
    want = np.mean([max(range(len(d["choices"])), key=lambda c: direct_loglikelihood(
        model, d["question"], " " + d["choices"][c])[0]) == d["answer"] for d in docs])
    assert results["config"]["model"] == "mesh" and results["results"]["cli_mc"]["acc,none"] == pytest.approx(want)


def test_cli_task_data_offline_is_one_line(mesh_lm):
    """A task whose dataset is neither cached nor downloadable ends in one line, not a traceback."""
    _, _, root = mesh_lm
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(root / "empty_cache"), "HF_HOME": str(root / "empty_home")}
    r = subprocess.run([sys.executable, "tools/lm_eval_mesh.py", "--model_args", f"out_dir={root / 'out'}", "--tasks",
                        "lambada_openai", "--device", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=HANG)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last.startswith("lm_eval_mesh.py: error: ") and "run once online" in last, last


@pytest.mark.parametrize("args, words", [
    (dict(out_dir_="out"), "unknown model_args key 'out_dir_' (did you mean 'out_dir'?); the mesh model "
                           "takes out_dir, dtype, max_gen_toks, pretrained"),
    (dict(max_gen_toks="x"), "max_gen_toks='x': expected a whole number of at least 1"),
    (dict(batch_size="0"), "--batch_size='0': expected a whole number of at least 1"),
    (dict(dtype="float64"), "dtype='float64': expected float32, bfloat16 or float16"),
    (dict(pretrained="hf"), "give out_dir or pretrained, not both"),  # two models: neither is read
])
def test_bad_model_args_are_the_projects_errors(mesh_lm, args, words):
    """A model_args key or value the mesh model cannot take is a UsageError (one line from the
    command), named before the checkpoint is read."""
    from configurator import UsageError
    from tools import lm_eval_mesh
    with pytest.raises(UsageError) as e:
        lm_eval_mesh.MeshLM(**{"out_dir": str(mesh_lm[2] / "out"), **args})
    assert str(e.value) == words


@pytest.mark.parametrize("device, words", [
    ("cuda:2", "--device=cuda:2 is not a device of this machine (it has 1 GPU(s), cuda:0 to cuda:0); "
               "use --device=cuda or one of those"),
    ("tpu", "unknown --device=tpu; expected auto, cpu, cuda, cuda:N or mps")])
def test_a_device_the_machine_lacks_is_one_line_before_the_checkpoint_is_read(mesh_lm, device, words, monkeypatch):
    """--device is checked as sample.py checks it (support/device.py), before anything moves to it."""
    from configurator import UsageError
    from tools import lm_eval_mesh
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError) as e:
        lm_eval_mesh.MeshLM(out_dir=str(mesh_lm[2] / "out"), device=device)
    assert str(e.value) == words


def test_lm_evals_default_cuda_on_a_machine_without_one_runs_on_the_cpu_and_says_so(mesh_lm, capsys, monkeypatch):
    from tools import lm_eval_mesh
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lm = lm_eval_mesh.MeshLM(out_dir=str(mesh_lm[2] / "out"), device="cuda:0")
    assert lm.device == torch.device("cpu") and next(lm.model.parameters()).device == torch.device("cpu")
    assert capsys.readouterr().err == "lm_eval_mesh: no cuda:0 here, running on the CPU\n"


def test_mesh_lm_reads_the_runs_latest_checkpoint_as_sample_does(mesh_lm, tmp_path):
    """out_dir is a run, read as sample.py reads it: its kept ckpt_ITER.pt where ckpt.pt is gone;
    a sharded latest checkpoint is refused naming consolidate.py, never a stale ckpt.pt read."""
    import shutil
    from configurator import UsageError
    from tools import lm_eval_mesh
    lm, model, root = mesh_lm
    (tmp_path / "kept").mkdir()
    shutil.copy(root / "out" / "ckpt.pt", tmp_path / "kept" / "ckpt_7.pt")
    kept = lm_eval_mesh.MeshLM(out_dir=str(tmp_path / "kept"))
    assert all(torch.equal(a, b) for a, b in zip(kept.model.state_dict().values(), model.state_dict().values()))
    sharded = tmp_path / "sharded"
    (sharded / "shards-00000002").mkdir(parents=True)
    shutil.copy(root / "out" / "ckpt.pt", sharded / "ckpt.pt")  # iter 0: older than the shards
    (sharded / "shards-00000002" / ".metadata").write_bytes(b"")
    saved = load_checkpoint(str(root / "out"))[1]
    (sharded / "shards-00000002" / "state.json").write_text(json.dumps(
        {"model_config": saved["model_config"], "iter_num": 2,
         "train_config": dict(saved["train_config"], weight_decay=0.1, beta1=0.9, beta2=0.95),
         "best_val_loss": 1.0, "rng": {"torch": [0]}}))
    with pytest.raises(UsageError, match="python tools/consolidate.py --out_dir="):
        lm_eval_mesh.MeshLM(out_dir=str(sharded))


def test_an_export_given_as_out_dir_is_named_as_lm_evals_pretrained(tmp_path):
    """out_dir=<an export_hf.py folder>: lm_eval's model arg for it is pretrained=."""
    pytest.importorskip("lm_eval", reason="lm_eval is not installed: pip install lm_eval")
    from configurator import UsageError
    from tools import lm_eval_mesh
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UsageError) as e:
        lm_eval_mesh.MeshLM(out_dir=str(tmp_path))
    assert str(e.value) == (f"{tmp_path} is a Hugging Face export; give it as "
                            f"pretrained={tmp_path}")


def test_lm_eval_mesh_without_out_dir_reads_the_run_in_out(tmp_path, monkeypatch):
    """No out_dir and no pretrained: ./out, train.py's default --out_dir, named when no run is there."""
    pytest.importorskip("lm_eval", reason="lm_eval is not installed: pip install lm_eval")
    from tools import lm_eval_mesh
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        lm_eval_mesh.MeshLM()
    assert str(e.value) == "no checkpoint at out/ckpt.pt; train one with: python train.py --out_dir=out"


def test_lm_evals_own_refusals_are_one_line_and_a_bug_is_not(mesh_lm):
    """lm_eval's checks of its command line refuse with ValueError: bad_input makes them
    UsageErrors; any other exception (a bug) passes through as it was."""
    from configurator import UsageError
    from tools import lm_eval_mesh

    def refuses():
        raise ValueError("Tasks not found: piqaa")

    def bug():
        raise TypeError("a bug")
    with pytest.raises(UsageError, match="^Tasks not found: piqaa$"):
        lm_eval_mesh.bad_input(refuses)()
    with pytest.raises(TypeError, match="a bug"):
        lm_eval_mesh.bad_input(bug)()
    assert lm_eval_mesh.bad_input(lambda x, y=1: x + y)(2, y=3) == 5


def test_cli_unknown_task_is_one_line(mesh_lm):
    """A task name lm_eval does not know: its own words, in one line, exit 2."""
    _, _, root = mesh_lm
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "tools/lm_eval_mesh.py", "--model_args", f"out_dir={root / 'out'}",
                        "--tasks", "no_such_task_xyz", "--device", "cpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == "lm_eval_mesh.py: error: Tasks not found: no_such_task_xyz"


def test_cli_without_lm_eval_is_one_line(tmp_path):
    """Run as a script where lm_eval cannot be imported: one line that says what to install, exit 2."""
    (tmp_path / "lm_eval").mkdir()
    (tmp_path / "lm_eval" / "__init__.py").write_text('raise ModuleNotFoundError("No module named lm_eval", name="lm_eval")')
    r = subprocess.run([sys.executable, "tools/lm_eval_mesh.py", "--tasks", "x"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=HANG)
    assert (r.returncode, r.stderr) == (2, "lm_eval_mesh.py: error: lm_eval is not installed; pip install lm_eval\n")


def test_train_continues_an_imported_model(tmp_path):
    """train.py --init_from=hf:PATH fine-tunes the imported vanilla model and saves a normal checkpoint."""
    import train
    from data.prepare import prepare
    hf, path = hf_neox(tmp_path, True)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 200)
    prepare("fox", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"), log=lambda *a: None)
    out = tmp_path / "out"
    flags = [f"--init_from=hf:{path}", f"--data_root={tmp_path / 'data'}", "--dataset=fox", f"--out_dir={out}",
             "--block_size=32", "--batch_size=4", "--max_iters=6", "--eval_interval=3", "--eval_iters=2",
             "--log_interval=1", "--sample_tokens=0", "--lr=1e-3"]
    assert train.main(flags) == 0
    model, ckpt = load_checkpoint(str(out))
    cfg = model.config
    assert (cfg.layout, cfg.scheme, cfg.scale_embeddings, cfg.block_size) == ("2", "base", False, 32)
    start = load_hf(path)
    moved = [k for k, v in start.state_dict().items() if not torch.equal(v, ckpt["model"][k])]
    assert moved  # it trained from the imported weights...
    assert ckpt["model"]["wte.weight"].shape == start.wte.weight.shape  # ...which it kept the shape of
    assert "source" in ckpt and ckpt["source"]["model_config"] == start.config.to_dict()
    # the width is the import's
    assert train.main([*flags, f"--out_dir={tmp_path / 'o2'}", "--n_embd=32"]) == 2
    assert not (tmp_path / "o2").exists()


def test_an_import_looped_at_k1_is_the_import_and_loops_to_any_layout(tmp_path, capsys, monkeypatch):
    """train.py --init_from=hf:PATH --layout: with K = 1 over its 4 layers the model saved at iter 0
    is transformers' (logits to 1e-5 of the plain import), its source recorded by its absolute path;
    looped with any scheme it uptrains."""
    import train
    from data.prepare import prepare
    hf, path = hf_neox(tmp_path, True, num_hidden_layers=4)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 200)
    prepare("fox", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"),
            log=lambda *a: None)
    monkeypatch.chdir(tmp_path)  # a path relative to where train.py runs
    flags = ["--init_from=hf:parallel", f"--data_root={tmp_path / 'data'}", "--dataset=fox",
             "--block_size=32", "--batch_size=4", "--eval_iters=2", "--sample_tokens=0", "--lr=1e-3"]
    assert train.main([*flags, f"--out_dir={tmp_path / 'k1'}", "--layout=1+2R1+1", "--scheme=base",
                       "--max_iters=0"]) == 0
    model, ckpt = load_checkpoint(str(tmp_path / "k1"))
    assert (model.config.layout, model.config.scale_embeddings) == ("1+2R1+1", False)
    assert ckpt["source"] == {"init_from": f"hf:{path}",
                              "model_config": load_hf(path).config.to_dict()}
    idx = torch.randint(0, 101, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, plain, ref = model.eval()(idx)[0], load_hf(path)(idx)[0], hf(idx).logits
    assert (ours - plain).abs().max().item() < 1e-5 and (ours - ref).abs().max().item() < 1e-4
    for scheme, layout in [("mesh", "1+1R3+1"), ("anchor", "0+2R2+2"), ("mesh", "1+1+1R2+1")]:
        out = tmp_path / f"{scheme}_{layout}"
        assert train.main([*flags, f"--out_dir={out}", f"--layout={layout}", f"--scheme={scheme}",
                           "--max_iters=2", "--eval_interval=2", "--core_init=average"]) == 0
        assert load_checkpoint(str(out))[0].config.layout == layout
    capsys.readouterr()
    assert train.main([*flags, f"--out_dir={tmp_path / 'o'}", "--layout=2+2R2+1"]) == 2
    assert capsys.readouterr().err == (
        f"train.py: error: --layout=2+2R2+1 needs 5 unique blocks, but --init_from=hf:parallel has 4 "
        f"layers; loop fewer unique blocks\n")


def test_a_looped_sources_width_and_heads_may_be_typed_whatever_the_preset(tmp_path, capsys):
    """A --n_embd and --n_head that name the source's own are taken, though the default
    preset's width (128) does not divide by 3 heads, nor 30 by its 4; other heads are the
    source's one line."""
    import train
    from data.prepare import prepare
    _, path = hf_neox(tmp_path, True, hidden_size=30, num_attention_heads=3, num_hidden_layers=3,
                      intermediate_size=120)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 200)
    prepare("fox", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"),
            log=lambda *a: None)
    flags = [f"--init_from=hf:{path}", f"--data_root={tmp_path / 'data'}", "--dataset=fox",
             "--block_size=32", "--batch_size=4", "--eval_iters=2", "--sample_tokens=0",
             "--layout=1+1R2+1", "--max_iters=0"]
    assert train.main([*flags, f"--out_dir={tmp_path / 'a'}", "--n_embd=30", "--n_head=3"]) == 0
    assert load_checkpoint(str(tmp_path / "a"))[0].config.n_head == 3
    assert train.main([f"--out_dir={tmp_path / 'a'}", "--init_from=resume", "--max_iters=1",
                       f"--data_root={tmp_path / 'data'}"]) == 0
    capsys.readouterr()
    assert train.main([*flags, f"--out_dir={tmp_path / 'b'}", "--n_head=4"]) == 2
    assert capsys.readouterr().err == (
        f"train.py: error: --init_from=hf:{path} has n_head=3, not --n_head=4: the width and "
        f"heads are the source's; drop --n_head\n")
    assert not (tmp_path / "b").exists()


# -----------------------------------------------------------------------------
# A GPT-NeoX folder with its own byte-level BPE tokenizer: lm_eval's pretrained=PATH, and fine-tuning

def neox_with_tokenizer(tmp_path):
    """A tiny random GPTNeoXForCausalLM saved with a tiny GPT-NeoX-shaped tokenizer (tokenizer.json) beside it."""
    tok = train_bpe(tmp_path / "tokenizer.json")
    hf, path = hf_neox(tmp_path, True, vocab_size=tok.get_vocab_size())
    os.replace(tmp_path / "tokenizer.json", os.path.join(path, "tokenizer.json"))
    return hf, tok, path


def test_lm_eval_pretrained_folder_equals_transformers(tmp_path):
    """lm_eval_mesh with pretrained=PATH: the log-likelihoods of transformers' own model and tokenizer."""
    pytest.importorskip("lm_eval", reason="lm_eval is not installed: pip install lm_eval")
    from tools import lm_eval_mesh
    hf, tok, path = neox_with_tokenizer(tmp_path)
    lm = lm_eval_mesh.MeshLM(pretrained=path, batch_size=2)
    assert lm.eot_token_id == tok.token_to_id("<|endoftext|>") == 0
    pairs = [("The king said", " to be, or not"), ("naïve café  ", "— 日本語"), ("a b", "  c"), ("", "Line 1: question!"),
             ("x" * 10, "\n\n    return")]
    got = lm.loglikelihood(requests("loglikelihood", *pairs))
    for (context, continuation), (ll, _) in zip(pairs, got):
        # lm_eval's convention (as for its own HF models): trailing spaces of the context go to the continuation,
        # then the context's encoding is a prefix of the encoding of both together
        whole = tok.encode(context + continuation).ids
        n_ctx = len(tok.encode(context.rstrip()).ids) if context else 0
        ids = ([0] if not context else []) + whole  # an empty context is conditioned on <|endoftext|>
        start = 1 if not context else n_ctx
        with torch.no_grad():
            logp = F.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)
        want = sum(logp[j - 1, ids[j]].item() for j in range(start, len(ids)))
        assert ll == pytest.approx(want, abs=1e-4)
    assert min(ll for ll, _ in got) < -10  # real sums over several tokens, not zeros


def test_fine_tuning_an_import_refuses_another_tokenizers_dataset(tmp_path, capsys):
    import train
    from data.prepare import prepare
    hf, tok, path = neox_with_tokenizer(tmp_path)
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 200)
    prepare("chars", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"), log=lambda *a: None)
    prepare("own", input=str(tmp_path / "text.txt"), tokenizer=path, out_root=str(tmp_path / "data"), log=lambda *a: None)
    flags = [f"--init_from=hf:{path}", f"--data_root={tmp_path / 'data'}", "--block_size=16", "--batch_size=2",
             "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--sample_tokens=5"]
    capsys.readouterr()  # transformers' save progress
    assert train.main([*flags, "--dataset=chars", f"--out_dir={tmp_path / 'o1'}"]) == 2
    assert capsys.readouterr().err == (
        f"train.py: error: dataset 'chars' was made with the char tokenizer, not the imported model's own "
        f"({path}/tokenizer.json); prepare it with that one: python data/prepare.py --dataset NAME --input FILE "
        f"--tokenizer {path}\n")
    assert not (tmp_path / "o1").exists()
    assert train.main([*flags, "--dataset=own", f"--out_dir={tmp_path / 'o2'}"]) == 0  # its own tokenizer: trains
