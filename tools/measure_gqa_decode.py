"""GQA and decode figures for notebooks 05 and 06, measured side by side in one process on a GPU.

results/gqa.csv: GQA by indexing (ours, packed rows where the rule picks them, and forced unpacked) against
materialising repeated K/V first (`repeat_interleave`, then the same kernel as MHA, with and without the copy in the
time) and against SDPA's FLASH_ATTENTION backend with enable_gqa; K/V bytes read and the extra memory each needs.

results/decode_bandwidth.csv: decode (Lq = 1, full caches) at the four target shapes (`sweep=issue`) and over Lk, ours (num_splits by
the heuristic, and forced to 1) against SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends; bandwidth = bytes of
q, k, v, o over the median time, next to the device-to-device copy ceiling measured here.

Every provider is checked against the float32 reference (sampled heads) before it is timed. Medians after a warm-up
(compilation and autotuning excluded), twice: eager calls (triton.testing.do_bench: what a Python loop sees, including
launch overhead where it exceeds the GPU time) and CUDA-graph replay (do_bench_cudagraph: the GPU time alone). Inputs that fit in L2 (50 MB) are
rotated through several copies so that no timing reads a warm cache.

Usage (on a GPU): python tools/measure_gqa_decode.py --commit <sha> [--out-dir results]
"""
import argparse, csv, datetime, pathlib

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from triton_fa2.causal import attention_flops
from triton_fa2.dispatch import _attention_forward
from triton_fa2.interface import attention, decode
from triton_fa2.split_kv import _choose_num_splits
from triton_fa2.naive import attention_ref

HEAD = ["provider", "op", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal",
        "ms", "tflops", "tbps", "gpu", "torch", "triton", "commit", "date"]
L2_BYTES = 50 * 2 ** 20


def bench(fn, inputs):
    """(eager, graph) median ms of fn(*inputs[i]), cycling through the input sets; all sets are warmed up first.
    Eager: calls from Python, as a user's loop runs them (host launch overhead included when it exceeds the GPU time).
    Graph: one CUDA graph holding a call per input set, replayed; GPU time only, as a server's captured decode step."""
    for args in inputs: fn(*args)
    torch.cuda.synchronize()
    i = [0]
    def step():
        fn(*inputs[i[0] % len(inputs)]); i[0] += 1
    eager = triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median")
    graph = triton.testing.do_bench_cudagraph(lambda: [fn(*args) for args in inputs], rep=200, return_mode="median")
    return eager, graph / len(inputs)


