"""The money shot (B=8, H=32, N=2048, D=128), causal and not, bf16 and fp16: our kernel
against SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends, one process, same inputs.

Median of triton.testing.do_bench after a warm-up that includes compilation and autotuning; each provider is checked
against the float32 reference (sampled heads) before it is timed; causal FLOPs count half. The inputs (134 MB per
tensor) are far larger than the 50 MB L2, so no rotation is needed. Writes a CSV with raw.csv's columns.

Usage (on a GPU): python tools/measure_forward.py --out results/forward_baseline.csv --commit <sha>
"""
import argparse, csv, datetime, pathlib

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from triton_fa2.causal import attention_flops
from triton_fa2.interface import attention, warmup
from triton_fa2.naive import attention_ref

COLUMNS = ["provider", "op", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal",
           "ms", "tflops", "tbps", "gpu", "torch", "triton", "commit", "date", "max_err_vs_ref", "config"]


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend): return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


PROVIDERS = {"triton_fa2": lambda q, k, v, causal: attention(q, k, v, causal=causal),
             "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def max_error(o, q, k, v, causal):
    "Max abs error against the float32 reference over a few (batch, head) pairs, corners included."
    B, H = q.shape[:2]
    err = 0.0
    for b, h in ((0, 0), (B - 1, H - 1), (B // 2, H // 2)):
        ref = attention_ref(q[b:b+1, h:h+1], k[b:b+1, h:h+1], v[b:b+1, h:h+1], causal=causal)[0]
        err = max(err, (o[b:b+1, h:h+1].float() - ref).abs().max().item())
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/forward_baseline.csv")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--shapes", default="8,32,2048,128")
    args = ap.parse_args()
    B, H, N, D = map(int, args.shapes.split(","))
    gpu, date = torch.cuda.get_device_name(), datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    rows = []
    for causal in (True, False):
        for dtype in (torch.bfloat16, torch.float16):
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
            config = warmup(q, k, v, causal=causal, tune=True).label
            flops = attention_flops(B, H, N, N, D, causal)
            for name, fn in PROVIDERS.items():
                o = fn(q, k, v, causal)                         # warm-up, and the output we check
                err = max_error(o, q, k, v, causal)
                assert err < 2e-2, (name, err)
                ms = triton.testing.do_bench(lambda: fn(q, k, v, causal), warmup=100, rep=500, return_mode="median")
                rows.append(dict(provider=name, op="prefill", batch=B, heads_q=H, heads_kv=H, seqlen_q=N, seqlen_k=N,
                                 head_dim=D, dtype=str(dtype)[6:].replace("bfloat16", "bf16").replace("float16", "fp16"),
                                 causal=int(causal), ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}",
                                 tbps=f"{4 * q.numel() * q.element_size() / ms / 1e9:.3f}", gpu=gpu,
                                 torch=torch.__version__, triton=triton.__version__, commit=args.commit, date=date,
                                 max_err_vs_ref=f"{err:.2e}", config=config if name == "triton_fa2" else ""))
                print(f"{name:<11} causal={causal!s:<5} {rows[-1]['dtype']}: {rows[-1]['ms']} ms, {rows[-1]['tflops']} TFLOP/s, err {err:.1e}")
    out = pathlib.Path(args.out); out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS); w.writeheader(); w.writerows(rows)
    by = {(r["provider"], r["causal"], r["dtype"]): float(r["tflops"]) for r in rows}
    for causal in (1, 0):
        for dt in ("bf16", "fp16"):
            ours = by[("triton_fa2", causal, dt)]
            print(f"causal={causal} {dt}: ours {ours:.0f} TFLOP/s = {ours / by[('sdpa_flash', causal, dt)]:.2f}× FA2, "
                  f"{ours / by[('sdpa_cudnn', causal, dt)]:.2f}× cuDNN")
    print("wrote", out)


if __name__ == "__main__":
    main()
