"""Issue 6, the next lever after run 22 (experiment, not in the package): the Gluon kernel with cuDNN's and FA3's
schedule. One program owns 128 query rows and runs three partitions (`gl.warp_specialize`): a producer warp that only
issues TMA loads of Q, K and V into shared-memory rings, and two consumer warpgroups of 64 rows each, which share every
K/V tile (half the loads per row of the shipped kernel's two 64-row programs per SM) and get most of the registers
(`setmaxnreg`, through `worker_num_regs` and `maxnreg`). Each consumer runs FA3's intra-warpgroup order: issue QKᵀ(t+1)
and PV(t), wait for QKᵀ(t+1) only, softmax(t+1) while PV(t) runs (P through shared memory, as notebook 11's `P_SMEM`,
so no register is live under PV(t) but its accumulator), then wait for PV(t) and rescale. The softmax is online on
every tile, or (`FIXED_MAX`) on the masked run only, each row's maximum from it then fixed for the unmasked tiles as in
the package's kernels; if P overflowed, the consumer redoes its block online, loading its own tiles into ring slot `me`
once both consumers are done with the rings (a barrier of count 2).
Optional ping-pong (`PINGPONG`): the consumers take turns issuing their products, so one's softmax runs under the
other's products (FA3's inter-warpgroup overlap), ordered by two mbarriers.

    PYTHONPATH=. python3 tools/gluon_ws_attention.py --compile          # CPU: compile for sm_90, registers, spills, SASS counts
    PYTHONPATH=. python3 tools/gluon_ws_attention.py --commit SHA --out ws.csv   # GPU: checks against float32, then timing
"""
import argparse, os, re, sys, time
import torch, triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)
from triton_fa2.forward import LOG2E
from triton_fa2.gluon import _LN2, _key_plan, _load_row, _wait_slot, _softmax_tile, _cuobjdump, wgmma_hazards, _GL_DTYPES
sys.path.insert(0, os.path.dirname(__file__))
from gluon_attention import check_against_float32, time_against_yardsticks

ROWS = 64          # rows per consumer warpgroup; a program owns 2 · ROWS


