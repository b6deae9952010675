"""Issue 6, the next lever after run 22: configs of the warp-specialised Gluon kernel (since run 23 in the package,
notebook 11's `_attn_fwd_ws`; this tool runs any of its configs, online or not) with cuDNN's and FA3's
schedule. One program owns 128 query rows and runs three partitions (`gl.warp_specialize`): a producer warp that only
issues TMA loads of Q, K and V into shared-memory rings, and two consumer warpgroups of 64 rows each, which share every
K/V tile (half the loads per row of the shipped kernel's two 64-row programs per SM) and get most of the registers
(`setmaxnreg`, through `worker_num_regs` and `maxnreg`). Each consumer runs FA3's intra-warpgroup order: issue QKᵀ(t+1)
and PV(t), wait for QKᵀ(t+1) only, softmax(t+1) while PV(t) runs (P through shared memory, as notebook 11's `P_SMEM`,
so no register is live under PV(t) but its accumulator), then wait for PV(t) and rescale. The softmax is online on
every tile, or (`FIXED_MAX`) on the masked run only, each row's maximum from it then fixed for the unmasked tiles as in
the package's kernels; if P overflowed, the consumer redoes its block online, loading its own tiles into ring slot `me`
once both consumers are done with the rings (a barrier of count 2).
Optional ping-pong (`PINGPONG`): the consumers take turns issuing their products, so one's softmax runs under the
other's products (FA3's inter-warpgroup overlap), ordered by two mbarriers.

    PYTHONPATH=. python3 tools/gluon_ws_attention.py --compile          # CPU: compile for sm_90, registers, spills, SASS counts
    PYTHONPATH=. python3 tools/gluon_ws_attention.py --commit SHA --out ws.csv   # GPU: checks against float32, then timing
"""
import argparse, os, re, sys, time
import torch, triton
from triton_fa2.forward import LOG2E
from triton_fa2.gluon import _attn_fwd_ws, _ws_maxnreg as maxnreg_for, _descriptor, wgmma_hazards
from triton_fa2.runtime import compile_for_gpu, cuobjdump
sys.path.insert(0, os.path.dirname(__file__))
from gluon_attention import check_against_float32, time_against_yardsticks

ROWS = 64          # rows per consumer warpgroup; a program owns CONSUMERS · ROWS
ONLY_D = int(os.environ.get("TIMING_D", 0))   # TIMING_D=64: checks, smoke and timing at that head dim alone
ONLY_CAUSAL = os.environ.get("TIMING_CAUSAL", "")   # "0": non-causal checks, smoke and timing alone (a build that compiles only so)


def _arguments(q, k, v, o, lse, causal, scale, BLOCK_N=64, STAGES=2, PINGPONG=False, FIXED_MAX=False, CONSUMER_REGS=240,
               CONSUMERS=2, PERSISTENT=False):
    B, Hq, Lq, D = q.shape
    named = dict(q_desc=_descriptor(q, ROWS), k_desc=_descriptor(k, BLOCK_N), v_desc=_descriptor(v, BLOCK_N),
                 o_desc=_descriptor(o, ROWS), LSE=lse, seqlen_q=Lq, seqlen_k=k.shape[2], num_heads=Hq,
                 group_size=Hq // k.shape[1], qk_scale=scale * LOG2E, HEAD_DIM=D, CAUSAL=causal, BLOCK_N=BLOCK_N,
                 STAGES=STAGES, PINGPONG=PINGPONG, FIXED_MAX=FIXED_MAX, CONSUMER_REGS=CONSUMER_REGS, num_warps=4,
                 CONSUMERS=CONSUMERS, PERSISTENT=PERSISTENT)
    blocks = triton.cdiv(Lq, CONSUMERS * ROWS) * B * Hq
    return named, min(blocks, torch.cuda.get_device_properties(q.device).multi_processor_count) if PERSISTENT and q.is_cuda else blocks


def attention_ws(q, k, v, causal=False, scale=None, poison=False, **config):
    "q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D) views that TMA can read; returns (o, lse)."
    D = q.shape[-1]
    o = torch.full_like(q, float("nan")) if poison else torch.empty_like(q)   # poisoned: an unwritten element reads NaN
    lse = torch.full(q.shape[:3], float("nan"), device=q.device) if poison else torch.empty(q.shape[:3], device=q.device)
    named, grid = _arguments(q, k, v, o, lse, causal, D ** -0.5 if scale is None else scale, **config)
    _attn_fwd_ws[(grid,)](**named, maxnreg=maxnreg_for(named["CONSUMER_REGS"], named["CONSUMERS"]))
    return o, lse


def compile_sm90(B=8, H=32, N=2048, D=128, causal=True, dtype=torch.bfloat16, **config):
    "Compile for sm_90 without a GPU (CPU tensors stand in), as `triton_fa2.gluon._compile_sm90`."
    q, k, v = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(3))
    named, _ = _arguments(q, k, v, torch.empty_like(q), torch.empty(B, H, N), causal, D ** -0.5, **config)
    return compile_for_gpu(_attn_fwd_ws, **named, maxnreg=maxnreg_for(named["CONSUMER_REGS"], named["CONSUMERS"]))


