"""Issue 6 diagnostic (GPU): which config the autotuner (with `_confirm_pick`) chooses for the money shot, and each
close candidate's time measured the way the benchmark measures (do_bench median, L2 cleared), in 5 alternating rounds.

    PYTHONPATH=. python3 tools/diag_money_pick.py"""
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import triton_fa2.forward as fwd

if __name__ == "__main__":
    q, k, v = (torch.randn(8, 32, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    picked = triton_fa2.warmup(q, k, v, causal=True)
    print("picked:", fwd._shape(picked), flush=True)
    timings = fwd._attn_fwd_tuned.configs_timings
    ranked = sorted(timings, key=lambda c: timings[c][0])
    print("autotuner's timings (ms):", [(fwd._shape(c), round(timings[c][0], 4)) for c in ranked[:5]], flush=True)
    o, lse = torch.empty_like(q), torch.empty(8, 32, 2048, device="cuda")
    flops = 4 * 8 * 32 * 2048 * 2048 * 128 / 2
    candidates = ranked[:3]
    samples = {fwd._shape(c): [] for c in candidates}
    for _ in range(5):
        for c in candidates:
            ms = triton.testing.do_bench(lambda: fwd._attention_forward(q, k, v, o, lse, True, 128 ** -0.5, config=c), warmup=25, rep=100)
            samples[fwd._shape(c)].append(ms)
    samples["attention() (the benchmark's call)"] = [triton.testing.do_bench(lambda: triton_fa2.attention(q, k, v, causal=True), warmup=25, rep=100) for _ in range(5)]
    for name, ms in samples.items():
        med = sorted(ms)[2]
        print(f"{str(name):<40} median {med:.4f} ms = {flops / med / 1e9:.1f} TFLOP/s   all: {[round(m, 4) for m in ms]}", flush=True)
