"""
Every laptop: the teaching path where Linux's conveniences are missing, as on Windows (no fcntl, no
resource, no os.statvfs, no /proc), and offline. Each command runs in a fresh Python whose
sitecustomize takes those away (for its children too): a short training, a sample, a two-run
table1.py, a tiny bench.py and every script's --help.

    python -m pytest -q tests/test_portable.py --all  # marked slow: the fast tier leaves it out
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import HANG, ROOT

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all
WINDOWS_LIKE = '''
import builtins, io, os, sys
sys.modules["fcntl"] = sys.modules["resource"] = None  # import fcntl (or resource): ImportError
del os.statvfs
_open, _os_open = builtins.open, os.open

def _proc(path):
    if isinstance(path, int):  # a file descriptor
        return False
    path = os.fspath(path)
    return path.startswith(b"/proc" if isinstance(path, bytes) else "/proc")

def open_(file, *args, **kwargs):
    if _proc(file):
        raise FileNotFoundError(2, "No such file or directory (no /proc on this system)", file)
    return _open(file, *args, **kwargs)

def os_open(path, *args, **kwargs):
    if _proc(path):
        raise FileNotFoundError(2, "No such file or directory (no /proc on this system)", path)
    return _os_open(path, *args, **kwargs)

builtins.open = io.open = open_
os.open = os_open
'''
TINY = ["--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=4", "--layout=1+1R2+1", "--eval_iters=2"]


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    """(run, folder): run(script, *args) runs a project script there, offline (Tiny Shakespeare's address
    leads nowhere) and without fcntl, resource, os.statvfs and /proc."""
    folder = tmp_path_factory.mktemp("laptop")
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(WINDOWS_LIKE)
    env = {**os.environ, "PYTHONPATH": str(folder / "site"), "OMP_NUM_THREADS": "1",
           "NANOMESH_SHAKESPEARE_URL": (folder / "nowhere.txt").as_uri()}

    def run(script, *args, timeout=HANG):
        return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                              cwd=folder, env=env, timeout=timeout)
    return run, folder


def test_the_environment_really_lacks_them(laptop):
    run, folder = laptop
    (folder / "probe_env.py").write_text("import os, sys\nprint(sys.modules['fcntl'], hasattr(os, 'statvfs'))\n"
                                         "open('/proc/cpuinfo')\n")
    r = subprocess.run([sys.executable, str(folder / "probe_env.py")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(folder / "site")})
    assert r.stdout == "None False\n" and "FileNotFoundError" in r.stderr and "no /proc on this system" in r.stderr


def test_train_and_sample(laptop):
    run, folder = laptop
    r = run("train.py", *TINY, f"--data_root={folder / 'data'}", "--out_dir=out", "--max_iters=3", "--eval_interval=3",
            "--sample_tokens=10")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Tiny Shakespeare could not be downloaded" in r.stderr and "---- sample ----" in r.stdout
    assert "note: cannot lock" not in r.stdout and (folder / "out" / ".nanomesh.lock").is_file()  # without fcntl
    r = run("train.py", "--init_from=resume", "--out_dir=out", "--max_iters=4")  # resume, and clean up, too
    assert r.returncode == 0, r.stderr[-3000:]
    r = run("sample.py", "--out_dir=out", "--max_new_tokens=8")
    assert r.returncode == 0 and r.stdout.endswith("---------------\n"), r.stderr[-3000:]


def test_table1_offline_names_the_data_it_trained_on(laptop):
    """Two runs, offline: train.py falls back on the pydoc text, and the table and its JSON say so."""
    run, folder = laptop
    r = run("tools/table1.py", "--only=vanilla,base", "--seeds=0", "--max_iters=2", "--root=runs", "--results=res",
            f"--data_root={folder / 'data'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    md = (folder / "res" / "table1.md").read_text()
    assert md.startswith("Python's pydoc text (characters; Tiny Shakespeare could not be downloaded), compute depth 12")
    table = json.loads((folder / "res" / "table1.json").read_text())
    assert table["settings"]["dataset"] == "pydoc" and {r["dataset"] for r in table["runs"]} == {"pydoc"}
    assert [p["dataset"] for p in json.loads((folder / "res" / "table1_probe.json").read_text())] == ["pydoc"]
    try:
        import matplotlib  # noqa: F401
        assert (folder / "res" / "table1_curves.png").stat().st_size > 0
    except ImportError:
        assert "matplotlib is not installed, so no figures (pip install matplotlib)" in r.stdout
    # the data moved: a rerun given its new root reuses the runs and passes the root on to its figures
    (folder / "res" / "table1_probe.json").unlink()
    os.rename(folder / "data", folder / "moved")
    r = run("tools/table1.py", "--only=vanilla,base", "--seeds=0", "--max_iters=2", "--root=runs", "--results=res",
            f"--data_root={folder / 'moved'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [p["dataset"] for p in json.loads((folder / "res" / "table1_probe.json").read_text())] == ["pydoc"]
    os.rename(folder / "moved", folder / "data")  # as the other tests expect it


def test_bench_says_what_it_cannot_measure(laptop):
    run, _ = laptop
    r = run("tools/bench.py", "--schemes=base,mesh", "--iters=1", "--warmup=0", "--decode=false", "--n_embd=32",
            "--n_head=2", "--block_size=16", "--batch_size=2", "--layout=1+1R2+1", "--vocab_size=32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("Not measured on this system: peak memory (no /proc/self/status); how busy other "
            "processes kept the CPUs (no /proc/stat).") in r.stdout
    assert "peak RSS MB" not in r.stdout and "| mesh | 1+1R2+1 |" in r.stdout


@pytest.mark.parametrize("script", ["train.py", "sample.py", "tools/probe.py", "tools/table1.py", "tools/bench.py", "tools/draw.py",
                                    "data/prepare.py", "tools/consolidate.py"])
def test_every_script_starts(script, laptop):
    run, _ = laptop
    r = run(script, "--help")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "usage:" in r.stdout + r.stderr and "Traceback" not in r.stderr
