"""The package runs on its core dependencies alone (torch, Triton, NumPy); fastcore, tqdm, pandas and matplotlib are
extras. Each test runs Python in a subprocess where those four cannot be imported: stub packages that raise
ModuleNotFoundError, as a missing package does, come first on PYTHONPATH."""
import os
import subprocess
import sys

import pytest

EXTRAS = ("fastcore", "tqdm", "pandas", "matplotlib")
# Tests marked newest_triton_only check packaging and the commands' plumbing, the same on every Triton: .ci/run runs
# them on the newest only (the package running on its core dependencies is checked on every release it tests).


@pytest.fixture(scope="module")
def no_extras(tmp_path_factory):
    "The environment of a subprocess in which importing any of EXTRAS raises ModuleNotFoundError."
    stubs = tmp_path_factory.mktemp("no_extras")
    for name in EXTRAS:
        (stubs / name).mkdir()
        message = f"No module named {name!r}"
        (stubs / name / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={name!r})\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(stubs), os.environ.get("PYTHONPATH")])))


def python(env, *args):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_extras_are_blocked(no_extras):
    "Without this the tests below would pass on any machine that has the extras, blocked or not."
    out = python(no_extras, "-c", "import importlib\n"
                 f"for name in {EXTRAS!r}:\n"
                 "    try: importlib.import_module(name)\n"
                 "    except ModuleNotFoundError: continue\n"
                 "    raise SystemExit(f'{name} was imported')")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_package_imports_and_runs(no_extras):
    out = python(no_extras, "-c", "import torch, triton_fa2, triton_fa2.bench\n"
                 "from triton_fa2.naive import attention_ref\n"
                 "torch.manual_seed(0)\n"
                 "q, k, v = (torch.randn(1, 2, 17, 16, dtype=torch.float16) for _ in range(3))\n"
                 "o, o_ref = triton_fa2.attention(q, k, v, causal=True), attention_ref(q, k, v, causal=True)[0]\n"
                 "print(((o.float() - o_ref).abs().max() / o_ref.abs().max().clamp(min=1)).item())")
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout) <= 2e-3                    # the fp16 tolerance of `python -m triton_fa2`


@pytest.mark.newest_triton_only
def test_python_dash_m_triton_fa2(no_extras):
    out = python(no_extras, "-m", "triton_fa2", "--seqlen", "17", "--head-dim", "16", "--batch", "1", "--heads", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "all 4 checks within tolerance"


@pytest.mark.newest_triton_only
def test_the_benchmark_asks_for_its_extras(no_extras):
    out = python(no_extras, "-m", "triton_fa2.bench", "--quick")
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    assert out.stderr == ('python -m triton_fa2.bench needs the benchmark extras: pip install "triton_fa2[bench]" '
                          "(missing: pandas, matplotlib, tqdm)\n")
    assert out.stdout == ""


@pytest.mark.newest_triton_only
def test_the_benchmark_still_answers_help_and_version(no_extras):
    for option, first in (("--help", "usage: python -m triton_fa2.bench"), ("--version", "triton_fa2 ")):
        out = python(no_extras, "-m", "triton_fa2.bench", option)
        assert out.returncode == 0 and out.stdout.startswith(first), out.stdout + out.stderr[-3000:]
