"attention_tiled (FlashAttention-2's loops in PyTorch) against attention_ref; the causal tile map against brute force."
import itertools

import pytest
import torch

from triton_fa2.naive import attention_ref, causal_mask
from triton_fa2.tiling import (TILE_FULL, TILE_MASKED, TILE_SKIPPED, attention_tiled, causal_tile_map,
                               hbm_bytes_flash, hbm_bytes_standard, kv_block_range)

pytestmark = pytest.mark.newest_triton_only   # PyTorch only, no Triton kernel: not run again on another Triton (.ci/run)

# dtype → (atol, rtol) on o: attention_tiled computes in float32 and rounds once, into the input dtype.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (4e-3, 4e-3)}
LSE_TOL = dict(atol=2e-5, rtol=2e-5)  # lse is float32 on both sides


def qkv(B, Hq, Hkv, Lq, Lk, D, Dv=None, dtype=torch.float32):
    "Fresh random inputs (never zeros), rounded to `dtype`."
    return (torch.randn(B, Hq, Lq, D).to(dtype), torch.randn(B, Hkv, Lk, D).to(dtype),
            torch.randn(B, Hkv, Lk, Dv or D).to(dtype))


def check(q, k, v, causal, **kw):
    "o to its dtype's rounding, lse to float32's; assert_close fails on NaN and wants −inf exactly where the reference has it."
    o, lse = attention_tiled(q, k, v, causal=causal, **kw)
    o_ref, lse_ref = attention_ref(q, k, v, causal=causal, scale=kw.get("scale"))
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert o.shape == (*q.shape[:3], v.shape[-1]) and lse.shape == q.shape[:3]
    atol, rtol = TOL[q.dtype]
    torch.testing.assert_close(o.float(), o_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse, lse_ref, **LSE_TOL)
    return o, lse


@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D, bm, bn", [
    (1, 1, 1, 1, 1, 16, 64, 64),       # one query, one key: a single partial tile
    (2, 3, 3, 17, 17, 64, 64, 64),     # odd length shorter than one tile
    (1, 2, 2, 64, 64, 32, 64, 64),     # exactly one full tile: no ragged edge
    (1, 2, 2, 128, 128, 32, 32, 32),   # lengths multiples of the blocks: the diagonal on tile corners
    (2, 2, 2, 100, 100, 40, 48, 48),   # blocks not dividing L; D not a power of two
    (1, 2, 2, 77, 130, 32, 32, 80),    # block_m < block_n, Lq < Lk
    (1, 2, 2, 130, 77, 32, 80, 32),    # block_m > block_n, Lq > Lk: rows that see no key
    (1, 1, 1, 1, 300, 64, 64, 64),     # decode: one query against a long context
    (1, 1, 1, 300, 1, 64, 64, 64),     # one key: only the last query sees it when causal
    (1, 1, 1, 9, 7, 8, 1, 1),          # 1×1 tiles: every tile a single score
    (1, 1, 1, 33, 40, 8, 5, 3),        # tiny odd blocks: many masked tiles per Q block
    (1, 2, 2, 50, 60, 16, 128, 128),   # blocks larger than both lengths: one partial tile
    (1, 8, 2, 33, 65, 32, 16, 16),     # GQA 4:1
    (1, 6, 3, 40, 40, 32, 16, 32),     # GQA 2:1
    (2, 6, 1, 29, 50, 16, 8, 16),      # MQA: one KV head for six query heads
    (1, 2, 1, 200, 200, 128, 64, 32),  # largest head dim used in the benchmarks
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(B, Hq, Hkv, Lq, Lk, D, bm, bn, dtype, causal):
    check(*qkv(B, Hq, Hkv, Lq, Lk, D, dtype=dtype), causal, block_m=bm, block_n=bn)


def test_long_sequence():
    "1000 = 15·64 + 40: 16×16 tiles, the last row and column of tiles partial."
    for causal in (False, True): check(*qkv(1, 1, 1, 1000, 1000, 64), causal)


