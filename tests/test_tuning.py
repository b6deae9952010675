"""The first call's config without timing: every GPU family gets one that fits, for every head dim, dtype and mask; the
H200's rules name real candidates; the tuning cache and the dispatcher across processes; calls from many threads."""
import json, os, subprocess, sys, textwrap
import pytest
import torch
import triton
from triton_fa2 import candidates, dispatch, split_kv, tuning
from triton_fa2.candidates import _backward_smem_bytes, _smem_bytes
from triton_fa2.tuning import GPU_FAMILIES, rule_config, rules

# Tests marked newest_triton_only check tables, rules and the tuning cache, no kernel: .ci/run runs them on the newest
# Triton only (test_threads_on_new_shapes, which runs kernels from many threads, runs on every release it tests).

HEAD_DIMS = range(8, 257, 8)


@pytest.mark.newest_triton_only
@pytest.mark.parametrize("capability", sorted(GPU_FAMILIES), ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_every_call_has_a_config_that_fits(capability, monkeypatch):
    """Every candidate any call could be given (the rule's, the first, or a tuned one) fits the family's shared memory: for
    every supported head dim, through descriptors where the GPU has TMA and through pointers everywhere (packed GQA rows,
    unaligned views); prefill, decode at every packed-row count, and both backward passes. dtype and mask change the
    rule, never the candidates, and every rule found is one of them."""
    monkeypatch.setattr(candidates, "interpreting", lambda: False)
    name, smem = GPU_FAMILIES[capability]
    paths = (False, True) if capability[0] >= 9 else (True,)
    for D in HEAD_DIMS:
        block_d = max(triton.next_power_of_2(D), 16)
        for pointers in paths:
            prefill = candidates.prefill_candidates(D, pointers, smem)
            assert prefill and all(_smem_bytes(c.BLOCK_M, c.BLOCK_N, block_d, c.num_stages) <= smem for c in prefill), (name, D, pointers, prefill)
            for kernel in ("bwd_dkdv", "bwd_dq"):
                found = candidates.backward_candidates(kernel, D, pointers, smem)
                bwd_d = min(max(triton.next_power_of_2(D), 64), 256)
                assert found and all(_backward_smem_bytes(c, bwd_d) <= smem for c in found), (name, kernel, D, pointers, found)
            for dtype in (torch.float16, torch.bfloat16):
                for causal in (False, True):
                    for seqlen_k in (1, 700, 4096, 100000):
                        rule = rule_config("prefill", capability, D, dtype, causal, seqlen_k)
                        labels = [c.label for c in candidates.prefill_candidates(D, pointers, smem, gluon=True)]
                        assert rule is None or rule in labels or pointers, (name, D, rule, labels)
        for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            block_m = split_kv._decode_block_m(rows)
            found = candidates.decode_candidates(block_m, D, smem)
            assert found and all(_smem_bytes(block_m, c.BLOCK_N, block_d, c.num_stages) <= smem for c in found), (name, D, rows, found)


@pytest.mark.newest_triton_only
def test_rules_name_candidates_of_their_kernel():
    "Each H200 rule names a candidate its kernel offers at that head dim through descriptors (the path the benchmark measured)."
    found = rules((9, 0))
    assert found, "the package ships its sm_90 rules (package data)"
    assert {r["kernel"] for r in found} == {"prefill", "bwd_dkdv", "bwd_dq", "decode", "decode_paged"}
    smem = GPU_FAMILIES[(9, 0)][1]
    for r in found:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(candidates, "interpreting", lambda: False)
            if r["kernel"] == "prefill": offered = candidates.prefill_candidates(r["head_dim"], False, smem, gluon=True)
            elif r["kernel"].startswith("decode"): offered = candidates.decode_candidates(split_kv._decode_block_m(4), r["head_dim"], smem)
            else: offered = candidates.backward_candidates(r["kernel"], r["head_dim"], False, smem, gluon=True)
        assert r["config"] in [c.label for c in offered], r


@pytest.mark.newest_triton_only
def test_decode_rules_stand_for_both_masks_and_every_measured_length():
    """One query sees the same keys with the mask or without: each decode rule is written for both, and a call between
    two measured lengths takes the nearer one's config."""
    decode = [r for r in rules((9, 0)) if r["kernel"].startswith("decode")]
    assert decode
    for r in decode:
        for causal in (False, True):
            assert rule_config(r["kernel"], (9, 0), r["head_dim"], torch.bfloat16, causal, r["seqlen_k"]) == r["config"], r
    lengths = sorted({r["seqlen_k"] for r in decode})
    for a, b in zip(lengths, lengths[1:]):
        near_a = next(r for r in decode if r["kernel"] == "decode" and r["head_dim"] == 128 and r["seqlen_k"] == a)
        assert rule_config("decode", (9, 0), 128, torch.float16, True, int(a * 1.1)) == near_a["config"]


@pytest.mark.gpu
def test_gpu_decode_first_call_runs_the_rule(monkeypatch):
    """A first decode call without tuning launches the decode rule's config for its cache kind (contiguous or paged),
    and its output matches the float64 reference."""
    from triton_fa2 import flash_attn_with_kvcache
    from triton_fa2.naive import attention_ref
    monkeypatch.setenv("TRITON_FA2_NO_CACHE", "1")
    capability = torch.cuda.get_device_capability()
    for paged in (False, True):
        dispatch._PICKS.clear(); dispatch._DECODE_PLANS.clear()
        q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.tensor([1000, 617], dtype=torch.int32, device="cuda")
        if paged:
            table = torch.randperm(2 * 63, device="cuda")[:2 * 63].view(2, 63).to(torch.int32)
            def pool(t):                                      # pages of 16 at shuffled blocks; a last page's tail NaN
                out = torch.full((2 * 63, 16, 2, 128), float("nan"), device="cuda", dtype=t.dtype)
                out[table.long()] = torch.cat([t, t.new_full((2, 8, 2, 128), float("nan"))], 1).view(2, 63, 16, 2, 128)
                return out
            kc, vc, extra = pool(k), pool(v), dict(block_table=table)
        else: kc, vc, extra = k, v, {}
        with tuning.tuning(False): out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, **extra)
        rule = rule_config("decode_paged" if paged else "decode", capability, 128, torch.bfloat16, True, kc.shape[1] * (63 if paged else 1))
        picks = [c.label for key, c in dispatch._PICKS.items() if key[0] == "decode"]
        assert picks and (rule is None or picks == [rule]), (paged, picks, rule)
        for b in range(2):
            n = int(seqlens[b])
            ref, _ = attention_ref(q[b:b + 1].double().transpose(1, 2), k[b:b + 1, :n].double().transpose(1, 2),
                                   v[b:b + 1, :n].double().transpose(1, 2), causal=True, upcast=torch.float64)
            assert not out.isnan().any()
            assert (out[b:b + 1].double().transpose(1, 2) - ref).abs().max() <= 2e-2, (paged, b)



