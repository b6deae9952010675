"""flash_attn_with_kvcache against the float64 reference: contiguous and paged caches (pages of 1, 4, 16 and 7, scattered,
spare pages full of NaN, page numbers read before the loop or per tile), the new tokens written in place (checked in
the cache itself), cache_batch_idx, cache_leftpad, splits, the LSE, GQA, both dtypes, rotary embedding; and every refusal."""
import pytest
import torch
import triton_fa2
from triton_fa2 import flash_attn_with_kvcache, split_kv
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device
from sampling import pairwise

device = default_device()
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(q, keys, values, lengths, causal, scale=None):
    "q (B, Lq, Hq, D); keys, values: per row, (L_b, Hkv, D). Float64 out (B, Lq, Hq, D) and lse (B, Hq, Lq)."
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(lengths[b])
        o, l = attention_ref(q[b:b + 1].transpose(1, 2), keys[b][None, :n].transpose(1, 2), values[b][None, :n].transpose(1, 2),
                             causal=causal, scale=scale, upcast=torch.float64)
        outs.append(o.transpose(1, 2)); lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def paged(dense, lengths, page_size, spare=3, seed=0):
    "A paged copy of a dense (B, Lmax, H, D) cache: each row's pages scattered at random in a pool with spare NaN pages."
    B, Lmax, H, D = dense.shape
    per_row = -(-Lmax // page_size)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(B * per_row + spare, generator=g)
    pool = torch.full((B * per_row + spare, page_size, H, D), float("nan"), dtype=dense.dtype, device=dense.device)
    table = order[:B * per_row].view(B, per_row).to(torch.int32).to(dense.device)
    for b in range(B):
        for j in range(int(lengths[b])): pool[table[b, j // page_size], j % page_size] = dense[b, j]
    return pool, table


# every call on every cache layout and in both dtypes, every layout in both dtypes: all pairs (tests/sampling.py)
@pairwise(("Lq,Lnew,causal", [(1, 1, True), (3, 3, True), (2, 0, False), (4, 2, True)]),
          ("page_size", [0, 1, 4, 7, 16], ["contiguous", "page1", "page4", "page7", "page16"]),
          ("dtype", [torch.float16, torch.bfloat16], ["fp16", "bf16"]))
def test_append_then_attend(Lq, Lnew, causal, page_size, dtype):
    "Lnew new tokens appended at cache_seqlens, then Lq queries (the last tokens) attend: GQA 2:1, ragged lengths, NaN past them."
    B, Hq, Hkv, D, Lmax = 3, 4, 2, 32, 40
    lengths = torch.tensor([5, 0, 31], dtype=torch.int32)
    dense_k, dense_v = (torch.randn(B, Lmax, Hkv, D, device=device, dtype=dtype) for _ in range(2))
    for t in (dense_k, dense_v):
        for b in range(B): t[b, int(lengths[b]):] = float("nan")
    q = torch.randn(B, Lq, Hq, D, device=device, dtype=dtype)
    new = [torch.randn(B, Lnew, Hkv, D, device=device, dtype=dtype) for _ in range(2)] if Lnew else [None, None]
    if page_size: (k_cache, table), (v_cache, _) = paged(dense_k, lengths, page_size), paged(dense_v, lengths, page_size)
    else: k_cache, v_cache, table = dense_k.clone(), dense_v.clone(), None
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=lengths.to(device), block_table=table,
                                       causal=causal, return_softmax_lse=True)
    total = lengths + Lnew
    keys, values = dense_k.clone(), dense_v.clone()
    for b in range(B):
        n = int(lengths[b])
        if Lnew: keys[b, n:n + Lnew], values[b, n:n + Lnew] = new[0][b], new[1][b]
        for j in range(n, n + Lnew):                               # written in place, in the cache itself
            where = (table[b, j // page_size], j % page_size) if page_size else (b, j)
            assert torch.equal(k_cache[where], new[0][b, j - n]) and torch.equal(v_cache[where], new[1][b, j - n])
    o_ref, lse_ref = reference(q, keys, values, total, causal)
    assert out.shape == q.shape and lse.shape == (B, Hq, Lq) and not out.isnan().any()
    assert ((out.double() - o_ref).abs().max() / o_ref.abs().max().clamp(min=1)).item() <= TOL[dtype]
    finite = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), finite) and (lse.double()[finite] - lse_ref[finite]).abs().max() <= 1e-3


@pytest.mark.parametrize("page_size", [1, 4, 7], ids=["page1", "page4", "page7"])
@pytest.mark.parametrize("split_pages", [256, 3], ids=["pages-read-before-the-loop", "pages-read-per-tile"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_page_numbers_before_the_loop_or_per_tile(page_size, split_pages, num_splits, monkeypatch):
    """A split whose pages fit SPLIT_PAGES reads its page numbers once before its loop, any other reads a tile's pages
    per tile: both find every key (scattered pages, spare pages and keys past each length NaN, splits starting
    mid-page), as the float64 reference, and each path is the one taken."""
    monkeypatch.setattr(split_kv, "SPLIT_PAGES", split_pages)
    chosen, page_list = [], split_kv._page_list
    monkeypatch.setattr(split_kv, "_page_list", lambda *a: chosen.append(page_list(*a)) or chosen[-1])
    B, Hq, Hkv, D, Lmax = 2, 4, 2, 16, 50
    lengths = torch.tensor([50, 23], dtype=torch.int32)
    dense_k, dense_v = (torch.randn(B, Lmax, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    (k_cache, table), (v_cache, _) = paged(dense_k, lengths, page_size), paged(dense_v, lengths, page_size)
    q = torch.randn(B, 1, Hq, D, device=device, dtype=torch.float16)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths.to(device), block_table=table, causal=True,
                                       num_splits=num_splits, return_softmax_lse=True)
    assert chosen and all((c > 0) == (split_pages == 256) for c in chosen), chosen
    o_ref, lse_ref = reference(q, dense_k, dense_v, lengths, True)
    assert not out.isnan().any() and (out.double() - o_ref).abs().max() <= TOL[torch.float16]
    assert (lse.double() - lse_ref).abs().max() <= 1e-3


@pytest.mark.parametrize("num_splits", [1, 3, 0])
def test_batch_idx_leftpad_and_splits(num_splits):
    "cache_batch_idx picks each row's cache row; cache_leftpad where its keys start; the result as if the rows were alone."
    B, Hq, Hkv, D = 2, 4, 1, 16
    cache_k, cache_v = (torch.randn(4, 30, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    cache_k[0] = float("nan")                                      # a row nobody uses
    idx = torch.tensor([3, 1], dtype=torch.int32, device=device)
    leftpad = torch.tensor([4, 0], dtype=torch.int32, device=device)
    lengths = torch.tensor([20, 9], dtype=torch.int32, device=device)
    cache_k[3, :4] = float("nan")                                  # left padding: never read
    q = torch.randn(B, 1, Hq, D, device=device, dtype=torch.float16)
    out = flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=lengths, cache_batch_idx=idx, cache_leftpad=leftpad,
                                  causal=True, num_splits=num_splits)
    keys = [cache_k[3, 4:20], cache_k[1, :9]]
    values = [cache_v[3, 4:20], cache_v[1, :9]]
    o_ref, _ = reference(q, [k for k in keys], [v for v in values], [16, 9], True)
    assert not out.isnan().any() and (out.double() - o_ref).abs().max() <= 2e-3


def test_cache_seqlens_as_an_int_and_none():
    q = torch.randn(2, 1, 2, 16, device=device, dtype=torch.float16)
    cache = torch.randn(2, 12, 2, 16, device=device, dtype=torch.float16)
    full = flash_attn_with_kvcache(q, cache, cache)
    torch.testing.assert_close(flash_attn_with_kvcache(q, cache, cache, cache_seqlens=12), full)
    o_ref, _ = reference(q, list(cache), list(cache), [12, 12], False)
    assert (full.double() - o_ref).abs().max() <= 2e-3


def test_exported_and_signature_is_flash_attns():
    import inspect
    assert triton_fa2.flash_attn_with_kvcache is flash_attn_with_kvcache
    assert list(inspect.signature(flash_attn_with_kvcache).parameters) == [
        "q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx", "cache_leftpad",
        "block_table", "softmax_scale", "causal", "window_size", "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
        "return_softmax_lse", "learnable_sink"]                     # flash-attn 2's arguments in order, then FlashAttention-4's


@pytest.mark.parametrize("change,error,message", [
    (dict(block_table="out of range"), ValueError, "block_table must lie in"),
    (dict(block_table="int64"), TypeError, "block_table must be an int32"),
    (dict(cache_batch_idx="with pages"), ValueError, "apply to contiguous caches"),
    (dict(rotary_cos="some"), ValueError, "rotary_cos and rotary_sin must be given together"),
    (dict(window_size=(4, -3)), ValueError, "each an int ≥ 0 or −1"),
    (dict(k="alone"), ValueError, "k and v must be given together"),
    (dict(num_splits=-1), TypeError, "num_splits must be an int"),
    (dict(cache_seqlens="too long"), ValueError, "cache_seqlens must lie in"),
])
def test_bad_inputs_are_refused(change, error, message):
    q = torch.randn(2, 1, 4, 32, device=device, dtype=torch.float16)
    pool = torch.randn(6, 4, 2, 32, device=device, dtype=torch.float16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    args = dict(q=q, k_cache=pool, v_cache=pool, cache_seqlens=torch.tensor([3, 8], dtype=torch.int32, device=device), block_table=table)
    for name, value in change.items():
        if value == "out of range": value = table + 3
        elif value == "int64": value = table.long()
        elif value == "with pages": value = torch.zeros(2, dtype=torch.int32, device=device)
        elif value == "some": value = torch.zeros(1, device=device)
        elif value == "alone": value = pool[:2, :1]
        elif value == "too long": value = torch.tensor([3, 9], dtype=torch.int32, device=device)
        args[name] = value
    with pytest.raises(error, match=message): flash_attn_with_kvcache(**args)


def rotated(x, cos, sin, positions, interleaved):
    "Float64 reference of flash-attn's rotary embedding, as complex products: pair (x₁, x₂) times cos + i·sin at its position."
    half = cos.shape[1]
    x = x.double()
    turned = x[..., :2 * half]
    pairs = turned.unflatten(-1, (half, 2)) if interleaved else torch.stack(turned.chunk(2, dim=-1), dim=-1)
    z = torch.view_as_complex(pairs.contiguous()) * torch.complex(cos.double(), sin.double())[positions][:, :, None, :]
    out = torch.view_as_real(z)
    out = out.flatten(-2) if interleaved else torch.cat((out[..., 0], out[..., 1]), dim=-1)
    return torch.cat((out, x[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "halves"])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (5, 2))], ids=["causal", "full", "window"])
@pytest.mark.parametrize("page_size,rotary_dim", [(0, 32), (7, 16), (1, 32)], ids=["contiguous", "pages-of-7-half-dims", "pages-of-1"])
def test_rotary_embedding(interleaved, causal, window, page_size, rotary_dim):
    """q and the new keys rotated at flash-attn's positions: keys where they are written, queries at their tokens' positions
    when causal or windowed, all at cache_seqlens otherwise; the rotated keys land in the cache; dims past rotary_dim kept."""
    B, Hq, Hkv, D, Lmax, Lnew = 3, 4, 2, 32, 28, 3
    lengths = torch.tensor([4, 0, 21], dtype=torch.int32)
    dense_k, dense_v = (torch.randn(B, Lmax, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    for t in (dense_k, dense_v):
        for b in range(B): t[b, int(lengths[b]):] = float("nan")
    q = torch.randn(B, Lnew, Hq, D, device=device, dtype=torch.float16)
    k, v = (torch.randn(B, Lnew, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    angle = torch.rand(Lmax + 5, rotary_dim // 2, device=device) * 2 * torch.pi
    cos, sin = angle.cos().half(), angle.sin().half()
    if page_size: (k_cache, table), (v_cache, _) = paged(dense_k, lengths, page_size), paged(dense_v, lengths, page_size)
    else: k_cache, v_cache, table = dense_k.clone(), dense_v.clone(), None
    q_before, k_before = q.clone(), k.clone()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths.to(device),
                                  block_table=table, causal=causal, window_size=window, rotary_interleaved=interleaved)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)            # the caller's tensors are not rotated in place
    written = lengths[:, None].long().to(device) + torch.arange(Lnew, device=device)
    at_q = written if causal or window != (-1, -1) else lengths[:, None].long().to(device).expand(B, Lnew)
    k_ro, q_ro = rotated(k, cos, sin, written, interleaved), rotated(q, cos, sin, at_q, interleaved)
    keys, values = dense_k.double(), dense_v.double()
    for b in range(B):
        n = int(lengths[b])
        keys[b, n:n + Lnew], values[b, n:n + Lnew] = k_ro[b], v[b].double()
        for j in range(n, n + Lnew):                               # the rotated key, in the cache itself
            where = (table[b, j // page_size], j % page_size) if page_size else (b, j)
            assert (k_cache[where].double() - k_ro[b, j - n]).abs().max() <= 2e-3
    outs = []
    for b in range(B):                                             # float64 reference with the window, per row
        n = int(lengths[b]) + Lnew
        o, _ = attention_ref(q_ro[b:b + 1].transpose(1, 2), keys[b][None, :n].transpose(1, 2), values[b][None, :n].transpose(1, 2),
                             causal=causal, window_size=window, upcast=torch.float64)
        outs.append(o.transpose(1, 2))
    o_ref = torch.cat(outs)
    assert not out.isnan().any() and (out.double() - o_ref).abs().max().item() <= 4e-3


def test_rotary_with_batch_idx_and_leftpad():
    "Positions are indices into the cache row, left padding included (flash-attn's): row b's new keys sit at cache_seqlens[b] + i."
    B, Hq, Hkv, D = 2, 4, 2, 16
    cache_k, cache_v = (torch.randn(3, 24, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    leftpad = torch.tensor([5, 0], dtype=torch.int32, device=device)
    lengths = torch.tensor([12, 7], dtype=torch.int32, device=device)
    cache_k[2, :5] = float("nan")                                  # left padding: never read
    q, k, v = torch.randn(B, 2, Hq, D, device=device, dtype=torch.float16), *(torch.randn(B, 2, Hkv, D, device=device, dtype=torch.float16) for _ in range(2))
    angle = torch.rand(24, 8, device=device) * 2 * torch.pi
    cos, sin = angle.cos(), angle.sin()                            # float32 tables are taken too
    before_k, before_v = cache_k.clone(), cache_v.clone()
    out = flash_attn_with_kvcache(q, cache_k, cache_v, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths, cache_batch_idx=idx,
                                  cache_leftpad=leftpad, causal=True, rotary_interleaved=False)
    at = lengths[:, None].long() + torch.arange(2, device=device)
    k_ro, q_ro = rotated(k, cos, sin, at, False), rotated(q, cos, sin, at, False)
    keys, values = [], []
    for b, (row, pad, n) in enumerate(zip(idx.tolist(), leftpad.tolist(), lengths.tolist())):
        assert (cache_k[row, n:n + 2].double() - k_ro[b]).abs().max() <= 2e-3 and torch.equal(cache_v[row, n:n + 2], v[b])
        keys.append(torch.cat([before_k[row, pad:n].double(), k_ro[b]])); values.append(torch.cat([before_v[row, pad:n], v[b]]).double())
    o_ref, _ = reference(q_ro, keys, values, [len(t) for t in keys], True)
    assert not out.isnan().any() and (out.double() - o_ref).abs().max().item() <= 4e-3


@pytest.mark.parametrize("change,message", [
    (dict(rotary_sin=None), "must be given together"),
    (dict(k=None, v=None), "pass k and v with them"),
    (dict(rotary_cos="wide", rotary_sin="wide"), "must lie in \\[2, head_dim = 16\\]"),
    (dict(rotary_cos="short", rotary_sin="short"), "must cover every position of the cache"),
    (dict(rotary_sin="mismatched"), "must both be \\(seqlen_ro, rotary_dim / 2\\)"),
])
def test_rotary_refusals(change, message):
    q = torch.randn(2, 1, 2, 16, device=device, dtype=torch.float16)
    cache = torch.randn(2, 12, 2, 16, device=device, dtype=torch.float16)
    new = torch.randn(2, 1, 2, 16, device=device, dtype=torch.float16)
    table = torch.zeros(12, 4, device=device)
    args = dict(q=q, k_cache=cache, v_cache=cache.clone(), k=new, v=new, rotary_cos=table, rotary_sin=table, cache_seqlens=3)
    sizes = dict(wide=torch.zeros(12, 9, device=device), short=torch.zeros(11, 4, device=device), mismatched=torch.zeros(12, 3, device=device))
    args.update({n: sizes.get(x, x) if isinstance(x, str) else x for n, x in change.items()})
    with pytest.raises(ValueError, match=message): flash_attn_with_kvcache(**args)
    with pytest.raises(TypeError, match="rotary_interleaved must be a bool"):
        flash_attn_with_kvcache(q, cache, cache.clone(), new, new, rotary_cos=table, rotary_sin=table, cache_seqlens=3, rotary_interleaved=1)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_serving_sized_paged_decode():
    "64 sequences of up to 8k tokens in pages of 16 (vLLM's) and of 1 (SGLang's), GQA 8:1, D = 128, bf16, one new token each."
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, D, Lmax = 64, 32, 4, 128, 8192
    lengths = torch.randint(1, Lmax - 1, (B,), generator=g, dtype=torch.int32)
    dense_k, dense_v = (torch.randn(B, Lmax, Hkv, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(B, 1, Hq, D, device=device, dtype=torch.bfloat16)
    for page_size in (16, 1):
        per_row = Lmax // page_size
        order = torch.randperm(B * per_row, generator=g).to(device)
        table = order.view(B, per_row).to(torch.int32)
        pool_k, pool_v = (torch.empty(B * per_row, page_size, Hkv, D, device=device, dtype=torch.bfloat16) for _ in range(2))
        pool_k[table.long()] = dense_k.view(B, per_row, page_size, Hkv, D)
        pool_v[table.long()] = dense_v.view(B, per_row, page_size, Hkv, D)
        out = flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=lengths.to(device), block_table=table, causal=True)
        ref = triton_fa2.decode(q.transpose(1, 2), dense_k.transpose(1, 2), dense_v.transpose(1, 2), cache_seqlens=lengths.to(device))
        torch.testing.assert_close(out, ref.transpose(1, 2), atol=2e-2, rtol=0)
