"""The first call's configs (by rule, untimed) against the tuned ones, on the GPU, to `results/rules_vs_tuned.csv`.

For each prefill workload of the benchmark's grids: the config the dispatcher picks without timing, the one tuning
picks (every candidate timed, the tuning cache off), then both timed alternately in one process, five rounds of the
benchmark's timing (`do_bench`, 25 ms warm-up, 100 ms measured), median per config. Prints the geometric mean of
tuned/rule time and the worst shape.

    python tools/compare_rules.py [--grid prefill+fa3] [--out results/rules_vs_tuned.csv] [--commit abc1234]
    python tools/compare_rules.py --only 1,32,2048,64,0,fp16 --rounds 15 --out lab/data/...   # some shapes again
"""
import argparse, csv, datetime, math, os, pathlib, statistics
os.environ["TRITON_FA2_NO_CACHE"] = "1"          # tuning must time, not read an earlier pick
import torch, triton
from triton_fa2 import bench, dispatch
from triton_fa2.interface import warmup


def forget():
    dispatch._PICKS.clear(); dispatch._TUNED.clear(); dispatch._forget_launches()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default="prefill+fa3")
    p.add_argument("--out", default="results/rules_vs_tuned.csv")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", action="append", help="B,H,N,D,causal (0 or 1),dtype: this workload of the grids only; repeatable")
    a = p.parse_args(argv)
    only = {tuple(x.split(",")) for x in a.only or ()}
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=a.commit,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
    rows = []
    for w in bench.select_workloads(a.grid):
        if w.op != "prefill": continue
        if only and (str(w.batch), str(w.heads_q), str(w.seqlen_q), str(w.head_dim), str(int(w.causal)), w.dtype) not in only: continue
        q, k, v = w.inputs("cuda")
        forget(); rule = warmup(q, k, v, causal=w.causal)
        forget(); tuned = warmup(q, k, v, causal=w.causal, tune=True)
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
        scale = w.head_dim ** -0.5
        run = lambda c: dispatch._attention_forward(q, k, v, o, lse, w.causal, scale, config=c)
        samples = {rule: [], tuned: []}
        for _ in range(a.rounds):
            for c in samples: samples[c].append(triton.testing.do_bench(lambda: run(c), warmup=25, rep=100, return_mode="median"))
        ms_rule, ms_tuned = (statistics.median(samples[c]) for c in (rule, tuned))
        rows.append(dict(batch=w.batch, heads=w.heads_q, seqlen=w.seqlen_q, head_dim=w.head_dim, causal=int(w.causal), dtype=w.dtype,
                         rule_config=rule.label, tuned_config=tuned.label, ms_rule=f"{ms_rule:.4f}", ms_tuned=f"{ms_tuned:.4f}",
                         rule_over_tuned=f"{ms_rule / ms_tuned:.3f}", **meta))
        print(rows[-1], flush=True)
        del q, k, v, o, lse
    ratios = [float(r["rule_over_tuned"]) for r in rows]
    out = pathlib.Path(a.out)
    with out.open("w", newline="") as f:
        wr = csv.DictWriter(f, list(rows[0])); wr.writeheader(); wr.writerows(rows)
    worst = max(rows, key=lambda r: float(r["rule_over_tuned"]))
    print(f"rule time / tuned time over {len(rows)} shapes: geometric mean {math.exp(statistics.fmean(map(math.log, ratios))):.3f}, "
          f"worst {worst['rule_over_tuned']} at {worst}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
