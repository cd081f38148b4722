"""layer_offload: DeepSpeed ZeRO-Inference style parameter offload, expert-agnostic.

Whole MoE layers are the unit. The first layers that fit the budget (keeping room for two
streamed layers) stay resident for the whole run (on one of several GPUs: the first of the
layers it holds experts of, each as many experts as it holds); every other layer is
streamed in whole, all of its experts whether routed to or not, and the next streamed layer
is fetched while this one computes. Streamed experts are evicted oldest-loaded first.
"""

from __future__ import annotations

from collections import OrderedDict

from core.knobs import int_knob
from systems.base import System


class LayerOffload(System):
    name = "layer_offload"
    label = "DeepSpeed ZeRO-Inference style (whole layers streamed, routing ignored)"

    def __init__(self, stream_buffer_layers: int = 2, prefetch: bool = True):
        super().__init__(prefetch)  # false: streamed layers load on demand, none ahead
        # 0 leaves no room to stream a layer once the resident ones fill the cache
        self.stream_buffer_layers = int_knob(stream_buffer_layers, "stream_buffer_layers", lo=1)

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        # on one of several GPUs (docs/gpus.md): its layers, each as many experts as it holds
        share = ctx.layer_share or (E,) * L
        mine = [layer for layer in range(L) if share[layer]]
        per_layer = max(share)
        fit = (ctx.capacity_slots - self.stream_buffer_layers * per_layer) // per_layer
        n_resident = max(0, min(len(mine), fit))
        self.resident, self.streamed = mine[:n_resident], mine[n_resident:]
        self._streamed = set(self.streamed)
        self.fifo: OrderedDict[int, None] = OrderedDict()  # streamed keys, oldest load first
        self.proposal: list[int] | None = None
        self.last_target: tuple | None = None  # (streamed layer or None, next streamed layer)

    def initial_residents(self) -> list[int]:
        return [key for layer in self.resident for key in self._layer_keys(layer)]

    def _layer_keys(self, layer: int) -> list[int]:
        E = self.ctx.num_experts
        return list(range(layer * E, (layer + 1) * E))

    def on_layer_routed(self, routing, now_ms):
        if not self.streamed:
            return
        layer = routing.layer
        later = [s for s in self.streamed if s > layer]
        nxt = later[0] if later else self.streamed[0]  # wraps to the next iteration
        current = layer if layer in self._streamed else None
        if (current, nxt) == self.last_target:
            return  # the queue already holds this request (consecutive resident layers)
        self.last_target = (current, nxt)
        keys = self._layer_keys(layer) if current is not None else []
        self.proposal = keys + self._layer_keys(nxt)

    def propose_prefetch(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def on_load(self, key, demand, now_ms):
        self.fifo[key] = None

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        return candidates.first_of(self.fifo)

    def on_evict(self, key, now_ms):
        del self.fifo[key]
