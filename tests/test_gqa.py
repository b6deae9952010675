"""GQA/MQA in `attention`: query heads share KV heads by indexing, and small-Lq launches pack a KV head's query heads
into the rows of one program (PACK_GQA). Both row layouts against `attention_ref` in float64, on every ratio."""
import pytest
import torch

import triton_fa2.forward as fwd
import triton_fa2.ops as ops
from triton_fa2.dispatch import _attention_forward
from triton_fa2.forward import _should_pack_gqa
from triton_fa2.interface import attention
from triton_fa2.naive import attention_ref
from test_attention import DTYPES, LSE_TOL, TOL, errors, randn
from sampling import pairwise


def run(q, k, v, causal, pack):
    "The kernel with a forced row layout, into NaN-poisoned outputs; returns (o, lse)."
    o = torch.full_like(q, float("nan")); lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, causal, q.shape[-1] ** -0.5, pack_gqa=pack)
    assert not o.isnan().any() and not lse.isnan().any(), "an element was left unwritten"
    return o, lse


# (B, Hq, Hkv, Lq, Lk, D). Under the interpreter BLOCK_M = 32, so packed blocks hold 32 (head, position) rows:
GQA_SHAPES = [
    (2, 4, 2, 1, 37, 64),      # 2:1 decode: both heads' one query in one block
    (1, 8, 2, 1, 70, 32),      # 4:1 decode, Lk not a multiple of the 16-key tile
    (2, 6, 1, 1, 50, 16),      # MQA: six query heads read one KV head
    (1, 8, 2, 4, 70, 64),      # 4:1, Lq = 4 (speculative decoding): 16 packed rows, four positions each
    (1, 8, 2, 17, 33, 80),     # 4:1, 68 rows: blocks straddle heads, so their positions go from 0 to 16 again
    (2, 4, 1, 40, 20, 64),     # Lq > Lk, causal: packed rows that see nothing next to rows that do
    (1, 4, 2, 100, 100, 64),   # prefill-sized Lq: the packed layout must still be right when not chosen
]


# every shape in both dtypes and with and without the mask, every dtype with and without it (tests/sampling.py)
@pairwise(("B, Hq, Hkv, Lq, Lk, D", GQA_SHAPES), ("dtype", DTYPES), ("causal", [False, True]))
def test_packed_and_unpacked_rows_match_reference(B, Hq, Hkv, Lq, Lk, D, dtype, causal):
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
    for pack in (False, True):
        o, lse = run(q, k, v, causal, pack)
        max_abs, rel = errors(o, o_ref)
        assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (pack, max_abs, rel)
        torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)


def test_packed_rows_with_strided_views():
    "Packing gathers rows across heads: it must follow any head and length strides, e.g. flash-attn's (B, L, H, D)."
    q = randn(2, 3, 8, 64, dtype=torch.bfloat16).transpose(1, 2)          # (B, Hq, Lq, D) view, stride_qh = 64
    k, v = (randn(2, 90, 2, 64, dtype=torch.bfloat16).transpose(1, 2)[:, :, 5:80] for _ in range(2))
    o, lse = run(q, k, v, causal=True, pack=True)
    o_ref, lse_ref = attention_ref(q, k, v, causal=True, upcast=torch.float64)
    max_abs, rel = errors(o, o_ref)
    assert max_abs <= TOL[torch.bfloat16][0] and rel <= TOL[torch.bfloat16][1]
    torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)


def test_pack_rule():
    "flash-attn 3's rule: pack when it fills 128-row blocks at least 1/0.9 times better."
    assert _should_pack_gqa(1, 4) and _should_pack_gqa(1, 2) and _should_pack_gqa(16, 4)
    assert not _should_pack_gqa(1, 1)                  # MHA: nothing to pack
    assert not _should_pack_gqa(128, 8)                # blocks already full
    assert not _should_pack_gqa(2048, 4)
    assert _should_pack_gqa(40, 4)                     # 40/128 = 31% full vs 160/256 = 62%


def test_attention_packs_small_lq_and_never_copies_kv(monkeypatch):
    "attention() chooses the packed layout for decode-like shapes, and K/V reach the kernel as the caller's tensors."
    seen = {}
    real = ops._attention_forward
    def spy(q_, k_, v_, o_, lse_, causal, scale, config=None, pack_gqa=None, **kwargs):
        seen.update(k=k_.data_ptr(), v=v_.data_ptr(), pack=fwd._should_pack_gqa(q_.shape[2], q_.shape[1] // k_.shape[1]))
        return real(q_, k_, v_, o_, lse_, causal, scale, config, pack_gqa, **kwargs)
    monkeypatch.setattr(ops, "_attention_forward", spy)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda *a, **kw: pytest.fail("K/V were repeated"))
    q, k, v = randn(2, 8, 1, 64), randn(2, 2, 45, 64), randn(2, 2, 45, 64)
    o = attention(q, k, v, causal=True)
    assert seen == dict(k=k.data_ptr(), v=v.data_ptr(), pack=True)
    monkeypatch.undo()
    torch.testing.assert_close(o, run(q, k, v, True, pack=False)[0], atol=2e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_gqa_prefill(dtype):
    "A Llama-style GQA prefill (4, 32/8, 4096, 128) causal: sampled heads against float32, all against SDPA's FA2."
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from test_attention import check_sampled
    q, k, v = randn(4, 32, 4096, 128, dtype=dtype), randn(4, 8, 4096, 128, dtype=dtype), randn(4, 8, 4096, 128, dtype=dtype)
    o, _ = check_sampled(q, k, v, True, pairs=[(0, 0), (3, 31), (1, 5), (2, 12)])
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_fa2 = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (o.float() - o_fa2.float()).abs().max().item() <= (1e-2 if dtype == torch.float16 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("Hq, Hkv", [(32, 8), (32, 1), (16, 2)])
@pytest.mark.parametrize("Lq", [1, 4, 16])
def test_gpu_packed_small_lq(Hq, Hkv, Lq):
    "Packed layout on the GPU at realistic cache lengths, both layouts against float64 on a few sequences."
    q, k, v = randn(3, Hq, Lq, 128, dtype=torch.bfloat16), randn(3, Hkv, 3000, 128, dtype=torch.bfloat16), randn(3, Hkv, 3000, 128, dtype=torch.bfloat16)
    o_ref, lse_ref = attention_ref(q, k, v, causal=True, upcast=torch.float64)
    for pack in (False, True):
        o, lse = run(q, k, v, True, pack)
        max_abs, rel = errors(o, o_ref)
        assert max_abs <= TOL[torch.bfloat16][0] and rel <= TOL[torch.bfloat16][1], (pack, max_abs, rel)
        torch.testing.assert_close(lse.double(), lse_ref, atol=1e-4, rtol=1e-4)
