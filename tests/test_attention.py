"""The Triton forward kernel (`attention`, `flash_attn_func`) against `attention_ref` in float64.

CPU (CI) runs the kernel through Triton's interpreter on small shapes; the same tests run on the GPU on the device.
Tests marked `gpu` are the seed's full matrix and the large-tensor cases: `pytest -m gpu` on a CUDA machine.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import triton_fa2
import triton_fa2.candidates as cands
import triton_fa2.dispatch as dispatch
import triton_fa2.forward as fwd
import triton_fa2.launch as fast
import triton_fa2.ops as ops
from triton_fa2.candidates import Candidate
from triton_fa2.dispatch import _attention_forward
from triton_fa2.interface import attention, flash_attn_func, warmup
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device, interpreting
from sampling import pairwise

DEVICE = default_device()
# dtype → (max |o − o_ref|, ‖o − o_ref‖ / ‖o_ref‖) against float64 at unit-variance inputs: a few ulps of the output
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)}
LSE_TOL = dict(atol=1e-5, rtol=1e-5)  # lse is float32 on both sides of the comparison
DTYPES = [torch.float16, torch.bfloat16]


def randn(*shape, dtype=torch.float16, device=DEVICE):
    "Fresh unit-variance inputs, rounded to dtype: never zeros, never reused."
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


def errors(o, o_ref):
    """(max abs error / max(1, max |o_ref|), relative Frobenius error) of o against a float64 reference. The first is
    in units of the output's scale: a row that sees one or two keys has |o| up to ~4, where a bf16 ulp is 0.03."""
    diff = o.double() - o_ref
    scale = max(1.0, o_ref.abs().max().item()) if o_ref.numel() else 1.0
    return diff.abs().max().item() / scale, (diff.norm() / o_ref.norm().clamp(min=1e-30)).item()


def check(q, k, v, causal=False, scale=None, tol=None):
    """Run the kernel into NaN-poisoned buffers (every element must be written), compare o and lse with float64,
    and check that the public `attention` returns the same bits. Returns (o, lse)."""
    B, Hq, Lq, D = q.shape
    o = torch.full((B, Hq, Lq, D), float("nan"), device=q.device, dtype=q.dtype)
    lse = torch.full((B, Hq, Lq), float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, causal, D ** -0.5 if scale is None else scale)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, scale=scale, upcast=torch.float64)
    assert not o.isnan().any() and not lse.isnan().any(), "an element was left unwritten, or NaN was produced"
    max_abs, rel = errors(o, o_ref)
    tol_abs, tol_rel = tol or TOL[q.dtype]
    assert max_abs <= tol_abs and rel <= tol_rel, f"max abs {max_abs:.3g} (tol {tol_abs}), rel {rel:.3g} (tol {tol_rel})"
    torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)   # −∞ must match −∞ exactly
    o2, lse2 = attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse), "attention() must run the same kernel, deterministically"
    return o, lse


# (B, Hq, Hkv, Lq, Lk, D): each shape names the code path it exercises. With the interpreter's 32×16 tiles:
SHAPES = [
    (1, 1, 1, 1, 1, 64),        # one query, one key: a single partial tile on both axes
    (2, 3, 3, 17, 17, 64),      # odd length inside one Q block, two K tiles (16 + 1): the masked run alone
    (1, 2, 2, 64, 64, 64),      # multiples of both blocks: full run only when non-causal
    (1, 2, 2, 100, 100, 80),    # D = 80: a 128-wide tile with masked columns; ragged rows
    (1, 2, 2, 255, 255, 128),   # 255 = 7·32 + 31: ragged in both; many full tiles plus the diagonal
    (1, 2, 2, 1, 255, 16),      # decode-like: one query, long context; D = 16, the smallest tl.dot tile
    (1, 2, 2, 255, 1, 64),      # one key: causal, only the last query sees it (254 empty rows)
    (1, 2, 2, 37, 100, 16),     # Lq < Lk: bottom-right offset of 63 keys
    (1, 2, 2, 100, 37, 64),     # Lq > Lk: first 63 rows see nothing (O = 0, LSE = −∞); whole empty Q blocks
    (1, 4, 2, 100, 100, 64),    # GQA 2:1
    (1, 8, 2, 33, 65, 64),      # GQA 4:1, odd lengths
    (2, 6, 1, 29, 50, 32),      # MQA: one KV head for six query heads
    (1, 2, 2, 40, 40, 256),     # D = 256, the largest head dim
    (1, 2, 2, 40, 40, 24),      # D = 24: BLOCK_D 32 with 8 masked columns
    (1, 1, 1, 17, 1000, 8),     # D = 8 (tile padded to 16); 1000 keys = 62 full tiles + a partial one
]


