"""
table1.py: the paper's Table 1 in a classroom: Tiny Shakespeare (characters) on a laptop CPU.

    python tools/table1.py                 # the table, then the B ablation and probe figures
    python tools/table1.py --lesson        # one class period (LESSON.md): vanilla, base, mesh

Every variant applies 12 blocks (vanilla `12` against the loop layouts with each scheme of
mesh.SCHEMES; Appendix E.1's ablation: mesh with B = K+1 ... K+4 slots, seed 0) on one recipe,
and a seed's data order is every variant's: differences are paired seed by seed. Runs go through
train.py into ROOT/NAME/, --jobs at a time; a finished run is reused (unless trained with another
update rule than mesh.SCHEMES's now), a stopped one continues. Every final checkpoint is
evaluated on the same EVAL_BATCHES validation batches; into RESULTS go table1.json, table1.md,
the curves and probe.py's and routing.py's figures of base and mesh, seed 0.
"""

import inspect
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
sys.path.insert(0, ROOT)  # python tools/X.py: the project's modules are one folder up
from configurator import UsageError, check_ranges, closest, setting  # noqa: E402
from mesh import SCHEMES, Config, ConfigError, RecursiveGPT  # noqa: E402
from support import checkpoint, command, files  # noqa: E402
from support.tool import check_writable, log_records, machine_name  # noqa: E402
from tools.curves import colour, plot  # noqa: E402
from tools.probe import validation_windows  # noqa: E402

DEPTH_LAYOUT, LOOP_LAYOUT = "12", "2+4R2+2"   # 2 + 4x2 + 2 = 12 applied blocks either way
# name -> scheme, in table order: every scheme of mesh.py
VARIANTS = {"vanilla": "base", **{s: s for s in SCHEMES}}
# mesh with one of mesh.py's [choice]s, or two of them at once
CHOICES = {"mesh_direct": dict(cycle="direct"), "mesh_base_init": dict(router_init="base"),
           "mesh_unscaled": dict(slot0="unscaled"),
           "mesh_direct_base_init": dict(cycle="direct", router_init="base")}
SCHEME = {**VARIANTS, **{name: "mesh" for name in CHOICES}}
# what the table's first line calls a dataset
DATASETS = {"shakespeare_char": "Tiny Shakespeare (characters)",
            "pydoc": "Python's pydoc text (characters; Tiny Shakespeare could not be downloaded)"}
MODEL = dict(n_embd=128, n_head=4, block_size=64)
TRAIN = dict(dataset="shakespeare_char", batch_size=16, lr=1e-3, eval_iters=20, sample_tokens=0,
             **MODEL)
LESSON = dict(layouts="3+2R3+3", only="vanilla,base,mesh", seeds="0,1", jobs=2, n_embd=64, lr=2e-3,
              max_iters=700, root="runs/lesson", results="runs/lesson")  # a class period, 2 cores
# 100 x 16 x 64 = 102,400 targets in random windows: the same for every run; drawn with
# replacement, so some positions repeat and some are unseen
EVAL_BATCHES, EVAL_SEED = 100, 1337
WHERE = dict(device="cpu", data_root="data")  # train.py's flags of where a run trains


def steps(layout):  # K, the loop steps of a layout
    return Config(layout=layout).n_steps


def ablation_slots(layout):  # B = K+1 .. K+4 (the paper's default B = K+3 is the main mesh run)
    return tuple(range(steps(layout) + 1, steps(layout) + 5))


def run_name(variant, layout, seed, n_slots=None):
    """vanilla_s0, mesh_s0 (default layout), mesh_3+2R3+3_s0 (another), mesh_B3_s0 (ablation)."""
    where = "" if variant == "vanilla" or layout == LOOP_LAYOUT else f"_{layout}"
    return f"{variant}{where}{f'_B{n_slots}' if n_slots else ''}_s{seed}"


def plan(variants, seeds, ablation, layouts=(LOOP_LAYOUT,)):
    """The runs: vanilla once a seed, the others per layout too; the B ablation on the first."""
    runs = [dict(name=run_name(v, layout, s), variant=v, scheme=SCHEME[v], n_slots=None, seed=s,
                 layout=DEPTH_LAYOUT if v == "vanilla" else layout)
            for layout in layouts for v in variants for s in seeds]
    for b in ablation:
        n_slots = None if b == steps(layouts[0]) + 3 else b
        runs.append(dict(name=run_name("mesh", layouts[0], 0, n_slots), variant="mesh",
                         layout=layouts[0], scheme="mesh", n_slots=n_slots, seed=0))
    return list({r["name"]: r for r in runs}.values())  # once each


