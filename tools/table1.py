"""
table1.py: the paper's Table 1 in a classroom: Tiny Shakespeare (characters) on a laptop CPU.

    # the whole table, then the B ablation and probe figures
    python tools/table1.py
    # a quick subset, away from the full table's runs and results
    python tools/table1.py --only=vanilla,mesh --seeds=0 --max_iters=200 --root=runs/quick \
        --results=runs/quick
    # the same table at K = 2, 3, 4, 6 loop steps
    python tools/table1.py --layouts=2+4R2+2,3+2R3+3,2+2R4+2,3+1R6+3 \
        --only=vanilla,base,anchor,mesh --results=results/depth_sweep
    # one class period (LESSON.md): vanilla, base, mesh
    python tools/table1.py --lesson

Every variant has the same compute depth (12 applied blocks), width 128, 4 heads, context 64,
batch 16, peak LR 1e-3 with train.py's schedule (the paper's: 1% warmup, cosine to 10%), and
the same --seed, hence the same data order, for every variant: vanilla `12` against the loop
layouts (default `2+4R2+2`) with base, residual, anchor, anchor_emb (the paper's anchor*) and mesh;
plus the buffer-size ablation of Appendix E.1 (mesh with B = K+1 ... K+4 slots, seed 0, on the
first layout). No variant gets any setting the others don't. Since the seeds share the data order,
the table also gives each variant's paired differences to base (same layout) and to vanilla, seed by
seed.

Runs go through `python train.py` (one at a time, or --jobs at once) into ROOT/NAME/; a run whose
result.json exists is skipped and an interrupted one continues from its checkpoint, so a table
resumes where it stopped; a finished run of another --max_iters is refused, never replaced. One
table1.py per --root (it holds the folder's lock). SIGTERM, SIGINT (Ctrl-C) or SIGHUP to table1.py
stops its runs too (each saves a checkpoint) and waits for them; its kill -9 stops them as well.
The final validation loss is measured here, not taken from train.py's log: each final checkpoint is
evaluated on the same fixed EVAL_BATCHES batches of the validation split (identical batches for
every variant). Results go to RESULTS/table1.json and RESULTS/table1.md, which name the dataset the
runs trained on (offline, train.py falls back on the pydoc text: the table says so, and refuses runs
of different datasets); the validation loss of every variant against the iteration (mean over seeds,
their spread shaded) to RESULTS/table1_curves.png; probe.py's figures of the base and mesh runs
(seed 0) to RESULTS/table1_probe/, routing.py's view of one validation window, token by token, to
RESULTS/table1_routing.png (and .json). Figures need matplotlib (pip install matplotlib).
"""

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, closest, setting  # noqa: E402
from data.dataset import load_split, random_windows  # noqa: E402
from data.meta import checkpoint_dataset  # noqa: E402
from mesh import SCHEMES, Config, ConfigError, RecursiveGPT  # noqa: E402
from support import checkpoint, command, files  # noqa: E402
from support.device import machine_name  # noqa: E402
from support.log import log_records  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project folder
DEPTH_LAYOUT, LOOP_LAYOUT = "12", "2+4R2+2"   # 2 + 4x2 + 2 = 12 applied blocks either way
# name -> scheme, in table order: every scheme of mesh.py
VARIANTS = {"vanilla": "base", **{s: s for s in SCHEMES}}
# mesh with one of mesh.py's [choice]s, or two of them at once
CHOICES = {"mesh_direct": dict(cycle="direct"), "mesh_base_init": dict(router_init="base"),
           "mesh_unscaled": dict(slot0="unscaled"),
           "mesh_direct_base_init": dict(cycle="direct", router_init="base")}
SCHEME = {**VARIANTS, **{name: "mesh" for name in CHOICES}}  # every name -> scheme
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


# -----------------------------------------------------------------------------
# The plan: which runs, with which train.py flags

def steps(layout):  # K, the loop steps of a layout
    return Config(layout=layout).n_steps


def ablation_slots(layout):  # B = K+1 .. K+4 (the paper's default B = K+3 is the main mesh run)
    return tuple(range(steps(layout) + 1, steps(layout) + 5))


