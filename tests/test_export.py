"""
Tests of tools/export_hf.py: a run as a Hugging Face folder that transformers alone loads, offline,
with the run's logits, greedy tokens and token ids; a vanilla export read back by train.py
--init_from=hf: with the run's logits exactly; bad targets in one line, nothing written.

    TIKTOKEN_CACHE_DIR=... python -m pytest -q tests/test_export.py --all

The GPT-2 cases need tiktoken's vocabulary (TIKTOKEN_CACHE_DIR offline) and are skipped without it;
transformers, tokenizers and safetensors are optional: what needs one is skipped without it.
"""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

import sample
from conftest import BPE_CORPUS, HANG, TEXT, run, snapshot, train_bpe
from data.meta import DataError
from data.prepare import prepare
from data.meta import Tokenizer
from support import checkpoint, files
from tools import export_hf

UNICODE = "naïve café — “quoted” 日本語 😀\n"
KINDS = {"vanilla": ["--layout=3", "--scheme=base"], "mesh": ["--scheme=mesh"],
         "base": ["--scheme=base"]}
CASES = [(vocab, kind) for vocab in ("char", "gpt2") for kind in KINDS]
SAMPLE = {"char": TEXT[:40] + UNICODE + "  So\n", "gpt2": BPE_CORPUS[1][:80] + "<|endoftext|>Then"}