def train_command(run, out_dir, max_iters, train=TRAIN, where=WHERE, resume=False):
    """train.py's command line for a run: resume continues its checkpoint, else it starts afresh
    (--overwrite=true: by train.py's own rules, never while another run owns the folder)."""
    flags = dict(out_dir=out_dir, **train, max_iters=max_iters,
                 eval_interval=max(1, max_iters // 4), layout=run["layout"],
                 scheme=run["scheme"], n_slots=run["n_slots"], seed=run["seed"],
                 **CHOICES.get(run["variant"], {}), **where,
                 **({"init_from": "resume"} if resume else {"overwrite": "true"}))
    given = [f"--{k}={v}" for k, v in flags.items() if v is not None]
    return [sys.executable, os.path.join(ROOT, "train.py")] + given


def rule(variant):
    """A variant's update rule as mesh.py has it now: its line of SCHEMES, comments aside."""
    if variant == "vanilla" or SCHEMES[SCHEME[variant]] is None:
        return "no loop steps" if variant == "vanilla" else "Eq. 2-5"
    text = " ".join(re.sub(r"#.*", "", inspect.getsource(SCHEMES[SCHEME[variant]])).split())
    return text[text.find("lambda"):].rstrip(",") if "lambda" in text else text


def run_child(cmd, watch=lambda: None, env=None, **kwargs):
    """cmd's exit code, watch() called as it runs in a session of its own, launched by table1.py
    (whose end ends it): a signal is passed on (train.py saves and exits), then Stopped raised."""
    stop = command.Stop
    if stop.signals:
        raise command.Stopped(stop.name)
    env = {**(env or os.environ), command.LAUNCHER: str(os.getpid())}
    p, sent = subprocess.Popen(cmd, start_new_session=True, env=env, **kwargs), 0
    while p.poll() is None:
        if sent < stop.signals:
            p.terminate()  # SIGTERM
            sent += 1
        time.sleep(0.1)
        watch()
    watch()
    if stop.signals:  # it saved a checkpoint and stopped, as table1.py does now
        raise command.Stopped(stop.name)
    return p.returncode


def progress(name, out_dir, max_iters, since):
    """A watch(): a line per evaluation logged past iteration `since`, with its val loss, eta."""
    log = os.path.join(out_dir, "log.jsonl")

    def watch():
        nonlocal since
        ms = None
        for r in log_records(log) if os.path.isfile(log) else ():
            ms = r["ms"] if isinstance(r.get("ms"), NUMBER) else ms
            if isinstance(r.get("val_loss"), NUMBER) and r["iter"] > since:
                since, left = r["iter"], max_iters - r["iter"]
                eta = f", eta {ms * left / 60e3:.1f} min" if ms and left else ""
                say(f"{name}: iter {since}/{max_iters}, val loss {r['val_loss']:.4f}{eta}")
    return watch


def say(line):  # printed in one write: the runs' threads print at once
    print(line + "\n", end="", flush=True)


def ms_per_iter(log_path):
    """Median of the logged ms per iteration (the first window pays for warm-up)."""
    ms = [r["ms"] for r in log_records(log_path) if isinstance(r.get("ms"), NUMBER)]
    return statistics.median(ms) if ms else None


def eval_batches(ckpt, model, data_root=None):
    """The validation batches (n, B, T+1) of val_loss: the same for every run."""
    T, n = model.config.block_size, EVAL_BATCHES * TRAIN["batch_size"]
    batches = validation_windows(ckpt, T + 1, n, EVAL_SEED, data_root)
    return batches.view(EVAL_BATCHES, -1, T + 1)


def val_loss(model, batches):
    """Mean cross-entropy over batches (n, B, T+1), each of B x T targets: the token mean."""
    return statistics.fmean(model.evaluate((w[:, :-1], w[:, 1:]) for w in batches))


def val_curve(log_path):  # every evaluation train.py logged
    return [[r["iter"], r["val_loss"]] for r in log_records(log_path)
            if isinstance(r.get("val_loss"), NUMBER)]


NUMBER = (int, float)
# result.json's fields: their types, in words
FIELDS = {"seed": (int, "an integer"), "max_iters": (int, "an integer"),
          "params": (int, "an integer"), "val_loss": (NUMBER, "a number"),
          "ms_per_iter": ((*NUMBER, type(None)), "a number or null"),
          "val_curve": (list, "a list of [iter, val loss] pairs"), "dataset": (str, "a string"),
          "data_sha256": ((str, type(None)), "a string or null")}


def read_result(path, run):
    """A run's result.json, every field used here checked: a damaged or foreign one is named."""
    try:
        result = files.read_json(path)
        if not isinstance(result, dict):
            raise files.PlainDataError("is not a JSON object")
        if result.get("name") != run["name"]:
            raise files.PlainDataError(f"is the result of run {result.get('name')!r:.40}, "
                                       f"not of {run['name']}")
        for key, (kinds, word) in FIELDS.items():
            value = result.get(key)
            if not isinstance(value, kinds) or isinstance(value, bool) or key == "val_curve" and \
                    not all(isinstance(p, list) and len(p) == 2 and all(
                        isinstance(v, NUMBER) for v in p) for p in value):
                raise files.PlainDataError(f"has {key} {value!r:.40}, not {word}")
    except (OSError, files.PlainDataError) as e:
        why = f"cannot be read ({e.strerror})" if isinstance(e, OSError) else e
        raise UsageError(f"{path} {why}; delete the folder {os.path.dirname(path)} to train that "
                         f"run again") from None
    return result


def stage(run, out_dir, max_iters, train=TRAIN):
    """Where the run in out_dir stands: ("done", its result), ("resume", its checkpoint's
    iteration), ("again", the update rule its result was trained with, not mesh.py's now) or
    ("fresh", None). A finished run of other settings (--max_iters, --n_embd, --lr) is refused."""
    result = saved = at = None
    if os.path.lexists(os.path.join(out_dir, "result.json")):
        result = saved = read_result(os.path.join(out_dir, "result.json"), run)
    elif os.path.isfile(os.path.join(out_dir, checkpoint.CKPT)):
        try:  # read without its tensors; damaged or foreign: no run, as train.py judges it
            ckpt = checkpoint.peek(os.path.join(out_dir, checkpoint.CKPT))
            if type(ckpt["iter_num"]) is int and type(ckpt["train_config"]["max_iters"]) is int:
                saved, at = ckpt["train_config"], ckpt["iter_num"]
        except Exception:
            pass
    if saved is None:
        return "fresh", None
    ours = dict(max_iters=max_iters, n_embd=train["n_embd"], lr=train["lr"])
    theirs = {k: saved.get(k, TRAIN.get(k)) for k in ours}  # (older runs: the defaults)
    if theirs != ours and (result or at >= theirs["max_iters"]):
        other = ", ".join(f"--{k}={theirs[k]}" for k in ours if theirs[k] != ours[k])
        mine = ", ".join(f"--{k}={ours[k]}" for k in ours if theirs[k] != ours[k])
        raise UsageError(f"{out_dir} holds a finished run of {other}, not {mine}, which table1.py "
                         f"never replaces; give another --root, or {other} to use it, or delete "
                         f"{out_dir} to train it again")
    if result and result.get("rule", rule(run["variant"])) != rule(run["variant"]):
        return "again", result["rule"]
    return ("done", result) if result else ("resume", at) if theirs == ours else ("fresh", None)


def run_one(run, root, max_iters, env=None, train=TRAIN, where=WHERE):
    if command.Stop.signals:  # stopping: a run not begun never begins
        raise command.Stopped(command.Stop.name)
    name, out_dir = run["name"], os.path.join(root, run["name"])
    what, detail = stage(run, out_dir, max_iters, train)
    if what == "done":
        say(f"{name}: done (val loss {detail['val_loss']:.4f})")
        return detail
    os.makedirs(out_dir, exist_ok=True)
    if files.own(out_dir, flag="--root", note=False, shown=out_dir):  # a live run: touch nothing
        files.disown(out_dir)  # (train.py takes it)
    if what == "again":
        say(f"{name}: trained with {run['variant']} = {detail}, not mesh.py's "
            f"{rule(run['variant'])} now: training it again")
    resume = what == "resume"
    for stale in ("result.json", checkpoint.CKPT, "log.jsonl") if not resume else ():
        files.remove(os.path.join(out_dir, stale))  # a run of other settings, or rule, or damaged
    cmd = train_command(run, out_dir, max_iters, train, where, resume)
    if resume and detail >= max_iters:
        say(f"{name}: trained to iter {detail}; evaluating it")
    else:
        doing = f"continuing from iter {detail}" if resume else "training"
        say(f"{name}: {doing} ({' '.join(cmd[2:])})")
        # its output: train.out, one for the run, as its log is one curve
        with open(os.path.join(out_dir, "train.out"), "a", encoding="utf-8") as f:
            watch = progress(name, out_dir, max_iters, detail if resume else -1)
            rc = run_child(cmd, watch, env, stdout=f, stderr=subprocess.STDOUT)
        if rc:
            with open(os.path.join(out_dir, "train.out"), encoding="utf-8") as f:
                last = (f.read()[-2000:].strip().splitlines() or ["(it printed nothing)"])[-1]
            raise UsageError(f"{name} failed (exit {rc}); its last words: {last} (full output "
                             f"in {out_dir}/train.out)")
    model, ckpt = checkpoint.load(out_dir)
    batches = eval_batches(ckpt, model, where["data_root"])
    log = os.path.join(out_dir, "log.jsonl")
    result = dict(run, max_iters=max_iters, n_embd=train["n_embd"], lr=train["lr"],
                  iter_num=ckpt.get("iter_num"), rule=rule(run["variant"]),
                  n_slots=model.config.slots if run["scheme"] == "mesh" else None,
                  params=model.num_params(), eval_batches=EVAL_BATCHES,
                  val_loss=val_loss(model, batches),
                  ms_per_iter=ms_per_iter(log), out_dir=out_dir,
                  dataset=ckpt["train_config"]["dataset"],
                  data_sha256=ckpt.get("data", {}).get("sha256"), val_curve=val_curve(log))
    files.write_json(os.path.join(out_dir, "result.json"), result)
    say(f"{name}: val loss {result['val_loss']:.4f}, {ms(result['ms_per_iter'])} ms/iter")
    return result


def trained_on(results):
    """The name of the one dataset all the runs trained on; runs of other data are refused."""
    seen = {}
    for r in results:
        seen.setdefault((r["dataset"], r.get("data_sha256")), []).append(r["name"])
    if len(seen) > 1:
        which = "; ".join(f"{', '.join(names)} on {name!r} (sha256 {(sha or '?')[:12]})"
                          for (name, sha), names in seen.items())
        raise UsageError(f"the runs trained on different data, which one table cannot compare: "
                         f"{which}; train them again on one dataset (delete their result.json) or "
                         f"use another --root")
    return next(iter(seen))[0]


def vanilla_params(n_embd=MODEL["n_embd"]):
    with torch.device("meta"):  # counts only, no weights
        return RecursiveGPT(Config(**dict(MODEL, n_embd=n_embd), layout=DEPTH_LAYOUT)).num_params()


def mean_std(values):
    """(mean, sample std) of the values that are not None; None where there are too few."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate(results, vanilla, seeds, layouts=(LOOP_LAYOUT,)):
    """A row per layout and variant over the seeds: params, val loss, ms/iter, and the paired
    differences of its val loss to base's on its layout, vanilla's and (CHOICES) mesh's."""
    def runs_of(v, layout):
        return {r["seed"]: r for r in results
                if r["seed"] in seeds and r["name"] == run_name(v, layout, r["seed"])}

    rows = []
    for i, layout in enumerate(layouts):
        for v, scheme in SCHEME.items():
            rs = runs_of(v, layout)
            if not rs or v == "vanilla" and i:  # vanilla: one row, at the top
                continue
            loss, loss_std = mean_std([r["val_loss"] for r in rs.values()])
            row = dict(variant=v, layout=DEPTH_LAYOUT if v == "vanilla" else layout,
                       K=steps(layout) if v != "vanilla" else 0, scheme=scheme,
                       params=next(iter(rs.values()))["params"], val_loss=loss,
                       val_loss_std=loss_std, seeds=sorted(rs),
                       ms_per_iter=mean_std([r["ms_per_iter"] for r in rs.values()])[0])
            row["share"] = row["params"] / vanilla
            for ref in ("base", "vanilla", "mesh"):  # mesh: for a [choice] only
                paired = v not in (ref, "vanilla") and (ref != "mesh" or v in CHOICES)
                others = runs_of(ref, layout) if paired else {}
                d = [r["val_loss"] - others[s]["val_loss"] for s, r in rs.items() if s in others]
                row[f"vs_{ref}"], row[f"vs_{ref}_std"] = mean_std(d)
            rows.append(row)
    return rows


def ablation_rows(results, layout=LOOP_LAYOUT):
    names = {run_name("mesh", layout, 0, None if b == steps(layout) + 3 else b): b
             for b in ablation_slots(layout)}
    rs = [r for r in results if r["name"] in names]
    return [dict(n_slots=names[r["name"]], params=r["params"], val_loss=r["val_loss"],
                 ms_per_iter=r["ms_per_iter"])
            for r in sorted(rs, key=lambda r: names[r["name"]])]


def ms(v):
    return "-" if v is None else f"{v:.0f}"


def pm(mean, std, spec=".4f", sign=""):
    """'mean ± std' ('mean' alone without a std; '-' without a mean)."""
    if mean is None:
        return "-"
    return f"{mean:{sign}{spec}}" + ("" if std is None else f" ± {std:{spec}}")


def markdown(rows, ablation, max_iters, machine, dataset, layout=LOOP_LAYOUT, train=TRAIN):
    refs = ["base", "vanilla"] + ["mesh"] * any(r.get("vs_mesh") is not None for r in rows)
    lines = [f"{DATASETS.get(dataset, f'Dataset {dataset!r}')}, compute depth 12, "
             f"width {train['n_embd']}, {train['n_head']} heads, "
             f"context {train['block_size']}, batch {train['batch_size']}, "
             f"{max_iters} iterations, peak LR {train['lr']}. Machine: {machine}.", "",
             "| variant | layout | K | non-emb params | % of vanilla "
             "| val loss (mean ± std, seeds) | "
             + " | ".join(f"- {ref}" for ref in refs) + " | ms/iter |",
             "|---|---|---:|---:|---:|---|" + "---|" * len(refs) + "---:|"]
    for r in rows:
        differences = "".join(f"{pm(r[f'vs_{ref}'], r[f'vs_{ref}_std'], sign='+')} | "
                              for ref in refs)
        lines.append(f"| {r['variant']} | `{r['layout']}` | {r['K'] or '-'} | {r['params']:,} | "
                     f"{100 * r['share']:.1f}% | "
                     f"{pm(r['val_loss'], r['val_loss_std'])} ({len(r['seeds'])}) | "
                     + differences + f"{ms(r['ms_per_iter'])} |")
    tokens = EVAL_BATCHES * TRAIN["batch_size"] * MODEL["block_size"]
    lines += ["", f"val loss: cross-entropy (nats/char) of the final checkpoint on the same "
              f"{EVAL_BATCHES} validation batches ({tokens:,} tokens) for every run; std over "
              f"seeds (n-1). {', '.join(f'- {ref}' for ref in refs)}: the paired difference of "
              "val loss, seed by seed (the seeds share the data order), to that variant on the "
              "same layout (vanilla: its one layout), mean ± std. ms/iter: median per run, mean "
              "over seeds."]
    if "mesh" in refs:
        shown = [name for name in CHOICES if any(r["variant"] == name for r in rows)]
        changed = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in CHOICES[name].items())}"
                            for name in shown)
        lines += ["", f"MeSH's [choice]s (mesh.py) changed, by row: {changed}."]
    if ablation:
        K = steps(layout)
        lines += ["", f"Buffer size B (mesh `{layout}`, K = {K}, seed 0; the default is "
                      f"B = K+3 = {K + 3}):", "",
                  "| B | non-emb params | val loss | ms/iter |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['n_slots']} | {r['params']:,} | {r['val_loss']:.4f} | "
                  f"{ms(r['ms_per_iter'])} |" for r in ablation]
    return "\n".join(lines) + "\n"


