"""Serving figures in one process on a GPU: varlen prefill of a mixed batch against padding it dense, and paged decode against contiguous caches, ours next to SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends, to results/serving.csv.

section=varlen_prefill: 16 sequences of 100 to 8000 tokens (SEQLENS, 32768 tokens in all), Hq=32, Hkv=8, D=128, bf16,
causal. Providers: triton_fa2.flash_attn_varlen_func on the packed (total, H, D) tensors; triton_fa2.flash_attn_func
on the same tokens right-padded to a dense (16, 8000, H, D) batch; SDPA's flash and cuDNN backends (enable_gqa) on that
padded batch laid out (B, H, L, D) beforehand, with is_causal=True, because neither takes a padding mask: every dense
row computes its padded rows too. Right padding leaves each real query's causal keys real, so every provider's real
rows are the same attention. FLOPs are 4·Hq·D·L²/2 per sequence (triton_fa2.attention_flops): `real_flops` sums the
16 real sequences, `computed_flops` is what a dense call does (16 sequences of 8000). `tflops_real` = real FLOPs over
the time (what a server gets), `tflops_computed` = the work done over the time. On the varlen row,
`varlen_per_token_vs_dense` = its tflops_real / ours dense tflops_computed: varlen's throughput per real token against
the throughput our dense kernel reaches on work without raggedness. A row, `triton_fa2.flash_attn_func at each length`, is our dense
kernel on the mix's own lengths: each distinct length L as a dense batch of ⌊32768 / L⌋ sequences (about as many tokens
as the mix, so a full GPU; the first is a sequence of the mix, checked against its reference), and `ms` the sum over the
16 sequences of that batch's time divided by its batch size: the time the same work takes where no sequence shares a
launch with another of a different length. On the varlen row `varlen_vs_dense_same_lengths` = its tflops_real / that
row's: what packing itself costs, short sequences' lower efficiency (more of their tiles on the diagonal) set aside. A
last row, `triton_fa2.flash_attn_varlen_func at each length`, times the same batches packed (uniform lengths through
the varlen call): against the dense row it is what packing costs at one length, against the varlen row what mixing
lengths in one launch costs. `ms` is triton.testing.do_bench's median (CUDA
events around each call, L2 cleared between calls). With `--rounds N` the packed call and both rows at each length are
timed N times in turn (each round checks them again), each row's `ms` the median, every round's in its `note`: the
GPU's clock drifts under sustained load, and the three are compared with one another.

section=paged_decode: one query token per sequence at (B, Lk) = (8, 8192), (64, 4096), (1, 32768), Hq=32, Hkv=8,
D=128, bf16, full caches. Providers: triton_fa2.flash_attn_with_kvcache on the contiguous (B, Lk, Hkv, D) cache; on
paged pools (num_blocks, page_size, Hkv, D) at page sizes 1, 16 and 256, each sequence's pages at randomly permuted
block ids, with a few spare blocks (spare blocks and the unused tail of a last page hold NaN, so that a read outside a
sequence shows as a wrong result); triton_fa2.decode on the same cache laid out (B, Hkv, Lk, D) (the same kernel
reached through the other layout); SDPA's flash and cuDNN backends with enable_gqa on q (B, Hq, 1, D) and that
(B, Hkv, Lk, D) cache, is_causal=False (SDPA's causal mask is top-left: one query would see one key; ours is
bottom-right, where one query sees them all). `ms` is the median over CUDA-graph replays (each call captured once
after warm-up, every replay between its own CUDA events), `ms_eager` do_bench's median of eager calls (launch overhead
included where it exceeds the GPU time). `kv_bytes` = B·Lk·Hkv·D·2·2 (K and V read once), `gbps` = kv_bytes over `ms`,
`gbps_eager` over `ms_eager`, `gbps_vs_contiguous` = gbps / the contiguous flash_attn_with_kvcache row's gbps.

Each provider's output is first checked against the float32 reference (triton_fa2.naive.attention_ref, run per sampled
sequence on its own tokens, sampled heads for prefill): `err` is the largest |o − o_ref|; `ok` is False for NaN or an
error above the dtype's tolerance (triton_fa2.__main__.TOLERANCES) times max(1, max |o_ref|), and such a provider is
not timed; it is checked again after timing, and the graph's output after replay. A provider that cannot run says why
in `note`. On a GPU triton_fa2 runs tuned, as the benchmark does (the first call of a new shape times every candidate,
outside the timing); `config` names the configs its first call picked. Every row carries gpu, torch, triton, commit and date (triton_fa2.bench.run_config).

--tiny runs every step on tiny shapes (H 4/2, D 64, ~200 prefill tokens, Lk ≤ 96, B ≤ 2): on a GPU as a quick check;
without one under Triton's interpreter, where SDPA's backend choice and CUDA graphs are skipped (noted per row) and
`ms` is the wall clock of a few calls (`timer` says which clock each row used).

    python tools/measure_serving.py --out results/serving.csv --commit $(git rev-parse --short HEAD) --rounds 4
    python tools/measure_serving.py --tiny --out /tmp/serving_tiny.csv          # no GPU needed
"""
import triton_fa2  # first: without a GPU it selects Triton's interpreter before triton is imported
import argparse, contextlib, csv, dataclasses, itertools, math, pathlib, statistics, time, warnings

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from triton_fa2.__main__ import TOLERANCES
from triton_fa2.bench import run_config
from triton_fa2.naive import attention_ref
from triton_fa2.tuning import tuning

