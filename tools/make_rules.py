"""The sm_90 config rules (`triton_fa2/rules_sm90.json`) from the benchmark's own tuned rows in results/raw.csv.

For each (kernel, head dim, dtype, causal, Lk) the benchmark measured on a GPU of the family (the H200 and the H100 are
both sm_90), the config its tuning picked; where
several batch sizes were measured at one length, the pick most of them made (a tie: the one of the largest call).
The file records the GPU, the versions, the commits and the dates of the rows it was made from.

    python tools/make_rules.py [--raw results/raw.csv] [--gpu "NVIDIA H200" "NVIDIA H100 80GB HBM3"] [--out triton_fa2/rules_sm90.json]
"""
import argparse, collections, csv, json, pathlib

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--raw", default="results/raw.csv")
    p.add_argument("--gpu", nargs="+", default=["NVIDIA H200", "NVIDIA H100 80GB HBM3"], help="the sm_90 GPUs whose rows count")
    p.add_argument("--out", default="triton_fa2/rules_sm90.json")
    a = p.parse_args(argv)
    rows = [r for r in csv.DictReader(open(a.raw)) if r["provider"] == "triton_fa2" and r["gpu"] in a.gpu
            and r["op"] in KERNELS and r["config"] and not r["skip_reason"]]
    if not rows: raise SystemExit(f"no tuned triton_fa2 rows of {', '.join(a.gpu)} in {a.raw}")
    meta = {c: sorted({r[c] for r in rows}) for c in ("gpu", "torch", "triton", "commit")}
    meta["date"] = [min(r["date"] for r in rows), max(r["date"] for r in rows)]
    table = dict(source=a.raw, made_by="tools/make_rules.py", **meta, rules=rules(rows))
    pathlib.Path(a.out).write_text(json.dumps(table, indent=1) + "\n")
    print(f"{a.out}: {len(table['rules'])} rules from {len(rows)} rows ({', '.join(meta['commit'])}; {' to '.join(meta['date'])})")


if __name__ == "__main__":
    main()
