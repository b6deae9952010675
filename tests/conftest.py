# Import the runtime first: without a GPU it sets TRITON_INTERPRET=1 before any kernel module is decorated.
import triton_fa2.runtime  # noqa: F401
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