@pytest.mark.newest_triton_only
@pytest.mark.parametrize("mods", ["window", "softcap", "alibi"])
def test_rules_keep_their_kernel_under_score_modifiers(mods, monkeypatch):
    """Where a call's modifiers rule out the candidate a rule names (the ws kernel takes no ALiBi; the 64×128
    Gluon dK/dV tile spills with softcap or ALiBi), the first call still runs the rule's kernel, on its first candidate that
    takes them: a Gluon rule stays on a Gluon kernel, never falls to a `tl` tiling."""
    from triton_fa2 import gluon
    from triton_fa2.score_mods import ScoreMods
    monkeypatch.setattr(candidates, "interpreting", lambda: False)
    given = dict(window=ScoreMods(window_size=(4095, 0)), softcap=ScoreMods(softcap=50.0),
                 alibi=ScoreMods(alibi_slopes=torch.ones(32)))[mods]
    smem = GPU_FAMILIES[(9, 0)][1]
    for r in rules((9, 0)):
        if r["kernel"].startswith("decode"): continue          # modifiers do not change decode's candidates
        if r["kernel"] == "prefill":
            offered = [c for c in candidates.prefill_candidates(r["head_dim"], False, smem, gluon=True)
                       if c.kernel != "gluon" or gluon.takes(c, given)]
        else:
            offered = candidates.backward_candidates(r["kernel"], r["head_dim"], False, smem, gluon=True, score_mods=mods != "window",
                                                     softcap_mixed=False)
        pick = dispatch._rule_pick(r["config"], offered)
        every = (candidates.prefill_candidates(r["head_dim"], False, smem, gluon=True) if r["kernel"] == "prefill"
                 else candidates.backward_candidates(r["kernel"], r["head_dim"], False, smem, gluon=True))
        named = next(c for c in every if c.label == r["config"])
        assert pick.kernel == named.kernel, (mods, r, pick)
        if named in offered: assert pick == named, (mods, r, pick)

