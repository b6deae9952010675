"""The Gluon kernels (notebook 11): on sm_90 more candidates beside `_attn_fwd`'s, chosen by the dispatcher. CPU (CI): each
candidate compiled for sm_90 (no spill, no register touched under a running wgmma), the hazard scan itself, and the
dispatch in `_attention_forward` with a stand-in kernel. GPU (H200): every candidate against float64 on odd shapes, the
fixed maximum's overflow fallback, GQA, Lq ≠ Lk, flash-attn's strided layout, a negative scale, the dispatcher's pick
and its saved launch; softcap, ALiBi and sinks (chapter 14) in every candidate, on CPU where the dispatcher sends them.
"""
import itertools
import os
import pytest
import torch

import triton_fa2.dispatch as dispatch
from triton_fa2 import gluon
from triton_fa2.candidates import GLUON_HEAD_DIMS, PREFILL_GLUON, WARP_SPECIALIZED_HEAD_DIMS, Candidate
from triton_fa2.gluon import applies, sm90_reports, takes, wgmma_hazards
from triton_fa2.interface import attention
from triton_fa2.score_mods import ScoreMods

CANDIDATES = PREFILL_GLUON
GluonConfig = lambda BLOCK_M=64, BLOCK_N=64, STAGES=2, num_warps=4, **flags: Candidate("gluon", BLOCK_M, BLOCK_N, num_warps, STAGES, **flags)
head_dims = lambda c: WARP_SPECIALIZED_HEAD_DIMS if c.WARP_SPECIALIZE else GLUON_HEAD_DIMS
from triton_fa2.naive import attention_ref
from test_attention import LSE_TOL, TOL, errors, randn
from test_tma import check_path
from test_score_mods import TOL as MOD_TOL, mods_for, reference as mods_reference

on_h100_class = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# A loop in cuobjdump's SASS: a wgmma (HGMMA) whose accumulator R24…R55 is read before the DEPBAR that retires it.
RACY = """
        /*0100*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;  /* 0x0 */
        /*0110*/                   FMUL R30, R24, 2 ;                                         /* 0x0 */
        /*0120*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                            /* 0x0 */
        /*0130*/                   FADD R60, R24, R25 ;                                       /* 0x0 */
        /*0140*/               @P0 BRA 0x100 ;                                                /* 0x0 */
"""


def test_the_hazard_scan_finds_a_read_under_a_running_wgmma():
    found = wgmma_hazards(RACY)
    assert [h[1] for h in found] == ["0x110", "0x110"]                 # once per pass through the loop
    safe = RACY.replace("/*0110*/                   FMUL R30, R24, 2 ;", "/*0110*/                   FMUL R70, R71, 2 ;")
    assert wgmma_hazards(safe) == []                                   # R24 read only after the wait: fine
    # P (the A operand in registers) rewritten while PV still runs: the race of PV left running with P in registers
    racy_a = RACY.replace("R24, gdesc[UR4], RZ, !UPT", "R24, R88, gdesc[UR4], R24").replace("FMUL R30, R24, 2", "FMUL R89, R70, 2")
    assert [h[1] for h in wgmma_hazards(racy_a)] == ["0x110", "0x110"]


@pytest.mark.parametrize("D, causal, dtype", [(128, True, torch.bfloat16),   # the money shot's kernels: the most registers
                                              (64, False, torch.float16)])   # the other head dim, the other dtype
def test_every_candidate_compiles_for_sm90_without_spills_or_hazards(D, causal, dtype):
    candidates = [c for c in CANDIDATES if D in head_dims(c)]
    assert any(c.WARP_SPECIALIZE for c in candidates) == (D == 128)     # the ws kernel is a candidate at D = 128 only
    for config, r in zip(candidates, sm90_reports(candidates, D, causal, dtype)):
        assert r["stack_bytes"] == 0 and r["registers"] <= 255, r       # nothing spilled to local memory
        assert r["hazards"] == 0, r                                     # no register touched under a running wgmma
        # PV(t) runs under softmax(t+1) in psmem loops only: one loop, or each ws consumer's online and fixed loops
        assert r["waits_leaving_one"] == (4 if config.WARP_SPECIALIZE else int(config.P_SMEM)), r
        assert (r["setmaxnreg"] > 0) == config.WARP_SPECIALIZE, r       # registers handed from the loading warp
        assert r["wgmma"] > 0 and r["shared_kib"] <= 227, r


