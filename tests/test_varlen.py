"""flash_attn_varlen_func against a float64 reference per sequence: ragged lengths (0, 1, odd), chunked prefill
(Lq < Lk per sequence), GQA, both dtypes, odd head dims, strided inputs, poisoned outputs, gradients (into a packed QKV
buffer, through the LSE too), the operators under opcheck and torch.compile, and every refusal."""
import inspect
import re

import pytest
import torch
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import triton
import triton.language as tl
from triton_fa2 import varlen as _varlen_module
from triton_fa2.varlen import _packed_block, packed_slots
from triton_fa2 import dispatch, ops
from triton_fa2.backward import attention_backward_ref
from triton_fa2.runtime import interpreting
from triton_fa2 import flash_attn_varlen_func
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device
from sampling import pairwise

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


@triton.jit
def _schedule_probe(CU_SEQLENS, OUT, num_slots, batch, group, BLOCK: tl.constexpr, LONGEST_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    z, block, head = _packed_block(CU_SEQLENS, pid, num_slots, batch, BLOCK, LONGEST_FIRST, group)
    tl.store(OUT + 3 * pid, z)
    tl.store(OUT + 3 * pid + 1, block)
    tl.store(OUT + 3 * pid + 2, head)


BATCHES = [[5], [0], [300, 0, 0, 1, 64, 65, 127, 128, 129, 0], [1] * 37, [0, 0, 1000, 3, 0], [2917, 100, 8000, 611, 1493, 4321, 257]]
BATCH_BLOCKS = [(lengths, block) for lengths in BATCHES                 # the interpreter runs a program at a time:
                for block in ((16, 64, 128) if sum(lengths) < 2000 else (128,))]   # the long batch in 128-row blocks only


# every batch in every block size with every schedule and every kind of spare rows, every schedule with every kind of
# spare rows: all pairs (tests/sampling.py)
@pairwise(("lengths, block", BATCH_BLOCKS, [f"{len(l)}seqs-{sum(l)}rows-block{b}" for l, b in BATCH_BLOCKS]),
          ("longest_first, heads, group", [(False, 3, 1), (True, 3, 1), (True, 4, 2)]),
          ("lead_rows, spare_rows", [(0, 0), (0, 77), (300, 5)]))   # rows no sequence owns, before the first and after the last
def test_the_block_list_holds_every_block_of_every_sequence_once(lengths, block, longest_first, heads, group, lead_rows, spare_rows):
    """The packed grid (`packed_slots` slots a head, `_packed_block`): every block of every sequence and head exactly once,
    at most one spare slot per sequence, the slots backwards for causal, a group's heads side by side on each slot, and
    spare rows before the first offset and past the last harmless."""
    batch = len(lengths)
    cu = offsets(lengths) + lead_rows
    slots = packed_slots(lead_rows + sum(lengths) + spare_rows, batch, block)
    out = torch.full((slots * heads, 3), -7, dtype=torch.int32, device=device)
    _schedule_probe[(slots * heads,)](cu, out, slots, batch, group, BLOCK=block, LONGEST_FIRST=longest_first)
    seen, spare = [], 0
    for z, b, h in out.cpu().tolist():
        assert 0 <= z < batch and 0 <= h < heads and b >= 0, (z, b, h)
        if b * block < lengths[z]: seen.append((z, b, h))
        else: spare += 1
    want = [(z, b, h) for h in range(heads) for z, n in enumerate(lengths) for b in range(-(-n // block))]
    assert sorted(seen) == sorted(want)
    assert spare <= heads * (batch + (lead_rows + spare_rows) // block + 1), spare
    first_group = out.cpu().tolist()[:slots * group]     # the first group's heads, a slot's side by side
    assert [h for _, _, h in first_group] == list(range(group)) * slots, "a slot's heads side by side"
    head0 = [(z, b) for z, b, h in first_group[::group] if b * block < lengths[z]]
    assert head0 == sorted(head0, reverse=longest_first), "a head's slots in order, backwards for causal"


def test_offsets_that_start_past_row_zero_touch_no_other_row():
    """One sequence of a packed batch alone (its two offsets, the first past 0, as a caller that slices `cu_seqlens`
    passes them): the forward writes its rows only, equal to the whole batch's, and the backward's gradients of its rows
    match float64."""
    lengths = [37, 70, 1, 41]
    cu = offsets(lengths)
    q, k, v = (torch.randn(sum(lengths), 2, 32, device=device, dtype=torch.float16) for _ in range(3))
    for causal in (False, True):
        ref, _ = reference(q, k, v, cu, cu, causal)
        for b in (1, 3):
            (q0, q1) = cu[b:b + 2].tolist()
            o = torch.full_like(q, float("nan"))
            lse = torch.full((2, sum(lengths)), float("nan"), device=device)
            dispatch._varlen_forward(q, k, v, o, lse, cu[b:b + 2], cu[b:b + 2], q1 - q0, causal, 32 ** -0.5)
            assert o[:q0].isnan().all() and o[q1:].isnan().all() and lse[:, :q0].isnan().all() and lse[:, q1:].isnan().all(), b
            assert (o[q0:q1].double() - ref[q0:q1]).abs().max().item() < TOL[torch.float16], b
            do = torch.randn_like(q)
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            dispatch._varlen_backward(do, q, k, v, o, lse, None, cu[b:b + 2], cu[b:b + 2], q1 - q0, *grads, causal, 32 ** -0.5)
            one = [t[q0:q1].double().requires_grad_() for t in (q, k, v)]
            out, _ = reference(*one, offsets([q1 - q0]), offsets([q1 - q0]), causal)
            want = torch.autograd.grad(out, one, do[q0:q1].double())
            for got, expected in zip(grads, want):
                assert not got[q0:q1].isnan().any() and (got[q0:q1].double() - expected).abs().max().item() < 1e-2, b


def test_a_wrong_max_seqlen_costs_no_rows():
    "The grids come from the packed rows: a `max_seqlen_*` below the longest sequence (unchecked on a GPU) only picks tiles."
    lengths = [3, 70, 0, 41]
    cu = offsets(lengths)
    q, k, v = (torch.randn(sum(lengths), 2, 32, device=device, dtype=torch.float16, requires_grad=True) for _ in range(3))
    o = torch.full_like(q, float("nan")).detach()
    lse = torch.full((2, sum(lengths)), float("nan"), device=device)
    dispatch._varlen_forward(q.detach(), k.detach(), v.detach(), o, lse, cu, cu, 1, True, 32 ** -0.5)
    ref, ref_lse = reference(q.detach(), k.detach(), v.detach(), cu, cu, True)
    assert (o.double() - ref).abs().max().item() < TOL[torch.float16]
    do = torch.randn_like(q)
    grads = [torch.full_like(t, float("nan")).detach() for t in (q, k, v)]
    dispatch._varlen_backward(do, q.detach(), k.detach(), v.detach(), o, lse, None, cu, cu, 1, *grads, True, 32 ** -0.5)
    ref_out, _ = reference(*(t.double() for t in (q, k, v)), cu, cu, True)
    want = torch.autograd.grad(ref_out, (q, k, v), do.double())
    for got, expected in zip(grads, want):
        assert not got.isnan().any() and (got.double() - expected).abs().max().item() < 1e-2


def test_every_packed_kernel_finds_its_block_through_the_one_block_list():
    "The three `tl` kernels of packed sequences and the Gluon forward kernel all place their programs with `_packed_block`."
    source = inspect.getsource(_varlen_module)
    for kernel in ("_attn_fwd_varlen", "_attn_bwd_dkdv_varlen", "_attn_bwd_dq_varlen"):
        body = source[source.index(f"def {kernel}("):]
        body = body[:body.index("\ndef ", 1)]
        assert "_packed_block(" in body and "_program_block(" not in body, kernel
    try: from triton_fa2 import gluon
    except Exception: return                                   # no Gluon in this Triton
    gluon_source = inspect.getsource(gluon._attn_fwd_gluon.fn)
    assert len(re.findall(r"(?<![\w.])_packed_block\(", gluon_source)) == 1   # the name itself, not one that ends in it


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


# every batch in both dtypes and with and without the mask, every dtype with and without it (tests/sampling.py)
@pairwise(("lengths_q,lengths_k", [
    ([37, 0, 1, 50, 9], [37, 5, 17, 50, 30]),        # an empty sequence, one query, chunked prefill (Lq < Lk)
    ([1, 1, 1], [70, 3, 1]),                         # one query per sequence: decode through varlen
    ([64], [64]),                                    # one sequence: the dense case
    ([20, 33], [0, 33]),                             # a sequence with no keys at all: zeros, never NaN
]), ("causal", [False, True], ["full", "causal"]), ("dtype", [torch.float16, torch.bfloat16], ["fp16", "bf16"]))
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


# every batch in both dtypes and with and without the mask, every dtype with and without it (tests/sampling.py)
@pairwise(("lengths_q,lengths_k,Hq,Hkv,D", [
    ([37, 0, 1, 50, 9], [37, 5, 17, 50, 30], 4, 2, 40),   # an empty sequence (its keys: zero gradients), chunked prefill
    ([21, 64], [21, 64], 6, 2, 64),
    ([5, 18], [0, 18], 2, 1, 16),                          # no keys: dq = 0
]), ("causal", [False, True], ["full", "causal"]), ("dtype", [torch.float16, torch.bfloat16], ["fp16", "bf16"]))
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


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_neighbours_nan_stays_out_forward_and_backward(causal):
    """The middle sequence's keys, values, queries and output gradient are NaN: the sequences around it, whose key tiles
    reach into its rows (their V rows zeroed in the forward, their P and dS zero in the backward), come out finite and
    right, outputs and gradients alike."""
    lengths = [21, 40, 19]
    cu = offsets(lengths)
    q = torch.randn(sum(lengths), 4, 32, device=device, dtype=torch.float16)
    k, v = (torch.randn(sum(lengths), 2, 32, device=device, dtype=torch.float16) for _ in range(2))
    do = torch.randn_like(q)
    o_ref, _ = reference(q, k, v, cu, cu, causal)
    g_ref = grad_reference(q, k, v, do, cu, cu, causal, 32 ** -0.5)
    for t in (q, k, v, do): t[21:61] = float("nan")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu, cu, 40, 40, causal=causal)
    out.backward(do)
    clean = torch.cat([torch.arange(0, 21), torch.arange(61, 80)]).to(device)
    assert not out[clean].isnan().any() and relative_error(out[clean], o_ref[clean]) <= TOL[torch.float16]
    for name, leaf, ref in zip("qkv", leaves, g_ref):
        assert not leaf.grad[clean].isnan().any(), name
        assert relative_error(leaf.grad[clean], ref[clean]) <= GRAD_TOL[torch.float16], name


def test_rows_outside_every_sequence_are_zero_and_the_backward_fills_poisoned_buffers():
    "Offsets that end before the packed rows: those rows come back 0 (never uninitialised); the dispatcher's backward writes every gradient of a sequence."
    q = torch.randn(12, 2, 16, device=device, dtype=torch.float16)
    cu = offsets([4, 6])                                      # rows 10 and 11 belong to no sequence
    out, lse, _ = flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, return_attn_probs=True)
    assert (out[10:] == 0).all() and (lse[:, 10:] == float("-inf")).all()
    do = torch.randn_like(q)
    grads = [torch.full_like(q, float("nan")) for _ in range(3)]
    dispatch._varlen_backward(do, q, q, q, out, lse, None, cu, cu, 6, *grads, False, 0.25)
    assert not any(g[:10].isnan().any() for g in grads)


@pytest.mark.parametrize("fill", ["whole", "unowned rows"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fresh_buffers_are_written_by_the_kernels_and_the_unowned_rows_fill(causal, fill, monkeypatch):
    """flash_attn_varlen_func fills a large output, LSE or gradient only in the rows no sequence owns. With each such
    buffer NaN-poisoned first (every buffer, by a threshold of 0), every row of a sequence comes back from the attention
    kernels (a sequence without queries, one without keys, queries that see no key) and every row outside the offsets
    from `fill_unowned_rows`: 0, LSE −inf; small buffers filled whole give the same."""
    if fill == "unowned rows":
        real_fill = ops._fill_unowned
        monkeypatch.setattr(ops, "_fill_unowned", lambda t, cu, value, dim=0: real_fill(t.fill_(float("nan")), cu, value, dim))
        monkeypatch.setattr(ops, "_FILL_WHOLE_BELOW_BYTES", 0)
    lengths_q, lengths_k = [5, 0, 9, 7], [5, 7, 0, 3]        # no queries; no keys; more queries than keys
    tail_q, tail_k = 3, 2                                   # rows after the last sequence (offsets start at 0)
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = torch.randn(sum(lengths_q) + tail_q, 4, 24, device=device, dtype=torch.float16)
    k, v = (torch.randn(sum(lengths_k) + tail_k, 2, 24, device=device, dtype=torch.float16) for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                         return_attn_probs=True)
    inside_q, inside_k = slice(0, sum(lengths_q)), slice(0, sum(lengths_k))
    o_ref, lse_ref = reference(q[inside_q], k[inside_k], v[inside_k], cu_q, cu_k, causal)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[-tail_q:] == 0).all() and (lse[:, -tail_q:] == float("-inf")).all()
    assert relative_error(out[inside_q], o_ref) <= TOL[torch.float16]
    assert torch.equal(lse[:, inside_q].isinf(), lse_ref.isinf())
    out.backward(torch.randn_like(out))
    for name, leaf, tail in (("q", leaves[0], tail_q), ("k", leaves[1], tail_k), ("v", leaves[2], tail_k)):
        assert not leaf.grad.isnan().any(), name
        assert (leaf.grad[-tail:] == 0).all(), name
    no_queries = slice(5, 12)                                # the keys of the sequence without queries
    assert (leaves[1].grad[no_queries] == 0).all() and (leaves[2].grad[no_queries] == 0).all()
    no_keys = slice(5, 14)                                   # the queries of the sequence without keys
    assert (leaves[0].grad[no_keys] == 0).all() and (out[no_keys] == 0).all()


@pytest.mark.newest_triton_only   # PyTorch's operator checks: the kernels they run are this file's other tests' (.ci/run)
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
        varlen.launch(q, k, v, o, lse, cu_q, cu_k, causal, D ** -0.5, candidate, None, use_tma)
        assert not o.isnan().any(), use_tma
        assert (o.double() - ref).abs().max().item() < TOL[torch.float16], use_tma


# Packed sequences on the Gluon forward kernels (sm_90; notebooks 11 and 13)
from triton_fa2 import candidates as _candidates, gluon as _gluon
from triton_fa2.candidates import GLUON_HEAD_DIMS, PREFILL_GLUON, WARP_SPECIALIZED_HEAD_DIMS, Candidate
from triton_fa2.score_mods import ScoreMods

GLUON_64 = next(c for c in PREFILL_GLUON if not c.WARP_SPECIALIZE and not c.Q_IN_REGS)   # "gluon 64x64 w4 s2"
GLUON_WS = next(c for c in PREFILL_GLUON if c.WARP_SPECIALIZE)


def gluon_inputs(lengths, Hq=4, Hkv=2, D=64, dtype=torch.float16):
    tq = sum(lengths)
    q = torch.randn(tq, Hq, D, device=device, dtype=dtype)
    k, v = (torch.randn(tq, Hkv, D, device=device, dtype=dtype) for _ in range(2))
    return q, k, v, torch.full_like(q, float("nan")), torch.full((Hq, tq), float("nan"), device=device), offsets(lengths)


def test_the_varlen_dispatch_offers_gluon_where_it_applies(monkeypatch):
    """As on an H200 (`gluon.usable` says yes): the Gluon candidates are offered for packed K/V through TMA views at D 64
    and 128 (the ws kernel's at 128 only, and not with ALiBi), never over a paged pool; an explicit Gluon config goes to
    `gluon.launch_varlen` with the modifiers (a window too), and is refused by name where it cannot run."""
    monkeypatch.setattr(_gluon, "usable", lambda q: True)
    monkeypatch.setattr(dispatch, "_PICKS", {})
    offered, launched = [], []
    real = dispatch.prefill_candidates
    def candidates_seen(*args, **kwargs):
        with monkeypatch.context() as m:                     # the GPU's tables, not the interpreter's one tile
            m.setattr(_candidates, "interpreting", lambda: False)
            offered.append([c for c in real(*args, **kwargs) if c.kernel == "gluon"])
        return real(*args, **kwargs)
    monkeypatch.setattr(dispatch, "prefill_candidates", candidates_seen)
    monkeypatch.setattr(dispatch._forward, "_has_tma", lambda device: True)
    def stand_in(q, k, v, o, lse, cu_q, cu_k, causal, scale, config, mods=None):
        launched.append((config, mods))
        o.copy_(reference(q, k, v, cu_q, cu_k, causal, scale)[0])
    monkeypatch.setattr(_gluon, "launch_varlen", stand_in)
    alibi = ScoreMods(alibi_slopes=torch.rand(2, 4, device=device))
    one_warpgroup = [c for c in PREFILL_GLUON if not c.WARP_SPECIALIZE]           # the ws kernel: D 128, not with ALiBi
    for D, mods, expected in ((64, None, one_warpgroup), (128, None, list(PREFILL_GLUON)), (128, alibi, one_warpgroup), (32, None, []),
                              (128, ScoreMods(window_size=(8, 0)), list(PREFILL_GLUON))):
        q, k, v, o, lse, cu = gluon_inputs([9, 20], D=D)
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, D ** -0.5, mods=mods)
        assert [c for c in offered[-1] if _gluon.takes(c, mods, varlen=True)] == expected, (D, mods)   # the dispatcher's filter
        if expected:
            o.fill_(float("nan"))
            assert dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, D ** -0.5, config=expected[0], mods=mods) is expected[0]
            assert launched[-1] == (expected[0], mods) and not o.isnan().any()
        else:
            with pytest.raises(ValueError, match="runs only on sm_90"):
                dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, D ** -0.5, config=GLUON_64, mods=mods)
    q, k, v, o, lse, cu = gluon_inputs([9, 20], D=128)
    with pytest.raises(ValueError, match="ALiBi: not the ws kernel"):
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, 0.1, config=GLUON_WS, mods=alibi)
    pool = torch.randn(4, 16, 2, 128, device=device, dtype=torch.float16)           # a paged pool: the `tl` kernel alone
    table = torch.arange(4, dtype=torch.int32, device=device).view(2, 2)
    dispatch._varlen_forward(q, pool, pool, o, lse, cu, cu, 20, True, 0.1, block_table=table)
    assert offered[-1] == []
    with pytest.raises(ValueError, match="not a paged pool"):
        dispatch._varlen_forward(q, pool, pool, o, lse, cu, cu, 20, True, 0.1, config=GLUON_64, block_table=table)
    monkeypatch.setattr(_gluon, "usable", lambda q: False)                          # not sm_90 (or Gluon off): never
    dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, False, 0.1)
    assert offered[-1] == []
    with pytest.raises(ValueError, match="runs only on sm_90"):
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, 0.1, config=GLUON_64)


