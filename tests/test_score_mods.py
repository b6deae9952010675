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
from sampling import pairwise

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


# Sweeps below: every window or modifier on every shape and with and without the mask, every shape with and without
# it: all pairs (tests/sampling.py)
@pairwise(("B, Hq, Hkv, Lq, Lk, D", SHAPES), ("causal", [False, True]), ("window", WINDOWS))
def test_window(B, Hq, Hkv, Lq, Lk, D, causal, window):
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    check(q, k, v, causal, mods_for(Hq, B, window))


@pairwise(("B, Hq, Hkv, Lq, Lk, D", SHAPES), ("causal", [False, True]),
          ("softcap, alibi, sink", [(3.0, None, False), (0.0, "per head", False), (0.0, "per batch row", False),
                                    (0.0, None, True), (5.0, "per batch row", True)]))
def test_modifiers(B, Hq, Hkv, Lq, Lk, D, causal, softcap, alibi, sink):
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    check(q, k, v, causal, mods_for(Hq, B, (-1, -1), softcap, alibi, sink))


@pairwise(("pack_gqa, use_tma", [(True, False), (False, True), (False, False)], ["packed", "descriptors", "pointers"]),
          ("dtype", [torch.float16, torch.bfloat16]), ("causal", [False, True]))
def test_all_together_every_path(pack_gqa, use_tma, dtype, causal):
    "Window, softcap, ALiBi and sinks at once, through packed GQA rows, descriptors and pointers, both dtypes, with and without the mask."
    B, Hq, Hkv, Lq, Lk, D = 2, 8, 2, 45, 70, 32
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
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


def grads_ref(q, k, v, do, causal, mods, dlse=None):
    "dq, dk, dv (and dsink) by autograd through `attention_ref` in float64; rows that see no key: 0."
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    sink = None if mods.learnable_sink is None else mods.learnable_sink.detach().double().requires_grad_()
    o, lse = attention_ref(*leaves, causal=causal, upcast=torch.float64, window_size=mods.window_size, softcap=mods.softcap,
                           alibi_slopes=mods.alibi_slopes, learnable_sink=sink)
    loss = (o * do.double()).sum()
    if dlse is not None: loss = loss + (torch.where(lse == float("-inf"), 0.0, lse) * dlse.double()).sum()
    grads = torch.autograd.grad(loss, leaves + ([sink] if sink is not None else []))
    return [torch.nan_to_num(g) for g in grads]