COLUMNS = ["section", "provider", "layout", "batch", "heads_q", "heads_kv", "head_dim", "dtype", "causal",
           "seqlens", "seqlen_k", "page_size", "ms", "ms_eager", "timer",
           "real_tokens", "computed_tokens", "real_flops", "computed_flops", "tflops_real", "tflops_computed",
           "varlen_per_token_vs_dense", "varlen_vs_dense_same_lengths", "kv_bytes", "gbps", "gbps_eager", "gbps_vs_contiguous",
           "err", "ok", "note", "config", "gpu", "torch", "triton", "commit", "date"]

# Odd lengths (no tile multiples) in no particular order, as a scheduler hands them over; they sum to 32768.
SEQLENS = (2917, 100, 8000, 611, 1493, 4321, 257, 3109, 813, 1999, 145, 5555, 389, 1171, 977, 911)


@dataclasses.dataclass(frozen=True)
class Shapes:
    seqlens: tuple       # the prefill batch's sequence lengths
    heads_q: int
    heads_kv: int
    head_dim: int
    decode: tuple        # (B, Lk) of each decode case
    page_sizes: tuple
    spare_blocks: int    # pool blocks that no sequence owns


FULL = Shapes(SEQLENS, 32, 8, 128, ((8, 8192), (64, 4096), (1, 32768)), (1, 16, 256), 8)
TINY = Shapes((23, 100, 7, 61), 4, 2, 64, ((2, 64), (2, 40), (1, 96)), (1, 16, 256), 3)   # 40, 96: partial last pages
DTYPE = torch.bfloat16
CPU_CALLS = 3            # the interpreter takes about a second a call: a median of few


def eager_ms(fn, gpu:bool, warmup_ms:int, rep_ms:int) -> float:
    "Median ms per call: CUDA events around each call on a GPU (do_bench, L2 cleared in between); the wall clock on the CPU."
    if gpu: return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    times = []
    for _ in range(CPU_CALLS):
        start = time.perf_counter(); fn(); times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def capture(fn) -> tuple:
    "fn() captured once in a CUDA graph after warm-up on a side stream (cuBLAS/cuDNN set up outside the capture); (graph, its output)."
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): out = fn()
    graph.replay(); torch.cuda.synchronize()
    return graph, out


def replay_ms(graph, replays:int) -> float:
    "Median ms of one replay; every replay between its own pair of CUDA events, read after the last."
    for _ in range(10): graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record(); graph.replay(); end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def check(pieces:dict, refs:dict) -> tuple:
    "(largest |o − o_ref| over the sampled pieces, whether every piece is within tolerance · max(1, max |o_ref|)); NaN fails."
    err, ok = 0.0, True
    for key, ref in refs.items():
        diff = (pieces[key].float() - ref).abs().max().item()
        if not math.isfinite(diff): return diff, False
        err = max(err, diff)
        ok = ok and diff <= TOLERANCES[DTYPE] * max(1.0, ref.abs().max().item())
    return err, ok


