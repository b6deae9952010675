"""Inputs at the edges, each against float64 on small shapes through Triton's interpreter:

- the backward at logits far from zero: gradients that turn NaN or lose their digits where the scores are large
  (q·k past fp16's range), dense and packed sequences;
- split keys over a paged cache with ragged lengths: NaN past each row's length (in the last used page, and in the pages
  the block table names past it) must stay out of every split, and splits that hold no key must drop out of the combine;
- scores past fp16's range in the decode kernel (split and not, contiguous and paged) and the packed-sequence kernel
  (the dense kernel's own test is in test_attention.py).

Large scores are made without making the softmax one-hot: column 0 of every query holds 60000 and column 0 of every key
holds 2, so each raw q·k gains 120000 (past fp16's 65504) and each row's scores shift by the same constant. The softmax,
the output and the gradients are those of moderate scores; only the LSE moves, by that constant. A softmax scale of 1/64
(the other columns ×3 to keep the softmax spread) puts the scaled scores near 1900, where float32 still resolves 10⁻⁴:
the error left is the kernel's, not float32's (near 15000, any float32 score is 10⁻³ off, P by 0.1 %).
"""
import pytest
import torch

import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
from triton_fa2 import flash_attn_varlen_func, flash_attn_with_kvcache
from triton_fa2.backward import attention_backward_ref
from triton_fa2.dispatch import _attention_backward, _attention_forward, _decode_forward, _varlen_backward, _varlen_forward
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device
from sampling import pairwise

device = default_device()
DTYPES = [torch.float16, torch.bfloat16]
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}       # forward: max |o − o_ref| / max(1, max |o_ref|)
GRAD_TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}   # backward: ‖g − ref‖ / ‖ref‖ per gradient
SHIFT_Q, SHIFT_K = 60000.0, 2.0                          # raw q·k + 120000: past fp16's 65504 in every score
SCALE = 1 / 64                                            # scaled shift 1875: float32 resolves 1.2e-4 there


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


def shifted(q, k):
    "q, k with column 0 set to SHIFT_Q, SHIFT_K: every score of a row gains the same constant, past fp16's range raw."
    q, k = q * 3, k * 3                                  # at SCALE, a softmax as spread as scale 1/√D gives unit inputs
    q[..., 0], k[..., 0] = SHIFT_Q, SHIFT_K
    D = q.shape[-1]
    assert (q.reshape(-1, D).double() @ k.reshape(-1, D).double().T).min() > 65504
    return q, k