def need(module):
    return pytest.importorskip(module, reason=f"{module} is not installed: pip install {module}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(vocab, kind) -> (run folder, data root): a tiny run of 6 steps, trained once; on
    characters (with spaces, new lines and unicode) or GPT-2's BPE (skipped without it)."""
    made, roots = {}, {}

    def get(vocab, kind):
        if vocab not in roots:
            root = tmp_path_factory.mktemp(vocab)
            (root / "tiny.txt").write_text(TEXT + UNICODE * 40 + BPE_CORPUS[0], encoding="utf-8")
            try:
                prepare("tiny", input=str(root / "tiny.txt"), tokenizer=vocab, out_root=str(root),
                        log=lambda *a: None)
            except DataError as e:
                pytest.skip(f"GPT-2 vocabulary unavailable (set TIKTOKEN_CACHE_DIR): {e}")
            roots[vocab] = str(root)
        if (vocab, kind) not in made:
            out = os.path.join(roots[vocab], f"run-{kind}")
            flags = [*KINDS[kind], "--max_iters=6", "--eval_interval=6", "--lr=1e-2"]
            assert run(flags, roots[vocab], out) == 0
            made[vocab, kind] = out
        return made[vocab, kind], roots[vocab]
    return get


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """exports(vocab, kind) -> the folder export_hf.py wrote for runs(vocab, kind), once."""
    need("safetensors")
    made, where = {}, tmp_path_factory.mktemp("exports")

    def get(vocab, kind):
        if (vocab, kind) not in made:
            out, _ = runs(vocab, kind)
            folder = str(where / f"{vocab}-{kind}")
            assert export_hf.main([f"--out_dir={out}", f"--to={folder}"]) == 0
            made[vocab, kind] = folder
        return made[vocab, kind]
    return get


def model_and_tokenizer(out, root):
    model, _ = checkpoint.load(out)
    return model.eval(), Tokenizer.load(os.path.join(root, "tiny"))


def prompt(tok, vocab):
    """(2, 16) ids of the sample text: the rows the models are compared on."""
    ids = (tok.encode(SAMPLE[vocab]) * 2)[:32]
    return torch.tensor(ids).view(2, 16)


# transformers alone (python -I: not this project's modules) loads every folder, offline
LOAD = """
import json, os, sys, torch, tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer
out = {}
for name, job in json.load(open(sys.argv[1])).items():
    d, remote = job["folder"], job["remote"]  # a vanilla export: transformers' own code
    model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=remote)
    idx = torch.tensor(job["idx"])
    with torch.no_grad():
        logits = model(idx).logits
    greedy = model.generate(idx[:, :4], max_new_tokens=8, do_sample=False)
    cached = model.generate(idx[:, :4], max_new_tokens=8, do_sample=False, use_cache=True)
    torch.manual_seed(0)
    sampled = model.generate(idx[:, :4], max_new_tokens=12, do_sample=True, top_k=10)
    tok = AutoTokenizer.from_pretrained(d, trust_remote_code=remote)
    ids = tok(job["text"])["input_ids"]
    raw = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    out[name] = dict(cls=type(model).__name__, logits=logits.tolist(), greedy=greedy.tolist(),
                     cached=cached.tolist(),
                     sampled=sampled.tolist(),
                     eos=[model.config.eos_token_id, model.generation_config.eos_token_id],
                     auto=ids, raw=raw.encode(job["text"]).ids, decoded=tok.decode(ids))
    if remote:  # modeling_nanomesh's own: a loss of labels, a mask, past block_size, padding
        ones = torch.ones_like(idx)
        with torch.no_grad():
            loss = model(idx, labels=idx).loss.item()
        long = model.generate(idx[:, :4], attention_mask=ones[:, :4], max_new_tokens=20,
                              do_sample=False)
        try:
            model.generate(idx[:, :4], attention_mask=ones[:, :4].tril(), max_new_tokens=2)
            padded = None
        except ValueError as e:
            padded = str(e)
        out[name].update(loss=loss, long=long.tolist(), padded=padded)
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def loaded(runs, exports, tmp_path_factory):
    """{(vocab, kind): what transformers made of the export}, every available case in one
    process run with transformers and torch only (HF_HUB_OFFLINE=1, a fresh HF_HOME)."""
    need("transformers")
    need("tokenizers")
    where, jobs = tmp_path_factory.mktemp("loaded"), {}
    for vocab, kind in CASES:
        try:
            _, tok = model_and_tokenizer(*runs(vocab, kind))
        except pytest.skip.Exception:  # GPT-2's vocabulary unavailable: the char cases still run
            continue
        jobs[f"{vocab}-{kind}"] = {"folder": exports(vocab, kind), "remote": kind != "vanilla",
                                   "idx": prompt(tok, vocab).tolist(), "text": SAMPLE[vocab]}
    (where / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(where / "hf_home")}
    r = subprocess.run([sys.executable, "-I", "-c", LOAD, "jobs.json", "out.json"], cwd=where,
                       env=env, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr
    return json.loads((where / "out.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("vocab, kind", CASES)
def test_transformers_runs_the_export_as_the_run(vocab, kind, runs, loaded):
    """Logits to 1e-4, RecursiveGPT.generate's greedy tokens (use_cache=True too: a recursive
    model has none, and says so to transformers), a sampled generate of full length
    (a character vocabulary has no end-of-text token to stop on)."""
    model, tok = model_and_tokenizer(*runs(vocab, kind))
    got, idx = loaded[f"{vocab}-{kind}"], prompt(tok, vocab)
    assert got["cls"] == ("GPTNeoXForCausalLM" if kind == "vanilla" else "NanoMeshForCausalLM")
    with torch.no_grad():
        want = model(idx)[0]
    assert want.std() > 0.1  # 1000 x the tolerance: the comparison means something
    assert (torch.tensor(got["logits"]) - want).abs().max().item() < 1e-4
    assert got["greedy"] == got["cached"] == model.generate(idx[:, :4], 8, temperature=0).tolist()
    sampled = torch.tensor(got["sampled"])
    assert got["eos"] == [tok.eot_id] * 2 and tok.eot_id == (None if vocab == "char" else 50256)
    assert sampled[:, :4].tolist() == idx[:, :4].tolist() and sampled.max() < tok.vocab_size
    if vocab == "char":
        assert sampled.shape == (2, 16)


@pytest.mark.slow
@pytest.mark.parametrize("vocab, kind", [c for c in CASES if c[1] != "vanilla"])
def test_the_remote_code_takes_labels_and_generates_past_its_window(vocab, kind, runs, loaded):
    """The transformers model of a looped export: its loss of labels is the run's cross-entropy
    of the next tokens; a mask of ones is taken, generate keeps the last block_size tokens past
    it as RecursiveGPT.generate does; a padded row is refused in one line."""
    model, tok = model_and_tokenizer(*runs(vocab, kind))
    got, idx = loaded[f"{vocab}-{kind}"], prompt(tok, vocab)
    with torch.no_grad():
        logits = model(idx)[0]
    want = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    assert abs(got["loss"] - want.item()) < 1e-4
    assert got["long"] == model.generate(idx[:, :4], 20, temperature=0).tolist()
    assert len(got["long"][0]) == 24 > model.config.block_size
    assert got["padded"] == "padding is not supported: give rows of one length"


@pytest.mark.slow
@pytest.mark.parametrize("vocab, kind", CASES)
def test_the_exports_tokenizer_gives_the_runs_ids(vocab, kind, runs, exports, loaded):
    _, tok = model_and_tokenizer(*runs(vocab, kind))
    got, ids = loaded[f"{vocab}-{kind}"], tok.encode(SAMPLE[vocab])
    assert got["auto"] == got["raw"] == ids and got["decoded"] == SAMPLE[vocab]
    assert len(set(ids)) > 20 and (vocab == "char" or 50256 in ids)  # new lines, unicode, EOT
    # transformers before 4.45 decoded " ," as "," unless the folder says not to
    config = json.loads(open(os.path.join(exports(vocab, kind), "tokenizer_config.json")).read())
    assert config["clean_up_tokenization_spaces"] is False


@pytest.mark.slow
@pytest.mark.parametrize("vocab", ["char", "gpt2"])
def test_a_vanilla_export_comes_back_with_the_runs_logits(vocab, runs, exports, tmp_path):
    """train.py --init_from=hf: of the export, K = 1 over its 3 layers: the run's logits,
    exactly (the folded embedding scale is the same float32 product)."""
    out, root = runs(vocab, "vanilla")
    back = tmp_path / "back"
    flags = [f"--init_from=hf:{exports(vocab, 'vanilla')}", "--layout=1+1R1+1", "--scheme=base",
             "--max_iters=0"]
    assert run(flags, root, back) == 0
    source, tok = model_and_tokenizer(out, root)
    model, ckpt = checkpoint.load(str(back))
    assert ckpt["source"]["init_from"] == f"hf:{exports(vocab, 'vanilla')}"
    idx = prompt(tok, vocab)
    with torch.no_grad():
        assert torch.equal(model.eval()(idx)[0], source(idx)[0])


@pytest.mark.slow
def test_data_made_with_the_exports_tokenizer_fine_tunes_it(runs, exports, tmp_path):
    """What the refusal of other data says to do: prepare it with --tokenizer EXPORT."""
    need("tokenizers")  # a character vocabulary's tokenizer.json is not byte-level
    folder, root = exports("char", "vanilla"), runs("char", "vanilla")[1]
    prepare("own", input=os.path.join(root, "tiny.txt"), tokenizer=folder,
            out_root=str(tmp_path), log=lambda *a: None)
    flags = [f"--init_from=hf:{folder}", "--dataset=own", "--max_iters=0"]
    assert run(flags, str(tmp_path), tmp_path / "o") == 0


def test_export_weights_are_the_runs(runs, exports):
    """A recursive export keeps RecursiveGPT's names, the shared core once; a vanilla one is
    GPT-NeoX's, embed_in the scaled embedding and the fused QKV regrouped per head."""
    from safetensors.torch import load_file
    for kind in ("mesh", "vanilla"):
        model, _ = model_and_tokenizer(*runs("char", kind))
        ours = model.state_dict()
        theirs = load_file(os.path.join(exports("char", kind), "model.safetensors"))
        if kind == "mesh":
            assert theirs.keys() == ours.keys() and "cores.0.0.attn.qkv.weight" in theirs
            assert not any(k.startswith("cores.1") for k in theirs)  # K = 2 steps, one core
            assert all(torch.equal(theirs[k], v) for k, v in ours.items())
    D, H = model.config.n_embd, model.config.n_head
    assert len(theirs) == 4 + 12 * 3 and torch.equal(theirs["gpt_neox.embed_in.weight"],
                                                     ours["wte.weight"] * math.sqrt(D))
    assert "embed_out.weight" in theirs  # the head's name in GPT-NeoX's files (transformers 4 reads no other)
    qkv = theirs["gpt_neox.layers.2.attention.query_key_value.weight"].view(H, 3, D // H, D)
    assert torch.equal(qkv[1, 0], ours["prelude.2.attn.qkv.weight"][D // H:2 * D // H])  # head 1, q


def test_a_vanilla_exports_config_is_its_models_shape():
    """config.json carries the run's own block_size, residual form and rotary settings (in
    transformers 4's and 5's names), not Pythia's defaults."""
    from mesh import Config, RecursiveGPT
    cfg = Config(layout="2", vocab_size=65, n_embd=32, n_head=4, block_size=16,
                 parallel_residual=False, rotary_pct=0.5, rotary_base=500.0)
    hf, _ = export_hf.neox(cfg, RecursiveGPT(cfg).state_dict())
    assert (hf["max_position_embeddings"], hf["use_parallel_residual"], hf["num_hidden_layers"],
            hf["rotary_pct"], hf["rotary_emb_base"]) == (16, False, 2, 0.5, 500.0)
    assert hf["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0,
                                     "partial_rotary_factor": 0.5}


@pytest.mark.slow
def test_lm_eval_scores_a_character_export_as_its_run(runs, exports):
    """lm_eval_mesh.py's pretrained= of a character run's export reads with the run's tokenizer:
    the run's log-likelihoods, an empty context on a new line, a character it lacks refused (its
    tokenizer.json would drop it, scoring an empty continuation 0)."""
    need("lm_eval")
    from lm_eval.api.instance import Instance
    from tools import lm_eval_mesh
    out, _ = runs("char", "vanilla")
    run_lm = lm_eval_mesh.MeshLM(out_dir=out)
    export_lm = lm_eval_mesh.MeshLM(pretrained=exports("char", "vanilla"))
    asks = [Instance("loglikelihood", {}, pair, 0) for pair in [("", "Then"), ("So the", " king")]]
    want = [ll for ll, _ in run_lm.loglikelihood(asks)]
    assert [ll for ll, _ in export_lm.loglikelihood(asks)] == pytest.approx(want, abs=1e-4)
    with pytest.raises(DataError, match="characters not in the vocabulary: '@'"):
        export_lm.loglikelihood([Instance("loglikelihood", {}, ("So the", "@"), 0)])


@pytest.mark.slow
def test_a_bpe_datasets_tokenizer_json_goes_as_it_is(tmp_path):
    need("safetensors")
    train_bpe(tmp_path / "tokenizer.json")
    (tmp_path / "t.txt").write_text("".join(BPE_CORPUS) * 3, encoding="utf-8")
    prepare("tiny", input=str(tmp_path / "t.txt"), tokenizer=str(tmp_path / "tokenizer.json"),
            out_root=str(tmp_path), log=lambda *a: None)
    assert run(["--max_iters=1", "--eval_interval=1"], str(tmp_path), tmp_path / "r") == 0
    assert export_hf.main([f"--out_dir={tmp_path / 'r'}", f"--to={tmp_path / 'hf'}"]) == 0
    with open(tmp_path / "tiny" / "tokenizer.json", "rb") as a, \
            open(tmp_path / "hf" / "tokenizer.json", "rb") as b:
        assert a.read() == b.read()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 0


def test_recursive_exports_are_refused_by_hf_init(runs, exports, tmp_path, capsys):
    out, root = runs("char", "mesh")
    folder = exports("char", "mesh")
    capsys.readouterr()
    assert run([f"--init_from=hf:{folder}", "--max_iters=0"], root, tmp_path / "o") == 2
    assert capsys.readouterr().err == (
        f"train.py: error: cannot import {folder}: it holds a nanoMeSH model run by its own code "
        f"(mesh.py, trust_remote_code); hf: reads GPT-NeoX folders only (Pythia's, or a vanilla "
        f"run's export)\n")
    assert not (tmp_path / "o").exists()


def test_overwrite_replaces_the_whole_folder(runs, exports, tmp_path, capsys, monkeypatch):
    replace = os.replace

    def windows(source, target):  # as Windows' MoveFileEx: no folder is replaced, not even empty
        if os.path.isdir(target):
            raise PermissionError(13, "Access is denied")
        replace(source, target)
    monkeypatch.setattr(os, "replace", windows)
    to = tmp_path / "hf"
    to.mkdir()  # an empty folder takes the first without --overwrite
    for kind in ("mesh", "vanilla"):  # the second has no mesh.py: nothing of the first stays
        assert export_hf.main([f"--out_dir={runs('char', kind)[0]}", f"--to={to}",
                               f"--overwrite={kind == 'vanilla'}"]) == 0
    assert sorted(os.listdir(to)) == ["config.json", "generation_config.json",
                                      "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json"]
    assert os.listdir(tmp_path) == ["hf"]  # no temporary left beside it
    assert capsys.readouterr().out.endswith(f"wrote {to}: 3 base as GPTNeoXForCausalLM, iter 6\n")


def test_an_export_to_another_drive_than_the_run_is_written(runs, tmp_path, monkeypatch):
    need("safetensors")

    def two_drives(paths):  # Windows' ntpath, for a run on C: and --to on D:
        raise ValueError("Paths don't have the same drive")
    monkeypatch.setattr(os.path, "commonpath", two_drives)
    assert export_hf.main([f"--out_dir={runs('char', 'mesh')[0]}", f"--to={tmp_path / 'hf'}"]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_an_export_to_a_folder_in_folders_not_there_yet_makes_them(runs, tmp_path, monkeypatch):
    need("safetensors")
    to = tmp_path / "new" / "hf"
    assert export_hf.main([f"--out_dir={runs('char', 'mesh')[0]}", f"--to={to}"]) == 0
    assert os.listdir(tmp_path / "new") == ["hf"] and (to / "model.safetensors").is_file()
    monkeypatch.chdir(tmp_path / "new")  # replaced, given as a relative --to
    assert export_hf.main([f"--out_dir={runs('char', 'mesh')[0]}", "--to=hf", "--overwrite=true"]) == 0
    assert os.listdir(tmp_path / "new") == ["hf"] and (to / "model.safetensors").is_file()


def test_an_export_that_fails_writes_nothing(runs, tmp_path, monkeypatch, capsys):
    need("safetensors")
    write, calls = files.atomic_write, []
    out = runs("char", "mesh")[0]  # trained before the disk fills

    def full_disk(path, *args):  # the third file fails
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "the disk is full")
        write(path, *args)
    monkeypatch.setattr(files, "atomic_write", full_disk)
    capsys.readouterr()
    assert export_hf.main([f"--out_dir={out}", f"--to={tmp_path / 'hf'}"]) == 2
    assert capsys.readouterr().err == (
        "export_hf.py: error: the disk is full; check the disk (free space, permissions) and try "
        "again\n")
    assert os.listdir(tmp_path) == []


def test_unfinished_takes_a_run_stopped_early_too_as_its_help_says():
    """--unfinished is what a run stopped before its max_iters needs too, not only one still training:
    export_hf.py's help says both, in sample.py's words."""
    helps = [next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == "unfinished")
             for cls in (sample.SampleConfig, export_hf.ExportConfig)]
    assert helps == ["use a run still training or stopped early as it is now"] * 2


def test_bad_targets_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    out, _ = runs("char", "mesh")
    full, other = tmp_path / "full", tmp_path / "other"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    sharded = tmp_path / "sharded"  # a sharded checkpoint (support/sharded.py), whole: its .metadata
    shutil.copytree(out, sharded, ignore=shutil.ignore_patterns("ckpt.pt"))
    saved = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    (sharded / "shards-00000002").mkdir()
    (sharded / "shards-00000002" / ".metadata").write_bytes(b"")
    (sharded / "shards-00000002" / "state.json").write_text(json.dumps(
        {**{k: v for k, v in saved.items() if k not in ("model", "optimizer", "rng")}, "rng": {"torch": [0]}}))
    cases = [
        ([f"--to={full}"], f"--to={full} is not empty; give a new folder, or --overwrite=true to "
         f"replace the model folder there"),
        ([f"--to={full}", "--overwrite=true"], f"--to={full} holds no config.json, so no model "
         f"folder to replace; give a new folder"),
        ([f"--to={out}"], f"--to={out} is the run's folder {out}; give a folder of its own"),
        ([f"--to={out}/hf"], f"--to={out}/hf is inside the run's folder {out}; give a folder of "
         f"its own"),
        ([f"--to={os.path.dirname(out)}", "--overwrite=true"], f"--to={os.path.dirname(out)} "
         f"holds the run's folder {out}; give a folder of its own"),
        ([f"--to={full / 'notes.txt'}"], f"--to={full / 'notes.txt'} is a file; give a folder"),
        ([], "name the folder to write: --to=DIR"),
        ([f"--out_dir={tmp_path / 'none'}", f"--to={other}"], f"no checkpoint at "
         f"{tmp_path / 'none' / 'ckpt.pt'}; train one with: python train.py "
         f"--out_dir={tmp_path / 'none'}"),
        ([f"--out_dir={sharded}", f"--to={other}"], f"{sharded / 'shards-00000002'} (iter "
         f"{saved['iter_num']}) is the run's latest checkpoint, a sharded one, and export_hf.py reads "
         f"a whole one (ckpt.pt); write it first: python tools/consolidate.py --out_dir={sharded}"),
    ]
    before = snapshot(tmp_path, os.path.dirname(out))
    for flags, words in cases:
        capsys.readouterr()
        assert export_hf.main([f"--out_dir={out}", *flags]) == 2, flags
        assert capsys.readouterr().err == f"export_hf.py: error: {words}\n", flags
    assert snapshot(tmp_path, os.path.dirname(out)) == before
    assert sorted(os.listdir(tmp_path)) == ["full", "sharded"]


def test_a_model_folder_in_a_folder_not_writable_is_refused_first(runs, exports, tmp_path,
                                                                 monkeypatch, capsys):
    """--overwrite renames in the folder above --to: without permission there, one line
    before the run is read, and the folder as it was."""
    up = tmp_path / "read-only"
    shutil.copytree(exports("char", "mesh"), up / "hf")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: p != str(up) and access(p, mode))
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert export_hf.main([f"--out_dir={runs('char', 'vanilla')[0]}", f"--to={up / 'hf'}",
                           "--overwrite=true"]) == 2
    assert capsys.readouterr().err == (
        f"export_hf.py: error: cannot write --to={up / 'hf'}: no permission in {up}\n")
    assert snapshot(tmp_path) == before
