"""The benchmark harness (`triton_fa2.bench`): workload selection, the reference check that gates timing, skip
reasons, the CSV format and merge, and the CLI: its CPU mode (correctness only, no CSV unless asked), the table's
tolerance and verdict columns and closing line, and its usage errors."""
import csv
import dataclasses
import re
import subprocess
import sys

import pytest
import torch
import triton

import triton_fa2
import triton_fa2.__main__ as cli
import triton_fa2.bench as bench
from triton_fa2.bench import (BACKWARD, COLUMNS, CPU_WORKLOADS, DECODE, EXTRA_COLUMNS, GRAD_TOLERANCES, MONEY_SHOT, Unsupported,
                              Workload, load_results, measure, money_shot_table, run_config, run_sweep, select_workloads, tolerance,
                              write_rows)
from triton_fa2.runtime import default_device


def bench_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "triton_fa2.bench", *args], capture_output=True, text=True, timeout=600, **kwargs)


# Tests marked newest_triton_only check the harness's tables, options and printing, the same on every Triton: .ci/run
# runs them on the newest only (the reference checks of the providers run on every release it tests).


HEADER = ("provider,op,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,dtype,causal,ms,tflops,tbps,gpu,torch,triton,"
          "commit,date")


@pytest.mark.newest_triton_only
def test_header_is_the_agreed_one():
    assert ",".join(COLUMNS) == HEADER


@pytest.mark.newest_triton_only
def test_workload_sets_and_filters():
    assert len(select_workloads("prefill")) == 96                        # 3 B × 4 N × 2 D × causal × dtype
    assert select_workloads("quick")[0] == MONEY_SHOT
    fa3 = select_workloads("fa3")                                        # FlashAttention-3's grid: B·N = 16k, H·D = 2048
    assert len(fa3) == 36 and {(w.batch * w.seqlen_q, w.heads_q * w.head_dim) for w in fa3} == {(16384, 2048)}
    assert {w.head_dim for w in fa3} == {64, 128, 256} and {w.dtype for w in fa3} == {"bf16"}
    assert select_workloads("decode") == DECODE and all(w.seqlen_q == 1 for w in DECODE)
    assert {w.dtype for w in select_workloads("prefill:dtype=fp16")} == {"fp16"}
    assert all(w.batch == 32 and w.head_dim == 64 for w in select_workloads("prefill:B=32,D=64"))
    with pytest.raises(ValueError, match="unknown workload set"): select_workloads("nope")
    with pytest.raises(ValueError, match="unknown field"): select_workloads("prefill:Q=1")
    with pytest.raises(ValueError, match=r"'prefill:B=3' selects no workloads; in 'prefill', batch ∈ \[1, 8, 32\]"):
        select_workloads("money+prefill:B=3")
    with pytest.raises(ValueError, match="'D=big' in 'prefill:D=big': head_dim takes an integer"): select_workloads("prefill:D=big")
    with pytest.raises(ValueError, match="causal takes 1 or 0"): select_workloads("prefill:causal=maybe")
    assert all(not w.causal for w in select_workloads("cpu:causal=no")) and select_workloads("cpu:causal=no")


@pytest.mark.newest_triton_only
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
    assert row["max_err"] and float(row["max_err"]) <= tolerance(w), row
    if not torch.cuda.is_available(): assert row["skip_reason"] == "timing needs a GPU" and row["ms"] == ""


def test_wrong_or_nan_results_are_not_timed(monkeypatch):
    "A provider whose output is wrong, or NaN, is recorded as wrong and never timed."
    w = CPU_WORKLOADS[0]
    for bad in (lambda w, q, k, v: torch.zeros_like(q), lambda w, q, k, v: torch.full_like(q, float("nan"))):
        monkeypatch.setitem(bench.PROVIDERS, "broken", bad)
        row = measure(w, "broken", [w.inputs(default_device())], run_config("test"))
        assert row["skip_reason"].startswith("wrong result") and row["ms"] == "", row


def test_the_tolerance_is_the_one_of_python_dash_m_triton_fa2(monkeypatch):
    "One definition: the dtype's entry in TOLERANCES gates timing, so an fp16 result 1.5 tolerances off is wrong (a flat 2e-2 would pass it)."
    assert bench.TOLERANCES is cli.TOLERANCES
    forward = [w for w in CPU_WORKLOADS if w.op in ("prefill", "decode")]
    assert {w.dtype: tolerance(w) for w in forward} == {"fp16": cli.TOLERANCES[torch.float16], "bf16": cli.TOLERANCES[torch.bfloat16]}
    for w in CPU_WORKLOADS[0], CPU_WORKLOADS[2]:                                   # fp16, bf16
        def off(w, q, k, v):                                                        # 1.5 tolerances off, in err's units
            o = bench.attention_ref(q, k, v, causal=w.causal)[0]
            return (o + 1.5 * tolerance(w) * o.abs().max().clamp(min=1)).to(q.dtype)
        monkeypatch.setitem(bench.PROVIDERS, "off", off)
        row = measure(w, "off", [w.inputs(default_device())], run_config("test"))
        assert row["skip_reason"] == f"wrong result: max error {row['max_err']} > {tolerance(w):.1e}", row
        assert bench.verdict(row) is False


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


