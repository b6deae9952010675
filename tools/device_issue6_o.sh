#!/usr/bin/env bash
# Issue 6, prepared for the next session (~8 min): the Gluon kernel with PV(t) retired before softmax(t+1)
# (tools/gluon_attention.py's default since runs 12–13 showed ptxas reusing P's registers under a running PV), every
# config checked on odd and long shapes (the long D = 64 one three times: the race showed there), then timed against
# the shipped kernel and SDPA's FA2 and cuDNN in one process, eager (do_bench) and GPU time (CUDA graphs); then the
# unsafe PV overlap for the record of what it would add; then two configs over the bf16 prefill grid.
#   SHA=<commit> bash tools/device_issue6_o.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning | tail -1
timeout 260 python3 tools/gluon_attention.py --commit ${SHA:?} --out $OUT/gluon_run14_$SHA.csv \
  --configs "64,64,2,4;64,64,3,4;128,64,3,8;64,64,2,4,1;128,64,3,8,1" 2>&1 | grep -v Warn | tee $OUT/gluon_run14.log
timeout 150 python3 tools/gluon_attention.py --commit $SHA --overlap-pv 1 --out $OUT/gluon_run14_overlap_pv_$SHA.csv \
  --configs "64,64,2,4;128,64,3,8" 2>&1 | grep -v Warn | tee $OUT/gluon_run14_overlap_pv.log
timeout 200 python3 tools/gluon_attention.py --commit $SHA --grid --out $OUT/gluon_run14_grid_$SHA.csv \
  --configs "64,64,2,4;128,64,3,8" 2>&1 | grep -v Warn | tee $OUT/gluon_run14_grid.log
