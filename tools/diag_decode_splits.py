"""Issue 4 diagnostic (GPU): decode GPU time in CUDA graphs for forced split counts and both SDPA backends, and host
time per eager call; produced notes/logs/2026-11-30_issue4_decode_splits_graph.log from the working tree committed as 27b1cbb.
Usage on the device: PYTHONPATH=. python3 tools/diag_decode_splits.py"""
import time, torch, triton, sys
from triton_fa2.split_kv import decode, _choose_num_splits, _decode_fwd_tuned
from triton_fa2.forward import _check_inputs
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

def graph_ms(fn):
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")

for B, Hq, Hkv, L, D in [(8, 32, 8, 8192, 128), (1, 32, 8, 32768, 128), (64, 32, 8, 4096, 128), (32, 32, 8, 16384, 128)]:
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    nbytes = 2 * k.numel() * 2
    decode(q, k, v); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200): decode(q, k, v)
    t1 = time.perf_counter(); torch.cuda.synchronize()
    t2 = time.perf_counter()
    for _ in range(200): _check_inputs(q, k, v, True, None)
    t3 = time.perf_counter()
    S = _choose_num_splits(B, Hkv, Hq // Hkv, L, q.device)
    print(f"\n{(B, Hq, Hkv, L, D)} heuristic S={S}: host per call {1e6*(t1-t0)/200:.1f} us, _check_inputs {1e6*(t3-t2)/200:.1f} us; cfg {_decode_fwd_tuned.best_config}")
    for s in sorted({1, 2, 4, 8, 14, 16, 24, 32, 64, S}):
        ms = graph_ms(lambda: decode(q, k, v, num_splits=s))
        print(f"  S={s:<3} graph {ms*1e3:7.1f} us = {nbytes/ms/1e9:.2f} TB/s  cfg {_decode_fwd_tuned.best_config}")
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def f():
            with sdpa_kernel(be): return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        ms = graph_ms(f)
        print(f"  sdpa_{name} graph {ms*1e3:7.1f} us = {nbytes/ms/1e9:.2f} TB/s")
