#!/usr/bin/env bash
# Issue 6, run 19 (~14 device-minutes left after the sweep): PV(t) under softmax(t+1) without the register race (P through a
# shared-memory ring, `P_SMEM`, "psmem"): the psmem configs checked on odd and long shapes (bf16, fp16, the overflow
# fallback), then timed against the money shot's current pick (64x64 w4 s2 qreg) and SDPA's FA2 and cuDNN, one process; then ncu of the money shot (ours, FA2, cuDNN) and the GPU tests of the Gluon path.
#   SHA=<commit> bash tools/device_issue6_r.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
EXTRA_GLUON="64,64,2,4,1,1;64,64,2,4,0,1" python3 tools/precompile.py --workers 15 --gluon-only 2>&1 | grep -v Warning | tail -1
NO_AUTOTUNED=1 timeout ${TOOL_SECONDS:-240} python3 tools/gluon_attention.py --commit ${SHA:?} --out $OUT/gluon_run19_$SHA.csv \
  --configs "64,64,2,4,1;64,64,2,4,1,1;64,64,2,4,0,1" 2>&1 | grep -v Warn | tee $OUT/gluon_run19.log
python3 tools/precompile.py --workers 15 --dims 128 --dtypes bf16 2>&1 | grep -v Warning | tail -1   # the money shot's candidates, for ncu
timeout 100 ncu --clock-control none --profile-from-start off --csv --page details --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  python3 tools/profile_money_shot.py run --sass $OUT/sass.json > $OUT/ncu_raw.csv 2> $OUT/ncu_stderr.log
echo "ncu rc $?"; wc -l $OUT/ncu_raw.csv; tail -3 $OUT/ncu_stderr.log
timeout 100 python3 -m pytest -q -m gpu tests/test_gluon.py -x 2>&1 | tail -5 | tee $OUT/pytest_gluon.log
