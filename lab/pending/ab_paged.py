"""One process: our decode on contiguous and paged caches (pages 1, 16, 256) at the serving shapes, the rules' configs (the same on both sides), CUDA-graph medians."""
import sys, json, statistics, torch, triton_fa2
from triton_fa2.tuning import tuning
sys.path.insert(0, "tools"); sys.path.insert(0, "../tools")
from measure_serving import capture, replay_ms, block_table, paged
tag = sys.argv[1]
out = []
with torch.no_grad(), tuning(False):
    for B, Lk in ((8, 8192), (64, 4096), (1, 32768)):
        torch.manual_seed(0)
        q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, Lk, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((B,), Lk, dtype=torch.int32, device="cuda")
        ref = triton_fa2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True).float()
        cases = [("contiguous", lambda: triton_fa2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True))]
        for ps in (1, 16, 256):
            table, blocks = block_table(B, Lk, ps, 8, "cuda")
            kp, vp = paged(k, table, ps, blocks), paged(v, table, ps, blocks)
            cases.append((f"page{ps}", (lambda kp=kp, vp=vp, table=table: triton_fa2.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=True))))
        for name, fn in cases:
            o = fn(); err = (o.float() - ref).abs().max().item()
            g, o2 = capture(fn)
            err = max(err, (o2.float() - ref).abs().max().item())
            ms = replay_ms(g, 1000)
            out.append(dict(tag=tag, B=B, Lk=Lk, case=name, ms=ms, err=err))
            print(tag, B, Lk, name, f"{ms*1e3:.2f} us err {err:.1e}", flush=True)
            del g
print("JSON", json.dumps(out))
