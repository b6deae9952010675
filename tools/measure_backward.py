"""Peak GPU memory of one forward + backward, ours against SDPA's FA2 and math backends, over sequence lengths, to
results/backward_memory.csv (chapter 12 plots it). Each provider's gradients are checked against a float32 reference
on one head first.

    python tools/measure_backward.py --out results/backward_memory.csv --commit $(git rev-parse --short HEAD)
"""
import argparse, csv, datetime, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton, triton_fa2
from triton_fa2.naive import attention_ref

PROVIDERS = {
    "triton_fa2": lambda q, k, v: triton_fa2.attention(q, k, v, causal=True),
    "sdpa_flash": lambda q, k, v: _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v),
    "sdpa_math": lambda q, k, v: _sdpa(SDPBackend.MATH, q, k, v),
}


def _sdpa(backend, q, k, v):
    with sdpa_kernel(backend): return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def check(fn, B=1, H=2, N=300, D=128):
    "Relative error of each gradient on a small case, against float32 autograd through the naive attention."
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    grads = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    refs = torch.autograd.grad(attention_ref(q32, k32, v32, causal=True, upcast=torch.float32)[0], (q32, k32, v32), do.float())
    return max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, refs))


def peak_mib(fn, B, H, N, D) -> float:
    "Peak memory above what the inputs and dO hold, over one forward and one backward."
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    torch.autograd.grad(fn(q, k, v), (q, k, v), do)          # warm-up: compile and tune outside the measurement
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
    del grads
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/backward_memory.csv")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--seqlens", default="1024,2048,4096,8192")
    a = p.parse_args(argv)
    B, H, D = 2, 16, 128
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=a.commit,
                date=datetime.date.today().isoformat())
    rows = []
    for name, fn in PROVIDERS.items():
        err = check(fn)
        print(f"{name}: max relative gradient error {err:.2e}", flush=True)
        if err > 3e-2: print(f"{name} fails the check; left out", file=sys.stderr); continue
        for N in map(int, a.seqlens.split(",")):
            try: mib = peak_mib(fn, B, H, N, D)
            except torch.OutOfMemoryError: continue
            finally: torch.cuda.empty_cache()
            rows.append(dict(provider=name, batch=B, heads=H, seqlen=N, head_dim=D, dtype="bf16", causal=True,
                             peak_mib=round(mib, 1), max_rel_grad_error=f"{err:.2e}", **meta))
            print(rows[-1], flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)


if __name__ == "__main__":
    main()
