"""The synchronisation of the warp-specialised kernel (notebook 11's `_attn_fwd_ws`), simulated on the CPU: the producer
warp and the two or three consumer warpgroups as coroutines that wait on and arrive at mbarriers with PTX's semantics (`wait(parity)` returns once the
phase of that parity has completed; a fresh barrier counts as having completed phase parity 1), TMA copies completing
at random later steps, and a random scheduler. Each run checks that nothing deadlocks, that a ring slot is refilled
only after every consumer released its previous tile, that each consumer reads the tile it asked for, that with
ping-pong the consumers issue their products strictly in turn, and that a redo (FIXED_MAX) starts only after every
consumer is done with the rings and the producer has issued every load. The kernel's own code is not run: this checks
the protocol it follows, written out again here step for step, which a GPU run could only show as a hang.

    python tools/ws_protocol_sim.py            # thousands of random schedules over loads, stages, ping-pong, redo
"""
import itertools, random


class Barrier:
    "An mbarrier: `count` arrivals (and the expected transaction bytes, here one TMA completion) complete a phase."
    def __init__(self, count): self.count, self.pending, self.phase = count, count, 0
    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        if self.pending == 0: self.phase, self.pending = self.phase + 1, self.count
    def passed(self, parity): return self.phase % 2 != parity   # PTX: the phase of this parity has completed


def run(n_loads, stages, pingpong, redo, seed, consumers=2):
    rng = random.Random(seed)
    everyone = set(range(consumers))
    k_ready, v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
    k_empty, v_empty = [Barrier(consumers) for _ in range(stages)], [Barrier(consumers) for _ in range(stages)]
    turn, redo_bars, q_bars = ([Barrier(1) for _ in range(consumers)] for _ in range(3))
    done = Barrier(consumers)
    k_slot, v_slot = [None] * stages, [None] * stages            # which load a slot holds (None: being written)
    released = {"k": [set() for _ in range(n_loads)], "v": [set() for _ in range(n_loads)]}
    in_flight, issued, issue_order, finished, main_done = [], [0], [], set(), set()

    def tma(kind, t, bar):                                       # a copy that lands some steps later
        slot = t % stages
        if t >= stages: assert released[kind][t - stages] == everyone, f"{kind} slot {slot} refilled before all released load {t - stages}"
        (k_slot if kind == "k" else v_slot)[slot] = None
        in_flight.append((rng.randint(1, 6), kind, t, bar))

    def producer():
        for c in range(consumers): in_flight.append((rng.randint(1, 6), "q", c, q_bars[c]))
        for t in range(n_loads):
            slot, phase = t % stages, (t // stages) & 1
            while not k_empty[slot].passed(phase ^ 1): yield
            tma("k", t, k_ready[slot])
            while not v_empty[slot].passed(phase ^ 1): yield
            tma("v", t, v_ready[slot])
            issued[0] = t + 1
        finished.add("producer")

    def wait_tile(bars, slots, t, kind):
        while not bars[t % stages].passed((t // stages) & 1): yield
        assert slots[t % stages] == t, f"consumer read {kind} slot {t % stages} holding {slots[t % stages]}, wanted load {t}"

    def take_turn(me, k):
        if pingpong:
            while not turn[me].passed((k & 1) ^ 1 if me == 0 else k & 1): yield
        issue_order.append(me)

    def give_turn(me):
        if pingpong: turn[(me + 1) % consumers].arrive()

    def consumer(me):
        while not q_bars[me].passed(0): yield
        if n_loads > 0:
            yield from take_turn(me, 0)
            yield from wait_tile(k_ready, k_slot, 0, "k")       # QK(0) issued
            give_turn(me)
            yield                                                # … and waited for
            released["k"][0].add(me); k_empty[0].arrive()
            for t in range(n_loads - 1):
                yield from take_turn(me, t + 1)
                yield from wait_tile(k_ready, k_slot, t + 1, "k")   # QK(t+1) issued
                yield from wait_tile(v_ready, v_slot, t, "v")       # PV(t) issued
                give_turn(me)
                yield                                                # wait(1): QK(t+1) done
                released["k"][t + 1].add(me); k_empty[(t + 1) % stages].arrive()
                yield                                                # softmax(t+1); wait(0): PV(t) done
                released["v"][t].add(me); v_empty[t % stages].arrive()
            yield from wait_tile(v_ready, v_slot, n_loads - 1, "v")
            yield
            released["v"][n_loads - 1].add(me); v_empty[(n_loads - 1) % stages].arrive()
        main_done.add(me); done.arrive()
        if redo[me]:
            while not done.passed(0): yield
            assert main_done == everyone, "redo while another consumer still uses the rings"
            assert issued[0] == n_loads and not any(kind in "kv" for _, kind, _, _ in in_flight), "redo while the producer still loads"
            for t in range(3):                                   # own loads into slot `me`, one at a time
                in_flight.append((rng.randint(1, 6), "redo", t, redo_bars[me]))
                while not redo_bars[me].passed(t & 1): yield
        finished.add(f"consumer{me}")

    tasks = {"producer": producer(), **{f"consumer{c}": consumer(c) for c in range(consumers)}}
    alive = dict(tasks)
    for step in itertools.count():
        landed = [c for c in in_flight if c[0] <= 0]
        for c in landed:
            in_flight.remove(c)
            _, kind, t, bar = c
            if kind in "kv": (k_slot if kind == "k" else v_slot)[t % stages] = t
            bar.arrive()
        in_flight[:] = [(d - 1, *rest) for d, *rest in in_flight]
        if not alive and not in_flight: break
        name = rng.choice(list(alive)) if alive else None
        if name:
            try: next(alive[name])
            except StopIteration: del alive[name]
        assert step < 100_000, f"deadlock: {sorted(alive)} still waiting (n_loads {n_loads}, stages {stages})"
    if pingpong: assert issue_order == list(range(consumers)) * n_loads, issue_order
    return True


if __name__ == "__main__":
    runs = 0
    for consumers in (2, 3):
        redos = list(itertools.product((False, True), repeat=consumers))
        for n_loads, stages, pingpong, redo in itertools.product((0, 1, 2, 3, 7, 20), (2, 3, 4), (False, True), redos):
            if stages < consumers: continue                      # the kernel asserts one ring slot per consumer (the redo's)
            for seed in range(40 if consumers == 2 else 20):
                run(n_loads, stages, pingpong, redo, seed, consumers); runs += 1
    print(f"{runs} random schedules: no deadlock, no slot refilled early, every tile read as loaded, turns kept, redo safe")
