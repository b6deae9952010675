"""Prototype: the warp-specialised forward as a persistent kernel (one program per SM walks blocks pid, pid + G, ...).
The loading warp runs ahead into the next block (the ring's counters carry over; each consumer's Q slot is reloaded once
that consumer is done with it); O leaves through the consumer's own P slot, so Q's slot frees before the epilogue; a
redo (fixed maximum overflowed) loads 64-key halves of K and V into the consumer's own two P slots, never the ring."""
import triton, torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)
from triton_fa2.gluon import (_tma_load, _tma_store, _wait_slot, _load_row, _block_plan, _mods_start, _softmax_tile,
                              _fixed_p, _epilogue, _take_turn, _give_turn, _arguments, _descriptor, _ws_maxnreg, _WS_REGS)
from triton_fa2.forward import _program_block
from triton_fa2.runtime import COMPILE_OPTIONS


@gluon.jit
def _p_block(blk, seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    start_m, off_zh = _program_block(blk, gl.cdiv(seqlen_q, BLOCK_M), CAUSAL)
    off_z = off_zh // num_heads
    off_h = off_zh % num_heads
    off_hkv = off_h // group_size
    first_pos = start_m * BLOCK_M
    end, full_end, online_lo, n_online, n_fixed, fixed_lo, full_lo = _block_plan(
        first_pos, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL,
        ALIBI=False, WINDOW=WINDOW)
    return (off_z, off_h, off_hkv, off_zh, first_pos), (n_online, online_lo, n_online + n_fixed, full_end, end, fixed_lo, full_lo)


@gluon.jit
def _p_producer(descs, smem, bars, args, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    q_desc, k_desc, v_desc, o_desc, k64_desc, v64_desc, LSE = descs
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars, redo_bars = bars
    seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right, total_blocks = args
    stages: gl.constexpr = k_smem.shape[0]
    rows: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    consumers: gl.constexpr = q_smem.shape[0]
    it = 0
    j = 0
    for blk in range(gl.program_id(0), total_blocks, gl.num_programs(0)):
        block, plan = _p_block(blk, seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW)
        off_z, off_h, off_hkv, off_zh, first_pos = block
        n_online, online_lo, n_loads, full_end, end, fixed_lo, full_lo = plan
        for c in gl.static_range(consumers):
            mbarrier.wait(q_empty.index(c), (j & 1) ^ 1)                  # consumer c is done with its last Q
            mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
            _tma_load(q_desc, [off_z, off_h, first_pos + c * rows, 0], q_bars.index(c), q_smem.index(c))
        for t in range(n_loads):
            r = it + t
            slot = r % stages
            phase = (r // stages) & 1
            row = _load_row(t, n_online, online_lo, BLOCK_N=BLOCK_N, fixed_lo=fixed_lo)
            mbarrier.wait(k_empty.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [off_z, off_hkv, row, 0], k_ready.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [off_z, off_hkv, row, 0], v_ready.index(slot), v_smem.index(slot))
        it += n_loads
        j += 1


@gluon.jit
def _p_products(me: gl.constexpr, r, t, q, acc, s_zero, smem, bars, PINGPONG: gl.constexpr):
    "`_ws_products` with ring (and turn) index r = the program's loads before this block + t; P slot by t."
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars, redo_bars = bars
    rows: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    _take_turn(turn_bars, me, r + 1, PINGPONG=PINGPONG)
    k = _wait_slot(k_ready, k_smem, r + 1)
    s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc_tok = warpgroup_mma(p_smem.index(me * 2 + t % 2).reshape([rows, BLOCK_N]), _wait_slot(v_ready, v_smem, r),
                            warpgroup_mma_init(acc), is_async=True)
    _give_turn(turn_bars, me, PINGPONG=PINGPONG)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    mbarrier.arrive(k_empty.index((r + 1) % k_smem.shape[0]), count=1)
    return s, acc_tok


@gluon.jit
def _p_retire(me: gl.constexpr, r, t, p, acc_tok, smem, bars):
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars, redo_bars = bars
    rows: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    p_smem.index(me * 2 + (t + 1) % 2).reshape([rows, BLOCK_N]).store(p.to(p_smem.dtype))
    fence_async_shared()
    acc = warpgroup_mma_wait(0, deps=(acc_tok,))
    mbarrier.arrive(v_empty.index(r % v_smem.shape[0]), count=1)
    return acc



@gluon.jit
def _p_consumer(me: gl.constexpr, descs, smem, bars, args, qk_scale, mods, BLOCK_M: gl.constexpr,
                CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTCAP: gl.constexpr, SINK: gl.constexpr,
                WINDOW: gl.constexpr):
    q_desc, k_desc, v_desc, o_desc, k64_desc, v64_desc, LSE = descs
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars, redo_bars = bars
    seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right, total_blocks = args
    dtype: gl.constexpr = o_desc.dtype
    rows: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HALF: gl.constexpr = 64                                            # a redo's key tile: one P slot
    EXACT_TANH: gl.constexpr = False
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    h_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_h: gl.constexpr = gl.SliceLayout(1, h_layout)
    cols_h: gl.constexpr = gl.SliceLayout(0, h_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offset = seqlen_k - seqlen_q
    window_sides = (window_left, window_right)
    offs_n = gl.arange(0, BLOCK_N, layout=cols_s)
    offs_h = gl.arange(0, HALF, layout=cols_h)
    s_zero = gl.zeros([rows, BLOCK_N], gl.float32, layout=s_layout)
    h_zero = gl.zeros([rows, HALF], gl.float32, layout=h_layout)
    it = 0
    j = 0
    rc = 0                                                             # redo loads so far (redo_bars[me]'s phases)
    for blk in range(gl.program_id(0), total_blocks, gl.num_programs(0)):
        block, plan = _p_block(blk, seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, WINDOW=WINDOW)
        off_z, off_h, off_hkv, off_zh, first_pos = block
        n_online, online_lo, n_loads, full_end, end, fixed_lo, full_lo = plan
        window = (full_lo, window_left, window_right)
        offs_m = first_pos + me * rows + gl.arange(0, rows, layout=rows_s)
        m_i, l_i, logit_mods = _mods_start(gl.full([rows], float("-inf"), gl.float32, layout=rows_s),
                                           gl.zeros([rows], gl.float32, layout=rows_s), mods, off_z, off_h, ALIBI=False, SINK=SINK)
        acc = gl.zeros([rows, HEAD_DIM], gl.float32, layout=o_layout)
        tma.store_wait(0)                                              # the last block's O has left P slot me·2
        mbarrier.wait(q_bars.index(me), j & 1)
        q = q_smem.index(me).reshape([rows, HEAD_DIM])
        if n_loads > 0:
            _take_turn(turn_bars, me, it, PINGPONG=PINGPONG)
            k = _wait_slot(k_ready, k_smem, it)
            s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            _give_turn(turn_bars, me, PINGPONG=PINGPONG)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(it % k_smem.shape[0]), count=1)
            p, alpha, l_i, m_i = _softmax_tile(s, m_i, l_i, offs_m, offs_n, online_lo, full_end, seqlen_k, offset, qk_scale,
                                               logit_mods, CAUSAL=CAUSAL, SOFTCAP=SOFTCAP, ALIBI=False, WINDOW=WINDOW,
                                               window=window, EXACT_TANH=EXACT_TANH)
            p_smem.index(me * 2).reshape([rows, BLOCK_N]).store(p.to(dtype))
            fence_async_shared()
            for t in range(0, n_online - 1):                           # the rest of the masked run: online
                s, acc_tok = _p_products(me, it + t, t, q, acc, s_zero, smem, bars, PINGPONG=PINGPONG)
                p, alpha, l_i, m_i = _softmax_tile(s, m_i, l_i, offs_m, offs_n, online_lo + (t + 1) * BLOCK_N, full_end,
                                                   seqlen_k, offset, qk_scale, logit_mods, CAUSAL=CAUSAL, SOFTCAP=SOFTCAP,
                                                   ALIBI=False, WINDOW=WINDOW, window=window, EXACT_TANH=EXACT_TANH)
                acc = _p_retire(me, it + t, t, p, acc_tok, smem, bars)
                acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            m_fixed = gl.where(m_i == float("-inf"), 0.0, m_i)
            for t in range(n_online - 1, n_loads - 1):                 # the unmasked tiles, each row's maximum fixed
                s, acc_tok = _p_products(me, it + t, t, q, acc, s_zero, smem, bars, PINGPONG=PINGPONG)
                p = _fixed_p(s, m_fixed[:, None], offs_m, offs_n, fixed_lo + (t + 1 - n_online) * BLOCK_N, offset, qk_scale,
                             logit_mods, SOFTCAP=SOFTCAP, ALIBI=False, WINDOW=WINDOW, window=window, seqlen_k=seqlen_k,
                             CAUSAL=CAUSAL, EXACT_TANH=EXACT_TANH)
                l_i = l_i + gl.sum(p, 1)
                acc = _p_retire(me, it + t, t, p, acc_tok, smem, bars)
            t_last = n_loads - 1
            acc_tok = warpgroup_mma(p_smem.index(me * 2 + t_last % 2).reshape([rows, BLOCK_N]),
                                    _wait_slot(v_ready, v_smem, it + t_last), warpgroup_mma_init(acc), is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok,))
            mbarrier.arrive(v_empty.index((it + t_last) % v_smem.shape[0]), count=1)
        finite = (l_i < float("inf")) & (gl.convert_layout(gl.sum(gl.abs(acc), 1), rows_s) < float("inf"))
        if gl.min(finite.to(gl.int32), 0) == 0:                         # redo online through this consumer's P slots
            bar = redo_bars.index(me)
            offs_mh = gl.convert_layout(offs_m, rows_h)
            m_h, l_h, _ = _mods_start(gl.full([rows], float("-inf"), gl.float32, layout=rows_h),
                                      gl.zeros([rows], gl.float32, layout=rows_h), mods, off_z, off_h, ALIBI=False, SINK=SINK)
            acc = gl.zeros([rows, HEAD_DIM], gl.float32, layout=o_layout)
            kh = p_smem.index(me * 2).reshape([HALF, HEAD_DIM])
            vh = p_smem.index(me * 2 + 1).reshape([HALF, HEAD_DIM])
            for t in range(0, gl.cdiv(end - fixed_lo, HALF)):
                start_n = fixed_lo + t * HALF
                mbarrier.expect(bar, k64_desc.block_type.nbytes + v64_desc.block_type.nbytes)
                _tma_load(k64_desc, [off_z, off_hkv, start_n, 0], bar, p_smem.index(me * 2))
                _tma_load(v64_desc, [off_z, off_hkv, start_n, 0], bar, p_smem.index(me * 2 + 1))
                mbarrier.wait(bar, rc & 1)
                rc += 1
                s = warpgroup_mma_wait(0, deps=(warpgroup_mma(q, kh.permute((1, 0)), h_zero, use_acc=False, is_async=True),))
                p, alpha, l_h, m_h = _softmax_tile(s, m_h, l_h, offs_mh, offs_h, start_n, full_end, seqlen_k, offset,
                                                   qk_scale, logit_mods, CAUSAL=CAUSAL, SOFTCAP=SOFTCAP, ALIBI=False,
                                                   WINDOW=WINDOW, window=window, EXACT_TANH=EXACT_TANH)
                acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc, p16 = warpgroup_mma_wait(0, deps=(warpgroup_mma(p16, vh, warpgroup_mma_init(acc), is_async=True), p16))
            m_i = gl.convert_layout(m_h, rows_s)
            l_i = gl.convert_layout(l_h, rows_s)
        mbarrier.arrive(q_empty.index(me), count=1)                    # Q's slot: the loading warp may refill it
        o, lse = _epilogue(acc, l_i, m_i, rows_o)
        gl.store(LSE + off_zh.to(gl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)
        o_smem = p_smem.index(me * 2)
        o_smem.reshape([rows, HEAD_DIM]).store(o.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, [off_z, off_h, first_pos + me * rows, 0], o_smem)
        it += n_loads
        j += 1
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k", "num_heads", "group_size", "window_left", "window_right", "total_blocks"])
def _attn_fwd_ws_persistent(q_desc, k_desc, v_desc, o_desc, k64_desc, v64_desc, LSE, seqlen_q, seqlen_k, num_heads,
                            group_size, qk_scale, softcap_scale, softcap_log2, SINKS, window_left, window_right, total_blocks,
                            HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                            PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                            num_warps: gl.constexpr, SOFTCAP: gl.constexpr = False, SINK: gl.constexpr = False,
                            WINDOW: gl.constexpr = False):
    consumers: gl.constexpr = 2
    dtype: gl.constexpr = q_desc.dtype
    rows: gl.constexpr = q_desc.block_type.shape[2]
    gl.static_assert(BLOCK_N == HEAD_DIM, "O leaves through a P slot")
    q_smem = gl.allocate_shared_memory(dtype, [consumers, 1, 1, rows, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [2 * consumers, 1, 1, rows, BLOCK_N], o_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [consumers, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [consumers, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [consumers, 1], mbarrier.MBarrierLayout())
    redo_bars = gl.allocate_shared_memory(gl.int64, [consumers, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(consumers):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
        mbarrier.init(turn_bars.index(i), count=1)
        mbarrier.init(redo_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=consumers)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=consumers)
    descs = (q_desc, k_desc, v_desc, o_desc, k64_desc, v64_desc, LSE)
    smem = (q_smem, k_smem, v_smem, p_smem)
    bars = (q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars, redo_bars)
    args = (seqlen_q, seqlen_k, num_heads, group_size, window_left, window_right, total_blocks)
    mods = (softcap_scale, softcap_log2, SINKS, 0, SINKS)
    gl.warp_specialize([(_p_consumer, (0, descs, smem, bars, args, qk_scale, mods, consumers * rows, CAUSAL, PINGPONG,
                                       SOFTCAP, SINK, WINDOW)),
                        (_p_consumer, (1, descs, smem, bars, args, qk_scale, mods, consumers * rows, CAUSAL, PINGPONG,
                                       SOFTCAP, SINK, WINDOW)),
                        (_p_producer, (descs, smem, bars, args, consumers * rows, CAUSAL, WINDOW))],
                       [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def launch(q, k, v, o, lse, causal, scale, config, mods=None, programs=None, compile_only=False):
    """(B, H, L, D) views; the ws config's tiles; `programs`: the grid (default: one per SM)."""
    named, grid = _arguments(q, k, v, o, lse, causal, scale, config, mods)
    named.pop("o_desc")
    for drop in ("SLOPES", "stride_slopes_z", "CU_SEQLENS_Q", "CU_SEQLENS_K", "O", "stride_om", "stride_oh", "stride_lse_h",
                 "VARLEN", "ALIBI"):
        named.pop(drop, None)
    named.update(o_desc=_descriptor(o, 64), k64_desc=_descriptor(k, 64), v64_desc=_descriptor(v, 64), total_blocks=grid)
    if programs is None:
        programs = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    if compile_only:
        from triton_fa2.runtime import compile_for_gpu
        return compile_for_gpu(_attn_fwd_ws_persistent, **named)
    return _attn_fwd_ws_persistent[(min(programs, grid),)](**named)
