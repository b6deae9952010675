# Import the runtime first: without a GPU it sets TRITON_INTERPRET=1 before any kernel module is decorated.
import triton_fa2.runtime  # noqa: F401
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    "Tests marked `gpu` need CUDA: on a machine without one they are reported as skipped, with the reason."
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the device (DEVELOPERS.md)")
    for item in items:
        if "gpu" in item.keywords: item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
