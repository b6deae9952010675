"""Compile our kernels for a Hopper GPU (sm_90) on a machine without one: the compiler's errors, registers, spills and
shared memory of any config, through descriptors or pointers, in seconds and without device time. Nothing runs; timing still needs the H200.

    python tools/compile_sm90.py --config "128,64,4,2;64,64,4,3" [--pointers] [--causal] [--fp16] [--shape B,H,N,D] [--ttgir]

Arguments are built as `_attention_forward` builds them (CPU tensors stand in for GPU ones: same dtypes, strides and
16-byte alignment), so the specialisation is the one the GPU compiles."""
import os
os.environ["TRITON_INTERPRET"] = "0"          # compile, do not interpret (triton_fa2 would choose the interpreter)
import argparse, csv, datetime, re, traceback
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler.compiler import ASTSource
from triton.runtime.jit import create_function_from_signature
import triton_fa2.forward as fwd
from triton_fa2.gluon import _cuobjdump   # cuobjdump shipped with Triton, on a cubin

TARGET = GPUTarget("cuda", 90, 32)


def compile_launch(jitfn, args, kwargs, target=TARGET):
    "What `jitfn[grid](*args, **kwargs)` would compile on `target`: the CompiledKernel (raises the compiler's error)."
    backend = CUDABackend(target)
    binder = create_function_from_signature(jitfn.signature, jitfn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jitfn._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(jitfn, signature, constexprs, attrs), target=target, options=options.__dict__)


class _Offline:
    "Stands in for `_attn_fwd` inside `_attention_forward`: records the compiled kernel instead of launching it."
    def __init__(self, jitfn): self.jitfn, self.compiled = jitfn, None
    def __getitem__(self, grid):
        def launch(*args, **kwargs): self.compiled = compile_launch(self.jitfn, args, kwargs)
        return launch


def compile_forward(B=8, H=32, N=2048, D=128, causal=True, dtype=torch.bfloat16, config=(128, 64, 8, 3), use_tma=True):
    "Compile `_attn_fwd` for one shape, config (BLOCK_M, BLOCK_N, warps, stages) and tile source; the CompiledKernel."
    q, k, v = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(B, H, N)
    m, n, w, s = config
    cfg = triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=s, pre_hook=fwd._set_descriptor_blocks)
    offline, real = _Offline(fwd._attn_fwd), fwd._attn_fwd
    fwd._attn_fwd = offline
    try: fwd._attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=cfg, pack_gqa=False, use_tma=use_tma)
    finally: fwd._attn_fwd = real
    return offline.compiled


def resources(kernel) -> dict:
    "Registers, spilled bytes (stack) and shared memory from the cubin; tensor-core, TMA, load and wait counts in the SASS."
    usage = _cuobjdump(kernel.asm["cubin"], "-res-usage")
    sass = _cuobjdump(kernel.asm["cubin"], "-sass")
    found = lambda pattern: int(m.group(1)) if (m := re.search(pattern, usage)) else None
    return dict(regs=found(r"REG:(\d+)"), stack_bytes=found(r"STACK:(\d+)"), shared_kib=kernel.metadata.shared // 1024,
                **{op: len(re.findall(rf"\b{re.escape(op)}\b", sass))
                   for op in ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "LDG", "MUFU.EX2", "WARPGROUP.DEPBAR")})


def sass_instructions(kernel) -> list:
    "(address, instruction, opcode) of each SASS instruction; the opcode skips a leading predicate."
    found = []
    for line in _cuobjdump(kernel.asm["cubin"], "-sass").splitlines():
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
    ap = argparse.ArgumentParser()
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