@pytest.mark.newest_triton_only
def test_backward_workloads_and_their_flops():
    "The backward set: 7 shapes, each as backward (2.5× the forward's FLOPs, 2× its bytes) and fwd_bwd (3.5×, 3×)."
    shapes = [(8, 32, 32, 2048, 128, True, "bf16"), (8, 32, 32, 2048, 128, True, "fp16"), (8, 32, 32, 2048, 128, False, "bf16"),
              (8, 32, 32, 2048, 64, True, "bf16"), (1, 32, 32, 8192, 128, True, "bf16"), (4, 32, 32, 4096, 64, True, "fp16"),
              (4, 32, 8, 4096, 128, True, "bf16")]
    assert select_workloads("backward") == BACKWARD and len(BACKWARD) == 14
    assert [(w.batch, w.heads_q, w.heads_kv, w.seqlen_k, w.head_dim, w.causal, w.dtype) for w in BACKWARD[::2]] == shapes
    assert [w.op for w in BACKWARD] == ["backward", "fwd_bwd"] * 7 and all(w.seqlen_q == w.seqlen_k for w in BACKWARD)
    assert {w.op for w in select_workloads("backward:op=fwd_bwd,dtype=fp16")} == {"fwd_bwd"}
    for w in BACKWARD:
        forward = dataclasses.replace(w, op="prefill")
        assert w.flops() == {"backward": 2.5, "fwd_bwd": 3.5}[w.op] * forward.flops()
        assert w.io_bytes() == {"backward": 2, "fwd_bwd": 3}[w.op] * forward.io_bytes()
    causal, full = BACKWARD[0], BACKWARD[4]                            # causal counts half, as for the forward
    assert causal.flops() * 2 == full.flops() == 2.5 * 4 * 8 * 32 * 2048 * 2048 * 128
    assert tolerance(causal) == GRAD_TOLERANCES[torch.bfloat16] and tolerance(BACKWARD[2]) == GRAD_TOLERANCES[torch.float16]
    q, k, v, do = Workload("backward", 1, 2, 1, 8, 8, 16, "fp16", True).inputs(torch.device("cpu"))
    assert q.requires_grad and k.requires_grad and v.requires_grad and not do.requires_grad and do.shape == q.shape


TINY_GRADS = [Workload(op, 1, 2, 1, 48, 48, 32, dtype, True) for op in ("backward", "fwd_bwd") for dtype in ("fp16", "bf16")]


@pytest.mark.parametrize("provider", ["triton_fa2", "sdpa"])
@pytest.mark.parametrize("w", TINY_GRADS, ids=lambda w: w.label)
def test_gradients_pass_the_reference_check(provider, w):
    "dq, dk, dv of our backward (in the interpreter without a GPU) and of SDPA are checked against float32 autograd; .grad stays empty."
    inputs = w.inputs(default_device())
    row = measure(w, provider, [inputs], run_config("test"))
    assert row["max_err"] and float(row["max_err"]) <= tolerance(w), row
    assert all(t.grad is None for t in inputs[:3])                     # autograd.grad returns them: nothing accumulates
    if not torch.cuda.is_available(): assert row["skip_reason"] == "timing needs a GPU" and row["ms"] == ""
    if provider == "triton_fa2":                                          # the tuned configs, as tools/rules.py make reads them
        passes = row["config"].split(" + ")
        assert [p.removeprefix("gluon ").split()[0] for p in passes[-2:]] == ["dkdv", "dq"] and len(passes) == {"backward": 2, "fwd_bwd": 3}[w.op], row


def test_wrong_or_missing_gradients_are_not_timed(monkeypatch):
    "A forward that is right with a gradient that is wrong fails the check; a forward without a graph has no backward row."
    w = TINY_GRADS[0]
    def wrong_dq(w, q, k, v):                                          # o is right, dq is off by do / 10
        return bench.attention_ref(q, k, v, causal=w.causal)[0].to(q.dtype) + 0.1 * (q - q.detach())
    monkeypatch.setitem(bench.PROVIDERS, "wrong_dq", wrong_dq)
    row = measure(w, "wrong_dq", [w.inputs(default_device())], run_config("test"))
    assert row["skip_reason"].startswith("wrong result") and row["ms"] == "" and bench.verdict(row) is False, row
    monkeypatch.setitem(bench.PROVIDERS, "detached", lambda w, q, k, v: bench.attention_ref(q.detach(), k, v)[0].to(q.dtype).detach())
    row = measure(w, "detached", [w.inputs(default_device())], run_config("test"))
    assert row["skip_reason"] == "detached's output does not require grad: no backward" and not row["max_err"], row


