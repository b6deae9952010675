"""Issue 6 diagnostic (GPU): the one grid shape below FA2 in the sweep at d89284d, (1, 32, 512, 64) fp16 non-causal.
Prints the config the autotuner (with `_confirm_pick`) chooses for it, every candidate's time with L2 cleared (do_bench,
as the autotuner and the eager column measure) and in a CUDA graph (as the GPU-time column measures), and the
benchmark's own measurement of triton_fa2 and SDPA-FA2 on it, three times.

    PYTHONPATH=. python3 tools/diag_small_pick.py"""
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import triton_fa2.forward as fwd
from triton_fa2.bench import Workload, measure, run_config

if __name__ == "__main__":
    B, H, N, D = 1, 32, 512, 64
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
        picked = triton_fa2.warmup(q, k, v, causal=False)
        timings = fwd._attn_fwd_tuned.configs_timings
        print(f"{dtype}: picked {fwd._shape(picked)}; autotuner's medians (µs): "
              + ", ".join(f"{fwd._shape(c)}: {t[0] * 1e3:.1f}" for c, t in sorted(timings.items(), key=lambda x: x[1][0])), flush=True)
        o, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
        for c in sorted(timings, key=lambda c: timings[c][0]):
            run = lambda: fwd._attention_forward(q, k, v, o, lse, False, D ** -0.5, config=c)
            cold = triton.testing.do_bench(run, warmup=25, rep=100)
            graph = triton.testing.do_bench_cudagraph(run, rep=100)
            print(f"   {str(fwd._shape(c)):<20} L2 cleared {cold * 1e3:6.1f} µs   CUDA graph {graph * 1e3:6.1f} µs", flush=True)
    meta = run_config("diag")
    for dt in ("fp16", "bf16"):
        w = Workload("prefill", B, H, H, N, N, D, dt, False)
        sets = [w.inputs("cuda", seed=i) for i in range(4)]
        for _ in range(3):
            for p in ("triton_fa2", "sdpa_flash"):
                r = measure(w, p, sets, meta)
                print(f"{dt} {p:<11} eager {r['ms']} ms, graph {r['ms_graph']} ms", flush=True)
