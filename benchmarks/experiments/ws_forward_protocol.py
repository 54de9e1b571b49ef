"""A model of the warp-specialized forward's synchronization (fwd_kernel_sm90_ws.cuh), run under
random interleavings: the producer thread and each consumer warpgroup as a coroutine, the
mbarriers (phases, arrival counts, parity waits) and the consumers' named turn barriers as the
hardware counts them. It checks, over many random schedules and walks:
  - no deadlock;
  - no slot (Q, K or V) is refilled while an MMA that reads it may still run (from its issue to
    the wgmma wait that retires it);
  - every MMA reads the block it means (the slot holds that tile's block at issue);
  - every barrier phase gets its arrivals from distinct warpgroups (a warpgroup that arrived twice
    in one phase would complete it for a warpgroup still reading).
Consumers compute the steps [begin, end) of each tile that FwdQueryBlock::steps_seen_by gives them (drawn at
random here: top skips as under a causal mask, bottom skips as under a window's left edge, none)
and take the turns and releases of the others. The model follows the kernel's order of
operations line by line; a change to that order should be made here too.

    python benchmarks/experiments/ws_forward_protocol.py [--walks 2000] [--consumers 3] [--stages 2]
"""

import argparse
import random


WAIT = "wait"  # what a coroutine yields while it spins on a barrier; anything else is progress


class Deadlock(Exception):
    pass


class MBarrier:
    """Phase counter with an arrival count; wait_parity(p) passes once the phase of parity p is done."""

    def __init__(self, name, count):
        self.name, self.count, self.completed, self.arrived = name, count, 0, []

    def arrive(self, who):
        assert who not in self.arrived, f"{self.name}: {who} arrived twice in phase {self.completed}"
        self.arrived.append(who)
        if len(self.arrived) == self.count:
            self.completed += 1
            self.arrived = []

    def passed(self, parity):
        return self.completed % 2 != parity


class NamedBarrier:
    """bar.sync / bar.arrive of two warpgroups: a generation completes with two participants."""

    def __init__(self, name):
        self.name, self.generation, self.members = name, 0, []

    def join(self, who):
        assert who not in self.members, f"{self.name}: {who} joined generation {self.generation} twice"
        self.members.append(who)
        generation = self.generation
        if len(self.members) == 2:
            self.generation += 1
            self.members = []
        return generation


class Shared:
    def __init__(self, consumers, stages):
        self.consumers, self.stages = consumers, stages
        self.q_full, self.q_empty = MBarrier("q_full", 1), MBarrier("q_empty", consumers)
        self.full = {kv: [MBarrier(f"{kv}_full{s}", 1) for s in range(stages)] for kv in "kv"}
        self.empty = {kv: [MBarrier(f"{kv}_empty{s}", consumers) for s in range(stages)] for kv in "kv"}
        self.turn = [NamedBarrier(f"turn{c}") for c in range(consumers)]
        self.content = {"q": None, **{(kv, s): None for kv in "kv" for s in range(stages)}}
        self.readers = {key: set() for key in self.content}  # MMAs in flight on each slot
        self.landing = []  # (slot key, content, full barrier) of TMA loads not yet landed