def test_backward_replays_one_forward_and_fwd_bwd_runs_it_each_time(monkeypatch):
    "backward times the backward alone: the forward runs once per input set; fwd_bwd runs it in every call."
    calls = []
    def counted(w, q, k, v):
        calls.append(w.op); return bench.attention_ref(q, k, v, causal=w.causal)[0].to(q.dtype)
    monkeypatch.setitem(bench.PROVIDERS, "counted", counted)
    for op, forwards in (("backward", 2), ("fwd_bwd", 6)):
        w = dataclasses.replace(TINY_GRADS[0], op=op)
        sets, fn = [w.inputs(default_device(), seed) for seed in (0, 1)], bench._call(w, "counted")
        grads = [fn(*sets[i % 2]) for i in range(6)]
        assert calls.count(op) == forwards and all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))


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


@pytest.fixture(scope="module")
def quick_cpu_run(tmp_path_factory):
    "`--quick --no-progress` without a GPU, run once for the two tests that read it (ONE_WORKER in tests/conftest.py: on one worker): (its cwd, the run)."
    cwd = tmp_path_factory.mktemp("quick")
    return cwd, bench_cli("--quick", "--no-progress", cwd=cwd)


@pytest.mark.newest_triton_only
def test_cli_without_a_gpu_checks_and_writes_nothing(request):
    if torch.cuda.is_available(): pytest.skip("the CPU mode is what this tests")
    cwd, run = request.getfixturevalue("quick_cpu_run")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "timing needs a GPU" in run.stdout and "triton_fa2" in run.stdout
    assert not (cwd / "results").exists(), "a CPU run must not write results/raw.csv"


@pytest.mark.newest_triton_only
def test_cli_without_a_gpu_writes_the_csv_it_is_given_and_resumes(tmp_path):
    if torch.cuda.is_available(): pytest.skip("the CPU mode is what this tests")
    out = tmp_path / "cpu.csv"
    run = bench_cli("--no-progress", "--providers", "triton_fa2,naive", "--out", str(out), "--commit", "t")
    assert run.returncode == 0 and len(out.read_text().splitlines()) == 1 + 2 * len(CPU_WORKLOADS)
    assert run.stdout.splitlines()[-1] == f"all {2 * len(CPU_WORKLOADS)} checks within tolerance"
    before = out.read_text()                # --resume: every pair is already there for commit t, so nothing is re-run
    run = bench_cli("--no-progress", "--providers", "triton_fa2,naive", "--out", str(out), "--commit", "t", "--resume")
    assert run.returncode == 0 and f"{2 * len(CPU_WORKLOADS)} pairs of commit t already" in run.stdout, run.stdout
    assert out.read_text() == before and "wrote 0 rows" in run.stdout and run.stdout.splitlines()[-1] == "no checks ran"


ROW = re.compile(r"(\S+) +(.+?) +(\d\.\d\de[-+]\d\d|-) +(\d\.\de[-+]\d\d|-)  (ok|FAIL|-) +(.+)")  # provider, workload, err, tol, check, time


@pytest.mark.newest_triton_only
def test_quick_table_says_what_err_is_and_gives_a_verdict(request):
    "--quick: a line defining err, the tolerance and ok/FAIL on every checked row, and a closing line that counts them."
    if torch.cuda.is_available(): pytest.skip("the CPU run is what this reads (a GPU run times the quick set for minutes)")
    _, run = request.getfixturevalue("quick_cpu_run")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert any(l.startswith("err: max |o − o_ref| / max(1, max |o_ref|)") and "against attention_ref in float32" in l and
               "fp16 2.0e-03, bf16 1.6e-02" in l for l in lines), run.stdout
    assert any(l.startswith("err of backward and fwd_bwd: the largest max |dx − dx_ref| / max |dx_ref| of dq, dk, dv") and
               "fp16 5.0e-03, bf16 2.0e-02" in l for l in lines), run.stdout
    header = next(l for l in lines if l.startswith("provider "))
    assert header.split()[:6] == ["provider", "workload", "err", "tolerance", "check", "time,"]
    rows = [ROW.fullmatch(l).groups() for l in lines[lines.index(header) + 1:-1]]
    ours = [r for r in rows if r[0] == "triton_fa2"]
    assert [r[1] for r in ours] == [w.label for w in CPU_WORKLOADS]
    for (_, _, err, tol, check, _), w in zip(ours, CPU_WORKLOADS):
        assert float(err) <= float(tol) == tolerance(w) and check == "ok"
    checked = [r for r in rows if r[4] != "-"]
    assert all(r[4] == "ok" for r in checked) and all(r[2] == r[3] == "-" for r in rows if r[4] == "-")
    assert len(checked) > len(CPU_WORKLOADS) and len(rows) > len(checked)
    assert lines[-1] == f"all {len(checked)} checks within tolerance; {len(rows) - len(checked)} pairs not run (the reason is on each line)"


