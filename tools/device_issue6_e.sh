#!/usr/bin/env bash
# Issue 6, third round, first device call: is the cead636 decode failure the race between graph timing on a side stream
# and the test's queued cache writes? Decode tuned by graph timing without, then with, the synchronise (a fresh
# process each, so the autotuner starts empty); then the GPU suite on the head, file by file. Logs under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning
for sync in 0 1; do
  DECODE_GRAPH_SYNC=$sync timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -p tools.decode_graph_timing_plugin \
    -rf tests/test_decode.py -k "decode_shapes or at_batch_64" > $OUT/decode_graph_sync$sync.log 2>&1
  echo "graph-timed decode, sync=$sync: rc $? · $(tail -1 $OUT/decode_graph_sync$sync.log)"; grep "^FAILED\|^E " $OUT/decode_graph_sync$sync.log | head -8
done
for f in test_decode test_tma test_gqa test_attention; do
  timeout ${PER_FILE_SECONDS:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/$f.py > $OUT/$f.log 2>&1
  echo "$f: rc $? · $(tail -1 $OUT/$f.log)"; grep "^FAILED" $OUT/$f.log | head -5
done
