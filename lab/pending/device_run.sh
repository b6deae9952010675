# From the repo root on the device, this commit checked out, main's package before it in base/ (see README.md);
# carry .whl with pytest-xdist.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for r in 1 2 3; do
  (cd base && TRITON_FA2_NO_CACHE=1 PYTHONPATH=$PWD python3 ../lab/pending/ab_paged.py base)
  TRITON_FA2_NO_CACHE=1 PYTHONPATH=$PWD python3 lab/pending/ab_paged.py exp
done > $OUT/ab_paged.log 2>&1
grep -v JSON $OUT/ab_paged.log
PYTHONPATH=$PWD:/tmp/site python3 -m pytest -q -m gpu tests/test_kvcache.py tests/test_decode.py tests/test_varlen.py -n 8 \
  -p no:cacheprovider -k "page or paged or kvcache or decode" 2>&1 | tail -3
