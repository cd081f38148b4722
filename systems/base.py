"""The System interface: the questions the engine asks a policy (docs/engine.md).

A system is pure Python over expert keys (key = layer * num_experts + expert id). It never
imports torch and never sees routing that has not happened yet (except `oracle` systems,
which receive the whole trace in `bind`). The engine owns the loop, the clock and the cache;
a system only answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from harness import checks

# Stored EAMs / expert maps: 100x the papers' 1000. The matchers keep L * E floats per entry
# (several arrays for fmoe), so more would need gigabytes before the first request.
HISTORY_CAP = 100_000


class KnobError(ValueError):
    """A system's constructor argument has the wrong type or is out of range. The message
    starts with the knob's name (the runner reports it as `system.<message>`), e.g.
    `slots_per_layer: must be an integer >= 1 or null (auto), got 0`."""


# The strict checks of harness/checks.py, raising KnobError: systems check every constructor
# argument in __init__ (type, static range) and the ranges that depend on the model or the
# budget in bind(ctx).
int_knob = partial(checks.integer, error=KnobError)
float_knob = partial(checks.number, error=KnobError)
bool_knob = partial(checks.boolean, error=KnobError)
numbers_knob = partial(checks.numbers, error=KnobError)


@dataclass(frozen=True)
class SystemContext:
    """What a system may know before the run: shapes, budget, batch size."""

    num_layers: int  # MoE layers
    num_experts: int
    top_k: int
    expert_bytes: int
    capacity_slots: int  # experts the cache can hold
    capacity_bytes: int
    max_batch: int
    moe_layer_stacks: tuple[str, ...]
    trace_fields: tuple[str, ...]  # optional trace fields present
    trace: object | None = None  # full Trace, only for systems with oracle = True

    def key(self, layer: int, expert: int) -> int:
        return layer * self.num_experts + expert

    @property
    def total_experts(self) -> int:
        return self.num_layers * self.num_experts


@dataclass(frozen=True)
class RequestInfo:
    index: int
    request_id: str
    dataset: str
    task: str
    prompt_len: int
    output_len: int
    arrival_ms: float
    embedding: np.ndarray | None  # float16 [D] or None
    prompt: str | None = None  # prompt text when the trace carries it


@dataclass(frozen=True)
class IterationInfo:
    index: int
    kind: str  # "prefill" or "decode"
    members: tuple[tuple[int, int], ...]  # (request index, that request's step)
    start_ms: float


class LayerRouting:
    """Routing of one MoE layer in one iteration, revealed after the layer's router ran.

    `experts` / `counts`: the union over the iteration's tokens (ascending ids) and the tokens
    routed to each. The accessors read only this layer of this iteration; systems must not
    touch the underscored attributes (they index the whole trace).
    """

    __slots__ = ("iteration", "layer", "experts", "counts", "_index", "_blocks")

    def __init__(self, iteration: IterationInfo, layer: int, experts: list[int],
                 counts: list[int], index, blocks: dict[int, int]):
        self.iteration, self.layer = iteration, layer
        self.experts, self.counts = experts, counts
        self._index, self._blocks = index, blocks  # request index -> block id in the trace

    def per_request(self) -> dict[int, np.ndarray]:
        """Top-k ids per request: {request index: [n_tokens, k]}."""
        t = self._index.trace
        off = t.block_offsets
        return {r: t.topk[off[b]:off[b + 1]] for r, b in self._blocks.items()}

    def weights(self, request: int) -> np.ndarray | None:
        """Routing weights [n_tokens, k] (float16) or None when the trace has none."""
        return self._rows(self._index.trace.weights, request)

    def spec_guess(self, request: int) -> np.ndarray | None:
        """Guess of the next layer's top-k [n_tokens, k] made from this layer's hidden state;
        the value num_experts means no guess. None when the trace has no guesses."""
        return self._rows(self._index.trace.spec_topk, request)

    def spec_votes(self) -> tuple[list[int], list[int]] | None:
        """Next-layer guesses over the iteration's tokens: (ascending ids, tokens per id)."""
        return self._index.spec_union(self._blocks)

    def probs(self, request: int) -> np.ndarray | None:
        """Step-mean router probabilities over all experts [E] (float16) or None."""
        p = self._index.trace.probs
        return None if p is None else p[self._blocks[request]]

    def _rows(self, arr, request):
        if arr is None:
            return None
        b, off = self._blocks[request], self._index.trace.block_offsets
        return arr[off[b]:off[b + 1]]


class System:
    """Base policy: fetch on demand, no prefetch, evict the lowest evictable key."""

    name = "base"
    label = ""  # who the system stands for, shown in tables
    oracle = False  # True: receives the full trace (future routing) in bind()
    needs_all_experts = False  # True: the runner writes status "oom" unless every expert fits
    uses_fields: tuple[str, ...] = ()  # optional trace fields read; fallbacks in docs/systems.md
    prefetch = True  # set per instance by __init__ (subclasses call super().__init__(prefetch))

    def __init__(self, prefetch: bool = True):
        # `system.prefetch=false` is the one switch that turns a system's prefetch off: the
        # engine then never asks propose_prefetch, and systems may skip building proposals.
        self.prefetch = bool_knob(prefetch, "prefetch")

    def bind(self, ctx: SystemContext) -> None:
        """Called once before the run."""
        self.ctx = ctx

    def warmup(self, calibration) -> None:
        """History-based systems build their history from a disjoint calibration trace."""

    def initial_residents(self) -> list[int]:
        """Keys copied into the empty cache before serving starts (timed, counted in h2d
        bytes; docs/engine.md, "Preloads")."""
        return []

    def on_request_start(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def on_layer_routed(self, routing: LayerRouting, now_ms: float) -> None:
        pass

    def propose_prefetch(self, now_ms: float) -> list[int] | None:
        """Ordered keys to prefetch; replaces the queued (not in-flight) ones. None: no change."""
        return None

    def choose_victim(self, candidates, incoming: int, demand: bool, now_ms: float) -> int | None:
        """Asked before every load. Return an evictable key from `candidates` to make room, or
        None to use a free slot (or, for a prefetch, to decline it when the cache is full)."""
        if not candidates.full:
            return None
        for key in candidates:
            return key
        return None

    def on_load(self, key: int, demand: bool, now_ms: float) -> None:
        """A copy of `key` was committed (after choose_victim); not called for preloads."""

    def on_expert_done(self, key: int, now_ms: float) -> None:
        """An expert finished running. Called only if a system overrides it (hot path)."""

    def on_step_end(self, iteration: IterationInfo, now_ms: float) -> None:
        pass

    def on_request_end(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def describe(self) -> dict:
        """Parameters recorded in result.json."""
        return {"name": self.name, "label": self.label, "oracle": self.oracle,
                "prefetch": self.prefetch}