@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, k_empty, v_ready, v_empty,
                 off_z, off_h, off_hkv, first_pos, n_online, online_lo, n_loads, BLOCK_N: gl.constexpr):
    "The loading warp: both consumers' Q tiles, then K and V tiles in the consumers' order, each slot when both freed it."
    stages: gl.constexpr = k_smem.shape[0]
    rows: gl.constexpr = q_smem.shape[3]
    for c in gl.static_range(2):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [off_z, off_h, first_pos + c * rows, 0], q_bars.index(c), q_smem.index(c))
    for t in range(n_loads):
        slot = t % stages
        phase = (t // stages) & 1
        row = _load_row(t, n_online, online_lo, BLOCK_N)
        mbarrier.wait(k_empty.index(slot), phase ^ 1)             # a fresh barrier counts as its phase 1 done
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [off_z, off_hkv, row, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [off_z, off_hkv, row, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _take_turn(turn_bars, me: gl.constexpr, k, PINGPONG: gl.constexpr):
    "Ping-pong: wait until it is this consumer's k-th turn to issue its products (consumer 0 goes first)."
    if PINGPONG:
        mbarrier.wait(turn_bars.index(me), (k & 1) ^ (1 - me))


@gluon.jit
def _give_turn(turn_bars, me: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(1 - me), count=1)


@gluon.jit
def _ws_step(me: gl.constexpr, t, q, acc, m_i, l_i, m_fixed, offs_m, offs_n, s_zero, k_smem, v_smem, p_smem, k_ready, k_empty,
             v_ready, v_empty, turn_bars, seqlen_k, offset, qk_scale, n_online, online_lo, full_end,
             HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, ONLINE: gl.constexpr):
    """Iteration t of a consumer: issue QKᵀ(t+1) and PV(t) (P(t) from shared memory), softmax(t+1) while PV(t) runs,
    P(t+1) to the other slot, then wait for PV(t); online (running maximum, rescale) or with each row's maximum fixed."""
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    _take_turn(turn_bars, me, t + 1, PINGPONG)
    k = _wait_slot(k_ready, k_smem, t + 1)
    s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc_tok = warpgroup_mma(p_smem.index(me * 2 + t % 2), _wait_slot(v_ready, v_smem, t), warpgroup_mma_init(acc), is_async=True)
    _give_turn(turn_bars, me, PINGPONG)
    s = warpgroup_mma_wait(1, deps=(s_tok,))                          # QKᵀ(t+1) done; PV(t) may still run
    mbarrier.arrive(k_empty.index((t + 1) % k_smem.shape[0]), count=1)
    if ONLINE:
        p, alpha, l_i, m_i = _softmax_tile(s, m_i, l_i, offs_m, offs_n, _load_row(t + 1, n_online, online_lo, BLOCK_N),
                                           full_end, seqlen_k, offset, qk_scale, CAUSAL)
    else:
        p = gl.exp2(s * qk_scale - m_fixed[:, None])                  # one FMA and one exp2 per score, no rescale
        l_i = l_i + gl.sum(p, 1)
    p_smem.index(me * 2 + (t + 1) % 2).store(p.to(p_smem.dtype))     # PV(t−1), its last reader, is retired
    fence_async_shared()
    acc = warpgroup_mma_wait(0, deps=(acc_tok,))
    mbarrier.arrive(v_empty.index(t % v_smem.shape[0]), count=1)
    if ONLINE:
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return acc, m_i, l_i


@gluon.jit
def _ws_consumer(me: gl.constexpr, o_desc, k_desc, v_desc, LSE, q_smem, k_smem, v_smem, p_smem, q_bars, k_ready, k_empty,
                 v_ready, v_empty, turn_bars, done_bar, redo_bars, off_z, off_h, off_hkv, off_zh, first_pos, seqlen_q,
                 seqlen_k, qk_scale, n_online, online_lo, n_loads, full_end, end, HEAD_DIM: gl.constexpr,
                 CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, PINGPONG: gl.constexpr, FIXED_MAX: gl.constexpr):
    """One consumer warpgroup: rows first_pos + me·64 …, every K/V tile the producer loads, PV overlapped. The masked run
    online; then, with FIXED_MAX, each row's maximum from it fixed for the unmasked tiles, and the block redone online
    (loading its own tiles into ring slot `me` once both consumers are done with the rings) if P overflowed."""
    dtype: gl.constexpr = o_desc.dtype
    rows: gl.constexpr = q_smem.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offset = seqlen_k - seqlen_q
    offs_m = first_pos + me * rows + gl.arange(0, rows, layout=rows_s)
    offs_n = gl.arange(0, BLOCK_N, layout=cols_s)
    m_i = gl.full([rows], float("-inf"), gl.float32, layout=rows_s)
    l_i = gl.zeros([rows], gl.float32, layout=rows_s)
    acc = gl.zeros([rows, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([rows, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bars.index(me), 0)
    q = q_smem.index(me).reshape([rows, HEAD_DIM])
    if n_loads > 0:                                                    # then n_online ≥ 1: tile 0 is the masked run's
        _take_turn(turn_bars, me, 0, PINGPONG)
        k = _wait_slot(k_ready, k_smem, 0)
        s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _give_turn(turn_bars, me, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(0), count=1)
        p, alpha, l_i, m_i = _softmax_tile(s, m_i, l_i, offs_m, offs_n, _load_row(0, n_online, online_lo, BLOCK_N),
                                           full_end, seqlen_k, offset, qk_scale, CAUSAL)
        p_smem.index(me * 2).store(p.to(dtype))
        fence_async_shared()
        online_steps = n_online - 1 if FIXED_MAX else n_loads - 1
        for t in range(0, online_steps):
            acc, m_i, l_i = _ws_step(me, t, q, acc, m_i, l_i, m_i, offs_m, offs_n, s_zero, k_smem, v_smem, p_smem, k_ready,
                                     k_empty, v_ready, v_empty, turn_bars, seqlen_k, offset, qk_scale, n_online, online_lo,
                                     full_end, HEAD_DIM, CAUSAL, PINGPONG, True)
        if FIXED_MAX:
            m_fixed = gl.where(m_i == float("-inf"), 0.0, m_i)        # a row that saw none of them sees no key: P stays 0
            for t in range(online_steps, n_loads - 1):
                acc, m_i, l_i = _ws_step(me, t, q, acc, m_i, l_i, m_fixed, offs_m, offs_n, s_zero, k_smem, v_smem, p_smem,
                                         k_ready, k_empty, v_ready, v_empty, turn_bars, seqlen_k, offset, qk_scale, n_online,
                                         online_lo, full_end, HEAD_DIM, CAUSAL, PINGPONG, False)
        t_last = n_loads - 1
        acc_tok = warpgroup_mma(p_smem.index(me * 2 + t_last % 2), _wait_slot(v_ready, v_smem, t_last),
                                warpgroup_mma_init(acc), is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
        mbarrier.arrive(v_empty.index(t_last % v_smem.shape[0]), count=1)
    if FIXED_MAX:
        mbarrier.arrive(done_bar, count=1)                             # this consumer is done with the rings
        finite = (l_i < float("inf")) & (gl.convert_layout(gl.sum(gl.abs(acc), 1), rows_s) < float("inf"))
        if gl.min(finite.to(gl.int32), 0) == 0:
            mbarrier.wait(done_bar, 0)                                 # … and so is the other: slot `me` is free
            bar = redo_bars.index(me)
            m_i = gl.full([rows], float("-inf"), gl.float32, layout=rows_s)
            l_i = gl.zeros([rows], gl.float32, layout=rows_s)
            acc = gl.zeros([rows, HEAD_DIM], gl.float32, layout=o_layout)
            k = k_smem.index(me).reshape([BLOCK_N, HEAD_DIM])
            v = v_smem.index(me).reshape([BLOCK_N, HEAD_DIM])
            for t in range(0, gl.cdiv(end, BLOCK_N)):                  # one slot, load then compute: slow, and rare
                mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [off_z, off_hkv, t * BLOCK_N, 0], bar, k_smem.index(me))
                tma.async_copy_global_to_shared(v_desc, [off_z, off_hkv, t * BLOCK_N, 0], bar, v_smem.index(me))
                mbarrier.wait(bar, t & 1)
                s = warpgroup_mma_wait(0, deps=(warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True),))
                p, alpha, l_i, m_i = _softmax_tile(s, m_i, l_i, offs_m, offs_n, t * BLOCK_N, full_end, seqlen_k, offset,
                                                   qk_scale, CAUSAL)
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
                acc, p16 = warpgroup_mma_wait(0, deps=(warpgroup_mma(p16, v, warpgroup_mma_init(acc), is_async=True), p16))
    seen_nothing = l_i == 0.0
    l_safe = gl.where(seen_nothing, 1.0, l_i)
    o = acc / gl.convert_layout(l_safe, rows_o)[:, None]
    lse = gl.where(seen_nothing, float("-inf"), (m_i + gl.log2(l_safe)) * _LN2)
    gl.store(LSE + off_zh.to(gl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)
    o_smem = q_smem.index(me)                                          # Q's tile is no longer read: O goes out through it
    o_smem.reshape([rows, HEAD_DIM]).store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_z, off_h, first_pos + me * rows, 0], o_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k", "num_heads", "group_size"])
def _attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE, seqlen_q, seqlen_k, num_heads, group_size, qk_scale,
                 HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 PINGPONG: gl.constexpr, FIXED_MAX: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    rows: gl.constexpr = q_desc.block_type.shape[2]
    block_m: gl.constexpr = 2 * rows
    pid = gl.program_id(0)
    num_m_blocks = gl.cdiv(seqlen_q, block_m)
    start_m = pid % num_m_blocks
    if CAUSAL: start_m = num_m_blocks - 1 - start_m     # the blocks that see the most keys start first
    off_zh = pid // num_m_blocks
    off_z = off_zh // num_heads
    off_h = off_zh % num_heads
    off_hkv = off_h // group_size
    # The tiles of the whole 128-row block, in the shipped kernel's order: the masked run first, then key 0 onwards
    first_pos = start_m * block_m
    end, full_end, online_lo, n_online, n_fixed = _key_plan(first_pos, seqlen_q, seqlen_k, block_m, BLOCK_N, CAUSAL)
    n_loads = n_online + n_fixed

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, rows, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [4, rows, BLOCK_N], gl.NVMMASharedLayout.get_default_for([rows, BLOCK_N], dtype))
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    redo_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(done_bar, count=2)                  # both consumers done with the rings (FIXED_MAX's redo)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turn_bars.index(i), count=1)
        mbarrier.init(redo_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)      # both consumers release a slot
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)

    # (the argument tuples are written out in the call: a tuple assigned to a name first would turn its constexprs into tensors)
    gl.warp_specialize([(_ws_consumer, (0, o_desc, k_desc, v_desc, LSE, q_smem, k_smem, v_smem, p_smem, q_bars, k_ready,
                                         k_empty, v_ready, v_empty, turn_bars, done_bar, redo_bars, off_z, off_h, off_hkv,
                                         off_zh, first_pos, seqlen_q, seqlen_k, qk_scale, n_online, online_lo, n_loads,
                                         full_end, end, HEAD_DIM, CAUSAL, BLOCK_N, PINGPONG, FIXED_MAX)),
                        (_ws_consumer, (1, o_desc, k_desc, v_desc, LSE, q_smem, k_smem, v_smem, p_smem, q_bars, k_ready,
                                         k_empty, v_ready, v_empty, turn_bars, done_bar, redo_bars, off_z, off_h, off_hkv,
                                         off_zh, first_pos, seqlen_q, seqlen_k, qk_scale, n_online, online_lo, n_loads,
                                         full_end, end, HEAD_DIM, CAUSAL, BLOCK_N, PINGPONG, FIXED_MAX)),
                        (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, k_empty, v_ready,
                                        v_empty, off_z, off_h, off_hkv, first_pos, n_online, online_lo, n_loads, BLOCK_N))],
                       [4, 1], [CONSUMER_REGS, 24])


def _descriptor(t, rows):
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, t.shape[-1]], _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]], layout)


