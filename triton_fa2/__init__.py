__version__ = "0.0.1"

from .runtime import INTERPRET  # noqa: F401  first: without a GPU it selects Triton's interpreter before any kernel is defined
from .forward import attention, flash_attn_func, warmup  # noqa: F401
from .causal import attention_flops  # noqa: F401
from .split_kv import decode, merge_attention_states, num_splits_heuristic  # noqa: F401
