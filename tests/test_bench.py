"""The benchmark harness (`triton_fa2.bench`): workload selection, the reference check that gates timing, skip
reasons, the CSV format and merge, and the CLI's CPU mode (correctness only, no CSV unless asked)."""
import csv
import re
import subprocess
import sys

import pytest
import torch

import triton_fa2.bench as bench
from triton_fa2.bench import (COLUMNS, CPU_WORKLOADS, DECODE, EXTRA_COLUMNS, MONEY_SHOT, Unsupported, Workload, load_results,
                              measure, money_shot_table, run_config, run_sweep, select_workloads, write_rows)
from triton_fa2.runtime import default_device

HEADER = ("provider,op,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,dtype,causal,ms,tflops,tbps,gpu,torch,triton,"
          "commit,date")


def test_header_is_the_agreed_one():
    assert ",".join(COLUMNS) == HEADER


def test_workload_sets_and_filters():
    assert len(select_workloads("prefill")) == 96                        # 3 B × 4 N × 2 D × causal × dtype
    assert select_workloads("quick")[0] == MONEY_SHOT
    assert select_workloads("decode") == DECODE and all(w.seqlen_q == 1 for w in DECODE)
    assert {w.dtype for w in select_workloads("prefill:dtype=fp16")} == {"fp16"}
    assert all(w.batch == 32 and w.head_dim == 64 for w in select_workloads("prefill:B=32,D=64"))
    with pytest.raises(ValueError, match="unknown workload set"): select_workloads("nope")
    with pytest.raises(ValueError, match="unknown field"): select_workloads("prefill:Q=1")


def test_causal_flops_count_half_and_bytes():
    full = Workload("prefill", 2, 4, 4, 64, 64, 32, "fp16", False)
    causal = Workload("prefill", 2, 4, 4, 64, 64, 32, "fp16", True)
    assert causal.flops() * 2 == full.flops() == 4 * 2 * 4 * 64 * 64 * 32
    assert full.io_bytes() == 2 * 4 * 2 * 4 * 64 * 32


@pytest.mark.parametrize("provider", ["triton_fa2", "sdpa", "naive"])
@pytest.mark.parametrize("w", CPU_WORKLOADS, ids=lambda w: w.label)
def test_providers_pass_the_reference_check(provider, w):
    "Each provider that runs here gives a correct result on every CPU workload (prefill, GQA, decode)."
    row = measure(w, provider, [w.inputs(default_device())], run_config("test"))
    assert row["max_err"] and float(row["max_err"]) < bench.MAX_ERROR, row
    if not torch.cuda.is_available(): assert row["skip_reason"] == "timing needs a GPU" and row["ms"] == ""


def test_wrong_or_nan_results_are_not_timed(monkeypatch):
    "A provider whose output is wrong, or NaN, is recorded as wrong and never timed."
    w = CPU_WORKLOADS[0]
    for bad in (lambda w, q, k, v: torch.zeros_like(q), lambda w, q, k, v: torch.full_like(q, float("nan"))):
        monkeypatch.setitem(bench.PROVIDERS, "broken", bad)
        row = measure(w, "broken", [w.inputs(default_device())], run_config("test"))
        assert row["skip_reason"].startswith("wrong result") and row["ms"] == "", row


def test_unsupported_is_recorded_with_its_reason(monkeypatch):
    def refuse(w, q, k, v): raise Unsupported("no kernel for D=64 here")
    monkeypatch.setitem(bench.PROVIDERS, "refuser", refuse)
    rows = run_sweep(CPU_WORKLOADS[:2], ["refuser", "flash_attn"], run_config("test"), progress=False)
    assert [r["skip_reason"] for r in rows[::2]] == ["no kernel for D=64 here"] * 2
    assert all("flash_attn" in r["skip_reason"] or r["ms"] for r in rows[1::2])


def test_sdpa_is_not_given_a_mask_it_cannot_express():
    "SDPA's top-left causal differs from ours when Lq ≠ Lk (and Lq > 1): recorded as unsupported, not compared wrongly."
    w = Workload("prefill", 1, 2, 2, 20, 50, 32, "fp16", True)
    row = measure(w, "sdpa", [w.inputs(default_device())], run_config("test"))
    assert "top-left" in row["skip_reason"]


def test_csv_merge_and_reading(tmp_path):
    meta = run_config("abc123")
    rows = run_sweep(CPU_WORKLOADS[:1], ["triton_fa2", "naive"], meta, progress=False)
    path = tmp_path / "raw.csv"
    write_rows(rows, path)
    write_rows(run_sweep(CPU_WORKLOADS[1:2], ["naive"], meta, progress=False), path)   # another workload: appended
    write_rows(rows[:1], path)                                                          # the same pair: replaced
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS + EXTRA_COLUMNS) and len(lines) == 1 + 3
    back = list(csv.DictReader(path.open()))
    assert all(r["commit"] == "abc123" and r["gpu"] and r["date"] and r["torch"] and r["triton"] for r in back)
    assert [bool(re.fullmatch(r"\d+x\d+ w\d+ s\d+", r["config"])) for r in back] == [r["provider"] == "triton_fa2" for r in back]
    df = load_results(path)
    assert df.batch.dtype.kind == "i" and df.max_err.dtype.kind == "f"
    assert money_shot_table(df).empty                                                   # no money shot measured here


def test_cli_without_a_gpu_checks_and_writes_nothing(tmp_path):
    if torch.cuda.is_available(): pytest.skip("the CPU mode is what this tests")
    run = subprocess.run([sys.executable, "-m", "triton_fa2.bench", "--quick", "--no-progress"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "timing needs a GPU" in run.stdout and "triton_fa2" in run.stdout
    assert not (tmp_path / "results").exists(), "a CPU run must not write results/raw.csv"
    out = tmp_path / "cpu.csv"
    run = subprocess.run([sys.executable, "-m", "triton_fa2.bench", "--no-progress", "--providers", "triton_fa2,naive",
                          "--out", str(out), "--commit", "t"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and len(out.read_text().splitlines()) == 1 + 2 * len(CPU_WORKLOADS)
    before = out.read_text()                # --resume: every pair is already there for commit t, so nothing is re-run
    run = subprocess.run([sys.executable, "-m", "triton_fa2.bench", "--no-progress", "--providers", "triton_fa2,naive",
                          "--out", str(out), "--commit", "t", "--resume"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and f"{2 * len(CPU_WORKLOADS)} pairs of commit t already" in run.stdout, run.stdout
    assert out.read_text() == before and "wrote 0 rows" in run.stdout
    run = subprocess.run([sys.executable, "-m", "triton_fa2.bench", "--providers", "nope"], capture_output=True, text=True)
    assert run.returncode != 0 and "unknown providers" in (run.stdout + run.stderr)