def report(kernel):
    usage, sass = cuobjdump(kernel, "-res-usage"), cuobjdump(kernel)
    found = lambda pattern: int(m[1]) if (m := re.search(pattern, usage)) else None
    return dict(registers=found(r"REG:(\d+)"), stack_bytes=found(r"STACK:(\d+)"), shared_kib=kernel.metadata.shared // 1024,
                wgmma=sass.count("HGMMA"), waits=sass.count("WARPGROUP.DEPBAR"),
                waits_leaving_one=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"), setmaxnreg=len(re.findall(r"USETMAXREG", sass)),
                hazards=len(wgmma_hazards(sass))), sass


CHECKS = [(1, 2, 17, 64, True), (2, 4, 1000, 128, True), (2, 4, 1000, 128, False), (1, 2, 300, 128, True, 700),
          (1, 2, 700, 64, True, 300), (2, 8, 2048, 128, True), (1, 1, 1, 128, False), (2, 8, 128, 128, True, 64)] \
         + [(2, 4, 4096, 64, True)] * 3 + [(4, 8, 4096, 128, True), (8, 32, 2048, 64, False), (2, 4, 256, 128, False, 8192)]


def gpu_checks(configs):
    "Every config on odd shapes (Lq ≠ Lk both ways, rows that see no key, one row) against float32; poisoned outputs."
    ok_all = True
    for cfg in configs:
        for dtype in (torch.bfloat16, torch.float16):
            for B, H, Lq, D, causal, *lk in CHECKS:
                if ONLY_D and D != ONLY_D: continue
                if ONLY_CAUSAL not in ("", str(int(causal))): continue
                run = lambda q, k, v, causal: attention_ws(q, k, v, causal, poison=True, **cfg)
                ok_all &= check_against_float32(run, B, H, Lq, lk[0] if lk else Lq, D, causal, dtype, label=cfg)
            for D in [ONLY_D] if ONLY_D else (64, 128):   # P overflows under a fixed maximum: the redo (FIXED_MAX), or nothing to redo (online)
                ok_all &= check_against_float32(run, 2, 2, 512, 512, D, ONLY_CAUSAL != "0", dtype, label=f"{cfg} overflow", overflow=True)
        print(f"checked {cfg}", flush=True)
    print("ALL CHECKS PASSED" if ok_all else "SOME CHECKS FAILED", flush=True)
    return ok_all


def gpu_time(configs, out, commit):
    "The timing shapes: each config against the package's pick, FA2 and cuDNN, one process (do_bench and CUDA graphs)."
    time_against_yardsticks(lambda q, k, v, causal: {"ws " + " ".join(f"{a}={b}" for a, b in cfg.items()):
                                                     (lambda cfg=cfg: attention_ws(q, k, v, causal, **cfg)) for cfg in configs},
                            out, commit)


def parse(configs):
    "'BLOCK_N,STAGES,PINGPONG,CONSUMER_REGS[,FIXED_MAX[,CONSUMERS[,PERSISTENT]]];...' → config dicts (3 consumers: 160 registers)."
    keys = ("BLOCK_N", "STAGES", "PINGPONG", "CONSUMER_REGS", "FIXED_MAX", "CONSUMERS", "PERSISTENT")
    return [{k: (bool(int(x)) if k in ("PINGPONG", "FIXED_MAX", "PERSISTENT") else int(x)) for k, x in zip(keys, c.split(","))}
            for c in configs.split(";") if c]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--configs", default="64,2,0,240;64,2,1,240;128,2,0,240;128,2,1,240")
    ap.add_argument("--out", default="gluon_ws.csv"); ap.add_argument("--commit", default="unknown")
    ap.add_argument("--smoke", action="store_true", help="GPU: one small causal check per config, to catch a hang cheaply")
    a = ap.parse_args()
    configs = parse(a.configs)
    if a.smoke:   # prints "smoke <config as given>: ok" per config that passed, for the next call's --configs
        for text, cfg in zip([c for c in a.configs.split(";") if c], configs):
            run = lambda q, k, v, causal: attention_ws(q, k, v, causal, poison=True, **cfg)
            good = check_against_float32(run, 1, 2, 300, 300, ONLY_D or 128, ONLY_CAUSAL != "0", torch.bfloat16, label=cfg)
            print(f"smoke {text}: {'ok' if good else 'WRONG'}", flush=True)
    elif a.compile:
        for cfg in configs:
            for D, causal, dtype in ((128, True, torch.bfloat16), (64, False, torch.float16)):
                t0 = time.time()
                try:
                    r, sass = report(compile_sm90(D=D, causal=causal, dtype=dtype, **cfg))
                    print(cfg, D, causal, dtype, r, f"{time.time() - t0:.0f} s", flush=True)
                    if os.environ.get("SASS_OUT"): open(f"{os.environ['SASS_OUT']}_{D}.sass", "w").write(sass)
                except Exception as e:
                    print(cfg, D, causal, dtype, "FAILED", type(e).__name__, str(e)[:1500], flush=True)
    elif gpu_checks(configs):
        gpu_time(configs, a.out, a.commit)
