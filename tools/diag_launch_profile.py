"""Issue 6 diagnostic (GPU): where an eager forward call's host time goes, with tensor descriptors and with pointers.
Prints host µs per call of `_attention_forward` (preallocated outputs, the autotuner's pick cached) for both tile
sources at a host-bound shape, and the top functions of a cProfile of each. Usage on the device:

    PYTHONPATH=. python3 tools/diag_launch_profile.py [--calls 2000] [--shape 1,32,512,64]"""
import argparse, cProfile, io, pstats, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch
from triton_fa2.forward import _attention_forward


def host_us(fn, n):
    "Mean host time of one call over n back-to-back calls (the kernel is shorter than the host's work at this shape)."
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000); ap.add_argument("--shape", default="1,32,512,64")
    a = ap.parse_args()
    B, H, N, D = map(int, a.shape.split(","))
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
    for use_tma in (True, False):
        call = lambda: _attention_forward(q, k, v, o, lse, True, D ** -0.5, use_tma=use_tma)
        print(f"({B}, {H}, {N}, {D}) causal, {'descriptors' if use_tma else 'pointers'}: "
              f"{host_us(call, a.calls):.1f} µs per call", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(a.calls): call()
        profile.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue(), flush=True)
