python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export TRITON_FA2_NO_CACHE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > $OUT/gpu.txt
start=$(date +%s)
PYTHONPATH=$PWD:/tmp/site timeout 170 python3 -m pytest -m gpu tests/test_kvcache.py tests/test_decode.py tests/test_varlen.py tests/test_tuning.py -n 8 -q -k "page or paged or kvcache or decode" > $OUT/t_gpu.log 2>&1; echo "tests rc $? at $(( $(date +%s) - start )) s" >> $OUT/progress.txt
for r in 1 2 3; do
  [ $(( $(date +%s) - start )) -gt 390 ] && break
  PYTHONPATH=$PWD/base:$PWD/tools:/tmp/site timeout 95 python3 lab/pending/ab_paged.py base $r >> $OUT/ab.jsonl 2>> $OUT/ab.err
  PYTHONPATH=$PWD:$PWD/tools:/tmp/site timeout 95 python3 lab/pending/ab_paged.py new $r >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "round $r at $(( $(date +%s) - start )) s" >> $OUT/progress.txt
done
tail -2 $OUT/t_gpu.log; cat $OUT/progress.txt; tail -3 $OUT/ab.err
