"""
notebook.py: LESSON.ipynb, the class period in Jupyter, written from LESSON.md, its one source
(edit LESSON.md, then run this), and what its cells call.

    python tools/notebook.py     # LESSON.md -> LESSON.ipynb, stored without outputs

LESSON.md's words stay markdown; each command of a ```bash block is a code cell, run(), with
show() of the figures its exercise writes (under the command naming one, else its last); the line
of a ```python block is added to mesh.py by a cell too (scheme()).
"""

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from subprocess import DEVNULL, PIPE, STDOUT, Popen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # python tools/notebook.py: the project's modules are one folder up
from support import command, files  # noqa: E402

FENCE = re.compile(r"^```(bash|python)\n(.*?)^```\n", re.M | re.S)
FIRST = """# Written from LESSON.md by python tools/notebook.py: edit that, then run this.
import os

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
    python = [sys.executable, "-u", "-X", "utf8"]  # its output as it comes, in any language
    with Popen(python + shlex.split(line)[1:], stdin=DEVNULL, stdout=PIPE, stderr=STDOUT,
               encoding="utf-8", errors="replace") as p:
        try:
            for out in p.stdout:
                print(out, end="", flush=True)
        finally:  # interrupted: it got the kernel's interrupt too, and saves before it stops
            p.wait()
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
    there = name + ":" in source
    if not there:
        after = re.search(r'^    "anchor_emb": lambda.*\n', source, re.M)[0]
        new = source.replace(after, after + line + "\n", 1)
        files.atomic_write(path, lambda f: f.write(new), mode="w")
    print(f"{path}: SCHEMES has {name} ({'there already' if there else 'added now'})")


def cell(kind, text):
    code = dict(execution_count=None, outputs=[]) if kind == "code" else {}
    return dict(cell_type=kind, metadata={}, source=text.strip("\n").splitlines(True), **code)


def cells(text):
    """LESSON.md's text -> the notebook's cells."""
    out = [cell("code", FIRST)]
    for section in re.split(r"^(?=## )", text, flags=re.M):
        at, figures = 0, re.findall(r"`(runs/[^`]+\.png)`", section)
        for m in FENCE.finditer(section):
            out.append(cell("markdown", section[at:m.end() if m[1] == "python" else m.start()]))
            lines = m[2].splitlines()
            for c in lines:
                shown = [f for f in figures if f in c or c == lines[-1] and not any(
                    f in d for d in lines)]
                out.append(cell("code", f"scheme({c!r})" if m[1] == "python" else f"run({c!r})"
                                + f"\nshow({', '.join(map(repr, shown))})" * bool(shown)))
            at = m.end()
        out.append(cell("markdown", section[at:]))
    out = [c for c in out if c["source"]]  # (no empty markdown between two commands)
    return [dict(c, id=f"c{i}") for i, c in enumerate(out)]


def notebook(text):
    """The .ipynb file's text (nbformat 4, as Jupyter writes it)."""
    kernel = dict(display_name="Python 3", language="python", name="python3")
    nb = dict(cells=cells(text), metadata=dict(kernelspec=kernel), nbformat=4, nbformat_minor=5)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@dataclass
class NotebookConfig:
    """LESSON.ipynb from LESSON.md (no settings)."""


def write(given):
    text = notebook(open(os.path.join(ROOT, "LESSON.md"), encoding="utf-8").read())
    files.atomic_write(os.path.join(ROOT, "LESSON.ipynb"), lambda f: f.write(text), mode="w")
    print("wrote LESSON.ipynb")


if __name__ == "__main__":
    sys.exit(command.main("tools/notebook.py", write, sys.argv[1:], NotebookConfig))
