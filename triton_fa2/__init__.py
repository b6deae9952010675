"""FlashAttention-2 in Triton: `attention` (SDPA's layout), `flash_attn_func` (flash-attn's), `flash_attn_varlen_func` (packed sequences) and their packed-QKV variants, `flash_attn_with_kvcache` and `decode` against a KV cache (contiguous or paged),
`merge_attention_states`, and the helpers around them."""
__version__ = "0.0.1"

from .runtime import INTERPRET  # noqa: F401  first: without a GPU it selects Triton's interpreter before any kernel is defined
from .interface import (attention, decode, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, warmup)
from .causal import attention_flops
from .split_kv import merge_attention_states, num_splits_heuristic

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "decode", "warmup", "merge_attention_states", "num_splits_heuristic",
           "attention_flops", "__version__"]
