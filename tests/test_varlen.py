"""flash_attn_varlen_func against a float64 reference per sequence: ragged lengths (0, 1, odd), chunked prefill
(Lq < Lk per sequence), GQA, both dtypes, odd head dims, strided inputs, poisoned outputs, gradients (into a packed QKV
buffer, through the LSE too), the operators under opcheck and torch.compile, and every refusal."""
import pytest
import torch
import triton_fa2
from triton_fa2 import dispatch, ops
from triton_fa2.backward import attention_backward_ref
from triton_fa2.runtime import interpreting
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


@pytest.mark.parametrize("page_size", [1, 7, 16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_paged_kv(page_size, causal):
    "k, v in a pool of pages (scattered, the spare ones full of NaN), each sequence's pages in block_table: as the packed k, v."
    lengths_q, lengths_k = [5, 0, 33, 1], [40, 3, 33, 17]
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = torch.randn(sum(lengths_q), 4, 32, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, 32, device=device, dtype=torch.bfloat16) for _ in range(2))
    per_seq = -(-max(lengths_k) // page_size)
    order = torch.randperm(4 * per_seq + 3, generator=torch.Generator().manual_seed(page_size))
    table = order[:4 * per_seq].view(4, per_seq).to(torch.int32).to(device)
    pool_k, pool_v = (torch.full((4 * per_seq + 3, page_size, 2, 32), float("nan"), device=device, dtype=torch.bfloat16) for _ in range(2))
    for b, n in enumerate(lengths_k):
        for j in range(n): pool_k[table[b, j // page_size], j % page_size], pool_v[table[b, j // page_size], j % page_size] = k[cu_k[b] + j], v[cu_k[b] + j]
    out, lse, _ = flash_attn_varlen_func(q, pool_k, pool_v, cu_q, cu_k, 33, 40, causal=causal, return_attn_probs=True, block_table=table)
    dense, dense_lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 33, 40, causal=causal, return_attn_probs=True)
    assert not out.isnan().any()
    torch.testing.assert_close(out, dense, atol=1e-2, rtol=0); torch.testing.assert_close(lse, dense_lse, atol=1e-3, rtol=0)
    with pytest.raises(NotImplementedError, match="has no backward"):
        flash_attn_varlen_func(q.requires_grad_(), pool_k, pool_v, cu_q, cu_k, 33, 40, block_table=table)
    with pytest.raises(ValueError, match="do not fit in"):
        flash_attn_varlen_func(q.detach(), pool_k, pool_v, cu_q, cu_k, 33, 40 + per_seq * page_size, block_table=table)


def test_exported_and_signature_is_flash_attns():
    import inspect
    assert triton_fa2.flash_attn_varlen_func is flash_attn_varlen_func
    assert list(inspect.signature(flash_attn_varlen_func).parameters) == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale", "causal",
        "window_size", "softcap", "alibi_slopes", "deterministic", "return_attn_probs", "block_table", "learnable_sink"]


@pytest.mark.parametrize("change,error,message", [
    (dict(cu_seqlens_q="long"), TypeError, "cu_seqlens_q must be an int32"),
    (dict(cu_seqlens_k="short"), ValueError, "must have the same length"),
    (dict(cu_seqlens_q="decreasing"), ValueError, "must start at 0, never decrease"),
    (dict(max_seqlen_q=3), ValueError, "max_seqlen_q=3 is shorter"),
    (dict(max_seqlen_k=None), TypeError, "max_seqlen_k must be an int"),
    (dict(q="4d"), ValueError, "q must be 3-D (total_q, heads, head_dim)"),
    (dict(dropout_p=0.1), ValueError, "does not implement attention dropout"),
    (dict(window_size=(8, 0, 0)), ValueError, "window_size must be (left, right)"),
    (dict(block_table="some"), ValueError, "k must be 4-D (num_pages, page_size, heads, head_dim) with block_table"),
    (dict(causal=1), TypeError, "causal must be a bool"),
])
def test_bad_inputs_are_refused(change, error, message):
    if change.get("cu_seqlens_q") == "decreasing" and torch.device(device).type != "cpu":
        pytest.skip("offsets on the GPU are not read back: that would cost a host sync per call (documented)")
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


GRAD_TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}


def grad_reference(q, k, v, do, cu_q, cu_k, causal, scale, dlse=None):
    "dq, dk, dv in float64, each sequence through the dense reference of chapter 12; zero outside every sequence."
    grads = [torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v)]
    seq = lambda t, a, z: t[a:z].transpose(0, 1)[None]
    for b in range(cu_q.numel() - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        refs = attention_backward_ref(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), seq(do, q0, q1), causal=causal, scale=scale,
                                      dlse=None if dlse is None else dlse[None, :, q0:q1])
        for g, r, (a, z) in zip(grads, refs, ((q0, q1), (k0, k1), (k0, k1))): g[a:z] = r[0].transpose(0, 1)
    return grads


def relative_error(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item() if ref.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths_q,lengths_k,Hq,Hkv,D", [
    ([37, 0, 1, 50, 9], [37, 5, 17, 50, 30], 4, 2, 40),   # an empty sequence (its keys: zero gradients), chunked prefill
    ([21, 64], [21, 64], 6, 2, 64),
    ([5, 18], [0, 18], 2, 1, 16),                          # no keys: dq = 0
])
def test_gradients(lengths_q, lengths_k, Hq, Hkv, D, causal, dtype):
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = torch.randn(sum(lengths_q), Hq, D, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), Hkv, D, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
    do = torch.randn_like(out)
    out.backward(do)
    refs = grad_reference(q.detach(), k.detach(), v.detach(), do, cu_q, cu_k, causal, D ** -0.5)
    for name, got, ref in zip("qkv", (q.grad, k.grad, v.grad), refs):
        assert got.dtype == dtype and got.shape == ref.shape and not got.isnan().any(), name
        assert relative_error(got, ref) <= GRAD_TOL[dtype], (name, relative_error(got, ref))