def test_a_varlen_gluon_pick_that_fails_falls_back_to_the_tl_kernel_once(monkeypatch):
    "The dispatcher's Gluon pick failing at run time: one warning, the `tl` kernel's result, as the dense call's fallback."
    import warnings
    q, k, v, o, lse, cu = gluon_inputs([9, 0, 20], D=64)
    monkeypatch.setattr(dispatch, "_PICKS", {})
    monkeypatch.setattr(dispatch._forward, "_has_tma", lambda device: True)
    dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, 0.125)         # chooses: the `tl` kernel's pick
    (key,) = dispatch._PICKS
    monkeypatch.setitem(dispatch._PICKS, key, GLUON_64)                              # as if the Gluon kernel had won
    monkeypatch.setattr(_gluon, "_DISABLED", [])
    monkeypatch.setattr(_gluon, "usable", lambda q: not _gluon._DISABLED)
    def broken(*args, **kwargs): raise RuntimeError("a Gluon API this code does not know")
    monkeypatch.setattr(_gluon, "launch_varlen", broken)
    ref, _ = reference(q, k, v, cu, cu, True, 0.125)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            o.fill_(float("nan"))
            config = dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, 0.125)
            assert config.kernel == "tl" and dispatch._PICKS[key] is config
            assert (o.double() - ref).abs().max().item() < TOL[torch.float16]
    messages = [str(w.message) for w in caught if "Gluon" in str(w.message)]
    assert len(messages) == 1 and "gluon 64x64 w4 s2 failed (RuntimeError" in messages[0]
    monkeypatch.setattr(_gluon, "usable", lambda q: True)
    with pytest.raises(RuntimeError, match="does not know"):                         # a config given explicitly still raises
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 20, True, 0.125, config=GLUON_64)