# Every shape in both dtypes and with and without the mask, every dtype with and without it: all pairs (tests/sampling.py)
@pairwise(("B, Hq, Hkv, Lq, Lk, D", SHAPES), ("dtype", DTYPES), ("causal", [False, True]))
def test_matches_reference(B, Hq, Hkv, Lq, Lk, D, dtype, causal):
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    check(q, k, v, causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_causal(dtype):
    "1000 × 1000 causal: 32 Q blocks, the diagonal through the middle of 16-key tiles, 62 full tiles in the last block."
    check(*(randn(1, 1, 1000, 64, dtype=dtype) for _ in range(3)), causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views(dtype):
    "Transposed (B, L, H, D) views, a slice of a longer cache, every other head, every other batch: no copies needed."
    q_blhd, k_blhd, v_blhd = randn(4, 50, 6, 64, dtype=dtype), randn(4, 120, 3, 64, dtype=dtype), randn(4, 120, 3, 64, dtype=dtype)
    q, k, v = (t.transpose(1, 2) for t in (q_blhd, k_blhd, v_blhd))   # head and length strides swapped
    check(q, k, v, causal=True)
    check(q[::2, ::2], k[::2, :, 10:90], v[::2, :, 10:90], causal=True)  # batch, head and sequence strides
    kv = randn(2, 2, 1, 70, 64, dtype=dtype)                             # k and v packed in one tensor
    check(randn(2, 4, 30, 64, dtype=dtype).transpose(1, 2).contiguous().transpose(1, 2), kv[0], kv[1], causal=False)


def test_scale_override():
    q, k, v = (randn(1, 2, 40, 64) for _ in range(3))
    for scale in (0.05, 1.0, 0.3):
        check(q, k, v, causal=True, scale=scale)
    o_half = attention(q, k, v, scale=0.5 * 64 ** -0.5)
    assert not torch.equal(o_half, attention(q, k, v)), "the scale must reach the kernel"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("magnitude", [8.0, 30.0])
def test_adversarial_magnitudes(dtype, magnitude):
    "Inputs ×8 and ×30: scaled scores in the hundreds, softmax close to one-hot, the running max changing often."
    q, k, v = (randn(1, 2, 70, 64, dtype=dtype) * magnitude for _ in range(3))
    for causal in (False, True):
        check(q, k, v, causal)   # errors are relative to max |o_ref|, which is ×magnitude


def test_fp16_scores_beyond_fp16_range():
    """Bug class 4: q·k past fp16's 65504. With k = q ×40, each query's own score is |q|² ≈ 1600·64 = 102400: a kernel
    that formed scores in fp16 would give inf, then NaN. Scores here are float32 from the tensor cores."""
    q = randn(1, 2, 50, 64) * 40
    assert (q.float() @ q.float().transpose(-1, -2)).max() > 65504
    for causal in (False, True):
        check(q, q, randn(1, 2, 50, 64), causal)


@pairwise(("B, Hq, Hkv, Lq, Lk, D", [
    (2, 3, 3, 17, 17, 64),      # 17 keys: the one-key last tile online, the first fixed; causal: all online (row 0 sees one key)
    (1, 2, 2, 255, 255, 128),   # ragged: many fixed tiles before the masked, online ones
    (1, 2, 2, 100, 37, 64),     # Lq > Lk: rows that see no key at all
    (1, 8, 2, 33, 65, 64),      # GQA 4:1, odd lengths
]), ("dtype", DTYPES), ("causal", [False, True]))
def test_online_softmax_without_the_fixed_maximum(B, Hq, Hkv, Lq, Lk, D, dtype, causal):
    """`fixed_max=False`: the running maximum on every tile (the kernel's fallback, and what 03 derives) matches
    float64 too, and the default (each row's maximum fixed by the masked run) agrees with it to rounding."""
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    o = torch.full_like(q, float("nan")); lse = torch.full((B, Hq, Lq), float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, causal, D ** -0.5, fixed_max=False)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
    max_abs, rel = errors(o, o_ref)
    assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (max_abs, rel)
    torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)
    o_fixed, _ = check(q, k, v, causal)
    torch.testing.assert_close(o_fixed, o, atol=2 * TOL[dtype][0], rtol=0)


@pytest.mark.parametrize("dtype, log2_above", [(torch.float16, 20.0), (torch.bfloat16, 140.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_scores_far_above_the_fixed_maximum(dtype, log2_above, causal):
    """Each row's maximum is fixed by the masked tiles at the end of its keys (the last tile; causal: the diagonal),
    then kept for the tiles before them. Keys 32 … 127 here score up to `log2_above` (base 2) higher than every key
    from 128 on, past what P holds in this dtype (2^15.9 in fp16, 2^127 in bf16): for every row that sees key 128 or
    later they lie in the unmasked tiles, so P overflows to inf on the fast path and the kernel must notice and redo
    those blocks online. Causal: rows before 128 see them in their own diagonal tiles (no overflow), in the same grid."""
    D, L = 64, 240
    u = torch.nn.functional.normalize(torch.randn(D), dim=0)
    q = (torch.randn(1, 2, L, D) * 0.5 + 3 * u).to(dtype).to(DEVICE)
    boost = torch.zeros(L); boost[32:128] = torch.linspace(0, 1, 96)           # the last tile starts at 128 or later
    k = (torch.randn(1, 2, L, D) * 0.5 + boost[:, None] * u * log2_above * D ** 0.5 / (3 * fwd.LOG2E)).to(dtype).to(DEVICE)
    v = randn(1, 2, L, D, dtype=dtype)
    scores = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5 * fwd.LOG2E
    above = scores[..., 32:128].amax(-1) - scores[..., 128:].amax(-1)
    assert above[..., 128:].max() > {torch.float16: 15.9, torch.bfloat16: 128}[dtype]   # rows that see key 128 on
    check(q, k, v, causal)


def test_rows_that_see_no_key():
    "Bottom-right causal with Lq > Lk: the first Lq − Lk rows give O = 0 exactly and LSE = −∞, never NaN."
    q, k, v = randn(1, 2, 90, 32), randn(1, 2, 20, 32), randn(1, 2, 20, 32)
    o, lse = check(q, k, v, causal=True)
    assert o[:, :, :70].abs().max().item() == 0.0
    assert (lse[:, :, :70] == float("-inf")).all() and lse[:, :, 70:].isfinite().all()


def test_zero_sizes():
    "Empty batch, heads or queries give empty outputs; no keys at all gives O = 0, LSE = −∞ (a softmax over nothing)."
    for B, Hq, Lq in [(0, 2, 8), (1, 0, 8), (1, 2, 0)]:   # no batch; no query heads (over one KV head); no queries
        kv = randn(B, 1, 8, 16)
        o, lse = attention(randn(B, Hq, Lq, 16), kv, kv, return_lse=True)
        assert o.shape == (B, Hq, Lq, 16) and lse.shape == (B, Hq, Lq)
    q, kv = randn(1, 2, 5, 16), randn(1, 2, 0, 16)
    o, lse = attention(q, kv, kv, return_lse=True)
    assert o.abs().max().item() == 0.0 and (lse == float("-inf")).all()


def test_flash_attn_func_layout_and_no_copies(monkeypatch):
    "flash-attn's (B, L, H, D) layout: same kernel, same bits as attention on the transposed views, and no copies."
    q, k, v = randn(2, 33, 4, 64, dtype=torch.bfloat16), randn(2, 47, 2, 64, dtype=torch.bfloat16), randn(2, 47, 2, 64, dtype=torch.bfloat16)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 33, 4, 64) and out.is_contiguous() and lse.shape == (2, 4, 33) and probs is None
    o_sdpa, lse_sdpa = attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_lse=True)
    assert torch.equal(out.transpose(1, 2), o_sdpa) and torch.equal(lse, lse_sdpa)
    assert torch.equal(flash_attn_func(q, k, v, 0.0, 0.2, True), attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, scale=0.2).transpose(1, 2))
    seen = {}
    real = dispatch._attention_forward
    def spy(q_, k_, v_, o_, *args, **kwargs):
        seen.update(q=q_.data_ptr(), k=k_.data_ptr(), v=v_.data_ptr(), o=o_.data_ptr())
        return real(q_, k_, v_, o_, *args, **kwargs)
    monkeypatch.setattr(ops, "_attention_forward", spy)
    out = flash_attn_func(q, k, v)
    assert seen == dict(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr()), "inputs or output were copied"


@pytest.mark.parametrize("kwargs, message", [
    (dict(dropout_p=0.1), "dropout_p must be 0.0"),
    (dict(window_size=(64, 0, 1)), "window_size must be"),      # windows themselves are tests/test_score_mods.py's
    (dict(softcap=-30.0), "softcap must be a finite number"),
])
def test_flash_attn_func_refuses_unsupported_features(kwargs, message):
    q = randn(1, 8, 4, 64)
    with pytest.raises(ValueError, match=message): flash_attn_func(q, q, q, **kwargs)


def test_deterministic_and_warmup():
    q, k, v = (randn(2, 2, 77, 64, dtype=torch.bfloat16) for _ in range(3))
    config = warmup(q, k, v, causal=True)
    assert isinstance(config, Candidate) and config.kernel in ("tl", "gluon")
    if interpreting(): assert config == cands.INTERPRETER_PREFILL
    assert torch.equal(attention(q, k, v, causal=True), attention(q, k, v, causal=True))


def test_fixed_config_bypasses_the_choice():
    "A given candidate runs without the dispatcher's choice, bit for bit what the dispatcher runs when it picks that one."
    q, k, v = (randn(1, 2, 45, 64) for _ in range(3))
    config = warmup(q, k, v, causal=True)
    o = torch.full_like(q, float("nan")); lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, True, 64 ** -0.5, config=config)
    assert torch.equal(o, attention(q, k, v, causal=True))


