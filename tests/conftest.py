"""
What the test modules share: one thread per process, the project folder, a tiny prepared dataset
and the tiny training flags, and the helpers that run, read and compare runs.

The tests use tiny models, for which thread start-up costs more than the maths, and several test
processes (torchrun, kill -9 children) share the CI machine's 2 cores.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the subprocesses the tests start

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
# A suite started in the background (nohup, `&`) inherits SIGINT and SIGHUP ignored, and so would
# every script it starts: the tests that send them need them as a terminal leaves them.
signal.signal(signal.SIGINT, signal.default_int_handler)
if hasattr(signal, "SIGHUP"):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

HANG = 3600  # seconds: the tests' guard against a hung subprocess, never a speed limit
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
TEXT = "".join(f"{w} the {v} of {n}.\n" for n in range(400) for w, v in [("Then", "king"), ("So", "queen")])
TINY = ["--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=4", "--layout=1+1R2+1",
        "--eval_iters=2", "--log_interval=1", "--sample_tokens=0", "--dataset=tiny"]
BPE_CORPUS = ["".join(f"Line {i}: to be, or not to be; that is the question! {i * i}\n" for i in range(300)),
              "naïve café — “quoted” 日本語 😀\n" * 40 + "a line with no newline at the end é",
              "def f(x):\n        return x  +  1\n"]


LESSON = os.path.join(ROOT, "LESSON.md")


def exercises():
    """LESSON.md's sections (test_lesson.py runs them, test_notebook.py compares LESSON.ipynb):
    [(title, bash commands, python lines to add to SCHEMES, files it writes, quoted output lines)]."""
    text = open(LESSON, encoding="utf-8").read()
    found = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
        commands = [line for kind, body in blocks if kind == "bash" for line in body.splitlines() if line]
        added = [line for kind, body in blocks if kind == "python" for line in body.splitlines() if line]
        quoted = [line for kind, body in blocks if kind == "text" for line in body.splitlines() if line]
        writes = re.search(r"^Writes (.*?)\.(?:\s|$)", section, flags=re.M | re.S)  # one sentence
        paths = re.findall(r"`([^`]+)`", writes[1]) if writes else []
        found.append((section.splitlines()[0], commands, added, paths, quoted))
    return found


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """A data root holding `tiny`, TEXT prepared as characters."""
    from data.prepare import prepare
    root = tmp_path_factory.mktemp("data")
    src = root / "tiny.txt"
    src.write_text(TEXT)
    prepare("tiny", input=str(src), out_root=str(root), log=lambda *a: None)
    return str(root)


def run(args, data_root, out_dir):
    """train.py's main on the tiny dataset with the TINY flags, then args: its exit code."""
    import train
    return train.main([*TINY, f"--data_root={data_root}", f"--out_dir={out_dir}", *args])


def losses(out_dir, key="loss"):
    """(iter, value) of every log.jsonl record with `key`: training losses, or with key="val_loss"
    evaluations."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [(r["iter"], r[key]) for r in map(json.loads, f) if key in r]


def stdout_note(prog, why):
    """The one note on stderr of a command whose standard output failed (support/console.py)."""
    return (f"{prog}: note: cannot write to standard output ({why}); nothing more is printed "
            f"there, and nothing else stops")


EPIPE = "Broken pipe: the program reading it has stopped"
ENOSPC = "No space left on device: the file it is redirected to is full"


def copy_with_a_bug(tmp_path):
    """A copy of the project's code (its top-level files, support/, data/ and tools/) whose mesh.py
    holds a student's bug: the loss's targets cut short, which PyTorch refuses with a ValueError.
    Returns (the copy's folder, the planted line's number); run it without PYTHONPATH, so that its
    own modules are the ones imported."""
    copy = tmp_path / "nanoMeSH"
    copy.mkdir()
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), copy / name)
    for folder in ("support", "data", "tools"):
        shutil.copytree(os.path.join(ROOT, folder), copy / folder,
                        ignore=lambda d, names: [n for n in names if not n.endswith(".py")])
    source = (copy / "mesh.py").read_text()
    right = "targets.reshape(-1), ignore_index=-1)"
    assert source.count(right) == 1
    source = source.replace(right, "targets[:, 1:].reshape(-1), ignore_index=-1)")
    (copy / "mesh.py").write_text(source)
    return copy, 1 + source[:source.index("targets[:, 1:]")].count("\n")


def write_indexed(prefix, sequences, dtype="uint16"):
    """PREFIX.bin and PREFIX.idx holding sequences (1-d token arrays), as Megatron writes them: the
    tokens back to back, then data/indexed.py's write_index. Returns the number of sequences."""
    import numpy as np
    from data.indexed import write_index
    np.concatenate([np.asarray(s) for s in sequences]).astype(dtype).tofile(prefix + ".bin")
    write_index(prefix, [len(s) for s in sequences], dtype)
    return len(sequences)


def listed(folder):
    """A folder's names, sorted, but its lock file (support/files.py's LOCK, empty: the lock is the
    system's), which a folder a process held keeps."""
    return sorted(set(os.listdir(folder)) - {".nanomesh.lock"})


def snapshot(*folders):
    """Every file under the folders with its content hash: equal snapshots mean nothing changed (a
    lock file holds nothing: listed)."""
    found = {}
    for folder in folders:
        for dirpath, _, files in os.walk(folder):
            for name in set(files) - {".nanomesh.lock"}:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


def poison_micro_batch(monkeypatch, n):
    """From now on the loss of the n-th training micro-batch (1-based) is NaN."""
    import mesh
    forward, calls = mesh.RecursiveGPT.forward, []

    def poisoned(self, idx, targets=None, **kw):
        logits, loss = forward(self, idx, targets, **kw)
        if self.training:
            calls.append(1)
            loss = loss * float("nan") if len(calls) == n else loss
        return logits, loss
    monkeypatch.setattr(mesh.RecursiveGPT, "forward", poisoned)


def train_bpe(path, add_space_runs=True):
    """A small byte-level BPE tokenizer.json shaped like GPT-NeoX's: NFC, ByteLevel without a prefix
    space, <|endoftext|> special, runs of 2-8 spaces as added tokens."""
    tk = pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator(BPE_CORPUS * 20, tk.trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|padding|>"], show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
    if add_space_runs:
        tok.add_tokens([tk.AddedToken(" " * n, normalized=True) for n in range(2, 9)])
    tok.save(str(path))
    return tok


# -----------------------------------------------------------------------------
# Two tiers: `python -m pytest` runs the fast tests (the model's equations and counts, configs,
# data, a tiny train and its resume, bad input), `python -m pytest --all` everything (CI's).

def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", help="run the slow tests too (CI runs this)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_report_header(config):
    if not config.getoption("--all"):
        return "the fast tier: tests marked slow are left out (python -m pytest --all runs them)"


def small_disk(tmp_path, size):
    """(tmp_path/disk, whether a real tmpfs of size bytes is mounted there: where this machine lets us)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        return disk, subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                    capture_output=True).returncode == 0
    except OSError:  # no mount command
        return disk, False
