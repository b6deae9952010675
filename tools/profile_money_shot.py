"""Ceilings and Nsight Compute figures for notebook 08, on the GPU; writes results/ceilings.csv and results/ncu.csv.

  python3 tools/profile_money_shot.py ceilings --commit SHA        # bf16 matmul 8192³ and a 1 GiB device copy
  ncu --clock-control none --profile-from-start off --csv --page details \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      python3 tools/profile_money_shot.py run --sass sass.json > ncu_raw.csv   # one profiled launch of ours, SDPA-FA2 and cuDNN
  python3 tools/profile_money_shot.py extract ncu_raw.csv --sass sass.json --commit SHA  # → results/ncu.csv
  (extracting elsewhere: add --meta-from results/raw.csv, a sweep run on the same machine at the same commit, for GPU, versions, date)

On Hopper the "hmma" tensor pipe counts warpgroup MMAs (HGMMA) as well as mma.sync (HMMA): it is the tensor pipe's
activity. Which instruction a kernel uses is read from its SASS: `run --sass` disassembles the one compiled kernel of the
configuration the autotuner chose for the money shot.

`run` warms up (compilation, autotuning) outside the profiled range, then calls each provider once between
cudaProfilerStart/Stop, so ncu sees exactly one launch per kernel.
"""
import argparse, csv, datetime, json, pathlib, re, sys

import torch
import triton

MONEY = dict(B=8, H=32, N=2048, D=128)
KEEP = {  # ncu "Metric Name" → our column name
    "Duration": "duration", "DRAM Throughput": "dram_throughput_pct", "Compute (SM) Throughput": "sm_throughput_pct",
    "Achieved Occupancy": "achieved_occupancy_pct", "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Registers Per Thread": "registers_per_thread", "Dynamic Shared Memory Per Block": "dynamic_smem_per_block",
    "Static Shared Memory Per Block": "static_smem_per_block", "Block Size": "block_size", "Grid Size": "grid_size",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_active_pct",
}


def meta(commit, from_csv=None):
    """GPU, versions, commit and date of this run. Off the GPU machine (extracting a copied ncu CSV), they are read from
    `from_csv` instead: a results CSV written on the same machine at the same commit (its first row of `commit`)."""
    if from_csv:
        row = next(r for r in csv.DictReader(open(from_csv)) if r["commit"] == commit)
        return dict(gpu=row["gpu"], torch=row["torch"], triton=row["triton"], commit=commit, date=row["date"])
    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))


def ceilings(commit, out):
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    ms_copy = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    rows = [dict(ceiling="bf16 matmul 8192³", value=f"{2 * 8192**3 / ms / 1e9:.1f}", unit="TFLOP/s", **meta(commit)),
            dict(ceiling="device copy 1 GiB (read + write)", value=f"{2 * src.numel() / ms_copy / 1e9:.3f}", unit="TB/s", **meta(commit))]
    write(rows, out)


def run(sass_out=None):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton_fa2.interface import attention, warmup
    q, k, v = (torch.randn(MONEY["B"], MONEY["H"], MONEY["N"], MONEY["D"], device="cuda", dtype=torch.bfloat16) for _ in range(3))
    config = warmup(q, k, v, causal=True, tune=True)
    print("config:", config, file=sys.stderr)
    def fa2():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fa2(); cudnn(); torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    attention(q, k, v, causal=True)
    fa2()
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    if sass_out:   # outside the profiled range: compile the chosen config alone and count its matrix instructions
        from triton_fa2 import dispatch, forward
        kernel = (forward._attn_fwd if config.kernel == "tl" else          # the Gluon kernels on sm_90
                  dispatch._gluon._attn_fwd_ws if config.WARP_SPECIALIZE else dispatch._gluon._attn_fwd_gluon)
        kernel.device_caches.clear()
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
        dispatch._attention_forward(q, k, v, o, lse, causal=True, scale=q.shape[-1] ** -0.5, config=config)
        kernels = [kern for cache in kernel.device_caches.values() for kern in cache[0].values()]
        assert len(kernels) == 1, f"expected the one kernel of the chosen config, found {len(kernels)}"
        sass = kernels[0].asm["sass"]
        counts = dict(config=config.label, sass_hgmma=len(re.findall(r"\bHGMMA\.", sass)), sass_hmma=len(re.findall(r"\bHMMA\.", sass)))
        pathlib.Path(sass_out).write_text(json.dumps(counts))
        print("SASS:", counts, file=sys.stderr)


def extract(raw, sass, commit, out, meta_from=None):
    text = pathlib.Path(raw).read_text()
    lines = [l for l in text.splitlines() if l.startswith('"')]       # ncu prints its own lines before the CSV
    rows = {}
    for r in csv.DictReader(lines):
        name = r["Kernel Name"]
        provider = ("triton_fa2" if "_attn_fwd" in name else "sdpa_cudnn" if "cudnn" in name   # cuDNN's name holds "flash" too
                    else "sdpa_flash" if "flash" in name else name[:40])
        key = KEEP.get(r["Metric Name"])
        if key: rows.setdefault(provider, dict(provider=provider, kernel=name[:80], **meta(commit, meta_from)))[key] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
    if sass and "triton_fa2" in rows: rows["triton_fa2"].update(json.loads(pathlib.Path(sass).read_text()))
    write(list(rows.values()), out)


def write(rows, out):
    out = pathlib.Path(out); out.parent.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(c for r in rows for c in r))
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, cols); w.writeheader(); w.writerows(rows)
    print("wrote", out, file=sys.stderr)
    for r in rows: print(r, file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ceilings", "run", "extract"])
    ap.add_argument("raw", nargs="?")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--sass", default=None, help="JSON of the SASS counts (run writes it, extract reads it)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--meta-from", default=None, help="extract off the GPU machine: GPU, versions and date from this CSV's row of --commit")
    a = ap.parse_args()
    if a.what == "ceilings": ceilings(a.commit, a.out or "results/ceilings.csv")
    elif a.what == "run": run(a.sass)
    else: extract(a.raw, a.sass, a.commit, a.out or "results/ncu.csv", a.meta_from)
