"""The MoE layer step on several GPUs (Python core only; docs/gpus.md).

Per GPU the single-GPU parts: the system's hooks, an expert cache, a copy engine
(harness/sim/copies_gpu.py) and a layer step (harness/sim/step.py), all writing one
recorder. At a MoE layer:
1. every GPU's queued prefetches that can start do; then every GPU's system is told the
   layer's routing and asked for its prefetch proposal (each keeps what it would run);
2. each member request's experts go to the GPU the placement names for its home GPU
   (request r % N); the tokens a home sends to another GPU leave as one message per
   (home, GPU) pair when the dense part ends (tokens x hidden x dense bits / 8 bytes);
3. each GPU runs its experts as one GPU does (ready, in flight, demand fetches) from the
   arrival of its last incoming message; GPUs are stepped in ascending id, so a port two of
   them share is taken in that order;
4. each GPU sends the outputs back as it finishes; the layer ends when every home GPU has
   run its own experts and received every output.
"""

from __future__ import annotations

from harness.sim.copies_gpu import GpuCopyEngine
from harness.sim.executor import SimExecutor
from harness.sim.hooks import Hooks
from harness.sim.step import LayerStep


class GpuGroup:
    """The run's GPUs. To the engine it stands where one GPU's hooks, cache and copy engine
    stand: what the engine asks of those it asks of each GPU's."""

    def __init__(self, gpus, systems, caches, rec, backend, model, index, view,
                 time_policy: bool):
        self.placement, self.links, self.systems = gpus.placement, gpus.links(), systems
        n_keys, E = model.num_experts * index.L, model.num_experts
        self.gpu_hooks = [Hooks(s, time_policy) for s in systems]
        self.caches = list(caches)
        self.gpu_copies = [GpuCopyEngine(h, c, rec, backend, n_keys, g, self)
                           for g, (h, c) in enumerate(zip(self.gpu_hooks, self.caches))]
        self.steps = [LayerStep(index, view, h, cp, c, rec, SimExecutor(backend), E)
                      for h, cp, c in zip(self.gpu_hooks, self.gpu_copies, self.caches)]
        self.homes: frozenset[int] = frozenset()  # home GPUs of the running requests
        self.hidden_bytes = model.hidden_size * model.dense_bits / 8  # one token's state
        self.a2a_bytes = 0
        n = len(systems)
        # peers an expert may be copied from, by id: the directly linked ones (through host
        # memory a copy would cost more than the host's own copy of the weights)
        self._peers = [[p for p in range(n) if p != g and self.links.direct(p, g)]
                       for g in range(n)]

    # ---- the placement, as the copy engines ask it ------------------------------------------
    def runs_here(self, key: int, gpu: int) -> bool:
        """True when `gpu` would run `key` for a running request."""
        runs_on = self.placement.runs_on
        return any(runs_on(key, h) == gpu for h in self.homes)

    def may_hold(self, key: int, gpu: int) -> bool:
        return gpu in self.placement.owners[key]

    def peer_source(self, key: int, gpu: int, t: float) -> int | None:
        """A peer whose copy of `key` is in by `t`, or None."""
        for p in self._peers[gpu]:
            ready = self.caches[p].ready_ms.get(key)
            if ready is not None and ready <= t:
                return p
        return None

    def preloaded_source(self, key: int, gpu: int) -> tuple[int, float] | None:
        """(a lower GPU that preloads `key`, when its copy is in), or None."""
        for p in self._peers[gpu]:
            ready = self.caches[p].ready_ms.get(key) if p < gpu else None
            if ready is not None:
                return p, ready
        return None

    # ---- what the engine asks of one GPU's parts -----------------------------------------
    def preload_all(self) -> float:
        return max(cp.preload(s.initial_residents())
                   for cp, s in zip(self.gpu_copies, self.systems))

    def advance(self, t: float) -> None:
        for cp in self.gpu_copies:
            cp.advance(t)

    def ask(self, now: float) -> None:
        for cp in self.gpu_copies:
            cp.ask(now)

    def on_request_start(self, request, now: float) -> None:
        for h in self.gpu_hooks:
            h.on_request_start(request, now)

    def on_request_end(self, request, now: float) -> None:
        for h in self.gpu_hooks:
            h.on_request_end(request, now)

    def on_step_end(self, info, now: float) -> None:
        for h in self.gpu_hooks:
            h.on_step_end(info, now)

    def check_invariants(self) -> None:
        for c in self.caches:
            c.check_invariants()

    @property
    def timed(self) -> bool:
        return self.gpu_hooks[0].timed

    @property
    def policy_s(self) -> float:
        return sum(h.policy_s for h in self.gpu_hooks)

    @property
    def peak_bytes(self) -> int:
        return sum(c.peak_bytes for c in self.caches)

    def metrics(self) -> dict:
        """Bytes per link (they conserve: peer_link_bytes = peer_copy_bytes + a2a_bytes)."""
        eb = self.caches[0].expert_bytes
        host = sum(cp.host_copies for cp in self.gpu_copies)
        peer = sum(cp.peer_copies for cp in self.gpu_copies)
        return {"num_gpus": len(self.systems), "host_link_bytes": host * eb, "peer_fetches": peer,
                "peer_copy_bytes": peer * eb, "a2a_bytes": self.a2a_bytes,
                "peer_link_bytes": sum(map(sum, self.links.bytes)),
                "peer_messages": self.links.messages}


