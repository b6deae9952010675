"attention_ref against an independent expectation: SDPA in float64 with masks built another way."
import re

import pytest
import torch
import torch.nn.functional as F

from triton_fa2.naive import attention_ref, causal_mask

pytestmark = pytest.mark.newest_triton_only   # PyTorch only, no Triton kernel: not run again on another Triton (.ci/run)


def sdpa_expected(q, k, v, causal=False, kv_lens=None):
    "Expectation built independently: per-sequence slicing, explicit `tril` masks, per-head loops for GQA."
    B, Hq, Lq, _ = q.shape
    Hkv = k.shape[1]
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for b in range(B):
        n = k.shape[2] if kv_lens is None else int(kv_lens[b])
        mask = torch.ones(Lq, n, dtype=torch.bool)
        if causal: mask = mask.tril(diagonal=n - Lq)
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            if n == 0 or not mask.any(): continue
            rows = mask.any(-1)  # rows that see nothing stay 0
            o = F.scaled_dot_product_attention(q[b, h, rows], k[b, kv, :n], v[b, kv, :n], attn_mask=mask[rows])
            out[b, h, rows] = o
    return out


@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", [
    (1, 1, 1, 1, 1, 64),       # smallest: one query, one key
    (2, 3, 3, 17, 17, 64),     # odd length, MHA
    (1, 2, 2, 1, 1000, 128),   # decode-like: one query, long cache
    (2, 4, 2, 13, 29, 40),     # GQA 2:1, Lq < Lk, head dim not a power of two
    (1, 8, 1, 33, 20, 72),     # MQA, Lq > Lk: the first rows see nothing when causal
    (3, 4, 1, 7, 7, 256),      # largest head dim
])
@pytest.mark.parametrize("causal", [False, True])
def test_against_sdpa(B, Hq, Hkv, Lq, Lk, D, causal):
    q = torch.randn(B, Hq, Lq, D, dtype=torch.float64)
    k, v = torch.randn(B, Hkv, Lk, D, dtype=torch.float64), torch.randn(B, Hkv, Lk, D, dtype=torch.float64)
    o, lse = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
    torch.testing.assert_close(o, sdpa_expected(q, k, v, causal), atol=1e-10, rtol=1e-10)
    # LSE from scores masked the same independent way
    s = (q @ k.repeat_interleave(Hq // Hkv, 1).transpose(-1, -2)) * D ** -0.5
    if causal: s = s.masked_fill(~torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-10, rtol=1e-10)
    assert not o.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize("kv_lens", [
    [0, 5, 31],    # an empty sequence, a short one, a full one
    [1, 1, 1],     # every sequence has a single key
    [31, 16, 2],   # descending
])
@pytest.mark.parametrize("causal", [False, True])
def test_kv_lens_with_nan_garbage(kv_lens, causal):
    "Keys and values past each sequence's length are NaN, as in a real cache: none of it may reach the output."
    B, Hq, Hkv, Lq, Lmax, D = 3, 4, 2, 3, 31, 16
    q = torch.randn(B, Hq, Lq, D, dtype=torch.float64)
    k, v = torch.randn(B, Hkv, Lmax, D, dtype=torch.float64), torch.randn(B, Hkv, Lmax, D, dtype=torch.float64)
    for b, n in enumerate(kv_lens): k[b, :, n:] = v[b, :, n:] = float("nan")
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    o, lse = attention_ref(q, k, v, causal=causal, kv_lens=lens, upcast=torch.float64)
    assert not o.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(o, sdpa_expected(q, k, v, causal, kv_lens), atol=1e-10, rtol=1e-10)
    for b, n in enumerate(kv_lens):
        if n == 0: assert lse[b].isneginf().all() and (o[b] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_are_upcast(dtype):
    q, k, v = (torch.randn(2, 2, 19, 32).to(dtype) for _ in range(3))
    o, lse = attention_ref(q, k, v, causal=True)
    assert o.dtype == lse.dtype == torch.float32
    expected = sdpa_expected(q.double(), k.double(), v.double(), causal=True)
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)


def test_fp16_large_activations_do_not_overflow():
    "QKᵀ of fp16 inputs with large activations overflows fp16 (65504); the reference computes in float32."
    q = torch.full((1, 1, 4, 64), 60.0).half() + torch.randn(1, 1, 4, 64).half()
    k = torch.full((1, 1, 4, 64), 60.0).half()
    v = torch.randn(1, 1, 4, 64).half()
    assert (q @ k.transpose(-1, -2)).isinf().any()          # the naive fp16 product overflows
    o, lse = attention_ref(q, k, v)
    assert o.isfinite().all() and lse.isfinite().all()


def test_non_contiguous_inputs():
    "A (B, L, H, D) tensor viewed as (B, H, L, D) is a strided view; the result must not depend on layout."
    q, k, v = (torch.randn(2, 23, 4, 32, dtype=torch.float64).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    o, _ = attention_ref(q, k, v, causal=True, upcast=torch.float64)
    o2, _ = attention_ref(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, upcast=torch.float64)
    torch.testing.assert_close(o, o2, atol=0, rtol=0)


def test_causal_mask_bottom_right():
    for Lq, Lk in [(1, 1), (1, 9), (9, 1), (5, 8), (8, 5), (16, 16)]:
        expected = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)
        assert torch.equal(causal_mask(torch.arange(Lq), torch.arange(Lk), Lq, Lk), expected)


@pytest.mark.parametrize("args, error, message", [
    ((torch.randn(2, 4, 8, 16), torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16)), ValueError, "got Hq=4 and Hkv=3"),
    ((torch.randn(4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)), ValueError, "4 dimensions"),
    ((torch.randn(2, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)), ValueError, "batch sizes differ"),
    ((torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 8), torch.randn(2, 2, 8, 16)), ValueError, "same head dim"),
    ((torch.ones(2, 4, 8, 16, dtype=torch.int32), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)), TypeError, "floating-point"),
    (([1.0], torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)), TypeError, "torch.Tensor"),
])
def test_errors(args, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        attention_ref(*args)


def test_zero_heads():
    "No key/value head is refused with what to pass instead; no query head over one KV head is an empty output."
    q, kv = torch.randn(2, 0, 8, 16), torch.randn(2, 0, 8, 16)
    with pytest.raises(ValueError, match=re.escape("k and v have 0 heads, got Hq=0 and Hkv=0; attention needs at least one "
                                                   "key/value head: with Hq=0 any Hkv ≥ 1 gives an empty output")):
        attention_ref(q, kv, kv)
    with pytest.raises(ValueError, match=re.escape("got Hq=4 and Hkv=0; attention needs at least one key/value head: try Hkv in [1, 2, 4]")):
        attention_ref(torch.randn(2, 4, 8, 16), kv, kv)
    o, lse = attention_ref(q, torch.randn(2, 1, 8, 16), torch.randn(2, 1, 8, 16))
    assert o.shape == (2, 0, 8, 16) and lse.shape == (2, 0, 8)


def test_kv_lens_errors():
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    with pytest.raises(TypeError, match="integer tensor"): attention_ref(q, k, v, kv_lens=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\)"): attention_ref(q, k, v, kv_lens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"\[0, Lk=6\]"): attention_ref(q, k, v, kv_lens=torch.tensor([1, 7]))
    with pytest.raises(ValueError, match=r"\[0, Lk=6\]"): attention_ref(q, k, v, kv_lens=torch.tensor([-1, 2]))
