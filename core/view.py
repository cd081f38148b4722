"""What a policy sees of a run: its context before the run, each request, each iteration and
each MoE layer's routing once the layer's router ran (docs/engine.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    # Several GPUs (docs/gpus.md): keep(keys, iterations) -> bool mask of the access
    # sequence's accesses this system's GPU runs, for the oracle family; None: every access
    gpu_accesses: object | None = None
    # Several GPUs: how many experts of each MoE layer this system's GPU may hold (its
    # placement's share, [L] ints); None: every expert of every layer
    layer_share: tuple[int, ...] | None = None

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


class RoutingError(LookupError):
    """A read of routing that is not the running layer's: a later iteration or layer (the
    future), an earlier one (no longer revealed), or a request not in the iteration."""


class RoutingView:
    """The engine's window onto the trace's routing: only the running iteration's blocks of
    the current MoE layer are readable, and `reveal` (the engine's call) moves it forward.

    Every read names its (iteration, layer) and raises RoutingError unless that is "now";
    a LayerRouting kept past its layer raises too. Systems never get the trace this way.
    """

    __slots__ = ("_index", "_trace", "_now", "_blocks")

    def __init__(self, index):
        self._index, self._trace = index, index.trace  # core.blocks.BlockIndex over the trace
        self._now: tuple[int, int] | None = None  # (iteration index, MoE layer) revealed
        self._blocks: dict[int, int] = {}  # request index -> block id, the running layer

    def reveal(self, iteration: IterationInfo, layer: int, experts: list[int],
               counts: list[int], blocks: dict[int, int]) -> LayerRouting:
        """Engine: the routing of `layer` in `iteration` is now known; `blocks` maps each
        member request to its block of this layer."""
        self._now, self._blocks = (iteration.index, layer), blocks
        return LayerRouting(iteration, layer, experts, counts, self)

    def _check(self, iteration: int, layer: int) -> dict[int, int]:
        now = self._now
        if (iteration, layer) == now:
            return self._blocks
        when = "before anything was revealed" if now is None else (
            f"past now (iteration {now[0]}, layer {now[1]})" if (iteration, layer) > now
            else f"no longer revealed (now: iteration {now[0]}, layer {now[1]})")
        raise RoutingError(f"routing of iteration {iteration}, layer {layer} is {when}")

    def block_of(self, iteration: int, layer: int, request: int) -> int:
        blocks = self._check(iteration, layer)
        if request not in blocks:
            raise RoutingError(f"request {request} is not in iteration {iteration}")
        return blocks[request]

    def rows(self, field: str, iteration: int, layer: int, request: int) -> np.ndarray | None:
        """Rows [n_tokens, ...] of trace field `field` ("topk", "weights", "spec_topk") for one
        request at (iteration, layer); None when the trace has no such field."""
        if field not in ("topk", "weights", "spec_topk"):
            raise RoutingError(f"field must be topk, weights or spec_topk, got {field!r}")
        b = self.block_of(iteration, layer, request)
        arr, off = getattr(self._trace, field), self._trace.block_offsets
        return None if arr is None else arr[off[b]:off[b + 1]]

    def per_request(self, iteration: int, layer: int) -> dict[int, np.ndarray]:
        t = self._trace
        off, topk = t.block_offsets, t.topk
        return {r: topk[off[b]:off[b + 1]] for r, b in self._check(iteration, layer).items()}

    def probs(self, iteration: int, layer: int, request: int) -> np.ndarray | None:
        b = self.block_of(iteration, layer, request)
        p = self._trace.probs
        return None if p is None else p[b]

    def probs_rows(self, iteration: int, layer: int, requests: list[int]) -> np.ndarray | None:
        blocks = self._check(iteration, layer)
        missing = [r for r in requests if r not in blocks]
        if missing:
            raise RoutingError(f"request {missing[0]} is not in iteration {iteration}")
        p = self._trace.probs
        return None if p is None else p[[blocks[r] for r in requests]]

    def spec_votes(self, iteration: int, layer: int) -> tuple[list[int], list[int]] | None:
        return self._index.spec_union(self._check(iteration, layer))


class LayerRouting:
    """Routing of one MoE layer in one iteration, revealed after the layer's router ran.

    `experts` / `counts`: the union over the iteration's tokens (ascending ids) and the tokens
    routed to each. The accessors read through the engine's RoutingView, so they return only
    this layer of this iteration and only while it runs (RoutingError afterwards).
    """

    __slots__ = ("iteration", "layer", "experts", "counts", "_view")

    def __init__(self, iteration: IterationInfo, layer: int, experts: list[int],
                 counts: list[int], view: RoutingView):
        self.iteration, self.layer = iteration, layer
        self.experts, self.counts = experts, counts
        self._view = view

    def per_request(self) -> dict[int, np.ndarray]:
        """Top-k ids per request: {request index: [n_tokens, k]}."""
        return self._view.per_request(self.iteration.index, self.layer)

    def weights(self, request: int) -> np.ndarray | None:
        """Routing weights [n_tokens, k] (float16) or None when the trace has none."""
        return self._view.rows("weights", self.iteration.index, self.layer, request)

    def spec_votes(self) -> tuple[list[int], list[int]] | None:
        """Next-layer guesses over the iteration's tokens: (ascending ids, tokens per id)."""
        return self._view.spec_votes(self.iteration.index, self.layer)

    def probs(self, request: int) -> np.ndarray | None:
        """Step-mean router probabilities over all experts [E] (float16) or None."""
        return self._view.probs(self.iteration.index, self.layer, request)

    def probs_rows(self, requests: list[int]) -> np.ndarray | None:
        """probs of several requests as rows [len(requests), E] (float16), in their order;
        one gather instead of a row each (a batch's members)."""
        return self._view.probs_rows(self.iteration.index, self.layer, requests)