def test_the_gluon_varlen_arguments():
    "A program per (slot of the sequences' block list, head); the (1, H, total, D) views; the dense launch unchanged."
    lengths = [0, 1, 37, 300]
    q, k, v, o, lse, cu = gluon_inputs(lengths, Hq=8, Hkv=2, D=128, dtype=torch.bfloat16)
    config = GLUON_64
    named, grid = _gluon._arguments(*_gluon._packed_views(q, k, v, o), lse, True, 0.1, config, packed=(cu, cu))
    assert grid == (338 // config.BLOCK_M + len(lengths)) * 8 and named["VARLEN"] and named["seqlen_q"] == 338
    assert named["q_desc"].shape == [1, 8, 338, 128] and named["k_desc"].shape == [1, 2, 338, 128]
    assert (named["stride_om"], named["stride_oh"], named["stride_lse_h"]) == (8 * 128, 128, 338)
    dense, _ = _gluon._arguments(*(t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, o)), lse[None], True, 0.1, config)
    assert not dense["VARLEN"] and dense["CU_SEQLENS_Q"] is None and dense["O"] is None
    assert [n for n in _gluon.ARG_NAMES if n not in dense] == []                   # every parameter named: the saved launch
    ws, grid = _gluon._arguments(*_gluon._packed_views(q, k, v, o), lse, True, 0.1, GLUON_WS, packed=(cu, cu))
    assert grid == (338 // 128 + len(lengths)) * 8 and ws["VARLEN"] and ws["stride_lse_h"] == 338
    assert (ws["CONSUMER_REGS"], ws["PRODUCER_REGS"], ws["maxnreg"]) == (232, 40, 168)   # the loading warp zeroes V rows
    assert [n for n in _gluon.WS_ARG_NAMES if n not in ws] == []
    dense_ws, _ = _gluon._arguments(*(t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, o)), lse[None], True, 0.1, GLUON_WS)
    assert not dense_ws["VARLEN"] and (dense_ws["CONSUMER_REGS"], dense_ws["PRODUCER_REGS"]) == (240, 24)


