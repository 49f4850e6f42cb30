"""
When things go wrong around the tools that read a run (sample.py, probe.py, table1.py): a newer
sharded checkpoint, a prompt file that is a device or a FIFO, sizes that cannot fit, settings that
are not finite, a damaged result file, a signal to table1.py. Every bad input is one line naming
the problem and the fix, exit 2, with nothing touched; table1.py's runs stop with it. A bug (a
ValueError inside the model) is not bad input: a tool shows its traceback.

    python -m pytest tests/test_tool_failures.py -q --all
"""

import json
import shutil
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import sample
import train
from conftest import ENOSPC, EPIPE, HANG, ROOT, TEXT, copy_with_a_bug, listed, snapshot, stdout_note
from data.prepare import prepare
from data.meta import Tokenizer
from mesh import Config, RecursiveGPT
from support import checkpoint, files as plain, files as runfiles, tool as reading
from tools import probe, table1


def one_line(capsys, prog):
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def tiny_ckpt(data_root, tmp_path):
    """A run folder holding an untrained tiny model's ckpt.pt at iter 4, on the `tiny` dataset."""
    tok = Tokenizer.load(os.path.join(data_root, "tiny"))
    torch.manual_seed(0)
    model = RecursiveGPT(Config(vocab_size=tok.vocab_size, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1",
                                scheme="mesh"))
    out = tmp_path / "run"
    checkpoint.save(dict(model=model.state_dict(), model_config=model.config.to_dict(),
                         train_config=dict(dataset="tiny", data_root=data_root), iter_num=4),
                    str(out / "ckpt.pt"))
    return out


def write_shards(out, iter_num, saved_at):
    """A whole sharded checkpoint of out's run (its state.json and DCP's .metadata), as checkpoint.found
    lists it, beside out's ckpt.pt: the only one there."""
    for old in out.glob("shards-*"):
        shutil.rmtree(old)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    shards = out / f"shards-{iter_num:08d}"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"")
    (shards / "state.json").write_text(json.dumps(dict(
        model_config=ckpt["model_config"], iter_num=iter_num,
        train_config=dict(ckpt["train_config"], weight_decay=0.1, beta1=0.9, beta2=0.95),
        best_val_loss=1.0, rng={"torch": [0] * 8}, saved_at=saved_at)))
    return shards


# -----------------------------------------------------------------------------
# sample.py

