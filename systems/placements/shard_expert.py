"""Shard by expert (expert parallelism): expert e of every layer on GPU e N / E.

Each GPU owns a contiguous block of expert ids in every layer, as an expert-parallel rank
does (DeepSpeed-MoE, Megatron-LM: rank r holds experts [r E / N, (r + 1) E / N)); a token
routed to an expert of another GPU is sent there and its output back.
"""

from __future__ import annotations

from systems.placements.base import Placement, at_most, contiguous


class ShardExpert(Placement):
    name = "shard_expert"

    def check(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        at_most(num_gpus, num_experts, "experts per layer", self.name)

    def owners_of(self, layer, expert, num_gpus, num_layers, num_experts):
        return (contiguous(expert, num_experts, num_gpus),)
