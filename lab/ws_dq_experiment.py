# one-off lab experiment (not in the package): the dQ pass warp-specialised, as the dK/dV pass is: a loading warp streams
# K and V through a ring both consumers release, two consumer warpgroups of 64 query rows each (Q and dO loaded once),
# S = Q Kᵀ and dP = dO Vᵀ, dS = P ∘ (dP − Δ) in registers as the A operand of dQ += dS K. Rows' M and Δ come in (the
# preprocessing kernel's); the `tl` pass it is compared with reads them too (no PREPROCESS).
#   python .devjob/ws_dq.py compile        # sm_90 without a GPU: registers, spills, shared memory
#   python .devjob/ws_dq.py gpu            # correctness against float64 and the tl pass, then timing against the tl pass
import os, sys, time
if sys.argv[1:2] in (["compile"], ["hazards"]): os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait
from triton_fa2.forward import LOG2E, _kv_key_bounds, _program_block
from triton_fa2.gluon import _WS_CONSUMER_REGS, _descriptor, _tma_load, _ws_maxnreg
from triton_fa2.gluon_backward import _issue_rows

VARIANTS = [dict(BLOCK_N=64, STAGES=2), dict(BLOCK_N=64, STAGES=3), dict(BLOCK_N=128, STAGES=2)]
PRE_VARIANT = dict(BLOCK_N=64, STAGES=2)   # the one also run with its rows' M and Δ computed in its prologue