def reason(e:Exception, caught:list) -> str:
    "One line: the exception, then the warnings that came with it (SDPA explains a refused backend in warnings)."
    text = "; ".join([f"{type(e).__name__}: {str(e).strip()}"] + [str(w.message).strip() for w in caught])
    return " ".join(text.split())[:400]


@contextlib.contextmanager
def picks_recorded():
    """The labels of the configs triton_fa2's dispatcher picks inside the block, its cache of picks emptied first so that
    every call chooses again (from the tuning cache or the rules; nothing is timed twice)."""
    from triton_fa2 import dispatch
    seen, real = [], dispatch._choose
    def choose(*args, **kwargs):
        pick = real(*args, **kwargs)
        seen.append(pick.label)
        return pick
    dispatch._PICKS.clear()
    dispatch._choose = choose
    try: yield seen
    finally: dispatch._choose = real


def measure(fn, pieces_of, refs:dict, gpu:bool, graph:bool, replays:int, warmup_ms:int, rep_ms:int) -> dict:
    """Check fn() against refs, then time it: the row's measured fields. pieces_of(o) maps fn's output to refs' keys.
    graph: ms from CUDA-graph replays and ms_eager from eager calls; otherwise ms from eager calls. `config`: what
    triton_fa2 picked on the first call (empty for the other providers)."""
    values = dict(ms="", ms_eager="", err="", ok=False, note="", config="")
    wrong = lambda err, when: f"wrong result{when}: max abs error {err:.2e} (NaN or above {TOLERANCES[DTYPE]:.1e} · max(1, |o_ref|))"
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught, picks_recorded() as picks:
            warnings.simplefilter("always")
            o = fn()                                  # the first call compiles (and on a GPU tunes) triton_fa2
            if gpu: torch.cuda.synchronize()
        values["config"] = " + ".join(picks)
    except Exception as e:
        values["note"] = reason(e, caught)
        return values
    err, ok = check(pieces_of(o), refs); del o
    values.update(err=f"{err:.2e}", ok=ok)
    if not ok:
        values["note"] = wrong(err, "")
        return values
    try:
        ms_eager = eager_ms(fn, gpu, warmup_ms, rep_ms)
        after, ok = check(pieces_of(fn()), refs)      # the path the timed calls took (a saved launch) is checked too
    except Exception as e:
        values["note"] = "timing: " + reason(e, [])
        return values
    err = max(err, after) if math.isfinite(after) else after
    values.update(err=f"{err:.2e}", ok=ok)
    if not ok:
        values["note"] = wrong(err, " after timing")
        return values
    if not graph:
        values["ms"] = f"{ms_eager:.4f}"
        return values
    values["ms_eager"] = f"{ms_eager:.4f}"
    if not gpu:
        values.update(ms=f"{ms_eager:.4f}", note="CPU: no CUDA graph, ms is the eager wall clock")
        return values
    try:
        cuda_graph, out = capture(fn)
        after, ok = check(pieces_of(out), refs)
        err = max(err, after) if math.isfinite(after) else after
        values.update(err=f"{err:.2e}", ok=ok)
        if not ok: values["note"] = wrong(err, " in a CUDA graph")
        else: values["ms"] = f"{replay_ms(cuda_graph, replays):.4f}"
        del cuda_graph, out
    except Exception as e:
        values["note"] = "CUDA graph: " + reason(e, [])
    return values


def sdpa(backend, q, k, v, causal:bool, gpu:bool):
    "SDPA on one backend (on the CPU: torch's own choice, the GPU backends do not exist there)."
    def call():
        with sdpa_kernel(backend) if gpu else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return call


def fmt(x:float) -> str: return f"{x:.4g}"


def print_row(r:dict):
    figures = " ".join(f"{c}={r[c]}" for c in ("ms", "ms_eager", "tflops_real", "tflops_computed", "gbps", "gbps_vs_contiguous",
                                               "varlen_per_token_vs_dense", "varlen_vs_dense_same_lengths", "err", "ok") if r[c] != "")
    where = f"B={r['batch']}" + (f" Lk={r['seqlen_k']}" if r["section"] == "paged_decode" else "")
    print(f"{r['section']:<14} {r['provider']:<34} {r['layout']:<34} {where} {figures} {r['note']}", flush=True)


