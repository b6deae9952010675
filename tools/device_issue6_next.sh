#!/usr/bin/env bash
# Issue 6, the first device call of the next session (notes/issue6_progress.md): the decode tests that failed at
# cead636 with graph-timed decode tuning (now per-call again) and the two tests added to find the cause, then the rest
# of the GPU suite on the head. Logs under $OUT; carry .whl.   bash tools/device_issue6_next.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning
for f in test_decode test_tma test_gqa test_attention; do
  timeout ${PER_FILE_SECONDS:-170} python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/$f.py > $OUT/$f.log 2>&1
  echo "$f: rc $? · $(tail -1 $OUT/$f.log)"; grep "^FAILED" $OUT/$f.log | head -5
done