def copies_for(nbytes):
    "How many input sets to rotate through so that the working set exceeds twice the L2."
    return max(1, min(8, -(-2 * L2_BYTES // max(nbytes, 1))))


def sampled_error(o, q, k, v, causal):
    B, Hq = q.shape[:2]; g = Hq // k.shape[1]; err = 0.0
    for b, h in {(0, 0), (B - 1, Hq - 1), (B // 2, Hq // 2)}:
        ref = attention_ref(q[b:b+1, h:h+1], k[b:b+1, h//g:h//g+1], v[b:b+1, h//g:h//g+1], causal=causal)[0]
        err = max(err, (o[b:b+1, h:h+1].float() - ref).abs().max().item() / max(1.0, ref.abs().max().item()))
    return err


def sdpa(backend, causal):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return run


def meta(args):
    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=args.commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))


def copy_ceiling():
    "Device-to-device copy of 1 GiB: bytes read + written over the median time, TB/s."
    src = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() / ms / 1e9


def make(B, Hq, Hkv, Lq, Lk, D, dtype, n):
    return [(torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype), torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype),
             torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype)) for _ in range(n)]


def run_provider(rows, name, fn, inputs, shape, causal, op, extra, sweep=None):
    B, Hq, Hkv, Lq, Lk, D, dtype = shape
    try:
        o = fn(*inputs[0])
        err = sampled_error(o, *inputs[0], causal)
        if not err < 2e-2: raise AssertionError(f"max error {err:.2e} against float32")
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        fn(*inputs[0]); torch.cuda.synchronize()
        extra_mem = torch.cuda.max_memory_allocated() - base
        ms, ms_graph = bench(fn, inputs)
        skip = ""
    except Exception as e:                                   # a provider that cannot run this shape says why
        ms = ms_graph = err = extra_mem = float("nan")
        skip = f"{type(e).__name__}: {str(e)[:120]}"
    isz = torch.finfo(dtype).bits // 8
    io_bytes = isz * (2 * B * Hq * Lq * D + 2 * B * Hkv * Lk * D)   # q, o, and K, V read once
    row = dict(provider=name, op=op, batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Lq, seqlen_k=Lk, head_dim=D,
               dtype="bf16" if dtype == torch.bfloat16 else "fp16", causal=int(causal), ms=f"{ms:.4f}",
               tflops=f"{attention_flops(B, Hq, Lq, Lk, D, causal) / ms / 1e9:.1f}", tbps=f"{io_bytes / ms / 1e9:.3f}",
               **extra, ms_graph=f"{ms_graph:.4f}", tbps_graph=f"{io_bytes / ms_graph / 1e9:.3f}",
               max_err_vs_ref=f"{err:.2e}", extra_mem_mb=f"{extra_mem / 2**20:.1f}", skip_reason=skip)
    if sweep is not None: row["sweep"] = sweep
    rows.append(row)
    print(f"{name:<22} {op} {shape[:6]} causal={int(causal)}: {row['ms']} ms ({row['ms_graph']} in a graph), {row['tflops']} TFLOP/s, "
          f"{row['tbps']} TB/s ({row['tbps_graph']} graph), "
          f"err {err:.1e}, extra {extra_mem / 2**20:.0f} MB {skip}", flush=True)


def gqa(args, m):
    rows = []
    for B, Hq, Hkv, Lq, Lk, D, causal in [(4, 32, 8, 4096, 4096, 128, True), (8, 32, 8, 1, 8192, 128, True),
                                          (8, 32, 8, 16, 8192, 128, True), (8, 32, 4, 128, 8192, 128, True)]:
        dtype = torch.bfloat16; shape = (B, Hq, Hkv, Lq, Lk, D, dtype); g = Hq // Hkv
        inputs = make(B, Hq, Hkv, Lq, Lk, D, dtype, copies_for(2 * B * Hkv * Lk * D * 2))
        op = "prefill" if Lq > 16 else "decode"           # SDPA's causal is top-left: only Lq = 1 (sees all) or Lq = Lk match ours
        def unpacked(q, k, v):
            o = torch.empty_like(q); lse = torch.empty(q.shape[:3], device="cuda")
            _attention_forward(q, k, v, o, lse, causal, D ** -0.5, pack_gqa=False); return o
        def packed(q, k, v):
            o = torch.empty_like(q); lse = torch.empty(q.shape[:3], device="cuda")
            _attention_forward(q, k, v, o, lse, causal, D ** -0.5, pack_gqa=True); return o
        repeat = lambda q, k, v: attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal=causal)
        pre = [(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) for q, k, v in inputs[:1]]
        kv_bytes = lambda heads: 2 * B * heads * Lk * D * 2
        for name, fn, ins, kv in [("triton_fa2 (indexed, packed)", packed, inputs, kv_bytes(Hkv)),
                                  ("triton_fa2 (indexed, unpacked)", unpacked, inputs, kv_bytes(Hkv)),
                                  ("repeat_interleave + MHA", repeat, inputs, kv_bytes(Hkv) + 2 * kv_bytes(Hq)),
                                  ("MHA on pre-repeated K/V", lambda q, k, v: attention(q, k, v, causal=causal), pre, kv_bytes(Hq)),
                                  ("sdpa_flash (enable_gqa)", sdpa(SDPBackend.FLASH_ATTENTION, causal and Lq > 1), inputs, kv_bytes(Hkv))]:
            run_provider(rows, name, fn, ins, shape, causal, op, dict(m, kv_hbm_mb_model=f"{kv / 2**20:.1f}"))
        del inputs, pre; torch.cuda.empty_cache()
    return rows


def decode_rows(args, m, copy_tbps):
    rows = []
    shapes = [("issue", B, Lk, Hq, Hkv, D) for B, Hq, Hkv, Lk, D in
              [(8, 32, 8, 8192, 128), (1, 32, 8, 32768, 128), (64, 32, 8, 4096, 128), (32, 32, 8, 16384, 128), (16, 16, 16, 3000, 64)]]
    shapes += [("seqlen", B, Lk, 32, 8, 128) for B in (1, 8) for Lk in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    for sweep, B, Lk, Hq, Hkv, D in shapes:
        dtype = torch.bfloat16; shape = (B, Hq, Hkv, 1, Lk, D, dtype)
        inputs = make(B, Hq, Hkv, 1, Lk, D, dtype, copies_for(2 * B * Hkv * Lk * D * 2))
        splits = _choose_num_splits(B, Hkv, Hq // Hkv, Lk, inputs[0][0].device)
        for name, fn in [("triton_fa2", lambda q, k, v: decode(q, k, v)),
                         ("triton_fa2 num_splits=1", lambda q, k, v: decode(q, k, v, num_splits=1)),
                         ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION, False)),   # Lq = 1: causal = sees every key
                         ("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, False))]:
            run_provider(rows, name, fn, inputs, shape, True, "decode",
                         dict(m, num_splits=splits if name == "triton_fa2" else (1 if name.startswith("triton") else ""),
                              copy_tbps=f"{copy_tbps:.3f}"), sweep=sweep)
        del inputs; torch.cuda.empty_cache()
    return rows


def write(rows, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = HEAD + [c for c in rows[0] if c not in HEAD]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, cols); w.writeheader(); w.writerows(rows)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out-dir", default="results")
    ap.add_argument("--only", choices=["gqa", "decode"], default=None)
    args = ap.parse_args()
    m = meta(args); out = pathlib.Path(args.out_dir)
    copy_tbps = copy_ceiling(); print(f"device copy: {copy_tbps:.3f} TB/s")
    if args.only in (None, "gqa"): write(gqa(args, m), out / "gqa.csv")
    if args.only in (None, "decode"): write(decode_rows(args, m, copy_tbps), out / "decode_bandwidth.csv")


if __name__ == "__main__":
    from triton_fa2.tuning import tuning
    with tuning():   # the tuned picks, as the benchmark measures
        main()
