"""Every decode candidate at decode shapes, contiguous and paged caches, to results/decode_configs.csv (the rows
`tools/rules.py make` turns into the first call's decode rules).

One query per row, Hq/Hkv = 32/8, bf16, D 64, 128 and 256; (B, Lk) from one long sequence to 64 rows of 4096 keys; caches
contiguous and paged (pages of 1, 16 and 256, at shuffled blocks); the split count the dispatcher's heuristic gives. Each
candidate is forced in turn (the dispatcher offered only it), checked against the first candidate's output, then timed
as a CUDA-graph replay (median of `--replays`). Run on the GPU whose rules it makes:

    python tools/sweep_decode.py --out results/decode_configs.csv --commit $(git rev-parse --short HEAD)
"""
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import argparse, csv, datetime, os, sys

import torch
import triton

from triton_fa2 import candidates, dispatch, split_kv
from triton_fa2.tuning import tuning

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_serving import block_table, capture, paged, replay_ms

SHAPES = ((1, 32768), (8, 8192), (64, 4096), (1, 4096), (8, 2048), (16, 1024), (1, 131072))   # (B, Lk)
HEAD_DIMS, HQ, HKV, PAGE_SIZES = (64, 128, 256), 32, 8, (16, 256, 1)
FIELDS = ["head_dim", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "layout", "config", "us", "err",
          "gpu", "torch", "triton", "commit", "date"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/decode_configs.csv")
    p.add_argument("--commit", default=None)
    p.add_argument("--replays", type=int, default=200)
    a = p.parse_args()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=a.commit or "",
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    offered = dispatch.decode_candidates
    with open(a.out, "w", newline="") as f, torch.no_grad(), tuning(False):
        out = csv.DictWriter(f, FIELDS); out.writeheader()
        for D in HEAD_DIMS:
            for B, Lk in SHAPES:
                torch.manual_seed(0)
                q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, Lk, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                seqlens = torch.full((B,), Lk, dtype=torch.int32, device="cuda")
                layouts = {"contiguous": (k, v, None)}
                for ps in PAGE_SIZES:
                    table, blocks = block_table(B, Lk, ps, 8, "cuda")
                    layouts[f"page{ps}"] = (paged(k, table, ps, blocks), paged(v, table, ps, blocks), table)
                ref = None
                for layout, (kc, vc, table) in layouts.items():
                    for c in offered(split_kv._decode_block_m(HQ // HKV), D, candidates._max_smem(0)):
                        dispatch.decode_candidates = lambda *args, c=c, **kw: [c]   # the dispatcher's only choice
                        dispatch._PICKS.clear(); dispatch._DECODE_PLANS.clear()
                        call = lambda: triton_fa2.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True)
                        o = call().float()
                        ref = o if ref is None else ref
                        graph, _ = capture(call)
                        us = replay_ms(graph, a.replays) * 1e3
                        del graph
                        out.writerow(dict(head_dim=D, dtype="bf16", batch=B, heads_q=HQ, heads_kv=HKV, seqlen_q=1, seqlen_k=Lk,
                                          layout=layout, config=c.label, us=f"{us:.2f}", err=f"{(o - ref).abs().max().item():.1e}", **meta))
                        f.flush()
                        print(D, B, Lk, layout, f"{c.label:18s} {us:8.2f} us", flush=True)
    dispatch.decode_candidates = offered
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