def test_sample_refuses_a_sharded_checkpoint_that_trained_further(tiny_ckpt, capsys):
    """sample.py reads the run's latest checkpoint by the rule a resume follows (checkpoint.latest): training
    progress first, so a sharded one at iter 6 beside ckpt.pt at iter 4 is refused, naming consolidate.py,
    however early its clock says it was saved; at the same iteration the clock decides, and a copy (the same
    iteration and time, as consolidate.py writes) leaves ckpt.pt to be read."""
    out = tiny_ckpt
    shards = write_shards(out, 6, saved_at=0.0)  # saved "before" ckpt.pt by the clock, yet further on
    before = snapshot(out)
    refusal = (f"(iter 6) is the run's latest checkpoint, a sharded one, and sample.py reads a whole one "
               f"(ckpt.pt); write it first: python tools/consolidate.py --out_dir={out}\n")
    assert sample.main([f"--out_dir={out}", "--max_new_tokens=3"]) == 2
    assert one_line(capsys, "sample.py") == f"sample.py: error: {shards} {refusal}"
    assert snapshot(out) == before
    assert probe.main([f"--out_dir={out}", "--num_samples=2"]) == 2  # the probe reads by the same rule
    assert one_line(capsys, "probe.py") == f"probe.py: error: {shards} " + refusal.replace("sample.py", "probe.py")
    shards = write_shards(out, 4, saved_at=time.time() + 3600)  # the same progress, a later clock
    assert sample.main([f"--out_dir={out}", "--max_new_tokens=3"]) == 2
    assert one_line(capsys, "sample.py") == f"sample.py: error: {shards} " + refusal.replace("iter 6", "iter 4")
    write_shards(out, 4, saved_at=0.0)  # saved together (ckpt.pt keeps no time: 0.0): ckpt.pt is its copy
    assert sample.main([f"--out_dir={out}", "--start=Then", "--max_new_tokens=3"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("Then")
    (out / "ckpt_8").mkdir()  # --keep_every's copy of a sharded one: --ckpt=8's, not the latest
    kept = shutil.move(write_shards(out, 8, saved_at=0.0), out / "ckpt_8")
    assert sample.main([f"--out_dir={out}", "--ckpt=8"]) == 2
    assert one_line(capsys, "sample.py") == (
        f"sample.py: error: {kept} (iter 8) is the run's kept checkpoint, a sharded one, "
        f"and sample.py reads a whole one (ckpt.pt); write it first: python "
        f"tools/consolidate.py --out_dir={out / 'ckpt_8'}\n")


def test_a_checkpoint_or_an_export_given_as_a_run_names_the_folder_to_give(tiny_ckpt, tmp_path, capsys):
    """A sharded checkpoint's folder (a kept ckpt_ITER/'s too), a ckpt.pt or ckpt_ITER.pt file, an
    export_hf.py folder or another file given where a run's folder is expected: every tool that reads a run says what it
    is and which folder to give, in one line, never to train into it, and writes nothing there
    (consolidate.py's lock file included)."""
    from tools import consolidate, export_hf, routing
    shards = write_shards(tiny_ckpt, 4, saved_at=0.0)
    kept = tiny_ckpt / "ckpt_8" / "shards-00000008"
    shutil.copytree(shards, kept)
    export = tmp_path / "hf"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"")
    shutil.copy(tiny_ckpt / "ckpt.pt", tiny_ckpt / "ckpt_4.pt")  # a kept one, as --keep_every's
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    for folder, words in [
            (shards, f"a checkpoint; give its run's folder, {tiny_ckpt}"),
            (tiny_ckpt / "ckpt.pt", f"a checkpoint; give its run's folder, {tiny_ckpt}"),
            (tiny_ckpt / "ckpt_4.pt", f"a checkpoint; give its run's folder, {tiny_ckpt}"),
            (kept, f"a checkpoint; give its run's folder, {tiny_ckpt / 'ckpt_8'}"),
            (export, f"a Hugging Face export; give it to from_pretrained or to train.py as --init_from=hf:{export}"),
            (tmp_path / "notes.txt", "a file; give a run's folder")]:
        for tool, flags in [(sample, []), (probe, []), (routing, ["--text=the"]), (consolidate, []),
                            (export_hf, [f"--to={tmp_path / 'new'}"]), (train, []),
                            (train, ["--init_from=resume"])]:
            prog = tool.__name__.split(".")[-1] + ".py"
            assert tool.main([f"--out_dir={folder}", *flags]) == 2
            assert one_line(capsys, prog) == f"{prog}: error: {folder} is {words}\n"
        with pytest.raises(checkpoint.CheckpointError) as refused:  # lm_eval_mesh.py's reader
            reading.load_latest(str(folder), "cpu", "lm_eval_mesh.py")
        assert str(refused.value) == f"{folder} is {words}"
    assert snapshot(tmp_path) == before
    assert [p for p in tmp_path.rglob("*") if p.name == plain.LOCK] == []
    (tiny_ckpt / "config.json").write_text("{}")  # a run folder holding a config file is a run
    reading.check_run_folder(str(tiny_ckpt))


def prompt_files(tmp_path):
    """(--start path, the words of the one-line error) for prompt files that are not plain text."""
    big, binary, folder = tmp_path / "big.txt", tmp_path / "binary.txt", tmp_path / "folder"
    with open(big, "wb") as f:
        f.truncate(sample.PROMPT_BYTES + 1)  # sparse: no disk taken
    binary.write_bytes(b"Then \xff\xfe")
    folder.mkdir()
    cases = [(big, f"is larger than {sample.PROMPT_BYTES:,} bytes"), (binary, "is not UTF-8 text (byte 5)"),
             (folder, "is not a regular file (a FIFO, a device or a folder)"),
             (tmp_path / "missing.txt", "cannot be read: No such file or directory")]
    if os.path.exists("/dev/zero"):
        cases.append(("/dev/zero", "is not a regular file (a FIFO, a device or a folder)"))
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        cases.append((tmp_path / "fifo", "is not a regular file (a FIFO, a device or a folder)"))
    return cases


def test_sample_reads_a_prompt_file_as_plain_text_only(tiny_ckpt, tmp_path, capsys, monkeypatch):
    cases = prompt_files(tmp_path)
    # a FIFO read blocking would wait for a writer forever: this one comes after a minute, and the test fails
    unblock = threading.Timer(60, lambda: open(tmp_path / "fifo", "w").close())
    unblock.daemon = True
    unblock.start()
    before = snapshot(tiny_ckpt)
    try:
        for path, words in cases:
            assert sample.main([f"--out_dir={tiny_ckpt}", f"--start=FILE:{path}", "--max_new_tokens=2"]) == 2
            assert one_line(capsys, "sample.py") == (f"sample.py: error: the prompt file {str(path)!r} {words}; "
                                                     f"give --start=FILE:path of a UTF-8 text file\n")
    finally:
        unblock.cancel()
    assert snapshot(tiny_ckpt) == before
    for text in ("Then the", "\ufeffThen the"):  # a byte order mark (Notepad's) is no character of the prompt
        (tmp_path / "prompt.txt").write_text(text, encoding="utf-8")
        assert sample.main([f"--out_dir={tiny_ckpt}", f"--start=FILE:{tmp_path / 'prompt.txt'}",
                            "--max_new_tokens=2"]) == 0
        assert capsys.readouterr().out.startswith("Then the")
    monkeypatch.setenv("HOME", str(tmp_path))  # ~ is the home folder, as in every path setting
    assert sample.main([f"--out_dir={tiny_ckpt}", "--start=FILE:~/prompt.txt", "--max_new_tokens=2"]) == 0
    assert capsys.readouterr().out.startswith("Then the")


def test_sample_prints_what_generate_makes_of_its_flags(tiny_ckpt, data_root, capsys):
    """Past block_size (16) too: the prompt and 20 new tokens; --max_new_tokens=0 is the prompt."""
    model, _, _ = reading.load_run(str(tiny_ckpt), "cpu", "sample.py")
    tok = Tokenizer.load(os.path.join(data_root, "tiny"))
    torch.manual_seed(7)
    rows = model.eval().generate(torch.tensor([tok.encode("Then")] * 2), 20, temperature=1.5, top_k=3)
    flags = ["--start=Then", "--num_samples=2", "--max_new_tokens=20", "--temperature=1.5",
             "--top_k=3", "--seed=7", "--device=cpu"]
    assert sample.main([f"--out_dir={tiny_ckpt}", *flags]) == 0
    sep = "\n---------------\n"
    assert capsys.readouterr().out == "".join(tok.decode(r.tolist()) + sep for r in rows)
    assert sample.main([f"--out_dir={tiny_ckpt}", "--start=Then", "--max_new_tokens=0"]) == 0
    assert capsys.readouterr().out == "Then" + sep
    greedy = model.generate(torch.tensor([tok.encode("Then")]), 20, temperature=0)[0]
    assert sample.main([f"--out_dir={tiny_ckpt}", "--start=Then", "--max_new_tokens=20",
                        "--temperature=0", "--device=cpu"]) == 0  # 0: greedy, as its help says
    assert capsys.readouterr().out == tok.decode(greedy.tolist()) + sep


@pytest.mark.parametrize("flag", ["--num_samples=1000000", "--max_new_tokens=1000000000000"])
def test_sample_refuses_a_decode_beyond_the_machines_memory_before_allocating(tiny_ckpt, flag, capsys,
                                                                               monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("decoding started")
    monkeypatch.setattr(sample, "complete", never)
    monkeypatch.setattr(reading, "device_memory", lambda device: (8 << 30, "this machine"))
    assert sample.main([f"--out_dir={tiny_ckpt}", flag]) == 2
    err = one_line(capsys, "sample.py")
    n, m = ("1000000", "300") if "num_samples" in flag else ("1", "1000000000000")
    assert err.startswith(f"sample.py: error: --num_samples={n} and --max_new_tokens={m} need about ")
    assert err.endswith(" GiB to decode (the KV cache of 4 applied blocks, the logits, the tokens), more than "
                        "the 8.0 GiB of this machine; use fewer samples or tokens\n")
    model, _ = checkpoint.load(str(tiny_ckpt))
    monkeypatch.setattr(reading, "device_memory", lambda device: (None, "this machine"))  # memory unknown
    assert reading.check_decode(model, 0, 1000000, 10**12, "cpu") is None  # nothing to check against


@pytest.mark.parametrize("prog, when", [("sample.py", "load"), ("sample.py", "decode"), ("probe.py", "load"),
                                        ("routing.py", "load")])
def test_a_checkpoint_too_big_for_the_gpu_is_one_line(tiny_ckpt, prog, when, capsys, monkeypatch):
    """torch's OutOfMemoryError on a GPU, moving the checkpoint there or decoding, is one line: torch's first
    words and --device=cpu, not a corrupt checkpoint; sample.py's --debug keeps its traceback."""
    from types import SimpleNamespace
    from tools import routing

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                     "capacity of 16.00 GiB of which 20.00 MiB is free.")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=16 << 30))
    monkeypatch.setattr(RecursiveGPT, "to", oom if when == "load" else lambda self, device: self)
    monkeypatch.setattr(sample, "complete", oom)
    main = {"sample.py": sample.main, "probe.py": probe.main, "routing.py": routing.main}[prog]
    before = snapshot(tiny_ckpt)
    assert main([f"--out_dir={tiny_ckpt}", "--device=cuda"]) == 2
    assert one_line(capsys, prog) == (f"{prog}: error: CUDA out of memory. Tried to allocate 2.00 GiB; "
                                      f"use --device=cpu, or smaller settings\n")
    assert snapshot(tiny_ckpt) == before
    with pytest.raises(torch.OutOfMemoryError):  # (sample.py has --debug)
        sample.main([f"--out_dir={tiny_ckpt}", "--device=cuda", "--debug=true"])


