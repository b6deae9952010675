#!/usr/bin/env bash
# Issue 6, next session's first call (~10 device-minutes): the rest of the sweep of ca1409e (fp16 from (8, 32, 16384, 128)
# on, GQA, decode), run from that commit's package (sweep_tree/, carried: `rm -rf sweep_tree && mkdir sweep_tree &&
# git archive ca1409e triton_fa2 | tar -x -C sweep_tree`); then copy $OUT/results/raw.csv to results/issue6/raw_ca1409e_partial.csv.
#   SWEEP_SECONDS=540 bash tools/device_issue6_w.sh        (carry .whl and sweep_tree)
set -uo pipefail
COMMIT=ca1409e PACKAGE_TREE=sweep_tree RAW=results/issue6/raw_ca1409e_partial.csv SWEEP_SECONDS=${SWEEP_SECONDS:-540} \
  bash tools/sweep_h200.sh 2>&1 | grep -v '^{' | tail -8
