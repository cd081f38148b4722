"""The MissHandler interface: which of a layer's missed experts run on the host CPU.

At a MoE layer the engine asks, once, about the experts that are neither resident nor in
flight (harness/sim/step_tiers.py); those named run on the CPU stream beside the GPU's, the
rest are demand-fetched as always. `choose_cpu` is a pure query over the costs the engine
offers (harness/sim/cpu_misses.py MissCosts, all in ms). A handler that never names one
(`runs_on_cpu = False`, the default `fetch`) leaves the engine's one-link path as it is.
A handler that weighs the whole layer (the experts the GPU runs anyway) overrides
`on_layer_routed`: a composed system forwards it the layer step's routing before the engine
asks `choose_cpu` about that layer.
"""

from __future__ import annotations


class MissHandler:
    name = "base"
    runs_on_cpu = True  # False: never names an expert (the engine keeps its compiled core)

    def on_layer_routed(self, routing, now_ms: float) -> None:
        """The running MoE layer step's routing (core.view.LayerRouting), before choose_cpu;
        forwarded by systems.composed.Composed only where a handler overrides it."""

    def choose_cpu(self, layer: int, missing: list[tuple[int, int]], costs) -> set[int]:
        """Of `missing` ((expert id, tokens) in ascending id), the experts the CPU runs."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}
