"""Split-KV decode (`decode`), its combine kernel and `merge_attention_states`, against `attention_ref` in float64.

Caches hold NaN past each sequence's length, as a server's may: anything read from there would poison the result.
Under the interpreter the decode tile is 16 keys and the heuristic assumes 8 SMs, so small caches split for real.
"""
import math
import re

import numpy as np
import pytest
import torch

import triton_fa2
import triton_fa2.candidates as cands
import triton_fa2.dispatch as dispatch
import triton_fa2.launch as fast
import triton_fa2.split_kv as dec
from triton_fa2.candidates import Candidate
from triton_fa2.dispatch import _decode_forward
from triton_fa2.interface import attention, decode
from triton_fa2.split_kv import _choose_num_splits, merge_attention_states, num_splits_heuristic
from triton_fa2.naive import attention_ref
from test_attention import DEVICE, DTYPES, LSE_TOL, TOL, errors, randn
from sampling import pairwise


def nan_cache(B, Hkv, Lmax, D, seqlens, dtype=torch.float16):
    "A random cache whose positions past each sequence's length hold NaN."
    cache = randn(B, Hkv, Lmax, D, dtype=dtype)
    past = torch.arange(Lmax, device=cache.device)[None, :] >= seqlens.to(cache.device)[:, None]
    return cache.masked_fill(past[:, None, :, None], float("nan"))


def run(q, k, v, seqlens, causal, num_splits, config=None):
    "The decode launch into NaN-poisoned outputs (every element must be written); returns (o, lse)."
    o = torch.full_like(q, float("nan")); lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    _decode_forward(q, k, v, None if seqlens is None else seqlens.to(q.device, torch.int32), o, lse, causal,
                    q.shape[-1] ** -0.5, num_splits, config)
    assert not o.isnan().any() and not lse.isnan().any(), "an element was left unwritten, or NaN leaked from the cache"
    return o, lse


def assert_matches(o, lse, o_ref, lse_ref, dtype):
    max_abs, rel = errors(o, o_ref)
    assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (max_abs, rel)
    torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)   # −∞ exactly where the reference has it


# (B, Hq, Hkv, Lq, seqlens) with Lmax = 70, D = 64; 16-key tiles: 70 = 4 full tiles + 6 keys
DECODE_CASES = [
    (1, 8, 2, 1, [70]),            # B=1, GQA 4:1, one token, full cache: the heuristic splits 1 sequence
    (2, 4, 2, 1, [1, 70]),         # GQA 2:1, lengths 1 and Lmax: a one-key sequence leaves splits empty
    (3, 6, 1, 4, [1, 33, 70]),     # MQA, Lq = 4: 24 packed rows; seq 0's first three queries see nothing
    (3, 4, 4, 4, [70, 16, 5]),     # MHA (g = 1), Lq = 4, a length on a tile boundary and one inside the first tile
    (2, 8, 1, 16, [70, 20]),       # MQA, Lq = 16: 128 packed rows = two 64-row Q blocks, each with its own causal bounds
]


# Every case with every split count, each in both dtypes, each split count in both dtypes: all pairs (tests/sampling.py)
@pairwise(("B, Hq, Hkv, Lq, lens", DECODE_CASES), ("num_splits", [1, 3, 7, None]), ("dtype", DTYPES))
def test_decode_matches_reference(B, Hq, Hkv, Lq, lens, num_splits, dtype):
    seqlens = torch.tensor(lens, dtype=torch.int32)
    q = randn(B, Hq, Lq, 64, dtype=dtype)
    k, v = nan_cache(B, Hkv, 70, 64, seqlens, dtype), nan_cache(B, Hkv, 70, 64, seqlens, dtype)
    o_ref, lse_ref = attention_ref(q, k, v, causal=True, kv_lens=seqlens, upcast=torch.float64)
    splits = num_splits or _choose_num_splits(B, Hkv, Hq // Hkv * Lq, 70, q.device)
    o, lse = run(q, k, v, seqlens, True, splits)
    assert_matches(o, lse, o_ref, lse_ref, dtype)
    o2, lse2 = decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits, return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse), "decode() must run the same launch, deterministically"


