"""
Which transitional cycle, by K: MeSH's routed cycle (the paper's: routers[0] on the prelude output)
against cycle=direct, paired seed by seed with the depth sweep's vanilla, base and routed runs.

    # for each K's layout:
    python tools/table1.py --layouts=3+2R3+3 --only=mesh_direct --seeds=0,1,2 --root=runs/cycle
    python tools/cycle.py --root=runs/cycle --results=results/cycle

Reads the sweep's runs (--sweep, a table1.json; K = 4's direct runs from --choices) and the
result.json of every run under --root, which take precedence; writes cycle.md and cycle.json.
"""

import json
import os
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, setting  # noqa: E402
from support import command, files  # noqa: E402
from support.files import PlainDataError  # noqa: E402
from tools.table1 import mean_std, pm, steps  # noqa: E402

LAYOUTS = ["2+4R2+2", "3+2R3+3", "2+2R4+2", "3+1R6+3"]  # K = 2, 3, 4, 6: the depth sweep's
DIRECT = ("mesh_direct", "mesh_direct_base_init")        # the variants compared with routed mesh


@dataclass
class CycleConfig:
    """The transitional cycle's table: routed against direct, by K."""
    sweep: str = setting("results/depth_sweep/table1.json", "the depth sweep's table1.json",
                         path=True)
    choices: str = setting("results/choices/table1.json", "the K = 4 choices' table1.json",
                           path=True)
    root: str = setting("runs/cycle", "folders of the cycle=direct runs (each with result.json)",
                        path=True)
    results: str = setting("results/cycle", "cycle.md and cycle.json go here", path=True)


# what this table reads of a run's record
RUN_FIELDS = {"variant": ((str,), "a name"), "layout": ((str,), "a layout"),
              "seed": ((int,), "an integer"), "val_loss": ((int, float), "a number")}


def records(path, flag=None):
    """The run records of a table1.json (flag: the setting that named it) or, flag None, of one
    run's result.json, each checked: a damaged file, or another tool's JSON, is one line naming
    it."""
    try:
        data = files.read_json(path)
        if flag and not (isinstance(data, dict) and isinstance(data.get("runs"), list)):
            holds = type(data).__name__ if not isinstance(data, dict) else "other keys"
            raise PlainDataError(f"is not a table1.json of tools/table1.py (it holds no list of "
                                 f"\"runs\", but {holds})")
        found = data["runs"] if flag else [data]
        for r in found:
            if not isinstance(r, dict):
                raise PlainDataError(f"holds a run record that is not a JSON object ({r!r:.40})")
            for key, (kinds, word) in RUN_FIELDS.items():
                if not isinstance(r.get(key), kinds) or isinstance(r.get(key), bool):
                    raise PlainDataError(f"holds a run whose {key} is {r.get(key)!r:.40}, "
                                         f"not {word}")
    except (json.JSONDecodeError, PlainDataError) as e:  # a damaged file, or another's JSON
        why = e
        if isinstance(e, json.JSONDecodeError):
            why = f"is not JSON ({e.msg}, line {e.lineno})"
        fix = (f"give {flag} the table1.json of a tools/table1.py run" if flag else
               "delete that run's folder (table1.py trains it again) or move it out of --root")
        raise UsageError(f"{path} {why}; {fix}") from None
    return found


def runs(cfg):
    """{(variant, layout, seed): val loss} of every run: the two tables', then --root's over
    them."""
    found = records(cfg.sweep, "--sweep") + records(cfg.choices, "--choices")
    if os.path.isdir(cfg.root):
        for name in sorted(os.listdir(cfg.root)):
            path = os.path.join(cfg.root, name, "result.json")
            if os.path.isfile(path):
                found += records(path)
    return {(r["variant"], r["layout"], r["seed"]): r["val_loss"] for r in found}


def seeds_of(loss, variant, layout):
    return {s for (v, lay, s) in loss if v == variant and lay == layout}


def paired(loss, a, b, layout, seeds=None):
    """(mean, std) over the seeds both have (of `seeds`, if given) of a's val loss minus b's, and
    how many seeds."""
    b_layout = "12" if b == "vanilla" else layout
    both = seeds_of(loss, a, layout) & seeds_of(loss, b, b_layout)
    d = [loss[(a, layout, s)] - loss[(b, b_layout, s)] for s in sorted(both)
         if seeds is None or s in seeds]
    return (*mean_std(d), len(d))


def table(loss):
    rows = []
    for layout in LAYOUTS:
        gap = paired(loss, "base", "vanilla", layout)
        row = dict(layout=layout, K=steps(layout), base_vs_vanilla=gap,
                   mesh_vs_base=paired(loss, "mesh", "base", layout))
        for v in DIRECT:
            row[f"{v}_vs_base"] = paired(loss, v, "base", layout)
            row[f"{v}_vs_mesh"] = paired(loss, v, "mesh", layout)
        for v in ("mesh", *DIRECT):  # the share of base's gap to vanilla each closes, same seeds
            d = row[f"{v}_vs_base"][0]
            g = paired(loss, "base", "vanilla", layout, seeds_of(loss, v, layout))[0]
            row[f"{v}_closes"] = None if d is None or not g else -d / g
        rows.append(row)
    return rows


def cell(x):
    mean, std, n = x
    return "-" if not n else f"{pm(mean, std, sign='+')} ({n})"


def share(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def markdown(rows):
    lines = ["| K | layout | base − vanilla | routed − base | direct − base | direct − routed "
             "| routed closes | direct closes |", "|---:|---|---|---|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['K']} | `{r['layout']}` | {cell(r['base_vs_vanilla'])} | "
                     f"{cell(r['mesh_vs_base'])} | {cell(r['mesh_direct_vs_base'])} | "
                     f"{cell(r['mesh_direct_vs_mesh'])} | {share(r['mesh_closes'])} | "
                     f"{share(r['mesh_direct_closes'])} |")
    both = [r for r in rows if r["mesh_direct_base_init_vs_mesh"][2]]
    for r in both:
        lines += ["", f"K = {r['K']}, cycle=direct with router_init=base: "
                      f"{cell(r['mesh_direct_base_init_vs_base'])} against base, "
                      f"{cell(r['mesh_direct_base_init_vs_mesh'])} against routed mesh "
                      f"({share(r['mesh_direct_base_init_closes'])} of the gap closed)."]
    lines += ["", "Val loss differences, paired seed by seed (mean ± std over the seeds, how many "
                  "in brackets); closes: the share of base's gap to vanilla that the variant "
                  "removes "
                  "(its mean difference to base over the mean gap, on the same seeds)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    return command.main("tools/cycle.py", run, sys.argv[1:] if argv is None else argv, CycleConfig)


def run(given):
    cfg = CycleConfig(**given)
    rows = table(runs(cfg))
    os.makedirs(cfg.results, exist_ok=True)
    md = markdown(rows)
    files.atomic_write(os.path.join(cfg.results, "cycle.md"), lambda f: f.write(md), mode="w")
    files.write_json(os.path.join(cfg.results, "cycle.json"), rows)
    print(md + f"wrote {cfg.results}/cycle.md and cycle.json")


if __name__ == "__main__":
    sys.exit(main())
