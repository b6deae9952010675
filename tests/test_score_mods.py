"""Sliding windows, softcapping, ALiBi and attention sinks (chapter 14) in the forward kernel, against `attention_ref`
in float64 with exactly flash-attn's semantics; each alone and combined, with causal, GQA, packed GQA rows, Lq ≠ Lk,
odd lengths; the tile skipping of windows; and the errors for bad arguments.

CPU (CI): the kernel through Triton's interpreter on small shapes. `pytest -m gpu` repeats a larger matrix on the GPU.
"""
import itertools

import pytest
import torch

import triton_fa2
import triton_fa2.forward as fwd
from triton_fa2.candidates import Candidate
from triton_fa2.dispatch import _attention_forward
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device

DEVICE = default_device()
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}    # max |o − o_ref| / max(1, max |o_ref|) against float64


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=DEVICE, dtype=torch.float32).to(dtype)


def reference(q, k, v, causal, mods):
    return attention_ref(q, k, v, causal=causal, upcast=torch.float64, window_size=mods.window_size, softcap=mods.softcap,
                         alibi_slopes=mods.alibi_slopes, learnable_sink=mods.learnable_sink)


def check(q, k, v, causal, mods, **kwargs):
    "The kernel into NaN-poisoned o and lse against float64: o within TOL, lse within float32 rounding, −∞ exactly where expected."
    B, Hq, Lq, D = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Lq), float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, causal, D ** -0.5, mods=mods, **kwargs)
    o_ref, lse_ref = reference(q, k, v, causal, mods)
    assert not o.isnan().any() and not lse.isnan().any(), "an element was left unwritten, or NaN was produced"
    err = (o.double() - o_ref).abs().max().item() / max(1.0, o_ref.abs().max().item())
    assert err <= TOL[q.dtype], f"max error {err:.3g} > {TOL[q.dtype]}"
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-5, rtol=2e-5)
    return o, lse


def mods_for(Hq, B, window=(-1, -1), softcap=0.0, alibi=None, sink=False):
    slopes = None if alibi is None else (torch.rand(Hq, device=DEVICE) if alibi == "per head" else torch.rand(B, Hq, device=DEVICE))
    return fwd.ScoreMods(window, softcap, slopes, torch.randn(Hq, device=DEVICE) * 2 if sink else None)


# (B, Hq, Hkv, Lq, Lk, D) with the interpreter's 32×16 tiles: ragged both ways, GQA, Lq < Lk and Lq > Lk
SHAPES = [(2, 4, 2, 37, 53, 32), (1, 2, 1, 64, 20, 16), (1, 3, 3, 50, 50, 24)]
WINDOWS = [(-1, -1), (5, 3), (0, 0), (17, -1), (-1, 2), (40, 40)]


@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_window(B, Hq, Hkv, Lq, Lk, D, causal, window):
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    check(q, k, v, causal, mods_for(Hq, B, window))


@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap, alibi, sink", [(3.0, None, False), (0.0, "per head", False), (0.0, "per batch row", False),
                                                  (0.0, None, True), (5.0, "per batch row", True)])
def test_modifiers(B, Hq, Hkv, Lq, Lk, D, causal, softcap, alibi, sink):
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    check(q, k, v, causal, mods_for(Hq, B, (-1, -1), softcap, alibi, sink))


