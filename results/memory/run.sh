#!/usr/bin/env bash
# What a checkpoint read costs: sample.py's peak memory (resident set, GNU time's %M) on a checkpoint
# of pythia-160m's shape (12 layers of 768, a character vocabulary; AdamW's state in it, as every
# ckpt.pt of train.py has), against a Python that imports torch and nothing else, and the weights'
# own bytes. Offline: the text is Python's pydoc documentation. Writes results/memory/memory.md.
#   bash results/memory/run.sh          # about 2 minutes on a 2-core CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
$PY data/prepare.py --dataset pydoc --out_root "$runs" 2>/dev/null
$PY train.py --model=pythia-160m --dataset=pydoc --data_root="$runs" --out_dir="$runs/out" \
    --block_size=64 --batch_size=1 --max_iters=1 --eval_interval=1 --eval_iters=1 \
    --sample_tokens=0 >/dev/null
peak() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -n 1; }  # KiB
torch_kib=$(peak $PY -c "import torch")
sample_kib=$(peak $PY sample.py --out_dir="$runs/out" --max_new_tokens=20)
$PY - "$runs/out/ckpt.pt" "$torch_kib" "$sample_kib" <<'PY' | tee results/memory/memory.md
import os, sys, torch
path, base, peak = sys.argv[1], int(sys.argv[2]) / 1024, int(sys.argv[3]) / 1024
weights = sum(t.numel() * t.element_size()
              for t in torch.load(path, mmap=True, weights_only=True)["model"].values()) / 2**20
print(f"| checkpoint | weights | ckpt.pt | torch alone | sample.py peak | above torch, x weights |")
print(f"|---|---:|---:|---:|---:|---:|")
print(f"| pythia-160m's shape, characters | {weights:,.0f} MiB | "
      f"{os.path.getsize(path) / 2**20:,.0f} MiB | {base:,.0f} MiB | {peak:,.0f} MiB | "
      f"{(peak - base) / weights:.2f}x |")
PY
