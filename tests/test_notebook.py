"""
LESSON.ipynb is LESSON.md in Jupyter: written from it by tools/notebook.py (the file as stored is
what the script writes now, without outputs), holding the lesson's words and, as code, its commands
(read by test_lesson.py's own parser, conftest.exercises), figures and line for mesh.py; what its cells call, checked.

    python -m pytest -q tests/test_notebook.py
"""

import ast
import importlib.util
import json
import os
import re
import shutil
import sys

import pytest

from conftest import LESSON, ROOT, exercises
from tools import notebook

NOTEBOOK = os.path.join(ROOT, "LESSON.ipynb")


def stored():
    with open(NOTEBOOK, encoding="utf-8") as f:
        return json.load(f)


def calls(nb):
    """[(function, its literal arguments...)] of every code cell after the first."""
    found = []
    for c in nb["cells"][1:]:
        if c["cell_type"] == "code":
            for line in ast.parse("".join(c["source"])).body:
                found.append((line.value.func.id, *[ast.literal_eval(a) for a in line.value.args]))
    return found


def test_the_notebook_is_what_the_script_writes_from_the_lesson():
    with open(LESSON, encoding="utf-8") as f:
        written = notebook.notebook(f.read())
    with open(NOTEBOOK, encoding="utf-8") as f:
        assert f.read() == written, "LESSON.ipynb is not LESSON.md's: run python tools/notebook.py"


def test_the_notebook_is_stored_without_outputs():
    nb = stored()
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and nb["nbformat"] == 4
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)


def test_the_notebook_is_valid_nbformat():
    nbformat = pytest.importorskip("nbformat", reason="nbformat (Jupyter's) is not installed")
    nbformat.validate(nbformat.read(NOTEBOOK, as_version=4))


def test_the_notebook_has_the_lessons_words_commands_figures_and_edit():
    """Its markdown is LESSON.md but the ```bash blocks, line for line; its code runs each command
    of each exercise in order, shows every figure the exercise says it writes, once, under the
    command naming it (else the exercise's last), and adds the lesson's line to SCHEMES."""
    nb = stored()
    text = open(LESSON, encoding="utf-8").read()
    words = [line for line in re.sub(r"```bash\n.*?```\n", "", text, flags=re.S).splitlines() if line]
    markdown = [line.rstrip("\n") for c in nb["cells"][1:] if c["cell_type"] == "markdown"
                for line in c["source"] if line.strip()]
    assert markdown == words
    expected = []
    for title, commands, added, paths, quoted in exercises():
        expected += [("scheme", line) for line in added]
        figures = [p for p in paths if p.endswith(".png")]
        for command in commands:
            expected.append(("run", command))
            shown = [p for p in figures if p in command] or (
                [p for p in figures if not any(p in c for c in commands)] if command == commands[-1] else [])
            expected += [("show", *shown)] if shown else []
    assert calls(nb) == expected
    assert len([p for call in expected if call[0] == "show" for p in call[1:]]) == 9


def test_run_uses_the_kernels_python_not_the_one_on_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no python on PATH at all
    notebook.run("python -c 'import sys; print(sys.executable); print(\"é ±\")'")
    assert capsys.readouterr().out == f"{sys.executable}\né ±\n"


def test_a_failed_command_stops_the_notebook_in_one_line(capsys):
    command = "python -c 'import sys; print(\"tool: error: why; fix\"); sys.exit(2)'"
    with pytest.raises(notebook.Failed) as e:
        notebook.run(command)
    assert capsys.readouterr().out == "tool: error: why; fix\n"
    assert e.value._render_traceback_() == [f"Failed: {command} exited with 2: the lines above say why"]
    killed = "python -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'"  # out of memory
    with pytest.raises(notebook.Failed, match=f"^{re.escape(killed)} exited with -9: "):
        notebook.run(killed)


