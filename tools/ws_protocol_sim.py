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
    """One schedule. `n_loads`: the block's K/V loads, or a list of them, one per block of a persistent program
    (`_ws_producer_persistent`, `_ws_consumer_persistent`); `redo`: which consumers redo, or a list of that per block."""
    blocks = list(n_loads) if isinstance(n_loads, (list, tuple)) else [n_loads]
    redos = list(redo) if isinstance(redo[0], (list, tuple)) else [redo]
    assert len(redos) == len(blocks)
    total = sum(blocks)
    starts = [sum(blocks[:j]) for j in range(len(blocks))]     # each block's first load in the program's count (`ring`)
    rng = random.Random(seed)
    everyone = set(range(consumers))
    k_ready, v_ready = [Barrier(1) for _ in range(stages)], [Barrier(1) for _ in range(stages)]
    k_empty, v_empty = [Barrier(consumers) for _ in range(stages)], [Barrier(consumers) for _ in range(stages)]
    turn, redo_bars, q_bars = ([Barrier(1) for _ in range(consumers)] for _ in range(3))
    done, block_bar = Barrier(consumers), Barrier(consumers)
    k_slot, v_slot = [None] * stages, [None] * stages            # which load a slot holds (None: being written)
    q_tile = [None] * consumers                                  # which block's Q a consumer's tile holds
    released = {"k": [set() for _ in range(total)], "v": [set() for _ in range(total)]}
    in_flight, issued, issue_order, finished = [], [0], [], set()
    main_done = [set() for _ in blocks]                          # consumers done with the rings, per block
    q_read = [set() for _ in blocks]                             # consumers done reading Q, per block

    def tma(kind, g, bar):                                       # a copy that lands some steps later
        slot = g % stages
        if g >= stages: assert released[kind][g - stages] == everyone, f"{kind} slot {slot} refilled before all released load {g - stages}"
        (k_slot if kind == "k" else v_slot)[slot] = None
        in_flight.append((rng.randint(1, 6), kind, g, bar))

    def producer():
        for j, n in enumerate(blocks):
            if j > 0:
                while not block_bar.passed((j - 1) & 1): yield
                assert q_read[j - 1] == everyone, "Q reloaded while a consumer still reads the last block's"
            for c in range(consumers):
                q_tile[c] = None
                in_flight.append((rng.randint(1, 6), "q", (c, j), q_bars[c]))
            for t in range(n):
                g = starts[j] + t
                slot, phase = g % stages, (g // stages) & 1
                while not k_empty[slot].passed(phase ^ 1): yield
                tma("k", g, k_ready[slot])
                while not v_empty[slot].passed(phase ^ 1): yield
                tma("v", g, v_ready[slot])
                issued[0] = g + 1
        finished.add("producer")

    def wait_tile(bars, slots, g, kind):
        while not bars[g % stages].passed((g // stages) & 1): yield
        assert slots[g % stages] == g, f"consumer read {kind} slot {g % stages} holding {slots[g % stages]}, wanted load {g}"

    def take_turn(me, k):
        if pingpong:
            while not turn[me].passed((k & 1) ^ 1 if me == 0 else k & 1): yield
        issue_order.append(me)

    def give_turn(me):
        if pingpong: turn[(me + 1) % consumers].arrive()

    def consumer(me):
        redo_loads = 0
        for j, n in enumerate(blocks):
            ring = starts[j]
            while not q_bars[me].passed(j & 1): yield
            assert q_tile[me] == j, f"consumer {me} read Q of block {q_tile[me]} for block {j}"
            if n > 0:
                yield from take_turn(me, ring)
                yield from wait_tile(k_ready, k_slot, ring, "k")    # QK(0) issued
                give_turn(me)
                yield                                                # … and waited for
                released["k"][ring].add(me); k_empty[ring % stages].arrive()
                for t in range(n - 1):
                    yield from take_turn(me, ring + t + 1)
                    yield from wait_tile(k_ready, k_slot, ring + t + 1, "k")   # QK(t+1) issued
                    yield from wait_tile(v_ready, v_slot, ring + t, "v")       # PV(t) issued
                    give_turn(me)
                    yield                                                # wait(1): QK(t+1) done
                    released["k"][ring + t + 1].add(me); k_empty[(ring + t + 1) % stages].arrive()
                    yield                                                # softmax(t+1); wait(0): PV(t) done
                    released["v"][ring + t].add(me); v_empty[(ring + t) % stages].arrive()
                yield from wait_tile(v_ready, v_slot, ring + n - 1, "v")
                yield
                released["v"][ring + n - 1].add(me); v_empty[(ring + n - 1) % stages].arrive()
            q_read[j].add(me)
            main_done[j].add(me); done.arrive()
            if redos[j][me]:
                while not done.passed(j & 1): yield
                assert main_done[j] == everyone, "redo while another consumer still uses the rings"
                assert issued[0] == starts[j] + n and not any(kind in "kv" for _, kind, _, _ in in_flight), "redo while the producer still loads"
                for t in range(3):                                   # own loads into slot `me`, one at a time
                    in_flight.append((rng.randint(1, 6), "redo", t, redo_bars[me]))
                    while not redo_bars[me].passed((redo_loads + t) & 1): yield
                redo_loads += 3
            if len(blocks) > 1: block_bar.arrive()                   # the persistent program's: done with the rings
        finished.add(f"consumer{me}")

    tasks = {"producer": producer(), **{f"consumer{c}": consumer(c) for c in range(consumers)}}
    alive = dict(tasks)
    for step in itertools.count():
        landed = [c for c in in_flight if c[0] <= 0]
        for c in landed:
            in_flight.remove(c)
            _, kind, t, bar = c
            if kind in "kv": (k_slot if kind == "k" else v_slot)[t % stages] = t
            if kind == "q": q_tile[t[0]] = t[1]
            bar.arrive()
        in_flight[:] = [(d - 1, *rest) for d, *rest in in_flight]
        if not alive and not in_flight: break
        name = rng.choice(list(alive)) if alive else None
        if name:
            try: next(alive[name])
            except StopIteration: del alive[name]
        assert step < 200_000, f"deadlock: {sorted(alive)} still waiting (loads {blocks}, stages {stages})"
    if pingpong: assert issue_order == list(range(consumers)) * total, issue_order
    return True


if __name__ == "__main__":
    runs = 0
    for consumers in (2, 3):
        redos = list(itertools.product((False, True), repeat=consumers))
        for n_loads, stages, pingpong, redo in itertools.product((0, 1, 2, 3, 7, 20), (2, 3, 4), (False, True), redos):
            if stages < consumers: continue                      # the kernel asserts one ring slot per consumer (the redo's)
            for seed in range(40 if consumers == 2 else 20):
                run(n_loads, stages, pingpong, redo, seed, consumers); runs += 1
    for blocks, stages, pingpong in itertools.product(((3, 0, 5), (1, 1, 1, 1), (7, 2), (0, 0, 4)), (2, 3), (False, True)):
        for seed in range(40):                                   # a persistent program: blocks in a row, random redos
            redo = [tuple(random.Random(seed * 7 + j * 3 + c).random() < 0.3 for c in range(2)) for j in range(len(blocks))]
            run(list(blocks), stages, pingpong, redo, seed); runs += 1
    print(f"{runs} random schedules: no deadlock, no slot refilled early, every tile read as loaded, turns kept, redo safe")
