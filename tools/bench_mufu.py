"""Issue 6 (head dim 64): the special-function unit's exp2 rate on this GPU, fp32 (`ex2.approx.ftz.f32`, one
`MUFU.EX2` per value) against packed half precision (`ex2.approx.f16x2`, which sm_90 compiles to two `MUFU.EX2.F16`
per pair). If the half-precision instruction ran at twice the rate, a D = 64 softmax could take its exponentials in
fp16 (P is rounded to bf16/fp16 for PV anyway). Each thread iterates x ← 2^x − 1 on independent values (no hoisting).

    PYTHONPATH=. python3 tools/bench_mufu.py          # GPU: exponentials per clock per SM, both forms
"""
import torch, triton, triton.language as tl

ITERS = 4096

@triton.jit
def _exp2_loop(x_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr, HALF: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(ITERS):
        if HALF: y = tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x], dtype=tl.float16, is_pure=True, pack=2)
        else: y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
        x = y - 1.0
    tl.store(x_ptr + offs, x)

def rate(dtype, block=2048, warps=4):
    "Exponentials per clock per SM, at the clock the GPU reports while running (nvml), and exponentials per ns."
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = sms * 16 * block
    x = -torch.rand(n, device="cuda", dtype=torch.float32).to(dtype)
    run = lambda: _exp2_loop[(n // block,)](x, ITERS=ITERS, BLOCK=block, HALF=dtype == torch.float16, num_warps=warps)
    run(); torch.cuda.synchronize()
    ms = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
    try: clock_mhz = torch.cuda.clock_rate()   # SM clock now (nvml), read after the timing
    except Exception: clock_mhz = float("nan")
    per_ns = n * ITERS / (ms * 1e6)
    return per_ns, per_ns * 1e3 / clock_mhz / sms, clock_mhz

if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for name, dtype in (("f32", torch.float32), ("f16x2", torch.float16)):
        per_ns, per_clock_sm, mhz = rate(dtype)
        print(f"exp2 {name}: {per_ns:.0f} per ns, {per_clock_sm:.1f} per clock per SM (clock {mhz} MHz)", flush=True)
