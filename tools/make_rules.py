"""The sm_90 config rules (`triton_fa2/rules_sm90.json`) from the benchmark's own tuned rows in results/raw.csv.

For each (kernel, head dim, dtype, causal, Lk) the benchmark measured on a GPU of the family (the H200 and the H100 are
both sm_90), the config its tuning picked; where
several batch sizes were measured at one length, the pick most of them made (a tie: the one of the largest call).
Decode's rules come from `tools/sweep_decode.py`'s rows (results/decode_configs.csv, every candidate timed at each
shape): for each (head dim, dtype, Lk) and cache kind (`decode` contiguous, `decode_paged` for pages of any size), the
config whose time over the fastest is least in geometric mean across the shapes and page sizes measured at that Lk. One
query sees the same keys with or without the mask, so each decode rule stands for both.
The file records the GPU, the versions, the commits and the dates of the rows it was made from.

    python tools/make_rules.py [--raw results/raw.csv] [--decode results/decode_configs.csv] [--gpu "NVIDIA H200" "NVIDIA H100 80GB HBM3"] [--out triton_fa2/rules_sm90.json]
"""
import argparse, collections, csv, json, math, pathlib

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    table = dict(source=[a.raw] + ([a.decode] if decode else []), made_by="tools/make_rules.py", **meta, rules=rules(rows) + decode_rules(decode))
    pathlib.Path(a.out).write_text(json.dumps(table, indent=1) + "\n")
    print(f"{a.out}: {len(table['rules'])} rules from {len(rows) + len(decode)} rows ({', '.join(meta['commit'])}; {' to '.join(meta['date'])})")


if __name__ == "__main__":
    main()