@gluon.jit
def _dq_ws_producer(descs, smem, bars, where):
    "The loading warp: each consumer's Q and dO once, then every step's K and V into the ring once both consumers released the slot."
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_smem, v_smem = smem
    q_bars, ready, empty = bars
    off_z, off_h, off_hkv, first_row, n_steps = where
    stages: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    ROWS: gl.constexpr = q_smem.shape[3]
    for c in gl.static_range(2):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [off_z, off_h, first_row + c * ROWS, 0], q_bars.index(c), q_smem.index(c))
        _tma_load(do_desc, [off_z, off_h, first_row + c * ROWS, 0], q_bars.index(c), do_smem.index(c))
    for t in range(n_steps):
        mbarrier.wait(empty.index(t % stages), ((t // stages) & 1) ^ 1)    # a fresh barrier counts as its phase 1 done
        _issue_rows(k_desc, v_desc, off_z, off_hkv, t * BLOCK_N, ready, k_smem, v_smem, t, True)


@gluon.jit
def _dq_ws_consumer(me: gl.constexpr, descs, smem, bars, where, DQ, M, DELTA, stride_dqz, stride_dqh, stride_dqm,
                    num_heads_q, seqlen_q, seqlen_k, scale, qk_scale, pre, CAUSAL: gl.constexpr,
                    PREPROCESS: gl.constexpr, HAS_DLSE: gl.constexpr):
    "Consumer warpgroup `me`: rows first_row + 64·me …, over the keys they see; the ring's later steps only released."
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_smem, v_smem = smem
    q_bars, ready, empty = bars
    off_z, off_h, off_hkv, first_row, n_steps = where
    dtype: gl.constexpr = q_desc.dtype
    stages: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    ROWS: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row0 = first_row + me * ROWS
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    at = (off_z * num_heads_q + off_h).to(gl.int64) * seqlen_q
    if PREPROCESS:                                             # the rows' Δ and M from O, dO and the LSE, stored for dK/dV
        O, LSE, DLSE, stride_oz, stride_oh, stride_om = pre
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_b = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, blk))
        offs_db = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, blk))
        row_ok = rows_b < seqlen_q
        o = gl.load(O + off_z.to(gl.int64) * stride_oz + off_h.to(gl.int64) * stride_oh + rows_b[:, None].to(gl.int64) * stride_om
                    + offs_db[None, :], mask=row_ok[:, None], other=0.0)
        mbarrier.wait(q_bars.index(me), 0)
        do_b = do_smem.index(me).reshape([ROWS, HEAD_DIM]).load(blk)
        delta_b = gl.sum(o.to(gl.float32) * do_b.to(gl.float32), axis=1)
        if HAS_DLSE: delta_b -= gl.load(DLSE + at + rows_b, mask=row_ok, other=0.0)
        lse = gl.load(LSE + at + rows_b, mask=row_ok, other=float("-inf"))
        m_b = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        gl.store(DELTA + at + rows_b, delta_b, mask=row_ok)
        gl.store(M + at + rows_b, m_b, mask=row_ok)
        m = gl.convert_layout(m_b, gl.SliceLayout(1, s_layout))
        delta = gl.convert_layout(delta_b, gl.SliceLayout(1, s_layout))
    else:
        m = gl.load(M + at + rows, mask=rows < seqlen_q, other=float("inf"))   # rows past Lq: P = 0
        delta = gl.load(DELTA + at + rows, mask=rows < seqlen_q, other=0.0)
    full_end, end, _ = _kv_key_bounds(row0, gl.minimum(row0 + ROWS, seqlen_q) - 1, seqlen_q, seqlen_k, BLOCK_N, CAUSAL)
    my_steps = gl.cdiv(end, BLOCK_N)
    offset = seqlen_k - seqlen_q
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    if not PREPROCESS: mbarrier.wait(q_bars.index(me), 0)
    q = q_smem.index(me).reshape([ROWS, HEAD_DIM])
    do = do_smem.index(me).reshape([ROWS, HEAD_DIM])
    for t in range(n_steps):
        slot = t % stages
        mbarrier.wait(ready.index(slot), (t // stages) & 1)
        if t < my_steps:
            k = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
            v = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
            s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)     # S = Q Kᵀ
            dp_tok = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)   # dP = dO Vᵀ
            s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            p = gl.exp2(s * qk_scale - m[:, None])
            start_n = t * BLOCK_N
            if start_n >= full_end:                                 # the causal diagonal, or Lk's partial (zero-filled) tile
                cols = start_n + offs_n
                visible = cols[None, :] < seqlen_k
                if CAUSAL: visible = visible & (cols[None, :] <= rows[:, None] + offset)
                p = gl.where(visible, p, 0.0)
            ds16 = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
            dq_tok = warpgroup_mma(ds16, k, warpgroup_mma_init(dq), is_async=True)               # dQ += dS K
            dq, ds16 = warpgroup_mma_wait(0, deps=(dq_tok, ds16))
        mbarrier.arrive(empty.index(slot), count=1)
    dq = dq * scale
    rows_o = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    ptrs = DQ + off_z.to(gl.int64) * stride_dqz + off_h.to(gl.int64) * stride_dqh + rows_o[:, None].to(gl.int64) * stride_dqm + offs_d[None, :]
    gl.store(ptrs, dq.to(DQ.dtype.element_ty), mask=rows_o[:, None] < seqlen_q)