def gluon_mods(name, Hq, batch):
    return {"none": None, "softcap": ScoreMods(softcap=3.0), "sinks": ScoreMods(learnable_sink=torch.randn(Hq, device=device) * 2),
            "softcap and sinks": ScoreMods(softcap=3.0, learnable_sink=torch.randn(Hq, device=device) * 2),
            "alibi": ScoreMods(alibi_slopes=torch.rand(batch, Hq, device=device)),
            "window": ScoreMods(window_size=(100, 0)), "narrow window": ScoreMods(window_size=(5, 3)),
            "window and softcap": ScoreMods(window_size=(300, 30), softcap=3.0)}[name]


def sequence_reference(q, k, v, cu_q, cu_k, causal, scale, mods):
    "The float64 reference of each sequence alone, with the score modifiers (ALiBi's slopes per sequence): O and LSE packed."
    from triton_fa2.naive import attention_ref
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    mods = mods or ScoreMods()
    for b in range(cu_q.numel() - 1):
        (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        if q1 == q0: continue
        slopes = None if mods.alibi_slopes is None else mods.alibi_slopes[b]
        o, l = attention_ref(*(t[a:z].transpose(0, 1)[None] for t, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1))),
                             causal=causal, scale=scale, upcast=torch.float64, window_size=mods.window_size, softcap=mods.softcap,
                             alibi_slopes=slopes, learnable_sink=mods.learnable_sink)
        out[q0:q1], lse[:, q0:q1] = o[0].transpose(0, 1), l[0]
    return out, lse


