#!/usr/bin/env bash
# Issue 6, sixth session (~4 device-minutes): one-warpgroup Gluon kernels with 128-row blocks at D = 64, the open goal
# (D = 64's long rows take the `tl` kernel's 128x64 w4 s3; the Gluon candidates are 64-row). Checks against float32
# (poisoned outputs, odd shapes, the overflow redo), then the D = 64 timing shapes against the pick, FA2 and cuDNN.
#   SHA=<commit> bash tools/device_issue6_za.sh        (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
# BLOCK_M,BLOCK_N,STAGES,num_warps,Q in registers,P through shared memory
CONFIGS="128,64,2,4;128,64,3,4;128,64,2,4,1,1;128,64,2,4,0,1;128,64,3,4,0,1;64,128,2,4,1;64,64,2,4,1"
TIMING_D=64 timeout 420 python3 tools/gluon_attention.py --commit ${SHA:?} --out $OUT/d64_gluon128_$SHA.csv \
  --configs "$CONFIGS" 2>&1 | grep -v Warn | tee $OUT/d64_gluon128.log | grep -v "^checked"
