"""lru_per_layer: Mixtral-Offloading's cache (Eliseev & Mazur 2023), an LRU per MoE layer with
a quota of `slots_per_layer` experts each.

An incoming expert of layer l evicts the least recently used evictable expert of layer l once
layer l holds its quota (or the cache is full). When every expert of layer l is in use (a
step routed to more experts than the quota) and the cache is full, it borrows: the least
recent evictable expert of the layer holding the most experts (ties: the lowest layer).
Recency: a copy enters its layer's order as most recent when it lands; a routed resident
moves to most recent (a step's keys in ascending order, so the lower key counts as older).

slots_per_layer = floor(cache slots / MoE layers), at most E, unless set (on one of several
GPUs: over the layers it holds experts of, at most the experts it holds of a layer); a set
value must be in [1, E]; a cache smaller than one expert per layer is refused.
"""

from __future__ import annotations

from collections import OrderedDict

from core.knobs import int_knob
from systems.evictors.base import Evictor


def auto_slots_per_layer(ctx) -> int:
    """The budget's share per MoE layer, at most a layer's experts (0: below one per layer);
    on one of several GPUs (ctx.layer_share, docs/gpus.md) per layer it holds experts of, at
    most the experts it holds of one."""
    share = ctx.layer_share or (ctx.num_experts,) * ctx.num_layers
    held = [n for n in share if n]
    return min(ctx.capacity_slots // len(held), max(held))


class LRUPerLayer(Evictor):
    name = "lru_per_layer"

    def __init__(self, slots_per_layer: int | None = None):
        self.slots_per_layer_cfg = int_knob(slots_per_layer, "slots_per_layer", lo=1,
                                            null="auto")

    def bind(self, ctx):
        super().bind(ctx)
        if self.slots_per_layer_cfg is None:  # auto: the budget's share, at most a layer
            self.slots_per_layer = auto_slots_per_layer(ctx)
            if self.slots_per_layer < 1:
                raise ValueError(f"lru: the cache ({ctx.capacity_slots} experts) cannot hold "
                                 f"one expert per layer ({ctx.num_layers} layers)")
        else:  # more slots than a layer has experts is a config mistake, not a clamp
            self.slots_per_layer = int_knob(
                self.slots_per_layer_cfg, "slots_per_layer", lo=1, hi=ctx.num_experts,
                null="auto", note=f"the model has {ctx.num_experts} experts per layer")
        self.layers = [OrderedDict() for _ in range(ctx.num_layers)]  # key -> None, LRU first

    def on_access(self, iteration, layer, keys, now_ms):
        lru = self.layers[layer]
        for key in keys:
            if key in lru:
                lru.move_to_end(key)

    def on_insert(self, key, demand, now_ms):
        self.layers[key // self.ctx.num_experts][key] = None

    def on_evict(self, key, now_ms):
        self.layers[key // self.ctx.num_experts].pop(key, None)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        layer = incoming // self.ctx.num_experts
        lru = self.layers[layer]
        victim = None
        if len(lru) >= self.slots_per_layer or candidates.full:
            victim = candidates.first_of(lru)
        if victim is None and candidates.full:
            victim = self._borrow(candidates, layer)
        return victim

    def _borrow(self, candidates, layer: int):
        """Every expert of this layer is in use: the least recent evictable expert of the
        layer holding the most (ties: the lowest layer), else of the next fullest, and so on."""
        if len(self.layers) < 2:  # a one-layer model has nowhere to borrow from
            return None
        sizes = list(map(len, self.layers))
        sizes[layer] = -1  # not this layer
        # index(max) is the first of equal sizes, the lowest layer: the usual answer, in O(L).
        victim = candidates.first_of(self.layers[sizes.index(max(sizes))])
        if victim is None:  # that layer is all in use or in flight: walk them by size
            others = [d for i, d in enumerate(self.layers) if i != layer]
            # sorted is stable: equal sizes keep the lowest layer first
            for other in sorted(others, key=len, reverse=True):
                victim = candidates.first_of(other)
                if victim is not None:
                    break
        return victim

    def describe(self):
        out = {"name": self.name, "slots_per_layer": self.slots_per_layer_cfg}
        if hasattr(self, "slots_per_layer"):
            out["slots_per_layer_used"] = self.slots_per_layer
        return out
