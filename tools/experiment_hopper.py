"""Kernel variants on the GPU (notebook 09): both tile sources (tensor descriptors, pointers) × every candidate config ×
a few extra configs on a few prefill shapes, each launch checked against SDPA's FLASH backend before it is timed in
short bursts (`do_bench` with 10 ms of warm-up and 50 ms of timed calls). Prints the best config per (shape, variant)
and writes every row, with the GPU, versions, commit and date.

    PYTHONPATH=. python3 tools/experiment_hopper.py --out $OUT/hopper_paths.csv --seconds 300 --commit SHA --workers 15

Extra configs may carry a register cap (a fifth number, Triton's `maxnreg`), e.g. to fit two 8-warp programs on
an SM; `--paths descriptors+gemm_only` (alone in its process) replaces the softmax by one multiply per score, which
gives wrong answers (not checked) and the loop's time without the softmax: a ceiling for what cheaper softmax could give;
`--paths descriptors+fixed_max` keeps the exponentials, masks and sum but not the running max and its rescale;
`--paths descriptors+persistent` runs the same body as a persistent kernel fed by an atomic counter (`_persistent_kernel`).
Each shape also times SDPA's FLASH and cuDNN backends (variant `sdpa_flash`, `sdpa_cudnn`), for ratios from one process."""
import argparse, csv, datetime, itertools, os, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import triton.language as tl
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton_fa2.forward import _INTERPRETER_CONFIG, _attention_forward, _gpu_configs, _shape, _softmax_step
from triton_fa2.naive import attention_ref

GPU = torch.cuda.is_available()      # without one: a smoke test of this script on tiny shapes in the interpreter

SHAPES = [  # (B, H, N, D, causal, dtype): the money shot, its non-causal twin, a long causal one, head dim 64, fp16
    (8, 32, 2048, 128, True, "bf16"), (8, 32, 2048, 128, False, "bf16"), (1, 32, 16384, 128, True, "bf16"),
    (8, 32, 2048, 64, True, "bf16"), (8, 32, 2048, 128, True, "fp16"), (8, 32, 512, 128, False, "bf16"),  # … short rows
    (4, 32, 4096, 64, False, "bf16"), (1, 32, 16384, 64, True, "bf16")]                                      # D = 64's long rows
PATHS = [{"use_tma": True, "fixed_max": True}, {"use_tma": False, "fixed_max": True}]   # tensor descriptors, pointers


def variant_of(name):
    """'descriptors', 'pointers' (the kernel as shipped: each row's maximum fixed by the masked run), 'descriptors+online'
    (the running maximum on every tile), 'descriptors+gemm_only', 'descriptors+fixed_max' (a maximum fixed
    at 8, right on random inputs only) or 'descriptors+persistent': keyword arguments of _attention_forward."""
    swap = name.removeprefix("descriptors+")
    assert name in ("descriptors", "pointers", "descriptors+online") or swap in SWAPS, name
    if swap in SWAPS: _swap(swap)
    return {"use_tma": name != "pointers",
            "fixed_max": name in ("descriptors", "pointers", "descriptors+persistent") or swap.startswith("poly_exp")}


@triton.jit
def _gemm_only_step(qk, m_i, l_i, cols, offs_m, seqlen_k, diag_offset, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, FOLD_SCALE: tl.constexpr, FIXED_MAX: tl.constexpr = False):
    "P = S·s, α = 1: the same loop, tiles and dots, no max or exp2 (wrong answers)."
    return qk * qk_scale, tl.full(m_i.shape, 1.0, tl.float32), m_i, l_i


@triton.jit
def _fixed_max_step(qk, m_i, l_i, cols, offs_m, seqlen_k, diag_offset, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, FOLD_SCALE: tl.constexpr, FIXED_MAX: tl.constexpr = False):
    """P = 2^(S·s − 8) with the masks and the row sum, but a fixed row maximum: no running max, no rescale (α = 1).
    Right for scores whose base-2 logits stay far from 8 + 128 (these random inputs); the LSE is not."""
    if MASKED:
        visible = cols[None, :] < seqlen_k
        if CAUSAL: visible = visible & (cols[None, :] <= offs_m[:, None] + diag_offset)
        qk = tl.where(visible, qk, float("-inf"))
    p = tl.math.exp2(qk * qk_scale - 8.0)
    return p, tl.full(m_i.shape, 1.0, tl.float32), m_i, l_i + tl.sum(p, 1)


