"""Compile every forward-kernel candidate the benchmark's prefill grid will autotune, in parallel processes, before the
sweep: the autotuner then loads binaries from Triton's disk cache instead of compiling 10 (13 on sm_90) candidates per key one after
another (seconds each on the device's CPU). Measures nothing. GPU only.

    PYTHONPATH=. python3 tools/precompile.py --workers 15 [--dims 64,128] [--dtypes bf16,fp16]"""
import argparse, os, concurrent.futures, itertools, multiprocessing, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch
from triton_fa2.forward import _attention_forward, _gluon, _gpu_configs


def candidates() -> list:
    """The `tl` kernel's candidates, and on sm_90 the Gluon kernel's (notebook 11), which the autotuner times beside them,
    then the Gluon configs in $EXTRA_GLUON ("BLOCK_M,BLOCK_N,STAGES,num_warps,Q_IN_REGS,P_SMEM;...": experiments)."""
    hopper = _gluon is not None and torch.cuda.get_device_capability() == (9, 0)
    extra = [_gluon.GluonConfig(*(int(x) for x in c.split(","))) for c in os.environ.get("EXTRA_GLUON", "").split(";") if c]
    return _gpu_configs() + (list(_gluon.CANDIDATES) + extra if hopper else [])

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compile_one(task):
    "One launch of (head dim, causal, dtype, candidate) on a shape with the grid's specialisation (lengths % 16 == 0)."
    D, causal, dtype, index = task
    q, k, v = (torch.randn(1, 32, 512, D, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    try:
        _attention_forward(q, k, v, torch.empty_like(q), torch.empty(1, 32, 512, device="cuda"), causal, D ** -0.5,
                           config=candidates()[index])
        torch.cuda.synchronize()
        return None
    except Exception as e:                      # a candidate this GPU cannot run: the autotuner's pruning or timing says so
        return f"{task}: {type(e).__name__}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--dims", default="64,128"); ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--gluon-only", action="store_true", help="only the Gluon kernel's candidates (sm_90)")
    a = ap.parse_args()
    first = len(_gpu_configs()) if a.gluon_only else 0       # the Gluon candidates follow the `tl` kernel's
    tasks = [t for t in itertools.product(map(int, a.dims.split(",")), (False, True), a.dtypes.split(","), range(first, len(candidates())))
             if t[0] in getattr(candidates()[t[3]], "head_dims", (t[0],))]    # a Gluon candidate only where it is timed
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor(a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = [r for r in pool.map(compile_one, tasks) if r]
    print(f"precompiled {len(tasks) - len(failed)} of {len(tasks)} forward launches with {a.workers} processes in "
          f"{time.time() - t0:.0f} s" + (f"; not compiled: {failed}" if failed else ""), flush=True)
