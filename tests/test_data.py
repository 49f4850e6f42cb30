"""
Tests for the data pipeline (data/prepare.py, the write side; data/dataset.py and data/meta.py, the loading side). Fast, offline, and they only write under tmp_path.

    python -m pytest tests/test_data.py -q --all  # --all: its slow-marked tests too

The GPT-2 tests need tiktoken's vocabulary: set TIKTOKEN_CACHE_DIR to a folder holding
tiktoken's cached files when offline; without it they are skipped.
"""
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import data.dataset as loader
import data.meta as data_meta
import data.prepare as prep
from data.meta import DataError
from data.dataset import load_split
from data.prepare import ensure_dataset, prepare
from data.meta import Tokenizer
from conftest import listed, snapshot, train_bpe
from support import files as runfiles
from data.meta import dataset_folder
from data.trained_on import checkpoint_dataset
from data.bpe import bytes_to_unicode

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
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
    except DataError as e:
        pytest.skip(f"GPT-2 vocabulary unavailable (set TIKTOKEN_CACHE_DIR): {e}")


def test_char_prepare(tmp_path, monkeypatch):
    src, logs = write(tmp_path / "in.txt", UNICODE), []
    d = prepare("mine", input=src, out_root=str(tmp_path / "out"), log=logs.append)
    assert d == str(tmp_path / "out" / "mine")
    meta, train, val = read_bins(d)
    assert meta["tokenizer"] == "char" and meta["dtype"] == "uint16"
    assert "".join(meta["chars"]) == "".join(sorted(set(UNICODE))) and meta["vocab_size"] == len(set(UNICODE))
    n = len(UNICODE)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val)) == (n * 9 // 10, n - n * 9 // 10)
    assert len(logs) == 1 and logs[0].startswith(f"prepare: mine: 1,039 train + 116 val tokens, vocab "
                                                 f"{len(set(UNICODE))}, uint16 -> {d} (")
    assert meta["sha256"] == hashlib.sha256(UNICODE.encode()).hexdigest()
    assert meta["source"] == os.path.abspath(src)
    assert train.dtype == np.uint16
    tok = Tokenizer.load(d)
    assert tok.decode(np.concatenate([train, val])) == UNICODE
    assert Tokenizer.load(os.path.join(d, "meta.json")).to_meta() == tok.to_meta()
    assert listed(tmp_path / "out") == ["mine"]  # no staging leftovers
    assert listed(d) == ["meta.json", "train.bin", "val.bin"]
    monkeypatch.chdir(tmp_path)  # a relative --input: meta.json names the file wherever it is read from
    meta, _, _ = read_bins(prepare("rel", input="in.txt", out_root="out", log=quiet))
    assert meta["source"] == src


@pytest.mark.slow
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
    d = prepare("shakespeare", input=write(tmp_path / "in.txt", text),  # the dataset's own tokenizer: gpt2
                out_root=str(tmp_path), log=quiet)
    meta, train, val = read_bins(d)
    assert meta["tokenizer"] == "gpt2" and meta["encoding"] == "gpt2" and meta["vocab_size"] == 50257
    assert meta["dtype"] == "uint16" and train.dtype == np.uint16
    ids = gpt2._bpe._enc.encode(text, allowed_special={"<|endoftext|>"})
    assert np.concatenate([train, val]).tolist() == ids
    assert gpt2.decode(ids + [50300]) == text  # padding ids are dropped


@pytest.mark.parametrize("end", ["\n", "\r"], ids=["lines", "one line"])  # "\r": old Macs' line ends
def test_gpt2_chunked(tmp_path, gpt2, end):
    """Chunks are cut before a run of spaces or newlines, where GPT-2's pre-tokenizer splits too: blank lines,
    indents and trailing spaces are encoded as in the whole text (cut after a newline, 'be,\\n\\n' ending a chunk
    would end in one token where the whole text has two; cut at the run's last newline, '\n\n\t' would be split
    where the whole text's '\n\n' is one). A line longer than a chunk was cut in a word."""
    text = "To be,\n\nor not  \n    to be?\n\n\tor\n\n\n".replace("\n", end) * 40 + "é 日本語 😀"
    src = write(tmp_path / "in.txt", text)
    for chunk in (16, 64, 1 << 30):
        _, t, v = read_bins(prepare("a", input=src, tokenizer="gpt2", out_root=str(tmp_path), chunk_bytes=chunk,
                                    log=quiet))
        assert np.concatenate([t, v]).tolist() == gpt2.encode(text)


def test_gpt2_unavailable(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import fails, like a missing vocabulary
    with pytest.raises(DataError, match="GPT-2 vocabulary could not be loaded.*TIKTOKEN_CACHE_DIR"):
        prepare("g", input=write(tmp_path / "in.txt", TEXT), tokenizer="gpt2",
                out_root=str(tmp_path / "out"), log=quiet)
    assert not (tmp_path / "out").exists()


def test_an_unknown_gpt2_encoding_in_meta_json_is_one_line():
    pytest.importorskip("tiktoken")
    with pytest.raises(DataError) as e:  # tiktoken's own words run over three lines
        Tokenizer.from_meta({"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "encoding": "nope"})
    assert "Unknown encoding nope" in str(e.value) and "\n" not in str(e.value), str(e.value)


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
    with pytest.raises(DataError) as e:  # the real hash does not match our small file
        prepare("shakespeare_char", url=url, out_root=str(out), log=quiet)
    got = hashlib.sha256(TEXT.encode()).hexdigest()
    assert prep.SHAKESPEARE_SHA256 in str(e.value) and got in str(e.value)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(DataError):  # an existing out_root is left exactly as it was
        prepare("shakespeare_char", url=url, out_root=str(out), log=quiet)
    assert os.listdir(out) == []
    monkeypatch.setattr(prep, "SHAKESPEARE_SHA256", got)
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", url)
    assert ensure_dataset("shakespeare_char", out_root=str(out), log=quiet) == "shakespeare_char"
    meta, train, val = read_bins(out / "shakespeare_char")
    assert meta["source"] == url and meta["sha256"] == got
    assert open(out / "shakespeare_char" / "input.txt", "rb").read() == open(served, "rb").read()
    assert Tokenizer.from_meta(meta).decode(list(train) + list(val)) == TEXT
    meta, train, val = read_bins(prepare("mine", url=url, out_root=str(out), log=quiet))  # any name's --url
    assert meta["source"] == url and Tokenizer.from_meta(meta).decode(list(train) + list(val)) == TEXT
    write(tmp_path / "empty.txt", b"")
    with pytest.raises(DataError) as e:
        prepare("mine", url=(tmp_path / "empty.txt").as_uri(), out_root=str(out), log=quiet)
    assert str(e.value) == f"{(tmp_path / 'empty.txt').as_uri()} is empty"


def test_a_replacement_cut_short_leaves_no_meta_json_over_mixed_files(tmp_path, monkeypatch):
    """Prepared again, a dataset's new files move in with the old meta.json set aside, the new one last: cut
    short (here a full disk as val.bin moves in), no meta.json describes the mix; the next prepare ends it."""
    d = prepare("tiny", input=write(tmp_path / "a.txt", TEXT), out_root=str(tmp_path), log=quiet)
    replace = os.replace

    def full_at_val(src, dst):
        if dst.endswith("val.bin"):
            raise OSError(28, os.strerror(28))  # ENOSPC
        replace(src, dst)
    monkeypatch.setattr(os, "replace", full_at_val)
    with pytest.raises(DataError, match="^could not write dataset 'tiny'"):
        prepare("tiny", input=write(tmp_path / "b.txt", TEXT.upper()), out_root=str(tmp_path), log=quiet)
    monkeypatch.undo()
    assert listed(d) == [".meta.json.replacing", "train.bin", "val.bin"]
    meta, train, val = read_bins(prepare("tiny", input=str(tmp_path / "b.txt"), out_root=str(tmp_path), log=quiet))
    assert Tokenizer.from_meta(meta).decode(list(train) + list(val)) == TEXT.upper()
    assert listed(d) == ["meta.json", "train.bin", "val.bin"]


def test_offline_fallback_to_pydoc(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOMESH_SHAKESPEARE_URL", (tmp_path / "missing.txt").as_uri())
    logs = []
    assert ensure_dataset("shakespeare_char", out_root=str(tmp_path), log=logs.append) == "pydoc"
    notes = [m for m in logs if "could not be downloaded" in m]
    assert notes == [f"prepare: Tiny Shakespeare could not be downloaded ([Errno 2] No such file or directory: "
                     f"'{tmp_path / 'missing.txt'}'); training on the offline 'pydoc' corpus instead"]
    assert listed(tmp_path) == [".shakespeare_char.offline", "pydoc"]
    assert ensure_dataset("pydoc", out_root=str(tmp_path), log=logs.append) == "pydoc"  # already there
    # the next run falls back at once, saying why, without trying the download again
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **kw: pytest.fail("downloaded again"))
    logs.clear()
    assert ensure_dataset("shakespeare_char", out_root=str(tmp_path), log=logs.append) == "pydoc"
    assert len(logs) == 1 and logs[0].startswith("prepare: training on the offline 'pydoc' corpus: Tiny Shakespeare "
                                                 "could not be downloaded on ") and logs[0].endswith(
        f"; python data/prepare.py --dataset shakespeare_char --out_root {tmp_path} tries the "
        "download again")
    monkeypatch.undo()  # the explicit prepare tries, and once it succeeds nothing falls back any more
    # the local copy a failed download suggests lands in the data root that failed, not in data/
    with pytest.raises(DataError) as e:
        prepare("shakespeare_char", url=(tmp_path / "gone").as_uri(), out_root=str(tmp_path / "o"),
                log=quiet)
    want = f"--dataset shakespeare_char --input FILE --out_root {tmp_path / 'o'}"
    assert str(e.value).endswith(want)
    prepare("shakespeare_char", input=write(tmp_path / "s.txt", TEXT), out_root=str(tmp_path), log=quiet)
    assert ensure_dataset("shakespeare_char", out_root=str(tmp_path), log=quiet) == "shakespeare_char"
    assert not (tmp_path / ".shakespeare_char.offline").exists()
    # no fallback for GPT-2 Shakespeare (without tiktoken's files the vocabulary fails first)
    with pytest.raises(DataError, match="could not download|GPT-2 vocabulary"):
        ensure_dataset("shakespeare", out_root=str(tmp_path), log=quiet)
    with pytest.raises(DataError, match="could not download|GPT-2 vocabulary"):  # a data root it made: gone again
        ensure_dataset("shakespeare", out_root=str(tmp_path / "new"), log=quiet)
    assert not (tmp_path / "new").exists()
    with pytest.raises(DataError, match=r"'mine' is not in --data_root=.*--dataset mine --input FILE --out_root"):
        ensure_dataset("mine", out_root=str(tmp_path), log=quiet)
    txt = write(tmp_path / "my text.txt", TEXT)  # the text itself, given to train.py
    with pytest.raises(DataError) as e:
        ensure_dataset(txt, out_root=str(tmp_path / "o"), log=quiet)
    assert str(e.value) == (f"{txt} is a file, not a dataset; prepare its text with: python data/prepare.py "
                            f"--dataset NAME --input '{txt}' --out_root {tmp_path / 'o'}, then train with --dataset=NAME")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    write(tmp_path / "here" / "pydoc", TEXT)  # a file in the working folder named as one of ours: ours, prepared
    assert ensure_dataset("pydoc", out_root=str(tmp_path / "o"), log=quiet) == "pydoc"


def test_a_hidden_folder_in_a_data_root_is_not_another_tools_dataset(tmp_path):
    (tmp_path / ".cache").mkdir()  # a tool's cache, a file manager's trash: not a dataset of nanoGPT's
    (tmp_path / ".cache" / "x.bin").write_bytes(b"x")
    assert ensure_dataset("pydoc", out_root=str(tmp_path), log=quiet) == "pydoc"
    assert listed(tmp_path) == [".cache", "pydoc"]


def test_the_projects_data_folder_is_never_another_tools(tmp_path, monkeypatch):
    """The project's data/ holds its scripts' __pycache__, a folder without meta.json: a first run prepares
    its dataset there all the same; any other data root holding such a folder is another tool's."""
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "prepare.cpython-311.pyc").write_bytes(b"\x00")
    with pytest.raises(DataError, match="holds another tool's datasets .__pycache__: folders without meta"):
        ensure_dataset("pydoc", out_root=str(tmp_path), log=quiet)
    monkeypatch.setattr(prep, "PROJECT_DATA", str(tmp_path))
    assert ensure_dataset("pydoc", out_root=str(tmp_path), log=quiet) == "pydoc"


def test_errors(tmp_path):
    out = tmp_path / "out"
    cases = [
        (str(tmp_path / "nope.txt"), "nope.txt does not exist"),
        (str(tmp_path), "is not a regular file .a folder or a device.; give one text file .a folder's: cat them into one.$"),
        (write(tmp_path / "empty.txt", b""), "empty.txt is empty; give a file of text$"),
        (write(tmp_path / "bad.txt", b"ab\xffcd"), "bad.txt is not UTF-8: invalid byte 0xff at byte offset 2; save it as UTF-8 text$"),
        (write(tmp_path / "one.txt", "x"), "one.txt is too small: 1 tokens cannot be split into train and val; give more text$"),
    ]
    for src, msg in cases:
        for chunk in (1, 1 << 20):
            with pytest.raises(DataError, match=msg):
                prepare("x", input=src, out_root=str(out), chunk_bytes=chunk, log=quiet)
    # an invalid byte far into a chunked file, and a truncated character at the very end
    with pytest.raises(DataError, match="byte offset 1002; save it as UTF-8 text$"):
        prepare("x", input=write(tmp_path / "b2", b"ab\n" * 334 + b"\xe2\x82"), out_root=str(out), chunk_bytes=10)
    with pytest.raises(DataError, match=r"did you mean 'shakespeare_char'\?.*pydoc, shakespeare, shakespeare_char"):
        prepare("shakespear_char", out_root=str(out))
    assert not out.exists()
    for name, root in (("mytext", tmp_path), ("x", tmp_path / "mytext")):  # a file in the way
        with pytest.raises(DataError) as e:
            prepare(name, input=write(tmp_path / "mytext", TEXT), out_root=str(root), log=quiet)
        assert str(e.value) == f"{tmp_path / 'mytext'} is a file; move it, or give another --dataset or --out_root"
    assert open(tmp_path / "mytext").read() == TEXT
    (tmp_path / "root").mkdir()
    write(tmp_path / "root" / "pydoc", TEXT)  # train.py's first use: its flag, --data_root
    with pytest.raises(DataError) as e:
        ensure_dataset("pydoc", out_root=str(tmp_path / "root"), log=quiet)
    assert str(e.value) == (f"{tmp_path / 'root' / 'pydoc'} is a file; move it, or give another --dataset "
                            f"or --data_root")


def test_an_unreadable_input_is_named_not_the_dataset(tmp_path):
    """An --input this user may not read: one line naming it, not "could not write dataset", nothing written.
    As root, run without the capabilities that let root read any file (where setpriv can drop them)."""
    src = write(tmp_path / "secret.txt", TEXT)
    os.chmod(src, 0)
    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    probe = f"import os, sys; sys.exit(os.access({src!r}, os.R_OK))"  # 0: setpriv ran, and the file is unreadable
    with contextlib.suppress(OSError):
        if subprocess.run(user + [sys.executable, "-c", probe], capture_output=True).returncode == 0:
            r = subprocess.run(user + [sys.executable, "data/prepare.py", "--dataset=x", f"--input={src}",
                                       f"--out_root={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True)
            assert r.returncode == 2 and r.stderr == (f"prepare.py: error: input file {src} cannot be read "
                                                      f"(permission denied)\n")
            assert not (tmp_path / "out").exists()
            return
    pytest.skip("this user reads any file, and setpriv cannot drop root's capabilities here")


def test_a_split_is_read_as_bytes_where_os_open_reads_text(tmp_path, monkeypatch):
    """Windows' os.open reads text unless given O_BINARY (stood in for here): CR LF as LF, Ctrl-Z (0x1a,
    token 26) as the end of the file. A split's windows are read from its file as bytes all the same."""
    d = prepare("t", input=write(tmp_path / "in.txt", TEXT), out_root=str(tmp_path), log=quiet)
    tokens = np.fromfile(os.path.join(d, "train.bin"), np.uint16)
    assert 26 in tokens  # bytes 1a 00: the end, in text mode
    binary, real = 1 << 28, os.open
    monkeypatch.setattr(os, "O_BINARY", binary, raising=False)

    def os_open(path, flags, *args):
        if flags & binary or not str(path).endswith(".bin"):
            return real(path, flags & ~binary, *args)
        with open(path, "rb") as f:  # what reading in text mode gives
            write(tmp_path / "as_text", f.read().replace(b"\r\n", b"\n").split(b"\x1a")[0])
        return real(tmp_path / "as_text", flags, *args)
    monkeypatch.setattr(os, "open", os_open)
    train = load_split(d, "train")
    assert data_meta.read_tokens(train, 0, len(train)).tolist() == tokens.tolist()


def test_tokenizer_and_dtype():
    tok = Tokenizer("char", chars=sorted("abc \n"))
    assert tok.decode(tok.encode("a cab\n")) == "a cab\n"
    assert tok.decode([0, 1, 99]) == "\n "  # out-of-vocabulary (padding) ids are dropped
    with pytest.raises(DataError, match="characters not in the vocabulary: 'é', '€'"):
        tok.encode("abc €é")
    assert Tokenizer.from_meta({"tokenizer": "char", "chars": list("ba"), "vocab_size": 2}).encode("ab") == [1, 0]
    assert data_meta.dtype_for_vocab(65) == "uint16" and data_meta.dtype_for_vocab(65535) == "uint16"
    assert data_meta.dtype_for_vocab(65536) == "uint32" and data_meta.dtype_for_vocab(100277) == "uint32"


def test_uint32_vocab(tmp_path):
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000) + "\n"
    meta, train, val = read_bins(prepare("big", input=write(tmp_path / "big.txt", text),
                                         out_root=str(tmp_path), log=quiet))
    assert meta["dtype"] == "uint32" and train.dtype == np.uint32 and meta["vocab_size"] > 65535
    assert Tokenizer.from_meta(meta).decode(np.concatenate([train, val])) == text


def test_indexed_format_holds_a_vocabulary_over_65535(tmp_path):
    """The indexed format has no uint32: a larger vocabulary is stored as Megatron's int32, and reads back."""
    text = "".join(chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c < 0xE000) * 2
    d = prepare("wide", input=write(tmp_path / "wide.txt", text), out_root=str(tmp_path), log=quiet, format="indexed",
                seq_len=997)
    meta = json.load(open(os.path.join(d, "meta.json"), encoding="utf-8"))
    assert meta["dtype"] == "int32" and meta["vocab_size"] > 65535
    train, val = load_split(d, "train"), load_split(d, "val")
    assert train.dtype == np.int32 and len(train) + len(val) == len(text)
    assert Tokenizer.load(d).decode(np.concatenate([train, val])) == text


@pytest.mark.slow
def test_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "data/prepare.py", *a, "--out_root", str(tmp_path)],
                                    cwd=REPO, capture_output=True, text=True)
    r = run("--dataset", "x", "--input", write(tmp_path / "in.txt", TEXT), "--tokenizer", "pythia-160m")
    assert r.returncode == 2 and r.stderr.splitlines() == [  # a name, not a folder on this machine: nothing downloads
        "prepare.py: error: --tokenizer pythia-160m: there is no such file or folder here; give char, gpt2, or the path "
        "of a tokenizer.json or of a downloaded Hugging Face model folder holding one (nothing is downloaded)"]
    r = run("--dataset", "x", "--input", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [f"prepare.py: error: input file {tmp_path / 'missing.txt'} does not exist"]
    r = run("--dataset", "x", "--input", write(tmp_path / "in.txt", TEXT))
    assert r.returncode == 0 and json.load(open(tmp_path / "x" / "meta.json"))["train_tokens"] > 0
    r = subprocess.run([sys.executable, "data/prepare.py", "--dataset", "y", "--input", str(tmp_path / "in.txt"),
                        "--out_root", str(tmp_path / "in.txt")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"prepare.py: error: {tmp_path / 'in.txt'} is a file; move it, or give another --dataset or --out_root"]


def test_a_dataset_name_is_refused_by_its_rule_at_its_edges():
    """200 bytes pass, 201 do not; a backslash (a folder separator on Windows) is refused; a name
    made of argv's undecodable bytes (lone surrogates) is measured in bytes too: one line, no traceback."""
    prep.check_name("x" * 200)
    prep.check_name("é" * 100)
    for name in ("x" * 201, "é" * 100 + "x", "a\\b", "\udcff" * 67):
        with pytest.raises(DataError, match="^invalid dataset name"):
            prep.check_name(name)


def test_damaged_dataset_names_the_file_and_the_fix(tmp_path):
    prepare("tiny", input=write(tmp_path / "t.txt", TEXT), out_root=str(tmp_path), log=quiet)
    os.remove(tmp_path / "tiny" / "train.bin")
    with pytest.raises(DataError, match=r"tiny/train.bin is missing; prepare the dataset again: "
                                           r"python data/prepare.py --dataset tiny$"):
        load_split(str(tmp_path / "tiny"), "train")
    (tmp_path / "tiny" / "meta.json").write_text('{"tokenizer": "char",')
    for call in (lambda: load_split(str(tmp_path / "tiny"), "val"), lambda: Tokenizer.load(str(tmp_path / "tiny"))):
        with pytest.raises(DataError, match=r"tiny/meta.json is damaged \(PlainDataError: is not JSON \(.*\)\); prepare the dataset again"):
            call()


def test_checkpoint_dataset_finds_the_folder_from_anywhere(tmp_path, monkeypatch):
    prepare("tiny", input=write(tmp_path / "t.txt", TEXT), out_root=str(tmp_path / "mine"), log=quiet)
    assert checkpoint_dataset({"data_root": str(tmp_path / "mine"), "dataset": "tiny"}) == str(tmp_path / "mine" / "tiny")
    monkeypatch.chdir(tmp_path)  # an older checkpoint's relative data_root, from the folder the run was trained in
    assert checkpoint_dataset({"data_root": "mine", "dataset": "tiny"}) == str(tmp_path / "mine" / "tiny")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # ... and from elsewhere, `data` (the default) is data/ beside data/prepare.py
    monkeypatch.setattr(data_meta, "PROJECT_DATA", str(tmp_path / "mine"))
    assert checkpoint_dataset({"data_root": "data", "dataset": "tiny"}) == str(tmp_path / "mine" / "tiny")
    assert checkpoint_dataset({"data_root": "gone", "dataset": "tiny"}, root=str(tmp_path / "mine")).endswith("tiny")
    assert checkpoint_dataset({"data_root": "gone", "dataset": str(tmp_path / "mine" / "tiny")}) == str(tmp_path / "mine" / "tiny")
    with pytest.raises(DataError, match=rf"dataset 'nope' is not in --data_root={tmp_path}/mine \(no "
                                        rf"{tmp_path}/mine/nope/meta.json\): give the folder it moved to with "
                                        r"--data_root or prepare it with: python data/prepare.py --dataset nope"):
        checkpoint_dataset({"data_root": "data", "dataset": "nope"})


def test_the_prepare_command_for_a_missing_dataset_names_its_data_root(tmp_path):
    """Followed, it prepares the data where the run looks (--out_root), not in data/."""
    with pytest.raises(DataError) as e:
        checkpoint_dataset({"data_root": str(tmp_path / "my data"), "dataset": "tiny"})
    suggested = str(e.value).split("prepare it with: ")[1]
    assert suggested == f"python data/prepare.py --dataset tiny --out_root '{tmp_path}/my data'"
    with pytest.raises(DataError, match=r"prepare it with: python data/prepare.py --dataset tiny$"):
        checkpoint_dataset({"data_root": "data", "dataset": "tiny"})


def test_a_dataset_path_is_the_absolute_prefix_its_meta_json_names(tmp_path, monkeypatch, gpt2):
    """--dataset PATH, the folder or the prefix of data --indexed described as pile/part0 (no document.idx
    there): the absolute prefix pile/part0, whatever the working folder."""
    (tmp_path / "pile").mkdir()
    write_indexed(str(tmp_path / "pile" / "part0"), [np.arange(8)] * 3)
    monkeypatch.chdir(tmp_path)
    prep.describe_indexed("pile/part0", "gpt2", log=quiet)  # the last of 3 sequences is val
    meta = json.load(open(tmp_path / "pile" / "meta.json"))
    assert (meta["dataset"], meta["source"], meta["train_tokens"], meta["val_tokens"]) == (
        "pile", str(tmp_path / "pile" / "part0"), 16, 8)
    for given in ("./pile", "pile/part0", str(tmp_path / "pile")):
        assert ensure_dataset(given, out_root=str(tmp_path / "data"), log=quiet) == str(tmp_path / "pile" / "part0")


def test_tiny_shakespeare_gone_is_named_though_its_stand_in_is_there(tmp_path):
    """A checkpoint of Tiny Shakespeare itself, whose folder is gone, never reads the offline stand-in (pydoc) instead."""
    prepare("pydoc", input=write(tmp_path / "t.txt", TEXT), out_root=str(tmp_path), log=quiet)
    with pytest.raises(DataError, match=rf"^dataset 'shakespeare_char' is not in --data_root={tmp_path} \(no "):
        checkpoint_dataset({"data_root": str(tmp_path), "dataset": "shakespeare_char"}, {"sha256": "another"})


def test_a_changed_dataset_is_said_field_by_field():
    """Each field that differs, in words: characters reordered, a field the data gained, a value of over 20 characters
    cut to 17 and '...'; a character vocabulary replaced by a subword one (no chars) too."""
    from data.trained_on import check_unchanged
    then = {"chars": "ab", "sha256": "0123456789abcdef01"}  # its repr: 20 characters
    now = {"chars": "ba", "sequences": 3, "sha256": "0123456789abcdef0123"}
    with pytest.raises(DataError) as e:
        check_unchanged("d", "tiny", then, now)
    assert str(e.value) == (f"{os.path.join('d', 'meta.json')} is not the data the checkpoint was trained on: "
                            "characters in another order, sequences None then, 3 now, sha256 '0123456789abcdef01' "
                            "then, '0123456789abcdef... now; prepare 'tiny' again from its original text, or train "
                            "a new run on this data")
    with pytest.raises(DataError, match=r"on: chars 'ab' then, None now, encoding None then, 'gpt2' now; prepare"):
        check_unchanged("d", "tiny", {"chars": "ab"}, {"encoding": "gpt2"})

def test_a_relative_data_root_is_the_working_folders_before_the_projects(tmp_path, monkeypatch):
    """A relative --data_root from the working folder where it is there; else the project folder's."""
    project = os.path.dirname(data_meta.PROJECT_DATA)
    monkeypatch.chdir(tmp_path)
    assert data_meta.data_root("tools") == os.path.join(project, "tools")
    (tmp_path / "tools").mkdir()
    assert data_meta.data_root("tools") == str(tmp_path / "tools")
    assert data_meta.data_root("nowhere") == str(tmp_path / "nowhere")


def test_a_meta_json_that_does_not_match_its_data_is_refused(tmp_path):
    """meta.json's characters must be vocab_size many; an indexed dataset's meta.json must name its prefix."""
    (tmp_path / "meta.json").write_text('{"tokenizer": "char", "chars": "ab", "vocab_size": 3, "dtype": "uint16"}')
    with pytest.raises(DataError, match=r"meta.json is damaged \(ValueError: its 3 characters are missing\)"):
        data_meta.read_meta(str(tmp_path / "meta.json"))
    d = prepare("ix", input=write(tmp_path / "in.txt", TEXT), out_root=str(tmp_path), format="indexed",
                seq_len=50, log=quiet)
    os.rename(os.path.join(d, "document.idx"), os.path.join(d, "other.idx"))
    os.rename(os.path.join(d, "document.bin"), os.path.join(d, "other.bin"))
    with pytest.raises(DataError, match=r"ix/meta.json describes 'document', not 'other'; write it again"):
        dataset_folder("data", os.path.join(d, "other"))


def test_out_root_defaults_to_data_as_data_root_does(tmp_path, monkeypatch):
    """--out_root's default is `data`, as train.py's --data_root's (data/README.md): --help shows it
    so, not this machine's path, and from any folder it is the project's data/."""
    from train import TrainConfig
    assert prep.PrepareConfig().out_root == TrainConfig().data_root == "data"
    monkeypatch.chdir(tmp_path)
    called = []
    monkeypatch.setattr(prep, "prepare", lambda name, out_root, **kw: called.append(out_root))
    assert prep.run({"dataset": "tiny"}) == 0 and called == [data_meta.PROJECT_DATA]
    r = subprocess.run([sys.executable, "data/prepare.py", "--help"], cwd=REPO, capture_output=True,
                       text=True)
    assert "  --out_root=data  " in r.stdout


# -----------------------------------------------------------------------------
# The Megatron / GPT-NeoX indexed format (data/indexed.py)

from conftest import write_indexed  # noqa: E402
from data.indexed import IndexedDataset  # noqa: E402


def parse_idx(path):
    """The .idx read field by field, by the layout of data/indexed.py's docstring (independently of it)."""
    import struct
    raw = open(path, "rb").read()
    magic, (version,), code, (n, m) = raw[:9], struct.unpack("<Q", raw[9:17]), raw[17], struct.unpack("<QQ", raw[18:34])
    sizes = np.frombuffer(raw, "<i4", n, 34)
    pointers = np.frombuffer(raw, "<i8", n, 34 + 4 * n)
    docs = np.frombuffer(raw, "<i8", m, 34 + 12 * n)
    assert len(raw) == 34 + 12 * n + 8 * m
    return magic, version, code, sizes.tolist(), pointers.tolist(), docs.tolist()


def test_indexed_write_read_layout(tmp_path):
    seqs = [np.arange(5), np.array([7, 8, 65535]), np.array([], dtype=np.int64), np.array([3])]
    assert write_indexed(str(tmp_path / "document"), seqs) == 4
    assert parse_idx(tmp_path / "document.idx") == (b"MMIDIDX\x00\x00", 1, 8, [5, 3, 0, 1], [0, 10, 16, 16], [0, 1, 2, 3, 4])
    assert open(tmp_path / "document.bin", "rb").read() == np.concatenate(seqs).astype("<u2").tobytes()
    for path in (str(tmp_path), str(tmp_path / "document"), str(tmp_path / "document.idx")):  # folder, prefix, file
        ds = IndexedDataset(path)
        assert len(ds) == 4 and ds.n_tokens == 9 and ds.dtype == np.uint16
        assert [ds[i].tolist() for i in range(4)] == [s.tolist() for s in seqs]
        assert isinstance(ds.tokens, np.memmap) and isinstance(ds[1], np.memmap)  # views of the map: no copy
    write_indexed(str(tmp_path / "big"), [np.array([70000, 1])], dtype=np.int32)
    assert parse_idx(tmp_path / "big.idx")[2] == 4 and IndexedDataset(str(tmp_path / "big"))[0].tolist() == [70000, 1]


def corrupt(tmp_path, how):
    write_indexed(str(tmp_path / "document"), [np.arange(4), np.arange(3)])
    idx, bin_ = tmp_path / "document.idx", tmp_path / "document.bin"
    raw = bytearray(idx.read_bytes())
    if how == "magic":
        raw[:9] = b"NOTIDX\x00\x00\x00"
    elif how == "version":
        raw[9] = 2
    elif how == "dtype":
        raw[17] = 7  # float32 in Megatron's table
    elif how == "truncated idx":
        raw = raw[:-3]
    elif how == "short header":
        raw = raw[:20]
    elif how == "pointer":
        raw[34 + 8 + 8:34 + 8 + 16] = (6).to_bytes(8, "little")  # sequence 1 at byte 6, not 8
    elif how == "negative size":  # sequence 0 of 8 tokens, sequence 1 of -1 ending where the .bin does
        raw[34:42] = np.array([8, -1], "<i4").tobytes()
        raw[34 + 8 + 8:34 + 8 + 16] = (16).to_bytes(8, "little")
    elif how == "short bin":
        bin_.write_bytes(bin_.read_bytes()[:-2])
    elif how == "long bin":
        bin_.write_bytes(bin_.read_bytes() + b"\x00\x00")
    idx.write_bytes(bytes(raw))
    return str(tmp_path / "document")


BAD_INDEX = [("magic", "does not start with the magic"), ("version", "version 2, expected 1"),
             ("short header", "does not start with the magic"),
             ("dtype", "dtype code 7 is not an integer token type"),
             ("truncated idx", r"promises 2 sequences and 3 document entries \(82 bytes\) but the file has 79"),
             ("pointer", "sequence 1 has size 3 at byte offset 6, expected a size >= 0 at offset 8"),
             ("negative size", "sequence 1 has size -1 at byte offset 16, expected a size >= 0 at offset 16"),
             ("short bin", r"covers 14 bytes \(7 uint16 tokens\) but the .bin has 12"),
             ("long bin", r"covers 14 bytes \(7 uint16 tokens\) but the .bin has 16")]


@pytest.mark.parametrize("how, message", BAD_INDEX, ids=[h for h, _ in BAD_INDEX])
def test_bad_index_is_one_clear_error(tmp_path, how, message):
    path = corrupt(tmp_path, how)
    with pytest.raises(DataError, match=message) as e:
        IndexedDataset(path)
    assert "\n" not in str(e.value) and "document" in str(e.value)


def test_an_indexed_dataset_written_again_is_read_again(tmp_path):
    """A process that read an indexed dataset reads it again once its files change (the check is cached per
    file sizes and times): the new val split, not the old index's view of it."""
    from data.indexed import split_tokens
    prefix = str(tmp_path / "document")
    write_indexed(prefix, [np.arange(4), np.arange(3)])
    assert split_tokens(prefix, "val")[0].tolist() == [0, 1, 2]
    write_indexed(prefix, [np.arange(4), np.full(5, 9)])
    tokens, path, first = split_tokens(prefix, "val")
    assert (tokens.tolist(), path, first) == ([9] * 5, prefix + ".bin", 4)
    (tmp_path / "new.bin").write_bytes(np.array([1] * 4 + [7] * 5, "<u2").tobytes())
    os.replace(tmp_path / "new.bin", prefix + ".bin")  # the .bin alone downloaded again, the same size
    assert split_tokens(prefix, "val")[0].tolist() == [7] * 5


def test_an_index_is_checked_in_slices_and_needs_two_sequences_and_regular_files(tmp_path, monkeypatch):
    """The tiling check reads the index in slices (here of 2 sequences: 3 slices, a damaged one found in the
    last); one sequence leaves none for validation; a folder named document.bin is not a file to read."""
    import data.indexed as indexed
    monkeypatch.setattr(indexed, "CHECK_SLICE", 2)
    write_indexed(str(tmp_path / "document"), [np.arange(n) for n in (3, 1, 4, 1, 5)])
    ds = IndexedDataset(str(tmp_path))
    assert (ds.n_tokens, ds.pointers.tolist(), ds[4].tolist()) == (14, [0, 6, 8, 16, 18], [0, 1, 2, 3, 4])
    raw = bytearray((tmp_path / "document.idx").read_bytes())
    raw[34 + 20 + 32:34 + 20 + 40] = (20).to_bytes(8, "little")  # sequence 4 at byte 20, not 18
    (tmp_path / "document.idx").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="sequence 4 has size 5 at byte offset 20, expected a size >= 0 at offset 18"):
        IndexedDataset(str(tmp_path))
    write_indexed(str(tmp_path / "one"), [np.arange(4)])
    with pytest.raises(DataError, match="one has 1 sequence.s.: it needs 2 or more, the last 1% .at least one."):
        IndexedDataset(str(tmp_path / "one")).train_tokens()
    (tmp_path / "none.bin").write_bytes(b"")  # no sequence at all: an empty .bin, which cannot be mapped
    indexed.write_index(str(tmp_path / "none"), [], "uint16")
    with pytest.raises(DataError, match="none has 0 sequence.s.: it needs 2 or more"):
        IndexedDataset(str(tmp_path / "none")).train_tokens()
    os.remove(tmp_path / "one.bin")
    os.mkdir(tmp_path / "one.bin")
    with pytest.raises(DataError, match="one.bin is not a regular file .a folder, a FIFO or a device.."):
        IndexedDataset(str(tmp_path / "one"))
    os.rmdir(tmp_path / "one.bin")  # the .idx alone: no dataset, rather than a damaged one
    with pytest.raises(DataError, match="one is not an indexed dataset: no .*one.idx and .*one.bin, nor"):
        IndexedDataset(str(tmp_path / "one"))


def test_prepare_indexed_format(tmp_path):
    src = write(tmp_path / "in.txt", UNICODE)
    flat = prepare("flat", input=src, out_root=str(tmp_path), log=quiet)
    d = prepare("ix", input=src, out_root=str(tmp_path), format="indexed", seq_len=50, log=quiet)
    assert listed(d) == ["document.bin", "document.idx", "meta.json"]
    meta = json.load(open(os.path.join(d, "meta.json")))
    n = len(UNICODE)  # one token a character
    ds = IndexedDataset(d)
    assert len(ds) == -(-n // 50) == meta["sequences"] and ds.sizes.tolist() == [50] * (n // 50) + [n % 50]
    _, ftrain, fval = read_bins(flat)
    assert ds.tokens.tolist() == np.concatenate([ftrain, fval]).tolist()  # same tokens as the flat format
    train, val = load_split(d, "train"), load_split(d, "val")
    n_val = max(1, len(ds) // 100)  # the last 1% of the sequences, at least one
    assert len(val) == n - ds.token_offset(len(ds) - n_val) == meta["val_tokens"] and len(train) == meta["train_tokens"]
    assert np.concatenate([train, val]).tolist() == ds.tokens.tolist()
    for split in (train, val):  # windows are read from the .bin (at the split's own start), not the map
        n_win = len(split) // 2
        assert n_win >= 2 and loader.sequential_windows(split, 2, 0, n_win).tolist() == \
            np.asarray(split[:n_win * 2]).reshape(n_win, 2).tolist()
    assert Tokenizer.load(d).decode(ds.tokens) == UNICODE
    many = prepare("ix200", input=write(tmp_path / "ab.txt", "ab" * 200), out_root=str(tmp_path),
                   format="indexed", seq_len=2, log=quiet)  # 200 sequences: the last 2 are val
    meta = json.load(open(os.path.join(many, "meta.json")))
    assert (meta["sequences"], meta["train_tokens"], meta["val_tokens"]) == (200, 396, 4)
    assert (len(load_split(many, "train")), len(load_split(many, "val"))) == (396, 4)
    with pytest.raises(DataError, match="fewer than 2 sequences of 5000"):
        prepare("ix2", input=src, out_root=str(tmp_path), format="indexed", seq_len=5000, log=quiet)
    for fmt, files in [("flat", ["meta.json", "train.bin", "val.bin"]), ("indexed", listed(d))]:  # prepared again
        assert prepare("ix", input=src, out_root=str(tmp_path), format=fmt, seq_len=50, log=quiet) == d
        assert listed(d) == files and dataset_folder("data", d) == d  # no file of the other format left


def test_a_run_reads_both_splits_and_checks_the_model_fits(data_root):
    """Dataset: train.bin and val.bin each as its own split; a model fits with every token id a row and one
    window of block_size + 1 tokens in each split (the boundary exactly); subword vocabularies padded to 64."""
    from types import SimpleNamespace as Cfg
    folder = os.path.join(data_root, "tiny")
    data = loader.Dataset(data_root, "tiny", folder)
    for split in ("train", "val"):
        assert np.asarray(getattr(data, split)).tolist() == np.fromfile(os.path.join(folder, f"{split}.bin"), np.uint16).tolist()
    vocab, val = data.vocab_size, len(data.val)
    assert vocab == 26 and val < len(data.train)
    data.check_fits(Cfg(vocab_size=vocab, block_size=val - 1))
    said = rf"block_size {val} \+ 1 is longer than the validation split of 'tiny' \({val} tokens\); use"
    with pytest.raises(DataError, match=said):
        data.check_fits(Cfg(vocab_size=vocab, block_size=val))
    with pytest.raises(DataError, match="dataset 'tiny' has 26 tokens but the model's vocabulary is 25; use a dataset"):
        data.check_fits(Cfg(vocab_size=25, block_size=8))
    for size, padded in [(128, 128), (129, 192), (50257, 50304)]:
        data.tokenizer = Cfg(kind="bpe", vocab_size=size)
        assert data.vocab_size == padded


def test_sequential_windows():
    data = np.arange(23)
    w = loader.sequential_windows(data, 5, 2, 4)  # 4 whole windows a pass; tokens 20-22 never read
    assert w.tolist() == [list(range(10, 15)), list(range(15, 20)), list(range(0, 5)), list(range(5, 10))]
    with pytest.raises(DataError, match="shorter than one window"):
        loader.sequential_windows(data, 24, 0, 1)


def test_random_windows_need_one_window():
    """A split of exactly one window gives it every time; one token less is a DataError, not numpy's."""
    assert loader.random_windows(np.arange(6), 6, 2, [0]).tolist() == [list(range(6))] * 2
    with pytest.raises(DataError, match="^the split has 5 tokens, fewer than one window of 6$"):
        loader.random_windows(np.arange(5), 6, 1, [0])


@pytest.mark.slow
@pytest.mark.parametrize("tok", ["char", "gpt2"])
def test_num_proc_output_equals_one_process(tmp_path, tok, request):
    """Chunks (here ~300 bytes, so dozens of them) are encoded in 2 processes, in order: the same bytes."""
    if tok == "gpt2":
        request.getfixturevalue("gpt2")  # skips without the GPT-2 vocabulary
    src = write(tmp_path / "in.txt", (TEXT + UNICODE) * 3)
    a = prepare("a", input=src, tokenizer=tok, out_root=str(tmp_path), chunk_bytes=300, log=quiet)
    b = prepare("b", input=src, tokenizer=tok, out_root=str(tmp_path), chunk_bytes=300, num_proc=2, log=quiet)
    for f in ("train.bin", "val.bin"):
        assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read()
    with pytest.raises(DataError, match="--num_proc=0 at least 1"):
        prepare("c", input=src, out_root=str(tmp_path), num_proc=0, log=quiet)


@pytest.mark.parametrize("args, message", [
    (dict(input="in.txt", url="https://example.com/in.txt"), "pass either --input or --url, not both"),
    (dict(tokenizer="gpt2"), "dataset 'shakespeare_char' uses the char tokenizer; pick another --dataset "
                             "name for a gpt2 version"),
    (dict(format="jsonl"), "unknown format 'jsonl'; use 'flat' or 'indexed'"),
    (dict(format="indexed", seq_len=1), "--seq_len=1 must be at least 2 and --num_proc=1 at least 1"),
])
def test_prepare_refuses_flags_that_contradict_each_other_before_any_work(args, message, tmp_path):
    """Two sources, or a tokenizer other than a known dataset's own: one line, nothing read or made."""
    with pytest.raises(DataError) as e:
        prepare("shakespeare_char", out_root=str(tmp_path / "data"), log=quiet, **args)
    assert str(e.value) == message and not (tmp_path / "data").exists()


def test_prepare_without_a_dataset_or_with_indexed_and_a_source_is_one_line(tmp_path, capsys):
    assert prep.main([]) == 2
    assert capsys.readouterr().err == "prepare.py: error: --dataset NAME is required (or --indexed PATH)\n"
    assert prep.main(["--indexed", str(tmp_path), "--url", "https://example.com/t.txt"]) == 2
    assert capsys.readouterr().err == ("prepare.py: error: --indexed describes an existing dataset: "
                                       "drop --dataset, --input and --url\n")
    assert prep.main(["--dataset", "x", "--seq_len", "64", "--out_root", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == ("prepare.py: error: --seq_len is the indexed format's; add "
                                       "--format indexed, or drop it\n")
    assert not (tmp_path / "d").exists()


class SignalsSeen:
    """A tokenizer's stand-in whose encode_array reports how a --num_proc worker takes SIGINT and SIGTERM."""

    def encode_array(self, text):
        return [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == [signal.SIG_IGN] * 2


@pytest.mark.slow
def test_num_proc_workers_leave_ctrl_c_to_prepare():
    """A terminal's Ctrl-C, or a SIGTERM to the whole group, reaches the workers too: they leave it to
    prepare.py, which ends them. A worker ended by it in the middle of sending its ids left prepare.py
    waiting for the rest, hung (else printing a traceback per worker)."""
    assert list(prep._encoded(iter(["a", "b", "c"]), SignalsSeen(), num_proc=2)) == [True] * 3


@pytest.mark.slow
def test_num_proc_workers_start_where_signals_cannot_be_blocked(monkeypatch):
    """Windows has no pthread_sigmask (nor SIG_BLOCK): the workers start, unblocked."""
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()  # POSIX's own, which its start masks signals for: first, as in a whole run
    for name in ("pthread_sigmask", "SIG_BLOCK", "SIG_SETMASK"):
        monkeypatch.delattr(signal, name, raising=False)
    assert list(prep._encoded(iter(["a", "b", "c"]), SignalsSeen(), num_proc=2)) == [True] * 3


def interrupted():
    """A SignalsSeen, which a --num_proc worker unpickles in its first moment, before it can ignore signals: it
    sends that worker a Ctrl-C and a SIGTERM then, as a terminal or `kill -TERM -PGID` can."""
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    return SignalsSeen()


class SignalledAtStart(SignalsSeen):
    def __reduce__(self):
        return interrupted, ()


# in a fresh process (Python's resource tracker not yet started: its start unblocked signals), 2 workers
# signalled in their first moment encode 3 chunks; then prepare.py's own signals, which it blocked as they started
SIGNALLED = """import signal
import data.prepare as prep
from test_data import SignalledAtStart
print(list(prep._encoded(iter("abc"), SignalledAtStart(), 2)), signal.pthread_sigmask(signal.SIG_BLOCK, []))"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signals")
def test_num_proc_workers_ignore_signals_from_their_first_moment():
    """The workers start with Ctrl-C and SIGTERM blocked, then ignore them. One that came before it could ignore
    them printed its KeyboardInterrupt's traceback, or ended it silently: prepare.py failed."""
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests")}
    r = subprocess.run([sys.executable, "-c", SIGNALLED], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert (r.stderr, r.stdout, r.returncode) == ("", "[True, True, True] set()\n", 0)


# prepare.py, its tokenizing paused once the --num_proc workers are up and wait for work
PAUSED = """import sys, time
import data.prepare as prep
encoded = prep._encoded
def paused(*args):
    ids = encoded(*args)
    yield next(ids)
    print("tokenizing", flush=True)
    time.sleep(600)
    yield from ids
prep._encoded = paused
sys.exit(prep.main(sys.argv[1:]))"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
def test_num_proc_prepare_stops_on_a_sigterm_to_its_whole_group(tmp_path):
    """kill -TERM -PGID (a job scheduler ending the job) reaches the --num_proc workers too: they
    leave it to prepare.py, which ends them and stops in one line, the dataset as it was. A worker
    ended while it held the pool's lock left prepare.py hung, holding the dataset's lock."""
    old = prepare("x", input=write(tmp_path / "old.txt", TEXT), out_root=str(tmp_path), log=quiet)
    before = snapshot(old)
    p = subprocess.Popen([sys.executable, "-c", PAUSED, "--dataset=x", "--num_proc=2",
                          f"--input={write(tmp_path / 'in.txt', UNICODE)}", f"--out_root={tmp_path}"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout.readline() == "tokenizing\n"
        os.killpg(p.pid, signal.SIGTERM)
        _, stderr = p.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a hung one, its workers with it
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and stderr == (
        "\nprepare.py: stopped by SIGTERM, so at once: a file being written, if any, was dropped, "
        "the one before it is as it was\n")
    assert snapshot(old) == before and listed(old) == ["meta.json", "train.bin", "val.bin"]


# --num_proc=2 workers, once up (their first chunks done), given chunks of 60 s: time.sleep tokenizes
SLOW = """import multiprocessing, sys, time, types
import data.prepare as prep
from support import command
def run(argv):
    ids = prep._encoded(iter([0, 0, 60, 60]), types.SimpleNamespace(encode_array=time.sleep), 2)
    next(ids)
    print(*[p.pid for p in multiprocessing.active_children()], flush=True)
    list(ids)
sys.exit(command.main("slow.py", run, []))"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_a_num_proc_worker_killed_is_one_line():
    """--num_proc workers killed as they work (out of memory, say): one line, exit 2, no hang. In a pool, their
    chunks were never answered: prepare.py waited for them for ever."""
    p = subprocess.Popen([sys.executable, "-c", SLOW], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for pid in p.stdout.readline().split():
            os.kill(int(pid), signal.SIGKILL)
        _, stderr = p.communicate(timeout=30)  # an answer would take 60 s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 2 and stderr == (
        "slow.py: error: a --num_proc process ended (killed: out of memory? or its error above); prepare "
        "again with a smaller --num_proc\n")


# -----------------------------------------------------------------------------
# Byte-level BPE tokenizer.json (GPT-NeoX / Pythia's) on tiktoken, against the `tokenizers` package

BPE_TEXTS = ["Hello  world!<|endoftext|>naïve   café\n\n\n  e\u0301 x",  # NFC: e + combining accent is é
             "def f(x):\n        return x  +  1\n\n\tdone   \n", "日本語's 😀😀 123456 don't — “quoted”",
             " \n \n  " + " " * 30 + "end", "<|endoftext|><|endoftext|>", "x<|endoftext|>\u0301", ""]


def test_bpe_equals_tokenizers(tmp_path):
    theirs = train_bpe(tmp_path / "tokenizer.json")
    ours = Tokenizer("bpe", path=str(tmp_path))  # a folder holding tokenizer.json
    assert ours._bpe.backend == "tiktoken" and ours.eot_id == 0 and ours.vocab_size == theirs.get_vocab_size()
    for text in BPE_TEXTS + [TEXT, UNICODE]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text).ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)
    assert ours.encode("<|endoftext|>") == [0] and ours.encode("a    b")[1] == theirs.token_to_id("    ")
    assert ours.decode([0, ours.vocab_size + 5]) == "<|endoftext|>"  # padding ids are dropped
    # the vocabulary may list the added tokens too, spelled as they are (literal spaces)
    spec = json.load(open(tmp_path / "tokenizer.json"))
    spec["model"]["vocab"].update({t["content"]: t["id"] for t in spec["added_tokens"]})
    (tmp_path / "listed.json").write_text(json.dumps(spec))
    ours = Tokenizer("bpe", path=str(tmp_path / "listed.json"))
    assert ours._bpe.backend == "tiktoken" and all(ours.encode(t) == theirs.encode(t).ids for t in BPE_TEXTS)
    assert all(ours.decode(ours.encode(t)) == theirs.decode(theirs.encode(t).ids, skip_special_tokens=False) for t in BPE_TEXTS)
    # without added space runs the spaces go through BPE merges instead: still the same ids
    theirs = train_bpe(tmp_path / "plain.json", add_space_runs=False)
    ours = Tokenizer("bpe", path=str(tmp_path / "plain.json"))
    assert all(ours.encode(t) == theirs.encode(t).ids for t in BPE_TEXTS)


def test_bpe_ignores_an_added_token_of_no_text_as_tokenizers_does(tmp_path):
    theirs = train_bpe(tmp_path / "full.json")
    spec = json.load(open(tmp_path / "full.json"))
    spec["added_tokens"].insert(0, dict(spec["added_tokens"][0], id=theirs.get_vocab_size(), content=""))
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    theirs = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer("bpe", path=str(tmp_path))
    assert ours._bpe.backend == "tiktoken" and ours.vocab_size == theirs.get_vocab_size()
    assert all(ours.encode(text) == theirs.encode(text).ids for text in BPE_TEXTS + [TEXT])


ADDED_IDS = {  # an added token's ids in the file: what `tokenizers` gives it instead
    "past the end": ([(300, "<|endoftext|>")], "'<|endoftext|>' has id 300", 257),
    "out of order": ([(258, "<|pad|>"), (257, "<|endoftext|>")], "'<|pad|>' has id 258", 257),
    "the vocabulary's other id": ([(257, "ab")], "'ab' has id 257", 256),
    "twice": ([(257, "<|endoftext|>"), (258, "<|endoftext|>")], "'<|endoftext|>' has id 258", 257),
    "a vocabulary token's id": ([(100, "<|endoftext|>")], "'<|endoftext|>' has id 100", 257),
    "another's id": ([(257, "<|endoftext|>"), (257, "<|pad|>")], "'<|pad|>' has id 257", 258),
}


@pytest.mark.parametrize("case", ADDED_IDS.values(), ids=ADDED_IDS)
def test_bpe_refuses_added_token_ids_that_tokenizers_would_renumber(tmp_path, case):
    """`tokenizers` numbers added tokens in the file's order, not by their ids there: a token of the vocabulary
    keeps its id, another takes the next free one (with a warning only). Such a file is refused, naming the id
    `tokenizers` gives; with that id the same ids as `tokenizers`."""
    tokens, named, want = case
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    spec = {"model": {"type": "BPE", "vocab": {**vocab, "ab": 256}, "merges": ["a b"]},
            "pre_tokenizer": byte_level, "decoder": byte_level,
            "added_tokens": [{"id": i, "content": c, "special": True, "normalized": False, "lstrip": False,
                              "rstrip": False, "single_word": False} for i, c in tokens]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(DataError) as e:
        Tokenizer("bpe", path=str(tmp_path))
    assert str(e.value) == (f"{tmp_path / 'tokenizer.json'} is not a tokenizer nanoMeSH can run: the added token "
                            f"{named}, but tokenizers gives it {want} (a vocabulary token's id, else the next "
                            f"free one, in the file's order); give it id {want}")
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install tokenizers")
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert theirs.token_to_id(named.split("'")[1]) == want
    for t in spec["added_tokens"]:  # numbered as tokenizers does: accepted, with its ids
        t["id"] = theirs.token_to_id(t["content"])
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    ours, text = Tokenizer("bpe", path=str(tmp_path)), "ab<|pad|>cab<|endoftext|>"
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids
    assert ours.vocab_size == theirs.get_vocab_size() and ours.decode(ours.encode(text)) == text


def test_bpe_without_the_bytes_no_text_holds_runs_on_tiktoken(tmp_path):
    """GPT-NeoX's vocabulary (Pythia's) lacks the 13 bytes no UTF-8 text holds (0xc0, 0xc1, 0xf5-0xff): tiktoken
    runs it all the same, with the ids of `tokenizers`, which is not needed for it."""
    from data.bpe import bytes_to_unicode
    train_bpe(tmp_path / "full.json")
    spec, alphabet = json.load(open(tmp_path / "full.json")), bytes_to_unicode()
    vocab, added = spec["model"]["vocab"], spec["added_tokens"]
    for b in (0xC0, 0xC1, *range(0xF5, 256)):
        del vocab[alphabet[b]]
    new = {i: n for n, i in enumerate(sorted({*vocab.values(), *(t["id"] for t in added)}))}  # no gaps (GPT-NeoX's)
    spec["model"]["vocab"] = {token: new[i] for token, i in vocab.items()}
    spec["added_tokens"] = [{**t, "id": new[t["id"]]} for t in added]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    theirs = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer("bpe", path=str(tmp_path))
    assert ours._bpe.backend == "tiktoken"
    for text in BPE_TEXTS + [TEXT, UNICODE]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text).ids and ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)


def test_bpe_dataset_keeps_its_tokenizer(tmp_path):
    (tmp_path / "tok").mkdir()
    train_bpe(tmp_path / "tok" / "tokenizer.json")
    text = TEXT + "<|endoftext|>" + UNICODE
    d = prepare("neox", input=write(tmp_path / "in.txt", text), tokenizer=str(tmp_path / "tok"),
                out_root=str(tmp_path / "data"), log=quiet)
    meta, train, val = read_bins(d)
    ours = Tokenizer("bpe", path=str(tmp_path / "tok"))
    assert (meta["tokenizer"], meta["tokenizer_file"], meta["vocab_size"]) == ("bpe", "tokenizer.json", ours.vocab_size)
    assert meta["tokenizer_sha256"] == ours.identity
    assert np.concatenate([train, val]).tolist() == ours.encode(text)
    os.remove(tmp_path / "tok" / "tokenizer.json")  # the dataset decodes without the original
    assert Tokenizer.load(d).decode(np.concatenate([train, val])) == text
    spec = json.load(open(os.path.join(d, "tokenizer.json")))
    spec["model"]["merges"] = spec["model"]["merges"][:-1]
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with pytest.raises(DataError, match="not the tokenizer this dataset was made with"):
        Tokenizer.load(d)
    # prepared again with characters: the folder is the char dataset's alone, its copy gone
    assert prepare("neox", input=str(tmp_path / "in.txt"), out_root=str(tmp_path / "data"), log=quiet) == d
    assert listed(d) == ["meta.json", "train.bin", "val.bin"] and Tokenizer.load(d).kind == "char"


def test_bpe_that_tiktoken_cannot_run(tmp_path, monkeypatch):
    """A tokenizer.json tiktoken cannot reproduce runs on `tokenizers` when installed, else is one clear error."""
    train_bpe(tmp_path / "tokenizer.json")
    import tokenizers
    for name, part, change in [("prefix.json", "pre_tokenizer", {"add_prefix_space": True}),
                               ("decoder.json", "decoder", {"type": "Fuse"})]:
        spec = json.loads((tmp_path / "tokenizer.json").read_text())
        spec[part] = {**spec[part], **change} if part == "pre_tokenizer" else change
        (tmp_path / name).write_text(json.dumps(spec))
        tok = Tokenizer("bpe", path=str(tmp_path / name))
        theirs = tokenizers.Tokenizer.from_file(str(tmp_path / name))
        assert tok._bpe.backend == "tokenizers"
        assert tok.encode(UNICODE) == theirs.encode(UNICODE, add_special_tokens=False).ids
        assert tok.decode(tok.encode(UNICODE)) == theirs.decode(tok.encode(UNICODE), skip_special_tokens=False)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(DataError, match=r"prefix.json cannot be run exactly by tiktoken \(pre-tokenizer .* is not "
                                           r"ByteLevel without add_prefix_space\); pip install tokenizers"):
        Tokenizer("bpe", path=str(tmp_path / "prefix.json"))
    with pytest.raises(DataError, match="cannot read the tokenizer .*missing.json"):
        Tokenizer("bpe", path=str(tmp_path / "missing.json"))
    (tmp_path / "vocab.json").write_text('{"model": 19849, "the": 262}')  # GPT-2's vocab.json: no tokenizer
    with pytest.raises(DataError, match=r"cannot read the tokenizer .*vocab.json \(ValueError: no 'model'\); give a"):
        Tokenizer("bpe", path=str(tmp_path / "vocab.json"))
    (tmp_path / "deep.json").write_text('{"model": ' + "[" * 10_000 + "]" * 10_000 + "}")
    with pytest.raises(DataError, match=r"cannot read the tokenizer .*deep.json \(PlainDataError: is nested more "
                                           r"than 64 levels deep\)"):  # not a RecursionError's traceback
        Tokenizer("bpe", path=str(tmp_path / "deep.json"))


def raw_token(spec, normalized=False):
    """Add e + combining accent (NFC makes it é) as an added token matched before NFC (or after it, as é), at the
    next id."""
    spec["added_tokens"].append({"id": max(t["id"] for t in spec["added_tokens"]) + 1, "content": "e\u0301",
                                 "special": False, "normalized": normalized, "lstrip": False, "rstrip": False,
                                 "single_word": False})


def vocab_token(spec, token):
    """Add token to the vocabulary at its next id: the added tokens after it move up one, as tokenizers numbers them."""
    vocab = spec["model"]["vocab"]
    for t in spec["added_tokens"]:
        t["id"] += t["id"] >= len(vocab)
    vocab[token] = len(vocab)


def without_a_byte(spec):
    """Drop byte 0x01 from the vocabulary: the ids after it move down one, as tokenizers numbers them."""
    gone = spec["model"]["vocab"].pop(bytes_to_unicode()[1])
    spec["model"]["vocab"] = {token: i - (i > gone) for token, i in spec["model"]["vocab"].items()}
    for t in spec["added_tokens"]:
        t["id"] -= t["id"] > gone


BPE_CHANGES = {  # what tiktoken alone would encode otherwise, or tokenizers' own post-processing would
    "lowercase": lambda s: s.update(normalizer={"type": "Lowercase"}),
    "single word": lambda s: s["added_tokens"][0].update(single_word=True),
    "not byte-level": lambda s: vocab_token(s, "日"),
    "without a byte": without_a_byte,
    "a merge twice": lambda s: s["model"]["merges"].append(s["model"]["merges"][0]),
    "an added token unnormalized": raw_token,
    "an added token normalized, not in NFC": lambda s: raw_token(s, normalized=True),
    "post-processed": lambda s: s.update(pre_tokenizer={**s["pre_tokenizer"], "add_prefix_space": True}, post_processor={
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}),
}


@pytest.mark.parametrize("change", BPE_CHANGES.values(), ids=BPE_CHANGES)
def test_bpe_gets_the_ids_of_tokenizers_where_tiktoken_alone_would_not(tmp_path, change):
    """The ids and text of `tokenizers` (which runs what tiktoken cannot), for a tokenizer.json tiktoken alone would
    encode otherwise; its identity is not the unchanged file's."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(train_bpe(tmp_path / "base.json").to_str())
    change(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    ours, theirs = Tokenizer("bpe", path=str(tmp_path)), tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = BPE_TEXTS + ["a\x01b cafe\u0301 Hello"]
    assert [ours.encode(t) for t in texts] == [theirs.encode(t, add_special_tokens=False).ids for t in texts]
    assert [ours.decode(ours.encode(t)) for t in texts] == [theirs.decode(ours.encode(t), skip_special_tokens=False)
                                                            for t in texts]
    assert ours.identity != Tokenizer("bpe", path=str(tmp_path / "base.json")).identity


def test_bpe_without_a_normalizer_runs_a_normalized_token_not_in_nfc_on_tiktoken(tmp_path):
    """No normalizer: a normalized added token not in NFC is matched as written, as tiktoken matches it; tiktoken
    runs it, with the ids of `tokenizers`."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(train_bpe(tmp_path / "base.json").to_str())
    spec["normalizer"] = None
    raw_token(spec, normalized=True)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    ours, theirs = Tokenizer("bpe", path=str(tmp_path)), tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = BPE_TEXTS + ["a\x01b cafe\u0301 Hello"]
    assert ours._bpe.backend == "tiktoken"
    assert [ours.encode(t) for t in texts] == [theirs.encode(t, add_special_tokens=False).ids for t in texts]


def test_bpe_knows_an_end_of_text_in_its_vocabulary_only_and_decodes_half_a_character_as_tokenizers(tmp_path):
    """An <|endoftext|> the vocabulary lists but added_tokens does not is the end of text still; a character's first
    byte alone decodes to U+FFFD, as in `tokenizers`."""
    theirs = train_bpe(tmp_path / "base.json")
    spec = json.loads(theirs.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|endoftext|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert Tokenizer("bpe", path=str(tmp_path)).eot_id == spec["model"]["vocab"]["<|endoftext|>"] == 0
    half = [spec["model"]["vocab"][bytes_to_unicode()[0xC3]]]  # é's first byte
    assert Tokenizer("bpe", path=str(tmp_path)).decode(half) == theirs.decode(half) == "\ufffd"


def test_bpe_on_tiktoken_in_chunks_gets_the_ids_of_the_whole_text(tmp_path):
    """Chunks are cut before a whole run of spaces: a tokenizer.json with runs of spaces as added tokens (GPT-NeoX's)
    run by tiktoken gets the ids `tokenizers` gives the whole text. Cut before its last space, '   to' was '  ', ' to'
    where the whole text has '   ', 'to'."""
    tokenizers = pytest.importorskip("tokenizers")
    train_bpe(tmp_path / "tokenizer.json")
    text = "To be,\n\nor not   to  be?\n    x\n" * 20
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text, add_special_tokens=False)
    for chunk in (4, 8, 16, 64):
        d = prepare(f"c{chunk}", input=write(tmp_path / "in.txt", text), tokenizer=str(tmp_path / "tokenizer.json"),
                    out_root=str(tmp_path), chunk_bytes=chunk, log=quiet)
        assert np.concatenate(read_bins(d)[1:]).tolist() == theirs.ids


def test_bpe_on_tokenizers_is_encoded_whole(tmp_path):
    """A tokenizer.json run by `tokenizers` may split elsewhere than GPT-2's pre-tokenizer: its text is
    encoded whole, as prepare.py promises. In chunks, each chunk started with a prefix space here."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(train_bpe(tmp_path / "base.json").to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    (tmp_path / "prefix.json").write_text(json.dumps(spec))
    d = prepare("p", input=write(tmp_path / "in.txt", TEXT), tokenizer=str(tmp_path / "prefix.json"),
                out_root=str(tmp_path), chunk_bytes=64, log=quiet)
    _, train, val = read_bins(d)
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "prefix.json"))
    assert np.concatenate([train, val]).tolist() == theirs.encode(TEXT, add_special_tokens=False).ids


def test_bpe_on_tokenizers_neither_truncates_nor_pads(tmp_path):
    """A tokenizer.json saved with truncation or padding on (as one used so is saved), run by `tokenizers`: the ids
    of the whole text, none cut off, none added. A dataset held only its text's first max_length tokens."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(train_bpe(tmp_path / "base.json").to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    (tmp_path / "prefix.json").write_text(json.dumps(spec))
    ids = tokenizers.Tokenizer.from_file(str(tmp_path / "prefix.json")).encode(TEXT, add_special_tokens=False).ids
    spec["truncation"] = dict(direction="Right", max_length=16, strategy="LongestFirst", stride=0)
    (tmp_path / "cut.json").write_text(json.dumps(spec))
    spec["truncation"], spec["padding"] = None, dict(strategy={"Fixed": 50_000}, direction="Right", pad_id=1,
                                                     pad_to_multiple_of=None, pad_type_id=0, pad_token="<|padding|>")
    (tmp_path / "pad.json").write_text(json.dumps(spec))
    for name in ("cut.json", "pad.json"):
        tok = Tokenizer("bpe", path=str(tmp_path / name))
        assert tok._bpe.backend == "tokenizers" and tok.encode(TEXT) == ids, name


@pytest.mark.slow
def test_describe_indexed(tmp_path):
    """--indexed PATH: meta.json (and the tokenizer's copy) beside a dataset made elsewhere, e.g. Pythia's Pile."""
    train_bpe(tmp_path / "tokenizer.json")
    ours = Tokenizer("bpe", path=str(tmp_path / "tokenizer.json"))
    (tmp_path / "pile").mkdir()
    seqs = [ours.encode_array(line) for line in TEXT.splitlines(keepends=True)]
    write_indexed(str(tmp_path / "pile" / "document"), seqs)
    assert prep.main(["--indexed", str(tmp_path / "pile" / "document"), "--tokenizer", str(tmp_path / "tokenizer.json")]) == 0
    assert listed(tmp_path / "pile") == ["document.bin", "document.idx", "meta.json", "tokenizer.json"]
    meta = json.load(open(tmp_path / "pile" / "meta.json"))
    assert (meta["format"], meta["prefix"], meta["sequences"], meta["tokenizer"]) == ("indexed", "document", len(seqs), "bpe")
    assert dataset_folder("data", str(tmp_path / "pile" / "document")) == str(tmp_path / "pile")
    assert Tokenizer.load(str(tmp_path / "pile")).decode(load_split(str(tmp_path / "pile"), "val")) == "".join(TEXT.splitlines(keepends=True)[-3:])  # 1% of 300
    before = snapshot(tmp_path / "pile")  # data made elsewhere: prepare.py never writes over it
    for fmt in ("indexed", "flat"):
        with pytest.raises(DataError, match=f"^{tmp_path / 'pile'} holds data made elsewhere "
                           r"\(its meta.json is --indexed's\), which nanoMeSH never writes over; "
                           "give another --dataset$"):
            prepare("pile", input=write(tmp_path / "in.txt", TEXT), out_root=str(tmp_path), format=fmt, log=quiet)
    assert snapshot(tmp_path / "pile") == before
    os.remove(tmp_path / "pile" / "tokenizer.json")  # which --indexed would write again
    before = snapshot(tmp_path / "pile")
    runfiles.own(str(tmp_path / "pile"), shared=True)  # as a live run on it does
    try:
        r = subprocess.run([sys.executable, "data/prepare.py", "--indexed", str(tmp_path / "pile"), "--tokenizer",
                            str(tmp_path / "tokenizer.json")], cwd=REPO, capture_output=True, text=True)
    finally:
        runfiles.release()
    assert r.returncode == 2 and r.stderr == (f"prepare.py: error: another run is using {tmp_path / 'pile'} (it holds "
                                              f"the folder's lock); wait for it to end, or choose another --indexed\n")
    assert snapshot(tmp_path / "pile") == before
    r = subprocess.run([sys.executable, "data/prepare.py", "--indexed", str(tmp_path / "pile"), "--tokenizer", "char"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines() == ["prepare.py: error: --indexed needs a BPE tokenizer: 'gpt2' "
                                                           "or a tokenizer.json (a character vocabulary is only known from its text)"]
    os.remove(tmp_path / "pile" / "meta.json")
    with pytest.raises(DataError, match="has no meta.json beside it to name its tokenizer; write one with: python "
                                           "data/prepare.py --indexed .*document --tokenizer TOKENIZER"):
        dataset_folder("data", str(tmp_path / "pile"))


def test_describe_indexed_refuses_ids_past_its_tokenizer_and_another_tokenizer_json(tmp_path, capsys):
    """--indexed with a tokenizer whose vocabulary the data's ids pass, or beside a tokenizer.json of another
    tokenizer: one line each, naming the file and the fix; nothing written."""
    train_bpe(tmp_path / "tokenizer.json")
    ours = Tokenizer("bpe", path=str(tmp_path / "tokenizer.json"))
    (tmp_path / "pile").mkdir()
    prefix = str(tmp_path / "pile" / "document")
    write_indexed(prefix, [np.array([1, 2, ours.vocab_size]), np.array([3, 4])])
    before = snapshot(tmp_path / "pile")
    assert prep.main(["--indexed", prefix, "--tokenizer", str(tmp_path / "tokenizer.json")]) == 2
    assert capsys.readouterr().err == (f"prepare.py: error: {prefix}.bin holds token id {ours.vocab_size}, outside "
                                       f"the vocabulary of {ours.vocab_size}; it was made with another tokenizer\n")
    assert snapshot(tmp_path / "pile") == before
    write_indexed(prefix, [np.array([1, 2, 5]), np.array([3, 4])])
    train_bpe(tmp_path / "pile" / "tokenizer.json", add_space_runs=False)  # another's, left there
    before = snapshot(tmp_path / "pile")
    assert prep.main(["--indexed", prefix, "--tokenizer", str(tmp_path / "tokenizer.json")]) == 2
    kept = tmp_path / "pile" / "tokenizer.json"
    assert capsys.readouterr().err == (f"prepare.py: error: {kept} exists and is another tokenizer; move it "
                                       f"away first\n")
    assert snapshot(tmp_path / "pile") == before


def test_describe_indexed_never_writes_over_a_prepared_datasets_meta(tmp_path, capsys):
    """An indexed dataset prepare.py made from text keeps its meta.json (its sha256, which its runs' checkpoints
    record): --indexed on it is refused, touching nothing."""
    train_bpe(tmp_path / "tokenizer.json")
    d = prepare("ix", input=write(tmp_path / "in.txt", TEXT), out_root=str(tmp_path), format="indexed", seq_len=50,
                tokenizer=str(tmp_path / "tokenizer.json"), log=quiet)
    before = snapshot(tmp_path)
    assert prep.main(["--indexed", os.path.join(d, "document"), "--tokenizer", str(tmp_path / "tokenizer.json")]) == 2
    made = os.path.join(d, "meta.json")
    assert capsys.readouterr().err == (f"prepare.py: error: {made} is data/prepare.py's, which --indexed never writes "
                                       f"over; train on the dataset as it is, or remove {made} first\n")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("tokenizer", ["char", "gpt2", "bpe"])
@pytest.mark.parametrize("chunk", [1 << 20, 1], ids=["one chunk", "byte chunks"])
def test_a_byte_order_mark_is_not_a_character_of_the_text(tokenizer, chunk, tmp_path):
    if tokenizer == "gpt2":
        try:
            Tokenizer("gpt2")
        except DataError as e:
            pytest.skip(f"GPT-2 vocabulary unavailable (set TIKTOKEN_CACHE_DIR): {e}")
    if tokenizer == "bpe":
        train_bpe(tmp_path / "tokenizer.json")
        tokenizer = str(tmp_path / "tokenizer.json")
    text = UNICODE[:300]
    plain = write(tmp_path / "plain.txt", text)
    marked = write(tmp_path / "marked.txt", b"\xef\xbb\xbf" + text.encode("utf-8"))
    a = prepare("a", input=plain, tokenizer=tokenizer, out_root=str(tmp_path), log=quiet)
    b = prepare("b", input=marked, tokenizer=tokenizer, out_root=str(tmp_path), chunk_bytes=chunk,
                log=quiet)
    (meta_a, train_a, val_a), (meta_b, train_b, val_b) = read_bins(a), read_bins(b)
    assert "\ufeff" not in meta_b.get("chars", "") and meta_a.get("chars") == meta_b.get("chars")
    assert meta_a["vocab_size"] == meta_b["vocab_size"]
    if chunk > 1:  # BPE is per chunk: byte chunks cut the text elsewhere
        assert (train_a.tolist(), val_a.tolist()) == (train_b.tolist(), val_b.tolist())
    else:
        assert Tokenizer.load(b).decode(np.concatenate([train_b, val_b])) == text
    with open(marked, "rb") as f:  # the file as it is, mark included, is what its hash names
        assert meta_b["sha256"] == hashlib.sha256(f.read()).hexdigest()


@pytest.mark.slow  # two real training processes
def test_two_trainings_at_once_on_a_fresh_data_root(tmp_path):
    """Two real train.py processes started at once on a data root without their dataset: one prepares
    it, the other waits for it, and both train on it. The root's lock is held here until both wait, so
    that they meet there whatever the order of their start-up; then it is let go."""
    from conftest import TINY
    from support import files as runfiles
    root, outs, procs = tmp_path / "data", [], []
    root.mkdir()
    flags = [f for f in TINY if not f.startswith("--dataset")] + ["--dataset=pydoc", f"--data_root={root}",
                                                                 "--max_iters=3", "--eval_interval=3"]
    assert runfiles.own(str(root))  # the root's lock, held while both start
    try:
        for i in range(2):
            outs.append(tmp_path / f"train{i}.out")
            with open(outs[-1], "w") as f:
                procs.append(subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *flags,
                                               f"--out_dir={tmp_path / f'out{i}'}", "--device=cpu"],
                                              stdout=f, stderr=subprocess.STDOUT))
        waiting = (f"prepare: another process holds {root} (preparing data there, or a run whose --out_dir "
                   f"it is); waiting for it")
        while not all(waiting in out.read_text() for out in outs):
            assert all(p.poll() is None for p in procs), [out.read_text() for out in outs]
            time.sleep(0.1)
    finally:
        runfiles.release()
    texts = [out.read_text() for out, p in zip(outs, procs) if p.wait(timeout=600) is not None]
    assert [p.returncode for p in procs] == [0, 0], texts
    assert sum("prepare: pydoc: " in t for t in texts) == 1  # one prepared it, the other found it
    assert all("iter 3: train loss" in t for t in texts)
    assert listed(root) == ["pydoc"]  # and nothing else: no staging folder left
