"""hybrid: HybriMoE's dynamic intra-layer CPU-GPU scheduling (arXiv 2504.05897; code
PKU-SEC-Lab/HybriMoE 508a85b, ktransformers/operators/experts.py `HSS`, the
"HybridSchedulingStrategy").

The layer's experts form one list: the experts already on the GPU (resident or in flight),
most tokens first, then the missed ones, most tokens first (ties: ascending id). The GPU
takes experts from the head of the list, the CPU from the tail, one at a time, until the two
meet:
- the head costs the GPU `gpu_ms(tokens)`; a missed head must first be copied: its copy
  queues on the link behind the copies already planned (`copy_ms` each), and the GPU waits
  for it when the link finishes later than the GPU's queue;
- the tail costs the CPU `cpu_ms(tokens)`;
- the GPU takes its head when its queue with the head ends no later than the CPU's queue with
  the tail (`gpu_total + gpu_time <= cpu_total + cpu_time`, ties to the GPU); else the CPU
  takes its tail.
The handler names the missed experts the CPU took; the others are fetched. Queues start where
the engine's are (`link_free_ms`, `cpu_free_ms`; the release starts both at zero) and the
times come from the engine's cost model (the release fits linear models per model: CPU
`1 ms x tokens + 0.79 ms` for the first CPU expert, GPU 0.5 ms, a copy 0.418 ms).

What differs from the release: it may also give the CPU an expert already on the GPU (once
the tail has passed every missed one); the engine runs resident experts on the GPU only, so
only the missed experts' placement is taken from the greedy, and that is the release's (the
missed experts sit at the tail, so the CPU has taken all of them before it reaches a resident
one). The release schedules only single-token (decode) steps and sends every expert of a
prefill to the GPU (`calc_experts`; `generate = input_tensor.size(0) == 1`):
`decode_only: true` does that; by default every layer step is scheduled, as the paper
describes its scheduler for both stages.

The experts the GPU runs anyway are read from the layer's routing (`on_layer_routed`, which
a composed system forwards): without it the list holds the missed experts only.
"""

from __future__ import annotations

from core.knobs import bool_knob
from systems.miss_handlers.base import MissHandler


def hybrid_schedule(loaded, missing, costs) -> set[int]:
    """The missed experts the CPU takes in HybriMoE's greedy. `loaded` / `missing`: (expert
    id, tokens) on the GPU / not; `costs`: harness/sim/cpu_misses.py MissCosts."""
    queue = ([(e, c, False) for e, c in sorted(loaded, key=lambda x: (-x[1], x[0]))]
             + [(e, c, True) for e, c in sorted(missing, key=lambda x: (-x[1], x[0]))])
    gpu, cpu = 0.0, costs.cpu_free_ms - costs.now_ms  # each queue's end, from the layer start
    link = costs.link_free_ms - costs.now_ms
    head, tail, on_cpu = 0, len(queue) - 1, set()
    while head <= tail:
        _, tokens, moved = queue[head]
        gpu_time, landed = costs.gpu_ms(tokens), link
        if moved:
            landed = link + costs.copy_ms
            if landed > gpu:  # the GPU waits for the copy
                gpu_time += landed - gpu
        last, last_tokens, last_missed = queue[tail]
        cpu_time = costs.cpu_ms(last_tokens)
        if gpu + gpu_time <= cpu + cpu_time:
            gpu, link, head = gpu + gpu_time, landed, head + 1
        else:
            cpu, tail = cpu + cpu_time, tail - 1
            if last_missed:
                on_cpu.add(last)
    return on_cpu


class HybridMisses(MissHandler):
    name = "hybrid"

    def __init__(self, decode_only: bool = False):
        self.decode_only = bool_knob(decode_only, "decode_only")
        self._layer: int | None = None  # the layer whose routing was seen last
        self._routed: list[tuple[int, int]] = []
        self._prefill = False

    def on_layer_routed(self, routing, now_ms):
        self._layer = routing.layer
        self._routed = list(zip(routing.experts, routing.counts))
        self._prefill = routing.iteration.kind == "prefill"

    def choose_cpu(self, layer, missing, costs):
        seen = self._layer == layer
        if self.decode_only and seen and self._prefill:
            return set()  # the release: a prefill's experts all run on the GPU
        absent = {e for e, _ in missing}
        loaded = [(e, c) for e, c in self._routed if e not in absent] if seen else []
        return hybrid_schedule(loaded, missing, costs)

    def describe(self):
        return {"name": self.name, "decode_only": self.decode_only}
