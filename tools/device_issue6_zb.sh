#!/usr/bin/env bash
# Issue 6, sixth session (~4 device-minutes): three programs per SM at D = 64 (the `tl` kernel's 128x64 w4 under a
# 168-register cap) against two (the pick), at D = 64's three timing shapes, in one process with FA2 and cuDNN.
#   SHA=<commit> bash tools/device_issue6_zb.sh        (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
CONFIGS=${CONFIGS:-"128x64 w4 s3,128x64 w4 s2,128x64 w4 s3 r168,128x64 w4 s2 r168,128x32 w4 s3"}
timeout 400 python3 tools/experiment_hopper.py --out $OUT/d64_three_programs_${SHA:?}.csv --seconds 330 --commit $SHA \
  --workers 15 --paths descriptors --shapes 3,6,7 --configs "$CONFIGS" 2>&1 | grep -v Warn | tee $OUT/d64_three_programs.log
python3 - "$OUT/d64_three_programs_$SHA.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["B"], r["N"], r["D"], r["causal"], r["variant"], r["config"], r["ms"], r["tflops"], r["max_err"], r["error"])
PY
