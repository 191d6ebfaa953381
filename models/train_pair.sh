#!/usr/bin/env bash
# Reproduce the default pair: corpus + tokenizer, then draft, then target.
# Uses ~1 CPU core (OPENBLAS_NUM_THREADS=1). Rerunning resumes from checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 RAYON_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
$PY models/data.py runs/stdlib-corpus
$PY models/train.py --out models/stdlib-llama-draft \
    --hidden-size 128 --layers 2 --heads 4 \
    --seq-len 256 --batch-size 8 --steps 800 --lr 2e-3 --warmup 50 --seed 0
$PY models/train.py --out models/stdlib-llama-target \
    --hidden-size 384 --layers 3 --heads 6 \
    --seq-len 256 --batch-size 8 --steps 560 --lr 1.5e-3 --warmup 30 --seed 0
