"""The backward pass (`attention` and `flash_attn_func` under autograd; `dispatch._attention_backward`) against float64.

References: `backward.attention_backward_ref` (the formulas, float64) and PyTorch's autograd through `naive.attention_ref`
in float64. Errors are relative per gradient, thresholds per dtype. CPU (CI) runs Triton's interpreter on small shapes;
`pytest -m gpu` runs the matrix on the device.
"""
import itertools
import pytest
import torch
import triton_fa2.candidates as candidates_module

import triton_fa2.ops as ops
from triton_fa2.backward import attention_backward_ref
from triton_fa2.candidates import BACKWARD, BACKWARD_GLUON, BACKWARD_GLUON_DQ, Candidate
from triton_fa2.dispatch import _attention_backward, _attention_forward
from triton_fa2.interface import attention, flash_attn_func
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device, interpreting

DEVICE = default_device()
# dtype → (relative Frobenius error per gradient, its floor in units of the reference's RMS): a few ulps of the inputs.
# P and dS enter their products rounded to the inputs' dtype, as in every FlashAttention, so bf16 sits near 2⁻⁸.
TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def randn(*shape, dtype=torch.float16, device=DEVICE):
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


def rel_error(g, ref) -> float:
    "‖g − ref‖ / max(‖ref‖, 1e-3·√n): relative, with a floor for gradients that are zero in exact arithmetic (one key)."
    diff = (g.double() - ref).norm().item()
    return diff / max(ref.norm().item(), 1e-3 * ref.numel() ** 0.5, 1e-30)


def check_grads(grads, refs, dtype, names=("dq", "dk", "dv")):
    for name, g, ref in zip(names, grads, refs):
        assert g.shape == ref.shape and g.dtype == dtype, (name, g.shape, g.dtype)
        assert not g.isnan().any(), f"{name}: NaN (or an element left unwritten)"
        err = rel_error(g, ref)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]}"


def poisoned_backward(q, k, v, do, causal, scale=None, dlse=None, configs=None):
    "The dispatcher's backward into NaN-filled gradient buffers, after its own forward: every element must be written."
    D = q.shape[-1]
    scale = D ** -0.5 if scale is None else scale
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
    _attention_forward(q, k, v, o, lse, causal, scale)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    _attention_backward(do, q, k, v, o, lse, dlse, *grads, causal, scale, configs)
    return grads


# (B, Hq, Hkv, Lq, Lk, D): each shape names the path it exercises. The interpreter's tiles: dK/dV 16 rows × 32 keys, dQ 32 × 16.
SHAPES = [
    (1, 1, 1, 1, 1, 16),        # one query, one key: dq = dk = 0 in exact arithmetic, dv = dO
    (2, 3, 3, 17, 17, 64),      # odd length within one tile on each axis
    (1, 2, 2, 64, 64, 32),      # multiples of every tile: the unmasked runs alone when not causal
    (1, 2, 2, 100, 100, 80),    # D = 80: a 128-wide tile with masked columns; ragged rows and keys
    (1, 2, 2, 37, 100, 16),     # Lq < Lk: bottom-right offset of 63 keys; K/V blocks no row sees are skipped
    (1, 2, 2, 100, 37, 64),     # Lq > Lk: 63 rows see no key (zero gradient, never NaN); Q tiles no key reaches
    (1, 4, 2, 50, 50, 64),      # GQA 2:1: dK, dV summed over each pair of query heads
    (1, 6, 2, 33, 65, 32),      # GQA 3:1, odd lengths
    (2, 4, 1, 29, 40, 24),      # MQA; D = 24, a 32-wide tile
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", SHAPES)
def test_dispatcher_backward_against_the_formulas(B, Hq, Hkv, Lq, Lk, D, causal):
    q, k, v = randn(B, Hq, Lq, D), randn(B, Hkv, Lk, D), randn(B, Hkv, Lk, D)
    do = randn(B, Hq, Lq, D)
    check_grads(poisoned_backward(q, k, v, do, causal), attention_backward_ref(q, k, v, do, causal=causal), torch.float16)


@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D, causal", [
    (1, 4, 2, 45, 45, 64, True),     # bf16 under the interpreter: the float32-copy workaround of its bf16 dot
    (1, 2, 2, 30, 70, 128, False),   # D = 128, Lq < Lk
    (2, 2, 1, 70, 30, 16, True),     # MQA, rows that see nothing
])
def test_bf16_through_autograd(B, Hq, Hkv, Lq, Lk, D, causal):
    q, k, v = (randn(B, h, L, D, dtype=torch.bfloat16).requires_grad_() for h, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    do = randn(B, Hq, Lq, D, dtype=torch.bfloat16)
    attention(q, k, v, causal=causal).backward(do)
    check_grads([q.grad, k.grad, v.grad], attention_backward_ref(q, k, v, do, causal=causal), torch.bfloat16)


def autograd_ref(q, k, v, loss_fn, causal, scale=None):
    "Gradients of loss_fn(o, lse) by PyTorch's autograd through the naive attention in float64."
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = attention_ref(q64, k64, v64, causal=causal, scale=scale, upcast=torch.float64)
    loss_fn(o, lse).backward()
    return q64.grad, k64.grad, v64.grad


def test_rows_that_see_no_key_get_zero_gradient():
    "Causal with Lq > Lk: the first Lq − Lk rows see nothing; their dq is exactly 0, and nothing is NaN (bug class 1)."
    q = randn(1, 2, 40, 32).requires_grad_()
    k, v = randn(1, 2, 10, 32).requires_grad_(), randn(1, 2, 10, 32).requires_grad_()
    attention(q, k, v, causal=True).backward(randn(1, 2, 40, 32))
    assert (q.grad[:, :, :30] == 0).all() and not q.grad.isnan().any() and not k.grad.isnan().any()


def test_gradient_of_the_lse_too():
    "A loss that uses the LSE (as a merge of attention states does): dS gains P·dLSE, folded into Δ."
    q, k, v = (randn(1, 4, 33, 32).requires_grad_() for _ in range(3))
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    w = randn(1, 4, 33, dtype=torch.float32)
    ((o.float() ** 2).sum() + (lse * w).sum()).backward()
    refs = autograd_ref(q, k, v, lambda o, lse: (o ** 2).sum() + (lse * w.double()).sum(), causal=True)
    check_grads([q.grad, k.grad, v.grad], refs, torch.float16)


@pytest.mark.parametrize("flash_layout", [False, True])
def test_a_loss_of_the_lse_alone(flash_layout):
    "Autograd hands no gradient for an output the loss never used (neither O's nor the LSE's is filled with zeros)."
    q, k, v = (randn(1, 4, 33, 32).requires_grad_() for _ in range(3))
    w = randn(1, 4, 33, dtype=torch.float32)
    if flash_layout:
        _, lse, _ = flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_attn_probs=True)
    else: _, lse = attention(q, k, v, causal=True, return_lse=True)
    (lse * w).sum().backward()
    refs = autograd_ref(q, k, v, lambda o, lse: (lse * w.double()).sum(), causal=True)
    check_grads([q.grad, k.grad], refs[:2], torch.float16)
    assert refs[2] is None and v.grad is not None and (v.grad == 0).all()   # the LSE does not depend on V