def test_public_names():
    "The package's top level exposes the kernel's public API."
    assert triton_fa2.attention is attention and triton_fa2.flash_attn_func is flash_attn_func
    assert triton_fa2.warmup is warmup


def test_bf16_dot_workaround_only_under_the_interpreter():
    "Triton's interpreter computes bf16 tl.dot on raw bits: only then do the dots take float32 copies of bf16 values."
    assert fwd._dot_in_fp32(torch.bfloat16) == interpreting()
    assert not fwd._dot_in_fp32(torch.float16)


q16 = lambda *s: randn(*s)  # noqa: E731
BAD_INPUTS = [  # (q, k, v, kwargs, exception, message): each names what it received and what is allowed
    (lambda: (q16(4, 16, 64), q16(1, 4, 16, 64), q16(1, 4, 16, 64)), {}, ValueError, r"q must have 4 dimensions \(B, H, L, D\), got shape \(4, 16, 64\)"),
    (lambda: (q16(1, 4, 16, 64).float(),) * 3, {}, TypeError, "must all be torch.float16 or all torch.bfloat16"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 4, 16, 64).bfloat16(), q16(1, 4, 16, 64)), {}, TypeError, "k torch.bfloat16"),
    (lambda: (q16(1, 4, 16, 64).double(), q16(1, 4, 16, 64), q16(1, 4, 16, 64)), {}, TypeError, "got q torch.float64"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 3, 16, 64), q16(1, 3, 16, 64)), {}, ValueError, r"got Hq=4 and Hkv=3; try Hkv in \[1, 2, 4\]"),
    (lambda: (q16(2, 4, 16, 64), q16(1, 4, 16, 64), q16(1, 4, 16, 64)), {}, ValueError, "batch sizes differ: q 2, k 1, v 1"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 4, 16, 32), q16(1, 4, 16, 32)), {}, ValueError, "same head dim, got 64 and 32"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 4, 16, 64), q16(1, 4, 17, 64)), {}, ValueError, "k and v must agree in heads and length"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 4, 16, 64), q16(1, 4, 16, 32)), {}, ValueError, "got D=64 and Dv=32"),
    (lambda: (q16(1, 4, 16, 12),) * 3, {}, ValueError, "multiple of 8 between 8 and 256, got D=12"),
    (lambda: (q16(1, 4, 16, 264),) * 3, {}, ValueError, "got D=264"),
    (lambda: (q16(1, 4, 16, 128)[..., ::2],) * 3, {}, ValueError, r"call q.contiguous\(\)"),
    (lambda: (q16(1, 4, 16, 64), q16(1, 0, 16, 64), q16(1, 0, 16, 64)), {}, ValueError, "got Hq=4 and Hkv=0"),
    (lambda: ([[1.0]], q16(1, 4, 16, 64), q16(1, 4, 16, 64)), {}, TypeError, "q must be a torch.Tensor, got list"),
    (lambda: (q16(1, 4, 16, 64),) * 3, dict(causal=torch.ones(16, 16, dtype=torch.bool)), TypeError, "causal must be a bool"),
    (lambda: (q16(1, 4, 16, 64),) * 3, dict(scale=float("inf")), ValueError, "scale must be finite"),
    (lambda: (q16(1, 4, 16, 64),) * 3, dict(scale="0.1"), TypeError, "scale must be a float or None, got str"),
]


