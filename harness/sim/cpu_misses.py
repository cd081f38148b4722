"""Missed experts run on the host CPU: the CPU's stream and what a miss handler may weigh.

Python core only (harness/sim/cores.py). At a MoE layer the system's miss handler
(systems/miss_handlers/) picks, among the experts that are neither resident nor in flight,
those the CPU runs (`choose_cpu`); the rest are fetched as always. The CPU runs its experts
one at a time from the layer's start, each once its weights are in host DRAM
(harness/sim/tiers.py stages it from NVMe when host memory is bounded), beside the GPU's
stream; the layer ends when both are done (docs/hardware.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.sim.executor import Durations


class CpuStream:
    """The host CPU's expert queue: `run(key, tokens, t)` -> the ms its output is back."""

    def __init__(self, backend, tier):
        self.tier = tier
        self.expert_ms = Durations(backend, "cpu_expert_ms")  # tokens -> CPU expert ms
        self.free_ms = 0.0
        self.runs = 0
        self.busy_ms = 0.0

    def run(self, key: int, tokens: int, t: float) -> float:
        _, landed = self.tier.stage(key, t, True)
        start = max(t, self.free_ms, landed)
        end = start + self.expert_ms[tokens]
        self.tier.hold(key, end)
        self.free_ms = end
        self.runs += 1
        self.busy_ms += end - start
        return end


@dataclass
class MissCosts:
    """What a miss handler may weigh at one MoE layer, in ms (docs/hardware.md):
    `cpu_ms(tokens)` / `gpu_ms(tokens)` one expert's run on each side, `copy_ms` one copy
    over the host link, `now_ms` the layer's start, `cpu_free_ms` / `link_free_ms` when the
    CPU and the link finish what they already hold, and `in_host(key)`."""

    cpu_ms: object
    gpu_ms: object
    copy_ms: float
    now_ms: float
    cpu_free_ms: float
    link_free_ms: float
    in_host: object
