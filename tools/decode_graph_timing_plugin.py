"""A pytest plugin for one experiment (notes/performance.md, "the likely cause"): decode's autotuner timed by CUDA-graph
replay, as at cead636 where `test_gpu_decode_shapes` failed at (64, 32/8, 4096). DECODE_GRAPH_SYNC=1 times through
`_graph_ms`, which synchronises first; DECODE_GRAPH_SYNC=0 calls `do_bench_cudagraph` straight away, as cead636 did.
    DECODE_GRAPH_SYNC=0 python3 -m pytest -p tools.decode_graph_timing_plugin -m gpu tests/test_decode.py -k shapes"""
import os, triton
from triton_fa2 import forward, split_kv

def _unsynced(fn, quantiles): return triton.testing.do_bench_cudagraph(fn, rep=10, quantiles=quantiles)

split_kv._decode_fwd_tuned._do_bench = forward._bench_candidate if os.environ.get("DECODE_GRAPH_SYNC") == "1" else _unsynced