@pytest.mark.parametrize("make, kwargs, exc, message", BAD_INPUTS)
def test_bad_inputs(make, kwargs, exc, message):
    with pytest.raises(exc, match=message): attention(*make(), **kwargs)


def test_bad_inputs_in_flash_attn_layout():
    "flash_attn_func checks ranks in its own layout, then everything else on the (B, H, L, D) views."
    q, k = randn(1, 16, 4, 64), randn(1, 16, 3, 64)
    with pytest.raises(ValueError, match="got Hq=4 and Hkv=3"): flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match=r"4-D \(B, L, H, D\)"): flash_attn_func(q[0], q, q)
    with pytest.raises(ValueError, match="k and v must agree in heads and length"): flash_attn_func(q, q, randn(1, 17, 4, 64))


def test_causal_numpy_bools_and_type_names():
    "Every entry point converts a NumPy bool; other types are named with their module."
    q = randn(1, 24, 2, 32)
    assert torch.equal(flash_attn_func(q, q, q, causal=np.True_), flash_attn_func(q, q, q, causal=True))
    assert torch.equal(flash_attn_func(q, q, q, causal=np.False_), flash_attn_func(q, q, q, causal=False))
    t = q.transpose(1, 2)
    assert torch.equal(attention(t, t, t, causal=np.True_), attention(t, t, t, causal=True))
    assert warmup(t, t, t, causal=np.True_) is not None
    for f, t in ((flash_attn_func, q), (attention, t)):
        with pytest.raises(TypeError, match="causal must be a bool, got numpy.int64"): f(t, t, t, causal=np.int64(1))
        with pytest.raises(TypeError, match="causal must be a bool, got int"): f(t, t, t, causal=1)


def test_zero_heads():
    "No KV head is refused with what is wrong; no query head over one KV head stays an empty output (test_zero_sizes)."
    message = re.escape("k and v have 0 heads, got Hq=0 and Hkv=0; attention needs at least one key/value head")
    with pytest.raises(ValueError, match=message): attention(randn(1, 0, 8, 16), randn(1, 0, 8, 16), randn(1, 0, 8, 16))
    with pytest.raises(ValueError, match=message): flash_attn_func(randn(1, 8, 0, 16), randn(1, 8, 0, 16), randn(1, 8, 0, 16))


def test_the_other_layout_is_named_where_only_it_fits():
    """SDPA's (B, H, L, D) tensors given to flash_attn_func, and flash-attn's given to attention: refused with the fix
    where the head counts fit only the other layout. Where they fit both, nothing is refused (valid input must run)."""
    q, k = randn(1, 4, 20, 32), randn(1, 2, 30, 32)                # (B, Hq, Lq, D), (B, Hkv, Lk, D)
    with pytest.raises(ValueError, match=re.escape(
            "got Hq=20 and Hkv=30; try Hkv in [1, 2, 4, 5, 10, 20]. If these are SDPA's (B, H, L, D) tensors (q (1, 4, 20, 32), "
            "k (1, 2, 30, 32), v (1, 2, 30, 32)): flash_attn_func takes (B, L, H, D); pass q.transpose(1, 2), k.transpose(1, 2), "
            "v.transpose(1, 2), or call triton_fa2.attention")):
        flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match=re.escape("If these are flash-attn's (B, L, H, D) tensors (q (1, 20, 4, 32)")):
        attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2))
    with pytest.raises(ValueError, match="k and v must agree in heads and length") as e:   # other errors: no hint
        flash_attn_func(randn(1, 16, 4, 64), randn(1, 16, 3, 64), randn(1, 17, 3, 64))
    assert "If these are" not in str(e.value)
    with pytest.raises(ValueError, match="got Hq=4 and Hkv=3") as e:   # swapped, 16 % 24 ≠ 0: wrong either way, no hint
        attention(randn(1, 4, 16, 64), randn(1, 3, 24, 64), randn(1, 3, 24, 64))
    assert "If these are" not in str(e.value)
    same = randn(1, 6, 6, 32)                                       # fits both layouts: runs, as flash-attn's layout
    assert torch.equal(flash_attn_func(same, same, same), attention(*(same.transpose(1, 2),) * 3).transpose(1, 2))