@pytest.mark.parametrize("Dv, scale", [
    (48, None),   # value head dim ≠ key head dim
    (32, 2.0),    # large custom scale: row maxima jump between tiles, the rescale does the work
    (32, 0.01),   # tiny scale: nearly uniform weights
])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_and_scale(Dv, scale, causal):
    check(*qkv(2, 4, 2, 45, 70, 32, Dv=Dv), causal, block_m=16, block_n=32, scale=scale)


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_do_not_overflow(causal):
    "Scores near ±150 would overflow exp() in float32 (e^89 > 3.4e38) without subtracting the running max."
    q, k, v = qkv(1, 2, 2, 70, 90, 64)
    check(q * 6, k, v, causal, block_m=16, block_n=16, scale=1.0)


@pytest.mark.parametrize("Lq, Lk, bm, bn", [
    (5, 2, 64, 64),      # one Q block, one masked tile: 3 empty rows inside it
    (130, 77, 32, 32),   # the first Q block skips every tile; the second mixes empty and non-empty rows
    (700, 300, 128, 64), # three whole Q blocks see nothing
    (9, 1, 2, 1),        # a single key: only the last query sees it
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_that_see_nothing(Lq, Lk, bm, bn, dtype):
    "O = 0 and LSE = −inf exactly, no NaN anywhere."
    q, k, v = qkv(2, 2, 1, Lq, Lk, 16, dtype=dtype)
    o, lse = check(q, k, v, True, block_m=bm, block_n=bn)
    empty = Lq - Lk
    assert (o[:, :, :empty] == 0).all() and lse[:, :, :empty].isneginf().all()
    assert lse[:, :, empty:].isfinite().all() and not o.isnan().any()


def test_empty_key_sequence():
    "Lk = 0: every row sees nothing, with or without causal masking."
    q, k, v = qkv(1, 2, 2, 10, 0, 16)
    for causal in (False, True):
        o, lse = attention_tiled(q, k, v, causal=causal)
        assert (o == 0).all() and lse.isneginf().all()


@pytest.mark.parametrize("Lq, Lk, bm, bn", [
    (256, 256, 64, 64),  # square
    (100, 300, 32, 48),  # Lq < Lk, blocks not dividing
    (300, 100, 48, 32),  # Lq > Lk
])
def test_skipped_tiles_are_never_loaded(Lq, Lk, bm, bn):
    "NaN planted in the K/V tiles a Q block skips cannot reach its rows (a masked-but-loaded tile would leak 0·NaN)."
    q, k, v = qkv(1, 2, 2, Lq, Lk, 16)
    o_clean, _ = attention_tiled(q, k, v, causal=True, block_m=bm, block_n=bn)
    for m in range((Lq + bm - 1) // bm):
        _, n_end = kv_block_range(m, Lq, Lk, bm, bn)
        if n_end * bn >= Lk: continue   # this block skips nothing
        k2, v2 = k.clone(), v.clone()
        k2[:, :, n_end * bn:] = v2[:, :, n_end * bn:] = float("nan")
        o, _ = attention_tiled(q, k2, v2, causal=True, block_m=bm, block_n=bn)
        rows = slice(m * bm, (m + 1) * bm)
        torch.testing.assert_close(o[:, :, rows], o_clean[:, :, rows])


@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous_inputs(causal):
    "(B, L, H, D) projections transposed to (B, H, L, D) without a copy, K and V unbound from one packed tensor."
    B, L, H, D = 2, 70, 4, 32
    q, k, v = (t.transpose(1, 2) for t in torch.randn(B, L, 3, H, D).unbind(2))
    assert not q.is_contiguous()
    check(q, k, v, causal, block_m=32, block_n=16)
    # GQA from a packed tensor with fewer KV heads
    q = torch.randn(B, L, 8, D).transpose(1, 2)
    k, v = (t.transpose(1, 2) for t in torch.randn(B, L, 2, 2, D).unbind(2))
    check(q, k, v, causal, block_m=16, block_n=32)


def test_bad_inputs():
    q, k, v = qkv(1, 4, 2, 8, 8, 16)
    for kw, msg in [(dict(block_m=0), "block_m must be a positive integer, got 0"),
                    (dict(block_n=-16), "block_n must be a positive integer, got -16"),
                    (dict(block_m=64.0), "got 64.0"),
                    (dict(block_n=True), "got True")]:
        with pytest.raises(ValueError, match=msg): attention_tiled(q, k, v, **kw)
    with pytest.raises(ValueError, match="got Hq=4 and Hkv=3"): attention_tiled(q, *qkv(1, 4, 3, 8, 8, 16)[1:])
    with pytest.raises(ValueError, match="4 dimensions"): attention_tiled(q[0], k, v)
    with pytest.raises(ValueError, match="block_n must be a positive integer"): causal_tile_map(8, 8, 4, 0)


def tile_map_brute(Lq, Lk, bm, bn):
    "Classify each tile from its element mask, built by `causal_mask`."
    vis = causal_mask(torch.arange(Lq), torch.arange(Lk), Lq, Lk)
    out = torch.empty((Lq + bm - 1) // bm, (Lk + bn - 1) // bn, dtype=torch.int64)
    for a, i in enumerate(range(0, Lq, bm)):
        for b, j in enumerate(range(0, Lk, bn)):
            t = vis[i:i + bm, j:j + bn]
            out[a, b] = TILE_FULL if t.all() else TILE_MASKED if t.any() else TILE_SKIPPED
    return out


@pytest.mark.parametrize("bm, bn", [(16, 16), (64, 64), (128, 64), (64, 128), (8, 24), (7, 5), (1, 1), (1, 16)])
def test_tile_map_against_brute_force(bm, bn):
    "Lq = Lk, Lq < Lk, Lq > Lk; lengths dividing the blocks or ragged, shorter or longer than a block."
    for Lq, Lk in itertools.product([1, 7, 16, 63, 64, 65, 130], [1, 9, 16, 64, 65, 129]):
        assert torch.equal(causal_tile_map(Lq, Lk, bm, bn), tile_map_brute(Lq, Lk, bm, bn)), (Lq, Lk, bm, bn)


def test_tile_map_skips_about_half():
    "Square and long: the skipped fraction tends to ½, one masked tile per Q block with square tiles."
    tiles = causal_tile_map(4096, 4096, 64, 64)
    assert (tiles == TILE_SKIPPED).float().mean().item() == pytest.approx(0.5 - 1 / 128)
    assert ((tiles == TILE_MASKED).sum(1) == 1).all()


@pytest.mark.parametrize("Lq, Lk, bm, bn", [(64, 64, 16, 16), (30, 50, 8, 16), (50, 30, 16, 8), (10, 3, 4, 4)])
def test_kv_block_range_agrees_with_map(Lq, Lk, bm, bn):
    "The loop bounds attention_tiled uses are the runs of the tile map; non-causal visits every block unmasked."
    tiles = causal_tile_map(Lq, Lk, bm, bn)
    for m in range(tiles.shape[0]):
        n_full, n_end = kv_block_range(m, Lq, Lk, bm, bn)
        assert (tiles[m, :n_full] == TILE_FULL).all() and (tiles[m, n_full:n_end] == TILE_MASKED).all()
        assert (tiles[m, n_end:] == TILE_SKIPPED).all()
        assert kv_block_range(m, Lq, Lk, bm, bn, causal=False) == (tiles.shape[1],) * 2


def walk_flash(N, d, bm, bn, es=2, lse_size=4):
    "Bytes attention_tiled's loops load and store, tile by tile."
    total = 0
    for i in range(0, N, bm):
        rows = min(bm, N - i)
        total += 2 * rows * d * es + rows * lse_size                      # Q tile in, O tile and LSE out
        total += sum(2 * min(bn, N - j) * d * es for j in range(0, N, bn))  # K and V tiles in
    return total


@pytest.mark.parametrize("N, d, bm, bn", [(1024, 128, 128, 64), (1000, 64, 64, 48), (17, 8, 5, 3), (300, 256, 300, 7)])
def test_io_model(N, d, bm, bn):
    assert hbm_bytes_flash(N, d, bm) == walk_flash(N, d, bm, bn)
    assert hbm_bytes_standard(N, d) == 2 * (4 * N * d + 4 * N * N)
    assert hbm_bytes_flash(N, d, N, lse_size=0) == 2 * 4 * N * d   # one Q block: every byte moved once
