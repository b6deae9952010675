#!/usr/bin/env bash
# The full benchmark sweep on the H200 device, resumable: a device command runs for at most 10 minutes, and the sweep
# takes longer. Each call measures only the (provider, workload) pairs that results/raw.csv does not yet hold for this
# commit, writes each workload's rows as soon as they are measured, and is stopped after SWEEP_SECONDS. Copy the
# returned $OUT/results/raw.csv to results/ and call again until it prints "sweep complete".
#   COMMIT=<sha> SWEEP_SECONDS=480 [RAW=results/raw_next.csv] bash tools/sweep_h200.sh
# RAW (default results/raw.csv) is the file resumed from: a new sweep can grow beside the published one.
# Carry .whl (../shared/device/wheels.sh tqdm) so the bench extras (tqdm; the device has pandas, matplotlib) import. The log gets one JSON line per confirmed
# autotune key (TRITON_FA2_PRINT_TUNING), to read a pick afterwards.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || true
# PACKAGE_TREE: a folder holding the package of COMMIT (`git archive COMMIT triton_fa2 | tar -x -C sweep_tree`, carried),
# so that a sweep resumed after later commits still runs that commit's package
export PYTHONPATH=${PACKAGE_TREE:+$PWD/$PACKAGE_TREE:}$PWD:/tmp/site PYTHONUNBUFFERED=1
python3 -c "import triton_fa2, sys; print('package from', triton_fa2.__file__)" | tee -a "$OUT/sweep.log"
RAW=${RAW:-results/raw.csv}
[ -f "$RAW" ] && cp "$RAW" "$OUT/results/raw.csv"
python3 tools/precompile.py --workers "${PRECOMPILE_WORKERS:-15}" 2>&1 | grep -v Warning | tee -a "$OUT/sweep.log"   # cache hits when warm
TRITON_FA2_PRINT_TUNING=1 timeout "${SWEEP_SECONDS:-480}" python3 -m triton_fa2.bench --resume --out "$OUT/results/raw.csv" \
  --commit "${COMMIT:?pass COMMIT=sha}" 2>&1 | tee -a "$OUT/sweep.log"
case $? in
  0) echo "sweep complete" ;;
  124) echo "sweep stopped after ${SWEEP_SECONDS:-480} s: call again to resume" ;;
  *) echo "sweep failed"; exit 1 ;;
esac
