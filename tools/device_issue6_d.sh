#!/usr/bin/env bash
# Issue 6, device call D: GPU tests of the CUDA-graph tuning and tune_dtype, then the N ≤ 2048 half of the prefill grid
# (ours, SDPA default, FA2, cuDNN side by side) with the new tuning, into its own CSV.
#   SHA=<commit> bash tools/device_issue6_d.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
SHA=${SHA:?}
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tma.py -k "dtype" 2>&1 | tail -4 > $OUT/tests_gpu.log
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py -k "saved" 2>&1 | tail -4 >> $OUT/tests_gpu.log
cat $OUT/tests_gpu.log
mkdir -p $OUT/results
timeout ${SWEEP_SECONDS:-300} python3 -m triton_fa2.bench --shapes "prefill:N=512+prefill:N=2048" \
  --providers triton_fa2,sdpa,sdpa_flash,sdpa_cudnn --out $OUT/results/raw_short.csv --fresh --commit $SHA \
  --no-progress > $OUT/short_sweep.log 2>&1
echo "bench rc $?"; grep -c "^triton_fa2" $OUT/short_sweep.log; tail -3 $OUT/short_sweep.log