def test_the_decode_estimate_grows_with_samples_and_tokens_and_fits_a_small_decode(tiny_ckpt, capsys):
    model, _ = checkpoint.load(str(tiny_ckpt))
    cfg, size = model.config, lambda n, t: reading.decode_bytes(model.config, n, t, 4, 0)
    assert size(2, 10) > size(1, 10) and size(1, 1000) > size(1, 10)
    # the KV cache alone: a key and a value of n_embd per position of block_size, per applied block
    assert size(1, 1) >= 2 * cfg.shape.depth * cfg.block_size * cfg.n_embd * 4
    assert sample.main([f"--out_dir={tiny_ckpt}", "--num_samples=3", "--max_new_tokens=4"]) == 0  # the real memory
    assert capsys.readouterr().out.count("---------------") == 3


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "1e999"])
def test_sample_refuses_a_temperature_that_is_not_finite_or_negative(value, tmp_path, capsys):
    """Refused before any file is read: the folder does not even exist."""
    assert sample.main([f"--out_dir={tmp_path / 'nowhere'}", f"--temperature={value}"]) == 2
    shown = float(value)
    assert one_line(capsys, "sample.py") == (f"sample.py: error: --temperature={shown} must be 0 (greedy) or a finite "
                                             f"number above it\n")
    assert not (tmp_path / "nowhere").exists()


# -----------------------------------------------------------------------------
# probe.py

@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-0.5", "1e999"])
def test_probe_refuses_a_sigma_frac_that_is_not_positive_and_finite(value, tmp_path, capsys):
    code = probe.main(["--out_dir=x", f"--sigma_frac={value}", f"--json={tmp_path / 'p.json'}"])
    assert code == 2
    assert one_line(capsys, "probe.py") == (f"probe.py: error: --sigma_frac={float(value)} must be a positive "
                                            f"finite number\n")
    assert not (tmp_path / "p.json").exists()


def test_probe_writes_null_for_every_measure_that_is_not_a_number(tiny_ckpt, tmp_path, capsys):
    """An all-zero model: every state is zero, so every effort is 0/0 and every CKA undefined. The JSON
    holds null for them (plain.read_json refuses NaN), not a traceback or an error."""
    ckpt = torch.load(tiny_ckpt / "ckpt.pt", weights_only=True)
    checkpoint.save({**ckpt, "model": {k: torch.zeros_like(v) for k, v in ckpt["model"].items()}},
                    str(tiny_ckpt / "ckpt.pt"))
    out = tmp_path / "probe.json"
    probe.main([f"--out_dir={tiny_ckpt}", "--num_samples=2", f"--json={out}"])
    assert f"wrote {out}" in capsys.readouterr().out
    (result,) = plain.read_json(str(out))
    assert all(v == [None, None] for v in result["effort"].values())
    assert all(v is None for row in result["cka"]["matrix"] for v in row)
    assert probe.json_ready({"a": [math.nan, 1.0, (math.inf, -math.inf)], "b": 2}) == \
        {"a": [None, 1.0, [None, None]], "b": 2}


# -----------------------------------------------------------------------------
# table1.py

DAMAGED_RESULTS = [  # (result.json's bytes, the words of the one-line error)
    (b'{"name": "vanilla_s0", "max_iters": 2', "is not JSON (Expecting ',' delimiter, line 1 column 38)"),
    (b"\x80\x81", "is not UTF-8 text (byte 0)"),
    (b"[1, 2]", "is not a JSON object"),
    (b'{"name": "vanilla_s0", "max_iters": 2}', "has seed None, not an integer"),
    (b'{"name": "vanilla_s0", "seed": 0, "max_iters": "2", "params": 1, "val_loss": 1.5, "ms_per_iter": null}',
     "has max_iters '2', not an integer"),
    (b'{"name": "vanilla_s0", "seed": 0, "max_iters": 2, "params": 1, "val_loss": NaN, "ms_per_iter": null}',
     "holds NaN, which JSON does not allow (write a number)"),
    (b'{"name": "vanilla_s0", "seed": 0, "max_iters": 2, "params": 1, "val_loss": 1e400}',
     "holds a number past a float's range (write a smaller one)"),  # inf: no std over the seeds
    (b'{"name": "vanilla_s0", "seed": 0, "seed": 1}', "has the key 'seed' twice"),
    (b'{"name": "vanilla_s0", "seed": 0, "max_iters": 2, "params": 1, "val_loss": 1.5, "ms_per_iter": null, '
     b'"val_curve": [[0, "x"]]}', "has val_curve [[0, 'x']], not a list of [iter, val loss] pairs"),
    (b'{"name": "mesh_s0", "seed": 0, "max_iters": 2, "params": 1, "val_loss": 1.5, "ms_per_iter": null}',
     "is the result of run 'mesh_s0', not of vanilla_s0"),
    (b"[" * 100 + b"]" * 100, "is nested more than 64 levels deep"),
]


