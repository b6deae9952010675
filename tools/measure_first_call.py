"""How long a program waits for its first attention calls, measured in fresh processes, to `results/first_call.csv`.

Three situations, each a new Python process per shape, in this order:
  fresh      Triton's compile cache and the tuning cache both empty (a new machine or container)
  warm       both caches as the `fresh` process left them, no pick tuned (a new process on the same machine)
  tuned      a `warmup(..., tune=True)` process has run for the shape first (its time is the `tuning` row); then a new process
Each process times `import triton_fa2`, the first call, a second call (GPU time, synchronised), and the first calls of
two more shapes in the same process: a new length (the same kernel) and a new head dim (a kernel compiled anew).

    python tools/measure_first_call.py [--out results/first_call.csv] [--commit abc1234] [--shape 1,2,64,32,1 ...]
"""
import argparse, csv, datetime, json, os, pathlib, subprocess, sys, tempfile

SHAPES = [   # (B, H, N, D, causal): the money shot, then lengths and head dims a first user meets
    (8, 32, 2048, 128, True), (2, 16, 1500, 128, True), (1, 8, 700, 64, False), (4, 32, 2048, 128, True), (2, 16, 1500, 96, True)]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, triton_fa2
t_import = time.perf_counter() - t0
B, H, N, D, causal = json.loads(sys.argv[1]); tune = sys.argv[2] == "tune"
device = "cuda" if torch.cuda.is_available() else "cpu"
q, k, v = (torch.randn(B, H, N, D, device=device, dtype=torch.bfloat16) for _ in range(3))
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
def timed(fn):
    sync(); t = time.perf_counter(); out = fn(); sync(); return time.perf_counter() - t, out
if tune:
    seconds, config = timed(lambda: triton_fa2.warmup(q, k, v, causal=causal, tune=True))
    print(json.dumps(dict(tuning_s=seconds, config=config.label))); sys.exit()
first, _ = timed(lambda: triton_fa2.attention(q, k, v, causal=causal))
second, _ = timed(lambda: triton_fa2.attention(q, k, v, causal=causal))
q2, k2, v2 = (t[:, :, : N - 37] for t in (q, k, v))
other, _ = timed(lambda: triton_fa2.attention(q2, k2, v2, causal=causal))
D2 = 64 if D != 64 else 128                                  # a new head dim: a kernel this process has not compiled
q3, k3, v3 = (torch.randn(B, H, N, D2, device=device, dtype=torch.bfloat16) for _ in range(3))
new_dim, _ = timed(lambda: triton_fa2.attention(q3, k3, v3, causal=causal))
from triton_fa2 import dispatch
print(json.dumps(dict(import_s=t_import, first_s=first, second_s=second, new_length_s=other, new_head_dim_s=new_dim,
                      configs=sorted({c.label for c in dispatch._PICKS.values()}))))
"""


def child(shape, triton_cache, tuning_cache, tune=False) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=triton_cache, TRITON_FA2_CACHE_DIR=tuning_cache)
    env.pop("TRITON_FA2_TUNE", None)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(shape), "tune" if tune else "call"], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode: raise SystemExit(f"{shape}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/first_call.csv")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--shape", action="append", help="B,H,N,D,causal (0 or 1) instead of the default shapes; repeatable")
    a = p.parse_args(argv)
    import torch, triton
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, commit=a.commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows = []
    with tempfile.TemporaryDirectory() as root:
        triton_cache, tuning_cache = (str(pathlib.Path(root) / n) for n in ("triton", "tuning"))
        shapes = [tuple(int(x) for x in s.split(",")[:4]) + (s.split(",")[4:] == ["1"],) for s in a.shape] if a.shape else SHAPES
        for shape in shapes:
            fresh_triton = str(pathlib.Path(root) / f"triton-{len(rows)}")   # empty for this shape's fresh process only
            untuned = str(pathlib.Path(root) / f"untuned-{len(rows)}")      # the package's cache, no pick in it
            for situation, tc in (("fresh", fresh_triton), ("warm", fresh_triton)):
                r = child(shape, tc, untuned)
                rows.append(dict(situation=situation, shape=str(shape), **r)); print(rows[-1], flush=True)
            t = child(shape, fresh_triton, tuning_cache, tune=True)
            rows.append(dict(situation="tuning", shape=str(shape), first_s=t["tuning_s"], configs=[t["config"]])); print(rows[-1], flush=True)
            r = child(shape, fresh_triton, tuning_cache)
            rows.append(dict(situation="tuned", shape=str(shape), **r)); print(rows[-1], flush=True)
    fields = ["situation", "shape", "import_s", "first_s", "second_s", "new_length_s", "new_head_dim_s", "configs", *meta]
    out = pathlib.Path(a.out)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: (f"{v:.4f}" if isinstance(v, float) else " ".join(v) if isinstance(v, list) else v) for k, v in r.items()}, **meta})
    print(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
