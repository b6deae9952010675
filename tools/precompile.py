"""Compile every prefill candidate the benchmark's grid will time, in parallel processes, before the sweep: the dispatcher
then loads binaries from Triton's disk cache instead of compiling a dozen candidates per key one after another (seconds
each on the device's CPU). Measures nothing. GPU only.

    PYTHONPATH=. python3 tools/precompile.py --workers 15 [--dims 64,128] [--dtypes bf16,fp16] [--gluon-only]"""
import argparse, concurrent.futures, itertools, multiprocessing, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch
from triton_fa2 import candidates as cands
from triton_fa2.dispatch import _attention_forward

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def candidates(gluon_only:bool=False) -> list:
    "The `tl` kernel's candidates, and on sm_90 the Gluon kernels', which the dispatcher times beside them."
    hopper = torch.cuda.get_device_capability() == (9, 0)
    return ([] if gluon_only else list(cands.PREFILL_TL)) + (list(cands.PREFILL_GLUON) if hopper else [])


def timed_at(candidate, head_dim:int) -> bool:
    "Whether the dispatcher times this candidate at this head dim."
    if candidate.kernel == "tl": return head_dim in cands.TUNED_HEAD_DIMS or candidate in cands.ANY_HEAD_DIM
    return head_dim in (cands.WARP_SPECIALIZED_HEAD_DIMS if candidate.WARP_SPECIALIZE else cands.GLUON_HEAD_DIMS)


def compile_one(task):
    "One launch of (head dim, causal, dtype, candidate) on a shape with the grid's specialisation (lengths % 16 == 0)."
    D, causal, dtype, candidate = task
    q, k, v = (torch.randn(1, 32, 512, D, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    try:
        _attention_forward(q, k, v, torch.empty_like(q), torch.empty(1, 32, 512, device="cuda"), causal, D ** -0.5, config=candidate)
        torch.cuda.synchronize()
        return None
    except Exception as e:                      # a candidate this GPU cannot run: the dispatcher leaves it out too
        return f"{candidate.label} D={D}: {type(e).__name__}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python tools/precompile.py")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--dims", default="64,128"); ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--gluon-only", action="store_true", help="only the Gluon kernels' candidates (sm_90)")
    a = ap.parse_args()
    tasks = [(D, causal, dtype, c) for D, causal, dtype, c in
             itertools.product(map(int, a.dims.split(",")), (False, True), a.dtypes.split(","), candidates(a.gluon_only))
             if timed_at(c, D)]
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor(a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = [r for r in pool.map(compile_one, tasks) if r]
    print(f"precompiled {len(tasks) - len(failed)} of {len(tasks)} prefill launches with {a.workers} processes in "
          f"{time.time() - t0:.0f} s" + (f"; not compiled: {failed}" if failed else ""), flush=True)