def _run(code:str, cache:str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TRITON_FA2_CACHE_DIR=cache, **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


CHOOSE = """
    import json, sys
    from triton_fa2 import dispatch
    from triton_fa2.candidates import Candidate
    from triton_fa2.tuning import tuning
    a, b, c = (Candidate("tl", 64, n, 4, 3) for n in (16, 32, 64))
    timed = []
    dispatch._time_candidates = lambda cands, run: timed.extend(cands) or {a: [1.2], b: [0.9], c: [1.5]}
    key = ("prefill", 64, True, False, 8, 512, True, True, True, "torch.bfloat16", "cpu")
    with tuning(sys.argv[1] == "tune"): pick = dispatch._choose(key, [a, b, c], run=None, rule=c.label)
    print(json.dumps(dict(pick=pick.label, timed=len(timed))))
"""


@pytest.mark.newest_triton_only
def test_a_tuned_pick_serves_later_processes(tmp_path, monkeypatch):
    "Process 1 uses the rule; process 2 tunes and saves; process 3 reads the pick untimed; with the cache off, the rule again."
    run = lambda mode, **env: json.loads(_run(CHOOSE.replace("sys.argv[1]", repr(mode)), str(tmp_path), **env))
    assert run("rule") == dict(pick="64x64 w4 s3", timed=0)
    assert run("tune") == dict(pick="64x32 w4 s3", timed=3)
    assert run("rule") == dict(pick="64x32 w4 s3", timed=0)
    assert run("rule", TRITON_FA2_NO_CACHE="1") == dict(pick="64x64 w4 s3", timed=0)
    assert run("tune", TRITON_FA2_NO_CACHE="1") == dict(pick="64x32 w4 s3", timed=3)
    (entry,) = tmp_path.rglob("*.json")
    assert json.loads(entry.read_text())["timings_ms"] == {"64x16 w4 s3": 1.2, "64x32 w4 s3": 0.9, "64x64 w4 s3": 1.5}
    entry.write_text("{ not json")                                          # cut short: the next process warns, uses the rule
    monkeypatch.setenv("TRITON_FA2_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match="ignoring the tuning cache entry"):
        assert tuning.load_pick(("prefill", 64, True, False, 8, 512, True, True, True, "torch.bfloat16"), "cpu") is None
    assert run("rule") == dict(pick="64x64 w4 s3", timed=0)


WRITER = """
    import sys, warnings
    warnings.simplefilter("error")                       # a torn entry read back would warn: fail instead
    from triton_fa2 import tuning
    key = ("prefill", 64, True, False, 8, 512, True, True, True, "torch.bfloat16")
    for i in range(200):
        tuning.save_pick(key, "cpu", f"64x{sys.argv[1]} w4 s3", {"i": i})
        assert tuning.load_pick(key, "cpu") in ("64x16 w4 s3", "64x32 w4 s3")
"""


@pytest.mark.newest_triton_only
def test_two_processes_writing_one_entry_at_once(tmp_path):
    "Two processes save and read the same entry 200 times each, at once: every read sees one whole entry, never a torn one."
    env = dict(os.environ, TRITON_FA2_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), n], env=env, stderr=subprocess.PIPE, text=True)
             for n in ("16", "32")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    (entry,) = tmp_path.rglob("*.json")                  # one entry, no temporary files left behind
    assert json.loads(entry.read_text())["config"] in ("64x16 w4 s3", "64x32 w4 s3")
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.newest_triton_only
def test_a_change_to_any_module_moves_the_cache_to_a_new_directory(tmp_path, monkeypatch):
    """Saved picks live under a hash of the package's source: changing any module (a kernel of packed sequences, a score
    modifier, the launch code) names a new directory, so no pick measured on other kernels is read."""
    import importlib.resources, pathlib, shutil
    copy = tmp_path / "triton_fa2"
    shutil.copytree(pathlib.Path(tuning.__file__).parent, copy)
    monkeypatch.setattr(importlib.resources, "files", lambda package: copy)
    tuning._source_hash.cache_clear()
    try:
        before = tuning._namespace("NVIDIA H200")
        for module in ("varlen.py", "score_mods.py", "launch.py"):
            (copy / module).write_text((copy / module).read_text() + "\n# changed\n")
            tuning._source_hash.cache_clear()
            after = tuning._namespace("NVIDIA H200")
            assert after != before, module
            before = after
    finally: tuning._source_hash.cache_clear()


