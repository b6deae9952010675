"""A/B on a GPU: softcap's exp2 half on the FMA pipe in the ws forward (`gluon._SOFTCAP_EXP2_FMA` toggled in one process),
every Gluon candidate with and without it beside plain causal, and the first-call picks; to $OUT/softcap_fma_ab.csv."""
import triton_fa2, csv, os, statistics, sys, time
import torch, triton
from triton_fa2 import gluon, dispatch
from triton_fa2.candidates import PREFILL_GLUON
from triton_fa2.score_mods import ScoreMods
from triton_fa2.naive import attention_ref
from triton_fa2.bench import run_config
from triton_fa2.interface import flash_attn_func
out = os.environ.get("OUT", "/tmp/out"); cfg = run_config(os.environ.get("COMMIT"))
SHAPES = [(8, 32, 2048, True), (8, 32, 2048, False), (32, 32, 512, True), (1, 32, 32768, True)]
D = 128; rows = []
def bench(fn): return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
for B, H, N, causal in SHAPES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    o = torch.empty_like(qt); lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    sc = ScoreMods(softcap=50.0)
    # reference on head 0, batch 0, last 512 queries, float64
    qs, ks, vs = (x[:1, :1].double() for x in (qt, kt, vt))
    s = (qs[..., -512:, :] @ ks.transpose(-1, -2)) * D**-0.5
    s = 50.0 * torch.tanh(s / 50.0)
    if causal:
        i = torch.arange(N - 512, N, device="cuda")[:, None]; j = torch.arange(N, device="cuda")[None]
        s = s.masked_fill(j > i, float("-inf"))
    ref = torch.softmax(s, -1) @ vs
    items = []
    for c in PREFILL_GLUON:
        items.append((f"plain {c.label}", c, None, None))
        items.append((f"softcap {c.label}", c, sc, False))
        if c.WARP_SPECIALIZE: items.append((f"softcap_fma {c.label}", c, sc, True))
    def run(c, mods, fma):
        if fma is not None: gluon._SOFTCAP_EXP2_FMA[c.WARP_SPECIALIZE] = fma
        return lambda: dispatch._attention_forward(qt, kt, vt, o, lse, causal, D**-0.5, config=c, pack_gqa=False, use_tma=True, mods=mods)
    times = {name: [] for name, *_ in items}; errs = {}
    times["first_call plain"] = []; times["first_call softcap"] = []
    for name, c, mods, fma in items:
        o.fill_(float("nan")); run(c, mods, fma)(); torch.cuda.synchronize()
        if mods is not None: errs[name] = ((o[:1, :1, -512:].double() - ref).abs().max().item())
    for r in range(5):
        for name, c, mods, fma in items:
            f = run(c, mods, fma); times[name].append(bench(f))
        times["first_call plain"].append(bench(lambda: flash_attn_func(q, k, v, causal=causal)))
        times["first_call softcap"].append(bench(lambda: flash_attn_func(q, k, v, causal=causal, softcap=50.0)))
    gluon._SOFTCAP_EXP2_FMA[True] = True
    for name, t in times.items():
        row = dict(case=name, batch=B, heads=H, seqlen=N, head_dim=D, causal=causal, ms=statistics.median(t),
                   ms_min=min(t), ms_max=max(t), err=errs.get(name, ""), **cfg)
        rows.append(row); print({k2: row[k2] for k2 in ("case", "batch", "seqlen", "causal", "ms", "ms_min", "ms_max", "err")}, flush=True)
    with open(f"{out}/softcap_fma_ab.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