@pytest.mark.parametrize("content, words", DAMAGED_RESULTS, ids=[w[:30] for _, w in DAMAGED_RESULTS])
def test_table1_names_a_damaged_result_file_and_touches_nothing(content, words, tmp_path, capsys):
    folder = tmp_path / "root" / "vanilla_s0"
    folder.mkdir(parents=True)
    (folder / "result.json").write_bytes(content)
    before = snapshot(tmp_path)
    code = table1.main(["--only=vanilla", "--seeds=0", "--max_iters=2", f"--root={tmp_path / 'root'}",
                 f"--results={tmp_path / 'res'}"])
    assert code == 2
    assert one_line(capsys, "table1.py") == (f"table1.py: error: {folder / 'result.json'} {words}; delete the folder "
                                             f"{folder} to train that run again\n")
    assert snapshot(tmp_path) == before and not (tmp_path / "res").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_table1_does_not_wait_on_a_result_file_that_is_a_fifo(tmp_path, capsys):
    folder = tmp_path / "root" / "vanilla_s0"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "result.json")
    code = table1.main(["--only=vanilla", "--seeds=0", f"--root={tmp_path / 'root'}", f"--results={tmp_path / 'res'}"])
    assert code == 2
    assert one_line(capsys, "table1.py") == (
        f"table1.py: error: {folder / 'result.json'} is not a regular file (a FIFO, a device or a folder); delete "
        f"the folder {folder} to train that run again\n")


@pytest.mark.parametrize("flag, words", [
    ("--lr=0", "--lr=0.0 must be a finite number above 0"),
    ("--n_embd=6", "--n_embd=6 makes no model of 4 heads (n_embd=6 is not divisible by n_head=4"),
    ("--seeds=0,-1", "--seeds='0,-1' must be comma-separated integers, 0 or more, as 0,1,2"),
])
def test_table1_refuses_what_train_py_would_before_any_run_starts(flag, words, tmp_path, capsys):
    """A setting every run's train.py would refuse: one line at once, no folder made."""
    code = table1.main([flag, "--only=vanilla", "--max_iters=2", f"--root={tmp_path / 'root'}",
                        f"--results={tmp_path / 'res'}"])
    assert code == 2 and one_line(capsys, "table1.py").startswith(f"table1.py: error: {words}")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("train_config", [{"lr": 1e-3}, [1, 2]], ids=["no max_iters", "not a dict"])
def test_table1_trains_afresh_over_a_foreign_checkpoint(train_config, tmp_path):
    """A ckpt.pt without result.json whose plain data is not a run's: no run, as train.py judges it."""
    run = table1.plan(["vanilla"], [0], ())[0]
    (tmp_path / run["name"]).mkdir()
    torch.save({"train_config": train_config, "iter_num": 3}, tmp_path / run["name"] / "ckpt.pt")
    assert table1.stage(run, str(tmp_path / run["name"]), 5) == ("fresh", None)


def live_processes(word):
    """The pids of the processes whose command line holds word (Linux's /proc)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    pids.append(int(pid))
        except OSError:  # ended meanwhile
            pass
    return pids


def wait_for(condition, what, p):
    deadline = time.time() + HANG
    while not condition():
        if p.poll() is not None:
            raise AssertionError(f"table1.py ended before {what}: {p.communicate()}")
        assert time.time() < deadline, what
        time.sleep(0.2)


def printed(run, words, since=0):
    """Whether the train.py of the run folder has printed words yet (into its train.out), past the first
    `since` characters."""
    return (run / "train.out").is_file() and words in (run / "train.out").read_text(errors="replace")[since:]


def held(folder):
    """Whether a live process holds the run folder's lock (the one train.py takes)."""
    try:
        if runfiles.own(str(folder), note=False):
            runfiles.disown(str(folder))
        return False
    except ValueError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc") or not hasattr(signal, "SIGTERM"),
                    reason="needs POSIX signals and /proc to list processes")