def producer(sh, tiles):
    ring = 0
    for t, (n_blocks, _) in enumerate(tiles):
        while not sh.q_empty.passed((t & 1) ^ 1):
            yield WAIT
        assert not sh.readers["q"], "Q refilled under an S MMA"
        sh.landing.append(("q", ("q", t), sh.q_full))

        def load(kv, i):
            pos = ring + i
            slot, parity = pos % sh.stages, (pos // sh.stages) & 1
            while not sh.empty[kv][slot].passed(parity ^ 1):
                yield WAIT
            assert not sh.readers[(kv, slot)], f"{kv} slot {slot} refilled under an MMA"
            sh.landing.append(((kv, slot), (kv, t, i), sh.full[kv][slot]))

        yield from load("k", 0)
        for i in range(n_blocks):
            if i + 1 < n_blocks:
                yield from load("k", i + 1)
            yield from load("v", i)
        ring += n_blocks


def consumer(sh, c, tiles):
    me = f"wg{c}"
    pending = []  # slot keys read by MMAs issued and not yet retired

    def turn_wait():
        generation = sh.turn[c].join(me)
        while sh.turn[c].generation == generation:
            yield WAIT

    def turn_pass():
        sh.turn[(c + 1) % sh.consumers].join(me)

    def retire_all():  # wgmma_wait<0>
        for key in pending:
            sh.readers[key].discard(me)
        pending.clear()

    def issue(key, expect):
        assert sh.content[key] == expect, f"{me} read {sh.content[key]} from {key}, meant {expect}"
        sh.readers[key].add(me)
        pending.append(key)

    if c == sh.consumers - 1:  # WarpgroupTurns::start
        sh.turn[0].join(me)
    ring = 0
    for t, (n_blocks, ranges) in enumerate(tiles):
        begin, end = ranges[c]
        at = lambda i: ((ring + i) % sh.stages, ((ring + i) // sh.stages) & 1)  # noqa: E731

        def wait_filled(kv, i):
            slot, parity = at(i)
            while not sh.full[kv][slot].passed(parity):
                yield WAIT

        def release_k(i):
            sh.empty["k"][at(i)[0]].arrive(me)
            if i == n_blocks - 1:
                sh.q_empty.arrive(me)

        def release_v(i):
            sh.empty["v"][at(i)[0]].arrive(me)

        def release_unused(i):
            yield from wait_filled("k", i)
            release_k(i)
            yield from wait_filled("v", i)
            release_v(i)

        def skip_step(i):
            yield from turn_wait()
            turn_pass()
            yield from release_unused(i)

        def retire_and_convert(i):
            retire_all()
            if i - 2 >= begin:
                release_v(i - 2)

        def step(first, i):
            if not first:
                retire_and_convert(i)
            yield from wait_filled("k", i)
            if not first:
                yield from wait_filled("v", i - 1)
            yield from turn_wait()
            issue("q", ("q", t))
            issue(("k", at(i)[0]), ("k", t, i))
            s_reads = list(pending)
            if not first:
                issue(("v", at(i - 1)[0]), ("v", t, i - 1))
            turn_pass()
            yield
            # wait_scores: S done (first: everything)
            for key in (pending if first else s_reads):
                sh.readers[key].discard(me)
            pending[:] = [] if first else [key for key in pending if key not in s_reads]
            release_k(i)

        while not sh.q_full.passed(t & 1):
            yield WAIT
        for i in range(begin):
            yield from skip_step(i)
        if begin < end:
            yield from step(True, begin)
            for i in range(begin + 1, end):
                yield from step(False, i)
            retire_and_convert(end)
            yield from wait_filled("v", end - 1)
            yield from turn_wait()
            issue(("v", at(end - 1)[0]), ("v", t, end - 1))
            turn_pass()
            yield
            retire_all()
            release_v(end - 1)
            if end < n_blocks:
                yield from release_unused(end)
            for i in range(end + 1, n_blocks):
                yield from skip_step(i)
            if end < n_blocks:
                yield from turn_wait()
                turn_pass()
        else:
            yield from turn_wait()
            turn_pass()
        ring += n_blocks
    if c == 0:  # WarpgroupTurns::finish
        yield from turn_wait()


def random_walk(rng, consumers, tiles):
    walk = []
    for _ in range(tiles):
        n_blocks = rng.randint(1, 5)
        ranges = []
        for _ in range(consumers):
            kind = rng.random()
            if kind < 0.15:
                ranges.append((n_blocks, n_blocks))  # no rows, or no visible key
            else:
                begin = rng.randint(0, n_blocks - 1) if kind < 0.6 else 0
                end = rng.randint(begin + 1, n_blocks) if kind > 0.85 else n_blocks
                ranges.append((begin, end))
        walk.append((n_blocks, ranges))
    return walk


def run(rng, consumers, stages, walk):
    sh = Shared(consumers, stages)
    actors = [producer(sh, walk)] + [consumer(sh, c, walk) for c in range(consumers)]
    live = list(actors)
    spins = 0  # actor steps since the last progress
    while live or sh.landing:
        if sh.landing and (not live or rng.random() < 0.3):  # a TMA load lands
            key, content, barrier = sh.landing.pop(rng.randrange(len(sh.landing)))
            sh.content[key] = content
            barrier.arrive(f"tma{barrier.completed}")
            spins = 0
            continue
        actor = rng.choice(live)
        try:
            spins = spins + 1 if next(actor) == WAIT else 0
        except StopIteration:
            live.remove(actor)
            spins = 0
        if spins > 200 * len(actors) and not sh.landing:
            raise Deadlock(f"every warpgroup waits; walk {walk}")
    for c in range(consumers):
        assert not sh.turn[c].members, f"turn barrier {c} left with {sh.turn[c].members}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--walks", type=int, default=2000)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for _ in range(args.walks):
        run(rng, args.consumers, args.stages, random_walk(rng, args.consumers, rng.randint(1, 4)))
    print(f"{args.walks} random walks, {args.consumers} consumers, {args.stages} stages: no deadlock, "
          "no slot refilled under an MMA, every MMA read its block, every phase from distinct warpgroups")


if __name__ == "__main__":
    main()
