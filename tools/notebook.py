"""
notebook.py: LESSON.ipynb, the class period in Jupyter, written from LESSON.md (its one source:
edit LESSON.md, then run this), and what its cells call.

    python tools/notebook.py     # LESSON.md -> LESSON.ipynb, stored without outputs

Every word of LESSON.md stays, in markdown cells; each command of a ```bash block becomes a code
cell, run(command), then show() of the figures its exercise's "Writes ..." sentence names (under
the command that names one, else under the exercise's last); the line of a ```python block is
added to mesh.py's SCHEMES by a cell too, once (scheme()).
"""

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import command, files  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
FENCE = re.compile(r"^```(bash|python)\n(.*?)^```\n", re.M | re.S)
NOTE = "*Written from LESSON.md by `python tools/notebook.py`: edit that, then run this.*"
FIRST = """import os


class NotHere(Exception):  # one line in the notebook, not a traceback (IPython's hook)
    def _render_traceback_(self):
        return [f"NotHere: {self}"]


if not os.path.isfile("tools/notebook.py"):  # Jupyter starts in the notebook's folder
    raise NotHere(f"{os.getcwd()} is not nanoMeSH's folder: start Jupyter there "
                  "(Colab: !git clone the repository, then %cd into it)")
from tools.notebook import run, scheme, show"""


class Failed(Exception):
    def _render_traceback_(self):  # IPython shows this line, not a traceback
        return [f"Failed: {self}"]


def run(line):
    """A lesson's `python ...` with the kernel's own Python (never the first on PATH), its output
    here as it comes; one that fails stops Run All, with a line under the command's own."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
    with subprocess.Popen([sys.executable, *shlex.split(line)[1:]], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, encoding="utf-8", errors="replace") as p:
        try:
            for out in p.stdout:
                print(out, end="", flush=True)
        except KeyboardInterrupt:  # it got the kernel's interrupt too: it saves and stops
            p.wait()
            raise
    if p.returncode:
        raise Failed(f"{line} exited with {p.returncode}: the lines above say why")


def show(*paths):
    """Each figure inline, or a line saying it is not drawn yet."""
    from IPython.display import Image, display
    for path in paths:
        if os.path.isfile(path):
            display(Image(filename=path))
        else:
            print(f"{path}: not drawn yet (its run has not finished: run the command above)")


def scheme(line, path="mesh.py"):
    """The lesson's line for SCHEMES, into mesh.py after anchor_emb's, unless a scheme of that name
    is there already (a cell run again adds nothing)."""
    source, name = open(path, encoding="utf-8").read(), line.split(":")[0].strip()
    if any(old.strip().startswith(name + ":") for old in source.splitlines()):
        print(f"{path} has a {name} scheme already: kept as it is")
        return
    after = re.search(r'^    "anchor_emb": lambda.*\n', source, re.M)[0]
    files.atomic_write(path, lambda f: f.write(source.replace(after, after + line + "\n", 1)),
                       mode="w")
    print(f"{path}: added to SCHEMES: {line.strip()}")


def cell(kind, text):
    lines = text.strip("\n").splitlines(keepends=True)
    if kind == "markdown":
        return dict(cell_type=kind, metadata={}, source=lines)
    return dict(cell_type=kind, execution_count=None, metadata={}, outputs=[], source=lines)


def cells(text):
    """LESSON.md's text -> the notebook's cells."""
    out = [cell("markdown", NOTE), cell("code", FIRST)]
    for section in re.split(r"^(?=## )", text, flags=re.M):
        writes = re.search(r"^Writes (.*?)\.(?:\s|$)", section, re.M | re.S)
        figures = [p for p in re.findall(r"`([^`]+)`", writes[1] if writes else "")
                   if p.endswith(".png")]
        lines = [c for kind, body in FENCE.findall(section) if kind == "bash"
                 for c in body.splitlines()]
        unnamed = [f for f in figures if not any(f in c for c in lines)]
        at = 0
        for m in FENCE.finditer(section):
            python = m[1] == "python"
            out.append(cell("markdown", section[at:m.end() if python else m.start()]))
            for c in m[2].splitlines():
                shown = [f for f in figures if f in c] + unnamed * (c == lines[-1])
                out.append(cell("code", f"scheme({c!r})" if python else f"run({c!r})"
                                + f"\nshow({', '.join(map(repr, shown))})" * bool(shown)))
            at = m.end()
        out.append(cell("markdown", section[at:]))
    out = [c for c in out if c["source"]]  # (no empty markdown between two commands)
    return [dict(c, id=f"c{i}") for i, c in enumerate(out)]


def notebook(text):
    """The .ipynb file's text (nbformat 4, as Jupyter writes it)."""
    kernel = dict(display_name="Python 3", language="python", name="python3")
    nb = dict(cells=cells(text), metadata=dict(kernelspec=kernel, language_info=dict(
        name="python")), nbformat=4, nbformat_minor=5)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@dataclass
class NotebookConfig:
    """LESSON.ipynb from LESSON.md (no settings)."""


def write(given):
    with open(os.path.join(ROOT, "LESSON.md"), encoding="utf-8") as f:
        text = notebook(f.read())
    files.atomic_write(os.path.join(ROOT, "LESSON.ipynb"), lambda f: f.write(text), mode="w")
    print("wrote LESSON.ipynb")


if __name__ == "__main__":
    sys.exit(command.main("tools/notebook.py", write, sys.argv[1:], NotebookConfig))