@pytest.mark.parametrize("dtype", DTYPES)
def test_forced_splits_agree_with_the_heuristic(dtype):
    "num_splits 1, 3, 7 give the heuristic's result up to summation order; the heuristic does split here."
    seqlens = torch.tensor([70, 9], dtype=torch.int32)
    q = randn(2, 8, 1, 64, dtype=dtype)
    k, v = nan_cache(2, 2, 70, 64, seqlens, dtype), nan_cache(2, 2, 70, 64, seqlens, dtype)
    chosen = _choose_num_splits(2, 2, 4, 70, q.device)
    assert chosen > 1 or DEVICE.type == "cuda"
    o_auto, lse_auto = decode(q, k, v, cache_seqlens=seqlens, return_lse=True)
    for splits in (1, 3, 7):
        o, lse = decode(q, k, v, cache_seqlens=seqlens, num_splits=splits, return_lse=True)
        torch.testing.assert_close(o.float(), o_auto.float(), atol=TOL[dtype][0], rtol=0)
        torch.testing.assert_close(lse, lse_auto, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_without_seqlens_decode_is_attention(causal):
    "cache_seqlens=None: every key valid; the result is attention's, bottom-right causal, for Lq ≤ Lk and Lq > Lk."
    for Lq, Lk in [(1, 50), (5, 50), (9, 4)]:
        q, k, v = randn(2, 4, Lq, 32), randn(2, 2, Lk, 32), randn(2, 2, Lk, 32)
        o, lse = run(q, k, v, None, causal, 3)
        o_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
        assert_matches(o, lse, o_ref, lse_ref, torch.float16)
        torch.testing.assert_close(o, attention(q, k, v, causal=causal), atol=2e-3, rtol=0)


def test_non_causal_with_seqlens():
    "Non-causal decode still stops at each sequence's length."
    seqlens = torch.tensor([3, 64], dtype=torch.int32)
    q, k, v = randn(2, 2, 4, 64), nan_cache(2, 2, 64, 64, seqlens), nan_cache(2, 2, 64, 64, seqlens)
    o, lse = run(q, k, v, seqlens, False, 2)
    assert_matches(o, lse, *attention_ref(q, k, v, kv_lens=seqlens, upcast=torch.float64), torch.float16)


def test_many_splits_more_than_tiles():
    "40 splits of a 70-key cache (5 tiles): 35+ empty splits, and a combine that loops over 16-split chunks."
    seqlens = torch.tensor([70, 2], dtype=torch.int32)
    q, k, v = randn(2, 4, 1, 64), nan_cache(2, 2, 70, 64, seqlens), nan_cache(2, 2, 70, 64, seqlens)
    o, lse = run(q, k, v, seqlens, True, 40)
    assert_matches(o, lse, *attention_ref(q, k, v, causal=True, kv_lens=seqlens, upcast=torch.float64), torch.float16)


@pytest.mark.parametrize("D", [8, 80, 256])
def test_head_dims(D):
    "Smallest, masked-column and largest head dims through the split path."
    seqlens = torch.tensor([40, 17], dtype=torch.int32)
    q, k, v = randn(2, 4, 2, D, dtype=torch.bfloat16), nan_cache(2, 2, 40, D, seqlens, torch.bfloat16), nan_cache(2, 2, 40, D, seqlens, torch.bfloat16)
    o, lse = run(q, k, v, seqlens, True, 3)
    assert_matches(o, lse, *attention_ref(q, k, v, causal=True, kv_lens=seqlens, upcast=torch.float64), torch.bfloat16)


def test_strided_caches():
    "A (B, L, H, D) cache seen as (B, H, L, D), sliced to fewer positions than it holds; q a strided view too."
    k_blhd, v_blhd = randn(2, 90, 2, 64), randn(2, 90, 2, 64)
    k, v = k_blhd.transpose(1, 2)[:, :, :60], v_blhd.transpose(1, 2)[:, :, :60]
    q = randn(2, 1, 8, 64).transpose(1, 2)                       # (B, Hq=8, Lq=1, D) view
    seqlens = torch.tensor([60, 31], dtype=torch.int32)
    o, lse = run(q, k, v, seqlens, True, 3)
    assert_matches(o, lse, *attention_ref(q, k, v, causal=True, kv_lens=seqlens, upcast=torch.float64), torch.float16)


def test_empty_caches_and_zero_sizes():
    "Lengths of 0 and Lmax = 0 give O = 0, lse = −∞; empty batch, heads or queries give empty outputs."
    q = randn(2, 4, 1, 32)
    for k in (nan_cache(2, 2, 20, 32, torch.tensor([0, 0])), randn(2, 2, 0, 32)):
        seqlens = torch.zeros(2, dtype=torch.int32)
        o, lse = decode(q, k, k, cache_seqlens=seqlens if k.shape[2] else None, num_splits=3, return_lse=True)
        assert o.abs().max().item() == 0.0 and (lse == float("-inf")).all()
    for B, Hq, Lq in [(0, 2, 1), (1, 2, 0)]:
        kv = randn(B, 2, 8, 32)
        o, lse = decode(randn(B, Hq, Lq, 32), kv, kv, return_lse=True)
        assert o.shape == (B, Hq, Lq, 32) and lse.shape == (B, Hq, Lq)


def test_int64_seqlens_and_public_names():
    seqlens = torch.tensor([5, 30], dtype=torch.int64)
    q, k, v = randn(2, 2, 1, 32), nan_cache(2, 2, 30, 32, seqlens), nan_cache(2, 2, 30, 32, seqlens)
    assert not decode(q, k, v, cache_seqlens=seqlens).isnan().any()
    assert triton_fa2.decode is decode and triton_fa2.merge_attention_states is merge_attention_states


BAD = [
    (dict(cache_seqlens=[3, 4]), TypeError, "cache_seqlens must be an int32 torch.Tensor"),
    (dict(cache_seqlens=torch.tensor([3.0, 4.0])), TypeError, "cache_seqlens must be an int32"),
    (dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ValueError, r"cache_seqlens must have shape \(2,\)"),
    (dict(cache_seqlens=torch.tensor([3, 31], dtype=torch.int32)), ValueError, r"must lie in \[0, Lmax=30\]"),
    (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "got min -1"),
    (dict(num_splits=0), ValueError, "num_splits must be between 1 and 1024"),
    (dict(num_splits=2.0), TypeError, "num_splits must be an int"),
    (dict(num_splits=True), TypeError, "num_splits must be an int"),
    (dict(causal=1), TypeError, "causal must be a bool"),
]


@pytest.mark.parametrize("kwargs, exc, message", BAD)
def test_bad_inputs(kwargs, exc, message):
    q, k = randn(2, 4, 1, 32), randn(2, 2, 30, 32)
    with pytest.raises(exc, match=message): decode(q, k, k, **kwargs)
    with pytest.raises(ValueError, match="Hq=4 and Hkv=3"): decode(q, randn(2, 3, 30, 32), randn(2, 3, 30, 32))
    with pytest.raises(TypeError, match="float16 or all torch.bfloat16"): decode(q.float(), k, k)


def test_heuristic():
    "FlashAttention-2's rule, including its own worked example, and bounds over many launches."
    assert num_splits_heuristic(48, 108, 64) == 2
    assert num_splits_heuristic(512, 132, 32) == 1 and num_splits_heuristic(106, 132, 64) == 1
    assert num_splits_heuristic(64, 132, 64) == 2 and num_splits_heuristic(8, 132, 256) == 14
    for programs in range(1, 200):
        for blocks in (1, 2, 7, 64, 256):
            assert 1 <= num_splits_heuristic(programs, 132, blocks) <= blocks


def test_merge_attention_states_over_chunks():
    "attention over [K1; K2] = merge(attention over K1, attention over K2), non-causal, fp16 and bf16, through the kernel."
    for dtype in DTYPES:
        q, k, v = randn(2, 4, 9, 64, dtype=dtype), randn(2, 2, 70, 64, dtype=dtype), randn(2, 2, 70, 64, dtype=dtype)
        o1, l1 = attention(q, k[:, :, :30], v[:, :, :30], return_lse=True)
        o2, l2 = attention(q, k[:, :, 30:], v[:, :, 30:], return_lse=True)
        o, lse = merge_attention_states(o1, l1, o2, l2)
        assert o.dtype == dtype and lse.dtype == torch.float32
        assert_matches(o, lse, *attention_ref(q, k, v, upcast=torch.float64), dtype)


def test_merge_attention_states_invisible_chunks():
    """Causal attention in two chunks of keys, each with the whole sequence's visibility: a row that cannot see chunk 2
    gets lse −∞ there, whatever that chunk's O holds (NaN here); a row that sees neither comes out O = 0, lse = −∞."""
    q, k, v = randn(1, 2, 6, 32), randn(1, 2, 40, 32), randn(1, 2, 40, 32)
    o_ref, lse_ref = attention_ref(q, k, v, causal=True, upcast=torch.float64)   # row i sees keys ≤ i + 34
    s = (q.double() @ k.double().transpose(-1, -2)) * 32 ** -0.5
    visible = torch.arange(40, device=q.device)[None, :] <= torch.arange(6, device=q.device)[:, None] + 34
    def part(lo, hi):
        sp = s[..., lo:hi].masked_fill(~visible[:, lo:hi], float("-inf"))
        lse = torch.logsumexp(sp, -1)
        return torch.exp(sp - lse.masked_fill(lse.isinf(), 0)[..., None]) @ v.double()[:, :, lo:hi], lse
    (o1, l1), (o2, l2) = part(0, 36), part(36, 40)
    assert l2[..., 0].isinf().all() and l2[..., 1].isinf().all()    # rows 0, 1 see none of keys 36 … 39
    o2[..., :2, :] = float("nan")
    o, lse = merge_attention_states(o1, l1, o2, l2)
    torch.testing.assert_close(o, o_ref); torch.testing.assert_close(lse, lse_ref)
    o, lse = merge_attention_states(o2, l2, o2, l2)
    assert (o[..., :2, :] == 0).all() and (lse[..., :2] == float("-inf")).all()


def test_merge_attention_states_bad_inputs():
    o, lse = randn(2, 3, 16), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one shape"): merge_attention_states(o, lse, o[:1], lse)
    with pytest.raises(ValueError, match="shape of o without its last dim"): merge_attention_states(o, lse, o, lse[:1])
    with pytest.raises(TypeError, match="lse_b must be a floating-point"): merge_attention_states(o, lse, o, lse.long())


def test_merge_attention_states_refuses_inf_and_nan_lse():
    "An lse of +inf or NaN would make the merge NaN: refused, naming the input, what it holds, and the convention (-inf)."
    o, lse = randn(2, 3, 16).float(), torch.zeros(2, 3, device=DEVICE)
    bad = lse.clone(); bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match=re.escape("lse_b must be finite or -inf (-inf marks a row that saw none of its part's keys), "
                                                   "got +inf at 1 of its 6 rows, the first at index (1, 2)")):
        merge_attention_states(o, lse, o, bad)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=re.escape("lse_a must be finite or -inf")) as e: merge_attention_states(o, bad, o, lse)
    assert "+inf at 1 and NaN at 1 of its 6 rows, the first at index (0, 0)" in str(e.value)
    empty = torch.full_like(lse, float("-inf"))                      # -inf is an empty part, not an error
    o_m, lse_m = merge_attention_states(o, lse, o * float("nan"), empty)
    assert torch.equal(o_m, o) and torch.equal(lse_m, lse)