on_sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
LENGTHS_Q = [0, 1, 37, 129, 1500, 64, 20]                   # empty, one query, odd, a block and one row, one long, exact
LENGTHS_K = {"self": LENGTHS_Q,
             "chunked": [3, 70, 20, 200, 1600, 64, 0]}      # Lq ≠ Lk: Lq < Lk, Lq > Lk (rows that see no key), no keys at all


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90, reason="the Gluon kernels run on sm_90 only")
@pytest.mark.parametrize("keys", list(LENGTHS_K))
@pytest.mark.parametrize("mods_name", ["none", "softcap", "sinks", "softcap and sinks", "alibi", "window", "narrow window",
                                       "window and softcap"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_every_gluon_candidate_over_packed_sequences(D, dtype, causal, mods_name, keys):
    """Every Gluon candidate that takes packed sequences, GQA 4:1, against each sequence's float64 reference, into NaN-poisoned
    o and lse with 3 rows past the last sequence, which stay NaN as the `tl` kernel leaves them; then each sequence alone
    (offsets of that sequence only) leaves every other row NaN and gives its rows bit for bit."""
    Hq, Hkv = 8, 2
    lengths_k = LENGTHS_K[keys]
    cu_q, cu_k = offsets(LENGTHS_Q), offsets(lengths_k)
    tq, tk = sum(LENGTHS_Q), sum(lengths_k)
    q = torch.randn(tq + 3, Hq, D, device=device, dtype=dtype)
    k, v = (torch.randn(tk, Hkv, D, device=device, dtype=dtype) for _ in range(2))
    mods = gluon_mods(mods_name, Hq, len(LENGTHS_Q))
    scale = D ** -0.5
    o_ref, lse_ref = sequence_reference(q[:tq], k, v, cu_q, cu_k, causal, scale, mods)
    tol = {torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    configs = [c for c in PREFILL_GLUON if D in (WARP_SPECIALIZED_HEAD_DIMS if c.WARP_SPECIALIZE else GLUON_HEAD_DIMS)
               and _gluon.takes(c, mods, varlen=True)]
    assert configs
    for config in configs:
        o, lse = torch.full_like(q, float("nan")), torch.full((Hq, tq + 3), float("nan"), device=device)
        assert dispatch._varlen_forward(q, k, v, o, lse, cu_q, cu_k, max(lengths_k), causal, scale, config=config,
                                        mods=mods) is config
        assert o[tq:].isnan().all() and lse[:, tq:].isnan().all(), config.label          # rows no sequence owns: untouched
        assert not o[:tq].isnan().any() and not lse[:, :tq].isnan().any(), config.label
        err = ((o[:tq].double() - o_ref).abs().max() / o_ref.abs().max().clamp(min=1)).item()
        assert err <= tol, (config.label, err)
        finite = lse_ref.isfinite()
        assert torch.equal(lse[:, :tq].isfinite(), finite), config.label
        assert (lse[:, :tq].double()[finite] - lse_ref[finite]).abs().max() <= 1e-3, config.label
        for b in range(len(LENGTHS_Q)):                      # one sequence alone: nothing outside its rows is written
            (q0, q1), (k0, k1) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
            one_mods = mods if mods is None or mods.alibi_slopes is None else mods._replace(alibi_slopes=mods.alibi_slopes[b:b + 1])
            o1, lse1 = torch.full_like(q, float("nan")), torch.full((Hq, tq + 3), float("nan"), device=device)
            dispatch._varlen_forward(q, k, v, o1, lse1, cu_q[b:b + 2], cu_k[b:b + 2], k1 - k0, causal, scale,
                                     config=config, mods=one_mods)
            assert o1[:q0].isnan().all() and o1[q1:].isnan().all() and lse1[:, :q0].isnan().all() and lse1[:, q1:].isnan().all(), \
                (config.label, b)
            assert torch.equal(o1[q0:q1], o[q0:q1]) and torch.equal(lse1[:, q0:q1], lse[:, q0:q1]), (config.label, b)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90, reason="the Gluon kernels run on sm_90 only")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_gluon_varlen_keeps_a_neighbours_nan_out(dtype, causal):
    """Two sequences' keys and values are NaN: the sequences before them, whose last key tile reaches into those rows (the
    ws kernel's loading warp zeroes such V rows, the one-warpgroup kernel's consumer does), come out finite and right; so
    does one whose block overflows and is redone (its redo zeroes them too)."""
    lengths = [100, 300, 129, 700, 64]                       # tiles of 64 or 128 keys cross from 0 into 1 and from 3 into 4
    cu = offsets(lengths)
    q = torch.randn(sum(lengths), 8, 128, device=device, dtype=dtype).abs()
    k, v = (torch.randn(sum(lengths), 2, 128, device=device, dtype=dtype) for _ in range(2))
    k[529] = 30.0                                            # the fourth sequence's first key: its blocks overflow, and are redone
    ref, _ = sequence_reference(q, k, v, cu, cu, causal, 128 ** -0.5, None)
    for b in (1, 4):
        k[cu[b]:cu[b + 1]] = v[cu[b]:cu[b + 1]] = float("nan")
    clean = torch.cat([torch.arange(cu[b], cu[b + 1], device=device) for b in (0, 2, 3)])
    for config in [c for c in PREFILL_GLUON if _gluon.takes(c, varlen=True)]:
        o, lse = torch.full_like(q, float("nan")), torch.full((8, sum(lengths)), float("nan"), device=device)
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 700, causal, 128 ** -0.5, config=config)
        assert not o[clean].isnan().any() and not lse[:, clean].isnan().any(), config.label
        err = ((o[clean].double() - ref[clean]).abs().max() / ref[clean].abs().max().clamp(min=1)).item()
        assert err <= TOL[dtype], (config.label, err)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90, reason="the Gluon kernels run on sm_90 only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_gluon_varlen_overflow_redoes_the_block(dtype):
    "A sequence's key 0 scoring far above its later rows' diagonal maximum: P overflows, the block is redone online from that sequence's keys."
    lengths = [300, 700, 129]
    cu = offsets(lengths)
    q = torch.randn(sum(lengths), 4, 128, device=device, dtype=dtype).abs()
    k, v = (torch.randn(sum(lengths), 4, 128, device=device, dtype=dtype) for _ in range(2))
    k[300] = 30.0                                            # the second sequence's first key
    ref, _ = sequence_reference(q, k, v, cu, cu, True, 128 ** -0.5, None)
    for config in [c for c in PREFILL_GLUON if _gluon.takes(c, varlen=True)]:
        o, lse = torch.full_like(q, float("nan")), torch.full((4, sum(lengths)), float("nan"), device=device)
        dispatch._varlen_forward(q, k, v, o, lse, cu, cu, 700, True, 128 ** -0.5, config=config)
        err = ((o.double() - ref).abs().max() / ref.abs().max().clamp(min=1)).item()
        assert not o.isnan().any() and err <= TOL[dtype], (config.label, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_fill_unowned_rows_writes_only_rows_outside_the_offsets(dtype):
    "Rows before the first offset and from the last on get the value, in (total, H, D) and (H, total) layouts; owned rows are never touched."
    for lengths, lead, tail in (([4, 0, 9], 3, 70), ([16, 16], 0, 0), ([], 5, 0), ([1], 0, 33)):
        total = lead + sum(lengths) + tail
        cu = offsets(lengths) + lead
        t = torch.full((total, 3, 40), float("nan"), device=device, dtype=dtype)
        lse = torch.full((5, total), float("nan"), device=device)
        assert _varlen_module.fill_unowned_rows(t, cu, 0.0) is t
        _varlen_module.fill_unowned_rows(lse, cu, float("-inf"), dim=1)
        owned = slice(lead, lead + sum(lengths))
        assert t[owned].isnan().all() and lse[:, owned].isnan().all(), lengths
        assert (t[:lead] == 0).all() and (t[lead + sum(lengths):] == 0).all(), lengths
        assert (lse[:, :lead] == float("-inf")).all() and (lse[:, lead + sum(lengths):] == float("-inf")).all(), lengths
    with pytest.raises(ValueError, match="evenly strided"):
        _varlen_module.fill_unowned_rows(torch.zeros(6, 8, 4, device=device).transpose(1, 2), offsets([6]), 0.0)