@pytest.mark.parametrize("pack_gqa, use_tma", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_all_together_every_path(pack_gqa, use_tma, dtype):
    "Window, softcap, ALiBi and sinks at once, through packed GQA rows, descriptors and pointers, both dtypes."
    B, Hq, Hkv, Lq, Lk, D = 2, 8, 2, 45, 70, 32
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    for causal in (False, True):
        check(q, k, v, causal, mods_for(Hq, B, (9, 4), 4.0, "per batch row", True), pack_gqa=pack_gqa, use_tma=use_tma)


def test_rows_that_see_no_key():
    "Lq > Lk causal with a window: early rows see nothing: O = 0 and LSE = −∞ without a sink, LSE = the sink with one."
    q, k, v = randn(1, 2, 40, 16), randn(1, 2, 10, 16), randn(1, 2, 10, 16)
    o, lse = check(q, k, v, True, mods_for(2, 1, (3, 0)))
    assert (o[:, :, :30] == 0).all() and (lse[:, :, :30] == float("-inf")).all()
    mods = mods_for(2, 1, (3, 0), sink=True)
    o, lse = check(q, k, v, True, mods)
    assert (o[:, :, :30] == 0).all()
    torch.testing.assert_close(lse[:, :, :30], mods.learnable_sink.view(1, 2, 1).expand(1, 2, 30))


def test_window_skips_tiles_outside_it():
    """Tiles wholly outside every row's window are never loaded: NaN in them must not reach the output (a mask alone
    would let 0 · NaN through the PV product)."""
    Lq = Lk = 96
    q, k, v = randn(1, 1, Lq, 16), randn(1, 1, Lk, 16), randn(1, 1, Lk, 16)
    c = Candidate("tl", 32, 16, 4, 1)
    mods = mods_for(1, 1, (8, 0))
    o_clean = torch.empty_like(q); lse = torch.empty(1, 1, Lq, device=DEVICE)
    _attention_forward(q, k, v, o_clean, lse, True, 0.25, config=c, mods=mods)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :16] = v2[:, :, :16] = float("nan")   # keys 0–15: outside the window of rows ≥ 24 (whole Q blocks from 32)
    o = torch.empty_like(q)
    _attention_forward(q, k2, v2, o, lse, True, 0.25, config=c, mods=mods)
    assert not o[:, :, 32:].isnan().any(), "a key tile outside the window was read"
    torch.testing.assert_close(o[:, :, 32:], o_clean[:, :, 32:], atol=0, rtol=0)


