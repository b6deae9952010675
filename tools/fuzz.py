"""Random calls of every public entry point against the float64 reference: dense (`flash_attn_func`), packed sequences
(`flash_attn_varlen_func`) and KV caches (`flash_attn_with_kvcache`, contiguous or paged, with new tokens and rotary
embedding), with random GQA ratios, head dims, lengths (0 and 1 included), causal or not, windows, softcap, ALiBi and
sinks, both dtypes, and gradients for a share of the dense and packed calls. Outputs must hold no NaN and match within
the tests' tolerances. On the CPU it runs the interpreter; on a GPU, the kernels the dispatcher picks there.

    python tools/fuzz.py [--seed 0] [--calls 40] [--max-len 70]      # exit 1 on any mismatch, printing its configuration
"""
import argparse, random, sys, traceback
import torch
import triton_fa2 as t2
from triton_fa2.naive import attention_ref
from triton_fa2.runtime import default_device

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}      # max |o − o_ref| over max(1, max |o_ref|)
GRAD_TOL = {torch.float16: 6e-3, torch.bfloat16: 3e-2}  # ‖g − g_ref‖ over ‖g_ref‖ (floored)


def rel_error(g, ref) -> float:
    return ((g.double() - ref).norm() / ref.norm().clamp_min(1e-3 * ref.numel() ** 0.5)).item()


def close(out, ref, dtype, what="out"):
    assert not out.isnan().any(), f"{what}: NaN"
    if ref.numel():
        err = (out.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        assert err <= TOL[dtype], f"{what}: error {err:.3g}"


def grads_close(leaves, refs, dtype):
    for name, a, b in zip("qkv", leaves, refs):
        if b.grad is None: continue
        err = rel_error(a.grad, b.grad)
        assert not a.grad.isnan().any() and err <= GRAD_TOL[dtype], f"d{name}: error {err:.3g}"


def rotated(x, cos, sin, positions, interleaved):
    "Float64 rotary embedding, written apart from the package's: each pair of dims a complex number times cos + i·sin."
    half, x = cos.shape[1], x.double()
    turned = x[..., :2 * half]
    pairs = turned.unflatten(-1, (half, 2)) if interleaved else torch.stack(turned.chunk(2, dim=-1), dim=-1)
    z = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * torch.complex(cos.double(), sin.double())[positions][:, :, None, :])
    return torch.cat((z.flatten(-2) if interleaved else torch.cat((z[..., 0], z[..., 1]), dim=-1), x[..., 2 * half:]), dim=-1)


def draw(rng, max_len):
    "One random configuration shared by the three calls."
    left = rng.choice([-1, -1, -1, 0, 1, 3, 17]); right = rng.choice([-1, 0, 2]) if left != -1 else -1
    Hq, Hkv = rng.choice([(4, 4), (4, 2), (6, 2), (3, 1), (2, 1)])
    return dict(dtype=rng.choice([torch.float16, torch.bfloat16]), Hq=Hq, Hkv=Hkv, D=rng.choice([16, 24, 40, 64, 72, 96, 128]),
                causal=rng.random() < 0.5, window=(left, right), softcap=rng.choice([0.0, 0.0, 4.0]), alibi=rng.random() < 0.3,
                sink=rng.random() < 0.3, grad=rng.random() < 0.4, B=rng.choice([1, 2]), Lq=rng.randint(1, max_len), Lk=rng.randint(1, max_len))


def modifiers(c, device):
    return dict(window_size=c["window"], softcap=c["softcap"], alibi_slopes=torch.rand(c["Hq"], device=device) * 0.5 if c["alibi"] else None,
                learnable_sink=torch.randn(c["Hq"], device=device) if c["sink"] else None)


def reference(q, k, v, c, mods, **kw):
    "attention_ref in float64 on (B, L, H, D) tensors; out (B, Lq, Hq, D)."
    o, lse = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=c["causal"], upcast=torch.float64,
                           **mods, **kw)
    return o.transpose(1, 2), lse


def dense(c, rng, device):
    dt = c["dtype"]
    q, k, v = (torch.randn(c["B"], L, H, c["D"], device=device, dtype=dt) for L, H in ((c["Lq"], c["Hq"]), (c["Lk"], c["Hkv"]), (c["Lk"], c["Hkv"])))
    mods = modifiers(c, device)
    leaves = [t.clone().requires_grad_(c["grad"]) for t in (q, k, v)]
    out, lse, _ = t2.flash_attn_func(*leaves, causal=c["causal"], return_attn_probs=True, **mods)
    refs = [t.double().requires_grad_(c["grad"]) for t in (q, k, v)]
    o_ref, lse_ref = reference(*refs, c, mods)
    close(out, o_ref, dt)
    seen = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), seen), "lse: rows that see no key differ"
    if seen.any(): assert (lse.double()[seen] - lse_ref[seen]).abs().max() < 1e-3, "lse"
    if c["grad"]:
        do = torch.randn_like(out)
        out.backward(do); o_ref.backward(do.double())
        grads_close(leaves, refs, dt)