def test_merge_attention_states_checks_values_only_outside_tracing():
    "Under torch.compile the value check is skipped (a traced graph cannot branch on values): one graph, no break."
    o1, o2 = randn(2, 5, 16).float(), randn(2, 5, 16).float()
    l1, l2 = torch.randn(2, 5, device=DEVICE), torch.randn(2, 5, device=DEVICE)
    explanation = torch._dynamo.explain(merge_attention_states)(o1, l1, o2, l2)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(merge_attention_states, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(o1, l1, o2, l2), merge_attention_states(o1, l1, o2, l2)): torch.testing.assert_close(got, want)


def test_merge_attention_states_dims():
    "A 0-D tensor is refused with what o must be; one row, o of shape (D,) and lse of shape (), merges."
    o, lse = randn(2, 3, 16).float(), torch.zeros(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match=re.escape("o_a must be a tensor of at least 1 dim, (..., L, D) with the head dim last, got a 0-D tensor")):
        merge_attention_states(o.sum(), lse.sum(), o, lse)
    with pytest.raises(ValueError, match="o_b must be a tensor of at least 1 dim"):
        merge_attention_states(o, lse, o.sum(), lse.sum())
    o_row, lse_row = merge_attention_states(o[0, 0], lse[0, 0], o[1, 0], lse[1, 0])
    torch.testing.assert_close(o_row, (o[0, 0] + o[1, 0]) / 2); torch.testing.assert_close(lse_row, torch.tensor(math.log(2), device=DEVICE))