def test_public_functions_take_them():
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 30, 41, 32
    q, k, v = randn(B, Lq, Hq, D), randn(B, Lk, Hkv, D), randn(B, Lk, Hkv, D)
    slopes, sink = torch.rand(Hq, device=DEVICE), torch.randn(Hq, device=DEVICE)
    out, lse, _ = triton_fa2.flash_attn_func(q, k, v, causal=True, window_size=(7, 0), softcap=2.5, alibi_slopes=slopes,
                                             return_attn_probs=True, learnable_sink=sink)
    o_ref, lse_ref = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True,
                               fwd.ScoreMods((7, 0), 2.5, slopes, sink))
    assert (out.transpose(1, 2).double() - o_ref).abs().max() <= TOL[q.dtype]
    o2 = triton_fa2.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window_size=(7, 0),
                              softcap=2.5, alibi_slopes=slopes, learnable_sink=sink)
    assert torch.equal(o2, out.transpose(1, 2))


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(window_size=(-2, 0)), ValueError, "each an int ≥ 0 or −1"),
    (dict(window_size=(4,)), ValueError, "window_size must be (left, right)"),
    (dict(softcap=-1.0), ValueError, "softcap must be a finite number ≥ 0"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes must have shape (4,) or (2, 4)"),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.int32)), TypeError, "floating-point"),
    (dict(learnable_sink=torch.ones(2, 4)), ValueError, "learnable_sink must have shape (4,)"),
])
def test_bad_arguments(kwargs, error, text):
    q, k, v = randn(2, 8, 4, 16), randn(2, 8, 2, 16), randn(2, 8, 2, 16)
    kwargs = {n: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        triton_fa2.flash_attn_func(q, k, v, **kwargs)


def test_gradient_refused_clearly():
    q, k, v = (randn(1, 8, 2, 16).requires_grad_() for _ in range(3))
    with pytest.raises(NotImplementedError, match="backward of window_size, softcap"):
        triton_fa2.flash_attn_func(q, k, v, softcap=30.0)
    with torch.no_grad(): triton_fa2.flash_attn_func(q, k, v, softcap=30.0)   # inference is fine


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache_and_decode(paged, num_splits):
    """flash_attn_with_kvcache and decode with every modifier, split or not, contiguous or paged (spare pages of NaN): each
    row as attention_ref on its own keys; the sink counted once however the keys are split."""
    B, Hq, Hkv, Lq, Lmax, D, page = 3, 4, 2, 2, 70, 32, 16
    q, k_cache, v_cache = randn(B, Lq, Hq, D), randn(B, Lmax, Hkv, D), randn(B, Lmax, Hkv, D)
    lengths = torch.tensor([70, 9, 41], dtype=torch.int32, device=DEVICE)
    mods = fwd.ScoreMods((12, 0), 4.0, torch.rand(B, Hq, device=DEVICE), torch.randn(Hq, device=DEVICE))
    kwargs = dict(cache_seqlens=lengths, causal=True, window_size=mods.window_size, softcap=mods.softcap,
                  alibi_slopes=mods.alibi_slopes, learnable_sink=mods.learnable_sink, num_splits=num_splits)
    if paged:
        pages = -(-Lmax // page)
        table = torch.randperm(B * pages + 2, device=DEVICE)[:B * pages].view(B, pages).to(torch.int32)
        pools = []
        for cache in (k_cache, v_cache):
            pool = torch.full((B * pages + 2, page, Hkv, D), float("nan"), device=DEVICE, dtype=cache.dtype)
            padded = torch.cat([cache, cache.new_zeros(B, pages * page - Lmax, Hkv, D)], 1)
            pool[table.long()] = padded.view(B, pages, page, Hkv, D)
            pools.append(pool)
        out = triton_fa2.flash_attn_with_kvcache(q, *pools, block_table=table, **kwargs)
    else:
        out = triton_fa2.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
        o2 = triton_fa2.decode(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), **kwargs)
        assert torch.equal(o2, out.transpose(1, 2))
    for b, n in enumerate(lengths.tolist()):
        o_ref, _ = reference(q[b:b + 1].transpose(1, 2), k_cache[b:b + 1, :n].transpose(1, 2), v_cache[b:b + 1, :n].transpose(1, 2),
                             True, mods._replace(alibi_slopes=mods.alibi_slopes[b]))
        assert (out[b:b + 1].transpose(1, 2).double() - o_ref).abs().max() <= TOL[q.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_matrix(dtype, causal):
    "Serving-sized shapes on the GPU's own configs: each modifier alone and all four at once, D = 128 with GQA and D = 64."
    for B, Hq, Hkv, L, D in [(2, 8, 2, 1000, 128), (1, 4, 4, 2049, 64)]:
        q, k, v = randn(B, Hq, L, D, dtype=dtype), randn(B, Hkv, L, D, dtype=dtype), randn(B, Hkv, L, D, dtype=dtype)
        for mods in [mods_for(Hq, B, (256, 0)), mods_for(Hq, B, (100, 100)), mods_for(Hq, B, softcap=50.0),
                     mods_for(Hq, B, alibi="per head"), mods_for(Hq, B, sink=True), mods_for(Hq, B, (256, 0), 50.0, "per head", True)]:
            check(q, k, v, causal, mods)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_sequences(causal):
    "flash_attn_varlen_func with every modifier: each sequence as attention_ref alone (lengths 0, 1 and odd; Lq ≠ Lk)."
    lengths_q, lengths_k = [17, 0, 1, 40], [30, 5, 1, 40]
    Hq, Hkv, D = 4, 2, 32
    cu = lambda ls: torch.tensor([0] + list(itertools.accumulate(ls)), dtype=torch.int32, device=DEVICE)
    q, k, v = randn(sum(lengths_q), Hq, D), randn(sum(lengths_k), Hkv, D), randn(sum(lengths_k), Hkv, D)
    slopes, sink = torch.rand(len(lengths_q), Hq, device=DEVICE), torch.randn(Hq, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    out, lse, _ = triton_fa2.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
                                                    causal=causal, window_size=(6, 2), softcap=3.0, alibi_slopes=slopes,
                                                    return_attn_probs=True, learnable_sink=sink)
    cq, ck = cu(lengths_q).tolist(), cu(lengths_k).tolist()
    for b in range(len(lengths_q)):
        if lengths_q[b] == 0: continue
        qb, kb, vb = (t[s:e].transpose(0, 1)[None] for t, s, e in ((q, cq[b], cq[b + 1]), (k, ck[b], ck[b + 1]), (v, ck[b], ck[b + 1])))
        o_ref, lse_ref = reference(qb, kb, vb, causal, fwd.ScoreMods((6, 2), 3.0, slopes[b], sink))
        assert (out[cq[b]:cq[b + 1]].transpose(0, 1)[None].double() - o_ref).abs().max() <= TOL[q.dtype]
        torch.testing.assert_close(lse[:, cq[b]:cq[b + 1]][None].double(), lse_ref, atol=2e-5, rtol=2e-5)
