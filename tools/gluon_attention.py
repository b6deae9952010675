"""Issue 6, sixth round: checks and timing of the Gluon kernel (now `triton_fa2.gluon`, notebook 11) with chosen
configs, beside the `tl` kernel and SDPA's FA2 and cuDNN backends, in one process. The kernel of runs 12–14 with
`--overlap-pv` (PV(t) left running into softmax(t+1), a register race: notebook 11) is this file at commit 1ff61fc.

    PYTHONPATH=. python3 tools/gluon_attention.py            # GPU: check against float32, time against the shipped kernel
    PYTHONPATH=. python3 tools/gluon_attention.py --compile  # CPU: compile for sm_90, print registers and the SASS counts
"""
import os, sys, argparse
import torch, triton
import triton_fa2.forward as fwd
from triton_fa2.gluon import GluonConfig, _compile_sm90, sm90_reports
from triton_fa2.runtime import cuobjdump


def attention_gluon(q, k, v, causal=False, scale=None, BLOCK_M=64, BLOCK_N=64, STAGES=3, num_warps=4, q_in_regs=False, p_smem=False,
                    poison=False):
    "q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D); returns (o, lse), through the package's launch with one Gluon config."
    B, H, Lq, D = q.shape
    o = torch.full_like(q, float("nan")) if poison else torch.empty_like(q)   # poisoned: an unwritten element reads NaN
    lse = torch.full((B, H, Lq), float("nan"), device=q.device) if poison else torch.empty(B, H, Lq, device=q.device)
    fwd._attention_forward(q, k, v, o, lse, causal, D ** -0.5 if scale is None else scale,
                           config=GluonConfig(BLOCK_M, BLOCK_N, STAGES, num_warps, bool(q_in_regs), bool(p_smem)))
    return o, lse


def _reference(q, k, v, causal, scale):
    "float32 attention and LSE, bottom-right causal (as the kernel)."
    qf, kf, vf = q.float(), k.float(), v.float()
    if k.shape[1] != q.shape[1]:
        kf, vf = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (kf, vf))
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        Lq, Lk = q.shape[2], k.shape[2]
        keep = torch.arange(Lk, device=q.device)[None, :] <= torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.nan_to_num(torch.softmax(s, -1)) @ vf, lse


def check_against_float32(run, B, H, Lq, Lk, D, causal, dtype, label="", overflow=False) -> bool:
    """One check of `run(q, k, v, causal)` → (o, lse) on fresh inputs against float32: O within 2e-2, LSE within 1e-3
    where a row sees a key and −inf where it sees none, no NaN; prints what failed. `overflow`: key 0 scores ~1500 above
    the diagonal's maximum, so a maximum fixed by the masked run overflows P in the unmasked tiles (blocks past the
    first) and the block must be redone online (O checked; LSE, in the hundreds there, only for NaN)."""
    torch.manual_seed(2 if overflow else 1)
    q = torch.randn(B, H, Lq, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, H, Lk, D, device="cuda", dtype=dtype) for _ in range(2))
    if overflow: q, k[:, :, 0] = q.abs(), 30.0
    try:
        o, lse = run(q, k, v, causal)
        torch.cuda.synchronize()
        ref, ref_lse = _reference(q, k, v, causal, D ** -0.5)
        err = (o.float() - ref).abs().max().item()
        seen = torch.isfinite(ref_lse)
        lse_err = (lse - ref_lse)[seen].abs().max().item() if seen.any() and not overflow else 0.0
        good = err <= 2e-2 and lse_err <= 1e-3 and not o.isnan().any().item() and bool((lse[~seen] == float("-inf")).all()) and not lse.isnan().any().item()
    except Exception as e:
        err, lse_err, good = float("nan"), float("nan"), False
        print("   error", label, (B, H, Lq, Lk, D, causal), type(e).__name__, str(e)[:300], flush=True)
    if not good: print(f"   WRONG {label} {dtype} {(B, H, Lq, Lk, D, causal)} err {err:.3e} lse {lse_err:.3e}", flush=True)
    return good


