"""One definition of which keys a block of query rows visits. The causal key bounds are `forward._kv_key_bounds`, a jit
function that every kernel calls (the `tl` prefill kernel, the decode kernel, both Gluon kernels); this checks it
against the PyTorch reference of chapter 02 (`tiling.kv_block_range`) on a grid of shapes, for plain and GQA-packed
rows, and that no kernel module (packed sequences' included) computes the bounds by itself. The backward's dK/dV pass needs the relation the other way
round (which rows see a block of keys): `backward._q_row_bounds`, checked against the same definition."""
import inspect
import itertools
import re

import pytest
import torch
import triton
import triton.language as tl

import triton_fa2.backward as bwd
import triton_fa2.forward as fwd
import triton_fa2.split_kv as split_kv
import triton_fa2.varlen as varlen
from triton_fa2.backward import _q_row_bounds
from triton_fa2.forward import _kv_key_bounds, _program_block, _q_block_rows
from triton_fa2.runtime import default_device
from triton_fa2.tiling import kv_block_range

DEVICE = default_device()


@triton.jit
def _bounds_probe(OUT, seqlen_q, num_rows, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  PACK_GQA: tl.constexpr):
    start_m, _ = _program_block(tl.program_id(0), tl.cdiv(num_rows, BLOCK_M), CAUSAL)
    rows, group_heads, positions, first_pos, last_pos = _q_block_rows(start_m, seqlen_q, num_rows, BLOCK_M, PACK_GQA)
    full_end, end, fewest = _kv_key_bounds(first_pos, last_pos, seqlen_q, seqlen_k, BLOCK_N, CAUSAL)
    tl.store(OUT + 5 * start_m, full_end)
    tl.store(OUT + 5 * start_m + 1, end)
    tl.store(OUT + 5 * start_m + 2, fewest)
    tl.store(OUT + 5 * start_m + 3, first_pos)
    tl.store(OUT + 5 * start_m + 4, last_pos)


def kernel_bounds(Lq, Lk, block_m, block_n, causal, group=1):
    "(blocks, 5) int32 from the device: full_end, end, fewest, first and last query position of each Q block."
    rows = Lq * group
    out = torch.full((triton.cdiv(rows, block_m), 5), -7, dtype=torch.int32, device=DEVICE)
    _bounds_probe[(out.shape[0],)](out, Lq, rows, Lk, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, PACK_GQA=group > 1)
    return out.cpu().tolist()


