"""Compile our kernels for a Hopper GPU (sm_90) on a machine without one: the compiler's errors, registers, spills and
shared memory of any config, through descriptors or pointers, in seconds and without device time. Nothing runs; timing still needs the H200.

    python tools/compile_sm90.py --all [--workers 2]     # every kernel and config the package ships; exit 1 on a spill, an error or
                                                     # a paged launch holding fewer K/V tiles than its contiguous twin
    python tools/compile_sm90.py --all --fingerprint before.json    # … and the SASS hash of each, to a JSON file
    python tools/compile_sm90.py --all --compare before.json        # … exit 1 where the SASS differs (a refactor that should not change a kernel)
    python tools/compile_sm90.py --config "128,64,4,2;64,64,4,3" [--pointers] [--causal] [--fp16] [--shape B,H,N,D] [--ttgir]

Arguments are built as the kernels' own `launch` functions build them (CPU tensors stand in for GPU ones: same dtypes, strides and
16-byte alignment), so the specialisation is the one the GPU compiles."""
import os
os.environ["TRITON_INTERPRET"] = "0"          # compile, do not interpret (triton_fa2 would choose the interpreter)
import argparse, concurrent.futures, contextlib, csv, datetime, functools, hashlib, json, re, sys, traceback
import torch, triton
import triton_fa2.backward as bwd
import triton_fa2.gluon_backward as gluon_bwd
import triton_fa2.forward as fwd
import triton_fa2.split_kv as split_kv
import triton_fa2.varlen as varlen
from triton_fa2 import candidates, gluon
from triton_fa2.candidates import Candidate
from triton_fa2.runtime import compile_for_gpu, cuobjdump, resource_usage, triton_release

H200_SMEM = 232448   # bytes of shared memory a block may use on sm_90


def all_mods(Hq:int, on:bool):
    "Every score modifier at once (a causal window, softcap, ALiBi, sinks; CPU tensors stand in), or None."
    return fwd.ScoreMods((256, 0), 50.0, torch.empty(Hq), torch.empty(Hq)) if on else None


class _Offline:
    "Stands in for a kernel inside the package's launch code: compiles for sm_90 instead of launching."
    def __init__(self, jitfn): self.jitfn, self.compiled = jitfn, []
    def __getitem__(self, grid):
        def launch(*args, **kwargs): self.compiled.append(compile_for_gpu(self.jitfn, *args, **kwargs))
        return launch


@contextlib.contextmanager
def offline(module, *names):
    "Within the block, `module`'s kernels `names` compile for sm_90 when launched; yields their recorders."
    real = [getattr(module, n) for n in names]
    stand_ins = [_Offline(k) for k in real]
    for n, s in zip(names, stand_ins): setattr(module, n, s)
    try: yield stand_ins
    finally:
        for n, k in zip(names, real): setattr(module, n, k)


def compile_forward(B=8, H=32, N=2048, D=128, causal=True, dtype=torch.bfloat16, config=(128, 64, 8, 3), use_tma=True, mods=False):
    "Compile `_attn_fwd` for one shape, config (BLOCK_M, BLOCK_N, warps, stages) and tile source; the CompiledKernel."
    q, k, v = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(3))
    with offline(fwd, "_attn_fwd") as (kernel,):
        fwd.launch(q, k, v, torch.empty_like(q), torch.empty(B, H, N), causal, D ** -0.5, Candidate("tl", *config), use_tma=use_tma,
                   mods=all_mods(H, mods))
    return kernel.compiled[0]


def compile_packed(B=2, Hq=32, Hkv=8, N=64, D=128, causal=True, dtype=torch.bfloat16, config=(64, 64, 4, 3)):
    "Compile `_attn_fwd` on its pointer path, the query heads of a KV head packed into one block (GQA with few rows)."
    q, k, v = torch.empty(B, Hq, N, D, dtype=dtype), torch.empty(B, Hkv, N, D, dtype=dtype), torch.empty(B, Hkv, N, D, dtype=dtype)
    with offline(fwd, "_attn_fwd") as (kernel,):
        fwd.launch(q, k, v, torch.empty_like(q), torch.empty(B, Hq, N), causal, D ** -0.5, Candidate("tl", *config), pack_gqa=True)
    return kernel.compiled[0]


