"""Issue 6 diagnostic (GPU): the SM clock and power while the money shot runs sustained, ours against SDPA's FA2 and
cuDNN backends. Under Nsight Compute (one launch per replay) our kernel is 1.56× FA2; timed sustained, as the benchmark
times, 1.46× (notebook 09, "The money shot's pick"). If ours draws more power, the clock drops more under it.

Samples `nvidia-smi` every 100 ms in the background while each provider runs back to back for `--seconds`, then prints,
per provider: its median time per call, and the median SM clock and power over its window.

    PYTHONPATH=. python3 tools/diag_clocks.py --seconds 4 --out clocks.csv
"""
import argparse, csv, io, statistics, subprocess, time
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

def sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel(backend): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default="clocks.csv")
    ap.add_argument("--swap", default="", help="an experiment_hopper swap of our softmax step (e.g. poly_exp_1of8), applied first")
    a = ap.parse_args()
    if a.swap:
        import os, sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import experiment_hopper
        experiment_hopper._swap(a.swap)
    q, k, v = (torch.randn(8, 32, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    providers = {"triton_fa2": lambda q, k, v: triton_fa2.attention(q, k, v, causal=True),
                 "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    for fn in providers.values(): fn(q, k, v)                                   # compile, autotune
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    windows = {}
    for rnd in range(2):                                                         # twice, alternating
        for name, fn in providers.items():
            time.sleep(1.0)                                                      # idle between windows: clocks recover
            start, calls = time.time(), 0
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            while time.time() - start < a.seconds:
                for _ in range(20): fn(q, k, v)
                calls += 20
                torch.cuda.synchronize()
            end.record(); torch.cuda.synchronize()
            windows[(name, rnd)] = (start, time.time(), begin.elapsed_time(end) / calls)
    time.sleep(0.5); smi.terminate()
    samples = []
    for row in csv.reader(io.StringIO(smi.stdout.read())):
        try:
            t = time.mktime(time.strptime(row[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + row[0].strip().split(".")[1])
            samples.append((t, float(row[1]), float(row[2]), float(row[3])))
        except (ValueError, IndexError): pass
    with open(a.out, "w") as f:
        csv.writer(f).writerows([("unix_time", "sm_mhz", "power_w", "temp_c")] + samples)
    flops = 4 * 8 * 32 * 2048 * 2048 * 128 / 2
    for (name, rnd), (t0, t1, ms) in windows.items():
        inside = [s for s in samples if t0 + 0.5 <= s[0] <= t1]                  # skip the first half second
        clock = statistics.median(s[1] for s in inside) if inside else float("nan")
        power = statistics.median(s[2] for s in inside) if inside else float("nan")
        print(f"{name + ('+' + a.swap if a.swap and name == 'triton_fa2' else ''):<11} round {rnd}: {ms:.4f} ms/call = {flops / ms / 1e9:.0f} TFLOP/s, "
              f"SM clock {clock:.0f} MHz, power {power:.0f} W ({len(inside)} samples)", flush=True)