@gluon.jit(do_not_specialize=["num_heads_q", "group_size", "seqlen_q", "seqlen_k"])
def _attn_bwd_dq_ws(q_desc, k_desc, v_desc, do_desc,   # descriptors of (B, H, L, D) views: Q, dO tiles of 64 rows, K, V of BLOCK_N
                    DQ, M, DELTA,                      # dq (B, Hq, Lq, D) any strides; m, delta (B, Hq, Lq)
                    O, LSE, DLSE,                      # with PREPROCESS: o as q; lse, dlse (B, Hq, Lq): M and Δ computed and stored
                    stride_dqz, stride_dqh, stride_dqm, stride_oz, stride_oh, stride_om,
                    num_heads_q, group_size, seqlen_q, seqlen_k, scale, qk_scale,
                    HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
                    PREPROCESS: gl.constexpr = False, HAS_DLSE: gl.constexpr = False):
    "`_attn_bwd_dq`'s program over 128 rows of a batch and query head, as a loading warp and two consumer warpgroups of 64 rows."
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = 2 * ROWS
    start_m, off_zh = _program_block(gl.program_id(0), gl.cdiv(seqlen_q, BLOCK_M), CAUSAL)   # as the `tl` pass
    off_z = off_zh // num_heads_q
    off_h = off_zh % num_heads_q
    off_hkv = off_h // group_size
    first_row = start_m * BLOCK_M
    _, end, _ = _kv_key_bounds(first_row, gl.minimum(first_row + BLOCK_M, seqlen_q) - 1, seqlen_q, seqlen_k, BLOCK_N, CAUSAL)
    n_steps = gl.cdiv(end, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, ROWS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, ROWS, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)             # both consumers release a slot

    descs = (q_desc, k_desc, v_desc, do_desc)
    smem = (q_smem, do_smem, k_smem, v_smem)
    bars = (q_bars, ready, empty)
    where = (off_z, off_h, off_hkv, first_row, n_steps)
    pre = (O, LSE, DLSE, stride_oz, stride_oh, stride_om)
    gl.warp_specialize([(_dq_ws_consumer, (0, descs, smem, bars, where, DQ, M, DELTA, stride_dqz, stride_dqh, stride_dqm,
                                           num_heads_q, seqlen_q, seqlen_k, scale, qk_scale, pre, CAUSAL, PREPROCESS, HAS_DLSE)),
                        (_dq_ws_consumer, (1, descs, smem, bars, where, DQ, M, DELTA, stride_dqz, stride_dqh, stride_dqm,
                                           num_heads_q, seqlen_q, seqlen_k, scale, qk_scale, pre, CAUSAL, PREPROCESS, HAS_DLSE)),
                        (_dq_ws_producer, (descs, smem, bars, where))],
                       [4, 1], [CONSUMER_REGS, 24])


def arguments(q, k, v, do, dq, m, delta, causal, scale, BLOCK_N=64, STAGES=2, preprocess=None):
    B, Hq, Lq, D = q.shape
    o, lse, dlse = preprocess if preprocess is not None else (dq, m, None)   # unread without PREPROCESS
    Hkv, Lk = k.shape[1], k.shape[2]
    named = dict(q_desc=_descriptor(q, 64), k_desc=_descriptor(k, BLOCK_N), v_desc=_descriptor(v, BLOCK_N),
                 do_desc=_descriptor(do, 64), DQ=dq, M=m, DELTA=delta, O=o, LSE=lse, DLSE=lse if dlse is None else dlse,
                 stride_dqz=dq.stride(0), stride_dqh=dq.stride(1), stride_dqm=dq.stride(2),
                 stride_oz=o.stride(0), stride_oh=o.stride(1), stride_om=o.stride(2),
                 num_heads_q=Hq, group_size=Hq // Hkv, seqlen_q=Lq, seqlen_k=Lk, scale=scale, qk_scale=scale * LOG2E,
                 HEAD_DIM=D, CAUSAL=causal, BLOCK_N=BLOCK_N, STAGES=STAGES,
                 CONSUMER_REGS=_WS_CONSUMER_REGS, num_warps=4, maxnreg=_ws_maxnreg(_WS_CONSUMER_REGS),
                 PREPROCESS=preprocess is not None, HAS_DLSE=dlse is not None)
    return named, triton.cdiv(Lq, 128) * B * Hq


def launch(q, k, v, do, dq, m, delta, causal, scale, **kw):
    named, grid = arguments(q, k, v, do, dq, m, delta, causal, scale, **kw)
    if grid: _attn_bwd_dq_ws[(grid,)](**named)


