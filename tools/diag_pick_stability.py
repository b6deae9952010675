"""Issue 6 diagnostic (GPU): does the autotuner pick the same config for a shape in every fresh process, and does the
pick agree with the benchmark's timing? f8468a9's sweep ran the money shot at 128×64/4 warps' time while a fresh
process right after picked 64×64, 4% faster timed as the benchmark times (notebook 09, "The money shot's pick").

Each process autotunes one shape; `--confirm graph` re-times close candidates in CUDA graphs (as shipped until 4df90f4,
which confirms calls of 0.2 ms or more eagerly), `--confirm bench` re-times them as the benchmark does (`do_bench`: eager, L2 flushed between calls). Then it
times `attention()` as the benchmark does. One line per process:

    PYTHONPATH=. python3 tools/diag_pick_stability.py --runs 3 --confirm graph,bench --shapes "8,2048,bf16;32,2048,fp16"
"""
import argparse, json, subprocess, sys

CHILD = r'''
import json, sys
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import triton_fa2.forward as fwd
batch, seqlen, dtype, confirm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if confirm == "graph":                     # graphs for every length, as before 4df90f4
    fwd._LONG_CALL_MS = float("inf")
if confirm == "bench":                     # the shipped logic with the benchmark's timer in place of the graph replay
    def _bench_ms(fn): torch.cuda.synchronize(); return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")
    shipped = fwd._confirm_pick
    def confirm_by_bench(timings, run, within=0.05, rounds=5):
        saved, fwd._graph_ms = fwd._graph_ms, _bench_ms
        try: return shipped(timings, run, within, rounds)
        finally: fwd._graph_ms = saved
    fwd._confirm_pick = confirm_by_bench
q, k, v = (torch.randn(batch, 32, seqlen, 128, device="cuda", dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype]))
           for _ in range(3))
picked = fwd._shape(triton_fa2.warmup(q, k, v, causal=True))
timings = fwd._attn_fwd_tuned.configs_timings
graph = sorted(((fwd._shape(c), round(t[0], 4)) for c, t in timings.items()), key=lambda x: x[1])[:3]
ms = triton.testing.do_bench(lambda: triton_fa2.attention(q, k, v, causal=True), warmup=25, rep=100, return_mode="median")
flops = 4 * batch * 32 * seqlen * seqlen * 128 / 2
print(json.dumps(dict(shape=[batch, 32, seqlen, 128, dtype], confirm=confirm, picked=picked, graph_top3=graph,
                      attention_ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1))))
'''

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--confirm", default="graph,bench")
    ap.add_argument("--shapes", default="8,2048,bf16", help="'batch,seqlen,dtype;...' at H=32, D=128, causal")
    a = ap.parse_args()
    for shape in a.shapes.split(";"):
        batch, seqlen, dtype = shape.split(",")
        for run in range(a.runs):
            for confirm in a.confirm.split(","):   # alternating, so drift over the runs hits both alike
                out = subprocess.run([sys.executable, "-c", CHILD, batch, seqlen, dtype, confirm], capture_output=True, text=True)
                line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else \
                    json.dumps(dict(shape=shape, confirm=confirm, error=out.stderr.strip().splitlines()[-1:]))
                print(line, flush=True)
