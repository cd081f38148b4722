"""The per-MoE-layer step, shared by trace replay and live runs (docs/engine.md).

At a MoE layer: start due prefetches; the routing is revealed (RoutingView) and the system
told (`on_layer_routed`), then asked for a prefetch proposal that replaces the queue; the
layer's experts run one at a time on the compute stream through the executor: ready
residents first (ascending id), then in-flight copies by ready time (ties: ascending id),
then demand fetches in ascending id. Only the running expert must be resident, so a cache
smaller than a layer's expert set still makes progress: a demand fetch with no free slot
and no evictable victim is deferred, retried after each expert that ran, and when nothing
else can run the system is asked again (`propose_prefetch`) before the run fails.
"""

from __future__ import annotations

from core.view import IterationInfo
from harness.sim.copies import EngineError
from harness.sim.recorder import HIT, LATE, MISS


class LayerStep:
    def __init__(self, index, view, hooks, copies, cache, rec, executor, num_experts: int):
        self.index, self.view, self.system = index, view, hooks.system
        self._routed, self._propose = hooks.on_layer_routed, hooks.propose_prefetch
        self.copies, self.cache, self.rec = copies, cache, rec
        self.executor = executor  # harness.sim.executor.Executor
        self.E, self.L = num_experts, index.L

    def run(self, info: IterationInfo, layer: int, members, now: float) -> float:
        """Run MoE layer `layer` of iteration `info` from `now`; returns when compute is free."""
        index = self.index
        self.start_due(now)
        if len(members) == 1:  # batch 1: the block's own union, precomputed
            r, s = members[0]
            b = (index.step_off[r] + s) * self.L + layer
            experts, counts = index.block_lists(b)
            owner, blocks = None, {r: b}
        else:
            blocks = {r: index.block(r, s, layer) for r, s in members}
            experts, counts, owner = index.union(blocks)
        if not experts:
            return now
        self.tell(self.view.reveal(info, layer, experts, counts, blocks), now)
        now = self.run_experts(experts, counts, owner, members[0][0], layer, now)
        self.rec.block(info.index, layer)
        return now

    def start_due(self, now: float) -> None:
        """Start the queued prefetches that can start by `now`."""
        copies = self.copies
        if copies.queue and copies.copy_free_ms <= now:  # else no queued copy can start yet
            copies.advance(now)

    def tell(self, routing, now: float) -> None:
        """The system learns the layer's routing; its prefetch proposal replaces the queue."""
        self._routed(routing, now)
        copies = self.copies
        proposal = self._propose(now) if copies.asks else None
        if proposal is not None:
            copies.set_queue(proposal, now)

    def run_experts(self, experts, counts, owner, first_owner: int, layer: int,
                    now: float) -> float:
        """Run `experts` (ascending ids, `counts` tokens each; `owner`: expert -> its first
        request, None: every one is `first_owner`'s) of MoE layer `layer` from `now`;
        returns when compute is free."""
        copies, base = self.copies, layer * self.E
        order, late, missing = self._split(experts, counts, base, now)
        if missing is None and late is None and not copies.queue:
            # Every expert is ready and nothing can be copied meanwhile: run back to back.
            return self.executor.run_ready(experts, counts, base, owner, first_owner, now,
                                           self.rec, self.cache.transfer_of)
        deferred = self._stage(order, late, missing, base, now)
        # The layer's demand fetches are committed first; queued prefetches start behind.
        if copies.queue:
            copies.advance(now)
        return self._run(order, deferred, base, owner, first_owner, now, layer)

    def _split(self, experts, counts, base: int, now: float):
        """(ready residents [(e, c, False)], in flight [(ready ms, e, c)] or None,
        absent [(e, c)] or None), each in ascending id."""
        ready_ms = self.cache.ready_ms
        order, late, missing = [], None, None
        for e, c in zip(experts, counts):
            t = ready_ms.get(base + e)
            if t is None:
                if missing is None:
                    missing = []
                missing.append((e, c))
            elif t <= now:
                order.append((e, c, False))
            else:
                if late is None:
                    late = []
                late.append((t, e, c))
        return order, late, missing

    def _stage(self, order, late, missing, base: int, now: float) -> list:
        """Mark the layer's experts in use, queue the in-flight ones by ready time and issue
        demand fetches in ascending id until one is refused; returns the deferred rest."""
        in_use = self.cache.in_use
        in_use.update([base + e for e, _, _ in order])
        if late:
            late.sort()
            order.extend((e, c, False) for _, e, c in late)
            in_use.update([base + e for _, e, _ in late])
        deferred = []
        if missing:
            demand = self.copies.demand
            for e, c in missing:
                if not deferred and demand(base + e, now):
                    in_use.add(base + e)
                    order.append((e, c, True))
                else:
                    deferred.append((e, c))
        return deferred

    def _run(self, order, deferred, base: int, owner, first_owner: int, now: float,
             layer: int) -> float:
        """One access per expert in `order` (which grows as deferred fetches are issued)."""
        copies, cache, rec = self.copies, self.cache, self.rec
        ready_ms, in_use, transfer_of = cache.ready_ms, cache.in_use, cache.transfer_of
        add, run = rec.add_access, self.executor.run
        durations = self.executor.memo  # sim: SimExecutor.run inlined below
        queue = copies.queue
        i, n = 0, len(order)
        while i < n or deferred:
            if i == n:
                self._unblock(deferred, order, base, now, layer)
                queue, n = copies.queue, len(order)
                continue
            e, c, is_miss = order[i]
            i += 1
            key = base + e
            ready = ready_ms[key]
            cls = MISS if is_miss else (LATE if ready > now else HIT)
            tid = transfer_of[key]
            if durations is None:
                start, end = run(e, c, ready, now)
            else:
                start = ready if ready > now else now
                end = start + durations[c]
            add((e, cls, tid, now, start, first_owner if owner is None else owner[e]))
            now = end
            if queue and copies.copy_free_ms <= now:  # else no queued copy can start yet
                copies.advance(now)
            in_use.discard(key)
            if deferred:
                self._retry(deferred, order, base, now)
                n = len(order)
        return now

    def _unblock(self, deferred, order, base: int, now: float, layer: int) -> None:
        """Every runnable expert has run and demand fetches still wait: ask the system again."""
        self.copies.ask(now)
        self.copies.advance(now)
        if not self._retry(deferred, order, base, now):
            raise EngineError(
                f"system {self.system.name}: no victim for a demand fetch at layer {layer} "
                f"while the cache is full ({self.cache.capacity_slots} slots)")

    def _retry(self, deferred, order, base: int, now: float) -> bool:
        """Issue deferred demand fetches in order while room allows; True if any progressed."""
        ready_ms, in_use, demand = self.cache.ready_ms, self.cache.in_use, self.copies.demand
        progressed = False
        while deferred:
            e, c = deferred[0]
            key = base + e
            if key in ready_ms:  # a queued prefetch brought it in meanwhile
                order.append((e, c, False))
            elif demand(key, now):
                order.append((e, c, True))
            else:
                break
            deferred.pop(0)
            in_use.add(key)
            progressed = True
        return progressed
