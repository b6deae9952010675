#!/usr/bin/env bash
# Issue 6, third round, run 6: the loop with a fixed row maximum (no running max, no rescale) next to the plain kernel,
# in one device call, on the money shot, its non-causal twin and D = 64.   SHA=<commit> bash tools/device_issue6_g.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
SHA=${SHA:?}
for path in descriptors+fixed_max descriptors; do
  timeout 75 python3 tools/experiment_hopper.py --paths $path --shapes 0,1,3 --workers 15 --seconds 65 --commit $SHA \
    --out $OUT/variants_run6_${path#descriptors+}_$SHA.csv 2>&1 | grep -E "^\(|^precompiled|stopped"
done
