"""One side of an A/B: paged and contiguous decode at the serving shapes, CUDA-graph medians, configs: the rule's and forced ones."""
import sys, json, statistics, torch
sys.path.insert(0, "tools")
import triton_fa2
from triton_fa2 import tuning, dispatch
from triton_fa2.candidates import Candidate
from measure_serving import block_table, paged, capture, replay_ms
label, rnd = sys.argv[1], sys.argv[2]
Hq, Hkv, D = 32, 8, 128
real_cands, real_rule = dispatch.decode_candidates, dispatch.rule_config
for B, Lk in ((8, 8192), (64, 4096), (1, 32768)):
    torch.manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Lk, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((B,), Lk, dtype=torch.int32, device="cuda")
    ref = triton_fa2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True).float()
    layouts = {"contiguous": (k, v, {})}
    for ps in (1, 16, 256):
        table, blocks = block_table(B, Lk, ps, 8, "cuda")
        layouts[f"page{ps}"] = (paged(k, table, ps, blocks), paged(v, table, ps, blocks), dict(block_table=table))
    for cfg in ("rule", (64, 4, 3), (32, 4, 3)):
        dispatch._PICKS.clear(); dispatch._DECODE_PLANS.clear()
        if cfg == "rule": dispatch.decode_candidates, dispatch.rule_config = real_cands, real_rule
        else:
            c = Candidate("decode", 0, *cfg)
            dispatch.decode_candidates, dispatch.rule_config = (lambda *a, c=c, **kw: [c]), (lambda *a, **kw: None)
        for name, (kc, vc, extra) in layouts.items():
            if cfg != "rule" and name == "contiguous" and cfg != (64, 4, 3): continue
            f = lambda: triton_fa2.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, **extra)
            with tuning.tuning(False):
                out = f()
                err = (out.float() - ref).abs().max().item()
                g = capture(f)[0]
            us = replay_ms(g, 300) * 1e3
            picks = [c.label for key, c in dispatch._PICKS.items() if key[0] == "decode"]
            print(json.dumps(dict(side=label, round=rnd, B=B, Lk=Lk, layout=name, cfg=str(cfg), picked=picks[-1] if picks else "", us=round(us, 3), err=err)), flush=True)
            del g
    del layouts, k, v, q
    torch.cuda.empty_cache()
