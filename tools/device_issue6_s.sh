#!/usr/bin/env bash
# Issue 6, run 21 (~9 device-minutes left): the psmem config (64x64 w4 s2 qreg psmem) as a fifth Gluon candidate; the
# Gluon path's GPU tests, then the benchmark on the money shot and the bf16 B = 8 D = 128 prefill row, one process.
#   SHA=<commit> bash tools/device_issue6_s.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 --dims 128 2>&1 | grep -v Warning | tail -1 | tee $OUT/precompile.log
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_gluon.py 2>&1 | grep -v Warn | tail -6 | tee $OUT/tests_gluon.log
TRITON_FA2_PRINT_TUNING=1 timeout ${BENCH_SECONDS:-200} python3 -m triton_fa2.bench --fresh --out $OUT/bench_run21_${SHA:?}.csv --commit $SHA \
  --providers triton_fa2,sdpa_flash,sdpa_cudnn --no-progress \
  --shapes "money+prefill:dtype=bf16,B=8,D=128" > $OUT/bench_run21.log 2>&1
grep -v '^{' $OUT/bench_run21.log | tail -45
