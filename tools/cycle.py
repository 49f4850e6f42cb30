"""
Which transitional cycle, by K: MeSH's routed cycle (the paper's) against cycle=direct, paired
seed by seed with the depth sweep's vanilla, base and routed runs.

    # for each K's layout:
    python tools/table1.py --layouts=3+2R3+3 --only=mesh_direct --seeds=0,1,2 --root=runs/cycle
    python tools/cycle.py --root=runs/cycle --results=results/cycle   # cycle.md, cycle.json
"""

import glob
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, setting  # noqa: E402
from support import command, files, tool  # noqa: E402
from tools.table1 import mean_std, pm, run_name, steps  # noqa: E402

LAYOUTS = ["2+4R2+2", "3+2R3+3", "2+2R4+2", "3+1R6+3"]  # K = 2, 3, 4, 6: the depth sweep's
DIRECT = ("mesh_direct", "mesh_direct_base_init")        # the variants compared with routed mesh
RUN_FIELDS = {"variant": (str, "a name"), "layout": (str, "a layout"),  # what is read of a run
              "seed": (int, "an integer"), "val_loss": ((int, float), "a number")}


@dataclass
class CycleConfig:
    """The transitional cycle's table: routed against direct, by K."""
    sweep: str = setting("results/depth_sweep/table1.json", "the depth sweep's runs", path=True)
    choices: str = setting("results/choices/table1.json", "K = 4's direct runs", path=True)
    root: str = setting("runs/cycle", "the direct runs' folders, over the tables", path=True)
    results: str = setting("runs/cycle", "cycle.md and cycle.json go here", path=True)


def records(path, flag=None):
    """The run records of a table1.json (flag: the setting that named it) or of a result.json."""
    try:
        found = files.read_json(path)
        runs = [found] if not flag else found.get("runs") if isinstance(found, dict) else None
        if not isinstance(runs, list):
            holds = "other keys" if isinstance(found, dict) else type(found).__name__
            raise files.PlainDataError(f"is not a table1.json of tools/table1.py (it holds no "
                                       f"list of \"runs\", but {holds})")
        for r in runs:
            if not isinstance(r, dict):
                raise files.PlainDataError(f"holds a run record that is not a JSON object "
                                           f"({r!r:.40})")
            for key, (kinds, word) in RUN_FIELDS.items():
                if not isinstance(r.get(key), kinds) or isinstance(r.get(key), bool):
                    raise files.PlainDataError(f"holds a run whose {key} is "
                                               f"{r.get(key)!r:.40}, not {word}")
    except files.PlainDataError as e:
        fix = (f"give {flag} the table1.json of a tools/table1.py run" if flag else
               "delete that run's folder (table1.py trains it again) or move it out of --root")
        raise UsageError(f"{path} {e}; {fix}") from None
    return runs


def paired(loss, a, b, layout, seeds=None):
    """(mean, std, how many) of a's val loss minus b's, seed by seed, over the seeds both have."""
    b_layout = "12" if b == "vanilla" else layout
    d = [x - loss[b, b_layout, s] for (v, lay, s), x in sorted(loss.items())
         if (v, lay) == (a, layout) and (b, b_layout, s) in loss
         and (seeds is None or s in seeds)]
    return (*mean_std(d), len(d))


def table(loss):
    rows = []
    for layout in LAYOUTS:
        row = dict(layout=layout, K=steps(layout),
                   base_vs_vanilla=paired(loss, "base", "vanilla", layout),
                   mesh_vs_base=paired(loss, "mesh", "base", layout))
        for v in DIRECT:
            row[f"{v}_vs_base"] = paired(loss, v, "base", layout)
            row[f"{v}_vs_mesh"] = paired(loss, v, "mesh", layout)
        for v in ("mesh", *DIRECT):  # the share of base's gap to vanilla each closes
            seeds = {s for (w, lay, s) in loss if (w, lay) == (v, layout)}
            d = row[f"{v}_vs_base"][0]
            gap = paired(loss, "base", "vanilla", layout, seeds)[0]
            row[f"{v}_closes"] = None if d is None or not gap else -d / gap
        rows.append(row)
    return rows


def markdown(rows):
    def cell(x):  # (mean, std, how many)
        return "-" if not x[2] else f"{pm(x[0], x[1], sign='+')} ({x[2]})"

    def share(x):
        return "-" if x is None else f"{100 * x:.0f}%"
    lines = ["| K | layout | base − vanilla | routed − base | direct − base "
             "| direct − routed | routed closes | direct closes |",
             "|---:|---|---|---|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['K']} | `{r['layout']}` | {cell(r['base_vs_vanilla'])} | "
                     f"{cell(r['mesh_vs_base'])} | {cell(r['mesh_direct_vs_base'])} | "
                     f"{cell(r['mesh_direct_vs_mesh'])} | {share(r['mesh_closes'])} | "
                     f"{share(r['mesh_direct_closes'])} |")
    for r in rows:
        if r["mesh_direct_base_init_vs_mesh"][2]:
            lines += ["", f"K = {r['K']}, cycle=direct with router_init=base: "
                          f"{cell(r['mesh_direct_base_init_vs_base'])} against base, "
                          f"{cell(r['mesh_direct_base_init_vs_mesh'])} against routed mesh "
                          f"({share(r['mesh_direct_base_init_closes'])} of the gap closed)."]
    lines += ["", "Val loss differences, paired seed by seed (mean ± std over the seeds, how "
                  "many in brackets); closes: the share of base's gap to vanilla that the "
                  "variant removes (its mean difference to base over the mean gap, on the "
                  "same seeds)."]
    return "\n".join(lines) + "\n"


def main(argv):
    return command.main("tools/cycle.py", run, argv, CycleConfig)


def run(given):
    cfg = CycleConfig(**given)
    tool.check_writable(cfg.results, "results", folder=True)
    found = records(cfg.sweep, "--sweep") + records(cfg.choices, "--choices")
    for path in sorted(glob.glob(os.path.join(glob.escape(cfg.root), "*", "result.json"))):
        found += records(path)  # the direct runs'
    own = [r for r in found if r.get("name") in (  # not the B ablation's runs
        None, run_name(r["variant"], r["layout"], r["seed"]))]
    rows = table({(r["variant"], r["layout"], r["seed"]): r["val_loss"] for r in own})
    md = markdown(rows)
    files.write_json(os.path.join(cfg.results, "cycle.json"), rows)
    files.atomic_write(os.path.join(cfg.results, "cycle.md"), lambda f: f.write(md), mode="w")
    print(md + f"wrote {cfg.results}/cycle.md and cycle.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
