"""Sliding windows, softcapping, ALiBi and sinks on a GPU, forward and backward, against FlexAttention with the same
mask_mod / score_mod (block mask built once per shape, outside the timing), to results/score_mods.csv.

Cases (bf16, D=128, Hq=Hkv=32): at the money shot (B=8, N=2048, causal) plain causal, softcap 50, ALiBi (the standard
slopes 2^(−8(h+1)/H)), sinks (one random logit per head); at B=1, N=32768 causal, plain causal and a sliding window of
4096 keys (window_size=(4095, 0), transformers' sliding_window=4096). FlexAttention runs sinks as one extra key of
zeros whose score is the head's sink (exactly the sink's softmax; its dK, dV are discarded and the sinks get no
gradient there; ours returns theirs). SDPA's flash and cuDNN backends take none of these, so they are not rows.

op=forward times o = f(q, k, v); op=backward times torch.autograd.grad of one retained forward (the backward alone).
FLOPs count the visible (query, key) pairs exactly: 4·D·pairs·B·H forward, 2.5× that backward. `ms` is the median of
`--rounds` (5) triton.testing.do_bench medians; each round times every case and provider of a length in turn (the GPU
runs at its power cap, and its clock drifts between rounds). `vs_plain` = this row's time over plain causal's of the same
length and provider, the median of the rounds' ratios (each pair timed in the same round);
`pairs_vs_plain` = this case's visible pairs over the plain causal case's (what the time should scale with).

Outputs are checked before timing: forward against attention_ref in float32 on sampled heads (and for N=32768 the
last 1024 queries), `err` = max |o − o_ref| / max(1, max |o_ref|); backward, ours against FlexAttention's dq, dk, dv
(relative norm, `err`). triton_fa2 runs its first-call configs (`config`), FlexAttention its defaults: neither tunes.

    python tools/measure_score_mods.py --out results/score_mods.csv --commit $(git rev-parse --short HEAD)
"""
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import argparse, csv, functools, math, pathlib, statistics

import torch
import triton

from triton_fa2.bench import run_config
from triton_fa2.naive import attention_ref

COLUMNS = ["case", "op", "provider", "batch", "heads", "seqlen", "head_dim", "dtype", "window", "softcap", "alibi", "sink",
           "ms", "tflops", "vs_plain", "pairs_vs_plain", "err", "config", "note", "gpu", "torch", "triton", "commit", "date"]

CASES = [  # name, B, N, window (left, right), softcap, alibi, sink
    ("plain", 8, 2048, (-1, -1), 0.0, False, False),
    ("softcap", 8, 2048, (-1, -1), 50.0, False, False),
    ("alibi", 8, 2048, (-1, -1), 0.0, True, False),
    ("sink", 8, 2048, (-1, -1), 0.0, False, True),
    ("plain", 1, 32768, (-1, -1), 0.0, False, False),
    ("window", 1, 32768, (4095, 0), 0.0, False, False),
]
H, D, DTYPE = 32, 128, torch.bfloat16


def visible_pairs(n:int, window:tuple) -> int:
    "Causal (query, key) pairs of one head, within `window` when it has a left side."
    left = window[0]
    if left < 0: return n * (n + 1) // 2
    w = left + 1
    return n * w - w * (w - 1) // 2


@functools.lru_cache
def flex():
    from torch.nn.attention.flex_attention import flex_attention
    torch._functorch.config.donated_buffer = False       # its compiled backward may then run twice on one retained forward
    torch._dynamo.config.recompile_limit = 64             # each case's mask_mod and score_mod compile anew: past the
    torch._dynamo.config.accumulated_recompile_limit = 512   # default limit dynamo would run FlexAttention's math fallback
    return torch.compile(flex_attention, dynamic=False)


def flex_call(n:int, window:tuple, softcap:float, slopes, sinks):
    "FlexAttention with this case's mask_mod and score_mod, its block mask built once here."
    from torch.nn.attention.flex_attention import create_block_mask
    left = window[0]
    def mask_mod(b, h, q, kv):
        seen = kv <= q
        if left >= 0: seen = seen & (q - kv <= left)
        if sinks is not None: seen = seen | (kv == n)              # the sink's key, seen by every row
        return seen
    def score_mod(score, b, h, q, kv):
        if softcap > 0: score = softcap * torch.tanh(score / softcap)
        if slopes is not None: score = score - slopes[h] * (q - kv).abs()
        if sinks is not None: score = torch.where(kv == n, sinks[h], score)
        return score
    lk = n + (sinks is not None)
    mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=lk, device="cuda")
    plain = softcap == 0 and slopes is None and sinks is None
    def run(q, k, v):
        if sinks is not None:                                     # one key and value of zeros: the sink's
            k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[3])], 2)
            v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[3])], 2)
        return flex()(q, k, v, block_mask=mask, score_mod=None if plain else score_mod)
    return run


def ours_call(window, softcap, slopes, sinks):
    return lambda q, k, v: triton_fa2.attention(q, k, v, causal=True, window_size=window, softcap=softcap,
                                                alibi_slopes=slopes, learnable_sink=sinks)