@pytest.mark.newest_triton_only
def test_an_unwritable_cache_warns_once_and_tuning_still_serves(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TRITON_FA2_CACHE_DIR", str(blocker / "under a file"))
    monkeypatch.setattr(tuning, "_WRITE_FAILED", [])
    with pytest.warns(UserWarning, match="cannot write the tuning cache") as caught:
        for i in range(3): assert tuning.save_pick(("k", i), "cpu", "x") is None
    assert len([w for w in caught if "cannot write" in str(w.message)]) == 1


@pytest.mark.newest_triton_only
def test_tuning_is_logged_once(monkeypatch, caplog):
    "The first tuning of a process is a warning on the `triton_fa2` logger, naming the cache; later keys are debug lines."
    from triton_fa2.candidates import Candidate
    a, b = Candidate("tl", 64, 16, 4, 3), Candidate("tl", 64, 32, 4, 3)
    monkeypatch.setattr(dispatch, "_time_candidates", lambda cands, run: {a: [1.0], b: [2.0]})
    monkeypatch.setattr(dispatch, "_PICKS", {}); monkeypatch.setattr(dispatch, "_TUNED", set())
    monkeypatch.setattr(tuning, "_SAID", set())
    monkeypatch.setenv("TRITON_FA2_NO_CACHE", "1")
    with caplog.at_level("DEBUG", logger="triton_fa2"), tuning.tuning():
        for i in range(3): dispatch._choose(("prefill", i, "cpu"), [a, b], run=None)
    levels = [r.levelname for r in caplog.records if "tuning" in r.getMessage()]
    assert levels == ["WARNING", "DEBUG", "DEBUG"], levels
    assert "compiling and timing 2 candidates" in caplog.records[0].getMessage()


def test_threads_on_new_shapes():
    "Eight threads at once, attention (forward and backward) and decode, each on a shape no other uses: all correct."
    from concurrent.futures import ThreadPoolExecutor
    from triton_fa2 import attention, decode
    from triton_fa2.backward import attention_backward_ref
    from triton_fa2.naive import attention_ref
    device = "cuda" if torch.cuda.is_available() else "cpu"
    def one(i):
        g = torch.Generator().manual_seed(i)
        L, D = 17 + 5 * i, (16, 32, 48)[i % 3]
        q, k, v = (torch.randn(1, 2, L, D, generator=g).to(device, torch.float16) for _ in range(3))
        if i % 3 == 0:
            lens = torch.tensor([L - 2], dtype=torch.int32, device=device)
            return [(decode(q[:, :, -2:], k, v, cache_seqlens=lens),
                     attention_ref(q[:, :, -2:], k, v, causal=True, kv_lens=lens, upcast=torch.float64)[0])]
        if i % 3 == 1: return [(attention(q, k, v, causal=True), attention_ref(q, k, v, causal=True, upcast=torch.float64)[0])]
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        do = torch.randn(q.shape, generator=g).to(device, torch.float16)
        attention(*leaves, causal=False).backward(do)
        return list(zip((x.grad for x in leaves), attention_backward_ref(q, k, v, do, causal=False, scale=D ** -0.5)))
    with ThreadPoolExecutor(8) as pool: results = list(pool.map(one, range(8)))
    for pairs in results:
        for got, ref in pairs:
            assert not got.isnan().any()
            assert (got.double() - ref).abs().max() <= 3e-3 * max(1.0, ref.abs().max().item())


@pytest.mark.newest_triton_only
def test_packaged_rules_are_what_the_benchmark_rows_give(tmp_path):
    "The sm_90 rules in the package are `tools/rules.py make`'s table of results/raw.csv as it stands: no rule outlives its rows."
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "rules.json"
    subprocess.run([sys.executable, os.path.join(root, "tools", "rules.py"), "make", "--raw", os.path.join(root, "results", "raw.csv"),
                    "--out", str(out)], check=True, capture_output=True)
    packaged = json.loads(open(os.path.join(root, "triton_fa2", "rules_sm90.json")).read())
    made = json.loads(out.read_text())
    assert made["rules"] == packaged["rules"] and made["commit"] == packaged["commit"], "run tools/rules.py make after a sweep"