def check_grads(q, k, v, causal, mods, dlse=False, tol=None):
    """The public `attention` with autograd against `grads_ref`: relative error of each gradient (sinks' too) within `tol`,
    nothing NaN. Returns (o, lse, gradients)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    sink = None if mods.learnable_sink is None else mods.learnable_sink.detach().requires_grad_()
    o, lse = triton_fa2.attention(q, k, v, causal=causal, window_size=mods.window_size, softcap=mods.softcap,
                                  alibi_slopes=mods.alibi_slopes, learnable_sink=sink, return_lse=True)
    do = torch.randn_like(o)
    dlse_t = torch.randn_like(lse) if dlse else None
    loss = (o.float() * do.float()).sum() + ((torch.where(lse == float("-inf"), 0.0, lse) * dlse_t).sum() if dlse else 0.0)
    grads = torch.autograd.grad(loss, [q, k, v] + ([sink] if sink is not None else []))
    refs = grads_ref(q, k, v, do, causal, mods._replace(learnable_sink=sink), dlse_t)
    tol = tol or {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[q.dtype]
    for name, g, ref in zip(("dq", "dk", "dv", "dsink"), grads, refs):
        assert not g.isnan().any(), f"{name} has NaN"
        err = ((g.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()
        bound = tol * (5 if name == "dsink" else 1)   # a sink's gradient sums P_sink·Δ over all its head's rows, signs mixed
        assert err <= bound, f"{name}: relative error {err:.3g} > {bound}"
    return o, lse, grads


GRAD_MODS = [dict(window=(5, 3)), dict(window=(17, -1)), dict(softcap=3.0), dict(alibi="per batch row"), dict(sink=True),
             dict(window=(9, 4), softcap=4.0, alibi="per head", sink=True)]


@pairwise(("B, Hq, Hkv, Lq, Lk, D", SHAPES), ("causal", [False, True]), ("mods", GRAD_MODS, [
    "+".join(k if v is True else f"{k}={v}" for k, v in m.items()).replace(" ", "") for m in GRAD_MODS]))
def test_gradients(B, Hq, Hkv, Lq, Lk, D, causal, mods):
    "dq, dk, dv and the sinks' gradient through autograd, each modifier alone and all four, against float64."
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    check_grads(q, k, v, causal, mods_for(Hq, B, **mods))


@pytest.mark.parametrize("use_tma, dtype", [(False, torch.float16), (True, torch.bfloat16)])
def test_gradient_kernels_every_path(use_tma, dtype):
    "Both passes launched by hand through pointers and descriptors, all four modifiers, into NaN-poisoned gradients."
    from triton_fa2 import backward as bwd
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 45, 70, 40
    q, k, v, do = (randn(B, h, n, D, dtype=dtype) for h, n in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk), (Hq, Lq)))
    for causal in (False, True):
        mods = mods_for(Hq, B, (9, 4), 4.0, "per batch row", True)
        o, lse = torch.empty_like(q), torch.empty(B, Hq, Lq, device=DEVICE)
        _attention_forward(q, k, v, o, lse, causal, D ** -0.5, mods=mods)
        delta, m = bwd.launch_preprocess(o, do, lse)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        bwd.launch_dkdv(q, k, v, do, dk, dv, m, delta, causal, D ** -0.5, Candidate("bwd_dkdv", 16, 32, 4, 1), use_tma, mods)
        bwd.launch_dq(q, k, v, do, dq, m, delta, causal, D ** -0.5, Candidate("bwd_dq", 32, 16, 4, 1), use_tma, mods)
        for name, g, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref(q, k, v, do, causal, mods)):
            assert not g.isnan().any(), name
            err = ((g.double() - ref).norm() / ref.norm()).item()
            assert err <= {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype], (name, causal, err)


def test_sink_gradient_with_rows_that_see_no_key_and_the_lse_used():
    """Lq > Lk causal with a window: early rows see only the sink (O = 0, dq = 0 there); the loss uses the LSE too, whose
    gradient reaches the sinks and the keys."""
    q, k, v = randn(2, 4, 40, 16), randn(2, 2, 10, 16), randn(2, 2, 10, 16)
    for mods in (mods_for(4, 2, (3, 0), sink=True), mods_for(4, 2, (3, 0), 2.0, "per head", True)):
        o, lse, grads = check_grads(q, k, v, True, mods, dlse=True)
        assert (o[:, :, :30] == 0).all() and (grads[0][:, :, :30] == 0).all()


def test_backward_skips_tiles_outside_the_window():
    """Both passes skip the tiles no row of theirs sees: NaN in far queries and keys never reaches dq of early rows or
    dk, dv of early keys (a mask alone would let 0 · NaN through the products). Far enough for the GPU's tiles (up to 256)
    and the interpreter's (32)."""
    L, cut, n, D = (1024, 768, 256, 16) if DEVICE.type == "cuda" else (256, 192, 64, 16)
    q, k, v = randn(1, 2, L, D), randn(1, 2, L, D), randn(1, 2, L, D)
    mods = mods_for(2, 1, (8, 0), sink=True)
    for t in (q, k, v): t[:, :, cut:] = float("nan")     # positions ≥ 768: outside every window of rows < 256, keys < 248
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = triton_fa2.attention(q, k, v, causal=True, window_size=mods.window_size, learnable_sink=mods.learnable_sink)
    do = torch.zeros_like(o)
    do[:, :, :n] = randn(1, 2, n, D)
    o.backward(do)
    clean = [t.detach()[:, :, :n] for t in (q, k, v)]
    ref = grads_ref(*clean, do[:, :, :n], True, mods)
    for name, g, r, m in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref, (n, n - 8, n - 8)):
        assert not g[:, :, :m].isnan().any(), f"{name} read a tile outside the window"
        assert ((g[:, :, :m].double() - r[:, :, :m]).norm() / r[:, :, :m].norm()).item() < 2e-3, name


@pytest.mark.newest_triton_only   # PyTorch's operator checks: the kernels they run are this file's other tests' (.ci/run)
def test_opcheck_with_modifiers():
    "`torch.library.opcheck` of the forward (its autograd included) and of the backward operator with every modifier."
    from triton_fa2 import ops
    q, k, v = (randn(1, 2, 20, 32).requires_grad_() for _ in range(3))
    slopes, sink = torch.rand(2, device=DEVICE), torch.randn(2, device=DEVICE).requires_grad_()
    args = (q, k, v, True, 0.2, False, 5, 0, 4.0, slopes, sink)
    torch.library.opcheck(ops._attention_op, args)
    o, lse = ops._attention_op(*(t.detach() if isinstance(t, torch.Tensor) else t for t in args))
    torch.library.opcheck(ops._attention_backward_op, (randn(1, 2, 20, 32), q.detach(), k.detach(), v.detach(), o, lse, None,
                                                       True, 0.2, 5, 0, 4.0, slopes, sink.detach()))


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


