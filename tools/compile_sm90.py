"""Compile our kernels for a Hopper GPU (sm_90) on a machine without one: the compiler's errors, registers, spills and
shared memory of any variant × config, in seconds and without device time. Nothing runs; timing still needs the H200.

    TRITON_INTERPRET=0 python tools/compile_sm90.py --variant use_tma,fold_scale --config 128,64,8,3 [--causal] [--ttgir]

Arguments are built as `_attention_forward` builds them (CPU tensors stand in for GPU ones: same dtypes, strides and
16-byte alignment), so the specialisation is the one the GPU compiles."""
import os
os.environ["TRITON_INTERPRET"] = "0"          # compile, do not interpret (triton_fa2 would choose the interpreter)
import argparse, re, subprocess, tempfile, traceback
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler.compiler import ASTSource
from triton.runtime.jit import create_function_from_signature
import triton_fa2.forward as fwd

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


def compile_forward(B=8, H=32, N=2048, D=128, causal=True, dtype=torch.bfloat16, config=(128, 64, 8, 3), variant=None):
    "Compile `_attn_fwd` for one shape, config (BLOCK_M, BLOCK_N, warps, stages) and variant; the CompiledKernel."
    q, k, v = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(B, H, N)
    m, n, w, s = config
    cfg = triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=s, pre_hook=fwd._set_descriptor_blocks)
    offline, real = _Offline(fwd._attn_fwd), fwd._attn_fwd
    fwd._attn_fwd = offline
    try: fwd._attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=cfg, pack_gqa=False, variant=variant)
    finally: fwd._attn_fwd = real
    return offline.compiled


def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin); f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def summary(kernel) -> str:
    "Registers, spills and shared memory (from the cubin), and the tensor-core and TMA instructions in the SASS."
    usage = _cuobjdump(kernel.asm["cubin"], "-res-usage")
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    sass = _cuobjdump(kernel.asm["cubin"], "-sass")
    counts = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "LDG", "MUFU.EX2")}
    return (f"regs {regs.group(1) if regs else '?'}, stack {stack.group(1) if stack else '?'} B, "
            f"shared {kernel.metadata.shared // 1024} KiB, SASS {counts}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="", help="comma-separated flags from triton_fa2.forward.VARIANTS")
    ap.add_argument("--config", default="128,64,8,3", help="BLOCK_M,BLOCK_N,num_warps,num_stages; ';' separates several")
    ap.add_argument("--shape", default="8,32,2048,128", help="B,H,N,D")
    ap.add_argument("--causal", action="store_true"); ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--ttgir", action="store_true", help="print the TTGIR of the last config")
    a = ap.parse_args()
    variant = {name: True for name in a.variant.split(",") if name}
    B, H, N, D = map(int, a.shape.split(","))
    for config in a.config.split(";"):
        config = tuple(map(int, config.split(",")))
        try:
            kernel = compile_forward(B, H, N, D, a.causal, torch.float16 if a.fp16 else torch.bfloat16, config, variant)
            print(config, a.variant or "baseline", summary(kernel), flush=True)
            if a.ttgir: print(kernel.asm["ttgir"])
        except Exception as e:
            print(config, a.variant or "baseline", "FAILED:", "".join(traceback.format_exception_only(e))[-3000:], flush=True)
