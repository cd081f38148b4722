"""The Prefetcher interface: which experts to copy ahead, from the routing seen so far.

A prefetcher only proposes; the engine queues the proposal (replacing queued, not in-flight,
copies) and asks the evictor for room for each copy. It sees the same events as a system
(systems/base.py) except eviction decisions, plus cache insert/evict notifications.
"""

from __future__ import annotations

from core.view import IterationInfo, LayerRouting, RequestInfo, SystemContext


class Prefetcher:
    name = "base"
    uses_fields: tuple[str, ...] = ()  # optional trace fields read (fallbacks: docs/systems.md)
    oracle = False  # True: reads the future (ctx.trace)

    def bind(self, ctx: SystemContext) -> None:
        self.ctx = ctx

    def warmup(self, calibration) -> None:
        """History-based prefetchers learn from a disjoint calibration trace."""

    def on_request_start(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def on_layer_routed(self, routing: LayerRouting, now_ms: float) -> None:
        pass

    def propose(self, now_ms: float) -> list[int] | None:
        """Ordered keys to prefetch, replacing the queued ones; None: no change."""
        return None

    def on_insert(self, key: int, demand: bool, now_ms: float) -> None:
        pass

    def on_evict(self, key: int, now_ms: float) -> None:
        pass

    def on_step_end(self, iteration: IterationInfo, now_ms: float) -> None:
        pass

    def on_request_end(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name}

    def needs_calibration(self) -> bool:
        """True: the run loads the calibration split and calls warmup() (default: the class
        overrides warmup)."""
        return type(self).warmup is not Prefetcher.warmup
