"""The optional admission rule of a composed system: may a prefetch displace the evictor's
victim? Demand fetches are always admitted (the expert must run)."""

from __future__ import annotations

from core.view import SystemContext


class Admission:
    name = "always"

    def bind(self, ctx: SystemContext) -> None:
        self.ctx = ctx

    def admit(self, incoming: int, victim: int | None, now_ms: float) -> bool:
        """Pure query for a prefetch of `incoming` that would evict `victim` (None: a free
        slot). False declines the prefetch."""
        return True

    def describe(self) -> dict:
        return {"name": self.name}
