"""
The students' exercise (README, the model page): a scheme of one's own is one line in mesh.py's
SCHEMES table. In a copy of the project with that line added, train.py trains it, --help lists it,
table1.py takes it, and test_mesh.py says where its reference formula goes.

    python -m pytest -q tests/test_exercise.py --all  # marked slow: the fast tier leaves it out
"""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import HANG, ROOT

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all

ANCHOR_EMB = '    "anchor_emb": lambda h_m, h, h0, h_emb: h_m + h_emb,'
HALF = '    "half": lambda h_m, h, h0, h_emb: h_m + (h + h_emb) / 2,  # h(t+1) = f_t(h(t)) + (h(t) + h_emb) / 2'


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A copy of the project whose mesh.py has one more scheme, and run(script, *args) there, offline."""
    copy = tmp_path_factory.mktemp("student") / "nanomesh"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "runs", "out", "out-*", "results", "__pycache__",
                                                              "shakespeare*", "pydoc"))
    source = (copy / "mesh.py").read_text()
    line = next(line for line in source.splitlines() if line.startswith(ANCHOR_EMB))
    (copy / "mesh.py").write_text(source.replace(line, f"{line}\n{HALF}", 1))  # the student's one edit
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NANOMESH_SHAKESPEARE_URL": (copy / "nowhere.txt").as_uri()}

    def run(*args, timeout=HANG):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=copy, env=env,
                              timeout=timeout)
    return run


def test_train_py_trains_it_and_lists_it(student):
    r = student("train.py", "--scheme=half", "--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=4",
                "--eval_iters=2", "--max_iters=3", "--eval_interval=3", "--sample_tokens=0", "--out_dir=out")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "scheme half:" in r.stdout
    r = student("train.py", "--help")
    assert "schemes: base, residual, anchor, anchor_emb, half, mesh" in r.stdout


def test_table1_takes_it(student):
    r = student("tools/table1.py", "--only=half", "--seeds=0", "--max_iters=1", "--root=runs", "--results=res")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| half | `2+4R2+2` | 2 | 1,586,432 |" in r.stdout  # the base scheme's parameters: no routers


def test_test_mesh_asks_for_its_reference_formula(student):
    r = student("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mesh.py", "-k", "independent and half")
    assert r.returncode == 1, r.stdout[-3000:]
    assert ("scheme 'half' of mesh.SCHEMES has no reference formula: add its update rule to REFERENCE in "
            "test_mesh.py (written from its equation, not copied from mesh.py)") in r.stdout