def timed(fn, op:str, q, k, v, do):
    "A zero-argument step for do_bench: the forward, or the backward of one retained forward."
    if op == "forward": return lambda: fn(q, k, v)
    o = fn(q, k, v)
    leaves = [q, k, v]
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def prepare(name, B, n, window, softcap, alibi, sink, q, k, v, do) -> dict:
    "One case: its providers, its forward error against float32 and its gradients' against FlexAttention's, its picks."
    seen = set(triton_fa2.dispatch._PICKS)                        # the picks of earlier cases: `config` names this case's
    slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], device="cuda") if alibi else None
    sinks = torch.randn(H, device="cuda") if sink else None
    providers = {"triton_fa2": ours_call(window, softcap, slopes, sinks), "flex": flex_call(n, window, softcap, slopes, sinks)}
    rows_q = slice(max(0, n - 1024), n)                           # sampled heads; the last 1024 queries at long N
    o_ref, _ = attention_ref(q[:1, :2, rows_q], k[:1, :2], v[:1, :2], causal=True, window_size=window, softcap=softcap,
                             alibi_slopes=None if slopes is None else slopes[:2], learnable_sink=None if sinks is None else sinks[:2])
    err_fwd = {}
    for prov, fn in providers.items():
        with torch.no_grad(): o = fn(q, k, v)
        err_fwd[prov] = ((o[:1, :2, rows_q].float() - o_ref).abs().max() / o_ref.abs().max().clamp_min(1)).item()
    grads = {}
    for prov, fn in providers.items():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grads[prov] = torch.autograd.grad(fn(*leaves), leaves, do)
    err_bwd = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads["triton_fa2"], grads["flex"]))
    config = ";".join(sorted({c.label for key, c in triton_fa2.dispatch._PICKS.items()
                              if key not in seen and key[0] in ("prefill", "bwd_dkdv", "bwd_dq") and key[1] == D}))
    return dict(name=name, B=B, n=n, window=window, softcap=softcap, alibi=alibi, sink=sink, providers=providers,
                err_fwd=err_fwd, err_bwd=err_bwd, config=config, pairs=visible_pairs(n, window))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/score_mods.csv")
    p.add_argument("--commit", default=None)
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all; plain runs with any)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    meta = run_config(args.commit)
    rows = []
    for n in dict.fromkeys(c[2] for c in CASES):                  # each length's cases together, plain causal first
        chosen = [c for c in CASES if c[2] == n and (c[0] == "plain" or not args.cases or c[0] in args.cases.split(","))]
        if len(chosen) == 1 and args.cases: continue
        torch.manual_seed(0)
        B = chosen[0][1]
        q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=DTYPE) for _ in range(4))
        cases = [prepare(*c, q, k, v, do) for c in chosen]
        plain_pairs = cases[0]["pairs"]
        for op in ("forward", "backward"):
            qg, kg, vg = (t.clone().requires_grad_(op == "backward") for t in (q, k, v))
            steps = {(c["name"], prov): timed(fn, op, qg, kg, vg, do) for c in cases for prov, fn in c["providers"].items()}
            for step in steps.values(): step(); step()
            samples = {key: [] for key in steps}
            for _ in range(args.rounds):                          # every case and provider in turn, each round
                for key, step in steps.items(): samples[key].append(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))
            for c in cases:
                fwd_flops = 4 * D * c["pairs"] * B * H
                flops = fwd_flops if op == "forward" else 2.5 * fwd_flops
                for prov in c["providers"]:
                    ms = statistics.median(samples[(c["name"], prov)])
                    # against plain causal timed next to it in the same round (the clock drifts under the power cap)
                    vs = statistics.median(a / b for a, b in zip(samples[(c["name"], prov)], samples[("plain", prov)]))
                    rows.append(dict(case=c["name"], op=op, provider=prov, batch=B, heads=H, seqlen=n, head_dim=D, dtype="bf16",
                                     window=f"{c['window'][0]}:{c['window'][1]}", softcap=c["softcap"], alibi=c["alibi"],
                                     sink=c["sink"], ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}", vs_plain=f"{vs:.3f}",
                                     pairs_vs_plain=f"{c['pairs'] / plain_pairs:.4f}",
                                     err=f"{c['err_fwd'][prov]:.2e}" if op == "forward" else f"{c['err_bwd']:.2e}",
                                     config=c["config"] if prov == "triton_fa2" else "defaults",
                                     note="sink as an extra key; no sink gradient" if prov == "flex" and c["sink"] else "", **meta))
                    print({col: rows[-1][col] for col in ("case", "op", "provider", "seqlen", "ms", "tflops", "vs_plain", "err")}, flush=True)
            del steps
            torch.cuda.empty_cache()
        write(rows, args.out)                                     # after every length: a later failure keeps these


def write(rows:list, path:str):
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {out}", flush=True)


if __name__ == "__main__":
    main()
