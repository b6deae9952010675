#!/usr/bin/env bash
# Issue 6, run 16 (~9.5 min): the harness gap on the money shot (tools/diag_gluon_harness.py), then the sweep of the
# package with the Gluon candidates, started fresh for SHA (resumable: COMMIT=SHA bash tools/sweep_h200.sh).
#   SHA=<commit of the package code> SWEEP_SECONDS=380 bash tools/device_issue6_q.sh      (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
timeout 150 python3 tools/diag_gluon_harness.py --out $OUT/run16_harness_${SHA:?}.csv --commit $SHA 2>&1 | grep -v Warn | tee $OUT/run16_harness.log
rm -f results/raw.csv
COMMIT=$SHA SWEEP_SECONDS=${SWEEP_SECONDS:-380} OUT=$OUT bash tools/sweep_h200.sh > $OUT/sweep_stdout.log 2>&1
tail -3 $OUT/sweep_stdout.log