def rel_error(g, ref) -> float:
    return ((g.double() - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def out_error(o, o_ref) -> float:
    return ((o.double() - o_ref).abs().max() / o_ref.abs().max().clamp(min=1)).item() if o_ref.numel() else 0.0


# --- the backward at large logits ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_with_scores_past_fp16_range(dtype, causal):
    """NaN or inaccurate gradients at large logits: every raw q·k is past fp16's range (shifted by 120000, scaled to
    1875), the softmax itself moderate. The dispatcher's backward, into NaN-poisoned gradients, against float64
    formulas; rows that see no key (Lq > Lk causal) among them. A kernel that forms S or dS in the inputs' dtype, or
    recomputes P from a low-precision LSE, turns these into inf, NaN, or P off by percents. dO is ×1/4 so that the
    true dK (column 0 is SCALE · 60000 · Σᵢ dS) stays inside fp16's range: an inf there would be the dtype's, not a bug."""
    B, Hq, Hkv, Lq, Lk, D = 1, 4, 2, 45, 30, 64
    q, k = shifted(randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype))
    v, do = randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hq, Lq, D, dtype=dtype) * 0.25
    scale = SCALE
    o, lse = torch.full_like(q, float("nan")), torch.full((B, Hq, Lq), float("nan"), device=device)
    _attention_forward(q, k, v, o, lse, causal, scale)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, scale=scale, upcast=torch.float64)
    assert not o.isnan().any() and not lse.isnan().any()
    assert out_error(o, o_ref) <= TOL[dtype]
    finite = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), finite) and (lse.double()[finite] - lse_ref[finite]).abs().max() <= 1e-2
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    _attention_backward(do, q, k, v, o, lse, None, *grads, causal, scale)
    for name, g, ref in zip(("dq", "dk", "dv"), grads, attention_backward_ref(q, k, v, do, causal=causal, scale=scale)):
        assert ref.abs().max() < 65504 / 2, f"{name}: the true gradient itself is outside fp16's range"
        assert g.isfinite().all(), f"{name}: NaN or inf (or an element left unwritten)"
        assert rel_error(g, ref) <= GRAD_TOL[dtype], (name, rel_error(g, ref))
    if causal: assert (grads[0][:, :, :Lq - Lk] == 0).all(), "rows that see no key: dq = 0"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_backward_with_one_hot_rows_stays_finite(dtype):
    """NaN gradients at large logits: inputs ×30, scaled scores in the hundreds, each row's softmax one key. Every
    gradient finite; dV (Pᵀ·dO, well conditioned) within tolerance in both dtypes, dQ and dK in fp16. (In bf16, dS =
    P·(dP − Δ) cancels to a few bits where P is one-hot: any kernel that forms Δ from O in the inputs' dtype loses them.)"""
    B, H, Lq, Lk, D = 1, 2, 45, 70, 64
    q, k, v = (randn(B, H, L, D, dtype=dtype) * 30 for L in (Lq, Lk, Lk))
    do = randn(B, H, Lq, D, dtype=dtype)
    for causal in (False, True):
        o, lse = torch.full_like(q, float("nan")), torch.full((B, H, Lq), float("nan"), device=device)
        _attention_forward(q, k, v, o, lse, causal, D ** -0.5)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        _attention_backward(do, q, k, v, o, lse, None, *grads, causal, D ** -0.5)
        refs = attention_backward_ref(q, k, v, do, causal=causal)
        for name, g, ref in zip(("dq", "dk", "dv"), grads, refs):
            assert g.isfinite().all(), f"{name}: NaN or inf (or an element left unwritten)"
            if name == "dv" or dtype == torch.float16: assert rel_error(g, ref) <= GRAD_TOL[dtype], (name, causal, rel_error(g, ref))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_packed_sequences_backward_with_scores_past_fp16_range(dtype):
    """NaN or inaccurate gradients at large logits, through the packed-sequence kernels: ragged lengths (one query, a
    sequence with no keys, chunked prefill), causal, every raw q·k past fp16's range. Into NaN-poisoned outputs and
    gradients; each sequence against the float64 formulas alone."""
    lengths_q, lengths_k, Hq, Hkv, D = [13, 1, 4, 30], [13, 9, 0, 41], 4, 2, 32
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_q, cu_k = cu(lengths_q), cu(lengths_k)
    q, k = shifted(randn(sum(lengths_q), Hq, D, dtype=dtype), randn(sum(lengths_k), Hkv, D, dtype=dtype))
    v, do = randn(sum(lengths_k), Hkv, D, dtype=dtype), randn(sum(lengths_q), Hq, D, dtype=dtype) * 0.25
    scale = SCALE
    o, lse = torch.full_like(q, float("nan")), torch.full((Hq, q.shape[0]), float("nan"), device=device)
    _varlen_forward(q, k, v, o, lse, cu_q, cu_k, max(lengths_k), True, scale)
    assert not o.isnan().any() and not lse.isnan().any()
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    _varlen_backward(do, q, k, v, o, lse, None, cu_q, cu_k, max(lengths_k), *grads, True, scale)
    seq = lambda t, a, z: t[a:z].transpose(0, 1)[None]
    for b in range(len(lengths_q)):
        (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        o_ref, lse_ref = attention_ref(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), causal=True, scale=scale,
                                       upcast=torch.float64)
        assert out_error(seq(o, q0, q1), o_ref) <= TOL[dtype], b
        finite = lse_ref[0].isfinite()
        assert torch.equal(lse[:, q0:q1].isfinite(), finite)
        if finite.any(): assert (lse[:, q0:q1].double()[finite] - lse_ref[0][finite]).abs().max() <= 1e-2
        refs = attention_backward_ref(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), seq(do, q0, q1), causal=True, scale=scale)
        for name, g, ref in zip(("dq", "dk", "dv"), (seq(grads[0], q0, q1), seq(grads[1], k0, k1), seq(grads[2], k0, k1)), refs):
            assert ref.abs().max() < 65504 / 2 if ref.numel() else True
            assert g.isfinite().all(), f"sequence {b}, {name}: NaN or inf (or an element left unwritten)"
            if ref.numel() and ref.norm() > 0: assert rel_error(g, ref) <= GRAD_TOL[dtype], (b, name, rel_error(g, ref))
            else: assert (g == 0).all(), (b, name)


