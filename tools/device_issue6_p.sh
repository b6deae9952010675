#!/usr/bin/env bash
# Issue 6, run 15 (~9.5 min): the Gluon kernel in the package (notebook 11). Its GPU tests, then the benchmark on the
# money shot and bf16/fp16 prefill shapes with the Gluon candidates in the autotuner, then the GPU tests of the paths
# around it (descriptors, GQA, saved launches).
#   SHA=<commit> bash tools/device_issue6_p.sh      (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning | tail -1 | tee $OUT/precompile.log
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_gluon.py 2>&1 | grep -v Warn | tail -15 | tee $OUT/tests_gluon.log
TRITON_FA2_PRINT_TUNING=1 timeout 250 python3 -m triton_fa2.bench --fresh --out $OUT/bench_run15_${SHA:?}.csv --commit $SHA \
  --providers triton_fa2,sdpa_flash,sdpa_cudnn --no-progress \
  --shapes "money+prefill:dtype=bf16,B=8,D=128+prefill:dtype=bf16,B=32,N=512+prefill:dtype=bf16,B=8,D=64+prefill:dtype=fp16,B=8,N=2048" \
  > $OUT/bench_run15.log 2>&1
tail -5 $OUT/bench_run15.log
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tma.py tests/test_gqa.py tests/test_attention.py -k "saved or tile_sources or gqa" 2>&1 | tail -4 | tee $OUT/tests_paths.log