@pytest.mark.parametrize("offline", [False, True])
def test_sigterm_to_table1_stops_its_runs_and_a_rerun_is_not_refused(tmp_path, offline):
    """table1.py with two runs at once, SIGTERM once both train: each run saves a checkpoint and ends,
    table1.py waits for them, says so in one line and exits 130; no process of theirs survives. A rerun's
    runs then take their folders (nothing refuses them as live), continue from their checkpoints, and stop
    with it in turn. Offline too: runs of --dataset=shakespeare_char that trained on pydoc's text continue."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # train.py's lines reach its train.out as they are printed
    if offline:  # the download fails: train.py falls back on pydoc's text
        env["NANOMESH_SHAKESPEARE_URL"] = (tmp_path / "nowhere.txt").as_uri()
    else:
        (tmp_path / "text.txt").write_text(TEXT)
        prepare("shakespeare_char", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"),
                log=lambda *a: None)
    root = tmp_path / "root"
    cmd = [sys.executable, os.path.join(ROOT, "tools", "table1.py"), "--only=vanilla,base", "--seeds=0", "--jobs=2",
           "--max_iters=100000", f"--root={root}", f"--results={tmp_path / 'res'}", f"--data_root={tmp_path / 'data'}"]
    runs = [root / "vanilla_s0", root / "base_s0"]
    for attempt, words in (("first", "iter 0: train loss"), ("rerun", "model ")):  # training; the folder taken
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        since = {r: len((r / "train.out").read_text()) if (r / "train.out").exists() else 0 for r in runs}
        try:
            wait_for(lambda: all(printed(r, words, since[r]) for r in runs), f"both runs print {words!r}", p)
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=HANG)
        finally:  # a failed test leaves nothing running
            for pid in set(live_processes(str(root))):  # table1.py's command line names root too
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert p.returncode == 130, (out, err)
        assert err == ("\ntable1.py: stopped by SIGTERM, and its runs with it, each saving a checkpoint: the same "
                       "command again continues them (finished ones are kept)\n"), err
        assert live_processes(str(root)) == [] and not any(held(r) for r in runs)
        if attempt == "first":
            for r in runs:
                text = (r / "train.out").read_text()
                assert "SIGTERM: finishing this step, then saving a checkpoint" in text and \
                    "checkpoint saved" in text, text
                assert (r / "ckpt.pt").exists()
        else:  # the same train.out and log go on: one output, one curve
            assert all(f"{r.name}: continuing from iter " in out for r in runs), out
            assert all((r / "train.out").read_text().count("model ") == 2 for r in runs)
    assert not (tmp_path / "res").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc") or not hasattr(signal, "SIGKILL"),
                    reason="needs POSIX signals and /proc to list processes")
def test_kill_9_of_table1_ends_its_run_and_a_rerun_continues_it(tmp_path):
    """kill -9 of table1.py while its run trains: the run, its launcher gone, saves a checkpoint and ends on
    its own (no orphan keeps training or holds the folder); a rerun continues that run from its checkpoint."""
    (tmp_path / "text.txt").write_text(TEXT)
    prepare("shakespeare_char", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"),
            log=lambda *a: None)
    root, run = tmp_path / "root", tmp_path / "root" / "vanilla_s0"
    cmd = [sys.executable, os.path.join(ROOT, "tools", "table1.py"), "--only=vanilla", "--seeds=0",
           "--max_iters=100000", f"--root={root}", f"--results={tmp_path / 'res'}", f"--data_root={tmp_path / 'data'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        wait_for(lambda: printed(run, "iter 0: train loss"), "the run trains", p)
        p.kill()
        p.communicate(timeout=HANG)
        deadline = time.time() + HANG
        while live_processes(str(root)):  # the run, alone now, ends by itself
            assert time.time() < deadline, "the run outlives table1.py"
            time.sleep(0.2)
        assert not held(run)
        text = (run / "train.out").read_text()  # its output, appended to by every run of it
        assert "is gone: finishing this step, then saving a checkpoint" in text and "checkpoint saved" in text, text
        saved = torch.load(run / "ckpt.pt", weights_only=True)["iter_num"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        wait_for(lambda: printed(run, "model ", since=len(text)), "the rerun takes the run", p)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=HANG)
    finally:  # a failed test leaves nothing running
        for pid in set(live_processes(str(root))):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert p.returncode == 130 and " --init_from=resume)" in out, (out, err)
    assert torch.load(run / "ckpt.pt", weights_only=True)["iter_num"] > saved


BAD_CYCLE_INPUTS = [  # (which file, its content, words of the one-line error)
    ("sweep", "[1, 2]", "is not a table1.json of tools/table1.py (it holds no list of \"runs\", but list); "
                        "give --sweep the table1.json of a tools/table1.py run"),
    ("sweep", '{"version": 1, "rows": []}', "is not a table1.json of tools/table1.py (it holds no list of "
                                            "\"runs\", but other keys)"),
    ("choices", '{"runs": [[1]]}', "holds a run record that is not a JSON object ([1]); give --choices"),
    ("choices", '{"runs": [{"variant": "mesh", "layout": "2+4R2+2", "seed": 0}]}',
     "holds a run whose val_loss is None, not a number; give --choices the table1.json"),
    ("choices", '{"runs": [{"variant": "mesh", "layout": "2+4R2+2", "seed": 0, "val_loss": true}]}',
     "holds a run whose val_loss is True, not a number"),
    ("sweep", '{"runs": [', "is not JSON (Expecting value, line 1 column 11)"),
    ("result", '{"params": 3}', "holds a run whose variant is None, not a name; delete that run's folder"),
    ("result", '"done"', "holds a run record that is not a JSON object ('done')"),
]


@pytest.mark.parametrize("which, content, words", BAD_CYCLE_INPUTS, ids=[f"{w} {c[:20]}" for w, c, _ in BAD_CYCLE_INPUTS])
def test_cycle_names_a_file_of_another_kind_in_one_line(which, content, words, tmp_path, capsys):
    good = json.dumps({"runs": [dict(variant="base", layout="2+4R2+2", seed=0, val_loss=1.9)]})
    files = {name: tmp_path / f"{name}.json" for name in ("sweep", "choices")}
    for name, path in files.items():
        path.write_text(content if name == which else good)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    bad = files.get(which, tmp_path / "runs" / "a" / "result.json")
    if which == "result":
        bad.write_text(content)
    from tools import cycle
    code = cycle.main([f"--sweep={files['sweep']}", f"--choices={files['choices']}", f"--root={tmp_path / 'runs'}",
                f"--results={tmp_path / 'out'}"])
    err = one_line(capsys, "cycle.py")
    assert code == 2 and err.startswith(f"cycle.py: error: {bad} ") and words in err, err
    assert not (tmp_path / "out").exists()


def test_cycle_never_writes_its_tables_into_a_dataset(data_root, tmp_path, capsys):
    """cycle.py's --results, checked as table1.py's: a dataset's folder refused in one line, nothing written."""
    from tools import cycle
    sweep, dataset = tmp_path / "sweep.json", os.path.join(data_root, "tiny")
    sweep.write_text(json.dumps({"runs": [dict(variant="base", layout="2+4R2+2", seed=0, val_loss=1.9)]}))
    before = snapshot(data_root)
    assert cycle.main([f"--sweep={sweep}", f"--choices={sweep}", f"--root={tmp_path}", f"--results={dataset}"]) == 2
    assert one_line(capsys, "cycle.py") == (f"cycle.py: error: --results={dataset} is a folder of the dataset in "
                                            f"{dataset}, which no output may write; give another folder\n")
    assert snapshot(data_root) == before


