"""
Tests for the data pipeline (data/prepare.py). Fast, offline, and they only write under tmp_path.

    python -m pytest test_data.py -q

The GPT-2 tests need tiktoken's vocabulary: set TIKTOKEN_CACHE_DIR to a folder holding
tiktoken's cached files when offline; without it they are skipped.
"""
import hashlib
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import data.prepare as prep
from data.prepare import PrepareError, Tokenizer, ensure_dataset, load_split, prepare

REPO = os.path.dirname(os.path.abspath(__file__))
TEXT = "".join(f"Line {i}: to be, or not to be; that is the question! {i * i}\n" for i in range(300))
UNICODE = "naïve café — “quoted” 日本語 😀\n" * 40 + "a line with no newline at the end é"


def write(path, content):
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)


def read_bins(d):
    meta = json.load(open(os.path.join(d, "meta.json"), encoding="utf-8"))
    return meta, load_split(d, "train"), load_split(d, "val")


def quiet(msg):
    pass


@pytest.fixture
def gpt2():
    try:
        return Tokenizer("gpt2")
    except PrepareError as e:
        pytest.skip(f"GPT-2 vocabulary unavailable (set TIKTOKEN_CACHE_DIR): {e}")


def test_char_prepare(tmp_path):
    src = write(tmp_path / "in.txt", UNICODE)
    d = prepare("mine", input=src, out_root=str(tmp_path / "out"), log=quiet)
    assert d == str(tmp_path / "out" / "mine")
    meta, train, val = read_bins(d)
    assert meta["tokenizer"] == "char" and meta["dtype"] == "uint16"
    assert "".join(meta["chars"]) == "".join(sorted(set(UNICODE))) and meta["vocab_size"] == len(set(UNICODE))
    n = len(UNICODE)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val)) == (n * 9 // 10, n - n * 9 // 10)
    assert meta["sha256"] == hashlib.sha256(UNICODE.encode()).hexdigest()
    assert meta["source"] == os.path.abspath(src)
    assert train.dtype == np.uint16
    tok = Tokenizer.load(d)
    assert tok.decode(np.concatenate([train, val])) == UNICODE
    assert Tokenizer.load(os.path.join(d, "meta.json")).to_meta() == tok.to_meta()
    assert sorted(os.listdir(tmp_path / "out")) == ["mine"]  # no staging leftovers
    assert sorted(os.listdir(d)) == ["meta.json", "train.bin", "val.bin"]


@pytest.mark.parametrize("text", [TEXT, UNICODE, "x" * 1000 + "é" * 500], ids=["ascii", "unicode", "one-line"])  # the last has no newline
def test_char_chunked_equals_one_shot(tmp_path, text):
    src = write(tmp_path / "in.txt", text)
    a = prepare("a", input=src, out_root=str(tmp_path), chunk_bytes=1 << 30, log=quiet)
    for chunk in (1, 7, 64):
        b = prepare("b", input=src, out_root=str(tmp_path), chunk_bytes=chunk, log=quiet)
        for f in ("train.bin", "val.bin"):
            assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read()


def test_gpt2_prepare(tmp_path, gpt2):
    text = TEXT + "<|endoftext|>\n" + UNICODE
    d = prepare("g", input=write(tmp_path / "in.txt", text), tokenizer="gpt2",
                out_root=str(tmp_path), log=quiet)
    meta, train, val = read_bins(d)
    assert meta["tokenizer"] == "gpt2" and meta["encoding"] == "gpt2" and meta["vocab_size"] == 50257
    assert meta["dtype"] == "uint16" and train.dtype == np.uint16
    ids = gpt2._enc.encode(text, allowed_special={"<|endoftext|>"})
    assert np.concatenate([train, val]).tolist() == ids
    assert gpt2.decode(ids + [50300]) == text  # padding ids are dropped


def test_gpt2_chunked(tmp_path, gpt2):
    src = write(tmp_path / "in.txt", TEXT + UNICODE)
    a = prepare("a", input=src, tokenizer="gpt2", out_root=str(tmp_path), chunk_bytes=1 << 30, log=quiet)
    b = prepare("b", input=src, tokenizer="gpt2", out_root=str(tmp_path), chunk_bytes=64, log=quiet)
    # BPE is applied per chunk and chunks are cut after newlines; every line here is shorter
    # than a chunk, so that is encoding groups of whole lines, which for this text is the same
    # as encoding each line (and the whole text) on its own
    lines = (TEXT + UNICODE).splitlines(keepends=True)
    per_line = [i for line in lines for i in gpt2.encode(line)]
    _, tb, vb = read_bins(b)
    assert np.concatenate([tb, vb]).tolist() == per_line
    _, ta, va = read_bins(a)
    assert np.concatenate([ta, va]).tolist() == gpt2.encode(TEXT + UNICODE)


def test_gpt2_unavailable(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import fails, like a missing vocabulary
    with pytest.raises(PrepareError, match="GPT-2 vocabulary could not be loaded.*TIKTOKEN_CACHE_DIR"):
        prepare("g", input=write(tmp_path / "in.txt", TEXT), tokenizer="gpt2",
                out_root=str(tmp_path / "out"), log=quiet)
    assert not (tmp_path / "out").exists()


def test_pydoc_offline(tmp_path, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("pydoc must not touch the network")
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    meta, train, val = read_bins(prepare("pydoc", out_root=str(tmp_path), log=quiet))
    assert meta["source"] == "pydoc_data.topics" and meta["tokenizer"] == "char"
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics))
    assert Tokenizer.from_meta(meta).decode(np.concatenate([train, val])) == text


def test_download_ok_and_mismatch(tmp_path, monkeypatch):
    served = write(tmp_path / "served.txt", TEXT)
    url = (tmp_path / "served.txt").as_uri()
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as e:  # the real hash does not match our small file
        prepare("shakespeare_char", url=url, out_root=str(out), log=quiet)
    got = hashlib.sha256(TEXT.encode()).hexdigest()
    assert prep.SHAKESPEARE_SHA256 in str(e.value) and got in str(e.value)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(PrepareError):  # an existing out_root is left exactly as it was
        prepare("shakespeare_char", url=url, out_root=str(out), log=quiet)
    assert os.listdir(out) == []
    monkeypatch.setattr(prep, "SHAKESPEARE_SHA256", got)
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", url)
    assert ensure_dataset("shakespeare_char", out_root=str(out), log=quiet) == "shakespeare_char"
    meta, train, val = read_bins(out / "shakespeare_char")
    assert meta["source"] == url and meta["sha256"] == got
    assert open(out / "shakespeare_char" / "input.txt", "rb").read() == open(served, "rb").read()
    assert Tokenizer.from_meta(meta).decode(list(train) + list(val)) == TEXT


def test_offline_fallback_to_pydoc(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", (tmp_path / "missing.txt").as_uri())
    logs = []
    assert ensure_dataset("shakespeare_char", out_root=str(tmp_path), log=logs.append) == "pydoc"
    notes = [m for m in logs if "could not be downloaded" in m]
    assert len(notes) == 1 and "'pydoc'" in notes[0] and "\n" not in notes[0]
    assert sorted(os.listdir(tmp_path)) == ["pydoc"]
    assert ensure_dataset("pydoc", out_root=str(tmp_path), log=logs.append) == "pydoc"  # already there
    # no fallback for GPT-2 Shakespeare (without tiktoken's files the vocabulary fails first)
    with pytest.raises(PrepareError, match="could not download|GPT-2 vocabulary"):
        ensure_dataset("shakespeare", out_root=str(tmp_path), log=quiet)
    with pytest.raises(PrepareError, match="never prepared.*--dataset mine --input FILE"):
        ensure_dataset("mine", out_root=str(tmp_path), log=quiet)


def test_errors(tmp_path):
    out = tmp_path / "out"
    cases = [
        (str(tmp_path / "nope.txt"), "nope.txt does not exist"),
        (write(tmp_path / "empty.txt", b""), "empty.txt is empty"),
        (write(tmp_path / "bad.txt", b"ab\xffcd"), "bad.txt is not UTF-8: invalid byte 0xff at byte offset 2"),
        (write(tmp_path / "one.txt", "x"), "too small"),
    ]
    for src, msg in cases:
        for chunk in (1, 1 << 20):
            with pytest.raises(PrepareError, match=msg):
                prepare("x", input=src, out_root=str(out), chunk_bytes=chunk, log=quiet)
    # an invalid byte far into a chunked file, and a truncated character at the very end
    with pytest.raises(PrepareError, match="byte offset 1002$"):
        prepare("x", input=write(tmp_path / "b2", b"ab\n" * 334 + b"\xe2\x82"), out_root=str(out), chunk_bytes=10)
    with pytest.raises(PrepareError, match=r"did you mean 'shakespeare_char'\?.*pydoc, shakespeare, shakespeare_char"):
        prepare("shakespear_char", out_root=str(out))
    assert not out.exists()


def test_tokenizer_and_dtype():
    tok = Tokenizer("char", chars=sorted("abc \n"))
    assert tok.decode(tok.encode("a cab\n")) == "a cab\n"
    assert tok.decode([0, 1, 99]) == "\n "  # out-of-vocabulary (padding) ids are dropped
    with pytest.raises(PrepareError, match="characters not in the vocabulary: 'é', '€'"):
        tok.encode("abc €é")
    assert Tokenizer.from_meta({"tokenizer": "char", "chars": list("ba"), "vocab_size": 2}).encode("ab") == [1, 0]
    assert prep.dtype_for_vocab(65) == "uint16" and prep.dtype_for_vocab(65535) == "uint16"
    assert prep.dtype_for_vocab(65536) == "uint32" and prep.dtype_for_vocab(100277) == "uint32"


def test_uint32_vocab(tmp_path):
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000) + "\n"
    meta, train, val = read_bins(prepare("big", input=write(tmp_path / "big.txt", text),
                                         out_root=str(tmp_path), log=quiet))
    assert meta["dtype"] == "uint32" and train.dtype == np.uint32 and meta["vocab_size"] > 65535
    assert Tokenizer.from_meta(meta).decode(np.concatenate([train, val])) == text


def test_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "data/prepare.py", *a, "--out_root", str(tmp_path)],
                                    cwd=REPO, capture_output=True, text=True)
    r = run("--dataset", "x", "--input", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [f"prepare.py: error: input file {tmp_path / 'missing.txt'} does not exist"]
    r = run("--dataset", "x", "--input", write(tmp_path / "in.txt", TEXT))
    assert r.returncode == 0 and json.load(open(tmp_path / "x" / "meta.json"))["train_tokens"] > 0
    r = subprocess.run([sys.executable, "data/prepare.py", "--dataset", "y", "--input", str(tmp_path / "in.txt"),
                        "--out_root", str(tmp_path / "in.txt")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"prepare.py: error: cannot use {tmp_path / 'in.txt'}: File exists; check the path"]


def test_damaged_dataset_names_the_file_and_the_fix(tmp_path):
    prepare("tiny", input=write(tmp_path / "t.txt", TEXT), out_root=str(tmp_path), log=quiet)
    os.remove(tmp_path / "tiny" / "train.bin")
    with pytest.raises(PrepareError, match=r"tiny/train.bin is missing; prepare the dataset again: "
                                           r"python data/prepare.py --dataset tiny$"):
        load_split(str(tmp_path / "tiny"), "train")
    (tmp_path / "tiny" / "meta.json").write_text('{"tokenizer": "char",')
    for call in (lambda: load_split(str(tmp_path / "tiny"), "val"), lambda: Tokenizer.load(str(tmp_path / "tiny"))):
        with pytest.raises(PrepareError, match=r"tiny/meta.json is damaged \(JSONDecodeError: .*\); prepare the dataset again"):
            call()


def test_checkpoint_dataset_finds_the_folder_from_anywhere(tmp_path, monkeypatch):
    prepare("tiny", input=write(tmp_path / "t.txt", TEXT), out_root=str(tmp_path / "data"), log=quiet)
    assert prep.checkpoint_dataset({"data_root": str(tmp_path / "data"), "dataset": "tiny"}) == str(tmp_path / "data" / "tiny")
    monkeypatch.chdir(tmp_path)  # a relative data_root, from the folder the run was trained in
    assert prep.checkpoint_dataset({"data_root": "data", "dataset": "tiny"}) == os.path.join("data", "tiny")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # ... and from elsewhere: then data/ beside data/prepare.py
    monkeypatch.setattr(prep, "DEFAULT_OUT_ROOT", str(tmp_path / "data"))
    assert prep.checkpoint_dataset({"data_root": "data", "dataset": "tiny"}) == str(tmp_path / "data" / "tiny")
    with pytest.raises(PrepareError, match=r"dataset 'nope' is not prepared \(no data/nope/meta.json\); "
                                           r"prepare it with: python data/prepare.py --dataset nope"):
        prep.checkpoint_dataset({"data_root": "data", "dataset": "nope"})
