"""Static expert placement: a fixed set of experts on the GPU for the whole run, chosen once.

kTransformers and Fiddler keep a fixed set of routed experts in GPU memory and run the others
where they live, on the host CPU (docs/systems.md, "CPU-offload systems"). How the set is
chosen, after kTransformers' `--kt-expert-placement-strategy` (kvcache-ai/sglang at 36a8e7b,
python/sglang/srt/layers/moe/kt_utils.py `_init_kt_gpu_experts_masks`):
- `frequency`: the N experts with the most activations in a profile, over all layers at once
  (kvcache-ai/ktransformers kt-kernel/python/experts_base.py `generate_gpu_experts_masks`: a
  top-N over the flattened [layers, experts] table). The profile there is SGLang's expert
  distribution record (`logical_count`, tokens routed per layer and expert); here it is the
  tokens per (layer, expert) of the calibration split, requests disjoint from the measured
  ones. Ties: the lowest key (torch.topk leaves them unspecified). Fiddler's popularity list
  is the same rule (efeslab/fiddler src/fiddler/mixtral.py `set_expert_loc`).
- `uniform`: N // L experts per layer, one more in the first N % L layers, the lowest ids of
  each layer (`generate_uniform_masks`).
- `front_loading`: whole layers from the first MoE layer on, the lowest ids first in the last
  one filled (`generate_front_loading_masks`).
The fourth strategy, `random` (torch.randperm with seed 42), is not reproduced: its draw is
torch's generator's. N is what the GPU cache holds less `scratch_slots` (every expert when
the cache holds them all). The placed experts are preloaded (timed copies, docs/engine.md,
"Preloads") and never evicted; a scratch slot holds one expert copied on demand (Fiddler's
GPU placeholder) and is the only victim ever named. No prefetch.
"""

from __future__ import annotations

import numpy as np

from core.blocks import block_unions
from core.knobs import KnobError
from systems.base import System

PLACEMENTS = ("frequency", "uniform", "front_loading")


def activation_counts(trace, num_layers: int, num_experts: int) -> np.ndarray:
    """Tokens routed to each expert over the trace, int64 [L, E] (every step and layer)."""
    ids, counts, bounds = block_unions(trace)
    layer = np.repeat(np.arange(len(bounds) - 1) % num_layers, np.diff(bounds))
    flat = np.bincount(layer * num_experts + ids.astype(np.int64), weights=counts,
                       minlength=num_layers * num_experts)  # integer sums: exact in float64
    return flat.astype(np.int64).reshape(num_layers, num_experts)


def frequency_keys(counts: np.ndarray, n: int) -> list[int]:
    """The n keys with the most tokens, ties by the lowest key; ascending."""
    flat = counts.reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))  # most tokens first, then lowest key
    return sorted(int(k) for k in order[:n])


def uniform_keys(num_layers: int, num_experts: int, n: int) -> list[int]:
    """n // L per layer (the first n % L layers one more), the lowest ids of each."""
    per, extra = divmod(n, num_layers)
    return [layer * num_experts + e for layer in range(num_layers)
            for e in range(min(num_experts, per + (layer < extra)))]


def front_loading_keys(num_layers: int, num_experts: int, n: int) -> list[int]:
    """The first n keys: layer 0 whole, then layer 1, ..."""
    return list(range(min(n, num_layers * num_experts)))


class StaticPlacement(System):
    """Preloads its placement, never evicts a placed expert, never prefetches; the missed
    experts go to its `miss_handler` (set by the subclass)."""

    scratch_slots = 0  # slots kept free of the placement for experts copied on demand

    def __init__(self, placement: str = "frequency", prefetch: bool = True):
        super().__init__(prefetch)
        if placement not in PLACEMENTS:
            raise KnobError(f"placement: must be one of {', '.join(PLACEMENTS)}, "
                            f"got {placement!r}")
        self.placement = placement
        self.counts: np.ndarray | None = None  # [L, E] calibration tokens (frequency)

    def needs_calibration(self) -> bool:
        return self.placement == "frequency"

    def bind(self, ctx):
        super().bind(ctx)
        total = ctx.total_experts
        self.gpu_experts = (total if ctx.capacity_slots >= total
                            else max(0, ctx.capacity_slots - self.scratch_slots))
        self.placed: set[int] = set()
        self.scratch: dict[int, None] = {}  # resident keys outside the placement, oldest first

    def warmup(self, calibration) -> None:
        self.counts = activation_counts(calibration, self.ctx.num_layers,
                                        self.ctx.num_experts)

    def placement_keys(self) -> list[int]:
        L, E, n = self.ctx.num_layers, self.ctx.num_experts, self.gpu_experts
        if self.placement == "uniform":
            return uniform_keys(L, E, n)
        if self.placement == "front_loading":
            return front_loading_keys(L, E, n)
        if self.counts is None:
            raise ValueError(f"{self.name} needs warmup(calibration) before the run: its "
                             "frequency placement comes from the calibration split's counts")
        return frequency_keys(self.counts, n)

    def initial_residents(self):
        keys = self.placement_keys()
        self.placed = set(keys)
        return keys

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        return candidates.first_of(self.scratch)  # never a placed expert

    def on_load(self, key, demand, now_ms):
        self.scratch[key] = None

    def on_evict(self, key, now_ms):
        del self.scratch[key]

    def describe(self):
        out = super().describe()
        out.update(placement=self.placement, scratch_slots=self.scratch_slots,
                   miss_handler=self.miss_handler.describe())
        if hasattr(self, "gpu_experts"):
            out["gpu_experts"] = self.gpu_experts
        return out
