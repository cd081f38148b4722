"""The layer step with memory tiers and CPU-run misses (Python core only; docs/hardware.md).

It is harness/sim/step.py's LayerStep with two additions:
- the host tier (harness/sim/tiers.py) learns the running iteration, to which the DRAM
  reads it tells its evictor about belong;
- a miss handler picks, among the layer's missing experts, those the CPU runs
  (harness/sim/cpu_misses.py); they leave the demand fetches, run on the CPU stream from the
  layer's start, and the layer ends when the GPU's experts and the CPU's are both done. Each
  CPU-run expert is one access of class `cpu` with no transfer (transfer id -1): its need_ms
  is when the GPU had run its own experts, its start_ms when the CPU's output was back, so
  its stall is the GPU's wait for it.
"""

from __future__ import annotations

from harness.sim.cpu_misses import CpuStream, MissCosts
from harness.sim.recorder import CPU
from harness.sim.step import LayerStep


class TieredLayerStep(LayerStep):
    def __init__(self, index, view, hooks, copies, cache, rec, executor, num_experts: int,
                 tier, handler, backend):
        super().__init__(index, view, hooks, copies, cache, rec, executor, num_experts)
        self.tier, self.handler = tier, handler
        self.cpu = CpuStream(backend, tier) if handler is not None else None
        self._gpu_ms = executor.memo  # tokens -> GPU expert ms (the cost model)
        self._cpu_rows: list | None = None  # (end ms, expert) of the running layer
        system_routed = self._routed

        def routed(routing, now: float) -> None:
            tier.on_routed(routing.iteration)
            system_routed(routing, now)

        self._routed = routed

    def _stage(self, order, late, missing, base: int, now: float) -> list:
        if missing and self.handler is not None:
            on_cpu = self.handler.choose_cpu(base // self.E, list(missing), self._costs(now))
            if on_cpu:
                run = self.cpu.run
                rows = sorted((run(base + e, c, now), e) for e, c in missing if e in on_cpu)
                self._cpu_rows = rows
                missing = [(e, c) for e, c in missing if e not in on_cpu] or None
        return super()._stage(order, late, missing, base, now)

    def _run(self, order, deferred, base: int, owner, first_owner: int, now: float,
             layer: int) -> float:
        now = super()._run(order, deferred, base, owner, first_owner, now, layer)
        rows, self._cpu_rows = self._cpu_rows, None
        for end, e in rows or ():
            start = end if end > now else now
            self.rec.add_access((e, CPU, -1, now, start,
                                 first_owner if owner is None else owner[e]))
            now = start
        return now

    def _costs(self, now: float) -> MissCosts:
        tier, cpu = self.tier, self.cpu
        return MissCosts(
            cpu_ms=cpu.expert_ms.__getitem__, gpu_ms=self._gpu_ms.__getitem__,
            copy_ms=self.copies.copy_ms, now_ms=now, cpu_free_ms=max(now, cpu.free_ms),
            link_free_ms=max(now, self.copies.copy_free_ms),
            in_host=lambda key: not tier.bounded or key in tier.ready_ms)
