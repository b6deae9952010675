#!/usr/bin/env bash
# Issue 6, device call C: finish the sweep, the money shot's pick, ncu of the final kernel.
#   SHA=<commit> SWEEP_SECONDS=330 bash tools/device_issue6_c.sh   (carry .whl and results/raw.csv from call B)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
SHA=${SHA:?}
COMMIT=$SHA SWEEP_SECONDS=${SWEEP_SECONDS:-330} OUT=$OUT bash tools/sweep_h200.sh > $OUT/sweep_stdout.log 2>&1
tail -2 $OUT/sweep_stdout.log | tr '\r' '\n' | tail -3
python3 tools/diag_money_pick.py > $OUT/money_pick.log 2>&1; cat $OUT/money_pick.log | grep -v Warn
ncu --clock-control none --profile-from-start off --csv --page details --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    python3 tools/profile_money_shot.py run --sass $OUT/sass.json > $OUT/ncu_raw.csv 2> $OUT/ncu_stderr.log
echo "ncu rc $?"; wc -l $OUT/ncu_raw.csv
