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
