"""Issue 4 diagnostic (GPU): host time of one eager decode/attention call and a cProfile of 300 decode calls;
produced notes/logs/2026-11-30_issue4_host_overhead.log from the working tree committed as 27b1cbb.
Usage on the device: PYTHONPATH=. python3 tools/diag_host_overhead.py"""
import time, torch, triton, cProfile, pstats, io
from triton_fa2.split_kv import decode, _decode_fwd, _combine_splits, _decode_forward
from triton_fa2.forward import attention
B, Hq, Hkv, L, D = 8, 32, 8, 8192, 128
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
def host_us(fn, n=300):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize(); return t
print("torch.empty x1", host_us(lambda: torch.empty(B, Hq, 1, D, device="cuda")))
print("decode S=1", host_us(lambda: decode(q, k, v, num_splits=1)))
print("decode S=2", host_us(lambda: decode(q, k, v, num_splits=2)))
print("attention", host_us(lambda: attention(q, k, v, causal=True)))
with torch.cuda.device(0): pass
print("cuda.device ctx", host_us(lambda: torch.cuda.device(q.device).__enter__()))
print("get_device_capability", host_us(lambda: torch.cuda.get_device_capability(q.device)))
pr = cProfile.Profile(); pr.enable()
for _ in range(300): decode(q, k, v, num_splits=2)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30); print(s.getvalue()[:6000])
