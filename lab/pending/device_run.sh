# One device call for the softcap lever on this branch (the warp-specialised dK/dV pass with 32-row steps).
# Before: mkdir -p .devjob/base && git archive main triton_fa2 | tar -x -C .devjob/base && cp lab/pending/ab_softcap.py .devjob/
# Run with timeout_s 600: BUDGET=580 bash lab/pending/device_run.sh   (.devjob travels untracked)
# Gluon backward GPU tests take ~30 s each on a cold machine: the -k selections below are narrow on purpose.
export PYTHONUNBUFFERED=1
START=$(date +%s); END=$((START + ${BUDGET:-580}))
left() { echo $(( END - $(date +%s) )); }
step() { local need=$1; shift; if [ $(left) -gt $need ]; then timeout $(( $(left) - 3 )) "$@"; else echo "SKIPPED (time): $*"; fi; }
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export PYTHONPATH=$PWD
C=$(git rev-parse --short HEAD 2>/dev/null || echo branch)
step 60 python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_backward.py -k "test_gpu_gluon_dkdv_with_score_modifiers and dtype0-128" 2>&1 | tail -4
step 40 python3 .devjob/ab_softcap.py softcap-ws-dkdv $OUT/ab_softcap_ws_dkdv.csv 2>&1 | tail -5
step 40 env PYTHONPATH=$PWD/.devjob/base python3 .devjob/ab_softcap.py main $OUT/ab_softcap_ws_dkdv.csv 2>&1 | tail -5
step 60 python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_backward.py -k "test_gpu_gluon_dkdv_with_score_modifiers and dtype1-128" 2>&1 | tail -4
step 60 python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_backward.py -k "test_gpu_gluon_dkdv and dtype0-128 and not modifiers" 2>&1 | tail -4
echo "done at $(( $(date +%s) - START )) s"
