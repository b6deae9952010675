# Import the runtime first: without a GPU it sets TRITON_INTERPRET=1 before any kernel module is decorated.
import triton_fa2.runtime  # noqa: F401
import atexit, os, shutil, tempfile
import pytest
import torch

# Tuned picks go to a directory of this run's own, never the user's tuning cache (and no run reads another's picks),
# removed when the run ends
os.environ["TRITON_FA2_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_fa2_tuning_cache_")
atexit.register(shutil.rmtree, os.environ["TRITON_FA2_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    "Tests marked `gpu` need CUDA: on a machine without one they are reported as skipped, with the reason."
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the device (DEVELOPERS.md)")
    for item in items:
        if "gpu" in item.keywords: item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