def test_a_failed_check_is_fail_and_exit_status_1(monkeypatch, capsys):
    w = [w for w in CPU_WORKLOADS if w.op == "decode"][0]
    monkeypatch.setitem(bench.PROVIDERS, "broken", lambda w, q, k, v: torch.zeros_like(q))
    assert bench.main(["--shapes", "cpu:op=decode", "--providers", "broken,naive", "--no-progress"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"broken +{re.escape(w.label)} +\S+ +{tolerance(w):.1e}  FAIL   wrong result: .*", next(l for l in lines if l.startswith("broken"))), lines
    assert lines[-1] == "1 of 2 checks FAILED: broken"


@pytest.mark.parametrize("args, message", [
    (["--shapes", "nonsense"], "argument --shapes: unknown workload set 'nonsense'; choose from ['backward', 'cpu', 'decode', 'fa3', 'gqa', 'money', 'prefill', "
                          "'quick']"),
    (["--shapes", "cpu:Q=1"], "argument --shapes: unknown field 'Q' in 'cpu:Q=1'; use one of ['batch', 'causal', 'dtype', 'head_dim', "
                              "'heads_kv', 'heads_q', 'op', 'seqlen_k', 'seqlen_q'] or B, N, D, H, Lq, Lk"),
    (["--shapes", "cpu:B=7"], "argument --shapes: 'cpu:B=7' selects no workloads; in 'cpu', batch ∈ [1, 2]"),
    (["--providers", "triton_fa2,nope"], "argument --providers: unknown provider 'nope'; choose from triton_fa2, sdpa, sdpa_flash, "
                                         "sdpa_cudnn, sdpa_efficient, flex, flash_attn, naive"),
    (["--quick", "--shapes", "cpu"], "argument --shapes: not allowed with argument --quick"),
    (["--fresh", "--resume"], "argument --resume: not allowed with argument --fresh"),
    (["--hero", "--quick"], "--hero measures nothing, so --quick, --shapes, --providers, --fresh and --resume do not go with it: "
                            "drop them or --hero"),
])
@pytest.mark.newest_triton_only
def test_bad_options_are_usage_errors_on_every_machine(args, message, capsys):
    """Refused before anything runs, with or without a GPU (without one only the cpu set runs, yet a bad --shapes is refused): exit 2.
    In this process (`main` is what `python -m triton_fa2.bench` runs; the next test runs a usage error through the command)."""
    with pytest.raises(SystemExit) as exit_: bench.main(args)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, out + err[-2000:]
    assert err.splitlines()[-1] == f"python -m triton_fa2.bench: error: {message}"
    assert "Traceback" not in err and out == ""


@pytest.mark.newest_triton_only
def test_a_csv_option_without_a_csv_is_a_usage_error():
    if torch.cuda.is_available(): pytest.skip("on a GPU the CSV defaults to results/raw.csv")
    run = bench_cli("--resume", "--providers", "naive")
    assert run.returncode == 2 and run.stderr.splitlines()[-1] == ("python -m triton_fa2.bench: error: --resume needs a CSV to act "
                                                                   "on: without a GPU there is no default one, so name it with --out")
    assert "Traceback" not in run.stderr and run.stdout == ""


@pytest.mark.newest_triton_only
def test_version_and_the_usage_line():
    run = bench_cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"triton_fa2 {triton_fa2.__version__} · torch {torch.__version__} · triton {triton.__version__}"
    run = bench_cli("--help")
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m triton_fa2.bench [-h]") and "bench.py" not in run.stdout


@pytest.mark.newest_triton_only
def test_no_progress_hides_the_progress_bar():
    "The help says what --no-progress does, and it does it: the bar (on stderr) is there without it and gone with it."
    help_text = " ".join(bench_cli("--help").stdout.split())
    assert "--no-progress hide the progress bar" in help_text
    if torch.cuda.is_available(): pytest.skip("the one-pair CPU run below is what shows the bar")
    one_pair = ["--shapes", "cpu:op=decode", "--providers", "naive"]
    shown, hidden = bench_cli(*one_pair), bench_cli(*one_pair, "--no-progress")
    assert shown.returncode == hidden.returncode == 0, shown.stderr[-2000:] + hidden.stderr[-2000:]
    assert "benchmark: 100%" in shown.stderr and "benchmark" not in hidden.stderr
