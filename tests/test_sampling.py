"""tests/sampling.py, which the sweeps of the kernel tests sample their cases with: every pair of values of any two factors
in at least one case, the values as given, and the ids and levels `--each-value-once` reads (tests/conftest.py)."""
import itertools, math

import pytest
import torch

from sampling import all_pairs, all_pairs_levels, pairwise
from conftest import _each_value_once

pytestmark = pytest.mark.newest_triton_only   # no Triton: not run again on another Triton (.ci/run)


@pytest.mark.parametrize("sizes", [(15, 2, 2), (5, 4, 2), (3, 2, 6), (2, 5, 2, 2), (3, 3, 3), (4, 5, 2), (1, 3, 3), (2, 2), (4,), ()])
def test_every_pair_of_values_is_in_a_row(sizes):
    rows = all_pairs_levels(sizes)
    assert len(set(rows)) == len(rows) and rows == sorted(rows)
    assert all(len(r) == len(sizes) and all(0 <= i < n for i, n in zip(r, sizes)) for r in rows)
    if len(sizes) < 2: assert rows == list(itertools.product(*map(range, sizes)))          # nothing to pair: all of them
    for a, b in itertools.combinations(range(len(sizes)), 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(range(sizes[a]), range(sizes[b]))), (a, b)
    if len(sizes) >= 2: assert len(rows) <= max(math.prod(sorted(sizes)[-2:]) * 5 // 4, 1)  # near the least possible


def test_values_ids_and_levels():
    shapes, dtypes = [(1, 2), (3, 4), (5, 6)], [torch.float16, torch.bfloat16]
    assert all_pairs(shapes, dtypes, [False, True])[:2] == [((1, 2), torch.float16, False), ((1, 2), torch.bfloat16, True)]
    mark = pairwise(("a, b", shapes), ("dtype", dtypes), ("causal", [False, True], ["full", "causal"]))
    assert mark.args[0] == "a, b, dtype, causal"
    params = mark.args[1]
    assert [p.values for p in params] == [(*s, d, c) for s, d, c in all_pairs(shapes, dtypes, [False, True])]
    assert params[0].id == "1-2-float16-full" and params[1].id == "1-2-bfloat16-causal"
    assert [m.args for m in params[1].marks] == [(("a, b", 0), ("dtype", 1), ("causal", 1))]


class _Item:
    "What `_each_value_once` reads of a collected test case."
    def __init__(self, function, indices, levels=()):
        self.nodeid = f"tests/test_x.py::{function}[{indices}{levels}]"
        self.callspec = type("Spec", (), dict(indices=indices))() if indices or levels else None
        self._levels = levels
    def iter_markers(self, name):
        return [type("Mark", (), dict(args=self._levels))()] if name == "factor_levels" and self._levels else []


def test_each_value_once_keeps_every_value_of_every_parameter():
    plain = [_Item("test_plain", {})]
    grid = [_Item("test_grid", dict(shape=s, dtype=d)) for s in range(3) for d in range(2)]
    sampled = [_Item("test_sampled", dict(a=r, b=r, dtype=r, causal=r), (("a, b", s), ("dtype", d), ("causal", c)))
               for r, (s, d, c) in enumerate(all_pairs_levels((5, 2, 2)))]
    keep, drop = _each_value_once(plain + grid + sampled)
    assert plain[0] in keep and len(keep) + len(drop) == 1 + 6 + len(sampled)
    kept_grid = [i for i in keep if i in grid]
    assert {i.callspec.indices["shape"] for i in kept_grid} == {0, 1, 2} and {i.callspec.indices["dtype"] for i in kept_grid} == {0, 1}
    assert len(kept_grid) == 3                                         # three shapes: each dtype rides along
    kept = [dict(i._levels) for i in keep if i in sampled]
    assert {k["a, b"] for k in kept} == set(range(5)) and {k["dtype"] for k in kept} == {k["causal"] for k in kept} == {0, 1}
    assert len(kept) == 5                                              # the factors' levels, not the rows of the sample
