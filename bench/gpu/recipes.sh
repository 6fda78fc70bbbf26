#!/usr/bin/env bash
# On the lent GPU machine, after bench/gpu/split_model.sh here and the first call that left /tmp/w/part.aa there:
# joins the halves, checks the sha256, and runs the recipe search, its rows to $OUT/recipes.jsonl, its log to
# $OUT/recipes.log. Arguments go to bench.gpu.smollm2_recipes (e.g. --budget-s 420 --only distill,dpo).
#     OUT=DIR bash bench/gpu/recipes.sh [ARGS]
set -euo pipefail
: "${OUT:?set OUT to the folder the results go to}"
model=/tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/w/part.aa .gpu/w2/part.ab > "$model"
[ "$(sha256sum < "$model" | cut -d' ' -f1)" = "$(cat .gpu/w2/model.sha256)" ] || { echo "the model's halves do not join" >&2; exit 1; }
export PYTHONPATH="$PWD/.gpu/site:$PWD" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; } 2>&1 | tee "$OUT/recipes.log"
python3 -m bench.gpu.smollm2_recipes --gguf "$model" --out "$OUT/recipes.jsonl" "$@" 2>&1 |
    grep --line-buffered -v "GGUF tensors\|Loading weights" | tee -a "$OUT/recipes.log"
