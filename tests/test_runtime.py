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