def test_flash_layout_packed_qkv_and_a_custom_scale():
    "flash_attn_func on q, k, v sliced from one (B, L, 3·H, D) buffer: its gradient lands in that buffer, in its dtype."
    qkv = randn(2, 37, 3 * 4, 64).requires_grad_()
    q, k, v = qkv.split(4, dim=2)
    do = randn(2, 37, 4, 64)
    flash_attn_func(q, k, v, softmax_scale=0.3, causal=True).backward(do)
    assert qkv.grad.shape == qkv.shape and qkv.grad.dtype == torch.float16
    refs = attention_backward_ref(*(t.transpose(1, 2) for t in (q, k, v)), do.transpose(1, 2), causal=True, scale=0.3)
    check_grads([g.transpose(1, 2) for g in qkv.grad.split(4, dim=2)], refs, torch.float16)


def test_gradients_keep_the_inputs_layout_and_take_any_do():
    "Non-contiguous inputs (transposed views) get gradients of their shape; dO may be any view, even expanded (o.sum())."
    q, k, v = (randn(1, 30, 2, 32).transpose(1, 2).requires_grad_() for _ in range(3))   # (B, H, L, D) views
    attention(q, k, v).sum().backward()                      # dO: ones expanded, every stride 0
    refs = autograd_ref(q, k, v, lambda o, lse: o.sum(), causal=False)
    check_grads([q.grad, k.grad, v.grad], refs, torch.float16)