def compile_varlen(lengths=(700, 2048, 1), Hq=32, Hkv=8, D=128, causal=True, dtype=torch.bfloat16, config=(64, 64, 4, 3), page_size=0,
                   use_tma=False, mods=False):
    """Compile `_attn_fwd_varlen` (packed sequences, pointers; K and V through descriptors with `use_tma`) for sequences of
    these lengths; with `page_size`, over a paged K/V."""
    total = sum(lengths)
    q, o = torch.empty(total, Hq, D, dtype=dtype), torch.empty(total, Hq, D, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    if page_size:
        per_seq = -(-max(lengths) // page_size)
        k, v = (torch.empty(len(lengths) * per_seq, page_size, Hkv, D, dtype=dtype) for _ in range(2))
        table = torch.arange(len(lengths) * per_seq, dtype=torch.int32).view(len(lengths), per_seq)
    else: k, v, table = *(torch.empty(total, Hkv, D, dtype=dtype) for _ in range(2)), None
    with offline(varlen, "_attn_fwd_varlen") as (kernel,):
        varlen.launch(q, k, v, o, torch.empty(Hq, total), cu, cu, causal, D ** -0.5, Candidate("tl", *config), table,
                      use_tma, all_mods(Hq, mods))
    return kernel.compiled[0]


def compile_varlen_backward(kernel, lengths=(700, 2048, 1), Hq=8, Hkv=2, D=128, causal=True, dtype=torch.bfloat16, config=(32, 64, 4, 2),
                            mods=False):
    "Compile one backward pass of packed sequences (`bwd_dkdv` or `bwd_dq`, pointers) for sequences of these lengths."
    total = sum(lengths)
    q, do = (torch.empty(total, Hq, D, dtype=dtype) for _ in range(2))
    k, v = (torch.empty(total, Hkv, D, dtype=dtype) for _ in range(2))
    m = delta = torch.empty(Hq, total)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    c = Candidate(kernel, *config)
    if kernel == "bwd_dkdv":
        with offline(varlen, "_attn_bwd_dkdv_varlen") as (compiled,):
            varlen.launch_dkdv(q, k, v, do, torch.empty_like(k), torch.empty_like(v), m, delta, cu, cu, causal, D ** -0.5, c,
                               all_mods(Hq, mods))
    else:
        with offline(varlen, "_attn_bwd_dq_varlen") as (compiled,):
            varlen.launch_dq(q, k, v, do, torch.empty_like(q), m, delta, cu, cu, causal, D ** -0.5, c, all_mods(Hq, mods))
    return compiled.compiled[0]


def compile_fill(dtype=torch.bfloat16, lse=False):
    "Compile `_fill_unowned_rows` as the varlen operators launch it: on a packed (total, H, D) output, or on an LSE (H, total)."
    t = torch.empty(32, 3000) if lse else torch.empty(3000, 32, 128, dtype=dtype)
    with offline(varlen, "_fill_unowned_rows") as (kernel,):
        varlen.fill_unowned_rows(t, torch.tensor([0, 700, 2900], dtype=torch.int32), float("-inf") if lse else 0.0, dim=1 if lse else 0)
    return kernel.compiled[0]


def compile_decode(B=4, Hq=32, Hkv=8, Lq=1, Lmax=4096, D=128, dtype=torch.bfloat16, config=(64, 4, 2), num_splits=4, page_size=0,
                   mods=False):
    """Compile the split-KV decode kernel (Lq queries per sequence, ragged lengths) and the combine of its splits; with
    `page_size`, on a paged cache ((pages, Hkv, page_size, D) views and a block table)."""
    q = torch.empty(B, Hq, Lq, D, dtype=dtype)
    if page_size:
        pages = B * Lmax // page_size
        k_cache, v_cache = (torch.empty(pages, page_size, Hkv, D, dtype=dtype).transpose(1, 2) for _ in range(2))
        table = torch.arange(pages, dtype=torch.int32).view(B, -1)
    else: k_cache, v_cache, table = *(torch.empty(B, Hkv, Lmax, D, dtype=dtype) for _ in range(2)), None
    o, lse = torch.empty_like(q), torch.empty(B, Hq, Lq)
    with offline(split_kv, "_decode_fwd", "_combine_splits") as (split, combine):
        split_kv.launch(q, k_cache, v_cache, torch.full((B,), Lmax, dtype=torch.int32), o, lse,
                        *split_kv._partials(q, num_splits, o, lse), True, D ** -0.5, num_splits, Candidate("decode", 0, *config), table,
                        mods=all_mods(Hq, mods))
    return split.compiled[0], combine.compiled[0]


def compile_backward(kernel, B=2, Hq=8, Hkv=2, N=2048, D=128, causal=True, dtype=torch.bfloat16, config=(32, 128, 8, 3), pointers=False,
                     mods=False):
    """Compile one pass of the backward (`bwd_dkdv` or `bwd_dq`) through descriptors or pointers, on aligned views: the
    dispatcher copies a view TMA cannot address, so pointers serve GPUs without TMA, whose tensors are aligned."""
    q, do = (torch.empty(B, Hq, N, D, dtype=dtype) for _ in range(2))
    k, v = (torch.empty(B, Hkv, N, D, dtype=dtype) for _ in range(2))
    m = delta = torch.empty(B, Hq, N)
    c = Candidate(kernel, *config)
    if kernel == "bwd_dkdv":
        with offline(bwd, "_attn_bwd_dkdv") as (compiled,):
            bwd.launch_dkdv(q, k, v, do, torch.empty_like(k), torch.empty_like(v), m, delta, causal, D ** -0.5, c, use_tma=not pointers,
                            mods=all_mods(Hq, mods))
    else:
        with offline(bwd, "_attn_bwd_dq") as (compiled,):
            bwd.launch_dq(q, k, v, do, torch.empty_like(q), m, delta, causal, D ** -0.5, c, use_tma=not pointers, mods=all_mods(Hq, mods),
                          preprocess=(torch.empty_like(q), m, None))   # as the dispatcher launches it: M and Δ computed first
    return compiled.compiled[0]


def compile_gluon_dkdv(config, B=2, Hq=8, Hkv=2, N=2048, D=128, causal=True, dtype=torch.bfloat16, mods=None):
    "Compile the dK/dV pass in Gluon (a `gluon_dkdv` candidate; `mods`: 14's modifiers) as the dispatcher launches it on an H200."
    q, do = (torch.empty(B, Hq, N, D, dtype=dtype) for _ in range(2))
    k, v = (torch.empty(B, Hkv, N, D, dtype=dtype) for _ in range(2))
    m = delta = torch.empty(B, Hq, N)
    arguments = gluon_bwd._dkdv_ws_arguments if config.WARP_SPECIALIZE else gluon_bwd._dkdv_gluon_arguments
    named, _ = arguments(q, k, v, do, torch.empty_like(k), torch.empty_like(v), m, delta, causal, D ** -0.5, config, mods)
    return compile_for_gpu(gluon_bwd._attn_bwd_dkdv_ws if config.WARP_SPECIALIZE else gluon_bwd._attn_bwd_dkdv_gluon, **named)


def compile_gluon_dq(config, B=2, Hq=8, Hkv=2, N=2048, D=128, causal=True, dtype=torch.bfloat16, dlse=False, mods=None):
    """Compile the warp-specialised dQ pass in Gluon (a `gluon_dq` candidate) as the dispatcher launches it: rows' Δ and M
    computed first (`mods`: ALiBi, the one modifier of 14 it takes)."""
    q, do, o = (torch.empty(B, Hq, N, D, dtype=dtype) for _ in range(3))
    k, v = (torch.empty(B, Hkv, N, D, dtype=dtype) for _ in range(2))
    m = delta = lse = torch.empty(B, Hq, N)
    named, _ = gluon_bwd._dq_ws_arguments(q, k, v, do, torch.empty_like(q), m, delta, causal, D ** -0.5, config, mods,
                                          preprocess=(o, lse, torch.empty(B, Hq, N) if dlse else None))
    return compile_for_gpu(gluon_bwd._attn_bwd_dq_ws, **named)


def compile_gluon_varlen(config, lengths=(700, 2048, 1), Hq=32, Hkv=8, D=128, causal=True, dtype=torch.bfloat16, mods=None):
    "Compile a Gluon forward candidate over packed sequences (`gluon.launch_varlen`) for sequences of these lengths."
    total = sum(lengths)
    q, o = torch.empty(total, Hq, D, dtype=dtype), torch.empty(total, Hq, D, dtype=dtype)
    k, v = (torch.empty(total, Hkv, D, dtype=dtype) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    named, _ = gluon._arguments(*gluon._packed_views(q, k, v, o), torch.empty(Hq, total), causal, D ** -0.5, config, mods,
                                packed=(cu, cu))
    return compile_for_gpu(gluon._attn_fwd_ws if config.WARP_SPECIALIZE else gluon._attn_fwd_gluon, **named)


def shipped():
    """Every (kernel, config, head dim, path) the package can launch on an H200, as (name, job) pairs, from the candidate
    tables and their pruning. Prefill: at the tuned head dims and at 256 (the most registers any other head dim needs),
    through descriptors and packed through pointers; packed sequences (varlen) with every pointer candidate, over packed and paged K/V; decode at D 128 and 256, with one query per sequence and with 64
    packed rows (GQA 8:1 over 8 queries), on contiguous caches and paged ones (pages of 16 and of 1); the combine; the fill of rows no sequence owns; the backward's two passes, every candidate of each table at its
    head-dim tile width and path (packed sequences: the pointer tables); Gluon: every candidate at each of its head dims (the forward's and the dK/dV pass's, the latter with a window too),
    the forward's also with every score modifier it takes (`gluon.takes`) and with a window alone, causal and not, and over packed sequences (varlen;
    the one-warpgroup kernel's) with and without them. On a Triton release the Gluon kernels do not run on
    (`gluon.GLUON_RELEASES`) they are no launch of the package: one launch of each stays (`gluon_smoke`)."""
    jobs = []
    for D in (*candidates.TUNED_HEAD_DIMS, 256):
        for pointers in (False, True):
            for c in candidates.prefill_candidates(D, pointers, H200_SMEM):
                path = "packed pointers" if pointers else "descriptors"
                config = (c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages)
                jobs.append((f"prefill {c.label} D={D} {path}", ("packed" if pointers else "forward", D, config, None)))
        for c in candidates.prefill_candidates(D, True, H200_SMEM, varlen=True):
            config = (c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages)
            jobs.append((f"varlen {c.label} D={D}", ("varlen", D, config, None)))
            jobs.append((f"varlen {c.label} D={D} pages of 16", ("varlen", D, config, 16)))
        for c in candidates.prefill_candidates(D, False, H200_SMEM, varlen=True):
            config = (c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages)
            jobs.append((f"varlen {c.label} D={D} descriptors", ("varlen", D, config, "tma")))
    jobs.append(("fill unowned rows", ("fill", 0, None, None)))
    for Hkv, Lq in ((8, 1), (4, 8)):
        rows = 32 // Hkv * Lq
        for D in (128, 256):
            for c in candidates.decode_candidates(split_kv._decode_block_m(rows), D, H200_SMEM):
                config = (c.BLOCK_N, c.num_warps, c.num_stages)
                jobs.append((f"decode BLOCK_N={config[0]} w{config[1]} s{config[2]} D={D} rows={rows} + combine",
                             ("decode", D, config, (Hkv, Lq))))
                for page_size in (16, 1):                      # a paged cache: vLLM's pages and SGLang's
                    jobs.append((f"decode BLOCK_N={config[0]} w{config[1]} s{config[2]} D={D} rows={rows} pages of {page_size}",
                                 ("paged", D, config, (Hkv, Lq, page_size))))
    for (kernel, block_d, pointers), table in candidates.BACKWARD.items():
        for c in table:
            if candidates._backward_smem_bytes(c, block_d) > H200_SMEM: continue
            config = (c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages)
            path = "pointers" if pointers else "descriptors"
            jobs.append((f"backward {c.label} D={block_d} {path}", ("backward", block_d, config, (kernel, pointers))))
            if pointers and (c, block_d) not in candidates.VARLEN_BACKWARD_SPILLS:
                jobs.append((f"varlen backward {c.label} D={block_d}", ("varlen_backward", block_d, config, kernel)))
    for D, table in candidates.BACKWARD_GLUON.items():
        for c in table:
            jobs.append((f"backward {c.label} D={D}", ("gluon_dkdv", D, c, None)))
            if c.WARP_SPECIALIZE:                                         # takes windows, ALiBi, softcap alone
                jobs.append((f"backward {c.label} D={D} with ALiBi", ("gluon_dkdv", D, c, "alibi")))
                jobs.append((f"backward {c.label} D={D} with softcap", ("gluon_dkdv", D, c, "softcap")))
                jobs.append((f"backward {c.label} D={D} window", ("gluon_dkdv", D, c, "window")))
                jobs.append((f"backward {c.label} D={D} window and ALiBi", ("gluon_dkdv", D, c, "window and alibi")))
                continue
            jobs.append((f"backward {c.label} D={D} window", ("gluon_dkdv", D, c, "window")))
            if (c, D) not in candidates.BACKWARD_GLUON_SCORE_SPILLS:   # those never take softcap or ALiBi
                jobs.append((f"backward {c.label} D={D} with every modifier", ("gluon_dkdv", D, c, "every modifier")))
    for D, table in candidates.BACKWARD_GLUON_DQ.items():
        for c in table:                                                   # takes every modifier
            jobs.append((f"backward {c.label} D={D}", ("gluon_dq", D, c, None)))
            jobs.append((f"backward {c.label} D={D} window", ("gluon_dq", D, c, "window")))
            if (c, D) not in candidates.BACKWARD_GLUON_SCORE_SPILLS:   # those never take softcap or ALiBi
                jobs.append((f"backward {c.label} D={D} with ALiBi", ("gluon_dq", D, c, "alibi")))
                jobs.append((f"backward {c.label} D={D} with softcap and ALiBi", ("gluon_dq", D, c, "softcap and alibi")))
                jobs.append((f"backward {c.label} D={D} with every modifier", ("gluon_dq", D, c, "every modifier")))
    for c in candidates.PREFILL_GLUON:
        for D in (candidates.WARP_SPECIALIZED_HEAD_DIMS if c.WARP_SPECIALIZE else candidates.GLUON_HEAD_DIMS):
            jobs.append((f"{c.label} D={D}", ("gluon", D, c, None)))
            jobs.append((f"modifiers {c.label} D={D}", ("gluon_modifiers", D, c, None)))   # every one it takes: no spill
            if gluon.takes(c, WINDOW_ALONE):                   # a window alone (Mistral's, the common case): no spill;
                jobs.append((f"window {c.label} D={D}", ("gluon_window", D, c, "alone")))   # with every other modifier too
                jobs.append((f"window and modifiers {c.label} D={D}", ("gluon_window", D, c, "with every modifier")))
            if gluon.takes(c, varlen=True):                    # packed sequences: plain, and with every modifier
                jobs.append((f"varlen {c.label} D={D}", ("gluon_varlen", D, c, None)))
                jobs.append((f"varlen modifiers {c.label} D={D}", ("gluon_varlen", D, c, "modifiers")))
    for D in (64, 128, 256):                                   # every score modifier at once, on each kernel that takes them
        for kernel in ("forward", "pointers", "varlen", "decode", "bwd_dkdv", "bwd_dq", "varlen_bwd_dkdv", "varlen_bwd_dq"):
            jobs.append((f"modifiers {kernel} D={D}", ("modifiers", D, None, kernel)))
    return jobs if triton_release() in gluon.GLUON_RELEASES else gluon_smoke(jobs)


GLUON_KINDS = ("gluon", "gluon_modifiers", "gluon_window", "gluon_varlen", "gluon_dkdv", "gluon_dq")

def gluon_smoke(jobs:list) -> list:
    """`jobs` with one Gluon launch of each kind (forward, with modifiers, with a window, over packed sequences, each pass
    of the backward; warp-specialised or not): the first of each, which shows the Gluon code still compiles on this
    release, for the day it joins `gluon.GLUON_RELEASES`, without compiling every candidate of kernels that never run
    here. The `tl` kernels keep every launch."""
    seen, kept = set(), []
    for name, job in jobs:
        kind, D, config, heads = job
        if kind in GLUON_KINDS:
            if (kind, config.WARP_SPECIALIZE) in seen: continue
            seen.add((kind, config.WARP_SPECIALIZE))
        kept.append((name, job))
    return kept


def compile_job(job, sass:bool=False) -> list:
    """Compile one job of `shipped()`: [(kernel, resources)] for each kernel it launches, with `sass` the SASS's hash too
    (its disassembly takes about as long as the compile)."""
    kind, D, config, heads = job
    if kind == "forward": kernels = [("_attn_fwd", compile_forward(D=D, config=config))]
    elif kind == "packed": kernels = [("_attn_fwd", compile_packed(D=D, config=config))]
    elif kind == "varlen": kernels = [("_attn_fwd_varlen", compile_varlen(D=D, config=config, page_size=heads if heads != "tma" else 0,
                                                                          use_tma=heads == "tma"))]
    elif kind == "fill": kernels = [("_fill_unowned_rows bf16", compile_fill()), ("_fill_unowned_rows LSE", compile_fill(lse=True))]
    elif kind == "varlen_backward": kernels = [(heads, compile_varlen_backward(heads, D=D, config=config))]
    elif kind == "backward":
        kernel, pointers = heads
        kernels = [(f"{kernel} {mask}", compile_backward(kernel, D=D, config=config, pointers=pointers, causal=mask == "causal"))
                   for mask in ("causal", "full")]
    elif kind == "decode":
        Hkv, Lq = heads
        kernels = list(zip(("_decode_fwd", "_combine_splits"), compile_decode(Hkv=Hkv, Lq=Lq, D=D, config=config)))
    elif kind == "paged":
        Hkv, Lq, page_size = heads
        kernels = [("_decode_fwd", compile_decode(Hkv=Hkv, Lq=Lq, D=D, config=config, page_size=page_size)[0])]
    elif kind == "gluon_dkdv":
        mods = {"window": WINDOW_ALONE, "every modifier": all_mods(8, True), "alibi": ALIBI_ALONE, "softcap": SOFTCAP_ALONE,
                "window and alibi": ALIBI_ALONE._replace(window_size=WINDOW_ALONE.window_size)}.get(heads)
        kernels = [(f"{config.label} {mask}" + (f" with {'a window' if heads == 'window' else heads}" if mods else ""),
                    compile_gluon_dkdv(config, D=D, causal=mask == "causal", mods=mods))
                   for mask in ("causal", "full")]
    elif kind == "gluon_dq" and heads is not None:
        mods = {"alibi": ALIBI_ALONE, "softcap and alibi": ALIBI_ALONE._replace(softcap=50.0), "window": WINDOW_ALONE,
                "every modifier": ALIBI_ALONE._replace(softcap=50.0, window_size=WINDOW_ALONE.window_size)}[heads]
        kernels = [(f"{config.label} {mask} with {'a window' if heads == 'window' else heads}",
                    compile_gluon_dq(config, D=D, causal=mask == "causal", mods=mods)) for mask in ("causal", "full")]
    elif kind == "gluon_dq":
        kernels = [(f"{config.label} {mask}{' with dLSE' if dlse else ''}", compile_gluon_dq(config, D=D, causal=mask == "causal", dlse=dlse))
                   for mask in ("causal", "full") for dlse in (False, True)]
    elif kind == "gluon_modifiers":
        kernels = [(f"{config.label} {mask} with every modifier it takes",
                    gluon._compile_sm90(config, D=D, causal=mask == "causal", mods=gluon._all_mods(32, config))) for mask in ("causal", "full")]
    elif kind == "gluon_window":
        mods = WINDOW_ALONE if heads == "alone" else gluon._all_mods(32, config)._replace(window_size=WINDOW_ALONE.window_size)
        kernels = [(f"{config.label} {mask} with a window" + ("" if heads == "alone" else " and every other modifier"),
                    gluon._compile_sm90(config, D=D, causal=mask == "causal", mods=mods)) for mask in ("causal", "full")]
    elif kind == "gluon_varlen":
        mods = gluon._all_mods(32, config) if heads == "modifiers" else None
        kernels = [(f"{config.label} {mask}" + (" with every modifier it takes" if mods else ""),
                    compile_gluon_varlen(config, D=D, causal=mask == "causal", mods=mods)) for mask in ("causal", "full")]
    elif kind == "modifiers":
        kernels = [(f"{heads} with every modifier", MODIFIER_JOBS[heads](D))]
    else: kernels = [(config.label, gluon._compile_sm90(config, D=D))]
    return [(n, dict(resource_usage(k), **({"sass": sass_hash(k)} if sass else {}))) for n, k in kernels]


WINDOW_ALONE = fwd.ScoreMods(window_size=(4095, 0))
ALIBI_ALONE = fwd.ScoreMods(alibi_slopes=torch.empty(8))   # per head, as compile_gluon_dkdv's and compile_gluon_dq's Hq
SOFTCAP_ALONE = fwd.ScoreMods(softcap=50.0)


MODIFIER_JOBS = {   # one config each, the smallest tiles of each table (what a first call without tuning may run)
    "forward": lambda D: compile_forward(D=D, config=(64, 64, 4, 2), mods=True),
    "pointers": lambda D: compile_forward(D=D, config=(64, 32, 4, 2), use_tma=False, mods=True),
    "varlen": lambda D: compile_varlen(D=D, config=(64, 32, 4, 2), mods=True),
    "decode": lambda D: compile_decode(D=D, mods=True)[0],
    "bwd_dkdv": lambda D: compile_backward("bwd_dkdv", D=D, config=(32, 64, 4, 2), mods=True),
    "bwd_dq": lambda D: compile_backward("bwd_dq", D=D, config=(64, 32, 4, 2), mods=True),
    "varlen_bwd_dkdv": lambda D: compile_varlen_backward("bwd_dkdv", D=D, config=(32, 64, 4, 2), mods=True),
    "varlen_bwd_dq": lambda D: compile_varlen_backward("bwd_dq", D=D, config=(64, 32, 4, 2), mods=True),
}


def sass_hash(kernel) -> str:
    """A hash of the SASS with the kernel's parameter offsets (`c[0x0][0x...]`, and the instruction encodings that hold
    them) blanked: a kernel whose parameters only moved (one added or removed before them) hashes alike, any other change
    to its instructions does not."""
    sass = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][param]", cuobjdump(kernel))
    sass = re.sub(r"(c\[0x0\]\[param\].*?)/\* 0x[0-9a-f]{16} \*/", r"\1", sass)   # the word that encodes the offset
    return hashlib.sha256(sass.encode()).hexdigest()[:16]


def _try(job, sass:bool=False):
    try: return compile_job(job, sass), None
    except Exception as e: return None, "".join(traceback.format_exception_only(e))[-1500:]


def spill_accepted(job) -> bool:
    """Whether a job may spill: a backward tile kept although it does (`candidates.BACKWARD_SPILLS_ACCEPTED`, measured
    faster), or a score-modifier variant of a `tl` kernel (they share the plain kernels' tiles; results/score_mods.csv
    measures them), or a Gluon forward kernel with a window and every other modifier at once (with D = 128 the
    one-warpgroup kernel spills 32–40 bytes on Triton 3.9, not on 3.6), or the Gluon dK/dV pass with every modifier
    (the 64-key overlapped tile at D = 64 spills 16–32 bytes on Triton 3.9 with ALiBi), or its warp-specialised form with
    a window (24 bytes on Triton 3.6, as the accepted plain causal tile, 32–40 with ALiBi too, 32–40 with softcap), or
    any Gluon launch on
    a Triton release its kernels do not run on (`gluon.GLUON_RELEASES`: compiled there to show they compile, never
    launched). The Gluon forward kernels with the other modifiers, or a window alone, may not spill."""
    kind, D, config, heads = job
    if kind == "modifiers" or (kind == "gluon_window" and heads != "alone"): return True
    if kind in GLUON_KINDS and triton_release() not in gluon.GLUON_RELEASES: return True   # compiled, never launched here
    if kind == "gluon_dkdv": return (heads == "every modifier" or (config, D) in candidates.BACKWARD_SPILLS_ACCEPTED
                                     or (config.WARP_SPECIALIZE and heads in ("window", "window and alibi")))
    return kind == "backward" and not heads[1] and (Candidate(heads[0], *config), D) in candidates.BACKWARD_SPILLS_ACCEPTED


def shallower_pipelines(compiled:dict) -> list:
    """(name, why) for each paged launch (decode, packed sequences) whose kernel holds fewer K/V tiles in shared memory
    than the same candidate's launch on a contiguous cache: `Candidate.paged_launch_options` should keep them alike. The
    page lookup's own buffers may add up to 2 KiB."""
    found = []
    for job, done in compiled.items():
        kind, D, config, heads = job
        if kind == "paged": twin = ("decode", D, config, heads[:2])
        elif kind == "varlen" and isinstance(heads, int): twin = ("varlen", D, config, None)
        else: continue
        if twin not in compiled: continue
        paged, contiguous = done[0][1]["shared_kib"], compiled[twin][0][1]["shared_kib"]
        if not contiguous <= paged <= contiguous + 2:
            found.append((f"{kind} D={D} {config} pages of {heads if kind == 'varlen' else heads[2]}",
                          f"{paged} KiB shared against {contiguous} KiB on a contiguous cache"))
    return found


def check_all(workers:int=2, fingerprint:str=None, compare:str=None) -> int:
    """Compile everything `shipped()` lists for sm_90; print one line each; the number of spills (but the accepted ones)
    and failures. With
    `fingerprint`, write each launch's SASS hashes to that JSON file; with `compare`, count a launch whose SASS differs
    from that file's as a failure too (launches it does not list are new, and said so)."""
    jobs = shipped()
    before = json.load(open(compare)) if compare else None
    hashes = {}
    print(f"Triton {triton.__version__}, torch {torch.__version__}: {len(jobs)} launches compiled for sm_90", flush=True)
    bad, compiled = 0, {}
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for (name, job), (done, error) in zip(jobs, pool.map(functools.partial(_try, sass=bool(fingerprint or compare)), [j for _, j in jobs])):
            if error: bad += 1; print(f"FAILED  {name}: {error}", flush=True); continue
            if fingerprint or compare: hashes[name] = {kernel: r["sass"] for kernel, r in done}
            compiled[job] = done
            if before is not None:
                if name not in before: print(f"NEW     {name}: not in {compare}", flush=True)
                elif before[name] != hashes[name]: bad += 1; print(f"CHANGED {name}: its SASS differs from {compare}", flush=True)
            for kernel, r in done:
                spilled, accepted = bool(r["stack_bytes"]), spill_accepted(job)
                bad += spilled and not accepted
                print(f"{('ACCEPTS' if accepted else 'SPILLS') if spilled else 'ok':<7} {name}: {kernel} {r['registers']} registers, "
                      f"{r['stack_bytes']} B stack, {r['shared_kib']} KiB shared", flush=True)
    for name, shallower in shallower_pipelines(compiled):
        bad += 1; print(f"SHALLOW {name}: {shallower}", flush=True)
    if fingerprint:
        with open(fingerprint, "w") as f: json.dump(hashes, f, indent=1, sort_keys=True)
    if before is not None:
        gone = sorted(set(before) - set(hashes))
        if gone: print(f"{len(gone)} launches of {compare} are no longer shipped: " + "; ".join(gone))
    print(f"{bad} of {len(jobs)} launches spill, fail to compile or changed" if bad else f"all {len(jobs)} compile without spills"
          + " (but the accepted backward tiles, ACCEPTS above)"
          + (f", SASS as in {compare}" if compare else ""))
    return bad


def resources(kernel) -> dict:
    "Registers, spilled bytes (stack) and shared memory from the cubin; tensor-core, TMA, load and wait counts in the SASS."
    usage, sass = resource_usage(kernel), cuobjdump(kernel)
    return dict(regs=usage["registers"], stack_bytes=usage["stack_bytes"], shared_kib=usage["shared_kib"],
                **{op: len(re.findall(rf"\b{re.escape(op)}\b", sass))
                   for op in ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "LDG", "MUFU.EX2", "WARPGROUP.DEPBAR")})


def sass_instructions(kernel) -> list:
    "(address, instruction, opcode) of each SASS instruction; the opcode skips a leading predicate."
    found = []
    for line in cuobjdump(kernel).splitlines():
        if m := re.match(r"\s*/\*([0-9a-f]{4})\*/", line):
            ins = line.split("*/", 1)[1].split(";")[0].strip()
            found.append((int(m.group(1), 16), ins, ins.split()[1] if ins.startswith("@") else ins.split()[0]))
    return found


def sass_sequence(kernel) -> str:
    "The SASS condensed to what shows overlap: wgmma (HGMMA; 'last' ends a group), its waits, exp2, TMA loads, branches."
    names = {"HGMMA": "HGMMA", "WARPGROUP": None, "MUFU.EX2": "EX2", "UTMALDG": "TMA", "SYNCS": "SYNCS", "FMNMX": "MAX",
             "LDL": "LDL", "STL": "STL"}
    out, prev, count = [], None, 0
    for _, ins, op in sass_instructions(kernel):
        key = next((op if short is None else short for name, short in names.items() if op.startswith(name)), None)
        if op == "BRA": key = "BRA " + ins.split()[-1]
        if key == "HGMMA" and "gsb0" in ins: key = "HGMMA last"
        if key is None: continue
        if key == prev: count += 1; continue
        if prev: out.append(prev + (f"x{count}" if count > 1 else ""))
        prev, count = key, 1
    return " ".join(out + [prev + (f"x{count}" if count > 1 else "")] if prev else out)


def loop_mix(kernel) -> list:
    """The SASS loops that hold tensor-core or exp2 instructions (a backward branch's target to the branch): their
    address range, instruction count per thread per iteration, and the count of each opcode (its first part)."""
    sass, loops = sass_instructions(kernel), []
    for addr, ins, op in sass:
        target = re.search(r"0x([0-9a-f]+)", ins) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [o.split(".")[0] for a, _, o in sass if int(target.group(1), 16) <= a <= addr]
            mix = {o: body.count(o) for o in sorted(set(body), key=lambda o: -body.count(o))}
            if "HGMMA" in mix or "MUFU" in mix:
                loops.append(dict(start=target.group(0), end=hex(addr), instructions=len(body), mix=mix))
    return loops


def summary(kernel) -> str:
    r = resources(kernel)
    return (f"regs {r.pop('regs')}, stack {r.pop('stack_bytes')} B, shared {r.pop('shared_kib')} KiB, SASS {r}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python tools/compile_sm90.py")
    ap.add_argument("--all", action="store_true", help="compile every kernel and config the package ships; exit 1 on a spill or error")
    ap.add_argument("--workers", type=int, default=2, help="compiler processes for --all")
    ap.add_argument("--fingerprint", help="with --all: write each launch's SASS sha256 to this JSON file")
    ap.add_argument("--compare", help="with --all: fail where a launch's SASS differs from this --fingerprint file")
    ap.add_argument("--pointers", action="store_true", help="per-thread pointer loads instead of tensor descriptors")
    ap.add_argument("--config", default="128,64,8,3", help="BLOCK_M,BLOCK_N,num_warps,num_stages; ';' separates several")
    ap.add_argument("--shape", default="8,32,2048,128", help="B,H,N,D")
    ap.add_argument("--causal", action="store_true"); ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--ttgir", action="store_true", help="print the TTGIR of the last config")
    ap.add_argument("--sequence", action="store_true", help="print the condensed SASS (wgmma, waits, exp2, TMA, branches)")
    ap.add_argument("--loops", action="store_true", help="print the instruction mix of each loop with wgmma or exp2")
    ap.add_argument("--csv", help="append one row per config to this CSV (with Triton's version, the commit and the date)")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    if a.all: sys.exit(1 if check_all(a.workers, a.fingerprint, a.compare) else 0)
    path = "pointers" if a.pointers else "descriptors"
    B, H, N, D = map(int, a.shape.split(","))
    for config in a.config.split(";"):
        config = tuple(map(int, config.split(",")))
        try:
            kernel = compile_forward(B, H, N, D, a.causal, torch.float16 if a.fp16 else torch.bfloat16, config, not a.pointers)
            print(config, path, summary(kernel), flush=True)
            if a.csv:
                row = dict(config="{}x{} w{} s{}".format(*config), path=path, B=B, H=H, N=N, D=D, causal=int(a.causal),
                           dtype="fp16" if a.fp16 else "bf16", **resources(kernel), target="sm_90", triton=triton.__version__,
                           commit=a.commit, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
                new = not os.path.exists(a.csv)
                with open(a.csv, "a", newline="") as f:
                    w = csv.DictWriter(f, list(row))
                    if new: w.writeheader()
                    w.writerow(row)
            if a.ttgir: print(kernel.asm["ttgir"])
            if a.sequence: print(sass_sequence(kernel))
            if a.loops:
                for loop in loop_mix(kernel): print(loop)
        except Exception as e:
            print(config, path, "FAILED:", "".join(traceback.format_exception_only(e))[-3000:], flush=True)
