#!/bin/bash
# The table of results/README.md's "A recursive model from a pretrained one", from run.sh's runs
# and the depth sweep's (table1.py's): every final checkpoint evaluated as table1.py does (its
# val_loss on its EVAL_BATCHES fixed validation batches); the sweep's 1200-iteration runs as their
# result.json has them (the same evaluation), else as results/depth_sweep/table1.json recorded them.
# Writes uptrain.json and uptrain.md beside this file; a run not there yet is left out ("-"), so it
# can be run again as runs finish. SEEDS="0" as run.sh's. From the project's folder.
set -euo pipefail
export OMP_NUM_THREADS=1
ROOT=${ROOT:-runs/uptrain} SWEEP=${SWEEP:-runs/sweep} HERE=$(dirname "$0")
python - "$ROOT" "$SWEEP" "$HERE" <<'EOF'
import json, os, sys
sys.path.insert(0, os.getcwd())
from support import checkpoint, files
from tools.table1 import LOOP_LAYOUT, eval_batches, mean_std, pm, val_loss
root, sweep, here = sys.argv[1:]
LAYOUTS, SCHEMES = ("2+4R2+2", "3+2R3+3"), ("base", "anchor", "mesh")
SEEDS = tuple(int(s) for s in os.environ.get("SEEDS", "0 1 2").split())  # as run.sh's
# the depth sweep's runs as table1.py recorded them (the same command), where SWEEP lacks one
recorded = {r["name"]: r["val_loss"]
            for r in files.read_json("results/depth_sweep/table1.json")["runs"]}
COLUMNS = {"scratch 0": "step0/scratch", "looped 0": "step0/up", "average 0": "step0/up_average",
           "scratch 300": "scratch", "uptrained 300": "up", "scratch 1200": None}
saved = f"{here}/uptrain.json"
old = files.read_json(saved)["runs"] if os.path.exists(saved) else {}
runs = {}
def loss(column, name):  # table1.py's evaluation of a final checkpoint, or None if not there yet
    if column == "scratch 1200":
        name = name.replace(f"_{LOOP_LAYOUT}_", "_")  # table1.py names its default layout's runs so
        result = os.path.join(sweep, name, "result.json")
        return files.read_json(result)["val_loss"] if os.path.exists(result) else recorded.get(name)
    out = os.path.join(root, COLUMNS[column], name)
    if not os.path.exists(os.path.join(out, "ckpt.pt")):
        return None
    model, ckpt = checkpoint.load(out)
    want = 0 if column.endswith(" 0") else 300
    if ckpt["iter_num"] != want:
        return None
    key = f"{out}@{ckpt['iter_num']}@{ckpt['saved_at']}"
    runs[key] = old.get(key) or val_loss(model, eval_batches(ckpt, model))
    return runs[key]
table = {f"{s}_{l}_s{seed}": {c: loss(c, f"{s}_{l}_s{seed}") for c in COLUMNS}
         for l in LAYOUTS for s in SCHEMES for seed in SEEDS}
vanilla = [files.read_json(f"{sweep}/vanilla_s{s}/result.json")["val_loss"] for s in SEEDS]
md_seeds = f"seeds {', '.join(map(str, SEEDS))}"
def paired(a, b, layout, scheme, scheme_b=None):  # mean ± std over seeds of a - b
    rows = [(table[f"{scheme}_{layout}_s{s}"][a], table[f"{scheme_b or scheme}_{layout}_s{s}"][b])
            for s in SEEDS]
    return mean_std([x - y for x, y in rows if x is not None and y is not None])
md = [f"vanilla `12` (the sources), 1200 iterations, {md_seeds}: {pm(*mean_std(vanilla))}", "",
      "| layout | scheme | " + " | ".join(COLUMNS) + " | uptrained − scratch 300 | uptrained − "
      "scratch 1200 |", "|---|---|" + "---|" * (len(COLUMNS) + 2)]
for l in LAYOUTS:
    for s in SCHEMES:
        cells = [pm(*mean_std([table[f"{s}_{l}_s{seed}"][c] for seed in SEEDS])) for c in COLUMNS]
        diffs = [pm(*paired("uptrained 300", b, l, s), sign="+")
                 for b in ("scratch 300", "scratch 1200")]
        md.append(f"| `{l}` | {s} | " + " | ".join(cells + diffs) + " |")
md += ["", "| layout | after | mesh − base | mesh − anchor | anchor − base |",
       "|---|---|---|---|---|"]
for l in LAYOUTS:
    for c in ("uptrained 300", "scratch 300", "scratch 1200"):
        md.append(f"| `{l}` | {c} | " + " | ".join(pm(*paired(c, c, l, a, b), sign="+") for a, b in
                  (("mesh", "base"), ("mesh", "anchor"), ("anchor", "base"))) + " |")
files.write_json(saved, {"vanilla": vanilla, "table": table, "runs": runs})
files.atomic_write(f"{here}/uptrain.md", lambda f: f.write("\n".join(md) + "\n"), mode="w")
print("\n".join(md))
EOF
