#!/usr/bin/env bash
# Issue 6, sixth round (~4 min): the Gluon kernel (tools/gluon_attention.py: QKᵀ(t+1) and PV(t−1) on the tensor cores
# during softmax(t)), every config checked against float32 on odd shapes in bf16 and fp16, then timed against the
# shipped kernel and SDPA's FA2 and cuDNN in one process.   SHA=<commit> bash tools/device_issue6_n.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 tools/precompile.py --workers 15 2>&1 | grep -v Warning | tail -2
timeout 300 python3 tools/gluon_attention.py --commit ${SHA:?} --out $OUT/gluon_run${RUN:-12}_${SHA:?}.csv \
  --configs "${CONFIGS:-64,64,2,4;64,64,2,4,1;64,64,3,4,1;128,64,2,8,1;128,64,3,8,1;128,64,3,8}" 2>&1 | grep -v Warn | tee $OUT/gluon_run${RUN:-12}.log
echo "rc=$?"
