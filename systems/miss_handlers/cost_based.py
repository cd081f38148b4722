"""cost_based: each missed expert goes where it finishes sooner, by Fiddler's latency rule.

Fiddler (Kamahori et al., arXiv 2402.07033, ICLR 2025, §3): for an expert not in GPU memory,
compare the CPU's latency for the expert's input tokens with the latency of copying its
weights to the GPU and running it there, and take the smaller. Decode (one token) mostly
runs on the CPU, long prefills fetch. Fiddler's models are per expert and ignore queues;
so is this rule (`hybrid` weighs the queues).
"""

from __future__ import annotations

from systems.miss_handlers.base import MissHandler


class CostBasedMisses(MissHandler):
    name = "cost_based"

    def choose_cpu(self, layer, missing, costs):
        return {e for e, tokens in missing
                if costs.cpu_ms(tokens) < costs.copy_ms + costs.gpu_ms(tokens)}
