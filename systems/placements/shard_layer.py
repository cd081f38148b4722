"""Shard by layer: MoE layer l's experts on GPU l N / L (contiguous blocks of layers).

The split `device_map="auto"` makes of a model on several GPUs (Hugging Face accelerate),
for the experts: a token goes to the GPU of each MoE layer's block and its output back to
its home GPU, which runs the dense part.
"""

from __future__ import annotations

from systems.placements.base import Placement, at_most, contiguous


class ShardLayer(Placement):
    name = "shard_layer"

    def check(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        at_most(num_gpus, num_layers, "MoE layers", self.name)

    def owners_of(self, layer, expert, num_gpus, num_layers, num_experts):
        return (contiguous(layer, num_layers, num_gpus),)
