"""The synchronisation of the warp-specialised kernel (notebook 11's `_attn_fwd_ws`), simulated on the CPU: the loading
warp and the two consumer warpgroups as coroutines that wait on and arrive at mbarriers with PTX's semantics
(`wait(parity)` returns once the phase of that parity has completed; a fresh barrier counts as having completed phase
parity 1), TMA copies landing at random later steps, and a random scheduler. Each run checks that nothing deadlocks, that
a ring slot is refilled only after both consumers released its previous tile, that each consumer reads the tile it
asked for, that with ping-pong the consumers issue their products strictly in turn, and that a redo (the fixed
maximum's overflow) starts only after both consumers are done with the rings and the producer has issued every load.
The kernel's own code is not run: this checks the protocol it follows, written out again here step for step, which a
GPU run could only show as a hang or a wrong tile now and then. `BUGS` are deliberate protocol errors; each must be caught.

    python tools/ws_protocol_sim.py            # thousands of random schedules over loads, stages, ping-pong, redo; every bug caught
"""
import itertools, random

CONSUMERS = 2


class Barrier:
    "An mbarrier: `count` arrivals (and the expected transaction bytes, here one TMA completion) complete a phase."
    def __init__(self, count): self.count, self.pending, self.phase = count, count, 0
    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        if self.pending == 0: self.phase, self.pending = self.phase + 1, self.count
    def passed(self, parity): return self.phase % 2 != parity   # PTX: the phase of this parity has completed


