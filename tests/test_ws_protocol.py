"""The warp-specialised kernel's barrier protocol (notebook 11's `_attn_fwd_ws`), replayed by `tools/ws_protocol_sim.py`
on random schedules: two and three consumers, ping-pong or not, with and without a redo. A deadlock, a slot refilled
before every consumer released it, a tile read before it landed or turns out of order fail here, on the CPU."""
import itertools, os, sys
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from ws_protocol_sim import run


# (consumers, stages): the two-consumer candidate's ring and deeper ones; three consumers need a slot each for a redo
@pytest.mark.parametrize("consumers, stages", [(2, 2), (2, 3), (3, 3), (3, 4)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_the_protocol_holds_on_random_schedules(consumers, stages, pingpong):
    for n_loads, redo in itertools.product((0, 1, 2, 5, 13), itertools.product((False, True), repeat=consumers)):
        for seed in range(5):
            assert run(n_loads, stages, pingpong, redo, seed, consumers)


def test_the_simulation_catches_a_broken_protocol(monkeypatch):
    "The turn barriers' parity of a two-consumer kernel, kept for three, lets consumer 2 cut in: the check must see it."
    import ws_protocol_sim
    source = open(ws_protocol_sim.__file__).read().replace("(k & 1) ^ 1 if me == 0 else k & 1", "(k & 1) ^ (1 - me)")
    assert source != open(ws_protocol_sim.__file__).read()
    broken = {}
    exec(compile(source, "broken_sim", "exec"), broken)
    with pytest.raises(AssertionError):
        for seed in range(20): broken["run"](7, 3, True, (False, False, False), seed, 3)


# A persistent program (`PERSISTENT`): blocks in a row; the rings' laps, the turns and the per-block parities carry on
@pytest.mark.parametrize("blocks", [(3, 0, 5), (1, 1, 1, 1), (7, 2)])   # an empty block between; one load each; uneven
@pytest.mark.parametrize("stages, pingpong", [(2, True), (3, True), (2, False)])
def test_the_persistent_protocol_holds_on_random_schedules(blocks, stages, pingpong):
    for seed in range(8):
        redo = [((seed + j) % 3 == 0, (seed * j) % 4 == 1) for j in range(len(blocks))]
        assert run(list(blocks), stages, pingpong, redo, seed)


@pytest.mark.parametrize("mutation", [
    ("            if j > 0:\n                while not block_bar.passed((j - 1) & 1): yield\n", "            if False:\n"),   # no wait for the last block
    ("yield from take_turn(me, ring + t + 1)", "yield from take_turn(me, t + 1)"),                            # turns counted per block
    ("while not q_bars[me].passed(j & 1): yield", "while not q_bars[me].passed(0): yield"),                   # Q's parity not carried
])
def test_the_simulation_catches_a_broken_persistent_protocol(mutation):
    import ws_protocol_sim
    original = open(ws_protocol_sim.__file__).read()
    source = original.replace(*mutation)
    assert source != original
    broken = {}
    exec(compile(source, "broken_sim", "exec"), broken)
    with pytest.raises(AssertionError):
        for seed in range(30): broken["run"]([3, 2, 4, 1], 2, True, [(True, False), (False, True), (False, False), (True, True)], seed)