def gpu_check_and_time(configs, out, commit="unknown"):
    "Every config on odd shapes against float32 (poisoned outputs), then the timing shapes against the shipped kernel."
    ok_all = True
    checks = [(1, 2, 17, 64, True), (2, 4, 1000, 128, True), (2, 4, 1000, 128, False), (1, 2, 300, 128, True, 700),
              (1, 2, 700, 64, True, 300), (2, 8, 2048, 128, True), (1, 1, 1, 128, False)] + [(2, 4, 4096, 64, True)] * 3 \
             + [(4, 8, 4096, 128, True), (8, 32, 2048, 64, True)]          # long rows, repeated: races show there
    for cfg in configs:
        bm, bn, st, nw, *qr = cfg
        for dtype in (torch.bfloat16, torch.float16):
            for B, H, Lq, D, causal, *lk in checks:
                shape = (B, H, Lq, lk[0] if lk else Lq, D, causal)
                run = lambda q, k, v, causal: attention_gluon(q, k, v, causal, BLOCK_M=bm, BLOCK_N=bn, STAGES=st, num_warps=nw,
                                                              q_in_regs=bool(qr and qr[0]), p_smem=len(qr) > 1 and bool(qr[1]), poison=True)
                good = check_against_float32(run, *shape, dtype, label=cfg)
                ok_all &= good
            ok_all &= check_against_float32(run, 2, 2, 512, 512, 64, True, dtype, label=f"{cfg} overflow fallback", overflow=True)
        print(f"checked {cfg}", flush=True)
    print("ALL CHECKS PASSED" if ok_all else "SOME CHECKS FAILED", flush=True)
    def gluon_runs(q, k, v, causal):
        return {"gluon " + "x".join(map(str, cfg)): (lambda cfg=cfg: attention_gluon(
            q, k, v, causal, BLOCK_M=cfg[0], BLOCK_N=cfg[1], STAGES=cfg[2], num_warps=cfg[3], q_in_regs=len(cfg) > 4 and bool(cfg[4]),
            p_smem=len(cfg) > 5 and bool(cfg[5]))) for cfg in configs}
    time_against_yardsticks(gluon_runs, out, commit, autotuned=not os.environ.get("NO_AUTOTUNED"))   # short calls: configs alone


TIMING_SHAPES = [(8, 32, 2048, 128, True, torch.bfloat16), (8, 32, 2048, 128, False, torch.bfloat16),
                 (8, 32, 2048, 64, True, torch.bfloat16), (8, 32, 2048, 128, True, torch.float16),
                 (1, 32, 16384, 128, True, torch.bfloat16), (4, 32, 4096, 64, False, torch.bfloat16),
                 (1, 32, 16384, 64, True, torch.bfloat16)]


def time_against_yardsticks(extra_runs, out, commit="unknown", autotuned=True):
    """The timing shapes in one process: SDPA's FA2 and cuDNN backends, the package's pick (`autotuned`) and the runs
    `extra_runs(q, k, v, causal)` returns by name, eager (`do_bench`) and GPU time (CUDA graphs); the rows go to `out`."""
    import csv, datetime
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import triton_fa2
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows = []
    only_d = int(os.environ.get("TIMING_D", 0))       # e.g. TIMING_D=64: the D = 64 timing shapes alone
    for B, H, N, D, causal, dtype in TIMING_SHAPES:
        if only_d and D != only_d: continue
        if os.environ.get("TIMING_CAUSAL", "") not in ("", str(int(causal))): continue   # TIMING_CAUSAL=0: non-causal shapes alone
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        def sdpa(backend):
            def run():
                with sdpa_kernel(backend): return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return run
        runs = {"sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
        if autotuned: runs["triton_fa2"] = lambda: triton_fa2.attention(q, k, v, causal=causal)
        runs.update(extra_runs(q, k, v, causal))
        for name, fn in runs.items():
            row = dict(B=B, H=H, N=N, D=D, causal=int(causal), dtype=str(dtype).split(".")[-1], provider=name, **meta)
            try:
                fn(); torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                torch.cuda.synchronize()
                ms_graph = triton.testing.do_bench_cudagraph(fn, rep=100)   # GPU time: no host launch cost in it
                row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}", ms_graph=f"{ms_graph:.4f}")
            except Exception as e:
                row.update(ms="", tflops="", ms_graph="")
                print("   error", name, type(e).__name__, str(e)[:200], flush=True)
            rows.append(row)
            print(f"({B}, {H}, {N}, {D}) {row['dtype']} {'causal' if causal else 'full'} {name:<44} {row['tflops']} TFLOP/s"
                  f"  (graph {row['ms_graph']} ms)", flush=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0])); w.writeheader(); w.writerows(rows)


