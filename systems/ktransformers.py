"""ktransformers: kTransformers' CPU-GPU expert placement (kvcache-ai/ktransformers).

kTransformers runs attention, the router, shared experts and dense layers on the GPU and the
routed experts on the host CPU (its optimize rules: `^model\\.layers\\..*\\.mlp\\.experts$` ->
`KTransformersExperts` with `generate_device: cpu`, `generate_op: KExpertsCPU`; archive/
ktransformers/optimize/optimize_rules/DeepSeek-V2-Lite-Chat.yaml). A fixed set of routed
experts may stay on the GPU: the older rules pick whole layers' experts by a regular
expression (`KExpertsMarlin` on `cuda:0` for `^model\\.layers\\.([0-7])\\.mlp\\.experts$`,
commented out in DeepSeek-V3-Chat-multi-gpu-8.yaml), kt-kernel with its SGLang
integration keeps `--kt-num-gpu-experts` per MoE layer times the layers (or
`--kt-gpu-experts-ratio` of all experts) on the GPU, chosen by
`--kt-expert-placement-strategy` (doc/en/kt-kernel/experts-sched-Tutorial.md; the masks of
kvcache-ai/sglang python/sglang/srt/layers/moe/kt_utils.py). The GPU experts run on the
GPU, every other routed expert on the CPU, both at once (kt_ep_wrapper.py).

Rules here:
- placement (`placement`, systems/placement.py): `frequency` by default, the strategy the
  tutorial recommends ("best performance when activation statistics are available"), from
  the calibration split's tokens per expert; `uniform` is the CLI's default and
  `front_loading` the third reproducible one. As many experts as the GPU cache holds.
- the placed experts are preloaded and never evicted; nothing is prefetched or copied on
  demand;
- every miss runs on the host CPU (systems/miss_handlers/cpu.py), beside the GPU's experts;
  the layer ends when both are done (the engine's CPU stream, docs/hardware.md).

Needs a host profile (`hardware.host`): the CPU's cost model. Not modelled, all off by
default: `--kt-enable-dynamic-expert-update` (GPU experts redistributed while serving),
`--kt-gpu-prefill-token-threshold` (a long prefill runs every expert on the GPU) and the older
rules' layer-wise prefill on the GPU (`per_layer_prefill_intput_threshold`). Also not
modelled: deferred experts (`max_deferred_experts_per_token`: some CPU experts' outputs are
merged one layer later, overlapping the next layer's attention), the CPU kernels (AMX /
AVX-512, quantized weights: the host profile's one cost model stands for them) and the CPU's
threads (the engine's CPU runs one expert at a time).
"""

from __future__ import annotations

from systems.miss_handlers.cpu import CpuMisses
from systems.placement import StaticPlacement


class KTransformers(StaticPlacement):
    name = "ktransformers"
    label = "kTransformers (hot experts on the GPU by placement, every other expert on the CPU)"

    def __init__(self, placement: str = "frequency", prefetch: bool = True):
        super().__init__(placement, prefetch)
        self.miss_handler = CpuMisses()
