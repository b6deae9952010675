"""The backward pass (`attention` and `flash_attn_func` under autograd; `dispatch._attention_backward`) against float64.

References: `backward.attention_backward_ref` (the formulas, float64) and PyTorch's autograd through `naive.attention_ref`
in float64. Errors are relative per gradient, thresholds per dtype. CPU (CI) runs Triton's interpreter on small shapes;
`pytest -m gpu` runs the matrix on the device.
"""
import pytest
import torch

import triton_fa2.ops as ops
from triton_fa2.backward import attention_backward_ref
from triton_fa2.candidates import BACKWARD, BACKWARD_GLUON, Candidate
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


def test_opcheck_including_autograd():
    "`torch.library.opcheck`: schema, fakes against real outputs, autograd registration and AOT dispatch."
    q, k, v = (randn(1, 2, 20, 32).requires_grad_() for _ in range(3))
    torch.library.opcheck(ops._attention_op, (q, k, v, True, 0.2, False))
    qf = randn(1, 20, 2, 32).transpose(1, 2).requires_grad_()
    torch.library.opcheck(ops._attention_op, (qf, k, v, False, 0.2, True))
    do = randn(1, 2, 20, 32)
    o, lse = ops._attention_op(q.detach(), k.detach(), v.detach(), True, 0.2, False)
    torch.library.opcheck(ops._attention_backward_op, (do, q.detach(), k.detach(), v.detach(), o, lse, None, True, 0.2))


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


def test_a_gluon_dkdv_pick_that_fails_falls_back_to_the_tl_pass_once(monkeypatch):
    "The dK/dV pass's Gluon pick failing at run time: one warning, the `tl` pass's gradients, never an error in the call."
    import warnings
    import triton_fa2.dispatch as dispatch
    import triton_fa2.gluon as gluon
    import triton_fa2.gluon_backward as gluon_bwd
    q, k, v, do = (randn(1, 2, 40, 64) for _ in range(4))
    refs = attention_backward_ref(q, k, v, do, causal=True)
    monkeypatch.setattr(dispatch, "_PICKS", {})
    poisoned_backward(q, k, v, do, True)                                  # chooses: the `tl` pass's pick for this key
    (key,) = [key for key in dispatch._PICKS if key[0] == "bwd_dkdv"]
    gluon_pick = BACKWARD_GLUON[64][0]
    monkeypatch.setitem(dispatch._PICKS, key, gluon_pick)                 # as if the Gluon pass had won the choice
    monkeypatch.setattr(gluon, "_DISABLED", [])
    monkeypatch.setattr(gluon_bwd, "gluon_dkdv_applies", lambda *args: not gluon._DISABLED)
    def broken(*args): raise RuntimeError("a Gluon API this code does not know")
    monkeypatch.setattr(gluon_bwd, "launch_dkdv", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            check_grads(poisoned_backward(q, k, v, do, True), refs, torch.float16)
            assert dispatch._PICKS[key].kernel == "bwd_dkdv"
    messages = [str(w.message) for w in caught if "Gluon" in str(w.message)]
    assert len(messages) == 1 and f"{gluon_pick.label} failed (RuntimeError" in messages[0], messages


def test_a_gluon_dkdv_config_where_it_cannot_run_is_refused():
    q, k, v, do = (randn(1, 2, 40, 64) for _ in range(4))
    with pytest.raises(ValueError, match="runs only on sm_90 with Gluon"):
        poisoned_backward(q, k, v, do, True, configs=(BACKWARD_GLUON[64][0], None))


GLUON_DKDV_CASES = [   # (B, Hq, Hkv, Lq, Lk, causal): Lq ≠ Lk both ways, GQA 4:1 and 8:1, one row, three keys, ragged
    (2, 8, 2, 333, 1000, True), (2, 4, 4, 1000, 333, True), (1, 8, 1, 257, 513, False), (1, 2, 2, 1, 700, True),
    (1, 2, 2, 700, 3, False), (3, 4, 4, 64, 64, True)]


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
