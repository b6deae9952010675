"""Persistent ws forward (prototype) against the shipped ws kernel: windows, correctness vs float64 incl. the redo; timing
interleaved with plain causal at the same length, ratios paired per round."""
import sys, json, statistics, time, torch, triton
sys.path.insert(0, "lab/prototypes")
import ws_persistent as P
from triton_fa2 import dispatch
from triton_fa2.candidates import Candidate as C
from triton_fa2.score_mods import ScoreMods
WS = C("gluon", 128, 128, 4, 2, P_SMEM=True, WARP_SPECIALIZE=True, PINGPONG=True)
SC = 128 ** -0.5
def ref(q, k, v, rows, heads, left):
    N = k.shape[2]
    s = q[:1, :heads, rows].double() @ k[:1, :heads].double().transpose(-1, -2) * SC
    i = torch.arange(N, device=q.device)[rows][:, None]; j = torch.arange(N, device=q.device)[None]
    vis = (j <= i) & (j >= i - left)
    return s.masked_fill(~vis, float("-inf")).softmax(-1) @ v[:1, :heads].double()
def err(o, q, k, v, rows, left, heads=2):
    r = ref(q, k, v, rows, heads, left)
    return ((o[:1, :heads, rows].double() - r).abs().max() / r.abs().max().clamp_min(1)).item()
out = {}
torch.manual_seed(0)
with torch.no_grad():
    # correctness: two shapes, the first and last rows, and a redo
    for B, N, left in ((1, 32768, 4095), (2, 8192, 1023), (1, 3000, 700)):
        q, k, v = (torch.randn(B, 32, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for name, run in (("ws", lambda o, l: dispatch._attention_forward(q, k, v, o, l, True, SC, config=WS, mods=ScoreMods(window_size=(left, 0)))),
                          ("persistent", lambda o, l: P.launch(q, k, v, o, l, True, SC, WS, ScoreMods(window_size=(left, 0))))):
            o = torch.full_like(q, float("nan")); l = torch.full((B, 32, N), float("nan"), device="cuda")
            t0 = time.time(); run(o, l); torch.cuda.synchronize()
            e = max(err(o, q, k, v, slice(0, 700), left), err(o, q, k, v, slice(N - 700, N), left))
            print(f"check {name} B={B} N={N} left={left}: err {e:.2e} nan {torch.isnan(o).any().item()} lse-nan {torch.isnan(l).any().item()} ({time.time()-t0:.1f}s)", flush=True)
            out[f"check|{name}|{B}|{N}|{left}"] = e
    # the redo: keys far inside the window whose logits dwarf the diagonal tile's
    N, left = 8192, 4095
    q, k, v = (torch.randn(1, 32, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q[:, :, 5000:5200] = 4.0; k[:, :, 4000] = 4.0
    for name, run in (("ws", lambda o, l: dispatch._attention_forward(q, k, v, o, l, True, SC, config=WS, mods=ScoreMods(window_size=(left, 0)))),
                      ("persistent", lambda o, l: P.launch(q, k, v, o, l, True, SC, WS, ScoreMods(window_size=(left, 0))))):
        o = torch.full_like(q, float("nan")); l = torch.full((1, 32, N), float("nan"), device="cuda")
        run(o, l); torch.cuda.synchronize()
        e = err(o, q, k, v, slice(4800, 5400), left)
        print(f"redo {name}: err {e:.2e} nan {torch.isnan(o).any().item()}", flush=True)
        out[f"redo|{name}"] = e
    # timing: plain causal (ws) beside each, 7 rounds
    for B, N, left in ((1, 32768, 4095), (4, 8192, 1023)):
        q, k, v = (torch.randn(B, 32, N, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, l = torch.empty_like(q), torch.empty(B, 32, N, device="cuda")
        fns = {"plain causal ws": lambda: dispatch._attention_forward(q, k, v, o, l, True, SC, config=WS),
               "window ws": lambda: dispatch._attention_forward(q, k, v, o, l, True, SC, config=WS, mods=ScoreMods(window_size=(left, 0))),
               "window persistent": lambda: P.launch(q, k, v, o, l, True, SC, WS, ScoreMods(window_size=(left, 0)))}
        for f in fns.values(): f()
        times = {n: [] for n in fns}
        for _ in range(7):
            for n, f in fns.items(): times[n].append(triton.testing.do_bench(f, warmup=25, rep=100))
        pairs_w = N * (left + 1) - (left + 1) * left // 2; pairs_c = N * (N + 1) // 2
        for n in fns:
            ms = statistics.median(times[n]); vs = statistics.median(a / b for a, b in zip(times[n], times["plain causal ws"]))
            vsw = statistics.median(a / b for a, b in zip(times[n], times["window ws"]))
            print(f"time B={B} N={N} left={left} {n:20s} {ms:.4f} ms  vs plain {vs:.3f} (pairs {pairs_w / pairs_c:.4f}: {vs / (pairs_w / pairs_c):.3f}x share)  vs window ws {vsw:.3f}  rounds {['%.4f' % t for t in times[n]]}", flush=True)
            out[f"time|{B}|{N}|{left}|{n}"] = dict(ms=ms, vs_plain=vs, vs_window_ws=vsw, rounds=times[n])
print("JSON", json.dumps(out))