def run_name(variant, layout, seed, n_slots=None):
    """vanilla_s0, mesh_s0 (default layout), mesh_3+2R3+3_s0 (another), mesh_B3_s0 (ablation)."""
    where = "" if variant == "vanilla" or layout == LOOP_LAYOUT else f"_{layout}"
    return f"{variant}{where}{f'_B{n_slots}' if n_slots else ''}_s{seed}"


def plan(variants, seeds, ablation, layouts=(LOOP_LAYOUT,)):
    """-> list of runs {name, variant, layout, scheme, n_slots, seed}: vanilla once per seed, every
    other variant per layout; ablation: B values on the first layout, whose B = K+3 is its mesh
    seed 0."""
    runs = [dict(name=run_name(v, layout, s), variant=v,
                 layout=DEPTH_LAYOUT if v == "vanilla" else layout, scheme=SCHEME[v], n_slots=None,
                 seed=s)
            for layout in layouts for v in variants for s in seeds]
    for b in ablation:
        default = b == steps(layouts[0]) + 3
        n_slots = None if default else b
        runs.append(dict(name=run_name("mesh", layouts[0], 0, n_slots), variant="mesh",
                         layout=layouts[0], scheme="mesh", n_slots=n_slots, seed=0))
    unique = {r["name"]: r for r in runs}
    return list(unique.values())


def train_command(run, out_dir, max_iters, device="cpu", data_root="data", train=TRAIN):
    """train.py's command line for a run: an interrupted run of ours there (a finished one of other
    settings never reaches here: check_redoable) is continued from its checkpoint; one that saved
    none is replaced (--overwrite=true, by train.py's own rules: never while another owns it)."""
    resume = os.path.isfile(os.path.join(out_dir, checkpoint.CKPT))
    flags = dict(out_dir=out_dir, **train, max_iters=max_iters,
                 eval_interval=max(1, max_iters // 4), layout=run["layout"],
                 scheme=run["scheme"], n_slots=run["n_slots"], seed=run["seed"],
                 **CHOICES.get(run["variant"], {}), device=device, data_root=data_root,
                 **(dict(init_from="resume") if resume else dict(overwrite="true")))
    given = [f"--{k}={v}" for k, v in flags.items() if v is not None]
    return [sys.executable, os.path.join(ROOT, "train.py")] + given


# -----------------------------------------------------------------------------
# The processes it runs, which stop with it

class Children:
    """The processes table1.py runs (train.py, probe.py), each in a session of its own, so that a
    signal reaches them only through table1.py (command.Stop, polled): each signal it receives is
    passed on as a SIGTERM (train.py saves a checkpoint and exits on the first, stops at once on a
    second), no new one starts, and table1.py waits for them all before it exits; killed (kill -9),
    it is their launcher gone (command.LAUNCHER, train_all): train.py saves and exits."""

    def run(self, cmd, **kwargs):
        """cmd's exit code, as subprocess.run(cmd, **kwargs) gives it, with every signal passed on;
        Stopped instead of a start once table1.py is stopping (after a run: run_one's)."""
        stop = command.Stop
        if stop.signals:
            raise command.Stopped(stop.name)
        p, sent = subprocess.Popen(cmd, start_new_session=True, **kwargs), 0
        while p.poll() is None:
            if sent < stop.signals:
                p.terminate()  # SIGTERM
                sent += 1
            time.sleep(0.1)
        return p.returncode


CHILDREN = Children()


# -----------------------------------------------------------------------------
# One run: train (unless done), then evaluate the final checkpoint

def ms_per_iter(log_path):
    """Median of the per-iteration times (ms) of every logged window. The first window also pays for
    warm-up; the median keeps that one slow window from moving the result."""
    ms = [r["ms"] for r in log_records(log_path) if isinstance(r.get("ms"), (int, float))]
    return statistics.median(ms) if ms else None


def val_loss(model, batches):
    """Mean cross-entropy over batches (n, B, T+1), each of B x T targets: the token mean."""
    return statistics.fmean(model.evaluate((w[:, :-1], w[:, 1:]) for w in batches))


def eval_batches(ckpt, model):
    """EVAL_BATCHES batches of validation windows, the same for every run:
    (EVAL_BATCHES, batch, T+1)."""
    T, n = model.config.block_size, EVAL_BATCHES * TRAIN["batch_size"]
    val = load_split(checkpoint_dataset(ckpt["train_config"], ckpt.get("data")), "val")
    return torch.from_numpy(random_windows(val, T + 1, n, EVAL_SEED)).view(EVAL_BATCHES, -1, T + 1)


def val_curve(log_path):
    """[[iter, val loss], ...] of every evaluation train.py logged."""
    return [[r["iter"], r["val_loss"]] for r in log_records(log_path)
            if isinstance(r.get("val_loss"), (int, float))]


NUMBER = (int, float)
RESULT_FIELDS = {"name": ((str,), "a string"), "seed": ((int,), "an integer"),
                 "max_iters": ((int,), "an integer"), "params": ((int,), "an integer"),
                 "val_loss": (NUMBER, "a number"),
                 "ms_per_iter": ((*NUMBER, type(None)), "a number or null")}
# and, since they were added:
RECENT_FIELDS = {"dataset": ((str,), "a string"),
                 "data_sha256": ((str, type(None)), "a string or null"),
                 "val_curve": ((list,), "a list of [iter, val loss] pairs")}


def is_pair(p):
    """A point of val_curve: [iter, val loss], a list of two numbers."""
    return isinstance(p, list) and len(p) == 2 and all(isinstance(v, NUMBER) for v in p)


def read_result(path, run):
    """A run's result.json, every field used here checked first: a damaged or foreign one is named
    in one line, with its fix (its run trains again once its folder is gone)."""
    try:
        result = files.read_json(path)
        if not isinstance(result, dict):
            raise files.PlainDataError("is not a JSON object")
        for key, (kinds, word) in {**RESULT_FIELDS, **RECENT_FIELDS}.items():
            if key in RECENT_FIELDS and key not in result:
                continue
            value = result.get(key)
            if (not isinstance(value, kinds) or isinstance(value, bool)
                    or key == "val_curve" and not all(is_pair(p) for p in value)):
                raise files.PlainDataError(f"has {key} {value!r:.40}, not {word}")
        if result["name"] != run["name"]:
            raise files.PlainDataError(f"is the result of run {result['name']!r:.40}, "
                                       f"not of {run['name']}")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}; check the file, or delete the folder "
                         f"{os.path.dirname(path)} to train that run again") from None
    except (json.JSONDecodeError, files.PlainDataError) as e:
        why = e
        if isinstance(e, json.JSONDecodeError):
            why = f"is not JSON ({e.msg}, line {e.lineno} column {e.colno})"
        raise UsageError(f"{path} {why}; delete the folder {os.path.dirname(path)} to train that "
                         f"run again") from None
    return result