def _arguments(q, k, v, o, lse, causal, scale, BLOCK_N=64, STAGES=2, PINGPONG=False, FIXED_MAX=False, CONSUMER_REGS=240):
    B, Hq, Lq, D = q.shape
    named = dict(q_desc=_descriptor(q, ROWS), k_desc=_descriptor(k, BLOCK_N), v_desc=_descriptor(v, BLOCK_N),
                 o_desc=_descriptor(o, ROWS), LSE=lse, seqlen_q=Lq, seqlen_k=k.shape[2], num_heads=Hq,
                 group_size=Hq // k.shape[1], qk_scale=scale * LOG2E, HEAD_DIM=D, CAUSAL=causal, BLOCK_N=BLOCK_N,
                 STAGES=STAGES, PINGPONG=PINGPONG, FIXED_MAX=FIXED_MAX, CONSUMER_REGS=CONSUMER_REGS, num_warps=4)
    return named, triton.cdiv(Lq, 2 * ROWS) * B * Hq


def maxnreg_for(consumer_regs):
    """Registers per thread the launch assumes (`maxnreg`), such that three warpgroups at that count hold what the two
    consumers (`consumer_regs` each, the default partition getting what is left) and the producer (24) are given:
    consumer_regs a multiple of 24 (192, 216, 240)."""
    assert (2 * consumer_regs + 24) % 24 == 0, f"consumer registers {consumer_regs}: use 192, 216 or 240"
    return (2 * consumer_regs + 24) // 3