def write_curves(results, rows, layouts, path, dataset):
    """A panel per layout, a line per variant: its seeds' mean val loss in train.py (their spread
    shaded); a star at the end: the table's loss."""
    panels = []
    for layout in layouts:
        lines = []
        for row in (r for r in rows if r["layout"] in (layout, DEPTH_LAYOUT)):
            curves = [r["val_curve"] for r in results if r["seed"] in row["seeds"] and r["name"] ==
                      run_name(row["variant"], layout, r["seed"])]
            n, x = min(len(c) for c in curves), [i for i, _ in curves[0]]
            losses = np.array([[v for _, v in c[:n]] for c in curves])
            c = colour(row["variant"])
            lines += [dict(label=f"{row['variant']}, seeds {row['seeds']}", colour=c, x=x[:n],
                           y=losses.mean(0), band=(losses.min(0), losses.max(0))),
                      dict(label=None, colour=c, x=x[n - 1:n], y=[row["val_loss"]], style="*")]
        vs = f" against vanilla {DEPTH_LAYOUT}" if any(r["K"] == 0 for r in rows) else ""
        panels.append((f"{layout}{vs} on {dataset}\nval loss, lines: "
                       f"train.py's ({TRAIN['eval_iters']} batches)\n\u2605: the table's "
                       f"({EVAL_BATCHES} batches)", lines))
    plot(panels, path, "table1.py")