@pytest.mark.parametrize("tool", ["probe", "bench", "routing"])
@pytest.mark.parametrize("target", ["ckpt.pt", "log.jsonl", "a link to ckpt.pt", "the dataset's meta.json",
                                    "the dataset's train.bin", "a shard of a sharded checkpoint",
                                    "a new file in the dataset's folder",
                                    "a shard of a kept sharded checkpoint"])
def test_an_output_file_is_never_a_file_of_a_run_or_a_dataset(tool, target, tiny_ckpt, data_root, tmp_path, capsys):
    from tools import bench, routing
    (tiny_ckpt / "log.jsonl").write_text('{"iter": 0, "loss": 3.2}\n')
    (tiny_ckpt / "shards-00000004").mkdir()
    (tiny_ckpt / "shards-00000004" / "__0_0.distcp").write_bytes(b"a shard")
    shutil.copytree(tiny_ckpt / "shards-00000004", tiny_ckpt / "ckpt_4" / "shards-00000004")  # --keep_every's
    (tmp_path / "link.json").symlink_to(tiny_ckpt / "ckpt.pt")
    dataset = os.path.join(data_root, "tiny")
    path, kind, folder, name = {
        "ckpt.pt": (tiny_ckpt / "ckpt.pt", "run", tiny_ckpt, "ckpt.pt"),
        "log.jsonl": (tiny_ckpt / "log.jsonl", "run", tiny_ckpt, "log.jsonl"),
        "a link to ckpt.pt": (tmp_path / "link.json", "run", tiny_ckpt, "ckpt.pt"),
        "the dataset's meta.json": (os.path.join(dataset, "meta.json"), "dataset", dataset, "meta.json"),
        "the dataset's train.bin": (os.path.join(dataset, "train.bin"), "dataset", dataset, "train.bin"),
        "a shard of a sharded checkpoint": (tiny_ckpt / "shards-00000004" / "__0_0.distcp", "run", tiny_ckpt,
                                            os.path.join("shards-00000004", "__0_0.distcp")),
        "a new file in the dataset's folder": (os.path.join(dataset, "notes.json"), "dataset", dataset, "notes.json"),
        "a shard of a kept sharded checkpoint": (tiny_ckpt / "ckpt_4" / "shards-00000004" / "__0_0.distcp", "run",
                                                 tiny_ckpt, os.path.join("ckpt_4", "shards-00000004", "__0_0.distcp")),
    }[target]
    before = snapshot(tiny_ckpt, data_root)
    if tool == "probe":
        code = probe.main([f"--out_dir={tiny_ckpt}", "--num_samples=2", f"--json={path}"])
    elif tool == "routing":
        code = routing.main([f"--out_dir={tiny_ckpt}", "--text=the", f"--json={path}"])
    else:
        code = bench.main(["--n_embd=32", "--n_head=2", "--layout=1+1R2+1", "--block_size=16", f"--json={path}"])
    err = one_line(capsys, f"{tool}.py")
    assert code == 2 and err.strip().endswith(f"error: --json={path} is the {name} of the {kind} in {folder}, which "
                                              f"no output may write; give another file name"), err
    assert snapshot(tiny_ckpt, data_root) == before


def test_a_run_with_its_log_alone_is_a_run_and_an_ending_in_capitals_is_that_ending(tmp_path):
    """A run folder before its first checkpoint (log.jsonl alone) keeps its files; FIG.PNG ends in .png."""
    from configurator import UsageError
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text('{"iter": 0, "loss": 3.2}\n')
    result = tmp_path / "run" / "result.json"
    with pytest.raises(UsageError) as e:
        reading.check_writable(str(result), "json", ".json")
    assert str(e.value) == (f"--json={result} is the result.json of the run in {tmp_path / 'run'}, which no output "
                            f"may write; give another file name")
    reading.check_writable(str(tmp_path / "FIG.PNG"), "png", ".png")


def test_an_output_on_a_link_to_nothing_names_where_it_points(tmp_path):
    """A folder's writer (export_hf.py's --to) would fail naming its temporary folder, a file's replace
    the link: both refused first, in one line."""
    from configurator import UsageError
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    for flag, folder, kind in [("to", True, "folder"), ("json", False, "file name")]:
        with pytest.raises(UsageError) as e:
            reading.check_writable(str(link), flag, folder=folder)
        assert str(e.value) == f"--{flag}={link} is a link to {tmp_path / 'gone'}, which is not there; give a {kind}"
    assert os.listdir(tmp_path) == ["out"] and os.readlink(link) == str(tmp_path / "gone")


def test_a_figure_is_never_drawn_into_a_run_or_a_dataset(tiny_ckpt, data_root, capsys):
    """draw.py's and routing.py's --png, routing.py's --json and probe.py's --png folder: refused in one line
    inside a sharded checkpoint's folder (onto a shard too), on a kept checkpoint (ckpt_ITER.pt, the folder
    ckpt_ITER/) or in a dataset's folder, before any model is built or run."""
    from tools import draw, routing
    (tiny_ckpt / "shards-00000004").mkdir()
    dataset = os.path.join(data_root, "tiny")
    before = snapshot(tiny_ckpt, data_root)
    for tool, argv, words in [
            (draw, [f"--png={tiny_ckpt}/shards-00000004/model.png"],
             f"is the {os.path.join('shards-00000004', 'model.png')} of the run in {tiny_ckpt}"),
            (routing, [f"--out_dir={tiny_ckpt}", f"--json={tiny_ckpt}/shards-00000004/__0_0.distcp"],
             f"is the {os.path.join('shards-00000004', '__0_0.distcp')} of the run in {tiny_ckpt}"),
            (routing, [f"--out_dir={tiny_ckpt}", f"--png={dataset}/sentence.png"],
             f"is the sentence.png of the dataset in {dataset}"),
            (probe, [f"--out_dir={tiny_ckpt}", f"--png={dataset}"], f"is a folder of the dataset in {dataset}"),
            (probe, [f"--out_dir={tiny_ckpt}", f"--png={tiny_ckpt}/shards-00000004"],
             f"is a folder of the run in {tiny_ckpt}"),
            (probe, [f"--out_dir={tiny_ckpt}", f"--json={tiny_ckpt}/ckpt_4.pt"],  # kept checkpoints
             f"is the ckpt_4.pt of the run in {tiny_ckpt}"),
            (probe, [f"--out_dir={tiny_ckpt}", f"--png={tiny_ckpt}/ckpt_8"], f"is a folder of the run in {tiny_ckpt}")]:
        assert tool.main(argv) == 2
        err = one_line(capsys, f"{tool.__name__.split('.')[-1]}.py")
        assert words in err and "which no output may write" in err, err
    assert snapshot(tiny_ckpt, data_root) == before