def test_deterministic_bits():
    "No atomics: the same inputs give the same gradient bits, with or without deterministic=True."
    q, k, v = (randn(2, 4, 45, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    do = randn(2, 4, 45, 64, dtype=torch.bfloat16)
    runs = []
    for deterministic in (False, True, True):
        grads = torch.autograd.grad(attention(q, k, v, causal=True, deterministic=deterministic), (q, k, v), do)
        runs.append(grads)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


@pytest.mark.parametrize("Lq, Lk", [(0, 20), (20, 0), (0, 0)])
def test_empty_sequences(Lq, Lk):
    "No queries: dk = dv = 0. No keys: dq = 0. Nothing is NaN."
    q, k, v = randn(1, 2, Lq, 32).requires_grad_(), randn(1, 2, Lk, 32).requires_grad_(), randn(1, 2, Lk, 32).requires_grad_()
    attention(q, k, v).backward(randn(1, 2, Lq, 32))
    for g in (q.grad, k.grad, v.grad): assert g is not None and (g == 0).all()


@pytest.mark.newest_triton_only   # PyTorch's operator checks: the kernels they run are this file's other tests' (.ci/run)
def test_opcheck_including_autograd():
    "`torch.library.opcheck`: schema, fakes against real outputs, autograd registration and AOT dispatch."
    q, k, v = (randn(1, 2, 20, 32).requires_grad_() for _ in range(3))
    torch.library.opcheck(ops._attention_op, (q, k, v, True, 0.2, False))
    qf = randn(1, 20, 2, 32).transpose(1, 2).requires_grad_()
    torch.library.opcheck(ops._attention_op, (qf, k, v, False, 0.2, True))
    do = randn(1, 2, 20, 32)
    o, lse = ops._attention_op(q.detach(), k.detach(), v.detach(), True, 0.2, False)
    torch.library.opcheck(ops._attention_backward_op, (do, q.detach(), k.detach(), v.detach(), o, lse, None, True, 0.2))


@pytest.mark.newest_triton_only   # PyTorch's operator checks: the kernels they run are this file's other tests' (.ci/run)
def test_torch_compile_fullgraph_traces_forward_and_backward():
    "A training step compiled with fullgraph=True: no graph break, the eager gradients."
    def step(q, k, v, w):
        return (attention(q, k, v, causal=True) * w).float().square().sum()
    q, k, v = (randn(1, 4, 24, 32).requires_grad_() for _ in range(3))
    w = randn(1, 4, 24, 32)
    eager = torch.autograd.grad(step(q, k, v, w), (q, k, v))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if interpreting() else "inductor")
    traced = torch.autograd.grad(compiled(q, k, v, w), (q, k, v))
    for a, b in zip(eager, traced): torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def test_double_backward_is_refused_clearly():
    q, k, v = (randn(1, 2, 8, 16).requires_grad_() for _ in range(3))
    (dq,) = torch.autograd.grad(attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="no second derivative"): dq.sum().backward()


def test_every_candidate_table_has_both_paths():
    "Each backward pass has candidates at every head-dim tile width, through descriptors and through pointers."
    for kernel in ("bwd_dkdv", "bwd_dq"):
        for block_d in (64, 128, 256):
            for pointers in (False, True): assert BACKWARD[(kernel, block_d, pointers)], (kernel, block_d, pointers)


# ---- the GPU matrix -------------------------------------------------------------------------------------------------

GPU_CASES = [  # (B, Hq, Hkv, N, D, causal, dtype)
    (4, 8, 8, 512, 64, True, torch.bfloat16),
    (2, 8, 8, 1000, 64, False, torch.float16),        # ragged
    (2, 16, 16, 2048, 128, True, torch.bfloat16),
    (2, 16, 16, 2048, 128, True, torch.float16),
    (2, 16, 16, 2048, 128, False, torch.bfloat16),
    (1, 8, 2, 4096, 128, True, torch.bfloat16),       # GQA 4:1
    (1, 4, 4, 8192, 64, True, torch.bfloat16),
    (1, 2, 1, 16384, 128, True, torch.bfloat16),      # MQA at 16k
    (1, 4, 4, 2048, 256, True, torch.bfloat16),
    (1, 4, 4, 1500, 256, False, torch.float16),
    (1, 4, 2, 777, 96, True, torch.bfloat16),         # an untuned head dim, ragged
]


@pytest.mark.gpu
@pytest.mark.gpu_memory
@pytest.mark.parametrize("B, Hq, Hkv, N, D, causal, dtype", GPU_CASES)
def test_gpu_matrix(B, Hq, Hkv, N, D, causal, dtype):
    q, k, v = randn(B, Hq, N, D, dtype=dtype), randn(B, Hkv, N, D, dtype=dtype), randn(B, Hkv, N, D, dtype=dtype)
    do = randn(B, Hq, N, D, dtype=dtype)
    check_grads(poisoned_backward(q, k, v, do, causal), attention_backward_ref(q, k, v, do, causal=causal), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["bwd_dkdv", "bwd_dq"])
def test_gpu_every_candidate_is_correct(kernel, monkeypatch):
    "Every candidate of every table, at the head dims it serves, through descriptors and pointers, not only the picks."
    import triton_fa2.forward as fwd
    from triton_fa2.candidates import backward_candidates, _max_smem
    smem = _max_smem(torch.cuda.current_device())
    checked = 0
    for D in (64, 128, 256):
        q, k, v, do = (randn(1, 4, 300, D, dtype=torch.bfloat16) for _ in range(4))
        refs = attention_backward_ref(q, k, v, do, causal=True)
        for pointers in (False, True):
            monkeypatch.setattr(fwd, "_has_tma", lambda device: not pointers)   # a GPU without TMA: the pointer path
            views = (q, k, v, do)
            for c in backward_candidates(kernel, D, pointers, smem, gluon=not pointers and D in BACKWARD_GLUON):
                other = BACKWARD[("bwd_dq" if kernel == "bwd_dkdv" else "bwd_dkdv", min(max(D, 64), 256), pointers)][0]
                configs = (c, other) if kernel == "bwd_dkdv" else (other, c)
                check_grads(poisoned_backward(*views, causal=True, configs=configs), refs, torch.bfloat16)
                checked += 1
    assert checked >= 10


@pytest.mark.parametrize("kernel", ["bwd_dkdv", "bwd_dq"])
def test_a_gluon_pick_that_fails_falls_back_to_the_tl_pass_once(kernel, monkeypatch):
    "Either pass's Gluon pick failing at run time: one warning, the `tl` pass's gradients, never an error in the call."
    import warnings
    import triton_fa2.dispatch as dispatch
    import triton_fa2.gluon as gluon
    import triton_fa2.gluon_backward as gluon_bwd
    q, k, v, do = (randn(1, 2, 40, 64) for _ in range(4))
    refs = attention_backward_ref(q, k, v, do, causal=True)
    monkeypatch.setattr(dispatch, "_PICKS", {})
    poisoned_backward(q, k, v, do, True)                                  # chooses: the `tl` pass's pick for this key
    (key,) = [key for key in dispatch._PICKS if key[0] == kernel]
    gluon_pick = (BACKWARD_GLUON if kernel == "bwd_dkdv" else BACKWARD_GLUON_DQ)[64][0]
    monkeypatch.setitem(dispatch._PICKS, key, gluon_pick)                 # as if the Gluon pass had won the choice
    monkeypatch.setattr(gluon, "_DISABLED", [])
    for applies in ("gluon_dkdv_applies", "gluon_dq_applies"):
        monkeypatch.setattr(gluon_bwd, applies, lambda *args: not gluon._DISABLED)
    def broken(*args): raise RuntimeError("a Gluon API this code does not know")
    monkeypatch.setattr(gluon_bwd, "launch_dkdv" if kernel == "bwd_dkdv" else "launch_dq", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            check_grads(poisoned_backward(q, k, v, do, True), refs, torch.float16)
            assert dispatch._PICKS[key].kernel == kernel
    messages = [str(w.message) for w in caught if "Gluon" in str(w.message)]
    assert len(messages) == 1 and f"{gluon_pick.label} failed (RuntimeError" in messages[0], messages


def test_the_gluon_dkdv_pass_takes_every_modifier_but_not_with_tiles_they_spill(monkeypatch):
    """As on an H200 (`usable` says yes): `gluon_dkdv_applies` with each modifier; with softcap or ALiBi the backward's
    candidates leave out the Gluon tiles those make spill, and its arguments carry them."""
    import triton_fa2.gluon_backward as gluon_bwd
    from triton_fa2.candidates import BACKWARD_GLUON_SCORE_SPILLS, backward_candidates
    from triton_fa2.score_mods import ScoreMods
    monkeypatch.setattr(gluon_bwd, "_gluon_usable", lambda q: True)
    q = randn(1, 2, 40, 64)
    every = {"none": None, "window": ScoreMods(window_size=(8, 0)), "sink": ScoreMods(learnable_sink=torch.zeros(2)),
             "softcap": ScoreMods(softcap=3.0), "alibi": ScoreMods(alibi_slopes=torch.ones(2)),
             "all": ScoreMods(window_size=(8, 8), softcap=3.0, alibi_slopes=torch.ones(2), learnable_sink=torch.zeros(2))}
    for causal in (False, True):
        assert all(gluon_bwd.gluon_dkdv_applies(q, 64, True, m, causal) for m in every.values())
        assert not gluon_bwd.gluon_dkdv_applies(q, 64, False, every["window"], causal)   # Q and dO through descriptors only
    m = torch.empty(1, 2, 40)
    named, _ = gluon_bwd._dkdv_gluon_arguments(q, q, q, q, q, q, m, m, True, 0.125, BACKWARD_GLUON[64][0], every["all"])
    assert named["SOFTCAP"] and named["ALIBI"] and named["WINDOW"] and named["SLOPES"] is every["all"].alibi_slopes
    assert named["softcap_scale"] == 0.125 / 3.0
    monkeypatch.setattr(candidates_module, "interpreting", lambda: False)
    for D in BACKWARD_GLUON:
        plain = backward_candidates("bwd_dkdv", D, False, 227 * 1024, gluon=True)
        mixed = backward_candidates("bwd_dkdv", D, False, 227 * 1024, gluon=True, score_mods=True, softcap_mixed=True)
        alibi = backward_candidates("bwd_dkdv", D, False, 227 * 1024, gluon=True, score_mods=True)   # or softcap alone
        windowed = backward_candidates("bwd_dkdv", D, False, 227 * 1024, gluon=True)   # a window changes no candidate
        assert [c for c in plain if c not in mixed] == [c for c in BACKWARD_GLUON[D]
                                                        if (c, D) in BACKWARD_GLUON_SCORE_SPILLS or c.WARP_SPECIALIZE]
        assert [c for c in plain if c not in alibi] == [c for c in BACKWARD_GLUON[D] if (c, D) in BACKWARD_GLUON_SCORE_SPILLS]
        assert windowed == plain
        assert any(c.kernel == "gluon_dkdv" for c in mixed)            # every head dim keeps a Gluon tile
    for D in BACKWARD_GLUON_DQ:                                        # the warp-specialised dQ pass: every modifier
        plain = backward_candidates("bwd_dq", D, False, 227 * 1024, gluon=True)
        softcapped = backward_candidates("bwd_dq", D, False, 227 * 1024, gluon=True, score_mods=True, softcap_mixed=True)
        assert [c for c in plain if c not in softcapped] == [c for c in BACKWARD_GLUON_DQ[D] if (c, D) in BACKWARD_GLUON_SCORE_SPILLS]
    ws = next(c for c in BACKWARD_GLUON[128] if c.WARP_SPECIALIZE)     # the warp-specialised pass: softcap alone, the rest with anything
    named, _ = gluon_bwd._dkdv_ws_arguments(q, q, q, q, q, q, m, m, True, 0.125, ws, every["softcap"])
    assert named["SOFTCAP"] and named["softcap_scale"] == 0.125 / 3.0 and not named["ALIBI"]
    with pytest.raises(ValueError, match="takes softcap alone"):              # with a window or ALiBi it spills
        gluon_bwd._dkdv_ws_arguments(q, q, q, q, q, q, m, m, True, 0.125, ws, every["all"])
    named, _ = gluon_bwd._dkdv_ws_arguments(q, q[:, :1], q[:, :1], q, q[:, :1], q[:, :1], m, m, False, 0.125, ws, every["window"])
    assert named["WINDOW"] and (named["window_left"], named["window_right"]) == (8, 0)
    dq_ws = BACKWARD_GLUON_DQ[64][0]
    named, _ = gluon_bwd._dq_ws_arguments(q, q, q, q, q, m, m, True, 0.125, dq_ws, every["all"])
    assert named["WINDOW"] and named["SOFTCAP"] and named["ALIBI"] and (named["window_left"], named["window_right"]) == (8, 0)
    named, grid = gluon_bwd._dkdv_ws_arguments(q, q[:, :1], q[:, :1], q, q[:, :1], q[:, :1], m, m, True, 0.125, ws, every["sink"])
    assert grid == 1 and named["group_size"] == 2 and named["maxnreg"] == gluon_bwd._ws_maxnreg(named["CONSUMER_REGS"])
    assert not named["ALIBI"]
    named, _ = gluon_bwd._dkdv_ws_arguments(q, q[:, :1], q[:, :1], q, q[:, :1], q[:, :1], m, m, False, 0.125, ws, every["alibi"])
    assert named["ALIBI"] and named["SLOPES"] is every["alibi"].alibi_slopes and named["stride_slopes_z"] == 0


def test_a_gluon_dkdv_config_where_it_cannot_run_is_refused():
    "Where the Gluon kernels cannot run (no sm_90, or a head dim they lack), naming one is an error, not a silent other pass."
    q, k, v, do = (randn(1, 2, 40, 96) for _ in range(4))
    with pytest.raises(ValueError, match="runs only on sm_90 with Gluon"):
        poisoned_backward(q, k, v, do, True, configs=(BACKWARD_GLUON[64][0], None))


GLUON_DKDV_CASES = [   # (B, Hq, Hkv, Lq, Lk, causal): Lq ≠ Lk both ways, GQA 4:1 and 8:1, one row, three keys, ragged
    (2, 8, 2, 333, 1000, True), (2, 4, 4, 1000, 333, True), (1, 8, 1, 257, 513, False), (1, 2, 2, 1, 700, True),
    (1, 2, 2, 700, 3, False), (3, 4, 4, 64, 64, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("D", sorted(BACKWARD_GLUON))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_dkdv_with_score_modifiers(D, dtype):
    """Every Gluon dK/dV candidate that takes them with a window (reaching back past a block, narrower than one, on both
    sides), softcap, ALiBi per head and per batch row, and all of them with a sink, causal and not, Lq ≠ Lk both ways and
    GQA, against float64 autograd through `attention_ref` (the dQ pass: the `tl` one). The warp-specialised pass: windows
    and ALiBi, softcap alone (with a sink too)."""
    from test_score_mods import grads_ref, mods_for
    from triton_fa2.candidates import BACKWARD_GLUON_SCORE_SPILLS
    dq_pass = BACKWARD[("bwd_dq", D, False)][0]
    variants = [dict(window=w) for w in [(100, 0), (5, 3), (70, 33)]] + [
        dict(softcap=30.0), dict(softcap=30.0, sink=True), dict(alibi="per head"), dict(alibi="per batch row"),
        dict(window=(70, 33), softcap=30.0, alibi="per head", sink=True)]
    for (B, Hq, Hkv, Lq, Lk, causal), variant in itertools.product(GLUON_DKDV_CASES[:3], variants):
        q, do = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hq, Lq, D, dtype=dtype)
        k, v = randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
        mods = mods_for(Hq, B, **variant)
        o, lse = torch.empty_like(q), torch.empty(B, Hq, Lq, device=q.device)
        _attention_forward(q, k, v, o, lse, causal, D ** -0.5, mods=mods)
        refs = grads_ref(q, k, v, do, causal, mods)[:3]
        scored = "softcap" in variant or "alibi" in variant
        for c in BACKWARD_GLUON[D]:
            if scored and (c, D) in BACKWARD_GLUON_SCORE_SPILLS: continue
            if c.WARP_SPECIALIZE and "softcap" in variant and ("window" in variant or "alibi" in variant): continue
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            _attention_backward(do, q, k, v, o, lse, None, *grads, causal, D ** -0.5, configs=(c, dq_pass), mods=mods)
            check_grads(grads, refs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("D", sorted(BACKWARD_GLUON))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_dkdv(D, dtype):
    "Every Gluon dK/dV candidate against float64 on awkward shapes, on packed (B, L, 3·H, D) views, and bit for bit twice."
    from triton_fa2.gluon_backward import gluon_dkdv_applies
    for B, Hq, Hkv, Lq, Lk, causal in GLUON_DKDV_CASES:
        q, do = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hq, Lq, D, dtype=dtype)
        k, v = randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
        assert gluon_dkdv_applies(q, D, True), "sm_90 with Triton 3.6 runs the Gluon kernels"
        refs = attention_backward_ref(q, k, v, do, causal=causal)
        dq_pass = BACKWARD[("bwd_dq", D, False)][0]
        for c in BACKWARD_GLUON[D]:
            grads = poisoned_backward(q, k, v, do, causal, configs=(c, dq_pass))
            check_grads(grads, refs, dtype)
            again = poisoned_backward(q, k, v, do, causal, configs=(c, dq_pass))
            assert all(torch.equal(a, b) for a, b in zip(grads[1:], again[1:])), f"{c.label}: not deterministic"
    qkv = randn(2, 300, 3 * 4, D, dtype=dtype)                 # packed QKV: (B, L, H, D) views with a row stride of 3·H·D
    q, k, v = (t.transpose(1, 2) for t in qkv.split(4, dim=2))
    do = randn(2, 4, 300, D, dtype=dtype)
    refs = attention_backward_ref(q, k, v, do, causal=True)
    for c in BACKWARD_GLUON[D]:
        check_grads(poisoned_backward(q, k, v, do, True, configs=(c, BACKWARD[("bwd_dq", D, False)][0])), refs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("D", sorted(BACKWARD_GLUON_DQ))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_dq(D, dtype):
    """Every Gluon dQ candidate against float64 on awkward shapes (with a gradient of the LSE on one), bit for bit twice,
    and on packed (B, L, 3·H, D) views."""
    from triton_fa2.gluon_backward import gluon_dq_applies
    dkdv_pass = BACKWARD[("bwd_dkdv", D, False)][0]
    for i, (B, Hq, Hkv, Lq, Lk, causal) in enumerate(GLUON_DKDV_CASES):
        q, do = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hq, Lq, D, dtype=dtype)
        k, v = randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
        assert gluon_dq_applies(q, D, True), "sm_90 with Triton 3.6 runs the Gluon kernels"
        o, lse = torch.empty_like(q), torch.empty(B, Hq, Lq, device=q.device)
        _attention_forward(q, k, v, o, lse, causal, D ** -0.5)
        dlse = randn(B, Hq, Lq, dtype=torch.float32) if i == 0 else None
        refs = attention_backward_ref(q, k, v, do, causal=causal, dlse=dlse)
        for c in BACKWARD_GLUON_DQ[D]:
            runs = []
            for _ in range(2):
                grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                _attention_backward(do, q, k, v, o, lse, dlse, *grads, causal, D ** -0.5, configs=(dkdv_pass, c))
                runs.append(grads)
            check_grads(runs[0], refs, dtype)                  # dK and dV too: they read the M and Δ it stored
            assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1])), f"{c.label}: not deterministic"
    qkv = randn(2, 300, 3 * 4, D, dtype=dtype)                 # packed QKV: (B, L, H, D) views with a row stride of 3·H·D
    q, k, v = (t.transpose(1, 2) for t in qkv.split(4, dim=2))
    do = randn(2, 4, 300, D, dtype=dtype)
    refs = attention_backward_ref(q, k, v, do, causal=True)
    for c in BACKWARD_GLUON_DQ[D]:
        check_grads(poisoned_backward(q, k, v, do, True, configs=(dkdv_pass, c)), refs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("D", sorted(BACKWARD_GLUON_DQ))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_dq_with_score_modifiers(D, dtype):
    """Every Gluon dQ candidate with windows (reaching back past a block, narrower than one, on both sides), softcap,
    slopes per head and per batch row, and all of them with a sink (without the tile softcap and ALiBi make spill), causal
    and not, Lq ≠ Lk both ways and GQA, against float64 autograd (the dK/dV pass: the `tl` one)."""
    from test_score_mods import grads_ref, mods_for
    from triton_fa2.candidates import BACKWARD_GLUON_SCORE_SPILLS
    dkdv_pass = BACKWARD[("bwd_dkdv", D, False)][0]
    variants = [dict(window=w) for w in [(100, 0), (5, 3), (70, 33)]] + [
        dict(softcap=30.0), dict(alibi="per head"), dict(alibi="per batch row"),
        dict(window=(70, 33), softcap=30.0, alibi="per batch row", sink=True)]
    for (B, Hq, Hkv, Lq, Lk, causal), variant in itertools.product(GLUON_DKDV_CASES[:3] + GLUON_DKDV_CASES[4:5], variants):
        q, do = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hq, Lq, D, dtype=dtype)
        k, v = randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
        mods = mods_for(Hq, B, **variant)
        o, lse = torch.empty_like(q), torch.empty(B, Hq, Lq, device=q.device)
        _attention_forward(q, k, v, o, lse, causal, D ** -0.5, mods=mods)
        refs = grads_ref(q, k, v, do, causal, mods)[:3]
        for c in BACKWARD_GLUON_DQ[D]:
            if ("softcap" in variant or "alibi" in variant) and (c, D) in BACKWARD_GLUON_SCORE_SPILLS: continue
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            _attention_backward(do, q, k, v, o, lse, None, *grads, causal, D ** -0.5, configs=(dkdv_pass, c), mods=mods)
            check_grads(grads, refs, dtype)