def compile_report():
    from triton_fa2.runtime import compile_for_gpu, resource_usage
    for D in (64, 128):
        for causal in (True, False):
            for dtype in (torch.bfloat16, torch.float16):
                for kw in VARIANTS + [dict(PRE_VARIANT, pre=True)]:
                    kw = dict(kw)
                    q, do = (torch.empty(2, 8, 2048, D, dtype=dtype) for _ in range(2))
                    k, v = (torch.empty(2, 2, 2048, D, dtype=dtype) for _ in range(2))
                    m, delta = torch.empty(2, 8, 2048), torch.empty(2, 8, 2048)
                    pre = (torch.empty_like(q), torch.empty(2, 8, 2048), None) if kw.pop("pre", False) else None
                    named, _ = arguments(q, k, v, do, torch.empty_like(q), m, delta, causal, D ** -0.5, preprocess=pre, **kw)
                    t = time.perf_counter()
                    try:
                        ck = compile_for_gpu(_attn_bwd_dq_ws, **named)
                        print(f"D={D} causal={causal} {str(dtype)[6:]} {kw} pre={pre is not None}: {resource_usage(ck)} ({time.perf_counter() - t:.1f} s)", flush=True)
                    except Exception as e:
                        print(f"D={D} causal={causal} {kw}: FAILED {type(e).__name__}: {str(e)[:1500]}", flush=True)


def gpu():
    import triton_fa2
    from triton_fa2.backward import attention_backward_ref, launch_preprocess, launch_dq
    from triton_fa2.candidates import backward_candidates
    torch.manual_seed(0)
    dev = "cuda"
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)

    def inputs(B, Hq, Hkv, Lq, Lk, D, dtype):
        q, do = (torch.randn(B, Hq, Lq, D, device=dev, dtype=dtype) for _ in range(2))
        k, v = (torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype) for _ in range(2))
        return q, k, v, do

    def stats(q, k, v, do, causal, scale):
        o, lse = triton_fa2.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        delta, m = launch_preprocess(o, do, lse.contiguous())
        return m, delta, o, lse.contiguous()

    bad = 0
    cases = [(2, 8, 2, 333, 1000, 128, True), (2, 4, 4, 1000, 333, 128, True), (1, 4, 4, 1024, 1024, 128, True),
             (2, 4, 1, 257, 513, 128, False), (1, 2, 2, 1, 700, 128, True), (1, 2, 2, 700, 1, 128, True),
             (1, 2, 2, 64, 64, 128, False), (1, 2, 2, 65, 64, 128, True), (2, 8, 2, 333, 1000, 64, True),
             (2, 4, 1, 257, 513, 64, False), (1, 4, 4, 1024, 1024, 64, True), (2, 4, 2, 2048, 2048, 128, True)]
    for kw in VARIANTS:
        for B, Hq, Hkv, Lq, Lk, D, causal in cases:
            for dtype in (torch.bfloat16, torch.float16):
                q, k, v, do = inputs(B, Hq, Hkv, Lq, Lk, D, dtype)
                scale = D ** -0.5
                m, delta, _, _ = stats(q, k, v, do, causal, scale)
                dq = torch.full_like(q, float("nan"))
                launch(q, k, v, do, dq, m, delta, causal, scale, **kw)
                torch.cuda.synchronize()
                rq, _, _ = attention_backward_ref(q, k, v, do, causal, scale)
                err = ((dq.double() - rq).abs().max() / rq.abs().max().clamp_min(1)).item()
                ok = err < 2e-2 and not dq.isnan().any()
                if kw == PRE_VARIANT:                          # again, with the rows' M and Δ computed in the prologue
                    _, _, o, lse = stats(q, k, v, do, causal, scale)
                    m2, delta2, dq2 = torch.full_like(m, float("nan")), torch.full_like(delta, float("nan")), torch.full_like(q, float("nan"))
                    launch(q, k, v, do, dq2, m2, delta2, causal, scale, preprocess=(o, lse, None), **kw)
                    torch.cuda.synchronize()
                    same = torch.equal(m2, m) and torch.allclose(delta2, delta, rtol=1e-5, atol=1e-5) and torch.equal(dq2.isnan(), dq.isnan())
                    err2 = ((dq2.double() - rq).abs().max() / rq.abs().max().clamp_min(1)).item()
                    ok = ok and same and err2 < 2e-2 and not dq2.isnan().any()
                bad += not ok
                if not ok or (B, Lq) == (2, 2048): print(f"check {'ok' if ok else 'BAD'} {kw} {(B, Hq, Hkv, Lq, Lk, D, causal)} {dtype} err {err:.2e}", flush=True)
    print(f"check done, bad: {bad}", flush=True)
    if bad: return

    shapes = [(8, 32, 32, 2048, 128, True, torch.bfloat16), (8, 32, 32, 2048, 128, True, torch.float16),
              (8, 32, 32, 2048, 128, False, torch.bfloat16), (1, 32, 32, 8192, 128, True, torch.bfloat16),
              (4, 32, 8, 4096, 128, True, torch.bfloat16), (8, 32, 32, 2048, 64, True, torch.bfloat16),
              (4, 32, 32, 4096, 64, True, torch.float16)]
    for B, Hq, Hkv, L, D, causal, dtype in shapes:
        q, k, v, do = inputs(B, Hq, Hkv, L, L, D, dtype)
        scale = D ** -0.5
        m, delta, o, lse = stats(q, k, v, do, causal, scale)
        dq = torch.empty_like(q)
        m2, delta2 = torch.empty_like(m), torch.empty_like(delta)
        runs = {}
        first = backward_candidates("bwd_dq", D, False, 232448)[0]
        runs[f"tl {first.label} + its rows' M and Δ"] = (lambda: launch_dq(q, k, v, do, dq, m2, delta2, causal, scale, first,
                                                                        use_tma=True, preprocess=(o, lse, None)))
        for c in backward_candidates("bwd_dq", D, False, 232448)[:3]:
            runs[f"tl {c.label}"] = (lambda c=c: launch_dq(q, k, v, do, dq, m, delta, causal, scale, c, use_tma=True))
        for kw in VARIANTS:
            runs[f"ws {kw}"] = (lambda kw=kw: launch(q, k, v, do, dq, m, delta, causal, scale, **kw))
        runs[f"ws {PRE_VARIANT} + its rows' M and Δ"] = (lambda: launch(q, k, v, do, dq, m2, delta2, causal, scale,
                                                                         preprocess=(o, lse, None), **PRE_VARIANT))
        flops = 3 * 2 * B * Hq * L * L * D / (2 if causal else 1)
        times = {name: [] for name in runs}
        for fn in runs.values(): fn()
        torch.cuda.synchronize()
        for _ in range(3):                                     # interleaved rounds
            for name, fn in runs.items():
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100))
        for name, ts in times.items():
            ms = sorted(ts)[1]
            print(f"time {(B, Hq, Hkv, L, D, causal, str(dtype)[6:])} {name}: {ms:.4f} ms {flops / ms / 1e9:.1f} TFLOP/s (dQ pass)", flush=True)