def test_decode_causal_heads_and_layout():
    "causal: a NumPy bool is converted, other types named; no KV head refused; flash-attn's (B, L, H, D) cache named."
    q, k = randn(2, 4, 3, 32), randn(2, 2, 30, 32)
    assert torch.equal(decode(q, k, k, causal=np.True_), decode(q, k, k, causal=True))
    assert torch.equal(decode(q, k, k, causal=np.False_), decode(q, k, k, causal=False))
    with pytest.raises(TypeError, match="causal must be a bool, got numpy.int64"): decode(q, k, k, causal=np.int64(1))
    with pytest.raises(ValueError, match="k and v have 0 heads, got Hq=0 and Hkv=0"): decode(q[:, :0], k[:, :0], k[:, :0])
    with pytest.raises(ValueError, match=re.escape("If these are flash-attn's (B, L, H, D) tensors (q (2, 3, 4, 32), k_cache (2, 30, 2, 32), "
                                                   "v_cache (2, 30, 2, 32)): decode takes (B, H, L, D); pass q.transpose(1, 2), "
                                                   "k_cache.transpose(1, 2), v_cache.transpose(1, 2)")):
        decode(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("B, Hq, Hkv, Lmax, D", [(8, 32, 8, 8192, 128), (1, 32, 8, 32768, 128), (64, 32, 8, 4096, 128),
                                                 (16, 16, 16, 3000, 64)])
@pytest.mark.parametrize("Lq", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_decode_shapes(B, Hq, Hkv, Lmax, D, Lq, dtype):
    "Serving's decode shapes, ragged lengths (1 and Lmax included), NaN past them; sampled sequences vs float32."
    seqlens = torch.randint(1, Lmax + 1, (B,), device="cuda", dtype=torch.int32)
    seqlens[0], seqlens[-1] = (1, Lmax) if B > 1 else (Lmax, Lmax)
    q = randn(B, Hq, Lq, D, dtype=dtype)
    k, v = nan_cache(B, Hkv, Lmax, D, seqlens, dtype), nan_cache(B, Hkv, Lmax, D, seqlens, dtype)
    o, lse = run(q, k, v, seqlens, True, _choose_num_splits(B, Hkv, Hq // Hkv * Lq, Lmax, q.device))
    for b in sorted({0, B // 2, B - 1}):
        o_ref, lse_ref = attention_ref(q[b:b+1], k[b:b+1], v[b:b+1], causal=True, kv_lens=seqlens[b:b+1])
        max_abs, rel = errors(o[b:b+1], o_ref.double())
        assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (b, max_abs, rel)
        torch.testing.assert_close(lse[b:b+1], lse_ref, atol=1e-4, rtol=1e-4)
    o1, _ = run(q, k, v, seqlens, True, 1)                  # unsplit: the same answer
    assert (o1.float() - o.float()).abs().max().item() <= TOL[dtype][0]


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 5])   # 1: the kernel writes o in q's dtype and lse itself; 5: fp32 partials
def test_gpu_every_decode_candidate(num_splits):
    "Whichever decode candidate the dispatcher picks must be right, with and without splits."
    seqlens = torch.tensor([1, 777, 3000], device="cuda", dtype=torch.int32)
    for config in cands.DECODE:
        for D, Lq in [(128, 1), (64, 4), (256, 2)]:
            if cands._smem_bytes(dec._decode_block_m(4 * Lq), config.BLOCK_N, D, config.num_stages) > cands._max_smem(0): continue
            q = randn(3, 8, Lq, D, dtype=torch.bfloat16)
            k, v = nan_cache(3, 2, 3000, D, seqlens, torch.bfloat16), nan_cache(3, 2, 3000, D, seqlens, torch.bfloat16)
            o, lse = run(q, k, v, seqlens, True, num_splits, config)
            o_ref, lse_ref = attention_ref(q, k, v, causal=True, kv_lens=seqlens, upcast=torch.float64)
            max_abs, rel = errors(o, o_ref)
            assert max_abs <= TOL[torch.bfloat16][0] and rel <= TOL[torch.bfloat16][1], ((n, w, s), D, max_abs, rel)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_growing_lengths():
    "One captured decode step replays correctly as the lengths change in place: the grid never depends on them."
    B, Hq, Hkv, Lmax, D = 4, 32, 8, 4096, 128
    q = randn(B, Hq, 1, D, dtype=torch.bfloat16)
    k, v = randn(B, Hkv, Lmax, D, dtype=torch.bfloat16), randn(B, Hkv, Lmax, D, dtype=torch.bfloat16)
    seqlens = torch.tensor([10, 100, 1000, 4000], device="cuda", dtype=torch.int32)
    decode(q, k, v, cache_seqlens=seqlens); torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = decode(q, k, v, cache_seqlens=seqlens)
    for step in range(4):
        seqlens.add_(333).clamp_(max=Lmax)
        q.copy_(randn(B, Hq, 1, D, dtype=torch.bfloat16))
        graph.replay()
        assert torch.equal(o_graph, decode(q, k, v, cache_seqlens=seqlens)), step


def test_plain_eager_decode_equals_the_operator():
    "A plain eager call runs the operator's implementation directly; under a dispatch mode the operator runs: same bits."
    from torch.utils.flop_counter import FlopCounterMode
    q = torch.randn(2, 4, 1, 32, device=DEVICE).half()
    k, v = (torch.randn(2, 2, 70, 32, device=DEVICE).half() for _ in range(2))
    seqlens = torch.tensor([70, 33], dtype=torch.int32, device=DEVICE)
    o = decode(q, k, v, cache_seqlens=seqlens, num_splits=3)
    with FlopCounterMode(display=False): o_op = decode(q, k, v, cache_seqlens=seqlens, num_splits=3)
    assert torch.equal(o, o_op)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_every_decode_candidate_at_batch_64(dtype):
    """(64, 32/8, 4096), Lq = 1, unsplit, with every candidate: the shape whose test failed when decode's candidates were
    first timed in CUDA graphs. Every candidate is right; the cause was the graph timing's race with the caches still
    being written (it fails without `_graph_ms`'s wait, and passes with it)."""
    B, Hq, Hkv, Lmax, D = 64, 32, 8, 4096, 128
    seqlens = torch.randint(1, Lmax + 1, (B,), device="cuda", dtype=torch.int32)
    seqlens[0], seqlens[-1] = 1, Lmax
    q = randn(B, Hq, 1, D, dtype=dtype)
    k, v = nan_cache(B, Hkv, Lmax, D, seqlens, dtype), nan_cache(B, Hkv, Lmax, D, seqlens, dtype)
    bad = []
    for config in cands.DECODE:
        o, lse = run(q, k, v, seqlens, True, 1, config)
        for b in (0, B // 2, B - 1):
            o_ref, _ = attention_ref(q[b:b+1], k[b:b+1], v[b:b+1], causal=True, kv_lens=seqlens[b:b+1])
            max_abs, rel = errors(o[b:b+1], o_ref.double())
            if not (max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1]): bad.append((config.label, b, max_abs, rel))
    assert not bad, bad


def test_a_given_decode_config_launches_with_all_its_options(monkeypatch):
    "As for the forward kernel: a decode candidate's register cap reaches the launch."
    from test_attention import _RecordLaunch
    recorder = _RecordLaunch()
    monkeypatch.setattr(dec, "_decode_fwd", recorder)
    q, k, v = randn(2, 4, 1, 64), randn(2, 2, 100, 64), randn(2, 2, 100, 64)
    config = Candidate("decode", 0, 32, 4, 3, maxnreg=96)
    o, lse = torch.empty_like(q), torch.empty(2, 4, 1, device=q.device)
    _decode_forward(q, k, v, None, o, lse, True, 0.125, 1, config)
    assert {k: recorder.options[k] for k in ("BLOCK_N", "num_warps", "num_stages", "maxnreg")} == \
        dict(BLOCK_N=32, num_warps=4, num_stages=3, maxnreg=96)


def test_decode_launch_passes_triton_3_6s_launcher_arguments(monkeypatch):
    """The arguments a `_DecodeLaunch` hands to Triton's C launcher, in Triton 3.6's order: grid, stream, function,
    flags, scratch, metadata, hooks, then the new tensors and the first launch's scalars and constants; the combine's
    launch follows on the same stream when keys are split. (The GPU test below checks the same launches against float64.)"""
    from test_attention import _FakeDriver, _fake_compiled_kernel
    monkeypatch.setattr(dec.triton.runtime.driver, "_active", _FakeDriver())
    split_calls, combine_calls = [], []
    split_kernel = _fake_compiled_kernel(lambda *a: split_calls.append(a), descriptors=False)
    combine_kernel = _fake_compiled_kernel(lambda *a: combine_calls.append(a), descriptors=False)
    first = [randn(2, 4, 1, 64), randn(2, 2, 100, 64), randn(2, 2, 100, 64), torch.empty(3, 2, 4, 1, 64), torch.empty(3, 2, 4, 1),
             torch.zeros(2, dtype=torch.int32)]
    split_args = first + list(range(200, len(dec._DECODE_FWD_ARGS) - len(first) + 200))   # scalars and constants: markers
    combine_args = [first[3], first[4], torch.empty(2, 4, 1, 64), torch.empty(2, 4, 1)] + list(range(300, 310))
    assert len(combine_args) == len(dec._COMBINE_ARGS)
    plan = fast._DecodeLaunch(split_kernel, 16, split_args, combine_kernel, 8, combine_args)
    new = [randn(2, 4, 1, 64), randn(2, 2, 100, 64), randn(2, 2, 100, 64), torch.zeros(2, dtype=torch.int32),
           torch.empty(3, 2, 4, 1, 64), torch.empty(3, 2, 4, 1), torch.empty(2, 4, 1, 64), torch.empty(2, 4, 1)]
    q, k, v, seqlens, o_part, lse_part, o, lse = new
    plan(*new)
    head = lambda grid: (grid, 1, 1, 77, 1234, False, False, None, None, "packed", None, None, None)
    want_split = (*head(16), q, k, v, o_part, lse_part, seqlens, *split_args[6:])
    want_combine = (*head(8), o_part, lse_part, o, lse, *combine_args[4:])
    same = lambda got, want: len(got) == len(want) and all(a is b or a == b for a, b in zip(got, want))
    assert len(split_calls) == 1 and same(split_calls[0], want_split)
    assert len(combine_calls) == 1 and same(combine_calls[0], want_combine)
    unsplit = fast._DecodeLaunch(split_kernel, 16, split_args, None, 0, combine_args)   # S = 1: the split kernel alone
    unsplit(*new)
    assert len(split_calls) == 2 and len(combine_calls) == 1


def test_decode_plan_key_separates_what_triton_specialises_on():
    "Two calls share a saved launch only if everything but the data pointers' values agrees."
    q, k = randn(2, 4, 1, 64), randn(2, 2, 100, 64)
    o, lse, seqlens = torch.empty_like(q), torch.empty(2, 4, 1), torch.tensor([5, 100], dtype=torch.int32)
    key = lambda *a, **kw: fast._decode_plan_key(*a, **kw)
    base = key(q, k, k, None, o, lse, True, 0.125, 3)
    assert base == key(randn(2, 4, 1, 64), randn(2, 2, 100, 64), k, None, torch.empty_like(q), torch.empty(2, 4, 1), True, 0.125, 3)
    others = [key(q, k, k, seqlens, o, lse, True, 0.125, 3),                               # lengths given
              key(q, k, k, None, o, lse, False, 0.125, 3),                                 # non-causal
              key(q, k, k, None, o, lse, True, 0.25, 3),                                   # another scale
              key(q, k, k, None, o, lse, True, 0.125, 1),                                  # no split
              key(q, randn(2, 2, 200, 64)[:, :, :100], k, None, o, lse, True, 0.125, 3),   # a slice of a longer cache: strides
              key(randn(2 * 4 * 64 + 1)[1:].view(2, 4, 1, 64), k, k, None, o, lse, True, 0.125, 3),   # q misaligned
              key(q.bfloat16(), k.bfloat16(), k.bfloat16(), None, o.bfloat16(), lse, True, 0.125, 3)]   # dtype
    assert base not in others and len(set(others)) == len(others)


# Saved decode launches: every case runs three times with fresh inputs into NaN-poisoned outputs; call 1 tunes and
# Triton launches (the plan is kept), calls 2 and 3 go through `_DecodeLaunch`.
DECODE_PLAN_CASES = [
    ((8, 32, 8, 1, 8192, 128), None, "bhld"),       # the heuristic splits (2): split kernel and combine, full caches
    ((1, 32, 8, 1, 32768, 128), "ragged", "bhld"),  # B = 1, many splits, lengths given (int32 pointer)
    ((4, 16, 16, 4, 3000, 64), "ragged", "blhd"),   # MHA, Lq = 4, caches seen through transpose(1, 2)
    ((64, 32, 8, 1, 4096, 128), "ragged", "bhld"),  # no split: the kernel writes o and lse itself
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, lengths, layout", DECODE_PLAN_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_saved_decode_launches(shape, lengths, layout, dtype, monkeypatch):
    B, Hq, Hkv, Lq, Lmax, D = shape
    monkeypatch.setattr(dispatch, "_DECODE_PLANS", {})
    calls = []
    original = fast._DecodeLaunch.__call__
    monkeypatch.setattr(fast._DecodeLaunch, "__call__", lambda self, *a: (calls.append(len(self.launches)), original(self, *a))[1])
    splits = _choose_num_splits(B, Hkv, Hq // Hkv * Lq, Lmax, torch.device("cuda"))
    for _ in range(3):
        seqlens = None
        if lengths:
            seqlens = torch.randint(1, Lmax + 1, (B,), device="cuda", dtype=torch.int32)
            seqlens[-1] = Lmax
        if layout == "blhd":
            k, v = (randn(B, Lmax, Hkv, D, dtype=dtype).transpose(1, 2) for _ in range(2))
        else:
            k, v = randn(B, Hkv, Lmax, D, dtype=dtype), randn(B, Hkv, Lmax, D, dtype=dtype)
        q = randn(B, Hq, Lq, D, dtype=dtype)
        o, lse = run(q, k, v, seqlens, True, splits)
        for b in sorted({0, B - 1}):
            o_ref, lse_ref = attention_ref(q[b:b+1], k[b:b+1], v[b:b+1], causal=True,
                                           kv_lens=None if seqlens is None else seqlens[b:b+1])
            max_abs, rel = errors(o[b:b+1], o_ref.double())
            assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (b, max_abs, rel)
            torch.testing.assert_close(lse[b:b+1], lse_ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(decode(q, k, v, cache_seqlens=seqlens, num_splits=splits), o)   # the public path: same plan
    assert calls == [1 + (splits > 1)] * 5, (calls, splits)


@pytest.mark.gpu
def test_gpu_saved_decode_launch_on_another_stream(monkeypatch):
    "The saved launch runs on the caller's current stream, as Triton's would."
    monkeypatch.setattr(dispatch, "_DECODE_PLANS", {})
    q, k, v = randn(2, 32, 1, 128, dtype=torch.bfloat16), randn(2, 8, 4096, 128, dtype=torch.bfloat16), randn(2, 8, 4096, 128, dtype=torch.bfloat16)
    o = decode(q, k, v); decode(q, k, v)
    assert dispatch._DECODE_PLANS and all(dispatch._DECODE_PLANS.values())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        o_side = decode(q, k, v)
    stream.synchronize()
    assert torch.equal(o_side, o)
