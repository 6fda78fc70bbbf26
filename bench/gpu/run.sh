#!/usr/bin/env bash
# bench.speed.sampling --model-config (the engine's sampling speed, eager and compiled, against generate's), then
# bench.trl.grpo --model-config (both legs in one process) on the lent GPU machine, from the repository root: its python3 has torch, transformers,
# peft and accelerate but not TRL, datasets or pydantic, which come from the wheels in .whl/ (carried with .gpu/,
# SmolLM2's config and tokenizer files). Writes $OUT/gpu_sampling.log, $OUT/gpu_grpo.json and the log
# $OUT/gpu_grpo.log; arguments go to the GRPO bench (e.g. --steps 4).
#     OUT=DIR bash bench/gpu/run.sh [ARGS]
set -euo pipefail
: "${OUT:?set OUT to the folder the results go to}"
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } 2>&1 | tee "$OUT/gpu_grpo.log"
python3 -m bench.speed.sampling --model-config .gpu/smollm2 2>&1 | tee "$OUT/gpu_sampling.log"
python3 -m bench.trl.grpo --model-config .gpu/smollm2 --out "$OUT/gpu_grpo.json" "$@" 2>&1 |
    tee -a "$OUT/gpu_grpo.log"