def finished_run(folder, max_iters, how):
    """A run folder holding a finished run of max_iters: its result.json, or (killed while evaluated) its final
    checkpoint alone."""
    folder.mkdir(parents=True)
    if how == "result.json":
        (folder / "result.json").write_text(json.dumps(dict(
            name=folder.name, seed=0, max_iters=max_iters, params=1, val_loss=1.5, ms_per_iter=None, val_curve=[],
            dataset="tiny", data_sha256=None)))
        return
    model = RecursiveGPT(Config(vocab_size=8, block_size=16, n_embd=32, n_head=2, layout="1+1R2+1"))
    checkpoint.save(dict(model=model.state_dict(), model_config=model.config.to_dict(), iter_num=max_iters,
                         train_config=dict(dataset="tiny", data_root="data", max_iters=max_iters)),
                    str(folder / "ckpt.pt"))


@pytest.mark.parametrize("how", ["result.json", "its final checkpoint"])
def test_table1_refuses_a_finished_run_of_other_settings(how, tmp_path, capsys):
    """A finished 30-iteration run asked again with --max_iters=10 is refused, naming --root, before anything
    trains: neither it nor the run beside it is touched."""
    root = tmp_path / "root"
    finished_run(root / "vanilla_s1", 30, how)
    before = snapshot(root)
    code = table1.main(["--only=vanilla", "--seeds=0,1", "--max_iters=10", f"--root={root}",
                 f"--results={tmp_path / 'res'}"])
    assert code == 2
    folder = root / "vanilla_s1"
    assert one_line(capsys, "table1.py") == (
        f"table1.py: error: {folder} holds a finished run of --max_iters=30, not --max_iters=10, which table1.py never replaces; "
        f"give another --root, or --max_iters=30 to use it, or delete {folder} to train it again\n")
    assert snapshot(root) == before and listed(root) == ["vanilla_s1"]
    assert not (tmp_path / "res").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to list processes")
def test_a_second_table1_on_one_root_is_refused_at_once(tmp_path):
    """Two table1.py on one --root: the second is refused at once in one line, trains nothing, and the first
    goes on training its run."""
    (tmp_path / "text.txt").write_text(TEXT)
    prepare("shakespeare_char", input=str(tmp_path / "text.txt"), out_root=str(tmp_path / "data"),
            log=lambda *a: None)
    root = tmp_path / "root"
    cmd = [sys.executable, os.path.join(ROOT, "tools", "table1.py"), "--seeds=0", "--max_iters=100000",
           f"--root={root}", f"--results={tmp_path / 'res'}", f"--data_root={tmp_path / 'data'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen([*cmd, "--only=vanilla"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path, env=env)
    try:
        wait_for(lambda: printed(root / "vanilla_s0", "iter 0: train loss"), "the first trains", first)
        second = subprocess.run([*cmd, "--only=vanilla,base"], capture_output=True, text=True, cwd=tmp_path,
                                timeout=HANG)
        assert second.returncode == 2 and second.stderr == (
            f"table1.py: error: another run is using --root={root} (it holds the folder's lock); wait for it to "
            f"end, or choose another --root\n"), second.stderr
        assert listed(root) == ["vanilla_s0"] and first.poll() is None
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=HANG)
    finally:
        for pid in set(live_processes(str(root))):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert first.returncode == 130 and "stopped by SIGTERM" in err, (out, err)
    assert "checkpoint saved" in (root / "vanilla_s0" / "train.out").read_text()


# -----------------------------------------------------------------------------
# A bug is not bad input

