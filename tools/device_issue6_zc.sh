#!/usr/bin/env bash
# Issue 6, sixth session (~2 device-minutes): D = 64's pick (`tl` 128x64 w4 s3) at D = 64's three timing shapes with
# its softmax as shipped, with 1/8 and 1/4 of the exponentials on the FMA pipe, and with no softmax at all (gemm_only:
# wrong answers, the loop's time without the exponentials: what a free softmax would give). One process per swap.
#   SHA=<commit> bash tools/device_issue6_zc.sh        (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
for path in descriptors descriptors+poly_exp_1of8 descriptors+poly_exp_2of8 descriptors+gemm_only; do
  timeout 120 python3 tools/experiment_hopper.py --out $OUT/d64_softmax_${path#descriptors+}_${SHA:?}.csv --seconds 100 \
    --commit $SHA --workers 3 --paths $path --shapes 3,6,7 --configs "128x64 w4 s3" 2>&1 | grep -v Warn | grep -v "^precompiled"
done