def test_gradients_land_in_a_packed_qkv_buffer_and_flow_through_the_lse():
    "q, k, v slices of one (total, 3·H, D) leaf; the loss uses out and the LSE (a sink of gradient as ring attention uses)."
    lengths = [19, 1, 44]
    cu = offsets(lengths)
    qkv = torch.randn(sum(lengths), 3 * 2, 32, device=device, dtype=torch.float16, requires_grad=True)
    q, k, v = qkv[:, :2], qkv[:, 2:4], qkv[:, 4:]
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 44, 44, causal=True, return_attn_probs=True)
    do, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out.float() * do).sum() + (lse * dlse).sum()).backward()
    refs = grad_reference(q.detach(), k.detach(), v.detach(), do, cu, cu, True, 32 ** -0.5, dlse=dlse)
    for got, ref in zip((qkv.grad[:, :2], qkv.grad[:, 2:4], qkv.grad[:, 4:]), refs):
        assert relative_error(got, ref) <= GRAD_TOL[torch.float16]


def test_rows_outside_every_sequence_are_zero_and_the_backward_fills_poisoned_buffers():
    "Offsets that end before the packed rows: those rows come back 0 (never uninitialised); the dispatcher's backward writes every gradient of a sequence."
    q = torch.randn(12, 2, 16, device=device, dtype=torch.float16)
    cu = offsets([4, 6])                                      # rows 10 and 11 belong to no sequence
    out, lse, _ = flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, return_attn_probs=True)
    assert (out[10:] == 0).all() and (lse[:, 10:] == float("-inf")).all()
    do = torch.randn_like(q)
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    dispatch._varlen_backward(do, q, q, q, out, lse, None, cu, cu, 6, 6, *grads, False, 0.25)
    assert not any(g[:10].isnan().any() for g in grads)


def test_opcheck_and_torch_compile():
    "The operators pass `torch.library.opcheck` (autograd included); a compiled training step has no graph break."
    lengths = [7, 12]
    cu = offsets(lengths)
    q = torch.randn(19, 4, 32, device=device, dtype=torch.float16, requires_grad=True)
    k, v = (torch.randn(19, 2, 32, device=device, dtype=torch.float16, requires_grad=True) for _ in range(2))
    torch.library.opcheck(ops._varlen_op, (q, k, v, cu, cu, 12, 12, True, 0.2))
    out, lse = ops._varlen_op(q.detach(), k.detach(), v.detach(), cu, cu, 12, 12, True, 0.2)
    torch.library.opcheck(ops._varlen_backward_op, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None,
                                                    cu, cu, 12, 12, True, 0.2))
    step = lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True).float().square().sum()
    eager = torch.autograd.grad(step(q, k, v), (q, k, v))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if interpreting() else "inductor")
    for a, b in zip(eager, torch.autograd.grad(compiled(q, k, v), (q, k, v))): torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_serving_sized_batch():
    "A serving-sized ragged batch on the GPU: 64 sequences from 1 to 4000 tokens, GQA 4:1, D = 128, bf16, forward and backward."
    g = torch.Generator().manual_seed(0)
    lengths_k = torch.randint(1, 4000, (64,), generator=g).tolist()
    lengths_q = [max(1, n // 3) for n in lengths_k]           # chunked prefill: each sequence's last third
    check(lengths_q, lengths_k, 32, 8, 128, torch.bfloat16, True)
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = torch.randn(sum(lengths_q), 32, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), 8, 128, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True)
    do = torch.randn_like(out)
    out.backward(do)
    few = offsets(lengths_q[:3]), offsets(lengths_k[:3])      # the reference on the first three sequences
    nq, nk = few[0][-1].item(), few[1][-1].item()
    refs = grad_reference(q.detach()[:nq].float(), k.detach()[:nk].float(), v.detach()[:nk].float(), do[:nq].float(), *few, True, 128 ** -0.5)
    for got, ref in zip((q.grad[:nq], k.grad[:nk], v.grad[:nk]), refs): assert relative_error(got, ref) <= GRAD_TOL[torch.bfloat16]


@pytest.mark.parametrize("causal", [True, False])
def test_descriptor_and_pointer_paths_agree_and_ignore_rows_past_the_sequences(causal):
    "Through TMA a key tile may run past its sequence into the next one or past the last: those rows never reach O."
    from triton_fa2 import varlen
    from triton_fa2.candidates import INTERPRETER_PREFILL, PREFILL_TL
    if not interpreting() and not dispatch._forward._has_tma(torch.device(device)): pytest.skip("no TMA on this GPU")
    lengths_q, lengths_k, Hq, Hkv, D = [5, 0, 37, 1, 20], [9, 3, 37, 20, 61], 4, 2, 40
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq, Hq, D, device=device, dtype=torch.float16)
    k, v = (torch.randn(tk + 9, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    k[tk:], v[tk:] = float("nan"), float("inf")                 # rows no sequence owns: garbage
    candidate = INTERPRETER_PREFILL if interpreting() else PREFILL_TL[0]
    ref, _ = reference(q, k[:tk], v[:tk], cu_q, cu_k, causal)
    for use_tma in (False, True):
        o = torch.full_like(q, float("nan"))
        lse = torch.full((Hq, tq), float("nan"), device=device)
        varlen.launch(q, k, v, o, lse, cu_q, cu_k, max(lengths_q), causal, D ** -0.5, candidate, None, use_tma)
        assert not o.isnan().any(), use_tma
        assert (o.double() - ref).abs().max().item() < TOL[torch.float16], use_tma