def reference_bounds(first_pos, last_pos, Lq, Lk, block_n, causal):
    "From the definition: query i sees keys j ≤ i + Lk − Lq (causal), j < Lk always."
    sees = lambda i: min(max(i + Lk - Lq + 1, 0), Lk) if causal else Lk
    fewest, most = sees(first_pos), sees(last_pos)
    return (fewest // block_n) * block_n, most, fewest


SHAPES = [(1, 1), (1, 300), (300, 1), (64, 64), (100, 100), (128, 256), (256, 128), (300, 700), (700, 300), (77, 1000)]
TILES = [(16, 16), (32, 16), (64, 32), (128, 64)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 3])          # 3: GQA-packed rows, blocks that span two heads
def test_key_bounds_agree_with_the_definition_and_chapter_02(causal, group):
    checked = 0
    for Lq, Lk in SHAPES:
        for bm, bn in TILES:
            for m, (full_end, end, fewest, first, last) in enumerate(kernel_bounds(Lq, Lk, bm, bn, causal, group)):
                assert (full_end, end, fewest) == reference_bounds(first, last, Lq, Lk, bn, causal), (Lq, Lk, bm, bn, m)
                if group == 1:   # plain rows: the tiles of 02's kv_block_range, up to the partial last tile
                    n_full, n_end = kv_block_range(m, Lq, Lk, bm, bn, causal=causal)
                    assert full_end == min(n_full * bn, (Lk // bn) * bn) and triton.cdiv(end, bn) == n_end, (Lq, Lk, bm, bn, m)
                checked += 1
    assert checked > 200


def test_no_kernel_computes_the_bounds_itself():
    "Which keys a row sees (`position + Lk − Lq + 1`, clamped) is written once, in `_kv_key_bounds`; every kernel calls it."
    sources = {"forward": inspect.getsource(fwd), "split_kv": inspect.getsource(split_kv), "backward": inspect.getsource(bwd),
               "varlen": inspect.getsource(varlen)}
    try:
        from triton_fa2 import gluon
        sources["gluon"] = inspect.getsource(gluon)
    except Exception: pass   # no Gluon in this Triton: nothing to check
    for name, source in sources.items():
        bounds = len(re.findall(r"_pos \+ (?:diag_)?offset \+ 1", source))
        assert bounds == (2 if name == "forward" else 0), (name, bounds)
        if name != "forward": assert "_kv_key_bounds(" in source, name
    assert "_q_row_bounds(" in sources["backward"]   # the dK/dV pass: the same relation, transposed (checked below)


@pytest.mark.gpu
def test_gpu_the_gluon_kernels_plan_the_same_tiles():
    "The Gluon kernels' tile plan (`gluon._key_plan`, on `_kv_key_bounds`), run on an H200, against the definition."
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)): pytest.skip("Gluon runs on sm_90")
    from triton.experimental import gluon as gluon_lang
    from triton.experimental.gluon import language as gl
    from triton_fa2.gluon import _key_plan

    @gluon_lang.jit
    def probe(OUT, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        start_m, _ = _program_block(gl.program_id(0), gl.cdiv(seqlen_q, BLOCK_M), CAUSAL)
        end, full_end, online_lo, n_online, n_fixed = _key_plan(start_m * BLOCK_M, seqlen_q, seqlen_k, BLOCK_M=BLOCK_M,
                                                                BLOCK_N=BLOCK_N, CAUSAL=CAUSAL)
        gl.store(OUT + 3 * start_m, full_end)
        gl.store(OUT + 3 * start_m + 1, end)
        gl.store(OUT + 3 * start_m + 2, (n_online + n_fixed) * BLOCK_N)

    for causal in (False, True):
        for Lq, Lk in SHAPES:
            for bm, bn in ((64, 64), (128, 128)):
                out = torch.full((triton.cdiv(Lq, bm), 3), -7, dtype=torch.int32, device="cuda")
                probe[(out.shape[0],)](out, Lq, Lk, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, num_warps=4)
                for m, (full_end, end, loaded) in enumerate(out.cpu().tolist()):
                    want_full, want_end, _ = reference_bounds(m * bm, min(m * bm + bm, Lq) - 1, Lq, Lk, bn, causal)
                    assert (full_end, end) == (want_full, want_end), (Lq, Lk, bm, bn, m)
                    assert loaded >= end and loaded - end < 2 * bn, (Lq, Lk, bm, bn, m)   # every visible key, whole tiles


def window_plan_errors(plan:list, first_pos:int, Lq:int, Lk:int, left:int, right:int, block_m:int, block_n:int,
                       causal:bool, alibi:bool) -> list:
    """What is wrong with one block's window plan (`gluon._window_plan`'s seven values), against the definition: a key a
    row sees that no tile brings, or that a masked tile hides; a tile with no mask holding a key some row may not see; a
    row that sees a key but none in the online run; with ALiBi, a row's nearest visible key outside the online run."""
    end, full_end, online_lo, n_online, n_fixed, fixed_lo, full_lo = plan
    sees = lambda i, j: j < Lk and (not causal or j <= i + Lk - Lq) and -right <= i + Lk - Lq - j <= left
    tiles = [(online_lo + t * block_n, True) for t in range(n_online)] + [(fixed_lo + t * block_n, False) for t in range(n_fixed)]
    errors = []
    for i in range(first_pos, min(first_pos + block_m, Lq)):
        seen, online = set(), set()
        for start, is_online in tiles:
            masked = start < full_lo or (is_online and start >= full_end)
            keys = range(start, start + block_n)
            if not masked and not all(sees(i, j) for j in keys): errors.append(("unmasked tile", i, start))
            seen.update(j for j in keys if sees(i, j))
            if is_online: online.update(j for j in keys if sees(i, j))
        want = {j for j in range(Lk) if sees(i, j)}
        if seen != want: errors.append(("keys", i, sorted(want ^ seen)[:4]))
        if want and not online: errors.append(("no online key", i))
        if want and alibi and min(want, key=lambda j: abs(i + Lk - Lq - j)) not in online: errors.append(("alibi", i))
    return errors


def test_the_window_plan_check_finds_what_is_wrong():
    "`window_plan_errors` on plans of rows 64–127 (Lq = Lk = 128, causal, window (100, 0), 64×64 tiles): right and broken."
    right = [128, 128, 0, 2, 0, 0, 128]        # no tile every row sees in full: both tiles online, masked
    assert window_plan_errors(right, 64, 128, 128, 100, 0, 64, 64, True, False) == []
    missing = [128, 128, 0, 1, 0, 0, 128]      # the diagonal tile never loaded
    assert ("keys", 64, [64]) in window_plan_errors(missing, 64, 128, 128, 100, 0, 64, 64, True, False)
    unmasked = [128, 128, 0, 2, 0, 0, 0]       # the left tile unmasked: row 127 would see key 0, 127 keys back
    assert ("unmasked tile", 127, 0) in window_plan_errors(unmasked, 64, 128, 128, 100, 0, 64, 64, True, False)


@pytest.mark.gpu
def test_gpu_the_gluon_window_plan_brings_each_window():
    """The one-warpgroup Gluon kernel's plan for a sliding window (`gluon._window_plan`, on 14's `_window_key_bounds`), run
    on an H200, against the definition (`window_plan_errors`): windows reaching past blocks, narrower than one, on both
    sides, unbounded on one, with and without the causal mask and ALiBi."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)): pytest.skip("Gluon runs on sm_90")
    from triton.experimental import gluon as gluon_lang
    from triton.experimental.gluon import language as gl
    from triton_fa2.gluon import _window_plan
    from triton_fa2.score_mods import ScoreMods, _mod_args

    @gluon_lang.jit
    def probe(OUT, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              ALIBI: gl.constexpr):
        start_m = gl.program_id(0)
        plan = _window_plan(start_m * BLOCK_M, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                            ALIBI=ALIBI)
        for i in gl.static_range(7): gl.store(OUT + 7 * start_m + i, plan[i])

    checked = 0
    for (Lq, Lk), window, causal, alibi in itertools.product(SHAPES, [(100, 0), (5, 3), (70, 33), (0, 0), (-1, 2), (17, -1)],
                                                             (False, True), (False, True)):
        left, right = _mod_args(ScoreMods(window_size=window), causal, 1.0, Lq, Lk, "cpu")[:2]
        for bm, bn in ((64, 64), (128, 64), (64, 128), (128, 128)):
            out = torch.full((triton.cdiv(Lq, bm), 7), -7, dtype=torch.int32, device="cuda")
            probe[(out.shape[0],)](out, Lq, Lk, left, right, BLOCK_M=bm, BLOCK_N=bn, ALIBI=alibi, num_warps=4)
            for m, plan in enumerate(out.cpu().tolist()):
                errors = window_plan_errors(plan, m * bm, Lq, Lk, left, right, bm, bn, causal, alibi)
                assert not errors, (Lq, Lk, window, causal, alibi, bm, bn, m, errors[:3])
                checked += 1
    assert checked > 1000


@triton.jit
def _row_bounds_probe(OUT, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0)
    lo, mid = _q_row_bounds(start_n * BLOCK_N, tl.minimum(start_n * BLOCK_N + BLOCK_N, seqlen_k) - 1, seqlen_q, seqlen_k,
                            BLOCK_M, CAUSAL)
    tl.store(OUT + 2 * start_n, lo)
    tl.store(OUT + 2 * start_n + 1, mid)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_row_bounds_are_the_key_bounds_transposed(causal):
    """The dK/dV pass's `_q_row_bounds` against the definition: rows before `lo` see no key of the block, rows from `mid`
    on see all of them, and the masked run [lo, mid) is as short as whole Q tiles allow."""
    checked = 0
    for Lq, Lk in SHAPES:
        for bm, bn in TILES:
            out = torch.full((triton.cdiv(Lk, bn), 2), -7, dtype=torch.int32, device=DEVICE)
            _row_bounds_probe[(out.shape[0],)](out, Lq, Lk, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal)
            sees = lambda i, j: (j <= i + Lk - Lq) if causal else True
            for n, (lo, mid) in enumerate(out.cpu().tolist()):
                keys = range(n * bn, min(n * bn + bn, Lk))
                assert lo % bm == 0 and mid % bm == 0 and lo <= mid, (Lq, Lk, bm, bn, n, lo, mid)
                assert not any(sees(i, j) for i in range(min(lo, Lq)) for j in keys), (Lq, Lk, bm, bn, n, lo)
                assert all(sees(i, j) for i in range(mid, Lq) for j in keys), (Lq, Lk, bm, bn, n, mid)
                assert lo + bm > Lq or any(sees(i, j) for i in range(lo, min(lo + bm, Lq)) for j in keys), (Lq, Lk, bm, bn, n)
                if mid > lo: assert not all(sees(i, j) for i in range(mid - bm, min(mid, Lq)) for j in keys), (Lq, Lk, bm, bn, n)
                checked += 1
    assert checked > 100
