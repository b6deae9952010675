"""Issue 6 diagnostic (GPU): where an eager forward call's host time goes. For a few host-bound shapes, prints the
mean wall time per call over back-to-back calls of each layer of the call (the public function with saved launches,
the same without them, the PyTorch operator, the bare launch into preallocated outputs), SDPA's for comparison, the
kernel's own time, and a cProfile of the public call. Writes one CSV row per (shape, layer) with --csv.

    PYTHONPATH=. python3 tools/diag_launch_profile.py [--calls 3000] [--csv $OUT/launch_overhead.csv --commit SHA]"""
import argparse, cProfile, csv, datetime, io, pstats, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton_fa2.forward as fwd

SHAPES = [(1, 32, 512, 64, True), (1, 32, 512, 128, False), (1, 2, 128, 64, False)]   # (B, H, N, D, causal), bf16


def per_call_us(fn, n):
    "Mean wall time of one call over n back-to-back calls, then a synchronisation (the queue absorbs GPU time shorter than the host's)."
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000); ap.add_argument("--csv", default=""); ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=a.commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows = []
    for B, H, N, D, causal in SHAPES:
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
        scale = D ** -0.5
        fast_launch_possible = fwd._fast_launch_possible
        def without_plans(fn):
            def run():
                fwd._fast_launch_possible = lambda q: False
                try: fn()
                finally: fwd._fast_launch_possible = fast_launch_possible
            return run
        layers = {
            "attention (saved launch, no dispatcher)": lambda: triton_fa2.attention(q, k, v, causal=causal),
            "attention without saved launches": without_plans(lambda: triton_fa2.attention(q, k, v, causal=causal)),
            "the operator triton_fa2::attention": lambda: fwd._attention_op(q, k, v, causal, scale, False),
            "_attention_forward (saved launch)": lambda: fwd._attention_forward(q, k, v, o, lse, causal, scale),
            "_attention_forward without saved launches": without_plans(lambda: fwd._attention_forward(q, k, v, o, lse, causal, scale)),
            "_check_inputs alone": lambda: fwd._check_inputs(q, k, v, causal, None),
            "sdpa flash": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "torch.empty_like(q) (calibration)": lambda: torch.empty_like(q),
        }
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for name, fn in layers.items():
                us = per_call_us(fn, a.calls)
                rows.append(dict(B=B, H=H, N=N, D=D, causal=int(causal), dtype="bf16", layer=name, us_per_call=f"{us:.1f}", **meta))
                print(f"({B}, {H}, {N}, {D}) {'causal' if causal else 'full'}  {name:<45} {us:7.1f} µs per call", flush=True)
        kernel_ms = triton.testing.do_bench_cudagraph(lambda: fwd._attention_forward(q, k, v, o, lse, causal, scale), rep=50, return_mode="median")
        rows.append(dict(B=B, H=H, N=N, D=D, causal=int(causal), dtype="bf16", layer="kernel (CUDA graph)", us_per_call=f"{kernel_ms * 1e3:.1f}", **meta))
        print(f"({B}, {H}, {N}, {D}) {'causal' if causal else 'full'}  {'kernel (CUDA graph)':<45} {kernel_ms * 1e3:7.1f} µs", flush=True)
    B, H, N, D, causal = SHAPES[0]
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(a.calls): triton_fa2.attention(q, k, v, causal=causal)
    profile.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(20)
    print(out.getvalue(), flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0])); w.writeheader(); w.writerows(rows)