# --- split keys over a paged cache with ragged lengths ----------------------------------------------------------------

def paged_with_garbage(dense, lengths, page_size, spare=2, seed=0):
    """A pool of pages for a dense (B, Lmax, H, D) cache: each row's pages scattered, every position past the row's
    length NaN (the rest of its last page and every page its table names after that), and spare pages of NaN."""
    B, Lmax, H, D = dense.shape
    per_row = -(-Lmax // page_size)
    order = torch.randperm(B * per_row + spare, generator=torch.Generator().manual_seed(seed))
    pool = torch.full((B * per_row + spare, page_size, H, D), float("nan"), dtype=dense.dtype, device=dense.device)
    table = order[:B * per_row].view(B, per_row).to(torch.int32).to(dense.device)
    for b in range(B):
        for j in range(int(lengths[b])): pool[table[b, j // page_size], j % page_size] = dense[b, j]
    return pool, table


# each page size with each split count and each call, each split count with each call: all pairs (tests/sampling.py)
@pairwise(("page_size", [7, 16], ["page7", "page16"]), ("num_splits", [2, 6], ["2-splits", "6-splits"]),
          ("Lq,Lnew", [(1, 0), (3, 2)], ["decode", "append-then-attend"]))
def test_split_keys_over_a_paged_ragged_cache(page_size, num_splits, Lq, Lnew):
    """Split-KV with paging with per-row lengths: NaN past each row's length (in its last page and in the pages its
    table names after it) must not reach any split's P·V, and splits that hold no key (a row of 0 or 1 keys over 6
    splits) must drop out of the combine (LSE −∞ there, never lse − lse_max = NaN). GQA 2:1, causal, fp16, new tokens
    appended through the table first; each row against float64 on its own keys, O = 0 and LSE = −∞ where it sees none."""
    B, Hq, Hkv, D, Lmax = 4, 4, 2, 32, 45
    lengths = torch.tensor([0, 1, 23, 40], dtype=torch.int32)
    dense_k, dense_v = (randn(B, Lmax, Hkv, D) for _ in range(2))
    (k_pool, table), (v_pool, _) = paged_with_garbage(dense_k, lengths, page_size), paged_with_garbage(dense_v, lengths, page_size)
    q = randn(B, Lq, Hq, D)
    new = [randn(B, Lnew, Hkv, D) for _ in range(2)] if Lnew else [None, None]
    out, lse = flash_attn_with_kvcache(q, k_pool, v_pool, *new, cache_seqlens=lengths.to(device), block_table=table,
                                       causal=True, num_splits=num_splits, return_softmax_lse=True)
    assert not out.isnan().any() and not lse.isnan().any(), "garbage past a row's length, or an empty split, leaked NaN"
    for b in range(B):
        n = int(lengths[b])
        keys, values = dense_k[b, :n], dense_v[b, :n]
        if Lnew: keys, values = torch.cat([keys, new[0][b]]), torch.cat([values, new[1][b]])
        o_ref, lse_ref = attention_ref(q[b:b + 1].transpose(1, 2), keys[None].transpose(1, 2), values[None].transpose(1, 2),
                                       causal=True, upcast=torch.float64)
        assert out_error(out[b:b + 1].transpose(1, 2), o_ref) <= TOL[torch.float16], b
        finite = lse_ref[0].isfinite()
        assert torch.equal(lse[b].isfinite(), finite), b
        if finite.any(): assert (lse[b].double()[finite] - lse_ref[0][finite]).abs().max() <= 1e-3, b
        if not finite.any(): assert (out[b] == 0).all(), b


# --- scores past fp16's range in the decode and packed-sequence kernels ---------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["unsplit", "3-splits"])
def test_decode_with_scores_past_fp16_range(dtype, num_splits):
    """fp16 overflow in QKᵀ in the decode kernel: every raw q·k past 65504, ragged lengths with NaN past them, split
    and not; into NaN-poisoned O and LSE, against float64. The split partials and their combine hold LSEs near 15000:
    merged in low precision they would lose the output's digits."""
    B, Hq, Hkv, Lq, Lmax, D = 3, 4, 2, 2, 50, 64
    lengths = torch.tensor([50, 17, 1], dtype=torch.int32, device=device)
    q, k_cache = shifted(randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lmax, D, dtype=dtype))
    v_cache = randn(B, Hkv, Lmax, D, dtype=dtype)
    past = torch.arange(Lmax, device=device)[None, :] >= lengths[:, None]
    k_cache, v_cache = (t.masked_fill(past[:, None, :, None], float("nan")) for t in (k_cache, v_cache))
    o, lse = torch.full_like(q, float("nan")), torch.full((B, Hq, Lq), float("nan"), device=device)
    _decode_forward(q, k_cache, v_cache, lengths, o, lse, True, SCALE, num_splits)
    o_ref, lse_ref = attention_ref(q, k_cache, v_cache, causal=True, scale=SCALE, kv_lens=lengths, upcast=torch.float64)
    assert not o.isnan().any() and not lse.isnan().any()
    assert out_error(o, o_ref) <= TOL[dtype]
    finite = lse_ref.isfinite()                                  # the row of one key: its first query sees none
    assert torch.equal(lse.isfinite(), finite) and (lse.double()[finite] - lse_ref[finite]).abs().max() <= 1e-2


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_paged_kvcache_with_scores_past_fp16_range(dtype):
    "fp16 overflow in QKᵀ through flash_attn_with_kvcache over pages of 7 with 3 splits: as the float64 reference."
    B, Hq, Hkv, Lq, Lmax, D = 2, 4, 2, 1, 30, 32
    lengths = torch.tensor([30, 11], dtype=torch.int32)
    q, dense_k = shifted(randn(B, Lq, Hq, D, dtype=dtype), randn(B, Lmax, Hkv, D, dtype=dtype))
    dense_v = randn(B, Lmax, Hkv, D, dtype=dtype)
    (k_pool, table), (v_pool, _) = paged_with_garbage(dense_k, lengths, 7), paged_with_garbage(dense_v, lengths, 7)
    out, lse = flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lengths.to(device), block_table=table,
                                       causal=True, num_splits=3, return_softmax_lse=True, softmax_scale=SCALE)
    assert not out.isnan().any() and not lse.isnan().any()
    o_ref, lse_ref = attention_ref(q.transpose(1, 2), dense_k.transpose(1, 2), dense_v.transpose(1, 2), causal=True,
                                   scale=SCALE, kv_lens=lengths.to(device), upcast=torch.float64)
    assert out_error(out.transpose(1, 2), o_ref) <= TOL[dtype]
    assert (lse.double() - lse_ref).abs().max() <= 1e-2


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_packed_sequences_with_scores_past_fp16_range(dtype):
    """fp16 overflow in QKᵀ in the packed-sequence kernel, through flash_attn_varlen_func: ragged lengths, one query,
    chunked prefill, causal and not, every raw q·k past 65504; each sequence against float64 alone."""
    lengths_q, lengths_k, Hq, Hkv, D = [37, 1, 20], [37, 30, 50], 4, 2, 64
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_q, cu_k = cu(lengths_q), cu(lengths_k)
    q, k = shifted(randn(sum(lengths_q), Hq, D, dtype=dtype), randn(sum(lengths_k), Hkv, D, dtype=dtype))
    v = randn(sum(lengths_k), Hkv, D, dtype=dtype)
    seq = lambda t, a, z: t[a:z].transpose(0, 1)[None]
    for causal in (False, True):
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                             softmax_scale=SCALE, return_attn_probs=True)
        assert not out.isnan().any() and not lse.isnan().any()
        for b in range(len(lengths_q)):
            (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
            o_ref, lse_ref = attention_ref(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), causal=causal, scale=SCALE,
                                           upcast=torch.float64)
            assert out_error(seq(out, q0, q1), o_ref) <= TOL[dtype], (causal, b)
            assert (lse[:, q0:q1].double() - lse_ref[0]).abs().max() <= 1e-2, (causal, b)


