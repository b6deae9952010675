"""Ring attention over real process groups: 2 and 3 processes on localhost with gloo (the CPU backend; the kernels run in
Triton's interpreter there), each rank checked against float64 attention over the whole sequence, forward and backward:
contiguous and zigzag shards, causal and not, GQA and MQA, odd local lengths, fp16 and bf16, a custom scale, the LSE and
its gradient, packed QKV and KV, non-contiguous inputs, no tokens, a ring over a subgroup; and ranks called with different shapes raising on every rank
instead of hanging."""
import json, os, socket, time, traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import triton_fa2
from triton_fa2.naive import attention_ref

OUT_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}    # max |o − o_ref| / max(1, max |o_ref|), as `python -m triton_fa2`
GRAD_TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}   # ‖g − g_ref‖ / ‖g_ref‖, as the backward's tests
WAIT_S = 420                                                # a hang fails the test instead of stalling CI

# name: (world sizes, zigzag, causal, dtype, B, local length, Hq, Hkv, D, scale, how the inputs are passed)
CASES = {
    "contiguous_causal_gqa_odd_length": ((2, 3), False, True, torch.float16, 2, 7, 4, 2, 24, None, "plain"),
    "contiguous_full_bf16":             ((2,), False, False, torch.bfloat16, 1, 5, 2, 2, 16, None, "plain"),
    "zigzag_causal_mqa_bf16":           ((2, 3), True, True, torch.bfloat16, 1, 6, 4, 1, 16, None, "plain"),
    "zigzag_full_scale":                ((2,), True, False, torch.float16, 1, 4, 2, 2, 32, 0.3, "plain"),
    "zigzag_causal_qkvpacked":          ((2,), True, True, torch.float16, 1, 6, 2, 2, 16, None, "qkvpacked"),
    "contiguous_causal_kvpacked_gqa":   ((3,), False, True, torch.float16, 1, 4, 4, 2, 16, None, "kvpacked"),
    "contiguous_causal_noncontiguous":  ((2,), False, True, torch.float16, 2, 5, 2, 2, 16, None, "noncontiguous"),
    "contiguous_causal_lse_gradient":   ((2,), False, True, torch.float16, 1, 6, 2, 1, 16, None, "lse"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def rel_error(g, ref) -> float:
    return (g.double() - ref).norm().item() / max(ref.norm().item(), 1e-3 * ref.numel() ** 0.5, 1e-30)


def run_case(rank, world, zigzag, causal, dtype, B, L, Hq, Hkv, D, scale, how, group=None) -> dict:
    "One case on this rank (its rank in `group`): its errors against float64 over the whole sequence."
    torch.manual_seed(L * 100 + D)                           # every rank draws the same whole sequence
    n = L * world
    q, do = (torch.randn(B, n, Hq, D).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, n, Hkv, D).to(dtype) for _ in range(2))
    dlse = torch.randn(B, Hq, n) if how == "lse" else None
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = attention_ref(*(t.transpose(1, 2) for t in ref), causal=causal, scale=scale, upcast=torch.float64)
    loss = (o_ref * do.double().transpose(1, 2)).sum() + ((lse_ref * dlse.double()).sum() if how == "lse" else 0)
    loss.backward()
    mine = ((lambda t, dim=1: triton_fa2.zigzag_shard(t, rank, world, dim)) if zigzag
            else (lambda t, dim=1: t.chunk(world, dim)[rank]))
    fn = triton_fa2.zigzag_ring_flash_attn_func if zigzag else triton_fa2.ring_flash_attn_func
    if how == "qkvpacked":
        qkv = torch.stack([mine(q), mine(k), mine(v)], dim=2).requires_grad_()
        packed = (triton_fa2.zigzag_ring_flash_attn_qkvpacked_func if zigzag else triton_fa2.ring_flash_attn_qkvpacked_func)
        out, lse, _ = packed(qkv, softmax_scale=scale, causal=causal, return_attn_probs=True, group=group)
        out.backward(mine(do))
        grads = qkv.grad.unbind(2)
    elif how == "kvpacked":
        q_local, kv = mine(q).clone().requires_grad_(), torch.stack([mine(k), mine(v)], dim=2).requires_grad_()
        packed = (triton_fa2.zigzag_ring_flash_attn_kvpacked_func if zigzag else triton_fa2.ring_flash_attn_kvpacked_func)
        out, lse, _ = packed(q_local, kv, softmax_scale=scale, causal=causal, return_attn_probs=True, group=group)
        out.backward(mine(do))
        grads = (q_local.grad, *kv.grad.unbind(2))
    else:
        local = [mine(t).clone().requires_grad_() for t in (q, k, v)]
        args = local
        if how == "noncontiguous":                          # (B, H, L, D) tensors seen as (B, L, H, D)
            args = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in local]
        out, lse, _ = fn(*args, softmax_scale=scale, causal=causal, return_attn_probs=True, group=group)
        loss = (out.double() * mine(do).double()).sum() + ((lse.double() * mine(dlse, 2).double()).sum() if how == "lse" else 0)
        loss.backward()
        grads = [t.grad for t in args]
    assert out.dtype == dtype and lse.dtype == torch.float32 and not out.isnan().any() and not lse.isnan().any()
    o_want, lse_want = mine(o_ref.transpose(1, 2)), mine(lse_ref, 2)
    result = dict(out=(out.double() - o_want).abs().max().item() / max(1.0, o_want.abs().max().item()),
                  lse=(lse.double() - lse_want).abs().max().item())
    for name, g, want in zip(("dq", "dk", "dv"), grads, (t.grad for t in ref)):
        assert g.dtype == dtype and g.shape == mine(want).shape and not g.isnan().any(), name
        result[name] = rel_error(g, mine(want))
    return result


