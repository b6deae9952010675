#!/usr/bin/env bash
# Issue 6, prepared for the next session (~6 device-minutes): the warp-specialised Gluon kernel of
# tools/gluon_ws_attention.py (a producer warp, two consumer warpgroups sharing each K/V tile, online softmax or the fixed
# maximum with a redo, PV under the next softmax through shared memory, optional ping-pong): every config checked on odd shapes against float32 (a
# hang is caught by the timeout: a deadlock in the barriers would show as no "checked" line), then timed against the
# package's pick, FA2 and cuDNN in one process. Configs: BLOCK_N,STAGES,PINGPONG,CONSUMER_REGS[,FIXED_MAX].
#   SHA=<commit> bash tools/device_issue6_t.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 --dims 128,64 --dtypes bf16,fp16 2>&1 | grep -v Warning | tail -1   # the package's pick, for its row
# a hang costs little here: one small check per config, each config compiled once, 90 s in all; only the configs that
# passed go on (a config that hangs stops the smoke run at the timeout: the ones after it are not tried)
CONFIGS="${WS_CONFIGS:-64,2,0,240;64,2,1,240;64,2,1,240,1;64,3,1,240,1;128,2,1,240;128,2,1,240,1}"
timeout 90 python3 tools/gluon_ws_attention.py --smoke --configs "$CONFIGS" 2>&1 | grep -v Warn | tee $OUT/gluon_ws_smoke.log
PASSED=$(sed -n 's/^smoke \(.*\): ok$/\1/p' $OUT/gluon_ws_smoke.log | paste -sd';')
[ -n "$PASSED" ] || { echo "no config passed the smoke check: stopping"; exit 1; }
echo "configs that passed: $PASSED"
timeout ${WS_SECONDS:-300} python3 tools/gluon_ws_attention.py --commit ${SHA:?} --out $OUT/gluon_ws_$SHA.csv \
  --configs "$PASSED" 2>&1 | grep -v Warn | tee $OUT/gluon_ws.log
echo "rc ${PIPESTATUS[0]}"
