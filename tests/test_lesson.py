"""
LESSON.md, run as a class would, at a tiny size: in a fresh copy of the project, offline, every
command each exercise shows runs (table1.py's with 2 steps at width 32 and one seed), the line the
lesson adds to mesh.py is added, every file the exercise says it writes is there, and every output
the lesson quotes from a command run at its real size is printed word for word.

    python -m pytest -q tests/test_lesson.py --all
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import HANG, LESSON, ROOT, exercises

pytestmark = pytest.mark.slow  # a dozen real processes, table1.py's trainings among them

TINY = {"tools/table1.py": ["--max_iters=2", "--n_embd=32", "--seeds=0"]}  # appended: the tiny size


def test_the_lesson_is_whole():
    text = open(LESSON, encoding="utf-8").read()
    assert "LESSON_" not in text, "a number the lesson still waits for"
    found = exercises()
    assert 5 <= len(found) <= 7 and all(commands and paths for _, commands, _, paths, _ in found[:2])
    assert all(re.search(r"\(.*\d.*minutes?\)$", title) for title, *_ in found), [t for t, *_ in found]


def test_the_setup_the_lesson_points_to_installs_matplotlib():
    """The lesson's figures need matplotlib: the README's Quick start, which the lesson names as its
    setup, installs requirements.txt on every line, and requirements.txt lists it."""
    assert "the README's Quick start\ninstalls what they need" in open(LESSON, encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quick = re.search(r"## Quick start\n\n```bash\n(.*?)```", readme, flags=re.S)[1]
    installs = [line for line in quick.splitlines() if line.startswith("pip ")]
    assert len(installs) == 2 and all("pip install -r requirements.txt" in line for line in installs)
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        assert "matplotlib" in [line.strip() for line in f if not line.startswith("#")]


@pytest.fixture(scope="module")
def classroom(tmp_path_factory):
    """A fresh copy of the project (no runs, no data) and run(command) there, offline."""
    copy = tmp_path_factory.mktemp("class") / "nanomesh"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "runs", "out", "out-*", "results", "__pycache__",
                                                              "shakespeare*", "pydoc", ".shakespeare*"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NANOMESH_SHAKESPEARE_URL": (copy / "nowhere.txt").as_uri()}

    def run(command):
        words = shlex.split(command)
        assert words[0] == "python", command
        words += TINY.get(words[1], [])
        return subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, cwd=copy, env=env,
                              timeout=HANG)
    return copy, run


def test_every_exercise_runs_and_writes_what_it_says(classroom):
    copy, run = classroom
    try:
        import matplotlib  # noqa: F401
        figures = True
    except ImportError:
        figures = False  # the tools say so, and write the rest
    for title, commands, added, paths, quoted in exercises():
        if added:  # the student's edit: after the last built-in scheme
            source = (copy / "mesh.py").read_text()
            line = next(line for line in source.splitlines() if line.startswith('    "anchor_emb": lambda'))
            (copy / "mesh.py").write_text(source.replace(line, "\n".join([line, *added]), 1))
        printed = ""
        for command in commands:
            r = run(command)
            assert r.returncode == 0, f"{title}: {command}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
            printed += r.stdout
        for path in paths:
            assert (not figures and path.endswith(".png")) or (copy / path).is_file(), f"{title}: {path} not written"
        if not any(shlex.split(c)[1] in TINY for c in commands):  # run at their real size: the numbers quoted
            for line in quoted:
                assert line in printed, f"{title}: the lesson quotes {line!r}, not printed"
    assert "Python's pydoc text" in (copy / "runs" / "lesson" / "table1.md").read_text()  # offline


def test_what_each_loop_step_knows_quotes_its_saved_probe():
    """The last exercise's table is results/steps/lesson/steps.json (its probe.py command at the
    lesson's size), each run's own loss, then its loss after each loop step, rounded as quoted;
    the figures it reads are saved beside it."""
    import json
    text = open(LESSON, encoding="utf-8").read()
    section = text[text.index("## 7. What each loop step knows"):]
    folder = os.path.join(ROOT, "results", "steps", "lesson")
    for r in json.load(open(os.path.join(folder, "steps.json"), encoding="utf-8")):
        name = os.path.basename(r["out_dir"]).split("_")[0]  # vanilla, base, mesh
        row = re.search(rf"^\| {name}\b[^|]*\|(.*)\|$", section, flags=re.M)[1]
        quoted = [c.strip().strip("*") for c in row.split("|") if c.strip() != "-"]
        assert quoted == [f"{v:.2f}" for v in [r["loss"]] + r["step_loss"][:len(quoted) - 1]], name
        assert len(quoted) == 1 + (len(r["step_loss"]) if r["n_steps"] else 0), name
    for figure in ("steps.png", "sentence.png"):
        assert os.path.isfile(os.path.join(folder, figure)), figure
