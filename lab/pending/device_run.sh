# On the device, from the repo root with this commit checked out, .whl carried: COMMIT=<sha> bash lab/pending/device_run.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; date -u; } > $OUT/env.txt 2>&1
timeout 200 python3 -m pytest -q -rf -m "gpu and not gpu_memory" -n 8 -p no:cacheprovider tests/test_gluon.py tests/test_score_mods.py tests/test_varlen.py -k "softcap or modifiers or overflow or (test_score_mods and gpu)" > $OUT/pytest.log 2>&1; echo "pytest rc $?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
timeout 170 python3 lab/pending/ab_softcap_fma.py > $OUT/ab.log 2>&1; echo "ab rc $?"; grep -v Warning $OUT/ab.log | tail -40
timeout 200 python3 tools/measure_score_mods.py --out $OUT/score_mods.csv --commit $COMMIT --rounds 3 > $OUT/score_mods.log 2>&1; echo "sm rc $?"; tail -5 $OUT/score_mods.log
