"""The sm_90 config rules: the configs a first call runs without timing (`triton_fa2/rules_sm90.json`, package data).

`make` writes them from the benchmark's own tuned rows in results/raw.csv (CPU). For each (kernel, head dim, dtype,
causal, Lk) the benchmark measured on a GPU of the family (the H200 and the H100 are both sm_90), the config its tuning
picked; where several batch sizes were measured at one length, the pick most of them made (a tie: the one of the largest
call). Decode's rules come from `tools/sweep_decode.py`'s rows (results/decode_configs.csv, every candidate timed at each
shape): for each (head dim, dtype, Lk) and cache kind (`decode` contiguous, `decode_paged` for pages of any size), the
config whose time over the fastest is least in geometric mean across the shapes and page sizes measured at that Lk. One
query sees the same keys with or without the mask, so each decode rule stands for both. The file records the GPU, the
versions, the commits and the dates of the rows it was made from.

`compare` times the rules' configs against the tuned ones, on the GPU, to `results/rules_vs_tuned.csv`: for each
prefill workload of the benchmark's grids, the config the dispatcher picks without timing, the one tuning picks (every
candidate timed, the tuning cache off), then both timed alternately in one process, five rounds of the benchmark's
timing (`do_bench`, 25 ms warm-up, 100 ms measured), median per config. Prints the geometric mean of tuned/rule time
and the worst shape.

    python tools/rules.py make [--raw results/raw.csv] [--decode results/decode_configs.csv] [--gpu "NVIDIA H200" "NVIDIA H100 80GB HBM3"] [--out triton_fa2/rules_sm90.json]
    python tools/rules.py compare [--grid prefill+fa3] [--out results/rules_vs_tuned.csv] [--commit abc1234]
    python tools/rules.py compare --only 1,32,2048,64,0,fp16 --rounds 15 --out lab/data/...   # some shapes again
"""
import argparse, collections, csv, datetime, json, math, os, pathlib, statistics, sys


KERNELS = {"prefill": ("prefill",), "backward": ("bwd_dkdv", "bwd_dq")}   # the bench's op → the dispatcher's kernels


def rules(rows:list) -> list:
    "One rule per (kernel, head dim, dtype, causal, Lk): the config most rows picked; a tie goes to the largest call."
    votes = collections.defaultdict(list)
    for r in rows:
        labels = r["config"].split(" + ")                    # backward rows: "dkdv … + dq …"
        for kernel, label in zip(KERNELS[r["op"]], labels):
            work = int(r["batch"]) * int(r["heads_q"]) * int(r["seqlen_q"]) * int(r["seqlen_k"])
            votes[kernel, int(r["head_dim"]), r["dtype"], bool(int(r["causal"])), int(r["seqlen_k"])].append((label, work))
    out = []
    for (kernel, head_dim, dtype, causal, seqlen_k), picks in sorted(votes.items()):
        count = collections.Counter(label for label, _ in picks)
        best = max(count.values())
        label = max((p for p in picks if count[p[0]] == best), key=lambda p: p[1])[0]
        out.append(dict(kernel=kernel, head_dim=head_dim, dtype=dtype, causal=causal, seqlen_k=seqlen_k, config=label,
                        rows=len(picks)))
    return out


def decode_rules(rows:list) -> list:
    """One rule per (decode kind, head dim, dtype, Lk), for both masks: the config least slower than each shape's fastest
    in geometric mean over that Lk's shapes (a config missing at any of them is not eligible)."""
    times = collections.defaultdict(dict)                       # (kind, D, dtype, Lk, shape) → {config: µs}
    for r in rows:
        kind = "decode" if r["layout"] == "contiguous" else "decode_paged"
        times[kind, int(r["head_dim"]), r["dtype"], int(r["seqlen_k"]), (r["batch"], r["heads_q"], r["heads_kv"], r["layout"])][r["config"]] = float(r["us"])
    groups = collections.defaultdict(list)
    for (kind, head_dim, dtype, seqlen_k, _), by_config in times.items(): groups[kind, head_dim, dtype, seqlen_k].append(by_config)
    out = []
    for (kind, head_dim, dtype, seqlen_k), shapes in sorted(groups.items()):
        eligible = set.intersection(*(set(s) for s in shapes))
        cost = lambda c: sum(math.log(s[c] / min(s.values())) for s in shapes)
        label = min(sorted(eligible), key=cost)
        for causal in (False, True):
            out.append(dict(kernel=kind, head_dim=head_dim, dtype=dtype, causal=causal, seqlen_k=seqlen_k, config=label,
                            rows=len(shapes)))
    return out


def make(argv=None):
    "The rules from the benchmark's rows, to the package's JSON table."
    p = argparse.ArgumentParser(prog="python tools/rules.py make", description=make.__doc__)
    p.add_argument("--raw", default="results/raw.csv")
    p.add_argument("--gpu", nargs="+", default=["NVIDIA H200", "NVIDIA H100 80GB HBM3"], help="the sm_90 GPUs whose rows count")
    p.add_argument("--decode", default="results/decode_configs.csv")
    p.add_argument("--out", default="triton_fa2/rules_sm90.json")
    a = p.parse_args(argv)
    rows = [r for r in csv.DictReader(open(a.raw)) if r["provider"] == "triton_fa2" and r["gpu"] in a.gpu
            and r["op"] in KERNELS and r["config"] and not r["skip_reason"]]
    if not rows: raise SystemExit(f"no tuned triton_fa2 rows of {', '.join(a.gpu)} in {a.raw}")
    decode = [r for r in csv.DictReader(open(a.decode)) if r["gpu"] in a.gpu] if pathlib.Path(a.decode).exists() else []
    meta = {c: sorted({r[c] for r in rows + decode}) for c in ("gpu", "torch", "triton", "commit")}
    meta["date"] = [min(r["date"] for r in rows + decode), max(r["date"] for r in rows + decode)]
    table = dict(source=[a.raw] + ([a.decode] if decode else []), made_by="tools/rules.py make", **meta, rules=rules(rows) + decode_rules(decode))
    pathlib.Path(a.out).write_text(json.dumps(table, indent=1) + "\n")
    print(f"{a.out}: {len(table['rules'])} rules from {len(rows) + len(decode)} rows ({', '.join(meta['commit'])}; {' to '.join(meta['date'])})")



def compare(argv=None):
    "The rules' configs against the tuned ones, timed alternately on the GPU."
    os.environ["TRITON_FA2_NO_CACHE"] = "1"          # tuning must time, not read an earlier pick
    import torch, triton
    from triton_fa2 import bench, dispatch
    from triton_fa2.interface import warmup

    def forget():
        dispatch._PICKS.clear(); dispatch._TUNED.clear(); dispatch._forget_launches()

    p = argparse.ArgumentParser(prog="python tools/rules.py compare", description=compare.__doc__)
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
    commands = {"make": make, "compare": compare}
    if len(sys.argv) < 2 or sys.argv[1] not in commands: raise SystemExit(f"usage: python tools/rules.py {{{'|'.join(commands)}}} [options]")
    commands[sys.argv[1]](sys.argv[2:])