def check_redoable(run, out_dir, max_iters, train=TRAIN):
    """Raise UsageError when out_dir holds a finished run of other settings (--max_iters, --n_embd,
    --lr; its result.json says so, or its checkpoint reached its own max_iters): only an interrupted
    run, a finished one of these settings, or none, is trained (again) or reused there."""
    result_path, theirs = os.path.join(out_dir, "result.json"), None
    if os.path.lexists(result_path):
        result = read_result(result_path, run)
        theirs = dict(max_iters=result["max_iters"], n_embd=result.get("n_embd", TRAIN["n_embd"]),
                      lr=result.get("lr", TRAIN["lr"]))  # (older results: the defaults)
    elif os.path.isfile(os.path.join(out_dir, checkpoint.CKPT)):
        try:
            ckpt = torch.load(os.path.join(out_dir, checkpoint.CKPT), mmap=True, weights_only=True,
                              map_location="cpu")
            saved = ckpt["train_config"]
            if isinstance(saved["max_iters"], int) and ckpt["iter_num"] >= saved["max_iters"]:
                theirs = dict(max_iters=saved["max_iters"],
                              n_embd=saved.get("n_embd", TRAIN["n_embd"]),
                              lr=saved.get("lr", TRAIN["lr"]))
        # damaged or foreign: no finished run, as train.py judges by its own rules
        except Exception:
            pass
    ours = dict(max_iters=max_iters, n_embd=train["n_embd"], lr=train["lr"])
    if theirs is not None and theirs != ours:
        other = ", ".join(f"--{k}={theirs[k]}" for k in ours if theirs[k] != ours[k])
        mine = ", ".join(f"--{k}={ours[k]}" for k in ours if theirs[k] != ours[k])
        raise UsageError(f"{out_dir} holds a finished run of {other}, not {mine}, which table1.py "
                         f"never replaces; give another --root, or {other} to use it, or delete "
                         f"{out_dir} to train it again")