def test_the_ws_kernel_compiles_at_d64_too():
    """The ws candidate is not timed at D = 64 (slower than the pick there), but a test or a user may pass it as `config`:
    it must compile cleanly there."""
    ws = next(c for c in CANDIDATES if c.WARP_SPECIALIZE)
    (r,) = sm90_reports([ws], 64, True, torch.float16)
    assert r["stack_bytes"] == 0 and r["hazards"] == 0 and r["waits_leaving_one"] == 4 and r["setmaxnreg"] > 0, r


def test_the_ws_arguments_two_consumers_and_their_registers():
    "128-row blocks for two 64-row consumer warpgroups of 240 registers, the loading warp 24: `maxnreg` 168 for the launch."
    t = lambda L, D: torch.empty(2, 8, L, D, dtype=torch.bfloat16)
    ws = next(c for c in CANDIDATES if c.WARP_SPECIALIZE)
    named, grid = gluon._arguments(t(300, 128), t(300, 128), t(300, 128), t(300, 128), torch.empty(2, 8, 300), True, 0.125, ws)
    assert (grid, named["CONSUMER_REGS"], named["maxnreg"]) == (3 * 2 * 8, 240, 168)
    assert [n for n in gluon.WS_ARG_NAMES if n in named] == gluon.WS_ARG_NAMES    # every kernel argument is built
    with pytest.raises(ValueError, match="BLOCK_M = 128, not 192"):             # the kernel has two consumers, no more
        gluon._arguments(t(300, 64), t(300, 64), t(300, 64), t(300, 64), torch.empty(2, 8, 300), True, 0.125,
                         GluonConfig(192, 64, 3, 4, P_SMEM=True, WARP_SPECIALIZE=True, PINGPONG=True))


def test_where_the_gluon_kernel_applies():
    q = randn(1, 2, 64, 64)
    assert not applies(q, 64, True, False, True) or on_h100_class      # a CPU tensor, the interpreter, another GPU: never
    assert [c.label for c in CANDIDATES] == ["gluon 64x64 w4 s2 qreg", "gluon 64x64 w4 s2", "gluon 64x64 w4 s2 qreg psmem",
                                             "gluon ws 128x128 s2 pingpong"]   # what ships
    assert GluonConfig(64, 64, 2, 4, Q_IN_REGS=True).label == "gluon 64x64 w4 s2 qreg" == CANDIDATES[0].label
    named, grid = gluon._arguments(*(torch.empty(2, 8, 100, 64, dtype=torch.bfloat16) for _ in range(4)),
                                   torch.empty(2, 8, 100), True, 0.125, GluonConfig(64, 64, 2, 4))
    assert grid == 2 * 2 * 8 and named["group_size"] == 1 and named["seqlen_q"] == 100
    ws = GluonConfig(128, 128, 2, 4, P_SMEM=True, WARP_SPECIALIZE=True, PINGPONG=True)
    assert ws.label == "gluon ws 128x128 s2 pingpong" and ws in CANDIDATES and head_dims(ws) == (128,)
    named, grid = gluon._arguments(*(torch.empty(2, 8, 100, 128, dtype=torch.bfloat16) for _ in range(4)),
                                   torch.empty(2, 8, 100), True, 0.125, ws)
    assert grid == 1 * 2 * 8 and named["q_desc"].block_shape == [1, 1, 64, 128] and named["k_desc"].block_shape == [1, 1, 128, 128]
    # a saved launch finds qk_scale by the kernel's parameter names, which agree up to it for both kernels
    at = gluon.ARG_NAMES.index("qk_scale")
    assert gluon.WS_ARG_NAMES[:at + 1] == gluon.ARG_NAMES[:at + 1]


