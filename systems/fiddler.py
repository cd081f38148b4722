"""fiddler: Fiddler (Kamahori et al., arXiv 2402.07033, ICLR 2025; code efeslab/fiddler).

Rules:
- placement: at initialisation the non-expert layers and the most popular experts, as many
  as GPU memory allows, go to the GPU; the rest stay in host memory (§3, Fig. 2 (a): "a
  selected subset of expert layers"; popularity from offline profiling on ShareGPT). The
  released code places a hard-coded list of (layer, expert) in the order of popularity over
  all layers (src/fiddler/mixtral.py `set_expert_loc`, `calc_n_expert_on_gpu`). Here the
  profile is the calibration split's tokens per expert, the `frequency` rule of
  systems/placement.py; the placed experts are preloaded and never evicted.
- per missed expert: run it on the CPU, or copy its weights to the GPU and run it there,
  whichever the latency model says is faster for its input tokens (§3, Algorithm 1; the
  release's `cost_per_expert` loop); the `cost_based` miss handler
  (systems/miss_handlers/cost_based.py) with the engine's cost model.
- an expert run on the GPU without being placed is copied into one GPU buffer, the
  release's `expert_placeholder` (a deep copy of one expert on the GPU, allocated before
  `calc_n_expert_on_gpu` counts the free memory): one scratch slot, the only slot ever
  evicted. No prefetch.

Needs a host profile (`hardware.host`). Not modelled: the AVX512_BF16 CPU kernel (the host
profile's cost model stands for it); beam search; the scratch expert is kept until the next
copy evicts it, so a later access can hit it (the release reloads it: its placement map says
CPU).
"""

from __future__ import annotations

from systems.miss_handlers.cost_based import CostBasedMisses
from systems.placement import StaticPlacement


class Fiddler(StaticPlacement):
    name = "fiddler"
    label = "Fiddler (popular experts on the GPU, each miss where it finishes sooner)"
    scratch_slots = 1  # the release's expert_placeholder

    def __init__(self, prefetch: bool = True):
        super().__init__("frequency", prefetch)
        self.miss_handler = CostBasedMisses()
