#!/usr/bin/env bash
# Issue 6, next session (~9 device-minutes): what a persistent ws kernel is worth (notebook 11's last section).
# (a) the ws kernel with the online softmax, one block per program against persistent, every D = 128 timing shape;
# (b) with the fixed maximum (the shipped candidate's softmax) not causal, where the persistent build compiles;
# then the GPU tests not reached in run 29 and tests/test_gluon.py at this commit.
#   SHA=<commit> bash tools/device_issue6_z.sh        (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
ONLINE="128,2,1,240,0;128,2,1,240,0,2,1"          # online: one block per program; persistent
FIXED="128,2,1,240,1;128,2,1,240,1,2,1"           # fixed maximum: shipped; persistent (non-causal only)
TIMING_D=128 timeout 60 python3 tools/gluon_ws_attention.py --smoke --configs "$ONLINE" 2>&1 | grep -v Warn | tee $OUT/smoke_online.log
TIMING_D=128 TIMING_CAUSAL=0 timeout 60 python3 tools/gluon_ws_attention.py --smoke --configs "$FIXED" 2>&1 | grep -v Warn | tee $OUT/smoke_fixed.log
P1=$(sed -n 's/^smoke \(.*\): ok$/\1/p' $OUT/smoke_online.log | paste -sd';')
P2=$(sed -n 's/^smoke \(.*\): ok$/\1/p' $OUT/smoke_fixed.log | paste -sd';')
[ -n "$P1" ] && TIMING_D=128 timeout 200 python3 tools/gluon_ws_attention.py --commit ${SHA:?} --out $OUT/persistent_online_$SHA.csv \
  --configs "$P1" 2>&1 | grep -v Warn | tail -16 | tee $OUT/persistent_online.log
[ -n "$P2" ] && TIMING_D=128 TIMING_CAUSAL=0 timeout 120 python3 tools/gluon_ws_attention.py --commit $SHA \
  --out $OUT/persistent_fixed_$SHA.csv --configs "$P2" 2>&1 | grep -v Warn | tail -10 | tee $OUT/persistent_fixed.log
timeout 100 python3 -m pytest -q -m gpu tests/test_gluon.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests_gluon.log
timeout 120 python3 -m pytest -q -m gpu tests/test_attention.py -k "test_seed_matrix and 32-16384-128" -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests_seed_rest.log
