#!/usr/bin/env bash
# Issue 6, third round, run 7: the plain kernel, the fixed row maximum and the persistent kernel, with SDPA's FLASH and
# cuDNN backends timed in each process, on the money shot, its non-causal twin, 16k causal, D = 64 and (8, 32, 512, 128)
# non-causal.   SHA=<commit> bash tools/device_issue6_h.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
SHA=${SHA:?}
CONFIGS="64x64 w4 s3,128x64 w4 s2,64x128 w4 s2,128x128 w8 s3,128x128 w8 s2,128x64 w8 s3,128x64 w4 s3"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
for path in descriptors descriptors+fixed_max descriptors+persistent; do
  name=${path#descriptors+}; [ "$name" = descriptors ] && name=plain
  timeout 110 python3 tools/experiment_hopper.py --paths $path --shapes 0,1,2,3,5 --workers 15 --seconds 100 \
    --configs "$CONFIGS" --commit $SHA --out $OUT/variants_run7_${name}_$SHA.csv 2>&1 | grep -E "^\(|^precompiled|stopped|Error"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
