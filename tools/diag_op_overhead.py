"""Issue 7 diagnostic (GPU): host time per eager call through the custom operators (`attention`, `decode`) against the
launch they wrap (`_attention_forward`, `_decode_forward` into preallocated outputs), and the GPU time of the same call
in a CUDA graph. Usage on the device: PYTHONPATH=. python3 tools/diag_op_overhead.py"""
import time, torch, triton
from triton_fa2.forward import attention, _attention_forward
from triton_fa2.split_kv import decode, _decode_forward, _choose_num_splits


def host_us(fn, n=300):
    "Mean host time of one call, measured over n back-to-back calls (the GPU work is far shorter than the host's here)."
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize(); return t


def graph_us(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


torch.manual_seed(0)
for B, H, N, D in ((1, 32, 512, 64), (8, 32, 2048, 128)):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    op = lambda: attention(q, k, v, causal=True)
    direct = lambda: _attention_forward(q, k, v, o, lse, True, D ** -0.5)
    op(); direct()
    print(f"attention (B={B}, H={H}, N={N}, D={D}) causal: host µs per call: through the operator {host_us(op):.1f}, "
          f"direct launch {host_us(direct):.1f}; GPU µs in a graph: {graph_us(op):.1f}")

B, Hq, Hkv, L, D = 8, 32, 8, 8192, 128
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
o, lse = torch.empty_like(q), torch.empty(B, Hq, 1, device="cuda", dtype=torch.float32)
splits = _choose_num_splits(B, Hkv, Hq // Hkv, L, q.device)          # rows of a packed group: g · Lq
op = lambda: decode(q, k, v)
direct = lambda: _decode_forward(q, k, v, None, o, lse, True, D ** -0.5, splits)
op(); direct()
print(f"decode (B={B}, {Hq}/{Hkv}, Lk={L}, D={D}), {splits} splits: host µs per call: through the operator {host_us(op):.1f}, "
      f"direct launch {host_us(direct):.1f}; GPU µs in a graph: {graph_us(op):.1f}")