if __name__ == "__main__":
    {"compile": compile_report, "gpu": lambda: gpu(), "hazards": lambda: None}[sys.argv[1]]()


def hazards_report():
    from triton_fa2.runtime import compile_for_gpu, cuobjdump
    from triton_fa2.gluon import wgmma_hazards
    for D in (64, 128):
        for causal in (True, False):
            for kw in VARIANTS + [dict(PRE_VARIANT, pre=True)]:
                kw = dict(kw)
                q, do = (torch.empty(2, 8, 2048, D, dtype=torch.bfloat16) for _ in range(2))
                k, v = (torch.empty(2, 2, 2048, D, dtype=torch.bfloat16) for _ in range(2))
                m, delta = torch.empty(2, 8, 2048), torch.empty(2, 8, 2048)
                pre = (torch.empty_like(q), torch.empty(2, 8, 2048), None) if kw.pop("pre", False) else None
                named, _ = arguments(q, k, v, do, torch.empty_like(q), m, delta, causal, D ** -0.5, preprocess=pre, **kw)
                kw["pre"] = pre is not None
                sass = cuobjdump(compile_for_gpu(_attn_bwd_dq_ws, **named))
                print(f"D={D} causal={causal} {kw}: hazards {wgmma_hazards(sass)[:5]}, HGMMA {sass.count('HGMMA')}", flush=True)


if __name__ == "__main__" and sys.argv[1] == "hazards": hazards_report()