def gpu_grid(configs, out, commit="unknown"):
    "The bf16 prefill grid (B 1/8/32, N 512/2048/8192, D 64/128, causal and not): each Gluon config against the shipped kernel and FA2, one process."
    import csv, datetime, itertools
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import triton_fa2
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows = []
    for B, N, D, causal in itertools.product((1, 8, 32), (512, 2048, 8192), (64, 128), (True, False)):
        q, k, v = (torch.randn(B, 32, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * 32 * N * N * D / (2 if causal else 1)
        def fa2():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION): return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        runs = {"sdpa_flash": fa2, "triton_fa2": lambda: triton_fa2.attention(q, k, v, causal=causal)}
        for cfg in configs:
            runs["gluon " + "x".join(map(str, cfg))] = (lambda cfg=cfg: attention_gluon(
                q, k, v, causal, BLOCK_M=cfg[0], BLOCK_N=cfg[1], STAGES=cfg[2], num_warps=cfg[3], q_in_regs=len(cfg) > 4 and bool(cfg[4]), p_smem=len(cfg) > 5 and bool(cfg[5])))
        ref = fa2().float()
        for name, fn in runs.items():
            row = dict(B=B, H=32, N=N, D=D, causal=int(causal), dtype="bf16", provider=name, ms="", tflops="", max_err="", **meta)
            try:
                o = fn(); o = o[0] if isinstance(o, tuple) else o
                row["max_err"] = f"{(o.float() - ref).abs().max().item():.2e}"
                ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}")
            except Exception as e:
                print("   error", name, (B, N, D, causal), type(e).__name__, str(e)[:200], flush=True)
            rows.append(row)
        mine = {r["provider"]: r for r in rows[-len(runs):]}
        print(f"({B}, 32, {N}, {D}) {'causal' if causal else 'full'}: " + ", ".join(f"{n} {r['tflops']}" for n, r in mine.items()), flush=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0])); w.writeheader(); w.writerows(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--config", default="64,64,3,4", help="BLOCK_M,BLOCK_N,STAGES,num_warps")
    ap.add_argument("--shape", default="8,32,2048,128")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--configs", default="64,64,3,4;64,64,2,4;64,128,2,4;128,64,2,8;128,64,3,8")
    ap.add_argument("--out", default="gluon_attention.csv"); ap.add_argument("--commit", default="unknown")
    ap.add_argument("--grid", action="store_true", help="time the configs over the bf16 prefill grid instead")
    a = ap.parse_args()
    bm, bn, st, nw, *qr = (int(x) for x in a.config.split(","))
    B, H, N, D = (int(x) for x in a.shape.split(","))
    if a.compile:   # CPU: compile for sm_90, print registers, spills and wgmma hazards; SASS_OUT=file keeps the SASS
        config = GluonConfig(bm, bn, st, nw, bool(qr and qr[0]), len(qr) > 1 and bool(qr[1]))
        dtype = torch.bfloat16
        print(sm90_reports([config], D, bool(a.causal), dtype))
        if os.environ.get("SASS_OUT"):
            kern = _compile_sm90(config, B, H, N, D, bool(a.causal), dtype)
            open(os.environ["SASS_OUT"], "w").write(cuobjdump(kern))
    elif a.grid:
        gpu_grid([tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")], a.out, a.commit)
    else:
        gpu_check_and_time([tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")], a.out, a.commit)
