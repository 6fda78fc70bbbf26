#!/usr/bin/env bash
# Usage: lockcmp.sh COMMIT NAME PIPELINES... : clone COMMIT to /tmp/lock_NAME, shrink params to TINY, repro, dump outs
set -euo pipefail
commit=$1; name=$2; shift 2
dir=/tmp/lock_$name
rm -rf $dir && git clone -q /work/main $dir && cd $dir && git checkout -q $commit
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=$dir
python - <<'PY'
import sys
sys.path.insert(0, "/work/main")
from omegaconf import OmegaConf
from tests.conftest import TINY
import os
params = OmegaConf.merge(OmegaConf.load("params.yaml"), OmegaConf.from_dotlist([*TINY, f"remote.url={os.getcwd()}/.remote", "remote.push=false"]))
OmegaConf.save(params, "params.yaml")
PY
git -c user.name=t -c user.email=t@t commit -qam tiny
for p in "$@"; do alignflow repro $p > /tmp/lock_$name.$p.log 2>&1; done
python - <<'PY' > /tmp/lock_$name.outs
import yaml
lock = yaml.safe_load(open("dvc.lock"))["stages"]
for stage, entry in sorted(lock.items()):
    for out in entry.get("outs", []):
        print(stage, out["path"], out["md5"])
PY
