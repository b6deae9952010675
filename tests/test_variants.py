"""The Hopper variants of the forward kernel under measurement (`_attention_forward(..., variant=...)`, issue 6), each
against `attention_ref` in float64. They are off by default; these tests keep every one of them correct while the
measurements decide which become the default. CPU (CI): Triton's interpreter, which executes tensor descriptors too.
"""
import itertools

import pytest
import torch

from triton_fa2.forward import VARIANTS, _attention_forward, _descriptors_fit, _gpu_configs, _shape
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device, interpreting
from test_attention import LSE_TOL, TOL, errors, randn

DEVICE = default_device()
ONE_AT_A_TIME = [{name: True} for name in VARIANTS]
ALL = dict.fromkeys(VARIANTS, True)


def check_variant(q, k, v, causal, variant, config=None):
    "Poisoned outputs, one launch with `variant`, o and lse against float64."
    B, Hq, Lq, D = q.shape
    o = torch.full((B, Lq, Hq, D), float("nan"), device=q.device, dtype=q.dtype).transpose(1, 2)  # flash layout view
    lse = torch.full((B, Hq, Lq), float("nan"), device=q.device)
    _attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=config, pack_gqa=False, variant=variant)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, upcast=torch.float64)
    assert not o.isnan().any() and not lse.isnan().any(), "an element was left unwritten, or NaN was produced"
    max_abs, rel = errors(o, o_ref)
    tol_abs, tol_rel = TOL[q.dtype]
    assert max_abs <= tol_abs and rel <= tol_rel, f"{variant}: max abs {max_abs:.3g} (tol {tol_abs}), rel {rel:.3g} (tol {tol_rel})"
    torch.testing.assert_close(lse.double(), lse_ref, **LSE_TOL)


# (B, Hq, Hkv, Lq, Lk, D) with the interpreter's 32×16 tiles:
SHAPES = [
    (2, 3, 3, 17, 17, 64),      # odd length inside one Q block: the masked run alone; descriptor rows past Lq clipped
    (1, 2, 2, 100, 100, 80),    # D = 80: the descriptor pads columns 80…127 with zeros and clips them on the store
    (1, 4, 2, 100, 37, 64),     # GQA 2:1 and Lq > Lk: 63 rows see nothing (O = 0, LSE = −∞), longest-first reorders
    (1, 2, 2, 1, 70, 32),       # one query against 70 keys: four full tiles and a partial one
    (1, 1, 1, 65, 65, 16),      # three Q blocks, the last of one row: the reversed order starts with the full ones
]


@pytest.mark.parametrize("variant", ONE_AT_A_TIME + [ALL], ids=lambda v: "+".join(v))
@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_variants_match_reference(variant, B, Hq, Hkv, Lq, Lk, D, causal, dtype):
    check_variant(randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype),
                  causal, variant)


def test_variant_refusals_and_descriptor_alignment():
    q = randn(1, 2, 20, 64); k = randn(1, 2, 20, 64)
    assert _descriptors_fit(q, k)
    assert not _descriptors_fit(randn(1, 2, 20, 68)[..., :60])       # a row stride of 68 · 2 bytes is not 16-byte aligned
    o, lse = torch.empty_like(q), torch.empty(1, 2, 20, device=q.device)
    with pytest.raises(ValueError, match="use_tma needs unpacked rows"):
        _attention_forward(q, k, k, o, lse, True, 0.1, pack_gqa=True, variant={"use_tma": True})
    with pytest.raises(AssertionError, match="unknown variants"):
        _attention_forward(q, k, k, o, lse, True, 0.1, variant={"tma": True})


def test_cached_launch_reuses_the_autotuners_pick():
    "cached_launch: the first call autotunes and remembers the config under our key; the second launches it directly."
    import triton_fa2.forward as fwd
    fwd._TUNED.clear()
    q, k, v = (randn(1, 2, 50, 64, dtype=torch.bfloat16) for _ in range(3))
    outs = []
    for _ in range(2):
        o = torch.full_like(q, float("nan")); lse = torch.empty(1, 2, 50, device=q.device)
        _attention_forward(q, k, v, o, lse, True, 0.125, variant={"cached_launch": True}); outs.append(o)
    assert len(fwd._TUNED) == 1 and next(iter(fwd._TUNED.values())) is fwd._attn_fwd_tuned.best_config
    assert torch.equal(outs[0], outs[1])
    o_ref, _ = attention_ref(q, k, v, causal=True, scale=0.125, upcast=torch.float64)
    assert errors(outs[1], o_ref)[0] <= TOL[torch.bfloat16][0]


def test_fold_scale_is_not_used_with_a_negative_scale():
    "max(S)·s = max(S·s) holds only for s > 0: a negative scale must still be exact."
    q, k, v = (randn(1, 2, 40, 32) for _ in range(3))
    o = torch.full_like(q, float("nan")); lse = torch.empty(1, 2, 40, device=q.device)
    _attention_forward(q, k, v, o, lse, False, -0.2, variant={"fold_scale": True})
    o_ref, _ = attention_ref(q, k, v, scale=-0.2, upcast=torch.float64)
    assert errors(o, o_ref)[0] <= TOL[torch.float16][0]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ONE_AT_A_TIME + [dict(use_tma=True, fold_scale=True, longest_first=True)], ids=lambda v: "+".join(v))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_variants_with_every_candidate(variant, causal, dtype):
    "Every autotune candidate with each variant, on a ragged GQA shape (warp specialisation: Triton may refuse it)."
    if interpreting(): pytest.skip("the GPU's compiled code is what this tests")
    q, k, v = randn(2, 8, 1000, 128, dtype=dtype), randn(2, 4, 1000, 128, dtype=dtype), randn(2, 4, 1000, 128, dtype=dtype)
    for config in _gpu_configs():
        try: check_variant(q, k, v, causal, variant, config=config)
        except AssertionError as e: raise AssertionError(f"config {_shape(config)}: {e}") from e
        except Exception as e:
            if variant.get("warp_specialize") and "warp" in str(e).lower():
                pytest.skip(f"Triton {__import__('triton').__version__} refuses warp specialisation here: {str(e)[:200]}")
            raise