def test_the_dispatch_runs_a_gluon_pick_and_refuses_it_where_it_cannot_run(monkeypatch):
    "A Gluon config goes to `gluon.launch` when `applies` allows it, and raises a ValueError naming why when not."
    q, k, v = (randn(1, 2, 40, 64) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(1, 2, 40, device=q.device)
    config = GluonConfig()
    with pytest.raises(ValueError, match="runs only on sm_90"):
        dispatch._attention_forward(q, k, v, o, lse, True, 0.125, config=config)
    launched = []
    def stand_in(q, k, v, o, lse, causal, scale, config, mods=None):
        launched.append(config); o.copy_(attention_ref(q, k, v, causal=causal, scale=scale)[0]); return None, 1, [], []
    monkeypatch.setattr(gluon, "applies", lambda *args: True)
    monkeypatch.setattr(gluon, "launch", stand_in)
    assert dispatch._attention_forward(q, k, v, o, lse, True, 0.125, config=config) is config and launched == [config]



def test_a_gluon_pick_that_fails_falls_back_to_the_tl_kernel_once(monkeypatch):
    "The dispatcher's Gluon pick failing at run time: one warning, the `tl` kernel's result, never an error in the call."
    import warnings
    q, k, v = (randn(1, 2, 40, 64) for _ in range(3))
    o, lse = torch.full_like(q, float("nan")), torch.empty(1, 2, 40, device=q.device)
    monkeypatch.setattr(dispatch, "_PICKS", {})
    dispatch._attention_forward(q, k, v, o, lse, True, 0.125)             # chooses: the `tl` kernel's pick for this key
    (key,) = dispatch._PICKS
    monkeypatch.setitem(dispatch._PICKS, key, GluonConfig())              # as if the Gluon kernel had won the choice
    monkeypatch.setattr(gluon, "_DISABLED", [])
    monkeypatch.setattr(gluon, "applies", lambda *args: not gluon._DISABLED)
    def broken(*args): raise RuntimeError("a Gluon API this code does not know")
    monkeypatch.setattr(gluon, "launch", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            o.fill_(float("nan"))
            config = dispatch._attention_forward(q, k, v, o, lse, True, 0.125)
            assert config.kernel == "tl" and dispatch._PICKS[key] is config
            o_ref, _ = attention_ref(q.double(), k.double(), v.double(), causal=True, scale=0.125)
            assert all(e <= t for e, t in zip(errors(o, o_ref), TOL[q.dtype]))
    messages = [str(w.message) for w in caught if "Gluon" in str(w.message)]
    assert len(messages) == 1 and "gluon 64x64 w4 s2 failed (RuntimeError" in messages[0] and "`tl` kernel runs instead" in messages[0]
    with pytest.raises(RuntimeError, match="does not know"):                # a config given explicitly (tests) still raises
        monkeypatch.setattr(gluon, "applies", lambda *args: True)
        dispatch._attention_forward(q, k, v, o, lse, True, 0.125, config=GluonConfig())


def test_the_gluon_kernels_run_only_on_the_releases_they_were_tested_on(monkeypatch):
    "On sm_90 with another Triton release, `applies` says no and warns once, naming both releases."
    import warnings
    from triton_fa2.runtime import triton_release
    q = type("Q", (), dict(is_cuda=True, dtype=torch.bfloat16, device=None))()   # a call as an H200 sees it
    monkeypatch.setattr(gluon, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(gluon, "interpreting", lambda: False)
    monkeypatch.setattr(gluon, "_DISABLED", [])
    monkeypatch.delenv("TRITON_FA2_NO_GLUON", raising=False)
    monkeypatch.setattr(gluon, "GLUON_RELEASES", (triton_release(),))
    assert applies(q, 128, True, False, True) and not applies(q, 96, True, False, True)
    monkeypatch.setattr(gluon, "GLUON_RELEASES", ((3, 6), (3, 0)))
    if triton_release() not in gluon.GLUON_RELEASES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not applies(q, 128, True, False, True) and not applies(q, 64, True, False, True)
        assert len(caught) == 1 and "enabled on Triton 3.6, 3.0" in str(caught[0].message)
    monkeypatch.setattr(gluon, "_DISABLED", [])
    monkeypatch.setenv("TRITON_FA2_NO_GLUON", "1")                        # the user's switch: off, and silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not applies(q, 128, True, False, True)


def test_gluon_that_cannot_be_loaded_is_said_once_on_sm90(monkeypatch):
    import warnings
    q = type("Q", (), dict(is_cuda=True, dtype=torch.bfloat16, device=None))()
    monkeypatch.setattr(dispatch, "_gluon", None)
    monkeypatch.setattr(dispatch, "_GLUON_MISSING", ["the Gluon kernels for sm_90 could not be loaded (ImportError: x)"])
    monkeypatch.setattr(dispatch, "_capability", lambda device: (9, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not dispatch._gluon_applies(q, 128, True, False, True) and not dispatch._gluon_applies(q, 128, True, False, True)
    assert len(caught) == 1 and "could not be loaded (ImportError: x)" in str(caught[0].message)

# Each score modifier alone, softcap, ALiBi and sinks together, and windows: one that reaches back 100 keys (left edge
# tiles masked in the run with the fixed maximum), one narrower than a block (every tile online), one on both sides
# (right bounded: with the causal mask it is 0), and a window with the other three (`mods_for`'s arguments)
GLUON_MODS = {"softcap": dict(softcap=3.0), "alibi per head": dict(alibi="per head"),
              "alibi per batch row": dict(alibi="per batch row"), "sinks": dict(sink=True),
              "all three": dict(softcap=3.0, alibi="per batch row", sink=True), "window": dict(window=(100, 0)),
              "narrow window": dict(window=(5, 3)), "window both sides": dict(window=(70, 33)),
              "window and all three": dict(window=(200, 0), softcap=3.0, alibi="per batch row", sink=True)}


def test_the_dispatcher_takes_every_score_modifier_to_gluon(monkeypatch):
    """As on an H200 (`usable` says yes): `applies` says with every modifier, a window too, what it says without them; the
    dispatcher asks it with the fixed maximum the Gluon kernels keep and hands the modifiers to `gluon.launch`; the ws
    kernel is refused by name with ALiBi or a window (`takes`); and every call still runs as before (the `tl` kernel here,
    the interpreter having no Gluon candidates) with the right result."""
    q = randn(2, 4, 100, 64)                       # GQA 2:1 below, its rows unpacked (100 rows fill blocks well)
    monkeypatch.setattr(gluon, "usable", lambda q: True)
    with_mods = [None, *(mods_for(4, 2, **m) for m in GLUON_MODS.values())]
    for D in (32, 64, 96, 128, 256):
        for use_tma, pack, fixed_max in itertools.product((False, True), repeat=3):
            before = use_tma and not pack and fixed_max and D in GLUON_HEAD_DIMS        # `applies` without the modifiers
            assert all(applies(q, D, use_tma, pack, fixed_max, m) == before for m in with_mods)
    asked, launched, real_applies = [], [], gluon.applies
    monkeypatch.setattr(gluon, "applies", lambda *args: asked.append(args) or real_applies(*args))
    def stand_in(q, k, v, o, lse, causal, scale, config, mods=None):
        launched.append(mods); o.copy_(mods_reference(q, k, v, causal, mods or ScoreMods())[0]); return None, 1, [], []
    monkeypatch.setattr(gluon, "launch", stand_in)
    k, v = randn(2, 2, 120, 64), randn(2, 2, 120, 64)
    ws = next(c for c in CANDIDATES if c.WARP_SPECIALIZE)
    for mods in with_mods:
        o, lse = torch.empty_like(q), torch.empty(2, 4, 100, device=q.device)
        dispatch._attention_forward(q, k, v, o, lse, True, 0.125, config=GluonConfig(), mods=mods)
        assert launched[-1] is mods and asked[-1][4] is True and asked[-1][5] is mods   # asked with the fixed maximum
        if mods is not None and mods.alibi_slopes is not None:
            assert not takes(ws, mods)
            with pytest.raises(ValueError, match="ALiBi: not the ws kernel"):
                dispatch._attention_forward(q, k, v, o, lse, True, 0.125, config=ws, mods=mods)
        else: assert takes(ws, mods)
        o.fill_(float("nan"))
        assert dispatch._attention_forward(q, k, v, o, lse, True, 0.125, mods=mods).kernel == "tl"
        o_ref, _ = mods_reference(q, k, v, True, mods or ScoreMods())
        assert not o.isnan().any() and (o.double() - o_ref).abs().max() <= MOD_TOL[q.dtype]


@pytest.mark.parametrize("D, causal, dtype", [(128, True, torch.bfloat16), (64, False, torch.float16)])
def test_every_candidate_compiles_for_sm90_with_score_modifiers(D, causal, dtype):
    "Every modifier each candidate takes, at once (`takes`): nothing spilled, no register touched under a running wgmma."
    candidates = [c for c in CANDIDATES if D in head_dims(c)]
    for config, r in zip(candidates, sm90_reports(candidates, D, causal, dtype, mods=True)):
        assert r["stack_bytes"] == 0 and r["registers"] <= 255 and r["hazards"] == 0, r
        assert r["waits_leaving_one"] == (4 if config.WARP_SPECIALIZE else int(config.P_SMEM)), r   # the same overlap


@pytest.mark.parametrize("D, causal, dtype", [(128, True, torch.bfloat16), (64, False, torch.float16)])
def test_every_one_warpgroup_candidate_compiles_for_sm90_with_a_window(D, causal, dtype):
    "A sliding window alone, the common case: nothing spilled, no register touched under a running wgmma, the same overlap."
    candidates = [c for c in CANDIDATES if D in head_dims(c) and not c.WARP_SPECIALIZE]
    for config, r in zip(candidates, sm90_reports(candidates, D, causal, dtype, mods="window")):
        assert r["stack_bytes"] == 0 and r["registers"] <= 255 and r["hazards"] == 0, r
        assert r["waits_leaving_one"] == int(config.P_SMEM), r


def check_gluon(q, k, v, causal, config, scale=None):
    "`check_path` with a Gluon config: poisoned outputs in flash-attn's strided layout, o and lse against float64."
    try: check_path(q, k, v, causal, use_tma=True, config=config, scale=scale)
    except AssertionError as e: raise AssertionError(f"{config.label}: {e}") from e


gpu = pytest.mark.skipif(not on_h100_class, reason="the Gluon kernel runs on sm_90 only")


# (B, Hq, Hkv, Lq, Lk, D)
GPU_SHAPES = [
    (1, 2, 2, 17, 17, 64),        # one partial Q block: the masked run alone
    (2, 4, 4, 1000, 1000, 128),   # partial last block and tile: both runs, the LSE mask
    (1, 2, 2, 300, 700, 128),     # Lq < Lk: bottom-right causal, a long unmasked run
    (1, 2, 2, 700, 300, 64),      # Lq > Lk: rows that see no key (O = 0, LSE = −∞)
    (1, 8, 2, 513, 513, 128),     # GQA 4:1 (unpacked: 513 rows fill blocks well)
    (1, 1, 1, 1, 1, 128),         # one query, one key
    (2, 4, 4, 4096, 4096, 64),    # long rows: where a race on P's registers (PV left running) showed as NaN
]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("B, Hq, Hkv, Lq, Lk, D", GPU_SHAPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_every_candidate_matches_reference(B, Hq, Hkv, Lq, Lk, D, causal, dtype):
    q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
    for config in CANDIDATES: check_gluon(q, k, v, causal, config)


def overflowing_inputs(head_dim:int, dtype):
    "(2, 2, 512, D) q, k, v with q ≥ 0 and key 0 at 30 everywhere: its scores far above every later row's diagonal maximum."
    q = randn(2, 2, 512, head_dim, dtype=dtype).abs()
    k, v = randn(2, 2, 512, head_dim, dtype=dtype), randn(2, 2, 512, head_dim, dtype=dtype)
    k[:, :, 0] = 30.0
    return q, k, v


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_overflow_falls_back_online(dtype):
    "Key 0 scores far above every later row's diagonal maximum: P overflows in the unmasked run, the block is redone."
    q, k, v = overflowing_inputs(64, dtype)
    for config in CANDIDATES: check_gluon(q, k, v, True, config)


@pytest.mark.gpu
@gpu
def test_gpu_negative_scale():
    q, k, v = (randn(1, 2, 300, 128) for _ in range(3))
    for config in CANDIDATES: check_gluon(q, k, v, True, config, scale=-0.05)


@pytest.mark.gpu
@gpu
def test_gpu_the_pick_and_its_saved_launch(monkeypatch):
    "`attention` chooses with the Gluon candidates in; the pick, then its saved launch, give the same exact output."
    dispatch._PICKS.clear(); dispatch._PLANS.clear()
    q, k, v = (randn(8, 32, 2048, 128, dtype=torch.bfloat16) for _ in range(3))
    outs = [attention(q, k, v, causal=True) for _ in range(3)]            # choose and launch; then the saved launch
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    o_ref, _ = attention_ref(q[:1, :4], k[:1, :4], v[:1, :4], causal=True, upcast=torch.float64)
    assert errors(outs[2][:1, :4], o_ref)[0] <= TOL[torch.bfloat16][0]
    plan = next(iter(dispatch._PLANS.values()))
    assert plan and plan.candidate in dispatch._PICKS.values()
    print("money shot's pick:", plan.candidate.label)
    monkeypatch.setenv("TRITON_FA2_NO_GLUON", "1")                      # the escape hatch: the `tl` kernel alone
    dispatch._PICKS.clear(); dispatch._PLANS.clear()
    attention(q, k, v, causal=True)
    assert all(c.kernel == "tl" for c in dispatch._PICKS.values())


def test_the_package_works_where_gluon_cannot_be_loaded():
    """Our Gluon modules failing to import (a Triton whose Gluon API they do not know): the package imports, and the forward
    and backward run on the `tl` kernels; no other module may import them."""
    import subprocess, sys, textwrap
    code = textwrap.dedent('''
        import sys
        sys.modules["triton_fa2.gluon"] = None                     # importing it raises ImportError
        import torch, triton_fa2
        from triton_fa2 import dispatch
        assert dispatch._gluon is None and dispatch._gluon_backward is None
        device = "cuda" if torch.cuda.is_available() else "cpu"
        q, k, v = (torch.randn(1, 2, 40, 32, device=device, dtype=torch.float16, requires_grad=True) for _ in range(3))
        triton_fa2.attention(q, k, v, causal=True).float().sum().backward()
        assert all(t.grad is not None and not t.grad.isnan().any() for t in (q, k, v))
        print("ok")''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def check_gluon_mods(q, k, v, causal, config, mods, v_seen=None):
    """A Gluon config with score modifiers: poisoned outputs in flash-attn's strided layout, o and lse against float64
    (`test_score_mods.reference`, given `v_seen` where v holds NaN no row may see), NaN never passing, −∞ LSE exactly where
    a row sees nothing (and no sink)."""
    B, Hq, Lq, D = q.shape
    o = torch.full((B, Lq, Hq, D), float("nan"), device=q.device, dtype=q.dtype).transpose(1, 2)
    lse = torch.full((B, Hq, Lq), float("nan"), device=q.device)
    dispatch._attention_forward(q, k, v, o, lse, causal, D ** -0.5, config=config, pack_gqa=False, use_tma=True, mods=mods)
    o_ref, lse_ref = mods_reference(q, k, v if v_seen is None else v_seen, causal, mods)
    where = f"{config.label} {tuple(q.shape)} Lk={k.shape[2]} Hkv={k.shape[1]}"
    assert not o.isnan().any() and not lse.isnan().any(), f"{where}: an element left unwritten, or NaN produced"
    err = (o.double() - o_ref).abs().max().item() / max(1.0, o_ref.abs().max().item())
    assert err <= MOD_TOL[q.dtype], f"{where}: max error {err:.3g} > {MOD_TOL[q.dtype]}"
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-5, rtol=2e-5, msg=lambda m: f"{where}: {m}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("modifiers", list(GLUON_MODS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_every_candidate_with_score_modifiers(modifiers, causal, dtype):
    """Every Gluon candidate with softcap, ALiBi (per head, per batch row; the one-warpgroup kernel's, `takes`) and sinks,
    alone and all three, on the plain test's odd shapes (one partial block, Lq ≠ Lk both ways, GQA 4:1): without the causal mask ALiBi's blocks run online
    from their diagonal (`_key_plan`), rows past Lk see no key (O = 0; LSE −∞, or the sink)."""
    for B, Hq, Hkv, Lq, Lk, D in GPU_SHAPES[:5]:
        q, k, v = randn(B, Hq, Lq, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype), randn(B, Hkv, Lk, D, dtype=dtype)
        mods = mods_for(Hq, B, **GLUON_MODS[modifiers])
        for config in CANDIDATES:
            if takes(config, mods): check_gluon_mods(q, k, v, causal, config, mods)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_overflow_with_softcap_redoes_the_block(dtype):
    """Key 0's capped logit (near c = 100) lies about 140 above later rows' diagonal maxima in base 2: 2^x overflows,
    past the FMA pipe's exp2 too (`_exp2_half_fma`: +inf from 128 on), and the block is redone online."""
    q, k, v = overflowing_inputs(128, dtype)
    for causal in (True, False):
        for config in CANDIDATES: check_gluon_mods(q, k, v, causal, config, ScoreMods(softcap=100.0))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_overflow_in_a_window_redoes_the_window(dtype):
    """Key 200 scores far above every other: rows whose window holds it in the run with the fixed maximum overflow, and
    the block is redone online from the window's first tile, not from key 0 (whose keys it must never see)."""
    q, k, v = overflowing_inputs(128, dtype)
    k[:, :, 0] = 0.0
    k[:, :, 200] = 30.0
    v_seen = v.clone()
    v[:, :, :128] = float("nan")                 # keys no window reaches from query 428 on (a tile of 128): never loaded
    mods = ScoreMods(window_size=(300, 0))
    for config in CANDIDATES:
        if takes(config, mods): check_gluon_mods(q[:, :, 428:], k, v, True, config, mods, v_seen=v_seen)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_overflow_with_modifiers_redoes_from_the_sink(dtype):
    "Key 0 far above every row's diagonal, gentle ALiBi slopes and sinks: P overflows, and the redo starts from the sink again."
    q, k, v = overflowing_inputs(128, dtype)
    mods = ScoreMods(alibi_slopes=torch.full((2,), 0.01, device=q.device), learnable_sink=torch.randn(2, device=q.device))
    for causal in (True, False):
        for config in CANDIDATES:   # the ws kernel: the sink alone (`takes`)
            check_gluon_mods(q, k, v, causal, config, mods if takes(config, mods) else mods._replace(alibi_slopes=None))
