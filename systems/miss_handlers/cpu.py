"""cpu: every missed expert runs on the host CPU; nothing is fetched on demand.

The rule of kTransformers' default placement (kvcache-ai/ktransformers: routed experts are
computed on the CPU, attention and shared experts on the GPU) and of llama.cpp's expert
offload to the CPU: only experts already on the GPU run there.
"""

from __future__ import annotations

from systems.miss_handlers.base import MissHandler


class CpuMisses(MissHandler):
    name = "cpu"

    def choose_cpu(self, layer, missing, costs):
        return {e for e, _ in missing}
