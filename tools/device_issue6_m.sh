#!/usr/bin/env bash
# Issue 6, fifth round (~7 min): part of the exponentials on the FMA pipe (FA4's polynomial exp2, tools/experiment_hopper.py
# swaps poly_exp_{1,2,4}of8) against the shipped kernel, each in its own process with its own yardsticks (short timing),
# then the money shot sustained (tools/diag_clocks.py) shipped and with the best-guess swap, for the clock and power.
#   SHA=<commit> bash tools/device_issue6_m.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
SHA=${SHA:?}
CONFIGS="64x64 w4 s3,128x64 w4 s2,64x128 w4 s2"
for paths in descriptors descriptors+poly_exp_1of8 descriptors+poly_exp_2of8 descriptors+poly_exp_4of8; do
  timeout 95 python3 tools/experiment_hopper.py --paths $paths --shapes 0,1,3,4 --workers 15 --seconds 80 \
    --configs "$CONFIGS" --commit $SHA --out $OUT/variants_run11_${paths//[,+]/_}_$SHA.csv 2>&1 | grep -E "^\(|^precompiled|stopped|Error"
done
for swap in "" poly_exp_1of8; do
  timeout 100 python3 tools/diag_clocks.py --seconds 3 --swap "$swap" --out $OUT/clocks_run11_${swap:-shipped}.csv 2>&1 | grep -v Warn | tee -a $OUT/clocks_run11.log
done