def run_one(run, root, max_iters, env=None, device="cpu", data_root="data", train=TRAIN):
    out_dir = os.path.join(root, run["name"])
    result_path = os.path.join(out_dir, "result.json")
    check_redoable(run, out_dir, max_iters, train)
    if os.path.lexists(result_path):  # a finished run of these settings (check_redoable): reused
        result = read_result(result_path, run)
        if "dataset" not in result:  # written before results named their data: from the checkpoint
            ckpt = torch.load(os.path.join(out_dir, checkpoint.CKPT), mmap=True, weights_only=True)
            result.update(dataset=ckpt["train_config"]["dataset"],
                          data_sha256=ckpt.get("data", {}).get("sha256"),
                          val_curve=val_curve(os.path.join(out_dir, "log.jsonl")))
            files.write_json(result_path, result)
        print(f"{run['name']}: done (val loss {result['val_loss']:.4f})")
        return result
    os.makedirs(out_dir, exist_ok=True)
    # a live run there: touch nothing of it
    files.check_free(out_dir, flag="--root", shown=out_dir)
    cmd = train_command(run, out_dir, max_iters, device, data_root, train)
    print(f"{run['name']}: training ({' '.join(cmd[2:])})", flush=True)
    # train.out only once it has trained
    out = files.temporary_name(os.path.join(out_dir, "train.out"))
    with open(out, "w", encoding="utf-8") as f:
        rc = CHILDREN.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    with open(out, encoding="utf-8") as f:
        tail = f.read()[-2000:]
    # one started there meanwhile: its train.out is its own
    if rc and "another run is using" in tail:
        os.remove(out)
        raise UsageError(f"{tail.strip().splitlines()[-1].partition('error: ')[2]} ({run['name']})")
    os.replace(out, os.path.join(out_dir, "train.out"))
    if command.Stop.signals:  # it saved a checkpoint and stopped, as table1.py does now
        raise command.Stopped(command.Stop.name)
    if rc:
        last = (tail.strip().splitlines() or ["(none: it printed nothing)"])[-1]
        raise UsageError(f"{run['name']} failed (exit {rc}); its last words: {last} (full output "
                         f"in {out_dir}/train.out)")
    model, ckpt = checkpoint.load(out_dir)
    result = dict(run, max_iters=max_iters, n_embd=train["n_embd"], lr=train["lr"],
                  iter_num=ckpt.get("iter_num"),
                  n_slots=model.config.slots if run["scheme"] == "mesh" else None,
                  params=model.num_params(),
                  val_loss=val_loss(model, eval_batches(ckpt, model)), eval_batches=EVAL_BATCHES,
                  ms_per_iter=ms_per_iter(os.path.join(out_dir, "log.jsonl")), out_dir=out_dir,
                  dataset=ckpt["train_config"]["dataset"],
                  data_sha256=ckpt.get("data", {}).get("sha256"),
                  val_curve=val_curve(os.path.join(out_dir, "log.jsonl")))
    files.write_json(result_path, result)
    print(f"{run['name']}: val loss {result['val_loss']:.4f}, {ms(result['ms_per_iter'])} ms/iter")
    return result


# -----------------------------------------------------------------------------
# Aggregation and the Markdown tables (pure: tested in test_probe.py)

