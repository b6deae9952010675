#!/usr/bin/env bash
# Issue 6, device call A: GPU tests of the saved launches, host cost per layer, and the lazy-rescale experiment.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
SHA=${SHA:?}
timeout 200 python3 -m pytest -q -m gpu tests/test_attention.py -k "saved or plain" -p no:cacheprovider 2>&1 | tail -15 > $OUT/tests_saved.log
tail -3 $OUT/tests_saved.log
python3 tools/diag_launch_profile.py --calls 3000 --csv $OUT/launch_overhead.csv --commit $SHA > $OUT/launch_profile.log 2>&1
head -30 $OUT/launch_profile.log
python3 tools/experiment_hopper.py --out $OUT/lazy_variants.csv --seconds 250 --commit $SHA --workers 15 \
    --shapes 0,1,2,3 --paths descriptors,descriptors+lazy 2>&1 | grep -v Warning > $OUT/experiment.log
tail -12 $OUT/experiment.log
