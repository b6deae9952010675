#!/usr/bin/env bash
# Issue 6, prepared for the next session (~3 min): run 7's swap (a maximum fixed at 8, right on random inputs only) and
# the shipped kernel (maximum fixed by the masked run) with the online one, back to back in one call, each process with
# its own yardsticks. Their main loops are the same in SASS (notes/performance.md): this says whether run 9's 454 against
# run 7's 491 TFLOP/s on the money shot is the runs or the kernel.   SHA=<commit> bash tools/device_issue6_k.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
SHA=${SHA:?}
CONFIGS="64x64 w4 s3,128x64 w4 s2,64x128 w4 s2,128x128 w8 s3,128x64 w8 s3"
for paths in descriptors,descriptors+online descriptors+fixed_max; do
  timeout 120 python3 tools/experiment_hopper.py --paths $paths --shapes 0,1,3 --workers 15 --seconds 110 \
    --configs "$CONFIGS" --commit $SHA --out $OUT/variants_run10_${paths//[,+]/_}_$SHA.csv 2>&1 | grep -E "^\(|^precompiled|stopped|Error"
done
