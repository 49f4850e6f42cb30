#!/bin/bash
# The uptraining runs of results/README.md's "A recursive model from a pretrained one", as run:
# one at a time, one thread each, into $ROOT (default runs/uptrain). Each vanilla `12` of the
# depth sweep (tools/table1.py's runs, SWEEP/vanilla_s{0,1,2}, 1200 iterations) looped to 2+4R2+2
# and 3+2R3+3 with base, anchor and mesh and uptrained for 300 iterations (up/), the same from
# scratch (scratch/), with table1.py's flags; step0/: each model before any training
# (--max_iters=0), the looped ones with either --core_init. A run with a checkpoint is resumed;
# SEEDS="0" runs one seed.
set -euo pipefail
export OMP_NUM_THREADS=1
ROOT=${ROOT:-runs/uptrain} SWEEP=${SWEEP:-runs/sweep} DATA=${DATA:-data}
FLAGS="--dataset=shakespeare_char --batch_size=16 --lr=0.001 --eval_iters=20 --sample_tokens=0
       --n_embd=128 --n_head=4 --block_size=64 --device=cpu --data_root=$DATA"
train() {  # OUT_DIR, then train.py's flags
  local out=$1; shift
  if [ -e "$out/ckpt.pt" ]; then python train.py --init_from=resume --out_dir="$out" | tail -1
  else python train.py --out_dir="$out" $FLAGS "$@" | tail -1; fi
}
for seed in ${SEEDS:-0 1 2}; do
  for layout in 2+4R2+2 3+2R3+3; do
    for scheme in base anchor mesh; do
      name=${scheme}_${layout}_s$seed up=--init_from=vanilla:$SWEEP/vanilla_s$seed
      run="--layout=$layout --scheme=$scheme --seed=$seed"
      train "$ROOT/step0/scratch/$name" $run --max_iters=0
      train "$ROOT/step0/up/$name" $run $up --max_iters=0
      train "$ROOT/step0/up_average/$name" $run $up --core_init=average --max_iters=0
      train "$ROOT/up/$name" $run $up --max_iters=300 --eval_interval=75
      train "$ROOT/scratch/$name" $run --max_iters=300 --eval_interval=75
    done
  done
done
