#!/usr/bin/env bash
# On the GPU device (see DEVELOPERS.md): every notebook with its `#| gpu` cells, the pytest suite and the main job,
# with logs under $OUT. Needs .whl/ carried (../shared/device/wheels.sh nbconvert).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export JUPYTER_PATH=/tmp/site/share/jupyter  # nbconvert's templates, installed with --target
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${COMMIT:-unknown: pass COMMIT=sha, as the copy on the device has no reliable git history}"
  date -u
} 2>&1 | tee "$OUT/env.txt"
status=0
[ -n "${SKIP_NBDEV:-}" ] || { echo "== nbdev-test --flags gpu"; nbdev-test --flags gpu --do-print 2>&1 | tee "$OUT/nbdev_test_gpu.log" || status=1; }
# PYTEST_ARGS runs one pytest command of its own, e.g. '-m "not gpu"'. Without it, the GPU tests: all but those marked
# gpu_memory in WORKERS parallel processes sharing the GPU (pytest-xdist, carried as a wheel: wheels.sh pytest-xdist;
# 8 fit an 80 GB H100, 12 ran some tests out of memory there),
# then the gpu_memory ones alone (beside the workers they ran out of memory).
if [ -n "${PYTEST_ARGS:-}" ]; then
  echo "== pytest ${PYTEST_ARGS}"; eval python3 -m pytest -q -rs --durations=15 "${PYTEST_ARGS}" 2>&1 | tee "$OUT/pytest_gpu.log" || status=1
else
  python3 -c "import xdist" 2>/dev/null && parallel="-n ${WORKERS:-8}" || parallel=""
  echo "== pytest -m 'gpu and not gpu_memory' $parallel"
  python3 -m pytest -q -rf --durations=15 -m "gpu and not gpu_memory" $parallel -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" || status=1
  echo "== pytest -m gpu_memory"
  python3 -m pytest -q -rf --durations=15 -m gpu_memory -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_memory.log" || status=1
fi
echo "== python -m triton_fa2"; python3 -m triton_fa2 --batch 4 --heads 16 --seqlen 2048 --head-dim 128 2>&1 | tee "$OUT/main_gpu.log" || status=1
exit $status