@pytest.mark.slow
def test_a_bug_run_through_a_tool_shows_its_traceback_and_a_bad_flag_stays_one_line(tmp_path):
    """A student's bug planted in a copy of mesh.py (PyTorch's ValueError in the loss), timed by
    bench.py: the output is the traceback, naming the copy's file and the planted line. Only the
    project's errors are one line, as a misspelt flag of the same tool still is."""
    copy, planted = copy_with_a_bug(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's modules, not ROOT's
    flags = ["--layout=1+1R2+1", "--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=2",
             "--schemes=base", "--iters=1", "--warmup=1", "--threads=1", "--decode=false"]
    r = subprocess.run([sys.executable, "tools/bench.py", *flags], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback (most recent call last):" in r.stderr, r.stderr[-3000:]
    assert f'File "{copy / "mesh.py"}", line {planted}, in forward' in r.stderr, r.stderr[-3000:]
    assert "ValueError: Expected input batch_size" in r.stderr.splitlines()[-1]
    r = subprocess.run([sys.executable, "tools/bench.py", *flags, "--iter=1"], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=HANG)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", "bench.py: error: unknown setting 'iter' in the command line (did you mean --iters?); "
               "see python tools/bench.py --help\n")


# -----------------------------------------------------------------------------
# A tool's stdout that fails stops nothing

def full_device(cmd):
    """cmd > /dev/full: every write of stdout fails (a full disk under a log)."""
    with open("/dev/full", "w") as full:
        return subprocess.run(cmd, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=HANG), ENOSPC


def reader_gone(cmd):
    """cmd | a reader that has already left: every write of stdout meets a broken pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(cmd, cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=HANG), EPIPE
    finally:
        os.close(write)


def tool_runs(tiny_ckpt, tmp_path):
    """(tool, the name its lines start with, its flags, the files it writes) of three tools that
    print and write."""
    for name in ("sweep", "choices"):
        (tmp_path / f"{name}.json").write_text('{"runs": []}')
    cycle = [f"--sweep={tmp_path / 'sweep.json'}", f"--choices={tmp_path / 'choices.json'}",
             f"--root={tmp_path / 'none'}", f"--results={tmp_path / 'cycle'}"]
    return [
        ("probe.py", "probe.py", [f"--out_dir={tiny_ckpt}", "--num_samples=2",
                                  f"--json={tmp_path / 'p.json'}"], ["p.json"]),
        ("routing.py", "routing.py", [f"--out_dir={tiny_ckpt}", "--tokens=8",
                                      f"--json={tmp_path / 'r.json'}"], ["r.json"]),
        ("cycle.py", "cycle.py", cycle, ["cycle/cycle.md", "cycle/cycle.json"]),
    ]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full") or not hasattr(os, "pipe"),
                    reason="needs /dev/full (Linux) and pipes")
@pytest.mark.parametrize("stdout", [full_device, reader_gone], ids=lambda f: f.__name__)
def test_a_tools_failing_stdout_stops_nothing(stdout, tiny_ckpt, tmp_path):
    """A tool whose stdout fails (> /dev/full, a reader gone) writes its files and exits 0, with one
    note on stderr that names standard output; never a traceback."""
    for tool, prog, flags, files in tool_runs(tiny_ckpt, tmp_path):
        r, why = stdout([sys.executable, os.path.join("tools", tool), *flags])
        assert (r.returncode, r.stderr) == (0, stdout_note(prog, why) + "\n"), r.stderr[-3000:]
        for name in files:
            path = tmp_path / name
            assert path.stat().st_size > 0, path
            if name.endswith(".json"):
                plain.read_json(str(path))  # whole JSON


# -----------------------------------------------------------------------------
# Bad text, names and sizes: one line with the fix, exit 2, nothing written, before any model runs

@pytest.mark.parametrize("script, flags, message", [
    ("tools/routing.py", [b"--text=the \xff king"], "--text='the \\udcff king' is not UTF-8 text"),
    ("tools/routing.py", [b"--text=\xed\xa0\x80"], "--text='\\udced\\udca0\\udc80' is not UTF-8 text"),
    ("sample.py", [b"--start=\xffROMEO"], "--start='\\udcffROMEO' is not UTF-8 text"),
], ids=["routing, a byte not UTF-8", "routing, an encoded surrogate", "sample, a byte not UTF-8"])
def test_a_command_line_that_is_not_utf8_text_is_one_line(script, flags, message, tiny_ckpt, tmp_path):
    """Bytes no UTF-8 text has (Python keeps them as lone surrogates) in a text setting: one line, exit 2."""
    output = [f"--json={tmp_path / 'r.json'}"] if script.endswith("routing.py") else []
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), f"--out_dir={tiny_ckpt}", *flags, *output],
                       capture_output=True, cwd=tmp_path, timeout=HANG)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and message in err and "give it in UTF-8" in err, err
    assert os.listdir(tmp_path) == ["run"]


def test_a_config_files_lone_surrogate_is_one_line(tiny_ckpt, tmp_path, capsys):
    from tools import routing
    (tmp_path / "c.json").write_text('{"text": "a \\ud800 b"}')
    assert routing.main([str(tmp_path / "c.json"), f"--out_dir={tiny_ckpt}"]) == 2
    assert "--text='a \\ud800 b' is not UTF-8 text" in one_line(capsys, "routing.py")


@pytest.mark.parametrize("tool, flags, message", [
    ("draw", ["--png=model.pgn"], "--png=model.pgn does not end in .png; give a file name that does"),
    ("routing", ["--text=the", "--png=model.pgn"], "--png=model.pgn does not end in .png; give a file name that does"),
    ("curves", ["--png=curves.pgn"], "--png=curves.pgn does not end in .png; give a file name that does"),
    ("probe", ["--png=a_file"], "--png=a_file is a file; give a folder"),
    ("routing", ["--text="], "--text is empty; give a sentence, or leave --text out for a window of the validation "
                             "split"),
    ("draw", ["--layout=1000000000"], "--layout=1000000000 applies 1,000,000,000 blocks; a drawing or a summary "
                                      "shows at most 256"),
    ("draw", ["--layout=1+1R100000+1"], "--layout=1+1R100000+1 applies 100,002 blocks; a drawing or a summary "
                                        "shows at most 256"),
    ("draw", ["--scheme=mesh", "--n_slots=100000000"], "--n_slots=100000000 must be at most 256"),
    ("draw", ["--n_embd=100000000000"], "--n_embd=100000000000 must be at most 65536"),
])
def test_bad_names_and_sizes_are_refused_before_anything_is_built(tool, flags, message, tiny_ckpt, tmp_path, capsys,
                                                                   monkeypatch):
    from support import command
    from tools import curves, draw, routing
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine")
    ran = []
    monkeypatch.setattr(RecursiveGPT, "forward", lambda *a, **kw: ran.append(1))  # no model runs first
    monkeypatch.setattr(draw, "summary", lambda cfg: ran.append(1))  # nor is one built
    fn = {"draw": draw.main, "routing": routing.main, "probe": probe.main,
          "curves": lambda argv: command.main("tools/curves.py", curves.run, argv, curves.CurvesConfig)}[tool]
    assert fn(([] if tool == "draw" else [f"--out_dir={tiny_ckpt}"]) + flags) == 2
    assert one_line(capsys, f"{tool}.py").strip() == f"{tool}.py: error: {message}" and not ran
    assert listed(tmp_path) == ["a_file", "run"]


def test_the_word_none_is_a_text_to_route(tiny_ckpt, capsys):
    """--text=none routes the four characters n, o, n, e; only leaving --text out routes a validation window."""
    from tools import routing
    assert routing.main([f"--out_dir={tiny_ckpt}", "--text=none"]) == 0
    assert "token             n    o    n    e" in capsys.readouterr().out