def run(n_loads, stages, pingpong, redo, seed):
    """One schedule of one block: `n_loads` K/V loads through rings of `stages` slots, the consumers taking turns with
    `pingpong`, `redo[c]` whether consumer c finds an overflow and redoes the block. True, or an AssertionError."""
    rng = random.Random(seed)
    everyone = set(range(CONSUMERS))
    k_ready, v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
    k_empty, v_empty = [Barrier(CONSUMERS) for _ in range(stages)], [Barrier(CONSUMERS) for _ in range(stages)]
    turn, redo_bars, q_bars = ([Barrier(1) for _ in range(CONSUMERS)] for _ in range(3))
    done = Barrier(CONSUMERS)
    k_slot, v_slot = [None] * stages, [None] * stages            # which load a slot holds (None: being written)
    q_tile = [False] * CONSUMERS                                 # whether a consumer's Q tile has landed
    released = {"k": [set() for _ in range(n_loads)], "v": [set() for _ in range(n_loads)]}
    in_flight, issued, issue_order, main_done = [], [0], [], set()

    def tma(kind, g, bar):                                       # a copy that lands some steps later
        slot = g % stages
        if g >= stages: assert released[kind][g - stages] == everyone, f"{kind} slot {slot} refilled before all released load {g - stages}"
        (k_slot if kind == "k" else v_slot)[slot] = None
        in_flight.append((rng.randint(1, 6), kind, g, bar))

    def producer():                                              # `_ws_producer`
        for c in range(CONSUMERS): in_flight.append((rng.randint(1, 6), "q", c, q_bars[c]))
        for t in range(n_loads):
            slot, phase = t % stages, (t // stages) & 1
            while not k_empty[slot].passed(phase ^ 1): yield
            tma("k", t, k_ready[slot])
            while not v_empty[slot].passed(phase ^ 1): yield
            tma("v", t, v_ready[slot])
            issued[0] = t + 1

    def wait_tile(bars, slots, g, kind):                         # `_wait_slot`
        while not bars[g % stages].passed((g // stages) & 1): yield
        assert slots[g % stages] == g, f"consumer read {kind} slot {g % stages} holding {slots[g % stages]}, wanted load {g}"

    def take_turn(me, k):                                        # `_take_turn`
        if pingpong:
            while not turn[me].passed((k & 1) ^ 1 if me == 0 else k & 1): yield
        issue_order.append(me)

    def give_turn(me):                                           # `_give_turn`
        if pingpong: turn[(me + 1) % CONSUMERS].arrive()

    def release(kind, g, me):                                    # a consumer's arrival on a slot's `empty` barrier
        released[kind][g].add(me)
        (k_empty if kind == "k" else v_empty)[g % stages].arrive()

    def consumer(me):                                            # `_ws_consumer`
        while not q_bars[me].passed(0): yield
        assert q_tile[me], f"consumer {me} read its Q tile before it landed"
        if n_loads > 0:
            yield from take_turn(me, 0)
            yield from wait_tile(k_ready, k_slot, 0, "k")        # QK(0) issued
            give_turn(me)
            yield                                                # … and waited for
            release("k", 0, me)
            for t in range(n_loads - 1):                         # `_ws_products`, the softmax, `_ws_retire`
                yield from take_turn(me, t + 1)
                yield from wait_tile(k_ready, k_slot, t + 1, "k")   # QK(t+1) issued
                yield from wait_tile(v_ready, v_slot, t, "v")       # PV(t) issued
                give_turn(me)
                yield                                            # wait(1): QK(t+1) done
                release("k", t + 1, me)
                yield                                            # softmax(t+1); wait(0): PV(t) done
                release("v", t, me)
            yield from wait_tile(v_ready, v_slot, n_loads - 1, "v")
            yield
            release("v", n_loads - 1, me)
        main_done.add(me); done.arrive()
        if redo[me]:
            while not done.passed(0): yield
            assert main_done == everyone, "redo while the other consumer still uses the rings"
            assert issued[0] == n_loads and not any(kind in "kv" for _, kind, _, _ in in_flight), "redo while the producer still loads"
            for t in range(3):                                   # own loads into slot `me`, one at a time
                in_flight.append((rng.randint(1, 6), "redo", t, redo_bars[me]))
                while not redo_bars[me].passed(t & 1): yield

    alive = {"producer": producer(), **{f"consumer{c}": consumer(c) for c in range(CONSUMERS)}}
    for step in itertools.count():
        landed = [c for c in in_flight if c[0] <= 0]
        for c in landed:
            in_flight.remove(c)
            _, kind, t, bar = c
            if kind in "kv": (k_slot if kind == "k" else v_slot)[t % stages] = t
            if kind == "q": q_tile[t] = True
            bar.arrive()
        in_flight[:] = [(d - 1, *rest) for d, *rest in in_flight]
        if not alive and not in_flight: break
        if alive:
            name = rng.choice(list(alive))
            try: next(alive[name])
            except StopIteration: del alive[name]
        assert step < 200_000, f"deadlock: {sorted(alive)} still waiting (loads {n_loads}, stages {stages})"
    if pingpong: assert issue_order == list(range(CONSUMERS)) * n_loads, issue_order
    return True


# Deliberate protocol errors, as (this file's text, the text with the bug): the schedules must catch every one
BUGS = {
    "the producer's parity a lap off": ("k_empty[slot].passed(phase ^ 1)", "k_empty[slot].passed(phase)"),
    "an empty barrier counts one consumer": ("k_empty, v_empty = [Barrier(CONSUMERS)", "k_empty, v_empty = [Barrier(1)"),
    "the turns' parities swapped": ("(k & 1) ^ 1 if me == 0 else k & 1", "k & 1 if me == 0 else (k & 1) ^ 1"),
    "a redo that does not wait for the other consumer": ("while not done.passed(0): yield", "pass"),
    "a slot released twice": ('release("k", t + 1, me)', 'release("k", t + 1, me); release("k", t + 1, me)'),
}


def with_bug(name):
    "`run` of this protocol with `BUGS[name]` in it."
    protocol, rest = open(__file__).read().split("\nBUGS = {", 1)          # the bug goes into the protocol, not into this table
    assert protocol.count(BUGS[name][0]) == 1, name
    namespace = {"__file__": __file__}
    exec(compile(protocol.replace(*BUGS[name]) + "\nBUGS = {" + rest, f"ws_protocol_sim with {name}", "exec"), namespace)
    return namespace["run"]


def caught(name, seeds=range(20)) -> bool:
    "Whether some random schedule of a short block with a redo fails under `BUGS[name]`."
    broken = with_bug(name)
    for seed in seeds:
        try: broken(7, 2, True, (seed % 2 == 0, True), seed)
        except AssertionError: return True
    return False


def schedules(seeds=40):
    "Every combination of loads, stages, ping-pong and redo, `seeds` random schedules each: how many ran, all held."
    runs = 0
    for n_loads, stages, pingpong, redo in itertools.product((0, 1, 2, 3, 7, 20), (2, 3, 4), (False, True),
                                                             itertools.product((False, True), repeat=CONSUMERS)):
        for seed in range(seeds):
            run(n_loads, stages, pingpong, redo, seed); runs += 1
    return runs


if __name__ == "__main__":
    runs = schedules()
    missed = [name for name in BUGS if not caught(name)]
    print(f"{runs} random schedules: no deadlock, no slot refilled early, every tile read as loaded, turns kept, redo safe")
    print(f"{len(BUGS) - len(missed)} of {len(BUGS)} deliberate bugs caught" + (f"; missed: {missed}" if missed else ""))
    raise SystemExit(1 if missed else 0)
