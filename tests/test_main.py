"The README's main job: `python -m triton_fa2` prints the check and exits 0; a failed check exits 1."
import subprocess, sys

import torch

import triton_fa2.__main__ as cli


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "triton_fa2", "--seqlen", "65", "--heads", "2", "--head-dim", "32"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all 4 checks within tolerance" in out.stdout
    assert out.stdout.count(" ok") == 4


def test_failure_exits_nonzero(monkeypatch):
    good = cli.attention
    def shifted(q, k, v, causal):  # off by a little more than the tolerance
        return good(q, k, v, causal=causal) + 0.05
    monkeypatch.setattr(cli, "attention", shifted)
    try:
        cli.main(batch=1, heads=1, seqlen=17, head_dim=16)
    except SystemExit as e:
        assert e.code == 1
    else:
        raise AssertionError("main() did not exit non-zero on a failed check")


def test_nan_fails(monkeypatch):
    "NaN never passes: an output full of NaN is a failed check, not an error of nan that compares False both ways."
    monkeypatch.setattr(cli, "attention", lambda q, k, v, causal: torch.full_like(q, float("nan")))
    assert not any(ok for *_, ok in cli.check_attention(batch=1, heads=1, seqlen=9, head_dim=16))
