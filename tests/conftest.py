# Import the runtime first: without a GPU it sets TRITON_INTERPRET=1 before any kernel module is decorated.
import triton_fa2.runtime  # noqa: F401
import atexit, os, shutil, tempfile
import pytest
import torch

# Tuned picks go to a directory of this run's own, never the user's tuning cache (and no run reads another's picks),
# removed when the run ends
os.environ["TRITON_FA2_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_fa2_tuning_cache_")
atexit.register(shutil.rmtree, os.environ["TRITON_FA2_CACHE_DIR"], ignore_errors=True)


# Tests that share an expensive fixture, each group run by one pytest-xdist worker (pyproject's `--dist loadgroup`), so that
# the fixture is set up once a run rather than once a worker that runs some of them: {node id or its prefix: group}.
# (pytest-xdist 3.8 groups `xdist_group` marks by renaming the tests, which pytest 9.2 ignores: every worker rendered the
# docs and started the ring's process groups.)
ONE_WORKER = {
    "tests/test_docs.py": "the rendered docs",
    "tests/test_ring.py": "the ring's process groups",
    "tests/test_bench.py::test_cli_without_a_gpu_checks_and_writes_nothing": "bench --quick on a CPU",
    "tests/test_bench.py::test_quick_table_says_what_err_is_and_gives_a_verdict": "bench --quick on a CPU",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    "`--dist loadgroup`: xdist's own scheduler, with ONE_WORKER's groups as the units of work."
    if config.getvalue("dist") != "loadgroup": return None
    from xdist.scheduler import LoadGroupScheduling

    class OneWorkerGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            for prefix, group in ONE_WORKER.items():
                if nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "[")): return group
            return super()._split_scope(nodeid)      # the test alone, or its `xdist_group` where xdist can name one

    return OneWorkerGroups(config, log)


def pytest_addoption(parser):
    parser.addoption("--each-value-once", action="store_true",
                     help="of each parametrised test, run only enough cases that every value of every parameter (every row of "
                          "a parametrize list, every level of a `pairwise` factor, every fixture param) is run at least once; "
                          "tests without parameters all run. .ci/run's pass on the oldest supported Triton uses it.")


def _levels(item):
    "The (parameter, value index) pairs a parametrised test case takes: what `--each-value-once` must cover."
    spec = getattr(item, "callspec", None)
    if spec is None: return set()
    levels, sampled = set(), set()
    for mark in item.iter_markers("factor_levels"):          # a `pairwise` case (tests/sampling.py): its factors' levels
        for argnames, i in mark.args:
            levels.add((argnames, i)); sampled.update(n.strip() for n in argnames.split(","))
    return levels | {(name, i) for name, i in spec.indices.items() if name not in sampled}


def _each_value_once(items):
    """Per test function, greedily the case that covers the most levels not yet covered and, of those, the one whose levels
    were taken least so far (so that the values spread: not every shape in one dtype), the first in collection order of
    those; until every level is covered. Returns (kept, dropped), each in collection order."""
    by_function = {}
    for item in items: by_function.setdefault((item.nodeid.split("[")[0]), []).append(item)
    keep = set()
    for cases in by_function.values():
        levels = {id(c): _levels(c) for c in cases}
        taken = dict.fromkeys(set().union(*levels.values()), 0)
        keep.update(id(c) for c in cases if not levels[id(c)])
        while any(n == 0 for n in taken.values()):
            best = max((c for c in cases if id(c) not in keep),
                       key=lambda c: (sum(taken[l] == 0 for l in levels[id(c)]), -sum(taken[l] for l in levels[id(c)])))
            keep.add(id(best))
            for l in levels[id(best)]: taken[l] += 1
    return [i for i in items if id(i) in keep], [i for i in items if id(i) not in keep]


def pytest_collection_modifyitems(config, items):
    if config.getoption("--each-value-once"):
        items[:], dropped = _each_value_once(items)
        if dropped: config.hook.pytest_deselected(items=dropped)
    if torch.cuda.is_available(): return
    # Tests marked `gpu` need CUDA: on a machine without one they are reported as skipped, with the reason.
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the device (DEVELOPERS.md)")
    for item in items:
        if "gpu" in item.keywords: item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