@pytest.mark.gpu
def test_gpu_warp_specialised_passes_skip_tiles_outside_the_window():
    """The warp-specialised passes load only the tiles some row's window reaches: NaN in far rows and keys never reaches
    dq of early rows or dk, dv of early keys (a mask alone would let 0 · NaN through the products)."""
    from test_score_mods import grads_ref, mods_for
    L, cut, n, D = 2048, 1536, 512, 128
    dkdv_pass = next(c for c in BACKWARD_GLUON[D] if c.WARP_SPECIALIZE)
    q, k, v, do = (randn(1, 2, L, D, dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v): t[:, :, cut:] = float("nan")    # outside every window of rows < n, keys < n − 8
    do[:, :, n:] = 0
    mods = mods_for(2, 1, (8, 0))
    o, lse = torch.empty_like(q), torch.empty(1, 2, L, device=q.device)
    _attention_forward(q, k, v, o, lse, True, D ** -0.5, mods=mods)
    refs = grads_ref(*(t[:, :, :n] for t in (q, k, v)), do[:, :, :n], True, mods)[:3]
    for c in BACKWARD_GLUON_DQ[D]:
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        _attention_backward(do, q, k, v, o, lse, None, *grads, True, D ** -0.5, configs=(dkdv_pass, c), mods=mods)
        for name, g, r, m in zip(("dq", "dk", "dv"), grads, refs, (n, n - 8, n - 8)):
            assert not g[:, :, :m].isnan().any(), f"{c.label}: {name} read a tile outside the window"
            assert ((g[:, :, :m].double() - r[:, :, :m]).norm() / r[:, :, :m].norm()).item() < 1e-2, (c.label, name)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_offsets_past_2_31_elements():
    "int64 offsets (bug class 7): q, k, v, do and the gradients past 2³¹ elements; sampled heads against float64."
    B = 2 ** 31 // (8 * 256 * 128) + 1                       # 8193 × 8 heads × 256 tokens × 128 > 2³¹
    q, k, v = (randn(B, 8, 256, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    assert q.numel() > 2 ** 31
    do = randn(B, 8, 256, 128, dtype=torch.bfloat16)
    attention(q, k, v, causal=True).backward(do)
    for b, h in ((0, 0), (B - 1, 7), (B // 2, 3)):
        sl = lambda t: t.detach()[b:b + 1, h:h + 1]
        refs = attention_backward_ref(sl(q), sl(k), sl(v), do[b:b + 1, h:h + 1], causal=True)
        check_grads([q.grad[b:b + 1, h:h + 1], k.grad[b:b + 1, h:h + 1], v.grad[b:b + 1, h:h + 1]], refs, torch.bfloat16)


def test_unaligned_views():
    "Row strides that are not multiples of 16 bytes (no TMA): copied once on a GPU with TMA, read in place elsewhere."
    q, k, v, do = (randn(1, 2, 30, 36)[..., :32] for _ in range(4))   # row stride 72 bytes
    check_grads(poisoned_backward(q, k, v, do, True), attention_backward_ref(q, k, v, do, causal=True), torch.float16)


# ---- saved launches (`launch._BackwardLaunch`) -------------------------------------------------------------------------

def _backward_tensors(B=1, Hq=4, Hkv=2, Lq=40, Lk=56, D=64, dlse=False, dtype=torch.float16):
    "Every tensor of one backward call, by `_attention_backward`'s names: GQA 2:1, Lq ≠ Lk."
    t = dict(do=randn(B, Hq, Lq, D, dtype=dtype), q=randn(B, Hq, Lq, D, dtype=dtype), k=randn(B, Hkv, Lk, D, dtype=dtype),
             v=randn(B, Hkv, Lk, D, dtype=dtype), o=randn(B, Hq, Lq, D, dtype=dtype), lse=randn(B, Hq, Lq, dtype=torch.float32),
             dlse=randn(B, Hq, Lq, dtype=torch.float32) if dlse else None)
    t.update(dq=torch.empty_like(t["q"]), dk=torch.empty_like(t["k"]), dv=torch.empty_like(t["v"]),
             m=torch.empty_like(t["lse"]), delta=torch.empty_like(t["lse"]))
    return t


def test_backward_plan_key_separates_what_triton_specialises_on():
    "Equal signatures give equal keys (new data, new scale); each tensor's layout, alignment and dtype and each flag change it."
    from triton_fa2.launch import _backward_plan_key
    base = _backward_tensors()
    key = lambda causal=True, scale=0.125, **new: _backward_plan_key(**{**base, **new}, causal=causal, scale=scale)
    assert key(**{n: t.clone() for n, t in base.items() if t is not None}, scale=0.3) == key()
    for name, t in base.items():
        if t is None: continue
        assert key(**{name: torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)}) != key(), name   # off alignment
        assert key(**{name: t.transpose(-1, -2).contiguous().transpose(-1, -2)}) != key(), name             # another layout
        assert key(**{name: t.to(torch.bfloat16 if t.dtype == torch.float32 else torch.float32)}) != key(), name
    assert key(k=randn(1, 2, 57, 64), v=randn(1, 2, 57, 64), dk=randn(1, 2, 57, 64), dv=randn(1, 2, 57, 64)) != key()   # Lk
    assert key(dlse=torch.zeros(1, 4, 40)) != key()                      # HAS_DLSE
    assert key(causal=False) != key() and key(scale=-0.125) != key()    # CAUSAL; the scale's sign
    with_dlse = _backward_tensors(dlse=True)
    assert _backward_plan_key(**with_dlse, causal=True, scale=0.1) == _backward_plan_key(**{**with_dlse, "dlse": with_dlse["dlse"].clone()},
                                                                                          causal=True, scale=0.1)


class _FakeDriver:
    "Triton's CUDA driver as a saved launch reads it, on a CPU: a fixed stream; a tensor map that names its address."
    def __init__(self):
        self.utils = type("Utils", (), dict(fill_tma_descriptor=staticmethod(lambda ptr, *encoding: ("map", ptr))))()
    def get_current_stream(self, device): return 77


class _RecordedKernel:
    "Stands in for a jitted kernel: `kernel[grid](...)` returns a compiled kernel shaped as Triton 3.6's, whose C launch records."
    def __init__(self): self.calls = []
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            from triton_fa2.launch import _is_descriptor
            meta = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=list(a.block_shape), fp4_padded=False)
                    for a in list(args) + list(kwargs.values()) if _is_descriptor(a)] or None
            launcher = lambda *a: self.calls.append(a)
            def inner(*args): return launcher(*args)              # Triton's wrapper: the C launch is its free variable
            run = type("Run", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                       launch_pdl=False, launch=staticmethod(inner if meta else launcher)))()
            return type("Compiled", (), dict(run=run, function="fn", packed_metadata="packed",
                                             metadata=type("Meta", (), dict(tensordesc_meta=meta))()))()
        return launch


def _expanded(args):
    "A launch's arguments as Triton 3.6's wrapper hands them to its C launch: each descriptor as (map, shape, strides)."
    from triton_fa2.launch import _is_descriptor
    out = []
    for a in args: out += [("map", a.base.data_ptr()), *a.shape, *a.strides] if _is_descriptor(a) else [a]
    return out


@pytest.mark.parametrize("dkdv, use_tma", [("tl", True), ("tl", False), ("gluon", True)])
@pytest.mark.parametrize("dlse", [False, True])
def test_backward_saved_launch_passes_what_the_launch_functions_would(dkdv, use_tma, dlse, monkeypatch):
    """A `_BackwardLaunch` built from one call's launches hands Triton's C launcher, for a call with new tensors and a new
    scale, exactly what `launch_dq` and `launch_dkdv` would have launched with them (descriptors encoded per address)."""
    import triton
    import triton_fa2.backward as bwd
    from triton_fa2.candidates import BACKWARD
    from triton_fa2.launch import _BackwardLaunch
    monkeypatch.setattr(triton.runtime.driver, "_active", _FakeDriver())
    dq_kernel, dkdv_kernel = _RecordedKernel(), _RecordedKernel()
    monkeypatch.setattr(bwd, "_attn_bwd_dq", dq_kernel)
    if dkdv == "gluon":
        gluon_bwd = pytest.importorskip("triton_fa2.gluon_backward")
        from triton_fa2.candidates import BACKWARD_GLUON
        monkeypatch.setattr(gluon_bwd, "_attn_bwd_dkdv_gluon", dkdv_kernel)
        launch_dkdv, dkdv_candidate = gluon_bwd.launch_dkdv, BACKWARD_GLUON[64][0]
    else:
        monkeypatch.setattr(bwd, "_attn_bwd_dkdv", dkdv_kernel)
        launch_dkdv, dkdv_candidate = bwd.launch_dkdv, BACKWARD[("bwd_dkdv", 64, not use_tma)][0]
    dq_candidate = BACKWARD[("bwd_dq", 64, not use_tma)][0]
    def launches(t, scale):
        return (bwd.launch_dq(t["q"], t["k"], t["v"], t["do"], t["dq"], t["m"], t["delta"], True, scale, dq_candidate, use_tma,
                              None, (t["o"], t["lse"], t["dlse"])),
                launch_dkdv(t["q"], t["k"], t["v"], t["do"], t["dk"], t["dv"], t["m"], t["delta"], True, scale, dkdv_candidate, use_tma))
    first = _backward_tensors(dlse=dlse)
    plan = _BackwardLaunch(*launches(first, 0.125), ("dK/dV", "dQ"))
    new = _backward_tensors(dlse=dlse)
    want = [_expanded(launched[2]) for launched in launches(new, 0.3)]   # the launches Triton would make, first in line
    dq_kernel.calls.clear(); dkdv_kernel.calls.clear()
    for _ in range(2): plan(*new.values(), 0.3, 0.3 * bwd.LOG2E)
    head = (1, 1, 77, "fn", False, False, None, None, "packed", None, None, None)   # the grid's y, z, stream, fixed handles
    for kernel, args in zip((dq_kernel, dkdv_kernel), want):
        assert len(kernel.calls) == 2
        for call in kernel.calls:
            assert call[1:13] == head and len(call) == 13 + len(args)
            assert all(a is b or (not isinstance(a, torch.Tensor) and a == b) for a, b in zip(call[13:], args)), (call[13:], args)
    assert len(plan.dq.tensor_maps) == (2 if use_tma else 0)              # K and V, each encoded once for its new address
    assert len(plan.dkdv.tensor_maps) == (4 if dkdv == "gluon" else 2 if use_tma else 0)
    assert not any(a is first[n] for launch in (plan.dq, plan.dkdv) for a in launch.args for n in first if first[n] is not None)


def test_a_backward_plan_that_cannot_be_built_leaves_the_normal_path(monkeypatch):
    """Where a saved launch cannot be built (here the interpreter, which returns no compiled kernel), the plan is kept as
    False and every call takes the normal path, with the same gradients."""
    import triton_fa2.dispatch as dispatch
    monkeypatch.setattr(dispatch, "_BACKWARD_PLANS", {}); monkeypatch.setattr(dispatch, "_PLANS", {})   # the forward's too
    monkeypatch.setattr(dispatch, "fast_launch_possible", lambda q: True)
    q, k, v, do = randn(1, 4, 30, 32), randn(1, 2, 45, 32), randn(1, 2, 45, 32), randn(1, 4, 30, 32)
    refs = attention_backward_ref(q, k, v, do, causal=True)
    first = poisoned_backward(q, k, v, do, True)
    assert list(dispatch._BACKWARD_PLANS.values()) == [False]
    again = poisoned_backward(q.clone(), k.clone(), v.clone(), do.clone(), True)
    check_grads(again, refs, torch.float16)
    assert all(torch.equal(a, b) for a, b in zip(first, again)) and len(dispatch._BACKWARD_PLANS) == 1


# (B, Hq, Hkv, Lq, Lk, D, dK/dV pass, views): each case names the path its saved launch replays
SAVED_BACKWARD_CASES = [
    (2, 8, 8, 300, 300, 64, "gluon", "tma"),        # Gluon dK/dV: Q, K, V, dO all through descriptors
    (1, 8, 2, 257, 513, 128, "gluon", "tma"),       # Gluon, GQA 4:1, Lq < Lk
    (2, 8, 8, 300, 300, 64, "tl", "tma"),           # the `tl` dK/dV pass through descriptors
    (1, 8, 2, 513, 257, 128, "tl", "tma"),          # `tl`, GQA 4:1, Lq > Lk
    (1, 4, 2, 300, 300, 96, "tl", "pointers"),      # a GPU without TMA: pointers in both passes; D = 96
    (1, 4, 4, 200, 200, 64, "tl", "unaligned"),     # row strides of 136 bytes: copied on each call, then descriptors
]


def _one_backward_candidate(monkeypatch, dkdv:str):
    "Fresh plans and picks, one candidate per pass: the Gluon passes' or the `tl` ones' (one compile each)."
    import triton_fa2.dispatch as dispatch
    from triton_fa2.candidates import backward_candidates
    monkeypatch.setattr(dispatch, "_BACKWARD_PLANS", {}); monkeypatch.setattr(dispatch, "_PICKS", {})
    def one(kernel, *args, gluon=False, **kwargs):
        every = backward_candidates(kernel, *args, gluon=gluon and dkdv == "gluon", **kwargs)
        return [c for c in every if c.kernel.startswith("gluon") == (dkdv == "gluon")][:1]
    monkeypatch.setattr(dispatch, "backward_candidates", one)


def _count_triton_launches(monkeypatch) -> list:
    "Every launch through Triton's Python path (`JITFunction.run`, Gluon's included) is appended to the list returned."
    from triton.runtime.jit import JITFunction
    runs, original = [], JITFunction.run
    def run(self, *args, **kwargs):
        runs.append(getattr(self, "__name__", self))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(JITFunction, "run", run)
    return runs


def _new_backward_call(B, Hq, Hkv, Lq, Lk, D, views, dlse:bool, scale:float, dtype=torch.bfloat16):
    "A training step's tensors: new ones (new addresses), o and lse from our forward, NaN-poisoned gradients."
    width = D + 4 if views == "unaligned" else D
    q, do = (randn(B, Hq, Lq, width, dtype=dtype)[..., :D] for _ in range(2))
    k, v = (randn(B, Hkv, Lk, width, dtype=dtype)[..., :D] for _ in range(2))
    o, lse = torch.empty(B, Hq, Lq, D, device=q.device, dtype=dtype), torch.empty(B, Hq, Lq, device=q.device)
    _attention_forward(q, k, v, o, lse, True, scale)
    return (do, q, k, v, o, lse, randn(B, Hq, Lq, dtype=torch.float32) if dlse else None)


@pytest.mark.gpu
@pytest.mark.parametrize("dlse", [False, True], ids=["no_dlse", "dlse"])
@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D, dkdv, views", SAVED_BACKWARD_CASES)
def test_gpu_backward_saved_launch_is_bit_identical(B, Hq, Hkv, Lq, Lk, D, dkdv, views, dlse, monkeypatch):
    """Call 1 chooses and launches through Triton; calls 2 and 3, with new tensors and another scale, go through the saved
    launch alone (no `JITFunction.run`) and give the same bits as the normal path with the same candidates."""
    import triton_fa2.dispatch as dispatch
    import triton_fa2.forward as fwd
    _one_backward_candidate(monkeypatch, dkdv)
    if views == "pointers": monkeypatch.setattr(fwd, "_has_tma", lambda device: False)
    runs = _count_triton_launches(monkeypatch)
    for call in range(3):
        scale = D ** -0.5 * (1 + 0.25 * call)
        inputs = _new_backward_call(B, Hq, Hkv, Lq, Lk, D, views, dlse, scale)
        grads = [torch.full_like(t, float("nan")) for t in inputs[1:4]]
        del runs[:]
        picks = _attention_backward(*inputs, *grads, True, scale)
        assert len(runs) == (2 if call == 0 else 0), (call, runs)
        assert [p.kernel for p in picks] == (["gluon_dkdv", "gluon_dq"] if dkdv == "gluon" else ["bwd_dkdv", "bwd_dq"])
        normal = [torch.full_like(t, float("nan")) for t in inputs[1:4]]
        _attention_backward(*inputs, *normal, True, scale, configs=picks)     # Triton's own path, the same candidates
        for name, g, n in zip(("dq", "dk", "dv"), grads, normal): assert torch.equal(g, n), (call, name)
    check_grads(grads, attention_backward_ref(*inputs[1:4], inputs[0], causal=True, scale=scale, dlse=inputs[6]), torch.bfloat16)
    (plan,) = dispatch._BACKWARD_PLANS.values()
    assert plan and plan.candidates == picks
    assert bool(plan.dq.tensor_maps) == (views != "pointers")


@pytest.mark.gpu
def test_gpu_backward_saved_launch_steps_aside_for_a_launch_hook(monkeypatch):
    "A profiler's launch hook must see both launches of every backward: with one installed, Triton's own path serves."
    from triton import knobs
    _one_backward_candidate(monkeypatch, "gluon")
    runs = _count_triton_launches(monkeypatch)
    inputs = _new_backward_call(1, 8, 8, 300, 300, 64, "tma", False, 0.125)
    for _ in range(2): _attention_backward(*inputs, *(torch.empty_like(t) for t in inputs[1:4]), True, 0.125)
    saved = [torch.full_like(t, float("nan")) for t in inputs[1:4]]
    del runs[:]
    _attention_backward(*inputs, *saved, True, 0.125)
    assert runs == []
    seen = []
    hook = lambda metadata: seen.append(metadata)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        hooked = [torch.full_like(t, float("nan")) for t in inputs[1:4]]
        _attention_backward(*inputs, *hooked, True, 0.125)
    finally: knobs.runtime.launch_enter_hook.remove(hook)
    assert len(runs) == 2 and len(seen) == 2
    assert all(torch.equal(a, b) for a, b in zip(saved, hooked))
    del runs[:]
    _attention_backward(*inputs, *hooked, True, 0.125)
    assert runs == []                                                    # the hook gone: the saved launch again


@pytest.mark.gpu
def test_gpu_a_training_step_launches_nothing_through_triton_after_the_first(monkeypatch):
    "`torch.autograd.grad` through `attention`, new tensors each step: from step 2 on, forward and backward skip `JITFunction.run`."
    import triton_fa2.dispatch as dispatch
    monkeypatch.setattr(dispatch, "_PLANS", {})
    _one_backward_candidate(monkeypatch, "gluon")
    runs = _count_triton_launches(monkeypatch)
    for step in range(3):
        q, k, v = (randn(2, 8, 256, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        do = randn(2, 8, 256, 64, dtype=torch.bfloat16)
        del runs[:]
        grads = torch.autograd.grad(attention(q, k, v, causal=True), (q, k, v), do)
        assert (len(runs) > 0) == (step == 0), (step, runs)
    check_grads(grads, attention_backward_ref(q.detach(), k.detach(), v.detach(), do, causal=True), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("first", ["backward", "checkpointed forward"])
def test_gpu_our_kernel_first_in_the_autograd_thread(first):
    """In a fresh process the autograd thread has no CUDA context until its first CUDA call; when that is our backward, or
    a forward recomputed there by activation checkpointing, the TMA descriptors need one bound (`launch.bind_context`)."""
    import subprocess, sys, textwrap
    code = textwrap.dedent(f'''
        import torch, triton_fa2
        from torch.utils.checkpoint import checkpoint
        q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
        spare = [torch.empty(1 << 19, dtype=torch.uint8, device="cuda") for _ in range(32)]
        del spare   # cached blocks: the autograd thread allocates without cudaMalloc, which would bind a context itself
        run = lambda q, k, v: triton_fa2.attention(q, k, v, causal=True)
        o = checkpoint(run, q, k, v, use_reentrant=False) if {first == "checkpointed forward"} else run(q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), do)
        assert all(g.isfinite().all() for g in grads)
        print("ok")''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("causal", [True, False])
def test_packed_variants_gradients_land_in_the_packed_tensor(causal):
    """flash-attn's packed entry points (qkv, kv; dense and packed end to end) as views of one leaf: their output and the
    leaf's gradient against float64 autograd through the same views."""
    from triton_fa2 import (flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func)
    qkv = randn(2, 29, 3, 2, 48).requires_grad_()
    cu = torch.tensor([0, 17, 29, 58], dtype=torch.int32, device=DEVICE)           # 17, 12 and 29 tokens
    calls = {
        "qkvpacked": (lambda t: flash_attn_qkvpacked_func(t, causal=causal), lambda t: t.unbind(2), None),
        "kvpacked": (lambda t: flash_attn_kvpacked_func(t[:, :, 0], t[:, :, 1:], causal=causal), lambda t: t.unbind(2), None),
        "varlen_qkvpacked": (lambda t: flash_attn_varlen_qkvpacked_func(t.flatten(0, 1), cu, 29, causal=causal),
                             lambda t: t.flatten(0, 1).unbind(1), cu),
        "varlen_kvpacked": (lambda t: flash_attn_varlen_kvpacked_func(t.flatten(0, 1)[:, 0], t.flatten(0, 1)[:, 1:], cu, cu, 29, 29,
                                                                      causal=causal), lambda t: t.flatten(0, 1).unbind(1), cu),
    }
    for name, (call, unpack, cu_seqlens) in calls.items():
        qkv.grad = None
        out = call(qkv)
        do = randn(*out.shape)
        out.backward(do)
        leaf = qkv.detach().double().requires_grad_()
        q, k, v = unpack(leaf)
        if cu_seqlens is None:
            ref = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, upcast=torch.float64)[0].transpose(1, 2)
        else:
            bounds = cu_seqlens.tolist()
            ref = torch.cat([attention_ref(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), causal=causal,
                                           upcast=torch.float64)[0][0].transpose(0, 1) for a, b in zip(bounds, bounds[1:])])
        ref.backward(do.double())
        assert (out.double() - ref).abs().max().item() <= 2e-3, name
        check_grads([qkv.grad], [leaf.grad], torch.float16, names=(f"{name}: dqkv",))


def test_packed_variants_have_flash_attns_signatures():
    import inspect
    import triton_fa2
    common = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic", "return_attn_probs"]
    expected = {"flash_attn_qkvpacked_func": ["qkv"], "flash_attn_kvpacked_func": ["q", "kv"],
                "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"],
                "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]}
    for name, leading in expected.items():   # flash-attn 2's arguments in order, then FlashAttention-4's sink
        assert list(inspect.signature(getattr(triton_fa2, name)).parameters) == leading + common + ["learnable_sink"], name