def run_refusals(rank, world) -> dict:
    "Shapes that differ across ranks, and no tokens at all."
    result = {}
    q = torch.randn(1, 4 + 2 * rank, 2, 16, dtype=torch.float16)          # rank 1 holds two tokens more
    try: triton_fa2.ring_flash_attn_func(q, q, q, causal=True); result["mismatch"] = "no error"
    except ValueError as e: result["mismatch"] = str(e)
    odd = torch.randn(1, 5 if rank == 1 else 4, 2, 16, dtype=torch.float16)   # refused on rank 1 alone: every rank raises
    try: triton_fa2.zigzag_ring_flash_attn_func(odd, odd, odd); result["odd"] = "no error"
    except ValueError as e: result["odd"] = str(e)
    empty = torch.zeros(2, 0, 2, 16, dtype=torch.float16, requires_grad=True)
    out, lse, _ = triton_fa2.ring_flash_attn_func(empty, empty, empty, causal=True, return_attn_probs=True)
    out.sum().backward()
    result["empty"] = [tuple(out.shape), tuple(lse.shape), tuple(empty.grad.shape)]
    return result


def worker(rank, world, port, names, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for name in names:
        try: results[name] = run_case(rank, world, *CASES[name][1:])
        except Exception: results[name] = {"error": traceback.format_exc()}
    if world == 3:                          # a ring over ranks 0 and 2 only: peers named by their ranks in the world
        pair = dist.new_group([0, 2])
        if rank != 1:
            try: results["subgroup"] = run_case(dist.get_rank(pair), 2, *CASES["zigzag_causal_mqa_bf16"][1:], group=pair)
            except Exception: results["subgroup"] = {"error": traceback.format_exc()}
    try: results["refusals"] = run_refusals(rank, world)
    except Exception: results["refusals"] = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f: json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}_ranks")
def ring_results(request, tmp_path_factory):
    "Every case of this world size run once, in one group of processes; each rank's results."
    world = request.param
    names = [n for n, c in CASES.items() if world in c[0]]
    out = tmp_path_factory.mktemp(f"ring{world}")
    ctx = mp.start_processes(worker, args=(world, free_port(), names, str(out)), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + WAIT_S
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline: pytest.fail(f"the {world} ranks did not finish in {WAIT_S} s: a hang")
    finally:
        for p in ctx.processes:
            if p.is_alive(): p.kill()
    return world, names, [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_ring_matches_float64_on_every_rank(ring_results):
    world, names, ranks = ring_results
    for name in names:
        dtype = CASES[name][3]
        for rank, results in enumerate(ranks):
            r = results[name]
            assert "error" not in r, f"{name}, rank {rank} of {world}:\n{r.get('error')}"
            assert r["out"] <= OUT_TOL[dtype], (name, rank, r)
            assert r["lse"] <= 1e-3, (name, rank, r)
            for g in ("dq", "dk", "dv"): assert r[g] <= GRAD_TOL[dtype], (name, rank, g, r)


def test_ring_over_a_subgroup(ring_results):
    world, _, ranks = ring_results
    if world != 3: pytest.skip("a subgroup of two ranks needs a world of three")
    for rank in (0, 2):
        r = ranks[rank]["subgroup"]
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
        assert r["out"] <= OUT_TOL[torch.bfloat16] and r["lse"] <= 1e-3, r
        for g in ("dq", "dk", "dv"): assert r[g] <= GRAD_TOL[torch.bfloat16], (rank, g, r)
    assert "subgroup" not in ranks[1]


def test_ring_refuses_ranks_called_differently_on_every_rank(ring_results):
    world, _, ranks = ring_results
    for rank, results in enumerate(ranks):
        r = results["refusals"]
        assert "error" not in r, r.get("error")
        assert "must be called with the same shapes" in r["mismatch"], r["mismatch"]
        assert "rank 0: q (1, 4, 2, 16)" in r["mismatch"] and "rank 1: q (1, 6, 2, 16)" in r["mismatch"], r["mismatch"]
        assert "each rank's length must be even, got 5" in r["odd"], r["odd"]
        if rank != 1: assert "was refused on another rank of the group, so on every rank: rank 1: ValueError" in r["odd"], r["odd"]
        assert r["empty"] == [[2, 0, 2, 16], [2, 2, 0], [2, 0, 2, 16]], r["empty"]


def test_ring_refusals_without_a_group():
    q = torch.randn(1, 4, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="call torch.distributed.init_process_group first"): triton_fa2.ring_flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match="dropout_p must be 0.0"): triton_fa2.zigzag_ring_flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="alibi_slopes must be None: ring attention takes no ALiBi"):
        triton_fa2.ring_flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
    for window in ((128, 0), 64):
        with pytest.raises(ValueError, match="window_size must be \\(-1, -1\\): ring attention takes no sliding window"):
            triton_fa2.zigzag_ring_flash_attn_func(q, q, q, window_size=window)
    with pytest.raises(ValueError, match="multiple of 2 · world_size = 4"): triton_fa2.zigzag_shard(torch.zeros(1, 6), 0, 2)
    with pytest.raises(TypeError, match="causal must be a bool"): triton_fa2.ring_flash_attn_func(q, q, q, causal=1)
