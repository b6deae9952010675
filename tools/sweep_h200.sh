#!/usr/bin/env bash
# The full benchmark sweep on the H200 device, in parts that each fit one 10-minute device call; every part merges its
# rows into $OUT/results/raw.csv (copy it to results/ afterwards). Usage on the device, from the repository root:
#   COMMIT=<sha> bash tools/sweep_h200.sh 1    # prefill grid, bf16
#   COMMIT=<sha> bash tools/sweep_h200.sh 2    # prefill grid, fp16
#   COMMIT=<sha> bash tools/sweep_h200.sh 3    # GQA prefill and decode (FlexAttention on one decode)
# Carry .whl (../shared/device/wheels.sh) so tqdm and fastcore are importable, and pass the previous part's raw.csv
# back in results/raw.csv so the parts merge into one file.
set -euo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || true
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
[ -f results/raw.csv ] && cp results/raw.csv "$OUT/results/raw.csv"
case "${1:?part 1, 2 or 3}" in
  1) shapes="prefill:dtype=bf16" ;;
  2) shapes="prefill:dtype=fp16" ;;
  3) shapes="gqa+decode" ;;
  *) echo "part must be 1, 2 or 3"; exit 2 ;;
esac
python3 -m triton_fa2.bench --shapes "$shapes" --out "$OUT/results/raw.csv" --commit "${COMMIT:?pass COMMIT=sha}" \
  2>&1 | tee "$OUT/sweep_part$1.log"
