#!/usr/bin/env bash
# The lock a commit leaves: clone COMMIT of this repo to /tmp/lock_NAME, shrink its params with examples/tiny.args
# (what the tests run), `alignflow repro` each PIPELINE, and write every output's hash to /tmp/lock_NAME.outs.
# Two of them, before and after a change, compared with diff: docs/testing.md ("A refactor leaves the lock as it was").
#   bash bench/repro/lock_compare.sh 5bec16d before sft rlhf r1; bash bench/repro/lock_compare.sh HEAD after sft rlhf r1
#   diff /tmp/lock_before.outs /tmp/lock_after.outs
set -uo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$1; name=$2; shift 2
dir=/tmp/lock_$name
rm -rf "$dir" && git clone -q "$repo" "$dir" && cd "$dir" && git checkout -q "$commit" || exit 1
export PATH=$repo/.venv/bin:$PATH PYTHONPATH=$dir
REPO="$repo" python - <<'PY'
import os
from pathlib import Path
from omegaconf import OmegaConf
lines = (Path(os.environ["REPO"]) / "examples/tiny.args").read_text().splitlines()
tiny = [*(line for line in lines if line and line[0] != "#"), f"remote.url={os.getcwd()}/.remote", "remote.push=false"]
OmegaConf.save(OmegaConf.merge(OmegaConf.load("params.yaml"), OmegaConf.from_dotlist(tiny)), "params.yaml")
PY
git -c user.name=t -c user.email=t@t commit -qam tiny
for pipeline in "$@"; do alignflow repro "$pipeline" > "/tmp/lock_$name.$pipeline.log" 2>&1 || echo "$pipeline stopped: /tmp/lock_$name.$pipeline.log"; done
python -c "
import yaml
for stage, entry in sorted(yaml.safe_load(open('dvc.lock'))['stages'].items()):
    for out in entry.get('outs', []):
        print(stage, out['path'], out['md5'])
" > "/tmp/lock_$name.outs"