def attention_ws(q, k, v, causal=False, scale=None, poison=False, **config):
    "q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D) views that TMA can read; returns (o, lse)."
    D = q.shape[-1]
    o = torch.full_like(q, float("nan")) if poison else torch.empty_like(q)   # poisoned: an unwritten element reads NaN
    lse = torch.full(q.shape[:3], float("nan"), device=q.device) if poison else torch.empty(q.shape[:3], device=q.device)
    named, grid = _arguments(q, k, v, o, lse, causal, D ** -0.5 if scale is None else scale, **config)
    _attn_fwd_ws[(grid,)](**named, maxnreg=maxnreg_for(named["CONSUMER_REGS"]))
    return o, lse


def compile_sm90(B=8, H=32, N=2048, D=128, causal=True, dtype=torch.bfloat16, **config):
    "Compile for sm_90 without a GPU (CPU tensors stand in), as `triton_fa2.gluon._compile_sm90`."
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    q, k, v = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(3))
    named, _ = _arguments(q, k, v, torch.empty_like(q), torch.empty(B, H, N), causal, D ** -0.5, **config)
    target = GPUTarget("cuda", 90, 32)
    backend, fn = CUDABackend(target), _attn_fwd_ws
    kwargs = dict(named, maxnreg=maxnreg_for(named["CONSUMER_REGS"]))
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(**kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def report(kernel):
    usage, sass = _cuobjdump(kernel.asm["cubin"], "-res-usage"), _cuobjdump(kernel.asm["cubin"])
    found = lambda pattern: int(m[1]) if (m := re.search(pattern, usage)) else None
    return dict(registers=found(r"REG:(\d+)"), stack_bytes=found(r"STACK:(\d+)"), shared_kib=kernel.metadata.shared // 1024,
                wgmma=sass.count("HGMMA"), waits=sass.count("WARPGROUP.DEPBAR"),
                waits_leaving_one=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"), setmaxnreg=len(re.findall(r"USETMAXREG", sass)),
                hazards=len(wgmma_hazards(sass))), sass


CHECKS = [(1, 2, 17, 64, True), (2, 4, 1000, 128, True), (2, 4, 1000, 128, False), (1, 2, 300, 128, True, 700),
          (1, 2, 700, 64, True, 300), (2, 8, 2048, 128, True), (1, 1, 1, 128, False), (2, 8, 128, 128, True, 64)] \
         + [(2, 4, 4096, 64, True)] * 3 + [(4, 8, 4096, 128, True), (8, 32, 2048, 64, False), (2, 4, 256, 128, False, 8192)]


def gpu_checks(configs):
    "Every config on odd shapes (Lq ≠ Lk both ways, rows that see no key, one row) against float32; poisoned outputs."
    ok_all = True
    for cfg in configs:
        for dtype in (torch.bfloat16, torch.float16):
            for B, H, Lq, D, causal, *lk in CHECKS:
                run = lambda q, k, v, causal: attention_ws(q, k, v, causal, poison=True, **cfg)
                ok_all &= check_against_float32(run, B, H, Lq, lk[0] if lk else Lq, D, causal, dtype, label=cfg)
            for D in (64, 128):   # P overflows under a fixed maximum: the redo (FIXED_MAX), or nothing to redo (online)
                ok_all &= check_against_float32(run, 2, 2, 512, 512, D, True, dtype, label=f"{cfg} overflow", overflow=True)
        print(f"checked {cfg}", flush=True)
    print("ALL CHECKS PASSED" if ok_all else "SOME CHECKS FAILED", flush=True)
    return ok_all


def gpu_time(configs, out, commit):
    "The timing shapes: each config against the package's pick, FA2 and cuDNN, one process (do_bench and CUDA graphs)."
    time_against_yardsticks(lambda q, k, v, causal: {"ws " + " ".join(f"{a}={b}" for a, b in cfg.items()):
                                                     (lambda cfg=cfg: attention_ws(q, k, v, causal, **cfg)) for cfg in configs},
                            out, commit)


def parse(configs):
    "'BLOCK_N,STAGES,PINGPONG,CONSUMER_REGS[,FIXED_MAX];...' → list of config dicts."
    keys = ("BLOCK_N", "STAGES", "PINGPONG", "CONSUMER_REGS", "FIXED_MAX")
    return [{k: (bool(int(x)) if k in ("PINGPONG", "FIXED_MAX") else int(x)) for k, x in zip(keys, c.split(","))}
            for c in configs.split(";") if c]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--configs", default="64,2,0,240;64,2,1,240;128,2,0,240;128,2,1,240")
    ap.add_argument("--out", default="gluon_ws.csv"); ap.add_argument("--commit", default="unknown")
    ap.add_argument("--smoke", action="store_true", help="GPU: one small causal check per config, to catch a hang cheaply")
    a = ap.parse_args()
    configs = parse(a.configs)
    if a.smoke:   # prints "smoke <config as given>: ok" per config that passed, for the next call's --configs
        for text, cfg in zip([c for c in a.configs.split(";") if c], configs):
            run = lambda q, k, v, causal: attention_ws(q, k, v, causal, poison=True, **cfg)
            good = check_against_float32(run, 1, 2, 300, 300, 128, True, torch.bfloat16, label=cfg)
            print(f"smoke {text}: {'ok' if good else 'WRONG'}", flush=True)
    elif a.compile:
        for cfg in configs:
            for D, causal, dtype in ((128, True, torch.bfloat16), (64, False, torch.float16)):
                t0 = time.time()
                try:
                    r, sass = report(compile_sm90(D=D, causal=causal, dtype=dtype, **cfg))
                    print(cfg, D, causal, dtype, r, f"{time.time() - t0:.0f} s", flush=True)
                    if os.environ.get("SASS_OUT"): open(f"{os.environ['SASS_OUT']}_{D}.sass", "w").write(sass)
                except Exception as e:
                    print(cfg, D, causal, dtype, "FAILED", type(e).__name__, str(e)[:1500], flush=True)
    elif gpu_checks(configs):
        gpu_time(configs, a.out, a.commit)