def trained_on(results):
    """The one dataset all the runs trained on; runs of different datasets are refused by name."""
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
    """(mean, sample std) of the values that are not None; None for what cannot be computed."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate(results, vanilla, seeds, layouts=(LOOP_LAYOUT,)):
    """Per layout and variant (table order), over its seeds: params, share of vanilla, val loss
    mean/std/n, ms/iter mean, and the paired differences (mean, std over seeds) of its val loss
    minus base's on the same layout, minus vanilla's and (for the CHOICES) minus mesh's, seed by
    seed. Only the seeds asked for: the ablation's default-B run is mesh seed 0 even when --seeds
    has no 0."""
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
            # a choice is compared with mesh too
            refs = ("base", "vanilla") + (("mesh",) if v in CHOICES else ())
            for ref in ("base", "vanilla", "mesh"):
                others = runs_of(ref, layout)
                paired = [r["val_loss"] - others[s]["val_loss"]
                          for s, r in rs.items() if s in others]
                compared = ref in refs and v not in (ref, "vanilla")
                difference = mean_std(paired) if compared else (None, None)
                row[f"vs_{ref}"], row[f"vs_{ref}_std"] = difference
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
    with_mesh = any(r.get("vs_mesh") is not None for r in rows)
    refs = ["base", "vanilla"] + (["mesh"] if with_mesh else [])
    data_name = DATASETS.get(dataset, f"Dataset {dataset!r}")
    lines = [f"{data_name}, compute depth 12, width {train['n_embd']}, {train['n_head']} heads, "
             f"context {train['block_size']}, batch {train['batch_size']}, {max_iters} iterations, "
             f"peak LR {train['lr']}. Machine: {machine}.", "",
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
    """A figure of validation loss against iteration, one panel per layout, one line per variant:
    the mean over its seeds of train.py's evaluations, the seeds' spread (min to max) shaded.
    Returns the path, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("table1.py: matplotlib is not installed, so no figures (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts), 3.8), squeeze=False,
                             layout="constrained")
    for ax, layout in zip(axes[0], layouts):
        for row in (r for r in rows if r["layout"] in (layout, DEPTH_LAYOUT)):
            curves = [r["val_curve"] for r in results if r["seed"] in row["seeds"] and r["name"] ==
                      run_name(row["variant"], layout, r["seed"])]
            n = min(len(c) for c in curves)
            iters = np.array(curves[0][:n])[:, 0]
            losses = np.array([[v for _, v in c[:n]] for c in curves])
            line, = ax.plot(iters, losses.mean(0), marker=".",
                            label=f"{row['variant']} ({len(curves)} seeds)")
            ax.fill_between(iters, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.2)
        ax.set(title=f"{layout} against vanilla {DEPTH_LAYOUT}", xlabel="iteration",
               ylabel="validation loss")
        # past the untrained start
        later = [v for line in ax.get_lines() for v in line.get_ydata()[1:]]
        if later:
            spread = max(later) - min(later)
            ax.set_ylim(min(later) - 0.05 * spread, max(later) + 0.1 * spread)
        ax.legend(fontsize=8)
    fig.suptitle(DATASETS.get(dataset, dataset), fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def machine(jobs=1):
    cpu = machine_name("cpu")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {jobs} run(s) at a time "
            f"with {threads} thread(s) each")


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
    data_root: str = setting("data", "train.py's --data_root: where the dataset is, or is made",
                             path=True)
    jobs: int = setting(1, "runs at once, each with cores/jobs threads")
    dry_run: bool = setting(False, "print the train.py commands and stop")
    lesson: bool = setting(False, "one class period (LESSON.md): "
                           + ", ".join(f"--{k}={v}" for k, v in LESSON.items()))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return command.main("tools/table1.py", table1, argv, Table1Config,
                        f"names for --only: {', '.join([*SCHEME, 'ablation'])}",
                        stopped="and its runs with it (the finished ones keep their result.json, "
                        "which a rerun skips)")


def fail(message):
    raise UsageError(message)


