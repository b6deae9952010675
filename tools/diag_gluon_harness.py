"""Issue 6, run 16: why the benchmark read the Gluon pick at 433 TFLOP/s on the money shot (run 15) when run 14's tool read
the same kernel at 480. One process, alternating rounds, all timed as the benchmark times (`bench._time`: do_bench,
L2 cleared, median of 100 ms): `attention` after tuning (the saved launch), `_attention_forward` with the Gluon config
through Triton's launch path, the shipped `tl` pick with Gluon kept out, FA2 and cuDNN; SM clock sampled after each.

    PYTHONPATH=. python3 tools/diag_gluon_harness.py --out run16.csv --commit <sha>
"""
import argparse, csv, datetime, os, subprocess
import torch, triton
import triton_fa2
import triton_fa2.forward as fwd
from triton_fa2 import bench
from triton_fa2.gluon import GluonConfig

ap = argparse.ArgumentParser(); ap.add_argument("--out", required=True); ap.add_argument("--commit", default="unknown")
ap.add_argument("--rounds", type=int, default=4)
a = ap.parse_args()
w = bench.MONEY_SHOT
q, k, v = w.inputs("cuda")
flops = w.flops()
B, H, N, D = q.shape
o, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
pick = triton_fa2.warmup(q, k, v, causal=True); triton_fa2.attention(q, k, v, causal=True)
print("pick with Gluon:", fwd._label(pick), flush=True)
os.environ["TRITON_FA2_NO_GLUON"] = "1"
saved = dict(fwd._PLANS)
fwd._TUNED.clear(); fwd._PLANS.clear()               # tune the key again without Gluon (run 16 hit the saved launch here)
tl_pick = fwd._attention_forward(q, k, v, o, lse, True, D ** -0.5)
fwd._PLANS.clear(); fwd._PLANS.update(saved)         # `attention` keeps the Gluon pick's saved launch
del os.environ["TRITON_FA2_NO_GLUON"]
print("tl pick:", fwd._label(tl_pick), flush=True)
from torch.nn.attention import SDPBackend
runs = {
    "attention (saved launch)": lambda: triton_fa2.attention(q, k, v, causal=True),
    "gluon qreg via Triton": lambda: fwd._attention_forward(q, k, v, o, lse, True, D ** -0.5, config=GluonConfig(64, 64, 2, 4, True)),
    "gluon s2 via Triton": lambda: fwd._attention_forward(q, k, v, o, lse, True, D ** -0.5, config=GluonConfig(64, 64, 2, 4)),
    "tl pick via Triton": lambda: fwd._attention_forward(q, k, v, o, lse, True, D ** -0.5, config=tl_pick),
    "sdpa_flash": lambda: bench._sdpa(SDPBackend.FLASH_ATTENTION)(w, q, k, v),
    "sdpa_cudnn": lambda: bench._sdpa(SDPBackend.CUDNN_ATTENTION)(w, q, k, v),
}
def clock():
    try: return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except Exception: return ""
meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=a.commit,
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
rows = []
for r in range(a.rounds):
    for name, fn in runs.items():
        fn(); torch.cuda.synchronize()
        ms = bench._time(lambda *s: fn(), [()])
        graph = triton.testing.do_bench_cudagraph(fn, rep=100)
        rows.append(dict(round=r, provider=name, ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}", ms_graph=f"{graph:.4f}", clock_power=clock(), **meta))
        print(r, f"{name:<28} {flops / ms / 1e9:6.1f} TFLOP/s  graph {graph:.4f} ms  {rows[-1]['clock_power']}", flush=True)
with open(a.out, "w", newline="") as f:
    wr = csv.DictWriter(f, list(rows[0])); wr.writeheader(); wr.writerows(rows)
