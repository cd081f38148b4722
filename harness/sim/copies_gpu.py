"""One GPU's copy engine among several (docs/gpus.md): the copy engine of harness/sim/
copies.py on this GPU's own host link, with three changes:
- a copy of an expert that a directly linked peer GPU holds (its copy finished) comes over
  the peer link, from the lowest such id; the host link stays free;
- a preload of an expert a lower GPU preloads too comes from that GPU once its copy is in;
- the system's prefetch proposal keeps only the experts this GPU may hold and would run for
  the running requests (the placement's `runs_on`); a clairvoyant system's (oracle: it
  plans on its GPU's own accesses) keeps every expert the GPU may hold.
The source's copy is not pinned while a peer reads it (docs/gpus.md, "Not modelled").
"""

from __future__ import annotations

from harness.sim.copies import CopyEngine, EngineError


class GpuCopyEngine(CopyEngine):
    def __init__(self, hooks, cache, rec, backend, n_keys: int, gpu: int, group):
        super().__init__(hooks, cache, rec, backend, n_keys)
        self.gpu, self.group = gpu, group  # group: harness/sim/step_gpus.py GpuGroup
        self.expert_bytes = cache.expert_bytes
        self.host_copies = self.peer_copies = 0

    def _times(self, key: int, kind: int, issue: float, start: float) -> tuple[float, float]:
        src = self.group.peer_source(key, self.gpu, issue)
        if src is None:
            self.host_copies += 1
            return super()._times(key, kind, issue, start)
        self.peer_copies += 1
        return self.group.links.send(src, self.gpu, self.expert_bytes, issue)

    def set_queue(self, proposal, now: float) -> None:
        super().set_queue(proposal, now)
        if self.queue:
            # a clairvoyant system proposes its own GPU's future: keep what the GPU may hold
            keep = self.group.may_hold if self.system.oracle else self.group.runs_here
            self.queue = type(self.queue)(k for k in self.queue if keep(k, self.gpu))

    def _preload_keys(self, keys: list[int]) -> list[int]:
        """This GPU's share of its system's preloads: the experts it may hold."""
        bad = [k for k in keys if not 0 <= k < self.n_keys][:5]
        if bad:
            raise EngineError(f"system {self.system.name} preloads invalid keys {bad}")
        keys = [k for k in keys if self.group.may_hold(k, self.gpu)]
        if len(keys) > self.cache.capacity_slots:
            raise EngineError(f"system {self.system.name} preloads {len(keys)} experts on GPU "
                              f"{self.gpu}; its cache holds {self.cache.capacity_slots}")
        return keys

    def _preload_times(self, key: int) -> tuple[float, float]:
        """Behind this GPU's last host copy, or from a lower GPU that preloads the same
        expert once its copy is in."""
        src = self.group.preloaded_source(key, self.gpu)
        if src is None:
            self.host_copies += 1
            return super()._preload_times(key)
        self.peer_copies += 1
        peer, peer_ready = src
        return self.group.links.send(peer, self.gpu, self.expert_bytes, peer_ready)
