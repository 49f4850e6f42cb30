"""
The project's shape, held by the suite: the top level is the teaching path, the teaching files stay
within their line budgets, they and the library (support/, data/, tools/) under 100 characters a
line, mesh.py stands alone, tests share conftest.py rather than each other, and every command the
README, LESSON.md and results/ show names a script that exists and settings it takes.

    python -m pytest tests/test_layout.py
"""

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import HANG, ROOT

# what a default run reads, the files a student opens: the scripts, and the data a batch comes from
TEACHING = ["mesh.py", "train.py", "sample.py", "configurator.py", "data/dataset.py"]
PROJECT = {"mesh", "train", "sample", "configurator", "support", "data", "tools"}  # its modules
TOP_LEVEL_PY = {"mesh.py", "train.py", "sample.py", "configurator.py", "test_mesh.py"}
BUDGETS = {"mesh.py": 580, "train.py": 340, "README.md": 310}  # lines
TEACHING_BUDGET, WIDTH = 1450, 99  # lines together; characters a line, at most (under 100)


def lines(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read().splitlines()


def test_the_top_level_is_the_teaching_path():
    found = {n for n in os.listdir(ROOT) if n.endswith(".py")}
    assert found == TOP_LEVEL_PY, "a new .py belongs in support/ or tools/, not at the top"
    for folder in ("support", "tools", "tests", "data", "config", "results"):
        assert os.path.isdir(os.path.join(ROOT, folder)), folder


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_line_budgets(name):
    assert len(lines(name)) <= BUDGETS[name], f"{name} is over {BUDGETS[name]} lines: make room"


def test_the_teaching_files_together_and_their_width():
    total = sum(len(lines(n)) for n in TEACHING)
    assert total <= TEACHING_BUDGET, f"the teaching files have {total} lines, over {TEACHING_BUDGET}"
    wide = [f"{n}:{i}" for n in TEACHING for i, line in enumerate(lines(n), 1) if len(line) > WIDTH]
    assert not wide, f"lines over {WIDTH} characters: {', '.join(wide[:10])}"


@pytest.mark.parametrize("folder", ["support", "data", "tools"])
def test_the_library_keeps_lines_within_the_width_too(folder):
    names = sorted(n for n in os.listdir(os.path.join(ROOT, folder)) if n.endswith(".py"))
    wide = [f"{folder}/{n}:{i}" for n in names for i, line in enumerate(lines(f"{folder}/{n}"), 1)
            if len(line) > WIDTH]
    assert not wide, f"lines over {WIDTH} characters: {', '.join(wide[:10])}"


def test_mesh_py_can_be_copied_alone(tmp_path):
    """Only torch and the standard library: a copy of mesh.py alone builds and runs a model, and
    runs as a script (the classroom model's summary)."""
    shutil.copy(os.path.join(ROOT, "mesh.py"), tmp_path)
    code = ("import torch, mesh; cfg = mesh.Config(vocab_size=65, block_size=16, n_embd=32, n_head=2, "
            "layout='1+1R2+1', scheme='mesh'); model = mesh.RecursiveGPT(cfg); "
            "print(tuple(model(torch.zeros(1, 8, dtype=torch.long))[0].shape))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the project's
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=HANG)
    assert r.returncode == 0 and r.stdout.strip() == "(1, 8, 65)", r.stderr[-2000:]
    r = subprocess.run([sys.executable, "mesh.py"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=HANG)
    assert r.returncode == 0 and "layout 2+4R2+2, scheme mesh, 5 slots" in r.stdout, r.stderr[-2000:]


def imported(path):
    """The top-level names of every module the file imports."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_layers_import_one_way():
    """configurator.py, the lowest file, imports no project module; support/ never imports data/ (data/
    uses support/'s locks and files)."""
    assert not imported(os.path.join(ROOT, "configurator.py")) & PROJECT
    for name in os.listdir(os.path.join(ROOT, "support")):
        if name.endswith(".py"):
            assert "data" not in imported(os.path.join(ROOT, "support", name)), f"support/{name}"


def test_train_calls_about_a_dozen_names_of_the_project():
    """train() reads as nanoGPT's: besides the model, its own functions and the objects it makes
    (the Run, the Dataset, the Spread, the Device), it calls at most a dozen names of the project's
    other modules; an error it raises is not counted."""
    tree = ast.parse(open(os.path.join(ROOT, "train.py"), encoding="utf-8").read())
    modules, names = set(), set()  # what train.py imports from the project
    for node in ast.walk(tree):  # (an import inside train() too)
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                is_module = node.module == "support"  # from support import guards, machine, ...
                (modules if is_module else names).add(alias.asname or alias.name)
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    called = set()
    for node in ast.walk(train):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in names:
            called.add(f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id in modules or f.value.id in names:
                called.add(f"{f.value.id}.{f.attr}")
    called = {c for c in called if c != "RecursiveGPT" and not c.endswith("Error")}
    assert len(called) <= 12, sorted(called)


def test_no_test_module_imports_another_and_the_model_tests_no_tool():
    tests = ["test_mesh.py"] + [f"tests/{n}" for n in os.listdir(os.path.join(ROOT, "tests"))
                                if n.endswith(".py")]
    for path in tests:
        found = imported(os.path.join(ROOT, path))
        assert not {n for n in found if n.startswith("test_")}, f"{path} imports a test module"
    assert "tools" not in imported(os.path.join(ROOT, "test_mesh.py"))


# -----------------------------------------------------------------------------
# Every command shown in the README and results/ (the scripts and the settings they take)

def settings_of(script):
    """The dataclass a script parses its command line into, or None for a grammar not ours."""
    sys.path.insert(0, ROOT)
    import importlib
    module, cls = {"train.py": ("train", "TrainConfig"), "sample.py": ("sample", "SampleConfig"),
                   "tools/bench.py": ("tools.bench", "BenchConfig"),
                   "tools/probe.py": ("tools.probe", "ProbeConfig"),
                   "tools/routing.py": ("tools.routing", "RoutingConfig"),
                   "tools/draw.py": ("tools.draw", "DrawConfig"),
                   "tools/table1.py": ("tools.table1", "Table1Config"),
                   "tools/cycle.py": ("tools.cycle", "CycleConfig"),
                   "tools/consolidate.py": ("tools.consolidate", "ConsolidateConfig"),
                   "tools/gpu_check.py": ("tools.gpu_check", "CheckConfig"),
                   "data/prepare.py": ("data.prepare", "PrepareConfig")}.get(script, (None, None))
    return getattr(importlib.import_module(module), cls) if module else None


def shown_commands():
    """(file, command line) for every `python SCRIPT ...` line of a code block in the Markdown files."""
    docs = ["README.md", "LESSON.md", "data/README.md"] + [os.path.join(d, n).replace(ROOT + os.sep, "")
                                              for d, _, files in os.walk(os.path.join(ROOT, "results"))
                                              for n in files if n.endswith(".md")]
    found = []
    for doc in docs:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read().replace("\\\n", " ")
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                line = line.split("  #")[0].strip()
                for part in re.split(r"&&|;", line):
                    m = re.search(r"(?:^|\s)(?:python|train\.py|torchrun .*?)\s*(\S+\.py)(.*)$", part.strip())
                    if m and "pip " not in part and "pythia/utils" not in m[1]:
                        found.append((doc, m[1], m[2]))
    return found


COMMANDS = shown_commands()


@pytest.mark.parametrize("doc, script, args", COMMANDS, ids=[f"{d}:{s}" for d, s, _ in COMMANDS])
def test_every_command_shown_names_a_script_and_its_settings(doc, script, args, monkeypatch):
    assert os.path.isfile(os.path.join(ROOT, script)), f"{doc}: {script} does not exist"
    settings = settings_of(script)
    if settings is None:  # mesh.py's and the tools' own small grammars are tested with them
        return
    from configurator import parse_flags
    from support.files import read_config
    words = []
    for word in (w.strip("[]") for w in shlex.split(args)):
        if "..." in word or "|" in word or "$" in word or re.fullmatch(r"[A-Z][A-Z_]*", word):
            # a placeholder: drop it, and the flag it is the value of
            words = words[:-1] if words and words[-1].startswith("--") and "=" not in words[-1] else words
        elif word not in (">", "2>&1"):
            words.append(word)
    monkeypatch.chdir(ROOT)
    if "--help" in words:
        with pytest.raises(SystemExit, match="0"):
            parse_flags(settings, words, script, read_config=read_config)
    else:  # raises for a setting the script does not have
        parse_flags(settings, words, script, read_config=read_config)



def test_the_results_scripts_import_what_the_project_has():
    """results/'s scripts run Python of their own: each name they import from the project is there
    (table.sh evaluates each checkpoint with table1.py's own eval_batches and val_loss)."""
    sys.path.insert(0, ROOT)
    import importlib.util
    imports = re.compile(r"^from ((?:tools|support|data)\S*) import (.+)$", re.M)
    for d, _, names in os.walk(os.path.join(ROOT, "results")):
        for path in (os.path.join(d, n) for n in names if n.endswith(".sh")):
            for module, what in imports.findall(open(path, encoding="utf-8").read()):
                for name in (w.strip() for w in what.split(",")):
                    found = hasattr(importlib.import_module(module), name)
                    assert found or importlib.util.find_spec(f"{module}.{name}"), (path, name)


def test_the_results_scripts_default_to_the_projects_folders():
    """Run from a clone as results/README.md shows them: their defaults are relative (runs/, data/),
    never one machine's absolute paths."""
    for d, _, names in os.walk(os.path.join(ROOT, "results")):
        for path in (os.path.join(d, n) for n in names if n.endswith(".sh")):
            text = open(path, encoding="utf-8").read()
            assert not re.findall(r"\$\{\w+:-/[^}]*\}", text), path
