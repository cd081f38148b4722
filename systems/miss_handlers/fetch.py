"""fetch: every missed expert is copied to the GPU (the engine's rule without a handler)."""

from __future__ import annotations

from systems.miss_handlers.base import MissHandler


class FetchMisses(MissHandler):
    name = "fetch"
    runs_on_cpu = False

    def choose_cpu(self, layer, missing, costs):
        return set()
