"""All-pairs sampling of a cross product, for parametrised sweeps that run the kernels through Triton's slow interpreter.

A sweep over shapes × dtypes × flags runs the same kernel path once per combination; a fault that needs one particular
value, or one particular pair of values (a shape in bf16, a shape with the mask, a dtype with the mask), shows in any
case that holds it. `all_pairs` keeps a subset of the combinations in which every pair of values of any two factors
appears at least once (so every value too), usually about as many cases as the two largest factors' product rather than
the product of all of them. `pairwise` is the `pytest.mark.parametrize` of those cases, each case marked with the value
it takes of each factor (`factor_levels`), which `--each-value-once` (tests/conftest.py) reads."""
import itertools

import pytest
import torch


def all_pairs_levels(sizes):
    """Rows of indices into factors of `sizes` values, in cross-product order, in which every pair of values of any two
    factors appears: each step takes the combination that covers the most pairs not yet covered and, of those, the one
    whose pairs were taken least so far (so that the rows spread over the pairs evenly), the first in cross-product order
    of those (deterministic)."""
    sizes = list(sizes)
    if len(sizes) < 2: return list(itertools.product(*map(range, sizes)))
    factor_pairs = list(itertools.combinations(range(len(sizes)), 2))
    pairs = lambda row: {(a, row[a], b, row[b]) for a, b in factor_pairs}
    candidates, rows = list(itertools.product(*map(range, sizes))), []
    taken = dict.fromkeys(set().union(*map(pairs, candidates)), 0)
    while any(n == 0 for n in taken.values()):
        best = max(candidates, key=lambda row: (sum(taken[p] == 0 for p in pairs(row)), -sum(taken[p] for p in pairs(row))))
        rows.append(best); candidates.remove(best)
        for p in pairs(best): taken[p] += 1
    return sorted(rows)


def all_pairs(*factors):
    "The values themselves: one tuple (a value of each factor) per row of `all_pairs_levels`."
    return [tuple(f[i] for f, i in zip(factors, row)) for row in all_pairs_levels(map(len, factors))]


def _id(value):
    if isinstance(value, tuple): return "-".join(map(_id, value))
    if isinstance(value, list): return "_".join(map(_id, value))
    if isinstance(value, torch.dtype): return str(value).removeprefix("torch.")
    return str(value)


def pairwise(*factors):
    """`pytest.mark.parametrize` over `all_pairs` of `factors`, each a pair ("names", values) as parametrize takes them
    (several comma-separated names: each value a tuple of as many). A factor of one name may give ids: ("name", values, ids)."""
    names, columns = [], []
    for factor in factors:
        argnames, values = factor[0], factor[1]
        ids = factor[2] if len(factor) > 2 else [_id(v) for v in values]
        several = "," in argnames
        names += [n.strip() for n in argnames.split(",")]
        columns.append((argnames, values, ids, several))
    params = []
    for row in all_pairs_levels(len(values) for _, values, _, _ in columns):
        flat = []
        for (_, values, _, several), i in zip(columns, row): flat += list(values[i]) if several else [values[i]]
        params.append(pytest.param(*flat, id="-".join(ids[i] for (_, _, ids, _), i in zip(columns, row)),
                                   marks=pytest.mark.factor_levels(*((argnames, i) for (argnames, *_), i in zip(columns, row)))))
    return pytest.mark.parametrize(", ".join(names), params)