class MultiGpuStep:
    """The layer step over a GpuGroup (the module docstring's four stages)."""

    def __init__(self, group: GpuGroup, index, view, rec, num_experts: int):
        self.group, self.index, self.view, self.rec = group, index, view, rec
        self.E, self.L = num_experts, index.L

    def run(self, info, layer: int, members, now: float) -> float:
        group, index = self.group, self.index
        for step in group.steps:
            step.start_due(now)
        blocks = {r: index.block(r, s, layer) for r, s in members}
        experts, counts, _ = index.union(blocks)
        if not experts:
            return now
        homes = {r: group.placement.home(r) for r in blocks}
        group.homes = frozenset(homes.values())
        routing = self.view.reveal(info, layer, experts, counts, blocks)
        for step in group.steps:
            step.tell(routing, now)
        work, sends = self._assign(blocks, homes, layer)
        starts = dict.fromkeys(range(len(group.steps)), now)
        for (h, g), tokens in sorted(sends.items()):
            starts[g] = max(starts[g], self._send(h, g, tokens, now))
        ends = dict(starts)
        first = members[0][0]
        for g, todo in enumerate(work):
            if todo:
                ids = sorted(todo)
                ends[g] = group.steps[g].run_experts(
                    ids, [todo[e][0] for e in ids], {e: todo[e][1] for e in ids}, first,
                    layer, starts[g])
        done = max(ends[h] for h in set(homes.values()))
        for (h, g), tokens in sorted(sends.items()):
            done = max(done, self._send(g, h, tokens, ends[g]))
        self.rec.block(info.index, layer)
        return done

    def _assign(self, blocks: dict, homes: dict, layer: int):
        """([per GPU {expert: [tokens, first request]}], {(home, GPU): tokens sent})."""
        group, base = self.group, layer * self.E
        runs_on = group.placement.runs_on
        work = [{} for _ in group.steps]
        sends: dict[tuple[int, int], int] = {}
        for r, b in blocks.items():
            h = homes[r]
            for e, c in zip(*self.index.block_lists(b)):
                g = runs_on(base + e, h)
                cell = work[g].setdefault(e, [0, r])
                cell[0] += c
                if g != h:
                    sends[h, g] = sends.get((h, g), 0) + c
        return work, sends

    def _send(self, a: int, b: int, tokens: int, t: float) -> float:
        nbytes = int(tokens * self.group.hidden_bytes)
        self.group.a2a_bytes += nbytes
        return self.group.links.send(a, b, nbytes, t)[1]
