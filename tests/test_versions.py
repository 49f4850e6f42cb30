"""
The versions the README names hold: every file parses as Python 3.10 (the floor it states), the floors
of the README, requirements.txt and CI's two environments agree, with this machine above them, and the
one part that needs a newer torch than the floor refuses in one line below it.

    python -m pytest tests/test_versions.py -q
"""
import ast
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from configurator import UsageError
from types import SimpleNamespace

from support.sharded import Sharded
from conftest import HANG, ROOT

PYTHON = (3, 10)   # the oldest Python the README names (CI's second environment)
TORCH = (2, 6)     # the oldest torch: CI's second environment installs it (the registry's build)
TESTED = (2, 13)   # the torch CI's first environment installs, its CPU build
CPU_FSDP = (2, 7)  # FSDP2 on a CPU: refused under it


def project_files():
    """Every .py file of the project (not git's, not caches)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        found += [os.path.join(folder, n) for n in files if n.endswith(".py")]
    return sorted(found)


def test_every_file_parses_as_the_oldest_python_named():
    assert len(project_files()) > 40
    for path in project_files():
        with open(path, encoding="utf-8") as f:
            ast.parse(f.read(), path, feature_version=PYTHON)  # a SyntaxError names the file


def version(text):
    return tuple(int(x) for x in text.split("."))


def test_the_floors_named_agree_and_hold_here():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        requirements = f.read()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    py, floor, fsdp = ("%d.%d" % v for v in (PYTHON, TORCH, CPU_FSDP))
    assert re.search(r"\*\*Python\*\* (\d+\.\d+)\+ and \*\*PyTorch\*\* (\d+\.\d+)\+", readme).groups() == (py, floor)
    assert f"| Python {py}, torch {floor} |" in readme and f"| torch {fsdp} | `--fsdp=true` on a CPU" in readme
    assert re.search(r"^torch>=(\S+)$", requirements, re.M)[1] == floor
    assert re.search(r"Python (\d+\.\d+) or later", requirements)[1] == py
    assert f"FSDP2 on a CPU needs {fsdp}" in requirements
    assert version(re.search(r"torch==(\S+)", ci)[1])[:2] == TESTED
    assert version(re.search(r"^FLOOR_TORCH=(\S+)$", ci, re.M)[1])[:2] == TORCH
    assert re.search(r"PYENV_VERSION=(\S+) \$\{PYTHON_FLOOR:-python(\S+)\}", ci).groups() == (py, py)
    assert sys.version_info[:2] >= PYTHON
    assert version(re.match(r"\d+\.\d+", torch.__version__)[0]) >= TORCH


def device(name):  # as support/device.py's Device gives it
    return SimpleNamespace(name=name, type=name.split(":")[0], dtype="float32", compile=False)


def test_fsdp_on_a_cpu_under_torch_2_7_is_refused_in_one_line(monkeypatch):
    """FSDP2's CPU streams came in torch 2.7: below it --fsdp=true on a CPU names the version it needs, before
    anything is sharded (on a GPU it goes on)."""
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.6.0+cu124"))
    with pytest.raises(UsageError) as e:
        Sharded(True).wrap(None, device("cpu"), scratch=True)
    assert str(e.value) == ("--fsdp=true on cpu needs torch %d.%d or later (this is 2.6.0+cu124): upgrade torch, "
                            "or train without --fsdp (DDP)" % CPU_FSDP)
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("%d.%d.0" % CPU_FSDP))
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'to'"):  # past the check
        Sharded(True).wrap(None, device("cpu"), scratch=True)
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.6.0+cu124"))
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'to'"):
        Sharded(True).wrap(None, device("cuda:0"), scratch=True)


def python_3_10():
    """A python3.10 on PATH that runs (pyenv's shim runs one when told its version), or None."""
    env = {**os.environ, "PYENV_VERSION": "3.10"}  # (pyenv's shims run the version it names)
    if shutil.which("python3.10") and subprocess.run(["python3.10", "-c", ""], env=env,
                                                    capture_output=True).returncode == 0:
        return env
    return None


def test_every_file_compiles_with_a_real_python_3_10(tmp_path):
    """The real 3.10 grammar (ast's feature_version is best effort), byte-compiling into tmp_path."""
    env = python_3_10()
    if env is None:
        pytest.skip("no python3.10 on PATH to compile with")
    code = ("import py_compile, sys\n"
            "for p in sys.argv[2:]:\n"
            "    py_compile.compile(p, cfile=sys.argv[1] + '/x.pyc', doraise=True)\n"
            "print(sys.version_info[:2])")
    r = subprocess.run(["python3.10", "-c", code, str(tmp_path), *project_files()], capture_output=True, text=True,
                       timeout=HANG, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "(3, 10)", r.stderr
