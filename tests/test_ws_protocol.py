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
