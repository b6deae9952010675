# From the repo root on the device, this commit checked out, the package before it in base/ (see README.md).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl   # pytest-xdist
for r in 1 2 3; do
  (cd base && PYTHONPATH=$PWD python3 ../lab/pending/ab_softcap.py before)
  PYTHONPATH=$PWD python3 lab/pending/ab_softcap.py after
done > $OUT/ab_softcap.log 2>&1
grep -v JSON $OUT/ab_softcap.log
PYTHONPATH=$PWD:/tmp/site python3 -m pytest -q -m gpu tests/test_gluon.py tests/test_score_mods.py -n 8 -p no:cacheprovider \
  -k "modifier or softcap or overflow or every_candidate" 2>&1 | tail -5
