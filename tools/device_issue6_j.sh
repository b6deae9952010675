#!/usr/bin/env bash
# Issue 6: the GPU tests of the kernel with the maximum fixed by the masked run (7dced4b), each file's output kept whole.
#   bash tools/device_issue6_j.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
run() { local limit=$1 name=$2; shift 2
  timeout $limit python3 -m pytest -q -rfE -p no:cacheprovider "$@" > $OUT/tests_$name.log 2>&1; echo "$name rc=$?"; tail -2 $OUT/tests_$name.log; }
run 330 attention tests/test_attention.py
run 100 tma_gqa tests/test_tma.py tests/test_gqa.py
run 80 decode tests/test_decode.py
