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