def threads(jobs):  # each run's share of the cores
    return max(1, (os.cpu_count() or 1) // jobs)


def machine(jobs=1, device="cpu"):  # the GPU too where the runs trained on one
    cuda = device.startswith("cuda") and torch.cuda.is_available()  # (finished runs: any machine)
    gpu = f" and {machine_name(device)} ({device})" if cuda else ""
    return (f"{machine_name('cpu')}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}, "
            f"{jobs} run(s) at a time with {threads(jobs)} thread(s) each")


@dataclass
class Table1Config:
    """Classroom Table 1: recursive schemes at equal compute depth (12 applied blocks)."""
    layouts: str = setting(LOOP_LAYOUT, "comma-separated loop layouts, each of compute depth 12")
    seeds: str = setting("0,1,2", "comma-separated seeds")
    max_iters: int = setting(1200, "train.py's --max_iters for every run")
    n_embd: int = setting(MODEL["n_embd"], "train.py's --n_embd (width D) for every run")
    lr: float = setting(TRAIN["lr"], "train.py's --lr (peak learning rate) for every run")
    only: str = setting(",".join([*VARIANTS, "ablation"]),
                        f"a comma-separated subset of the names below (default: all but "
                        f"{', '.join(CHOICES)})")
    root: str = setting("runs/table1", "one folder per run in here", path=True)
    results: str = setting("runs/table1", "table1.json, table1.md and the figures go here",
                           path=True)
    device: str = setting("cpu", "train.py's --device for every run (mps or cuda: with --jobs=1)")
    data_root: str = setting("data", "train.py's --data_root: the datasets' folder", path=True)
    jobs: int = setting(1, "runs at once, each with cores/jobs threads")
    dry_run: bool = setting(False, "print the train.py commands and stop")
    lesson: bool = setting(False, "one class period (LESSON.md): "
                           + ", ".join(f"--{k}={v}" for k, v in LESSON.items()))

    def __post_init__(self):
        check_ranges(self, [("max_iters jobs", lambda v: v >= 1, "at least 1"),
                            ("lr", lambda v: v > 0, "a finite number above 0")])


def main(argv):
    return command.main("tools/table1.py", table1, argv, Table1Config,
                        f"names for --only: {', '.join([*SCHEME, 'ablation'])}",
                        stopped="and its runs with it, each saving a checkpoint: the same command "
                        "again continues them (finished ones are kept)")


def train_all(runs, a, train, where):
    """Every run's result, --jobs at a time, each with its share of the cores; a finished run of
    other settings is refused before any trains."""
    for run in runs:
        stage(run, os.path.join(a.root, run["name"]), a.max_iters, train)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads(a.jobs))}
    pool = ThreadPoolExecutor(a.jobs)  # each run is its own process; threads only wait on them
    try:
        return list(pool.map(lambda run: run_one(run, a.root, a.max_iters, env, train, where),
                             runs))
    finally:  # stopping: the runs not started never start, the others end first
        pool.shutdown(cancel_futures=True)


