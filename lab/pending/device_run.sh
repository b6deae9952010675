set -x
for r in 1 2 3; do
  (cd base && PYTHONPATH=$PWD python3 ../lab/pending/ab_paged.py base)
  PYTHONPATH=$PWD python3 lab/pending/ab_paged.py exp
done 2>&1 | tee $OUT/ab_paged.log | grep -v JSON
PYTHONPATH=$PWD python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_decode.py tests/test_varlen.py -n 8 -k "page or paged or kvcache or decode"
