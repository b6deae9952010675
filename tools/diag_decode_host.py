"""Issue 6 diagnostic (GPU): host time of one eager `decode` call at the benchmark's decode shapes, through the saved
launch (`_DecodeLaunch`, notebook 06) and through Triton's own launch path, with the GPU time beside it (CUDA graph).
Usage on the device: PYTHONPATH=. python3 tools/diag_decode_host.py"""
import time, torch
import triton_fa2.split_kv as dec
from triton_fa2.bench import DECODE

def host_us(fn, n=300):
    "Mean host time of a call, the GPU's queue never full (n calls of a few kernels each)."
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize(); return t

def graph_us(fn, n=50):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): fn()
    graph.replay(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n): graph.replay()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3

fast = dec._fast_launch_possible
for w in DECODE:
    q = torch.randn(w.batch, w.heads_q, 1, w.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(w.batch, w.heads_kv, w.seqlen_k, w.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    call = lambda: dec.decode(q, k, v)
    call(); call()
    saved = host_us(call)
    dec._fast_launch_possible = lambda q: False          # Triton's launch path, as before the saved launch
    triton_path = host_us(call)
    dec._fast_launch_possible = fast
    print(f"decode {w.batch}x{w.heads_q}/{w.heads_kv}x{w.seqlen_k}: host {saved:.1f} us saved launch, {triton_path:.1f} us "
          f"Triton's path; GPU {graph_us(call):.1f} us; splits {dec._choose_num_splits(w.batch, w.heads_kv, w.heads_q // w.heads_kv, w.seqlen_k, q.device)}")