def table1(given):
    command.Stop.poll(says="passing it on to the runs, then waiting for them")
    # flags given override the lesson's
    a = Table1Config(**{**(LESSON if given.get("lesson") else {}), **given})
    if not re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", a.seeds):  # train.py takes no negative seed
        raise UsageError(f"--seeds={a.seeds!r} must be comma-separated integers, 0 or more, as "
                         f"0,1,2")
    seeds = [int(s) for s in a.seeds.split(",")]
    only = a.only.split(",")
    for name in (n for n in only if n not in [*SCHEME, "ablation"]):
        raise UsageError(f"--only: unknown {name!r}{closest(name, [*SCHEME, 'ablation'])}; "
                         f"expected some of {', '.join([*SCHEME, 'ablation'])}")
    train = dict(TRAIN, n_embd=a.n_embd, lr=a.lr)
    where = dict(device=a.device, data_root=a.data_root, threads=threads(a.jobs))
    try:  # a width the model cannot take, refused before any run starts (as train.py would)
        Config(**dict(MODEL, n_embd=a.n_embd))
    except ConfigError as e:
        raise UsageError(f"--n_embd={a.n_embd} makes no model of {MODEL['n_head']} heads ({e}); "
                         f"give another width, such as {MODEL['n_embd']}") from None
    layouts = a.layouts.split(",")
    for layout in layouts:
        try:
            shape = Config(layout=layout).shape
        except ConfigError as e:
            raise UsageError(f"--layouts: {e}") from None
        if shape.depth != 12 or not shape.schedule:
            raise UsageError(f"--layouts: {layout!r} has compute depth {shape.depth} and "
                             f"{len(shape.schedule)} loop steps; the table compares loop layouts "
                             f"of compute depth 12 (such as 3+2R3+3) with vanilla 12")
    ablation = ablation_slots(layouts[0]) if "ablation" in only else ()
    runs = plan([v for v in SCHEME if v in only], seeds, ablation, layouts)
    if a.dry_run:
        for run in runs:
            out_dir = os.path.join(a.root, run["name"])
            what, _ = stage(run, out_dir, a.max_iters, train)
            if what == "done":
                print(f"# {run['name']}: done, reused")
                continue
            resume = what == "resume"
            cmd = train_command(run, out_dir, a.max_iters, train, where, resume)
            print(" ".join(cmd[1:]))
        return
    check_writable(a.results, "results", folder=True)  # now, not after every run has trained
    os.makedirs(a.root, exist_ok=True)
    # one table1.py per root, held to its end: a second is refused at once
    files.own(a.root, flag="--root")
    try:
        write_results(train_all(runs, a, train, where), a, seeds, layouts, only, train)
    finally:
        files.disown(a.root)


