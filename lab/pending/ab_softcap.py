"""One process: the money shot forward, plain causal and softcap 50, through flash_attn_func (tuned picks) and at fixed
Gluon configs; do_bench medians of five alternating rounds; errors against float64 on one batch row's first heads."""
import sys, json, statistics, torch, triton, triton_fa2
from triton_fa2 import dispatch, candidates
from triton_fa2.score_mods import ScoreMods
from triton_fa2.tuning import tuning
tag = sys.argv[1]
torch.manual_seed(0)
q, k, v = (torch.randn(8, 2048, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))                  # (B, H, L, D) views, as the dispatcher takes them
o, lse = torch.empty_like(qh), torch.empty(8, 32, 2048, device="cuda", dtype=torch.float32)
by_label = {c.label: c for c in candidates.PREFILL_GLUON}
cap = ScoreMods(softcap=50.0)
fns = {"plain tuned": lambda: triton_fa2.flash_attn_func(q, k, v, causal=True),
       "softcap tuned": lambda: triton_fa2.flash_attn_func(q, k, v, causal=True, softcap=50.0)}
for label in ("gluon ws 128x128 s2 pingpong", "gluon 64x64 w4 s2 qreg", "gluon 64x64 w4 s2 qreg psmem"):
    for name, mods in (("plain", None), ("softcap", cap)):
        fns[f"{name} {label}"] = (lambda c=by_label[label], m=mods: dispatch._attention_forward(qh, kh, vh, o, lse, True, 128 ** -0.5, config=c, mods=m) and o)
s = (qh[:1, :4].double() @ kh[:1, :4].double().transpose(-1, -2)) * 128 ** -0.5
mask = torch.ones(2048, 2048, dtype=torch.bool, device="cuda").triu(1)
refs = {m: (t.masked_fill(mask, float("-inf")).softmax(-1) @ vh[:1, :4].double()) for m, t in (("plain", s), ("softcap", 50.0 * torch.tanh(s / 50.0)))}
errs = {}
with torch.no_grad(), tuning(True):
    for n, f in fns.items():
        o.fill_(float("nan"))
        out = f(); out = out.transpose(1, 2) if out.shape[1] == 2048 else out   # flash_attn_func returns (B, L, H, D)
        errs[n] = (out[:1, :4].double() - refs[n.split()[0]]).abs().max().item()
    times = {n: [] for n in fns}
    for _ in range(5):
        for n, f in fns.items(): times[n].append(triton.testing.do_bench(f, warmup=25, rep=150))
res = {n: statistics.median(t) for n, t in times.items()}
picks = sorted({p.label for p in dispatch._PICKS.values()})
for n in fns: print(tag, f"{n:40s} {res[n]:.4f} ms  vs plain tuned {res[n] / res['plain tuned']:.4f}  err {errs[n]:.1e}", flush=True)
print(tag, "picks", picks)
print("JSON", json.dumps(dict(tag=tag, ms=res, rounds=times, err=errs, picks=picks)))