def gpu_cases(dtype, seqlen_d64:int, alibi:str):
    "Serving-sized inputs, D = 128 with GQA and D = 64 at an odd length, each with every modifier alone and all four at once."
    for B, Hq, Hkv, L, D in [(2, 8, 2, 1000, 128), (1, 4, 4, seqlen_d64, 64)]:
        q, k, v = randn(B, Hq, L, D, dtype=dtype), randn(B, Hkv, L, D, dtype=dtype), randn(B, Hkv, L, D, dtype=dtype)
        for mods in [mods_for(Hq, B, (256, 0)), mods_for(Hq, B, (100, 100)), mods_for(Hq, B, softcap=50.0),
                     mods_for(Hq, B, alibi=alibi), mods_for(Hq, B, sink=True), mods_for(Hq, B, (256, 0), 50.0, "per head", True)]:
            yield q, k, v, mods


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_matrix(dtype, causal):
    "The forward on the GPU's own configs."
    for q, k, v, mods in gpu_cases(dtype, 2049, "per head"): check(q, k, v, causal, mods)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gradients(dtype, causal):
    "The backward on the GPU's own configs."
    for q, k, v, mods in gpu_cases(dtype, 1537, "per batch row"): check_grads(q, k, v, causal, mods)


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


def test_packed_sequences_gradients():
    "flash_attn_varlen_func's gradients with every modifier: each sequence as `grads_ref` alone (lengths 0, 1 and odd; Lq ≠ Lk)."
    lengths_q, lengths_k = [17, 0, 1, 40], [30, 5, 1, 40]
    Hq, Hkv, D = 4, 2, 32
    cu = lambda ls: torch.tensor([0] + list(itertools.accumulate(ls)), dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(sum(n), h, D).requires_grad_() for n, h in ((lengths_q, Hq), (lengths_k, Hkv), (lengths_k, Hkv)))
    slopes, sink = torch.rand(len(lengths_q), Hq, device=DEVICE), torch.randn(Hq, device=DEVICE).requires_grad_()
    for causal in (False, True):
        out = triton_fa2.flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
                                                causal=causal, window_size=(6, 2), softcap=3.0, alibi_slopes=slopes,
                                                learnable_sink=sink)
        do = torch.randn_like(out)
        dq, dk, dv, dsink = torch.autograd.grad(out, (q, k, v, sink), do)
        cq, ck = cu(lengths_q).tolist(), cu(lengths_k).tolist()
        dsink_ref = torch.zeros(Hq, dtype=torch.float64, device=DEVICE)
        for b in range(len(lengths_q)):
            per_seq = lambda t, c: t[c[b]:c[b + 1]].transpose(0, 1)[None]
            if lengths_q[b] == 0:
                assert (dk[ck[b]:ck[b + 1]] == 0).all() and (dv[ck[b]:ck[b + 1]] == 0).all()
                continue
            refs = grads_ref(per_seq(q, cq), per_seq(k, ck), per_seq(v, ck), per_seq(do, cq), causal,
                             fwd.ScoreMods((6, 2), 3.0, slopes[b], sink))
            for name, g, ref in zip(("dq", "dk", "dv"), (per_seq(dq, cq), per_seq(dk, ck), per_seq(dv, ck)), refs):
                assert not g.isnan().any(), name
                assert ((g.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item() <= 2e-3, (name, b, causal)
            dsink_ref += refs[3]
        torch.testing.assert_close(dsink.double(), dsink_ref, atol=2e-3, rtol=2e-3)


def test_gradients_with_modifiers_are_deterministic():
    "Twice the same call, the same bits: every gradient, the sinks' included (no atomics; the sinks' sum is one reduction)."
    B, Hq, Hkv, L, D = 2, 4, 2, 70, 32
    q, k, v = (randn(B, h, L, D).requires_grad_() for h in (Hq, Hkv, Hkv))
    slopes, sink = torch.rand(B, Hq, device=DEVICE), torch.randn(Hq, device=DEVICE).requires_grad_()
    do = randn(B, Hq, L, D)
    runs = [torch.autograd.grad(triton_fa2.attention(q, k, v, causal=True, window_size=(20, 0), softcap=5.0, alibi_slopes=slopes,
                                                     learnable_sink=sink), (q, k, v, sink), do) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
