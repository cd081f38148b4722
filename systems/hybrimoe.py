"""hybrimoe: HybriMoE (Zhong et al., arXiv 2504.05897, DAC'25; code PKU-SEC-Lab/HybriMoE
508a85b, built on kTransformers): hybrid CPU-GPU scheduling and cache management.

By construction composed(mrs, mrs, hybrid), one part per file, each citing its source:
- dynamic intra-layer scheduling: the `hybrid` miss handler (systems/miss_handlers/hybrid.py,
  the release's `HSS`): the GPU takes the layer's experts from the head of a list (on-GPU
  first, most tokens first), the CPU from its tail, whichever queue ends sooner; the missed
  experts the CPU takes run there, the others are fetched;
- score-based caching: the `mrs` evictor (systems/evictors/mrs.py, `KScoreAwareCache`):
  "Minus Recent Score", S = alpha * TopP(s) + (1 - alpha) * S per layer step, the lowest S
  evicted; alpha 0.5, top_p 2 * top_k;
- prefetching: the `mrs` prefetcher (systems/prefetchers/mrs.py, the release's
  `prefetch_expert`): the next layer's `prefetch_size` highest-scored experts. The release's
  `prefetch_size` defaults to 0 (ktransformers/local_chat.py, `KExpertsCache.__init__`), so
  no prefetch by default;
- start: the release fills each layer's GPU slots while it loads the weights, the layer's
  experts in id order while a slot is free (`KExpertsMarlin.load` ->
  `load_weights_to_storage` -> `load_expert_weights(init=True)`): preloaded here, as many
  per layer as the cache holds, the lowest ids (systems/placement.py `uniform_keys`).

Needs a host profile (`hardware.host`) and reads the trace's `probs` (routed shares without).
Not modelled: the paper's impact-driven prefetch (each candidate's simulated gain in the next
layers), which the release does not contain; the release's fixed slots per layer (`load_size`:
the engine has one pool; the victim is the lowest S over all layers); the release's prefill
path (a buffer streaming every expert of the layer after next, `reset_buffer`); the CPU-GPU
overlap inside the kernels (CPU expert submission and synchronisation, `submit` / `sync`): the
engine runs the CPU's experts one at a time beside the GPU's, and the layer ends when both do.
"""

from __future__ import annotations

from core.knobs import int_knob
from systems.composed import Composed
from systems.evictors.mrs import MRSEvictor
from systems.miss_handlers.hybrid import HybridMisses
from systems.placement import uniform_keys
from systems.prefetchers.mrs import MRSPrefetch


class HybriMoE(Composed):
    name = "hybrimoe"
    label = "HybriMoE (hybrid CPU-GPU scheduling + MRS score caching)"
    uses_fields = ("probs",)  # read by its evictor and prefetcher (set per instance too)

    def __init__(self, alpha: float = 0.5, top_p: int | None = None, prefetch_size: int = 0,
                 decode_only: bool = False, prefetch: bool = True):
        evictor = MRSEvictor(alpha, top_p)  # checks the knobs first: `alpha: ...`
        prefetch_size = int_knob(prefetch_size, "prefetch_size", lo=0)
        super().__init__(evictor=evictor,
                         prefetcher=MRSPrefetch(prefetch_size, alpha, top_p),
                         miss_handler=HybridMisses(decode_only), prefetch=prefetch)

    def initial_residents(self):
        ctx = self.ctx
        keys = uniform_keys(ctx.num_layers, ctx.num_experts,
                            min(ctx.capacity_slots, ctx.total_experts))
        self.evictor.preloaded(keys)  # preloads are not reported through on_load
        return keys