# --- K and V with strides of their own --------------------------------------------------------------------------------

def test_k_and_v_with_different_strides():
    """A kernel that addresses V with K's strides (they agree whenever both come from one layout) reads the wrong
    values the moment they differ: K (B, L, H, D) contiguous, V a (B, H, L, D) tensor seen as (B, L, H, D), and a slice
    of heads of a wider buffer. Through flash_attn_func forward and backward, flash_attn_with_kvcache (contiguous and
    paged) and flash_attn_varlen_func, each against float64; gradients land in V's own layout."""
    B, L, Hq, Hkv, D = 2, 37, 4, 2, 32
    q = randn(B, L, Hq, D)
    k = randn(B, L, Hkv, D)                                          # contiguous
    v = randn(B, Hkv, L, D).transpose(1, 2)                          # heads outermost: strides unlike k's
    assert k.stride() != v.stride()
    do = randn(B, L, Hq, D) * 0.25
    as_bhld = lambda t: t.transpose(1, 2)
    q_, k_, v_ = (t.detach().clone().requires_grad_() for t in (q, k, v))
    for causal in (False, True):
        out = triton_fa2.flash_attn_func(q_, k_, v_, causal=causal)
        o_ref, _ = attention_ref(as_bhld(q), as_bhld(k), as_bhld(v), causal=causal, upcast=torch.float64)
        assert out_error(as_bhld(out), o_ref) <= TOL[torch.float16], causal
        grads = torch.autograd.grad(out, (q_, k_, v_), do)
        assert grads[2].stride() == v.stride(), "dV in V's own layout"
        refs = attention_backward_ref(as_bhld(q), as_bhld(k), as_bhld(v), as_bhld(do), causal=causal)
        for name, g, ref in zip(("dq", "dk", "dv"), grads, refs):
            assert rel_error(as_bhld(g), ref) <= GRAD_TOL[torch.float16], (causal, name, rel_error(as_bhld(g), ref))
    lengths = torch.tensor([37, 9], dtype=torch.int32, device=device)    # a cache, V again in its own layout
    qd = randn(B, 1, Hq, D)
    out = flash_attn_with_kvcache(qd, k, v, cache_seqlens=lengths, causal=True)
    o_ref, _ = attention_ref(as_bhld(qd), as_bhld(k), as_bhld(v), causal=True, kv_lens=lengths, upcast=torch.float64)
    assert out_error(as_bhld(out), o_ref) <= TOL[torch.float16]
    (k_pool, table), (v_pool, _) = paged_with_garbage(k, lengths.cpu(), 16), paged_with_garbage(v, lengths.cpu(), 16)
    v_pool = v_pool.transpose(1, 2).contiguous().transpose(1, 2)      # pages of (H, page, D): strides unlike k_pool's
    assert k_pool.stride() != v_pool.stride()
    out = flash_attn_with_kvcache(qd, k_pool, v_pool, cache_seqlens=lengths, block_table=table, causal=True)
    assert out_error(as_bhld(out), o_ref) <= TOL[torch.float16]
    wide = randn(B * L, 2 * Hkv, D)                                    # packed sequences: V a slice of heads
    kp, vp = randn(B * L, Hkv, D), wide[:, Hkv:]
    assert kp.stride() != vp.stride()
    qp = randn(B * L, Hq, D)
    cu = torch.tensor([0, L, 2 * L], dtype=torch.int32, device=device)
    out = flash_attn_varlen_func(qp, kp, vp, cu, cu, L, L, causal=True)
    for b in range(B):
        seq = lambda t: t[b * L:(b + 1) * L].transpose(0, 1)[None]
        o_ref, _ = attention_ref(seq(qp), seq(kp), seq(vp), causal=True, upcast=torch.float64)
        assert out_error(seq(out), o_ref) <= TOL[torch.float16], b
