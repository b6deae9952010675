#!/usr/bin/env bash
# Issue 6, third round, runs 8 and 9: the kernel with the maximum fixed after the first key tile (as shipped) against the
# online softmax (`descriptors+online`), SDPA's FLASH and cuDNN in the same process, on six shapes; then the GPU tests
# the change touches.   SHA=<commit> bash tools/device_issue6_i.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
SHA=${SHA:?}
CONFIGS="64x64 w4 s3,128x64 w4 s2,64x128 w4 s2,128x128 w8 s3,128x64 w8 s3,128x64 w4 s3"
timeout 150 python3 tools/experiment_hopper.py --paths descriptors,descriptors+online --shapes 0,1,2,3,4 --workers 15 \
  --seconds 140 --configs "$CONFIGS" --commit $SHA --out $OUT/variants_run9_$SHA.csv 2>&1 | grep -E "^\(|^precompiled|stopped|Error"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py \
  -k "every_candidate or far_above or online_softmax or ragged or saved" > $OUT/tests_attention.log 2>&1; tail -3 $OUT/tests_attention.log
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_tma.py tests/test_gqa.py > $OUT/tests_tma_gqa.log 2>&1; tail -3 $OUT/tests_tma_gqa.log
