#!/usr/bin/env bash
# Issue 6, run 24 (~8 device-minutes): the ws kernel in the package as a D = 128 Gluon candidate (notebook 11). The
# Gluon path's GPU tests (every candidate, the ws one included, on odd shapes, GQA, overflow, the saved launch),
# notebook 11's GPU cells, then the benchmark: the money shot and the bf16 B = 8 prefill row (D 64 and 128), one process.
#   SHA=<commit> bash tools/device_issue6_u.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 --dims 128,64 --dtypes bf16 2>&1 | grep -v Warning | tail -1 | tee $OUT/precompile.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_gluon.py 2>&1 | grep -v Warn | tail -8 | tee $OUT/tests_gluon.log
(cd nbs && timeout 120 nbdev-test 11_gluon.ipynb --flags gpu 2>&1 | tail -8 | tee $OUT/nb11_gpu.log)
TRITON_FA2_PRINT_TUNING=1 timeout ${BENCH_SECONDS:-240} python3 -m triton_fa2.bench --fresh --out $OUT/bench_run24_${SHA:?}.csv --commit $SHA \
  --providers triton_fa2,sdpa_flash,sdpa_cudnn --no-progress \
  --shapes "money+prefill:dtype=bf16,B=8" > $OUT/bench_run24.log 2>&1
grep -v '^{' $OUT/bench_run24.log | tail -45