def write_results(results, a, seeds, layouts, only, train):
    """The tables, the curves, probe.py's and routing.py's figures, then the table printed."""
    dataset = trained_on(results)
    rows = aggregate(results, vanilla_params(a.n_embd), seeds, layouts)
    abl = ablation_rows(results, layouts[0]) if "ablation" in only else []
    info = machine(a.jobs, a.device)
    md = markdown(rows, abl, a.max_iters, info, dataset, layouts[0], train)
    files.write_json(os.path.join(a.results, "table1.json"), dict(
        settings=dict(train, dataset=dataset, data_root=a.data_root, device=a.device,
                      max_iters=a.max_iters, seeds=seeds, eval_batches=EVAL_BATCHES,
                      eval_seed=EVAL_SEED),
        machine=info, table=rows, ablation=abl, runs=results))
    files.atomic_write(os.path.join(a.results, "table1.md"), lambda f: f.write(md), mode="w")
    write_curves(results, rows, layouts, os.path.join(a.results, "table1_curves.png"), dataset)
    for layout in layouts:
        names = [run_name(v, layout, 0) for v in ("base", "mesh")]
        runs = [f"--out_dir={a.root}/{r['name']}" for r in results if r["name"] in names]
        tag = "" if layout == LOOP_LAYOUT else f"_{layout}"
        for tool, png in (("probe.py", f"table1_probe{tag}"),
                          ("routing.py", f"table1_routing{tag}.png")) if runs else ():
            stem = os.path.join(a.results, png.removesuffix(".png"))
            with open(f"{stem}.txt", "w", encoding="utf-8") as f:  # their long output
                rc = run_child([sys.executable, os.path.join(ROOT, "tools", tool), *runs,
                                f"--json={stem}.json", f"--png={a.results}/{png}",
                                f"--data_root={a.data_root}"], stdout=f, stderr=subprocess.STDOUT)
            with open(f"{stem}.txt", encoding="utf-8") as f:  # a line per figure
                print("".join(line for line in f if line.startswith(("wrote ", tool))), end="")
            if rc:
                raise UsageError(f"{tool} failed on {' '.join(runs)}; {stem}.txt says why")
    print(f"wrote {a.results}/table1.json, {a.results}/table1.md\n\n{md}", end="")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
