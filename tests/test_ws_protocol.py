"""The warp-specialised kernel's barrier protocol (notebook 11's `_attn_fwd_ws`), replayed by `tools/ws_protocol_sim.py`
on random schedules: ping-pong or not, with and without a redo in either consumer. A deadlock, a slot refilled before
both consumers released it, a tile read before it landed or turns out of order fail here, on the CPU; and so must each
deliberate bug of `BUGS`, or the simulation checks nothing."""
import itertools, os, sys
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import ws_protocol_sim
from ws_protocol_sim import run

pytestmark = pytest.mark.newest_triton_only   # a Python simulation, no Triton: not run again on another Triton (.ci/run)


@pytest.mark.parametrize("stages", [2, 3])        # the candidate's ring, and a deeper one
@pytest.mark.parametrize("pingpong", [False, True])
def test_the_protocol_holds_on_random_schedules(stages, pingpong):
    for n_loads, redo in itertools.product((0, 1, 2, 5, 13), itertools.product((False, True), repeat=2)):
        for seed in range(5):
            assert run(n_loads, stages, pingpong, redo, seed)


@pytest.mark.parametrize("bug", list(ws_protocol_sim.BUGS))
def test_the_simulation_catches_a_broken_protocol(bug):
    assert ws_protocol_sim.caught(bug), f"no schedule failed with {bug!r}"
    with pytest.raises(AssertionError):                # the bug is in the protocol, and the file's own table is intact
        ws_protocol_sim.with_bug(bug)(7, 2, True, (True, True), 0)
