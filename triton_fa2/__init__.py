"""FlashAttention-2 in Triton: `attention` (SDPA's layout), `flash_attn_func` (flash-attn's), `flash_attn_varlen_func` (packed sequences) and their packed-QKV variants, `flash_attn_with_kvcache` and `decode` against a KV cache (contiguous or paged),
`merge_attention_states`, ring attention across a process group's ranks (`ring_flash_attn_func`,
`zigzag_ring_flash_attn_func`), and the helpers around them."""
__version__ = "0.0.1"

from .runtime import INTERPRET  # noqa: F401  first: without a GPU it selects Triton's interpreter before any kernel is defined
from .interface import (attention, decode, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, warmup)
from .causal import attention_flops
from .split_kv import merge_attention_states, num_splits_heuristic
from .ring import (ring_flash_attn_func, ring_flash_attn_kvpacked_func, ring_flash_attn_qkvpacked_func, zigzag_ring_flash_attn_func,
                   zigzag_ring_flash_attn_kvpacked_func, zigzag_ring_flash_attn_qkvpacked_func, zigzag_shard)

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "decode", "warmup", "merge_attention_states", "num_splits_heuristic",
           "ring_flash_attn_func", "zigzag_ring_flash_attn_func", "ring_flash_attn_qkvpacked_func", "zigzag_ring_flash_attn_qkvpacked_func",
           "ring_flash_attn_kvpacked_func", "zigzag_ring_flash_attn_kvpacked_func", "zigzag_shard",
           "attention_flops", "__version__"]
