#!/bin/bash
# The step readout of results/README.md's "What each loop step knows": probe.py on the depth
# sweep's checkpoints (tools/table1.py's runs in $SWEEP, 1200 iterations each) at K = 3 (3+2R3+3)
# and K = 4 (2+2R4+2), vanilla, base, anchor and mesh, seeds 0-2; then steps.md, the mean ± std
# over seeds of step_loss (t = 0 ... K, on to 2K for base and anchor), and LAYOUT/steps.png (seed 0;
# of probe.py's figures only this one is kept here).
set -euo pipefail
export OMP_NUM_THREADS=1
SWEEP=${SWEEP:-runs/sweep} HERE=$(dirname "$0")
for layout in ${LAYOUTS:-3+2R3+3 2+2R4+2}; do  # LAYOUTS: probe only these again
  for seed in 0 1 2; do
    runs=(--out_dir=$SWEEP/vanilla_s$seed)
    for scheme in base anchor mesh; do runs+=(--out_dir=$SWEEP/${scheme}_${layout}_s$seed); done
    png=(); [ $seed = 0 ] && png=(--png="$HERE/$layout")
    python tools/probe.py "${runs[@]}" --json="$HERE/${layout}_s$seed.json" "${png[@]}" >/dev/null
  done
done
python - "$HERE" <<'PY'
import json, sys
import numpy as np
here, rows = sys.argv[1], []
for layout in ("3+2R3+3", "2+2R4+2"):
    seeds = [json.load(open(f"{here}/{layout}_s{s}.json")) for s in (0, 1, 2)]
    K = seeds[0][1]["n_steps"]
    vanilla = [r[0]["loss"] for r in seeds]
    rows += [f"\n### K = {K}, `{layout}` (vanilla `12`: {np.mean(vanilla):.4f} ± {np.std(vanilla):.4f})\n",
             "| scheme | " + " | ".join(f"t = {t}" for t in range(2 * K + 1)) + " |",
             "|---|" + "---|" * (2 * K + 1)]
    for i, scheme in enumerate(("base", "anchor", "mesh"), 1):
        loss = np.array([r[i]["step_loss"] for r in seeds])  # (seeds, steps)
        cells = [f"{m:.3f} ± {s:.3f}" + (" *" if t == K else "")
                 for t, (m, s) in enumerate(zip(loss.mean(0), loss.std(0)))]
        rows.append(f"| {scheme} | " + " | ".join(cells + ["-"] * (2 * K + 1 - len(cells))) + " |")
with open(f"{here}/steps.md", "w") as f:
    f.write("Validation loss had the model stopped after loop step t (probe.py's step_loss, 64 "
            "sequences, mean ± population std over seeds 0-2); * the trained K.\n" + "\n".join(rows) + "\n")
print(open(f"{here}/steps.md").read())
PY