def test_decode_refuses_inputs_that_need_grad():
    "decode has no backward: it must not silently drop gradients (attention has one: tests/test_backward.py); under no_grad it runs."
    q = randn(1, 2, 1, 16).requires_grad_()
    k = randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="decode is an inference kernel"): triton_fa2.decode(q, k, k)
    with torch.no_grad(): triton_fa2.decode(q, k, k)


def test_tensors_on_two_devices_are_refused():
    q = randn(1, 2, 8, 16)
    other = torch.device("meta")
    with pytest.raises(ValueError, match="must be on one device"): attention(q, q.to(other), q)


def test_triton_imported_first_without_a_gpu(tmp_path):
    "Without a GPU, `import triton` before `import triton_fa2` leaves Triton's helpers built for a GPU: a clear error."
    if torch.cuda.is_available(): pytest.skip("only without a GPU does triton_fa2 select the interpreter itself")
    code = textwrap.dedent("""
        import os; os.environ.pop("TRITON_INTERPRET", None)
        import triton, torch
        import triton_fa2
        q = torch.randn(1, 1, 4, 16, dtype=torch.float16)
        triton_fa2.attention(q, q, q)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode != 0 and "import triton_fa2 first" in run.stderr, run.stderr[-2000:]


def test_cpu_tensors_without_the_interpreter(tmp_path):
    "With TRITON_INTERPRET=0, CPU tensors are refused with the fix, not handed to a GPU kernel."
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import torch
        from triton_fa2 import attention
        q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
        try: attention(q, q, q)
        except ValueError as e: print("ValueError:", e)
    """))
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "ValueError: q, k, v are on cpu, but Triton kernels run on a CUDA GPU" in out.stdout, out.stdout + out.stderr
    assert "TRITON_INTERPRET=1" in out.stdout


def test_prefill_candidates():
    "Every head dim keeps candidates on an H200 and on a T4; D = 256 keeps none that would spill."
    for block_d in (16, 32, 64, 128, 256):
        for smem in (232448, 65536):      # H200, T4 (bytes per block)
            kept = [c for c in cands.PREFILL_TL if cands.fits(c, c.BLOCK_M, block_d, smem)]
            assert kept or block_d == 256 and smem == 65536, (block_d, smem)
    assert not any(cands.fits(c, c.BLOCK_M, 256, 232448) and c.BLOCK_N > 64 for c in cands.PREFILL_TL)


