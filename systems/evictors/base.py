"""The Evictor interface: which resident expert leaves when a copy needs a slot.

An evictor sees cache events batched per MoE layer step (the block's keys as one call, not
one call per access) and answers one pure query, `choose_victim`. Keys are
layer * num_experts + expert id. The composed system (systems/composed.py) forwards the
engine's events; joint systems may use an evictor as their eviction part.

Event order within one MoE layer step (docs/architecture.md): on_access(block keys), then
for each copy the engine commits: choose_victim -> on_evict(victim) (if one was named) ->
on_insert(key). on_step_end closes an iteration (a forward pass over the batch). An evictor
that reads the routing itself (router scores: `uses_fields`) overrides on_layer_routed, which
the composed system calls right after on_access, only where it is overridden.
"""

from __future__ import annotations

from core.view import IterationInfo, SystemContext


class Evictor:
    name = "base"
    bound = False  # True: reads the future (ctx.trace); its results are bounds, not systems
    uses_fields: tuple[str, ...] = ()  # optional trace fields read

    def bind(self, ctx: SystemContext) -> None:
        """Called once before the run."""
        self.ctx = ctx

    def on_access(self, iteration: IterationInfo, layer: int, keys: list[int],
                  now_ms: float) -> None:
        """The MoE layer step's routed keys (ascending), before any of them runs."""

    def on_layer_routed(self, routing, now_ms: float) -> None:
        """The layer step's routing (core.view.LayerRouting: probs, weights), after on_access."""

    def on_insert(self, key: int, demand: bool, now_ms: float) -> None:
        """A copy of `key` was committed into a slot (not called for preloads)."""

    def on_evict(self, key: int, now_ms: float) -> None:
        """`key` left the cache (the victim this evictor named)."""

    def on_step_end(self, iteration: IterationInfo, now_ms: float) -> None:
        """The iteration (one forward pass over its batch) finished."""

    def choose_victim(self, candidates, incoming: int, demand: bool, now_ms: float) -> int | None:
        """Pure query: an evictable key of `candidates` (harness cache view: `key in c`,
        `c.first_of(order)`, `c.full`) to free a slot for `incoming`, or None to use a free
        slot (or, for a prefetch, to decline it when the cache is full). Must not change
        state: the eviction arrives through on_evict."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}
