"""flash_attn_varlen_func against a float64 reference per sequence: ragged lengths (0, 1, odd), chunked prefill
(Lq < Lk per sequence), GQA, both dtypes, odd head dims, strided inputs, poisoned outputs, and every refusal."""
import pytest
import torch
import triton_fa2
from triton_fa2 import flash_attn_varlen_func
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device

device = default_device()
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32, device=device)


def reference(q, k, v, cu_q, cu_k, causal, scale=None):
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(cu_q.numel() - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        if q1 == q0: continue
        o, l = attention_ref(*(t[a:z].transpose(0, 1)[None] for t, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1))),
                             causal=causal, scale=scale, upcast=torch.float64)
        out[q0:q1], lse[:, q0:q1] = o[0].transpose(0, 1), l[0]
    return out, lse


def check(lengths_q, lengths_k, Hq, Hkv, D, dtype, causal, scale=None, strided=False):
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    tq, tk = sum(lengths_q), sum(lengths_k)
    if strided:   # q, k, v as slices of one packed (total, Hq + 2·Hkv, D) buffer, as a fused QKV projection gives them
        assert tq == tk
        qkv = torch.randn(tq, Hq + 2 * Hkv, D, device=device, dtype=dtype)
        q, k, v = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv], qkv[:, Hq + Hkv:]
    else:
        q = torch.randn(tq, Hq, D, device=device, dtype=dtype)
        k, v = (torch.randn(tk, Hkv, D, device=device, dtype=dtype) for _ in range(2))
    out, lse, none = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q, default=0), max(lengths_k, default=0),
                                            softmax_scale=scale, causal=causal, return_attn_probs=True)
    assert none is None and out.shape == q.shape and out.dtype == dtype and lse.shape == (Hq, tq) and lse.dtype == torch.float32
    o_ref, lse_ref = reference(q, k, v, cu_q, cu_k, causal, scale)
    assert not out.isnan().any() and not lse.isnan().any()
    err = ((out.double() - o_ref).abs().max() / o_ref.abs().max().clamp(min=1)).item() if tq else 0.0
    assert err <= TOL[dtype], err
    finite = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), finite)                              # a row that sees no key: −∞, as the dense kernel
    if finite.any(): assert (lse.double()[finite] - lse_ref[finite]).abs().max() <= 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths_q,lengths_k", [
    ([37, 0, 1, 50, 9], [37, 5, 17, 50, 30]),        # an empty sequence, one query, chunked prefill (Lq < Lk)
    ([1, 1, 1], [70, 3, 1]),                         # one query per sequence: decode through varlen
    ([64], [64]),                                    # one sequence: the dense case
    ([20, 33], [0, 33]),                             # a sequence with no keys at all: zeros, never NaN
])
def test_ragged_batches(lengths_q, lengths_k, causal, dtype):
    check(lengths_q, lengths_k, 4, 2, 40, dtype, causal)


@pytest.mark.parametrize("Hq,Hkv,D", [(4, 4, 64), (6, 2, 72), (8, 1, 16), (2, 2, 256)])
def test_heads_and_head_dims(Hq, Hkv, D):
    check([13, 40], [29, 40], Hq, Hkv, D, torch.float16, True, scale=0.3)


def test_strided_packed_qkv():
    check([19, 1, 44], [19, 1, 44], 4, 2, 32, torch.bfloat16, True, strided=True)


def test_all_sequences_empty_and_no_sequences():
    check([0, 0], [3, 0], 2, 1, 16, torch.float16, True)
    q = torch.empty(0, 2, 16, device=device, dtype=torch.float16)
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    assert flash_attn_varlen_func(q, q[:, :1], q[:, :1], cu, cu, 0, 0).shape == (0, 2, 16)


def test_exported_and_signature_is_flash_attns():
    import inspect
    assert triton_fa2.flash_attn_varlen_func is flash_attn_varlen_func
    assert list(inspect.signature(flash_attn_varlen_func).parameters) == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale", "causal",
        "window_size", "softcap", "alibi_slopes", "deterministic", "return_attn_probs", "block_table"]


@pytest.mark.parametrize("change,error,message", [
    (dict(cu_seqlens_q="long"), TypeError, "cu_seqlens_q must be an int32"),
    (dict(cu_seqlens_k="short"), ValueError, "must have the same length"),
    (dict(cu_seqlens_q="decreasing"), ValueError, "must start at 0, never decrease"),
    (dict(max_seqlen_q=3), ValueError, "max_seqlen_q=3 is shorter"),
    (dict(max_seqlen_k=None), TypeError, "max_seqlen_k must be an int"),
    (dict(q="4d"), ValueError, "q must be 3-D (total_q, heads, head_dim)"),
    (dict(dropout_p=0.1), ValueError, "does not implement attention dropout"),
    (dict(window_size=(8, 0)), ValueError, "sliding windows are not supported yet"),
    (dict(block_table="some"), NotImplementedError, "paged K/V"),
    (dict(causal=1), TypeError, "causal must be a bool"),
])
def test_bad_inputs_are_refused(change, error, message):
    q = torch.randn(10, 4, 32, device=device, dtype=torch.float16)
    k = torch.randn(12, 2, 32, device=device, dtype=torch.float16)
    args = dict(q=q, k=k, v=k, cu_seqlens_q=offsets([4, 6]), cu_seqlens_k=offsets([5, 7]), max_seqlen_q=6, max_seqlen_k=7)
    for name, value in change.items():
        if value == "long": value = args[name].long()
        elif value == "short": value = args[name][:2]
        elif value == "decreasing": value = args[name].flip(0)
        elif value == "4d": value = q[None]
        elif value == "some": value = torch.zeros(2, 1, dtype=torch.int32, device=device)
        args[name] = value
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        flash_attn_varlen_func(**args)


def test_training_is_refused_with_the_alternative():
    q = torch.randn(10, 2, 32, device=device, dtype=torch.float16, requires_grad=True)
    cu = offsets([4, 6])
    with pytest.raises(NotImplementedError, match="no backward yet"):
        flash_attn_varlen_func(q, q.detach(), q.detach(), cu, cu, 6, 6)
    with torch.no_grad(): flash_attn_varlen_func(q, q.detach(), q.detach(), cu, cu, 6, 6)