def test_run_shows_what_a_command_prints_in_any_locale(monkeypatch, capsys):
    """In a locale that cannot write é (C, as a Windows console cannot write every language), the command's Python
    writes UTF-8; a byte that is not UTF-8 (a program's own bytes) is shown as �, not the kernel's traceback."""
    for name, value in [("LC_ALL", "C"), ("PYTHONCOERCECLOCALE", "0"), ("PYTHONUTF8", "0")]:
        monkeypatch.setenv(name, value)
    notebook.run("python -c 'import sys; print(\"é ±\", flush=True); sys.stdout.buffer.write(b\"\\xff\\n\")'")
    assert capsys.readouterr().out == "é ±\n\ufffd\n"


def test_run_shows_each_line_as_it_comes(tmp_path, monkeypatch):
    """Not at the command's end: here the command waits (a minute at most) for its first line to be shown."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # a notebook's kernel may not have it
    shown, lines = tmp_path / "shown", []
    monkeypatch.setattr(notebook, "print", lambda out, **kw: [lines.append(out), shown.touch()], raising=False)
    notebook.run(f"python -c 'import os, time; print(1); [time.sleep(0.1) for _ in range(600) if not "
                 f"os.path.exists(\"{shown}\")]; print(os.path.exists(\"{shown}\"))'")
    assert lines == ["1\n", "True\n"]


def test_an_interrupted_command_is_waited_for(tmp_path, monkeypatch):
    """Jupyter's interrupt (a KeyboardInterrupt here; the command gets its SIGINT too): the cell ends with the
    command, which may be saving a checkpoint, never before it."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    saved = tmp_path / "saved"
    monkeypatch.setattr(notebook, "print", interrupt, raising=False)
    with pytest.raises(KeyboardInterrupt):
        notebook.run(f"python -c 'import time; print(1, flush=True); time.sleep(2); open(\"{saved}\", \"w\")'")
    assert saved.exists()


def test_show_draws_a_figure_inline_or_says_it_is_not_drawn_yet(tmp_path, monkeypatch, capsys):
    display = pytest.importorskip("IPython.display", reason="IPython (Jupyter's kernel) is not installed")
    shown = []
    monkeypatch.setattr(display, "display", shown.append)
    png = tmp_path / "a.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    notebook.show(str(png), str(tmp_path / "b.png"))
    assert [(type(s), s.data) for s in shown] == [(display.Image, png.read_bytes())]
    assert capsys.readouterr().out == (f"{tmp_path / 'b.png'}: not drawn yet (its run has not finished: "
                                       f"run the command above)\n")


def test_the_lessons_line_is_added_to_schemes_once(tmp_path, capsys):
    (line,) = [added for _, _, lines, _, _ in exercises() for added in lines]
    path = tmp_path / "mesh.py"
    shutil.copy(os.path.join(ROOT, "mesh.py"), path)
    notebook.scheme(line, str(path))
    notebook.scheme(line, str(path))  # the cell run again
    assert capsys.readouterr().out == (f'{path}: SCHEMES has "half" (added now)\n'
                                       f'{path}: SCHEMES has "half" (there already)\n')
    source = path.read_text()
    assert source.count(line) == 1
    spec = importlib.util.spec_from_file_location("mesh_with_half", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import mesh
    assert list(module.SCHEMES) == [*list(mesh.SCHEMES)[:list(mesh.SCHEMES).index("anchor_emb") + 1],
                                    "half", *list(mesh.SCHEMES)[list(mesh.SCHEMES).index("anchor_emb") + 1:]]


def test_the_first_cell_names_the_fix_outside_the_repository(tmp_path):
    """Its first code cell, in a kernel started elsewhere (as Colab's is): one line, and nothing
    after it runs; at the repository's root it imports the cells' helpers."""
    nbclient = pytest.importorskip("nbclient", reason="nbclient (Jupyter's) is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel (Jupyter's kernel) is not installed")
    nbformat = pytest.importorskip("nbformat", reason="nbformat (Jupyter's) is not installed")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = nb.cells[:1] + [nbformat.v4.new_code_cell("print(run.__module__)")]
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert [o["traceback"] for o in nb.cells[0].outputs] == [[
        f"NotHere: {tmp_path} is not nanoMeSH's folder: start Jupyter there (Colab: !git clone the "
        f"repository, then %cd into it)"]]
    assert nb.cells[1].outputs == []
    nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": ROOT}}).execute()
    assert nb.cells[1].outputs[0]["text"] == "tools.notebook\n"