# ----------------------------------------------------------------------------------------------------------- GPU
def check_sampled(q, k, v, causal, pairs=None, tol_sdpa=None):
    """Large shapes: o against the float32 reference one (batch, head) at a time for a few pairs (the corners catch
    offset bugs), NaN anywhere fails. Returns the max abs error seen."""
    o = attention(q, k, v, causal=causal)
    assert not o.isnan().any()
    B, Hq = q.shape[:2]
    g = Hq // k.shape[1]
    pairs = pairs or sorted({(0, 0), (B - 1, Hq - 1), (B // 2, Hq // 2), (0, Hq - 1), (B - 1, 0)})
    worst = 0.0
    for b, h in pairs:
        o_ref = attention_ref(q[b:b+1, h:h+1], k[b:b+1, h//g:h//g+1], v[b:b+1, h//g:h//g+1], causal=causal)[0]
        max_abs, rel = errors(o[b:b+1, h:h+1], o_ref.double())
        tol_abs, tol_rel = TOL[q.dtype]
        assert max_abs <= tol_abs and rel <= tol_rel, (b, h, max_abs, rel)
        worst = max(worst, max_abs)
    return o, worst


# The largest cases hold about 20 GiB at once: alone (gpu_memory), as beside other workers they can run out of memory.
SEED_MATRIX = [pytest.param(B, N, D, causal, dtype, marks=[pytest.mark.gpu_memory] if B * N * D >= 32 * 8192 * 128 else [])
               for B in (1, 8, 32) for N in (512, 2048, 8192, 16384) for D in (64, 128)
               for causal in (False, True) for dtype in DTYPES]


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, D, causal, dtype", SEED_MATRIX)
def test_seed_matrix(B, N, D, causal, dtype):
    "The seed's prefill grid, H = 32: sampled heads against float32, and every element against SDPA's FA2 backend."
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (randn(B, 32, N, D, dtype=dtype) for _ in range(3))
    o, _ = check_sampled(q, k, v, causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_fa2 = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    worst = max((o[b].float() - o_fa2[b].float()).abs().max().item() for b in range(B))   # one sequence at a time
    assert worst <= (1e-2 if dtype == torch.float16 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", [
    (2, 16, 16, 1024, 1024, 256),   # the largest head dim at length
    (2, 16, 4, 1000, 1000, 128),    # ragged length, GQA 4:1
    (1, 32, 8, 4099, 4099, 128),    # 4099 = 32·128 + 3: a three-key last tile
    (3, 8, 8, 1000, 4099, 64),      # chunked prefill: the last 1000 queries of a 4099-token sequence
    (2, 12, 12, 777, 777, 80),      # head dim 80: masked columns at scale
    (4, 32, 8, 1, 4099, 128),       # one query per sequence
])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ragged_and_wide(B, Hq, Hkv, Lq, Lk, D, dtype, causal):
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    check_sampled(q, k, v, causal)
    check(q[:1, :2], k[:1, :1], v[:1, :1], causal)   # one head group in full, with poisoned outputs


@pytest.mark.gpu
def test_gpu_every_candidate_is_correct():
    "Whichever candidate the dispatcher picks must be right: run every `tl` candidate that fits, on awkward shapes."
    for config in cands.PREFILL_TL:
        for (B, Hq, Hkv, Lq, Lk, D, causal) in [(2, 4, 2, 1000, 777, 128, True), (1, 2, 2, 333, 4099, 64, False),
                                                 (1, 2, 1, 257, 100, 80, True), (1, 2, 2, 130, 130, 256, True)]:
            if not cands.fits(config, config.BLOCK_M, fwd.triton.next_power_of_2(D), cands._max_smem(0)): continue
            for dtype in DTYPES:
                q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
                o = torch.full_like(q, float("nan")); lse = torch.full(q.shape[:3], float("nan"), device=q.device)
                _attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=config)
                o_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
                max_abs, rel = errors(o, o_ref)
                assert max_abs <= TOL[dtype][0] and rel <= TOL[dtype][1], (config, D, dtype, max_abs, rel)
                torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_offsets_past_2_31_elements():
    """int64 offsets (bug class 7): a batch offset past 2³¹ elements in q, k, v and o (SDPA layout), and key offsets
    past 2³¹ in one (batch, head)'s K and V (flash-attn layout, 131073 keys × 128 heads × 128)."""
    B = 2 ** 31 // (16 * 128 * 128) + 1                      # 8193 × 16 heads × 128 tokens × 128 = 2³¹ + 262144
    q, k, v = (randn(B, 16, 128, 128, dtype=torch.bfloat16) for _ in range(3))
    assert q.numel() > 2 ** 31
    check_sampled(q, k, v, causal=True, pairs=[(0, 0), (B - 1, 15), (B - 1, 0)])
    del q, k, v
    Lk = 2 ** 31 // (128 * 128) + 1                          # 131073 keys: key offsets reach 2³¹ + 16384 elements
    k, v = (randn(1, Lk, 128, 128) for _ in range(2))
    q = randn(1, 16, 128, 128)
    assert k.numel() > 2 ** 31
    out = flash_attn_func(q, k, v, causal=True)
    for h in (0, 127):
        o_ref = attention_ref(q[:, :, h:h+1].transpose(1, 2), k[:, :, h:h+1].transpose(1, 2), v[:, :, h:h+1].transpose(1, 2), causal=True)[0]
        max_abs, rel = errors(out[:, :, h:h+1].transpose(1, 2), o_ref.double())
        assert max_abs <= TOL[torch.float16][0] and rel <= TOL[torch.float16][1], (h, max_abs, rel)


def test_plain_eager_calls_skip_the_dispatcher_and_everything_else_sees_the_operator():
    "`_plain_eager` decides whether the public functions call the operator; modes, subclasses and profiles must see it."
    from torch.utils.flop_counter import FlopCounterMode
    q, k, v = randn(1, 2, 20, 32), randn(1, 2, 20, 32), randn(1, 2, 20, 32)
    assert ops._plain_eager(q, k, v)
    assert not ops._plain_eager(q, k, torch.nn.Parameter(v, requires_grad=False))   # a tensor subclass
    with torch.device(DEVICE): assert not ops._plain_eager(q, k, v)                  # a TorchFunctionMode
    with FlopCounterMode(display=False): assert not ops._plain_eager(q, k, v)       # a TorchDispatchMode
    with torch.profiler.profile(): assert not ops._plain_eager(q, k, v)
    o = attention(q, k, v, causal=True)
    with FlopCounterMode(display=False): o_mode = attention(q, k, v, causal=True)   # through the operator
    assert torch.equal(o, o_mode)
    assert not fast.fast_launch_possible(q) or q.is_cuda                             # saved launches: GPUs only


def test_saved_launches_step_aside_for_launch_hooks():
    "A profiler's launch hook (Triton 3.6 keeps them in a HookChain) must see every launch: Triton's own path then."
    from triton import knobs
    hooks = knobs.runtime.launch_enter_hook
    assert fast._no_hook(hooks) and fast._no_hook(None)
    hook = lambda metadata: None
    hooks.add(hook)
    try: assert not fast._no_hook(hooks)
    finally: hooks.remove(hook)
    assert fast._no_hook(hooks)


# Saved launches (`_Launch`): each case names the path it exercises; every case is called three times with fresh
# inputs, so that calls 2 and 3 run through the plan built after call 2's launch by Triton, into NaN-poisoned outputs.
SAVED_LAUNCH_CASES = [
    ((2, 8, 8, 1000, 1000, 128), True, "bhld"),     # tensor descriptors, causal, ragged length
    ((2, 8, 8, 300, 700, 64), False, "bhld"),       # tensor descriptors, Lq < Lk, non-causal
    ((1, 8, 2, 512, 513, 128), True, "blhd"),       # flash-attn layout views, GQA 4:1 unpacked, Lk = Lq + 1
    ((1, 8, 2, 1, 4099, 128), True, "bhld"),        # packed GQA rows: pointers
    ((2, 4, 4, 257, 257, 80), True, "offset"),      # q starts 2 bytes past 16-byte alignment: pointers; D = 80
]


def one_candidate(monkeypatch):
    "Fresh plans and picks, and one candidate: these tests check the launch path, not the choice (one compile each)."
    monkeypatch.setattr(dispatch, "_PLANS", {}); monkeypatch.setattr(dispatch, "_PICKS", {})   # call 1 chooses again
    monkeypatch.setattr(dispatch, "prefill_candidates", lambda *a, **kw: [Candidate("tl", 64, 64, 4, 3)])


def _saved_launch_inputs(shape, layout, dtype):
    B, Hq, Hkv, Lq, Lk, D = shape
    if layout == "blhd":
        return (randn(B, Lq, Hq, D, dtype=dtype).transpose(1, 2), randn(B, Lk, Hkv, D, dtype=dtype).transpose(1, 2),
                randn(B, Lk, Hkv, D, dtype=dtype).transpose(1, 2))
    q = randn(B * Hq * Lq * D + 1, dtype=dtype)[1:].view(B, Hq, Lq, D) if layout == "offset" else randn(B, Hq, Lq, D, dtype=dtype)
    return q, randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, causal, layout", SAVED_LAUNCH_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_saved_launches(shape, causal, layout, dtype, monkeypatch):
    one_candidate(monkeypatch)
    calls = []
    original = fast._Launch.__call__
    monkeypatch.setattr(fast._Launch, "__call__", lambda self, *a: (calls.append(self.use_tma), original(self, *a)))
    for _ in range(3):
        q, k, v = _saved_launch_inputs(shape, layout, dtype)
        check(q, k, v, causal)                           # _attention_forward into poisoned buffers, then attention()
    # call 1 chooses, and Triton launches the pick (the plan is saved); calls 2–6 go through the plan
    assert len(calls) == 5, calls
    assert all(calls) == (layout in ("bhld", "blhd") and fwd._has_tma(q.device) and not fwd._should_pack_gqa(shape[3], shape[1] // shape[2]))


@pytest.mark.gpu
def test_gpu_saved_launch_reuses_addresses_streams_and_graphs(monkeypatch):
    "A tensor map cached for an address must see new data there; other streams and CUDA graphs must get the launch."
    one_candidate(monkeypatch)
    q, k, v = (randn(2, 8, 512, 128, dtype=torch.bfloat16) for _ in range(3))
    for _ in range(3): attention(q, k, v, causal=True)  # the plan and q/k/v's maps exist now
    for t in (q, k, v): t.copy_(torch.randn_like(t))   # same addresses, new data
    o = attention(q, k, v, causal=True)
    o_ref = attention_ref(q, k, v, causal=True, upcast=torch.float64)[0]
    assert errors(o, o_ref)[0] <= TOL[torch.bfloat16][0]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        o_side = attention(q, k, v, causal=True)
    stream.synchronize()
    assert torch.equal(o_side, o)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): o_graph = attention(q, k, v, causal=True)
    for t in (q, k, v): t.copy_(torch.randn_like(t))
    graph.replay(); torch.cuda.synchronize()
    o_ref = attention_ref(q, k, v, causal=True, upcast=torch.float64)[0]
    assert errors(o_graph, o_ref)[0] <= TOL[torch.bfloat16][0]


class _FakeDriver:
    "Stands in for Triton's CUDA driver on a CPU: records tensor-map encodings, a fixed stream."
    def __init__(self):
        self.encoded = []
        self.utils = type("Utils", (), {"fill_tma_descriptor": lambda _, *a: self.encoded.append(a) or ("map", a[0])})()
    def get_current_stream(self, device): return 77


def _fake_compiled_kernel(raw, descriptors:bool):
    "A compiled kernel as `_Launch` reads it from Triton 3.6: `run` (the launcher) wraps the C launch when descriptors exist."
    meta = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[1, 1, rows, 64], fp4_padded=False) for rows in (64, 32, 32, 64)]
    launcher, tensordesc_indices, tensordesc_meta = raw, {0, 1, 2, 3}, meta
    def inner(*args): return launcher(*args, tensordesc_indices, tensordesc_meta)   # Triton's wrapper, same free variables
    run = type("Launcher", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                    launch_pdl=False, launch=staticmethod(inner if descriptors else raw)))()
    return type("Compiled", (), dict(run=run, function=1234, packed_metadata="packed",
                                     metadata=type("Meta", (), dict(tensordesc_meta=meta))()))()


@pytest.mark.parametrize("descriptors", [True, False], ids=["descriptors", "pointers"])
def test_saved_launch_passes_triton_3_6s_launcher_arguments(descriptors, monkeypatch):
    """The arguments a `_Launch` hands to Triton's C launcher, in Triton 3.6's order: grid, stream, function, flags,
    scratch, metadata, hooks, then each descriptor expanded to (tensor map, shape, strides), LSE and the scalars with the
    new scale. Tensor maps are encoded once per address. (The GPU tests check the same launches against float64.)"""
    driver = _FakeDriver()
    monkeypatch.setattr(fwd.triton.runtime.driver, "_active", driver)
    calls = []
    kernel = _fake_compiled_kernel(lambda *a: calls.append(a), descriptors)
    shapes = [(1, 2, 64, 64), (1, 2, 96, 64), (1, 2, 96, 64), (1, 2, 64, 64)]   # q, k, v, o: Lk = 96 ≠ Lq = 64
    q, k, v, o = (torch.randn(*s, dtype=torch.float16) for s in shapes)
    lse = torch.empty(1, 2, 64)
    tiles = [fwd.TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, 64]) for t, r in zip((q, k, v, o), (64, 32, 32, 64))] \
        if descriptors else [q, k, v, o]
    nowhere = torch.zeros(16)
    scalars = list(range(100, 112)) + [2, 1, 64, 64, 0.5]                    # 12 strides, Hq, g, Lq, Lk, qk_scale
    scalars += [160, 0, 0.0, 0.0, nowhere, 0, nowhere]                        # the score modifiers' arguments, all off
    constants = [64, 64, True, False, False, 64, 64, descriptors, True, True,   # HEAD_DIM … FIXED_MAX, in signature order
                 False, False, False, False]                                   # WINDOW, SOFTCAP, ALIBI, SINK
    args = tiles + [lse] + scalars + constants
    assert len(args) == len(fwd._ATTN_FWD_ARGS)
    plan = fast._Launch(kernel, 10, args, "candidate", fwd._ATTN_FWD_ARGS)
    q2, k2, v2, o2 = (torch.randn(*s, dtype=torch.float16) for s in shapes)
    lse2 = torch.empty(1, 2, 64)
    for _ in range(2): plan(q2, k2, v2, o2, lse2, 0.25 * fwd.LOG2E)
    head = (10, 1, 1, 77, 1234, False, False, None, None, "packed", None, None, None)
    if descriptors:
        expanded = []
        for t in (q2, k2, v2, o2): expanded += [("map", t.data_ptr()), *t.shape, *t.stride()]
    else: expanded = [q2, k2, v2, o2]
    scale_at = fwd._ATTN_FWD_ARGS.index("qk_scale")
    want = (*head, *expanded, lse2, *args[5:scale_at], 0.25 * fwd.LOG2E, *args[scale_at + 1:])
    assert len(calls) == 2 and all(len(c) == len(want) and all(a is b or a == b for a, b in zip(c, want)) for c in calls)
    assert len(driver.encoded) == (4 if descriptors else 0)                  # the second call reused the four maps
    if descriptors:
        assert driver.encoded == [(t.data_ptr(), 3, 2, fwd_tma_host_dtype(9), [1, 1, r, 64], list(t.shape), list(t.stride()), 0)
                                  for t, r in zip((q2, k2, v2, o2), (64, 32, 32, 64))]


