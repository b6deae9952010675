"""Plain causal and softcap 50 at the money shot (8, 32/32, 2048, D 128, bf16): forward and backward alone, the
dispatcher's own picks (no tuning), interleaved in one process; the softcap forward checked against float32 first."""
import sys, csv, os, datetime, statistics, torch, triton, triton_fa2
from triton_fa2 import dispatch
from triton_fa2.naive import attention_ref
label, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
B, N, H, D = 8, 2048, 32, 128
q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_()
cases = {"plain": dict(causal=True), "softcap": dict(causal=True, softcap=50.0)}
fwd, bwd = {}, {}
for name, kw in cases.items():
    fwd[name] = lambda kw=kw: triton_fa2.flash_attn_func(q, k, v, **kw)
    o = triton_fa2.flash_attn_func(q, k, v, **kw)
    qs, ks, vs = (t.detach()[:1, :, :4].transpose(1, 2).float() for t in (q, k, v))
    o_ref, _ = attention_ref(qs, ks, vs, causal=True, upcast=torch.float32, softcap=kw.get("softcap", 0.0))
    err = (o.detach()[:1, :, :4].transpose(1, 2).float() - o_ref).abs().max().item()
    assert not o.isnan().any() and err < 2e-2, (name, err)
    bwd[name] = lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    assert not any(x.isnan().any() for x in bwd[name]()), name
times = {(n, p): [] for n in cases for p in ("forward", "backward")}
for _ in range(5):
    for n in cases:
        times[(n, "forward")].append(triton.testing.do_bench(fwd[n], warmup=25, rep=100))
        times[(n, "backward")].append(triton.testing.do_bench(bwd[n], warmup=25, rep=150))
picks = ";".join(sorted({p.label for p in dispatch._PICKS.values()}))
new = not os.path.exists(out)
with open(out, "a", newline="") as fh:
    w = csv.writer(fh)
    if new: w.writerow(["code", "case", "pass", "ms", "vs_plain", "picks", "gpu", "torch", "triton", "date"])
    for (n, p), ts in times.items():
        ms = statistics.median(ts); base = statistics.median(times[("plain", p)])
        w.writerow([label, n, p, f"{ms:.4f}", f"{ms / base:.4f}", picks, torch.cuda.get_device_name(), torch.__version__,
                    triton.__version__, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")])
        print(label, n, p, f"{ms:.3f} ms", f"{ms / base:.3f}x plain", flush=True)
print(label, picks)
