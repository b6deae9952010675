#!/usr/bin/env bash
# Issue 6 (~4 device-minutes): the saved decode launch (`_DecodeLaunch`, notebook 06). GPU tests of decode, the host
# time of a decode call both ways, and the benchmark's decode rows (every provider, eager and graph) for this commit.
#   SHA=<commit> bash tools/device_issue6_y.sh        (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -m gpu tests/test_decode.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/decode_gpu_tests.log
timeout 90 python3 tools/diag_decode_host.py 2>&1 | grep -v Warn | tee $OUT/decode_host_${SHA:?}.log
timeout 200 python3 -m triton_fa2.bench --shapes decode --out $OUT/decode_$SHA.csv --commit $SHA --fresh --no-progress 2>&1 \
  | grep -v '^{' | tail -12 | tee $OUT/decode_bench.log