@pytest.mark.parametrize("descriptors", [True, False], ids=["descriptors", "pointers"])
def test_the_general_saved_launch_replays_the_prefill_launch_as_launch_does(descriptors, monkeypatch):
    "`_SavedLaunch`, given the forward's q, k, v, o, lse and qk_scale per call, hands Triton's C launcher what `_Launch` does."
    monkeypatch.setattr(fwd.triton.runtime.driver, "_active", _FakeDriver())
    calls = {"launch": [], "saved": []}
    shapes = [(1, 2, 64, 64), (1, 2, 96, 64), (1, 2, 96, 64), (1, 2, 64, 64)]
    q, k, v, o = (torch.randn(*s, dtype=torch.float16) for s in shapes)
    tiles = [fwd.TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, 64]) for t, r in zip((q, k, v, o), (64, 32, 32, 64))] \
        if descriptors else [q, k, v, o]
    nowhere = torch.zeros(16)
    args = tiles + [torch.empty(1, 2, 64)] + list(range(100, 112)) + [2, 1, 64, 64, 0.5] + [160, 0, 0.0, 0.0, nowhere, 0, nowhere] \
        + [64, 64, True, False, False, 64, 64, descriptors, True, True, False, False, False, False]
    names = fwd._ATTN_FWD_ARGS
    plans = (fast._Launch(_fake_compiled_kernel(lambda *a: calls["launch"].append(a), descriptors), 10, args, "c", names),
             fast._SavedLaunch(_fake_compiled_kernel(lambda *a: calls["saved"].append(a), descriptors), 10, args, names,
                               (*names[:5], "qk_scale")))
    new = [torch.randn(*s, dtype=torch.float16) for s in shapes] + [torch.empty(1, 2, 64)]
    for plan in plans:
        for _ in range(2): plan(*new, 0.25)
    assert len(calls["launch"]) == len(calls["saved"]) == 2
    for a, b in zip(*calls.values()):
        assert len(a) == len(b) and all(x is y or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(a, b))


def fwd_tma_host_dtype(device_code):
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    return TMA_DTYPE_DEVICE_TO_HOST[device_code]


class _RecordLaunch:
    "Stands in for a jitted kernel: records the launch options instead of launching."
    def __init__(self): self.options = None
    def __getitem__(self, grid):
        def launch(*args, **kwargs): self.options = kwargs
        return launch


def test_a_given_config_launches_with_all_its_options(monkeypatch):
    "A config passed to the launch keeps its register cap and CTA count (they were once dropped: only warps and stages went)."
    recorder = _RecordLaunch()
    monkeypatch.setattr(fwd, "_attn_fwd", recorder)
    q, k, v = (randn(1, 2, 64, 64) for _ in range(3))
    config = Candidate("tl", 64, 32, 8, 2, maxnreg=128)
    _attention_forward(q, k, v, torch.empty_like(q), torch.empty(1, 2, 64, device=q.device), True, 0.125, config=config)
    assert {k: recorder.options[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "maxnreg")} == \
        dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2, maxnreg=128)