@triton.jit
def _exp2_fma(x):
    """2^x on the FMA and integer pipes instead of the special-function unit (FA4's trick): x = n + f with n an integer and
    |f| ≤ ½ (adding 1.5·2²³ rounds x into the low mantissa bits of t), 2^f by a degree-3 polynomial (relative error
    7.5e-5, Lawson-fitted on [−½, ½]), n added to its exponent bits. Clamped to [−126, 129]: below −126 it returns about
    2^−126 (n = −127 would borrow from the sign bit), nothing beside the row maximum's 1; from 128 on it returns inf or NaN,
    never a finite number, so the kernel's overflow check still sees it; NaN goes to 129 (min returns the number), so a
    NaN score is still caught and redone online."""
    x = tl.maximum(tl.minimum(x, 129.0), -126.0)
    t = x + 12582912.0
    f = x - (t - 12582912.0)
    p = ((0.05517166853 * f + 0.24261114001) * f + 0.69326096773) * f + 0.99992805719
    return ((t.to(tl.uint32, bitcast=True) << 23) + p.to(tl.uint32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def _split_columns(x):
    "A (rows, cols) tile as its left and right halves of columns (registers only in the wgmma layout, as in Triton's tutorial)."
    rows: tl.constexpr = x.shape[0]
    cols: tl.constexpr = x.shape[1]
    return x.reshape([rows, 2, cols // 2]).permute(0, 2, 1).split()


@triton.jit
def _join_columns(left, right):
    rows: tl.constexpr = left.shape[0]
    cols: tl.constexpr = left.shape[1]
    return tl.join(left, right).permute(0, 2, 1).reshape([rows, 2 * cols])


@triton.jit
def _exp2_mixed(x, FMA_EIGHTHS: tl.constexpr):
    "2^x with FMA_EIGHTHS/8 of the columns (4, 2 or 1) on the FMA pipe (`_exp2_fma`), the rest on MUFU.EX2."
    left, right = _split_columns(x)
    if FMA_EIGHTHS == 4:
        right = _exp2_fma(right)
    else:
        right_left, right_right = _split_columns(right)
        if FMA_EIGHTHS == 2:
            right_right = _exp2_fma(right_right)
        else:
            tl.static_assert(FMA_EIGHTHS == 1)
            rr_left, rr_right = _split_columns(right_right)
            right_right = _join_columns(tl.math.exp2(rr_left), _exp2_fma(rr_right))
        right = _join_columns(tl.math.exp2(right_left), right_right)
    return _join_columns(tl.math.exp2(left), right)


_shipped_step = _softmax_step                  # forward's own, kept before any swap replaces it
POLY_FMA_EIGHTHS = tl.constexpr(2)             # set by the poly_exp swaps (one per process) before anything compiles


@triton.jit
def _poly_exp_step(qk, m_i, l_i, cols, offs_m, seqlen_k, diag_offset, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, FOLD_SCALE: tl.constexpr, FIXED_MAX: tl.constexpr = False):
    "The shipped softmax step with POLY_FMA_EIGHTHS/8 of the unmasked tiles' exponentials on the FMA pipe; masked tiles unchanged."
    if FIXED_MAX:
        p = _exp2_mixed(qk * qk_scale - m_i[:, None], POLY_FMA_EIGHTHS)
        return p, tl.full(m_i.shape, 1.0, tl.float32), m_i, l_i + tl.sum(p, 1)
    return _shipped_step(qk, m_i, l_i, cols, offs_m, seqlen_k, diag_offset, qk_scale, MASKED, CAUSAL, FOLD_SCALE, FIXED_MAX)


def _use_poly_exp(fma_eighths):
    def swap(fwd):
        globals()["POLY_FMA_EIGHTHS"] = tl.constexpr(fma_eighths)
        fwd._softmax_step = _poly_exp_step
    return swap


def _persistent_kernel():
    """`_attn_fwd` made persistent, from its own source (so it is the same body, not a copy that could drift): each
    program takes the next Q block from an atomic counter until none is left. Blocks are numbered as the grid numbers
    its programs (a head's blocks together, longest first when causal), so the counter hands out the longest blocks
    first and a program that drew short ones draws more: FA3's dynamic scheduler, without its warp specialisation."""
    import importlib.util, inspect, tempfile, textwrap
    import triton_fa2.forward as fwd
    source = inspect.getsource(fwd._attn_fwd.fn)
    head, body = source.split("    pid = tl.program_id(0)\n")
    assert head.count("def _attn_fwd(Q, K, V, O, LSE,") == 1 and "program_id" not in body
    head = head.replace("def _attn_fwd(Q, K, V, O, LSE,", "def _attn_fwd_persistent(Counter, num_tiles, Q, K, V, O, LSE,")
    head = head.replace('do_not_specialize=["num_heads_q"', 'do_not_specialize=["num_tiles", "num_heads_q"')
    loop = ("    pid = tl.atomic_add(Counter, 1)\n    while pid < num_tiles:\n"
            "        next_pid = tl.atomic_add(Counter, 1)       # asked early: its latency hides behind this block\n"
            + textwrap.indent(body, "    ") + "        pid = next_pid\n")
    path = os.path.join(tempfile.mkdtemp(), "attn_fwd_persistent.py")   # Triton reads a kernel's source from its file
    with open(path, "w") as f:
        f.write("import triton_fa2.forward as _fwd\nglobals().update({k: v for k, v in vars(_fwd).items() if not k.startswith('__')})\n"
                + head + loop)
    spec = importlib.util.spec_from_file_location("attn_fwd_persistent", path)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    return module._attn_fwd_persistent


class _PersistentLaunch:
    "Stands in for `_attn_fwd` in `_attention_forward`: `kernel[grid](*args)` runs the persistent kernel instead."
    PROGRAMS_PER_SM = 4              # more than fit: programs that start after the counter ran out return at once

    def __init__(self): self.kernel = _persistent_kernel()

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            tiles = grid(kwargs)[0]
            sms = torch.cuda.get_device_properties().multi_processor_count if GPU else 2
            counter = torch.zeros(1, dtype=torch.int32, device=args[4].device)   # a memset per call, timed with it
            return self.kernel[(min(tiles, sms * self.PROGRAMS_PER_SM),)](counter, tiles, *args, **kwargs)
        return launch


def _use_step(step): return lambda fwd: setattr(fwd, "_softmax_step", step)

SWAPS = {"gemm_only": _use_step(_gemm_only_step), "fixed_max": _use_step(_fixed_max_step),   # name → what it replaces
         "persistent": lambda fwd: setattr(fwd, "_attn_fwd", _PersistentLaunch()),
         **{f"poly_exp_{k}of8": _use_poly_exp(k) for k in (1, 2, 4)}}
SWAP = None           # the swap's name, if any; its answers are checked unless it is gemm_only

def _swap(name):
    "Swap the softmax step or the kernel before anything compiles (the precompiling processes do the same, through the environment)."
    global SWAP
    import triton_fa2.forward as fwd
    SWAPS[name](fwd)
    SWAP = name
    os.environ["EXPERIMENT_SWAP"] = name


def name_of(variant):
    if not variant["use_tma"]: return "pointers"
    return f"descriptors+{SWAP}" if SWAP else "descriptors" if variant["fixed_max"] else "descriptors+online"


EXTRA = [(128, 64, 8, 2), (128, 128, 8, 4), (64, 128, 4, 2), (128, 64, 4, 4), (128, 64, 8, 4), (64, 64, 4, 4),
         (128, 32, 4, 4), (64, 64, 4, 2),    # beyond the autotuner's candidates; then, for two or three programs per SM:
         (128, 64, 8, 2, 128), (128, 128, 8, 2, 128), (128, 32, 8, 3), (128, 32, 8, 4), (64, 32, 4, 3), (64, 32, 4, 4),
         (128, 64, 4, 3, 168), (128, 64, 4, 2, 168)]   # D = 64: three 4-warp programs per SM (3 × 128 × 168 ≤ 64 K)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


ONLY = []            # --configs: labels to keep (all when empty), passed to the precompiling processes in the environment

def _read_only(): ONLY[:] = [c.strip() for c in os.environ.get("EXPERIMENT_CONFIGS", "").split(",") if c.strip()]

def _configs():
    if not GPU: return [_INTERPRETER_CONFIG]
    configs = _gpu_configs() + [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=s, maxnreg=r[0] if r else None,
                                           pre_hook=_gpu_configs()[0].pre_hook) for m, n, w, s, *r in EXTRA]
    return [c for c in configs if not ONLY or _label(c) in ONLY]


def _label(config):
    return "{}x{} w{} s{}".format(*_shape(config)) + (f" r{config.maxnreg}" if config.maxnreg else "")


_INPUTS = {}

def _compile_one(task):
    "A worker's job: one launch of (shape, variant, config index), so that its binary lands in Triton's disk cache."
    (B, H, N, D, causal, dtype), variant, index = task
    if os.environ.get("EXPERIMENT_SWAP") and not SWAP: _swap(os.environ["EXPERIMENT_SWAP"])
    _read_only()
    if (B, H, N, D, dtype) not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[(B, H, N, D, dtype)] = [torch.randn(B, H, N, D, device="cuda", dtype=DTYPES[dtype]) for _ in range(3)]
    q, k, v = _INPUTS[(B, H, N, D, dtype)]
    try:
        _attention_forward(q, k, v, torch.empty_like(q), torch.empty(B, H, N, device="cuda"), causal, D ** -0.5,
                           config=_configs()[index], pack_gqa=False, **variant)
        torch.cuda.synchronize()
    except Exception: pass            # the timing pass records the error


def precompile(shapes, variants, workers):
    "Compile every (shape, variant, config) in parallel processes first: the timing pass then loads binaries from disk."
    import concurrent.futures, multiprocessing
    tasks = [(shape, variant, i) for shape in shapes for variant in variants for i in range(len(_configs()))]
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_one, tasks, chunksize=4))
    print(f"precompiled {len(tasks)} launches with {workers} processes in {time.time() - t0:.0f} s", flush=True)


def main(out, seconds, commit, workers=0, shapes=None, variants=None):
    start = time.time()
    shapes = (shapes or SHAPES) if GPU else [(1, 2, 40, 32, True, "bf16"), (1, 2, 40, 32, False, "fp16")]
    variants = variants or PATHS
    if GPU and workers: precompile(shapes, variants, workers)
    configs = _configs()
    meta = dict(gpu=torch.cuda.get_device_name() if GPU else "cpu (interpreter)", torch=torch.__version__, triton=triton.__version__, commit=commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows, writer = [], None
    f = open(out, "w", newline="")

    def emit(row):
        nonlocal writer
        rows.append(row)
        if writer is None: writer = csv.DictWriter(f, list(row)); writer.writeheader()
        writer.writerow(row); f.flush()
    for (B, H, N, D, causal, dtype), variant in itertools.product(shapes, variants):
        torch.manual_seed(0)
        device = "cuda" if GPU else "cpu"
        q, k, v = (torch.randn(B, H, N, D, device=device, dtype=DTYPES[dtype]) for _ in range(3))
        if GPU:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION): ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else: ref = attention_ref(q, k, v, causal=causal)[0]
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        o, lse = torch.empty_like(q), torch.empty(B, H, N, device=device)
        if GPU and variant is variants[0]:                   # the yardsticks, once per shape, in this process
            for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                row = dict(B=B, H=H, N=N, D=D, causal=int(causal), dtype=dtype, variant=name, config="",
                           ms="", tflops="", max_err="", error="", **meta)
                def yardstick(backend=backend):
                    with sdpa_kernel(backend): return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                try:
                    row["max_err"] = f"{(yardstick().float() - ref.float()).abs().max().item():.2e}"
                    ms = triton.testing.do_bench(yardstick, warmup=10, rep=50, return_mode="median")
                    row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}")
                except Exception as e: row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                emit(row)
                print(f"({B}, {H}, {N}, {D}) {dtype} {'causal' if causal else 'full'} {name:<40} {row['tflops'] or row['error']} TFLOP/s", flush=True)
        for config in configs:
            if time.time() - start > seconds: print("stopped at the time limit"); f.close(); return rows
            row = dict(B=B, H=H, N=N, D=D, causal=int(causal), dtype=dtype, variant=name_of(variant),
                       config=_label(config), ms="", tflops="", max_err="", error="", **meta)
            run = lambda: _attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=config, pack_gqa=False, **variant)
            try:
                o.fill_(float("nan")); run()
                if GPU: torch.cuda.synchronize()
                err = (o.float() - ref.float()).abs().max().item()
                row["max_err"] = f"{err:.2e}"
                if not err <= (5e-2 if SWAP and not SWAP.startswith("poly_exp") else 2e-2) and SWAP != "gemm_only": row["error"] = "wrong result"
                elif GPU:
                    ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}")
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            emit(row)
        mine = rows[-len(configs):]
        best = max((r for r in mine if r["tflops"]), key=lambda r: float(r["tflops"]), default=None)
        print(f"({B}, {H}, {N}, {D}) {dtype} {'causal' if causal else 'full'} {row['variant']:<40} best "
              + (f"{best['tflops']} TFLOP/s with {best['config']}" if best else "none ran")
              + f"   [{sum(1 for r in mine if r['error'])} of {len(mine)} configs failed: "
              + "; ".join(sorted({r['error'][:80] for r in mine if r['error']})) + "]", flush=True)
    f.close()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="hopper_variants.csv"); ap.add_argument("--seconds", type=float, default=480)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--workers", type=int, default=0, help="processes that compile every launch before timing (GPU)")
    ap.add_argument("--paths", default="descriptors,pointers", help="tile sources to measure")
    ap.add_argument("--shapes", default="", help="indices into SHAPES, e.g. 0,1; default: all")
    ap.add_argument("--configs", default="", help="labels to time, e.g. '64x64 w4 s3,128x64 w4 s2'; default: all")
    a = ap.parse_args()
    os.environ["EXPERIMENT_CONFIGS"] = a.configs
    _read_only()
    swapped = [p for p in a.paths.split(",") if p.removeprefix("descriptors+") in SWAPS]
    assert not swapped or a.paths == swapped[0], "a swapped softmax step applies to the whole process: run it alone"
    variants = [variant_of(p) for p in a.paths.split(",")]
    shapes = [SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else None
    main(a.out, a.seconds, a.commit, a.workers, shapes, variants)
