#!/usr/bin/env bash
# Reproduce the default pair: corpus + tokenizer, then draft, then target.
# Uses ~1 CPU core (OPENBLAS_NUM_THREADS=1). Rerunning resumes from checkpoints.
# Wall time on a shared 2-core CPU: target ~2.5 h, draft ~35 min.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1 RAYON_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
$PY models/data.py runs/stdlib-corpus
# The shipped draft ran with --steps 3000 up to step 912 and was then resumed
# with --steps 2000 (to finish in time); the two commands replay exactly that.
$PY models/train.py --out runs/draft-v2 --no-export \
    --hidden-size 192 --layers 2 --heads 4 \
    --seq-len 256 --batch-size 8 --steps 3000 --stop-step 912 \
    --lr 2e-3 --warmup 50 --seed 0
$PY models/train.py --out runs/draft-v2 \
    --hidden-size 192 --layers 2 --heads 4 \
    --seq-len 256 --batch-size 8 --steps 2000 --lr 2e-3 --warmup 50 --seed 0
$PY models/train.py --out runs/target-v2 \
    --hidden-size 384 --layers 8 --heads 6 \
    --seq-len 512 --batch-size 6 --steps 1500 --lr 1e-3 --warmup 100 --seed 0
for m in draft target; do
    mkdir -p models/stdlib-llama-$m
    cp runs/$m-v2/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json} \
        models/stdlib-llama-$m/
done