def varlen(c, rng, device):
    dt, n = c["dtype"], rng.randint(1, 4)
    lq = [rng.choice([0, 1, rng.randint(1, 40)]) for _ in range(n)]
    lk = [x if rng.random() < 0.5 else rng.randint(0, 45) for x in lq]
    c = dict(c, lq=lq, lk=lk)
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(sum(lq), c["Hq"], c["D"], device=device, dtype=dt)
    k, v = (torch.randn(sum(lk), c["Hkv"], c["D"], device=device, dtype=dt) for _ in range(2))
    mods = modifiers(c, device)
    leaves = [t.clone().requires_grad_(c["grad"]) for t in (q, k, v)]
    out = t2.flash_attn_varlen_func(*leaves, cu(lq), cu(lk), max(lq + [1]), max(lk + [1]), causal=c["causal"], **mods)
    refs = [t.double().requires_grad_(c["grad"]) for t in (q, k, v)]
    pieces, a, b = [], 0, 0
    for x, y in zip(lq, lk):
        if x and y:
            o, _ = reference(refs[0][None, a:a + x], refs[1][None, b:b + y], refs[2][None, b:b + y], c, mods)
            pieces.append(o[0])
        elif x: pieces.append(torch.zeros(x, c["Hq"], c["D"], dtype=torch.float64, device=device))
        a, b = a + x, b + y
    o_ref = torch.cat(pieces) if pieces else torch.zeros(0, c["Hq"], c["D"], dtype=torch.float64, device=device)
    close(out, o_ref, dt)
    if c["grad"] and o_ref.requires_grad:
        do = torch.randn_like(out)
        out.backward(do); o_ref.backward(do.double())
        grads_close(leaves, refs, dt)
    return c


def kvcache(c, rng, device):
    dt, B, Hkv, D = c["dtype"], c["B"], c["Hkv"], c["D"]
    page, new = rng.choice([0, 1, 3, 16]), rng.choice([0, 1, 2])
    Lq = max(new, 1) if c["causal"] else rng.randint(1, 3)
    Lmax = rng.randint(new + 1, 50)
    lens = [rng.randint(0, Lmax - new) for _ in range(B)]
    rotary, interleaved = new > 0 and rng.random() < 0.4, rng.random() < 0.5
    c = dict(c, page=page, new=new, Lq=Lq, Lmax=Lmax, lens=lens, rotary=rotary, interleaved=interleaved)
    q = torch.randn(B, Lq, c["Hq"], D, device=device, dtype=dt)
    keys, values = (torch.randn(B, Lmax, Hkv, D, device=device, dtype=dt) for _ in range(2))
    for b in range(B): keys[b, lens[b]:], values[b, lens[b]:] = float("nan"), float("nan")   # a server's stale rows
    k_new, v_new = (torch.randn(B, new, Hkv, D, device=device, dtype=dt) if new else None for _ in range(2))
    pages = -(-Lmax // page) if page else 0
    angle = torch.rand(max(Lmax, pages * page), D // 4, device=device) * 6.28
    cos, sin = (angle.cos().to(dt), angle.sin().to(dt)) if rotary else (None, None)
    if page:
        pool_k, pool_v = (torch.full((B * pages + 2, page, Hkv, D), float("nan"), device=device, dtype=dt) for _ in range(2))
        table = torch.randperm(B * pages + 2, device=device)[:B * pages].view(B, pages).to(torch.int32)
        for b in range(B):
            for j in range(lens[b]): pool_k[table[b, j // page], j % page], pool_v[table[b, j // page], j % page] = keys[b, j], values[b, j]
        k_cache, v_cache = pool_k, pool_v
    else: k_cache, v_cache, table = keys.clone(), values.clone(), None
    mods = modifiers(c, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = t2.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                     block_table=table, causal=c["causal"], rotary_interleaved=interleaved, **mods)
    q, keys, values = q.double(), keys.double(), values.double()
    if new:
        at = seqlens[:, None].long() + torch.arange(new, device=device)
        if rotary:                # new keys at the positions they are written to; q at its tokens' (causal, windowed) or all at cache_seqlens
            k_new = rotated(k_new, cos, sin, at, interleaved)
            steps = torch.arange(Lq, device=device) if c["causal"] or c["window"] != (-1, -1) else 0
            q = rotated(q, cos, sin, (seqlens[:, None].long() + steps).expand(B, Lq).clamp(max=cos.shape[0] - 1), interleaved)
        for b in range(B): keys[b, lens[b]:lens[b] + new], values[b, lens[b]:lens[b] + new] = k_new[b].double(), v_new[b].double()
    o_ref, _ = reference(q, keys, values, c, mods, kv_lens=seqlens + new)
    close(out, o_ref, dt)
    return c


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", type=int, default=40, help="configurations; each runs the three entry points")
    p.add_argument("--max-len", type=int, default=70)
    a = p.parse_args(argv)
    rng, device, failures = random.Random(a.seed), default_device(), 0
    torch.manual_seed(a.seed)
    for _ in range(a.calls):
        c = draw(rng, a.max_len)
        for call in (dense, varlen, kvcache):
            try: call(c, rng, device)
            except Exception as e:
                failures += 1
                print(f"FAILED {call.__name__} {c}: {e!r}"[:2000]); traceback.print_exc(limit=2)
    print(f"seed {a.seed}, {a.calls} configurations on {device}: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
