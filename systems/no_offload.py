"""no_offload: every expert resident on the GPU; an `oom` row when the model does not fit."""

from __future__ import annotations

from systems.base import System


class NoOffload(System):
    name = "no_offload"
    label = "all experts on the GPU (upper bound on speed, needs the memory)"
    needs_all_experts = True  # the runner writes status "oom" instead of running

    def initial_residents(self) -> list[int]:
        return list(range(self.ctx.total_experts))

    def choose_victim(self, candidates, incoming, demand, now_ms):
        return None  # never reached: everything is resident
