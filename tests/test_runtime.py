"The interpreter decision: made at import, before any kernel is decorated; the user's own choice wins."
import os, subprocess, sys

import pytest

PROBE = ("import triton_fa2.runtime as r, triton, triton.language as tl\n"
         "@triton.jit\n"
         "def k(x): pass\n"
         "print(r.INTERPRET, type(k).__name__)")


def run_probe(tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full.update(env)
    probe = tmp_path / "probe.py"  # @triton.jit needs its source in a file
    probe.write_text(PROBE)
    out = subprocess.run([sys.executable, str(probe)], env=full, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_no_gpu_means_interpreter(tmp_path):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this path is exercised on GPU machines too
    assert run_probe(tmp_path, CUDA_VISIBLE_DEVICES="") == ["True", "InterpretedFunction"]


def test_user_choice_wins(tmp_path):
    # an explicit TRITON_INTERPRET=0 is kept even without a GPU (the user asked for compiled kernels)
    assert run_probe(tmp_path, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="0") == ["False", "JITFunction"]


# Triton's interpreter on its own, without triton_fa2's workarounds: does it still have each defect?
RAW_DEFECTS = '''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl

@triton.jit
def bf16_dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))

@triton.jit
def runtime_bound(x_ptr, n):
    total = 0.0
    for i in range(0, n): total += tl.load(x_ptr + i)
    tl.store(x_ptr, total)

def run(kernel):
    if kernel == "bf16_dot":
        torch.manual_seed(0)
        a, b = (torch.randn(16, 16).to(torch.bfloat16) for _ in range(2))
        c = torch.full((16, 16), float("nan"))
        bf16_dot[(1,)](a, b, c, 16)
        return not torch.allclose(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)   # exact up to summation order
    x = torch.arange(1, 9, dtype=torch.float32)
    try: runtime_bound[(1,)](x, 4)
    except Exception: return True
    return x[0].item() != 10.0

kernel = sys.argv[1]
if sys.argv[2] == "workaround": import triton_fa2.runtime                # imported first, as the package is
defect = run(kernel)
import triton_fa2.runtime as r
claims = dict(bf16_dot=r.interpreter_bf16_dot_is_wrong, runtime_bound=r.interpreter_index_breaks_on_numpy)[kernel]()
print(defect, claims)
'''


def run_raw(tmp_path, kernel, mode):
    probe = tmp_path / "defects.py"
    probe.write_text(RAW_DEFECTS)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(probe), kernel, mode], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.parametrize("kernel", ["bf16_dot", "runtime_bound"])
def test_each_interpreter_workaround_is_on_exactly_where_its_defect_is(tmp_path, kernel):
    "The installed Triton (and NumPy), without triton_fa2: a defect is present iff runtime says it is (and works around it)."
    import triton
    defect, claimed = run_raw(tmp_path, kernel, "raw")
    assert defect == claimed, (f"Triton {triton.__version__}: the interpreter's {kernel} defect is {defect == 'True'}, "
                               f"but triton_fa2.runtime says {claimed == 'True'}: update BF16_DOT_FIXED_IN / NUMPY_INDEX_FIXED_IN")


def test_loops_with_a_runtime_bound_run_once_triton_fa2_is_imported(tmp_path):
    "Whatever the NumPy: with triton_fa2.runtime imported first, the interpreter runs a loop over a runtime bound."
    defect, _ = run_raw(tmp_path, "runtime_bound", "workaround")
    assert defect == "False"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records the launches through Triton's interpreter")
def test_every_launch_says_the_compile_options(monkeypatch):
    """Every kernel launch of ours passes `COMPILE_OPTIONS` (fused multiply-adds whatever Triton's default): the forward,
    the backward's three kernels, decode with its combine, packed sequences forward and backward; and the Gluon kernels'
    arguments, which the interpreter cannot run, carry them."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction
    import triton_fa2
    from triton_fa2 import gluon
    from triton_fa2.candidates import PREFILL_GLUON
    from triton_fa2.runtime import COMPILE_OPTIONS
    seen, run = [], InterpretedFunction.run
    def recording(self, *args, **kwargs):
        seen.append((self.fn.__name__, {k: kwargs.get(k) for k in COMPILE_OPTIONS}))
        return run(self, *args, **kwargs)
    monkeypatch.setattr(InterpretedFunction, "run", recording)
    q, k, v = (torch.randn(1, 2, 20, 16, dtype=torch.float16, requires_grad=True) for _ in range(3))
    triton_fa2.attention(q, k, v, causal=True).sum().backward()
    triton_fa2.decode(q[:, :, -1:].detach(), k.detach(), v.detach(), num_splits=2)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    packed = [t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v)]
    triton_fa2.flash_attn_varlen_func(*packed, cu, cu, 13, 13, causal=True).sum().backward()
    names = {name for name, _ in seen}
    assert {"_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq", "_decode_fwd", "_combine_splits",
            "_attn_fwd_varlen", "_attn_bwd_dkdv_varlen", "_attn_bwd_dq_varlen"} <= names, names
    assert all(options == COMPILE_OPTIONS for _, options in seen), [s for s in seen if s[1] != COMPILE_OPTIONS]
    for config in PREFILL_GLUON:
        named, _ = gluon._arguments(q.detach(), k.detach(), v.detach(), q.detach(), torch.empty(1, 2, 20), True, 0.25, config, None)
        assert {key: named.get(key) for key in COMPILE_OPTIONS} == COMPILE_OPTIONS, config
