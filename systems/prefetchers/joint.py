"""The prefetch side of a joint system as a zoo prefetcher (fmoe_maps, eamc).

The adapter holds an instance of the joint system (`self.joint`, built by the subclass with
its eviction-side knobs off) and forwards every prefetcher event to the matching System hook,
so the matching and ranking run the joint system's own code. Its choose_victim is never
asked: the composed system's evictor picks every victim, and insert / evict notifications
keep the joint system's residency view (and refetch guards) true.
"""

from __future__ import annotations

from systems.prefetchers.base import Prefetcher


class JointPrefetch(Prefetcher):
    joint = None  # the joint System instance (set by the subclass's __init__)
    dropped: tuple[str, ...] = ()  # describe() keys of the joint system's eviction side

    def use_policy_kernels(self, choice: str) -> None:
        self.joint.use_policy_kernels(choice)  # the config's policy_kernels (systems/base.py)

    def bind(self, ctx):
        super().bind(ctx)
        self.joint.bind(ctx)

    def needs_calibration(self) -> bool:
        return self.joint.needs_calibration()

    def warmup(self, calibration) -> None:
        self.joint.warmup(calibration)

    def on_request_start(self, request, now_ms):
        self.joint.on_request_start(request, now_ms)

    def on_layer_routed(self, routing, now_ms):
        self.joint.on_layer_routed(routing, now_ms)

    def propose(self, now_ms):
        return self.joint.propose_prefetch(now_ms)

    def on_insert(self, key, demand, now_ms):
        self.joint.on_load(key, demand, now_ms)

    def on_evict(self, key, now_ms):
        self.joint.on_evict(key, now_ms)

    def on_step_end(self, iteration, now_ms):
        self.joint.on_step_end(iteration, now_ms)

    def on_request_end(self, request, now_ms):
        self.joint.on_request_end(request, now_ms)

    def describe(self):
        drop = ("name", "label", "oracle", "prefetch", *self.dropped)
        out = {k: v for k, v in self.joint.describe().items() if k not in drop}
        return {"name": self.name, **out}
