#!/usr/bin/env bash
# Issue 6, third round, the experiment call: register-capped 8-warp configs and 3-per-SM configs on the experiment's
# five shapes (every candidate too, each launch checked against SDPA-FA2), then the GEMM-only ceiling in its own process.
#   SHA=<commit> bash tools/device_issue6_f.sh    (carry .whl)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
SHA=${SHA:?}
python3 tools/experiment_hopper.py --paths descriptors --workers 15 --seconds ${SECONDS_A:-170} --commit $SHA \
  --out $OUT/variants_run5_occupancy_$SHA.csv 2>&1 | grep -v Warn | tee $OUT/run5.log
python3 tools/experiment_hopper.py --paths descriptors+gemm_only --shapes 0,1,3 --workers 15 --seconds ${SECONDS_B:-110} --commit $SHA \
  --out $OUT/variants_run5_gemm_only_$SHA.csv 2>&1 | grep -v Warn | tee -a $OUT/run5.log
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/test_decode.py > $OUT/test_decode.log 2>&1
echo "test_decode (graph-timed tuning): rc $? · $(tail -1 $OUT/test_decode.log)"; grep "^FAILED" $OUT/test_decode.log | head -5
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/test_attention.py -k "every_candidate or offsets or saved_launch" > $OUT/test_attention_rest.log 2>&1
echo "test_attention, the rest: rc $? · $(tail -1 $OUT/test_attention_rest.log)"; grep "^FAILED" $OUT/test_attention_rest.log | head -5
