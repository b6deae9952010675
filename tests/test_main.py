"""The README's smaller check, `python -m triton_fa2`: it prints the check and exits 0, a failed check exits 1, and an
option the kernel cannot take is argparse's usage error (exit 2, the option named, no traceback)."""
import subprocess, sys

import pytest
import torch
import triton

import triton_fa2
import triton_fa2.__main__ as cli

TINY = ["--seqlen", "17", "--head-dim", "16", "--batch", "1", "--heads", "2"]   # the interpreter is slow


def run(*args):
    return subprocess.run([sys.executable, "-m", "triton_fa2", *args], capture_output=True, text=True, timeout=300)


def test_python_dash_m():
    out = run("--seqlen", "65", "--heads", "2", "--head-dim", "32")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "all 4 checks within tolerance"
    assert out.stdout.count(" ok") == 4


def test_failure_exits_nonzero(monkeypatch, capsys):
    good = cli.attention
    def shifted(q, k, v, causal):  # off by a little more than the tolerance
        return good(q, k, v, causal=causal) + 0.05
    monkeypatch.setattr(cli, "attention", shifted)
    assert cli.main(["--batch", "1", "--heads", "1", "--seqlen", "17", "--head-dim", "16"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "4 of 4 checks FAILED"


def test_nan_fails(monkeypatch):
    "NaN never passes: an output full of NaN is a failed check, not an error of nan that compares False both ways."
    monkeypatch.setattr(cli, "attention", lambda q, k, v, causal: torch.full_like(q, float("nan")))
    assert not any(ok for *_, ok in cli.check_attention(batch=1, heads=1, seqlen=9, head_dim=16))


@pytest.mark.parametrize("option, value, message", [
    ("--batch", "0", "must be at least 1, got 0"),
    ("--heads", "0", "must be at least 1, got 0"),
    ("--seqlen", "0", "must be at least 1, got 0"),
    ("--seqlen", "ten", "expected an integer of at least 1, got 'ten'"),
    ("--head-dim", "12", "must be a multiple of 8 between 8 and 256, got '12'"),
])
@pytest.mark.newest_triton_only
def test_bad_values_are_usage_errors(option, value, message, capsys):
    "In this process: `main` is what the command runs (the next test runs one through the command)."
    with pytest.raises(SystemExit) as exit_: cli.main([*TINY, option, value])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, out + err
    assert err.splitlines()[-1] == f"python -m triton_fa2: error: argument {option}: {message}"
    assert "Traceback" not in err and out == ""                     # refused before anything ran


@pytest.mark.newest_triton_only
def test_a_bad_value_on_the_command_line_is_a_usage_error():
    out = run(*TINY, "--head-dim", "12")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines()[-1] == "python -m triton_fa2: error: argument --head-dim: must be a multiple of 8 between 8 and 256, got '12'"
    assert "Traceback" not in out.stderr and out.stdout == ""      # refused before anything ran


@pytest.mark.newest_triton_only
def test_version():
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"triton_fa2 {triton_fa2.__version__} · torch {torch.__version__} · triton {triton.__version__}"


@pytest.mark.newest_triton_only
def test_usage_names_the_command():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m triton_fa2 [-h]") and "__main__" not in out.stdout
    for option in ("--batch B", "--heads H", "--seqlen L", "--head-dim D", "--seed SEED", "--version"):
        assert option in out.stdout, option