def same_lengths(q, k, v, lens:tuple, starts:list, refs:dict, gpu:bool, packed:bool=False) -> dict:
    """Our dense kernel at each distinct length of the mix, a batch of ⌊total / L⌋ sequences of L tokens whose first is
    a sequence of the mix: each checked (against `refs` where that sequence has them, else head 0's float32 reference)
    and timed; with `packed`, the same batch packed end to end through flash_attn_varlen_func (uniform lengths: packing
    without a mix). The row's measured fields: `ms` = Σ over the mix's sequences of their length's time / its batch size."""
    Hq, Hkv = q.shape[1], k.shape[1]
    ms, errs, notes, configs = 0.0, [], [], []
    for L in sorted(set(lens)):
        n, b = max(1, sum(lens) // L), lens.index(L)
        rows = slice(starts[b], starts[b] + L)
        def batch(x):
            out = torch.randn(n, L, *x.shape[1:], device=x.device, dtype=x.dtype)
            out[0] = x[rows]
            return out
        qL, kL, vL = batch(q), batch(k), batch(v)
        checked = {key: ref for key, ref in refs.items() if key[0] == b}
        if not checked:
            one = lambda t: t[rows, :1].transpose(0, 1)[None]                      # head 0: (1, 1, L, D)
            checked = {(b, 0): attention_ref(one(q), one(k), one(v), causal=True)[0][0, 0]}
        if packed:
            cu = torch.arange(0, (n + 1) * L, L, dtype=torch.int32, device=q.device)
            flat = lambda t: t.flatten(0, 1)                                        # (n, L, H, D) → (n·L, H, D)
            fn = lambda: triton_fa2.flash_attn_varlen_func(flat(qL), flat(kL), flat(vL), cu, cu, L, L, causal=True).view(qL.shape)
        else:
            fn = lambda: triton_fa2.flash_attn_func(qL, kL, vL, causal=True)
        values = measure(fn, lambda o: {key: o[0, :, key[1]] for key in checked}, checked, gpu, graph=False, replays=0,
                         warmup_ms=100, rep_ms=1000)
        del qL, kL, vL
        if not values["ms"]:
            return dict(ms="", err=values["err"], ok=False, note=f"length {L}: {values['note']}", config=values["config"])
        ms += float(values["ms"]) / n * lens.count(L)
        errs.append(float(values["err"]))
        configs.append(f"{L}: {values['config']}" if values["config"] else "")
    note = (f"each length as a {'packed' if packed else 'dense'} batch of about {sum(lens)} tokens, each sequence its share of"
            " that batch's time")
    return dict(ms=f"{ms:.4f}", err=f"{max(errs):.2e}", ok=True, note=note, config="; ".join(filter(None, configs)))


def prefill_rows(shapes:Shapes, meta:dict, device, gpu:bool, rounds:int=1) -> list:
    Hq, Hkv, D, lens = shapes.heads_q, shapes.heads_kv, shapes.head_dim, shapes.seqlens
    B, Lmax, total = len(lens), max(lens), sum(lens)
    starts = [0, *itertools.accumulate(lens)]
    torch.manual_seed(0)
    q, k, v = (torch.randn(total, H, D, device=device, dtype=DTYPE) for H in (Hq, Hkv, Hkv))
    cu_seqlens = torch.tensor(starts, dtype=torch.int32, device=device)

    def padded(x):
        "(total, H, D) → (B, Lmax, H, D), zeros after each sequence's end."
        out = x.new_zeros(B, Lmax, *x.shape[1:])
        for b, L in enumerate(lens): out[b, :L] = x[starts[b]:starts[b] + L]
        return out
    q_pad, k_pad, v_pad = padded(q), padded(k), padded(v)
    q_bhld, k_bhld, v_bhld = (t.transpose(1, 2).contiguous() for t in (q_pad, k_pad, v_pad))   # SDPA's layout, before timing

    g = Hq // Hkv
    sampled = sorted({0, B - 1, lens.index(min(lens)), lens.index(max(lens))})   # both ends of the packing, shortest, longest
    heads = sorted({0, Hq // 2, Hq - 1})
    refs = {}
    for b in sampled:
        rows = slice(starts[b], starts[b + 1])
        for h in heads:
            one = lambda t, head: t[rows, head:head + 1].transpose(0, 1)[None]   # (1, 1, L, D)
            refs[b, h] = attention_ref(one(q, h), one(k, h // g), one(v, h // g), causal=True)[0][0, 0]
    pieces = lambda seq_rows: (lambda o: {(b, h): seq_rows(o, b)[h] for b, h in refs})   # seq_rows(o, b): (Hq, L_b, D)

    seq_flops = [triton_fa2.attention_flops(1, Hq, L, L, D, True) for L in lens]
    real_flops, dense_flops = sum(seq_flops), B * triton_fa2.attention_flops(1, Hq, Lmax, Lmax, D, True)
    no_mask = "padded dense batch, is_causal=True: no padding mask, so the padded rows are computed too"
    providers = [
        ("triton_fa2.flash_attn_varlen_func", "packed (total, H, D)",
         lambda: triton_fa2.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, Lmax, Lmax, causal=True),
         lambda o, b: o[starts[b]:starts[b + 1]].transpose(0, 1), False, ""),
        ("triton_fa2.flash_attn_func", "padded (B, Lmax, H, D)",
         lambda: triton_fa2.flash_attn_func(q_pad, k_pad, v_pad, causal=True),
         lambda o, b: o[b, :lens[b]].transpose(0, 1), True, "padded dense batch: the padded rows are computed too"),
        ("sdpa_flash", "padded (B, H, Lmax, D)", sdpa(SDPBackend.FLASH_ATTENTION, q_bhld, k_bhld, v_bhld, True, gpu),
         lambda o, b: o[b, :, :lens[b]], True, no_mask),
        ("sdpa_cudnn", "padded (B, H, Lmax, D)", sdpa(SDPBackend.CUDNN_ATTENTION, q_bhld, k_bhld, v_bhld, True, gpu),
         lambda o, b: o[b, :, :lens[b]], True, no_mask),
    ]
    timer = "do_bench median, CUDA events per call, L2 cleared" if gpu else f"wall clock, median of {CPU_CALLS} calls, Triton interpreter"
    out = []
    for provider, layout, fn, seq_rows, dense, note in providers:
        values = measure(fn, pieces(seq_rows), refs, gpu, graph=False, replays=0, warmup_ms=100, rep_ms=1000)
        if not gpu and provider.startswith("sdpa"): note = "; ".join(filter(None, [note, "CPU: backend choice skipped, torch's CPU kernel ran"]))
        computed = dense_flops if dense else real_flops
        r = dict.fromkeys(COLUMNS, "")
        r.update(meta, section="varlen_prefill", provider=provider, layout=layout, batch=B, heads_q=Hq, heads_kv=Hkv,
                 head_dim=D, dtype="bf16", causal=1, seqlens=" ".join(map(str, lens)), timer=timer,
                 real_tokens=total, computed_tokens=B * Lmax if dense else total, real_flops=int(real_flops),
                 computed_flops=int(computed), **values)
        r["note"] = "; ".join(filter(None, [note, values["note"]]))
        if r["ms"]:
            r.update(tflops_real=fmt(real_flops / float(r["ms"]) / 1e9), tflops_computed=fmt(computed / float(r["ms"]) / 1e9))
        out.append(r)
    def each_length(base:dict, provider:str, layout:str, packed:bool) -> dict:
        "A row of `same_lengths`: the mix's work at each of its lengths, dense or packed, built on `base`'s fields."
        r = dict(base, provider=provider, layout=layout, computed_tokens=total, computed_flops=int(real_flops), tflops_real="",
                 tflops_computed="", ms_eager="", **same_lengths(q, k, v, lens, starts, refs, gpu, packed=packed))
        r["timer"] = timer + "; ms: the sum over the sequences of their length's batch time / its batch size"
        if r["ms"]: r.update(tflops_real=fmt(real_flops / float(r["ms"]) / 1e9), tflops_computed=fmt(real_flops / float(r["ms"]) / 1e9))
        return r
    same = each_length(out[1], "triton_fa2.flash_attn_func at each length", "dense (⌊total / L⌋, L, H, D) per length", False)
    out += [same, each_length(out[0], "triton_fa2.flash_attn_varlen_func at each length",
                              "packed (⌊total / L⌋ · L, H, D) per length", True)]
    varlen, dense = out[0], out[1]
    timed = {0: [varlen["ms"]], 4: [same["ms"]], 5: [out[5]["ms"]]}   # the packed call against our dense kernel at its lengths
    for _ in range(rounds - 1):                                         # again, the three rows in turn, checked each time
        timed[0].append(measure(providers[0][2], pieces(providers[0][3]), refs, gpu, graph=False, replays=0,
                                warmup_ms=100, rep_ms=1000)["ms"])
        timed[4].append(same_lengths(q, k, v, lens, starts, refs, gpu)["ms"])
        timed[5].append(same_lengths(q, k, v, lens, starts, refs, gpu, packed=True)["ms"])
    for i, times in timed.items():
        if rounds == 1 or not all(times): continue
        r = out[i]
        r["ms"] = f"{statistics.median(map(float, times)):.4f}"
        r["timer"] += f"; ms: the median of {rounds} rounds of this row and the two others timed in turn with it"
        r["note"] = "; ".join(filter(None, [r["note"], "rounds' ms " + " ".join(f"{float(t):.4f}" for t in times)]))
        r.update(tflops_real=fmt(real_flops / float(r["ms"]) / 1e9), tflops_computed=fmt(real_flops / float(r["ms"]) / 1e9))
    if varlen["tflops_real"] and dense["tflops_computed"]:
        varlen["varlen_per_token_vs_dense"] = fmt(float(varlen["tflops_real"]) / float(dense["tflops_computed"]))
    if varlen["tflops_real"] and same["tflops_real"]:
        varlen["varlen_vs_dense_same_lengths"] = fmt(float(varlen["tflops_real"]) / float(same["tflops_real"]))
    for r in out: print_row(r)
    del q, k, v, q_pad, k_pad, v_pad, q_bhld, k_bhld, v_bhld, refs
    if gpu: torch.cuda.empty_cache()
    return out


def block_table(batch:int, seqlen:int, page_size:int, spare_blocks:int, device) -> tuple:
    "Each sequence's pages at randomly permuted block ids of a pool with spare_blocks that no sequence owns: (int32 (B, pages), blocks)."
    pages = -(-seqlen // page_size)
    blocks = batch * pages + spare_blocks
    return torch.randperm(blocks, device=device)[:batch * pages].view(batch, pages).to(torch.int32), blocks


def paged(cache:torch.Tensor, table:torch.Tensor, page_size:int, blocks:int) -> torch.Tensor:
    """cache (B, Lk, Hkv, D) copied into a pool (blocks, page_size, Hkv, D) at table's blocks; the blocks no sequence owns
    and a last page's unused tail hold NaN, so that the kernel reading any of them shows as a wrong result."""
    B, Lk = cache.shape[:2]
    pages = table.shape[1]
    pool = cache.new_full((blocks, page_size, *cache.shape[2:]), float("nan"))
    if pages * page_size != Lk:
        cache = torch.cat([cache, cache.new_full((B, pages * page_size - Lk, *cache.shape[2:]), float("nan"))], dim=1)
    pool[table.long()] = cache.view(B, pages, page_size, *cache.shape[2:])
    return pool


def decode_rows(shapes:Shapes, meta:dict, device, gpu:bool, replays:int) -> list:
    Hq, Hkv, D = shapes.heads_q, shapes.heads_kv, shapes.head_dim
    timer = ("ms: median of CUDA-graph replays (CUDA events per replay); ms_eager: do_bench median" if gpu
             else f"wall clock, median of {CPU_CALLS} eager calls, Triton interpreter")
    out = []
    for B, Lk in shapes.decode:
        torch.manual_seed(0)
        q = torch.randn(B, 1, Hq, D, device=device, dtype=DTYPE)
        k, v = (torch.randn(B, Lk, Hkv, D, device=device, dtype=DTYPE) for _ in range(2))
        q_bhld, k_bhld, v_bhld = (t.transpose(1, 2).contiguous() for t in (q, k, v))   # (B, H, L, D), before timing
        cache_seqlens = torch.full((B,), Lk, dtype=torch.int32, device=device)
        refs = {b: attention_ref(q_bhld[b:b+1], k_bhld[b:b+1], v_bhld[b:b+1], causal=True)[0][0] for b in sorted({0, B // 2, B - 1})}
        flash_layout = lambda o: {b: o.transpose(1, 2)[b] for b in refs}    # (B, 1, Hq, D) → (Hq, 1, D) per sequence
        sdpa_layout = lambda o: {b: o[b] for b in refs}
        kv_bytes = 2 * B * Lk * Hkv * D * k.element_size()
        rows = []

        def run(provider, layout, fn, pieces_of, page_size="", note=""):
            values = measure(fn, pieces_of, refs, gpu, graph=True, replays=replays, warmup_ms=50, rep_ms=300)
            r = dict.fromkeys(COLUMNS, "")
            r.update(meta, section="paged_decode", provider=provider, layout=layout, batch=B, heads_q=Hq, heads_kv=Hkv,
                     head_dim=D, dtype="bf16", causal=1, seqlen_k=Lk, page_size=page_size, timer=timer, kv_bytes=kv_bytes, **values)
            r["note"] = "; ".join(filter(None, [note, values["note"]]))
            if r["ms"]: r["gbps"] = fmt(kv_bytes / float(r["ms"]) / 1e6)
            if r["ms_eager"]: r["gbps_eager"] = fmt(kv_bytes / float(r["ms_eager"]) / 1e6)
            rows.append(r)

        run("triton_fa2.flash_attn_with_kvcache", "contiguous (B, Lk, Hkv, D)",
            lambda: triton_fa2.flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens, causal=True), flash_layout)
        run("triton_fa2.decode", "contiguous (B, Hkv, Lk, D)",
            lambda: triton_fa2.decode(q_bhld, k_bhld, v_bhld, cache_seqlens=cache_seqlens, causal=True), sdpa_layout,
            note="the kernel of flash_attn_with_kvcache, reached with the cache head-major")
        for page_size in shapes.page_sizes:
            table, blocks = block_table(B, Lk, page_size, shapes.spare_blocks, device)
            k_pool, v_pool = paged(k, table, page_size, blocks), paged(v, table, page_size, blocks)
            run("triton_fa2.flash_attn_with_kvcache", "paged (num_blocks, page_size, Hkv, D)",
                lambda: triton_fa2.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=cache_seqlens,
                                                           block_table=table, causal=True),
                flash_layout, page_size=page_size, note=f"{blocks} blocks, {shapes.spare_blocks} spare")
            del k_pool, v_pool, table
        cpu_note = "" if gpu else "CPU: backend choice skipped, torch's CPU kernel ran"
        for provider, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            run(provider, "contiguous (B, Hkv, Lk, D)", sdpa(backend, q_bhld, k_bhld, v_bhld, False, gpu), sdpa_layout,
                note="; ".join(filter(None, ["is_causal=False: one query sees every key, as ours", cpu_note])))
        base = rows[0]
        for r in rows:
            if r["gbps"] and base["gbps"]: r["gbps_vs_contiguous"] = fmt(float(r["gbps"]) / float(base["gbps"]))
            print_row(r)
        out += rows
        del q, k, v, q_bhld, k_bhld, v_bhld, refs
        if gpu: torch.cuda.empty_cache()
    return out


def write(rows:list, path:pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS); w.writeheader(); w.writerows(rows)
    print("wrote", path, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/serving.csv", help="the CSV to write (both sections)")
    p.add_argument("--commit", default=None, help="recorded on every row (default: git rev-parse --short HEAD)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a check of every step, runs without a GPU in a few minutes")
    p.add_argument("--only", choices=["prefill", "decode"], default=None, help="one section only")
    p.add_argument("--replays", type=int, default=1000, help="CUDA-graph replays per decode median")
    p.add_argument("--rounds", type=int, default=1, help="time the packed call and our dense and packed kernels at its "
                   "lengths this many times in turn, each row's ms the median")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu and not a.tiny:
        p.error("without a GPU only --tiny runs: Triton's interpreter would take hours on the full shapes")
    shapes, device = (TINY if a.tiny else FULL), torch.device("cuda" if gpu else "cpu")
    meta = run_config(a.commit)
    rows = []
    with torch.no_grad(), tuning(gpu):    # tuned on a GPU, as the benchmark measures; the interpreter would time every candidate
        if a.only in (None, "prefill"): rows += prefill_rows(shapes, meta, device, gpu, a.rounds)
        if a.only in (None, "decode"): rows += decode_rows(shapes, meta, device, gpu, a.replays)
    write(rows, pathlib.Path(a.out))


if __name__ == "__main__":
    main()