def train_all(runs, a, train):
    """Every run's result: each trained unless done, --jobs at a time; a finished run of other
    settings refused before any trains."""
    for run in runs:
        check_redoable(run, os.path.join(a.root, run["name"]), a.max_iters, train)
    threads = max(1, (os.cpu_count() or 1) // a.jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), command.LAUNCHER: str(os.getpid())}
    pool = ThreadPoolExecutor(a.jobs)  # each run is its own process; threads only wait on them
    try:
        return list(pool.map(lambda run: run_one(run, a.root, a.max_iters, env, a.device,
                                                 a.data_root, train), runs))
    finally:  # stopping: the runs not started never start, the others end first
        pool.shutdown(cancel_futures=True)


def table1(given):
    command.Stop.poll(says="passing it on to the runs, then waiting for them")
    # flags given override the lesson's
    a = Table1Config(**{**(LESSON if given.get("lesson") else {}), **given})
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        fail(f"--seeds={a.seeds!r} must be comma-separated integers, e.g. --seeds=0,1,2")
    only = a.only.split(",")
    for name in only:
        if name not in [*SCHEME, "ablation"]:
            fail(f"--only: unknown {name!r}{closest(name, [*SCHEME, 'ablation'])}; "
                     f"expected some of {', '.join([*SCHEME, 'ablation'])}")
    if a.max_iters < 1:
        fail(f"--max_iters={a.max_iters} must be at least 1")
    if a.jobs < 1:
        fail(f"--jobs={a.jobs} must be at least 1")
    train = dict(TRAIN, n_embd=a.n_embd, lr=a.lr)
    layouts = a.layouts.split(",")
    for layout in layouts:
        try:
            shape = Config(layout=layout).shape
        except ConfigError as e:
            fail(f"--layouts: {e}")
        if shape.depth != 12 or not shape.schedule:
            fail(f"--layouts: {layout!r} has compute depth {shape.depth} and "
                 f"{len(shape.schedule)} loop steps; the table compares loop layouts of compute "
                 f"depth 12 (such as 3+2R3+3) with vanilla 12")
    ablation = ablation_slots(layouts[0]) if "ablation" in only else ()
    runs = plan([v for v in SCHEME if v in only], seeds, ablation, layouts)
    if a.dry_run:
        for run in runs:
            cmd = train_command(run, os.path.join(a.root, run["name"]), a.max_iters, a.device,
                                a.data_root, train)
            print(" ".join(cmd[1:]))
        return
    if not os.path.isfile(os.path.join(ROOT, "train.py")):
        fail("train.py not found in the project folder")
    os.makedirs(a.root, exist_ok=True)
    # one table1.py per root, held to its end: a second is refused at once
    files.own(a.root, flag="--root")
    try:
        write_results(train_all(runs, a, train), a, seeds, layouts, only, train)
    finally:
        files.disown(a.root)


def write_results(results, a, seeds, layouts, only, train):
    """The tables (JSON and Markdown), the curves and probe.py's figures of the runs' results."""
    dataset = trained_on(results)
    rows = aggregate(results, vanilla_params(a.n_embd), seeds, layouts)
    abl = ablation_rows(results, layouts[0]) if "ablation" in only else []
    os.makedirs(a.results, exist_ok=True)
    md = markdown(rows, abl, a.max_iters, machine(a.jobs), dataset, layouts[0], train)
    files.write_json(os.path.join(a.results, "table1.json"), dict(
        settings=dict(train, dataset=dataset, data_root=a.data_root, device=a.device,
                      max_iters=a.max_iters, seeds=seeds, eval_batches=EVAL_BATCHES,
                      eval_seed=EVAL_SEED),
        machine=machine(a.jobs), table=rows, ablation=abl, runs=results))
    files.atomic_write(os.path.join(a.results, "table1.md"), lambda f: f.write(md), mode="w")
    curves = write_curves(results, rows, layouts, os.path.join(a.results, "table1_curves.png"),
                          dataset)
    print(md + f"wrote {a.results}/table1.json, {a.results}/table1.md"
          + (f" and {curves}" if curves else ""))
    # probe.py's and routing.py's figures of base and mesh, seed 0, per layout
    for layout in layouts:
        names = [run_name(v, layout, 0) for v in ("base", "mesh")]
        figures = [os.path.join(a.root, n) for n in names if any(r["name"] == n for r in results)]
        tag = "" if layout == LOOP_LAYOUT else f"_{layout}"
        for tool, out in (("probe.py", f"--png={a.results}/table1_probe{tag}"),
                          ("routing.py", f"--png={a.results}/table1_routing{tag}.png")):
            # the tools as commands, as train.py is
            stem = out.partition("=")[2].removesuffix(".png")
            if figures and CHILDREN.run([sys.executable, os.path.join(ROOT, "tools", tool), *(
                    f"--out_dir={d}" for d in figures), f"--json={stem}.json", out,
                    f"--data_root={a.data_root}"]):
                if command.Stop.signals:
                    raise command.Stopped(command.Stop.name)
                fail(f"{tool} failed on {', '.join(figures)}; its own lines above say why")


if __name__ == "__main__":
    sys.exit(main())
