#!/usr/bin/env bash
# Issue 6, after the sweep (~8 device-minutes): notebook 11's GPU cells (the check cell fixed after run 26), the three-
# consumer ws kernel at D = 64 against the pick, FA2 and cuDNN (tool timing, D = 64 shapes only), then ncu on the money
# shot (ours, FA2, cuDNN) for the final kernel.
#   SHA=<commit> bash tools/device_issue6_x.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
(cd nbs && timeout 120 nbdev-test 11_gluon.ipynb --flags gpu > $OUT/nb11_gpu.log 2>&1; tail -3 $OUT/nb11_gpu.log; grep -B2 -A30 "Error" $OUT/nb11_gpu.log | head -50)
CONFIGS="64,3,1,160,1,3;128,3,1,160,1,3;128,3,1,240,1;128,4,1,240,1"   # three consumers; two with deeper rings
TIMING_D=64 timeout 90 python3 tools/gluon_ws_attention.py --smoke --configs "$CONFIGS" 2>&1 | grep -v Warn | tee $OUT/ws3_smoke.log
PASSED=$(sed -n 's/^smoke \(.*\): ok$/\1/p' $OUT/ws3_smoke.log | paste -sd';')
[ -n "$PASSED" ] && TIMING_D=64 timeout 240 python3 tools/gluon_ws_attention.py --commit ${SHA:?} --out $OUT/ws3_$SHA.csv \
  --configs "$PASSED" 2>&1 | grep -v Warn | tail -30 | tee $OUT/ws3.log
python3 tools/precompile.py --workers 15 --dims 128 --dtypes bf16 2>&1 | grep -v Warning | tail -1   # the money shot's candidates
timeout 150 ncu --clock-control none --profile-from-start off --csv --page details --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  python3 tools/profile_money_shot.py run --sass $OUT/sass.json > $OUT/ncu_raw.csv 2> $OUT/ncu_stderr.log
echo "ncu rc $?"; wc -l $OUT/ncu_raw.csv; tail -3 $OUT/ncu_stderr.log
