#!/usr/bin/env bash
# Issue 6, run 25: notebook 11's GPU cells (the ws candidate through `_attention_forward`, after run 24's notebook-order
# failure), then the first part of the fresh full sweep of the final kernel into a file of its own (resumable).
#   SHA=<commit> bash tools/device_issue6_v.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
(cd nbs && timeout 110 nbdev-test 11_gluon.ipynb --flags gpu > $OUT/nb11_gpu.log 2>&1; grep -B2 -A40 "Error\|error" $OUT/nb11_gpu.log | head -80)
COMMIT=${SHA:?} SWEEP_SECONDS=${SWEEP_SECONDS:-400} RAW=results/issue6/raw_${SHA}_partial.csv bash tools/sweep_h200.sh 2>&1 | grep -v '^{' | tail -15
