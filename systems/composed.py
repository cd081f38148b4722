"""composed: a system built from an evictor, a prefetcher and an optional admission rule.

    moebench system=composed system/evictor=lfu system/prefetcher=spec_next_layer
    moebench system=composed system/miss_handler=cost_based hardware/host=ddr5_dual_channel

Each part is a config node with a `_target_` (conf/system/evictor/*.yaml,
conf/system/prefetcher/*.yaml) that must subclass Evictor / Prefetcher / Admission, built
with the project allowlist (core/targets.py); an already built part is taken as it is.
Engine events are forwarded (docs/architecture.md has the order):
  on_layer_routed -> evictor.on_access(iteration, layer, the step's keys) once per layer step,
                     evictor.on_layer_routed (an evictor reading router scores),
                     miss_handler.on_layer_routed, then prefetcher.on_layer_routed
  propose_prefetch -> prefetcher.propose
  choose_victim   -> evictor.choose_victim; for a prefetch that would evict a named victim,
                     admission.admit (False: declined, None). A free slot is always used: the
                     engine loads into it whatever a system answers.
  on_load / on_evict -> evictor.on_insert / on_evict, then the prefetcher's
  on_step_end -> evictor, then prefetcher; request hooks and warmup -> prefetcher.
The miss handler (conf/system/miss_handler/*.yaml; null: fetch) is asked by the engine itself
which missed experts run on the host CPU (docs/hardware.md); it sees no other event than the
layer step's routing. The evictor's and the miss handler's on_layer_routed are called only
where they override the base class's.
`prefetch: false` turns the prefetcher off: the engine never asks, and the prefetcher sees
no event after bind (it is not warmed up either).
"""

from __future__ import annotations

from core.knobs import KnobError
from core.targets import build_part
from systems.admission import Admission
from systems.base import System
from systems.evictors.base import Evictor
from systems.miss_handlers.base import MissHandler
from systems.prefetchers.base import Prefetcher


class Composed(System):
    name = "composed"
    label = "composed: an evictor + a prefetcher (+ an admission rule)"

    def __init__(self, evictor=None, prefetcher=None, admission=None, prefetch: bool = True,
                 miss_handler=None):
        super().__init__(prefetch)
        if evictor is None:
            raise KnobError("evictor: a composed system needs an evictor node (_target_)")
        # A bind-time KnobError of a part built from a node is reported under its key
        # (`system.evictor.<knob>`); a part handed over built (on_demand, lru) answers for
        # the system's own knobs (`system.<knob>`).
        self._prefix = {where: "" if isinstance(node, base) else f"{where}."
                        for where, node, base in (("evictor", evictor, Evictor),
                                                  ("prefetcher", prefetcher, Prefetcher),
                                                  ("admission", admission, Admission))}
        self.evictor = build_part(evictor, "evictor", Evictor)
        self.prefetcher = (build_part(prefetcher, "prefetcher", Prefetcher)
                           if prefetcher is not None else _none())
        self.admission = (build_part(admission, "admission", Admission)
                          if admission is not None else None)
        self.miss_handler = (build_part(miss_handler, "miss_handler", MissHandler)
                             if miss_handler is not None else None)
        # instance attributes the runner and the engine read (declared on System)
        self.oracle = bool(self.evictor.bound or self.prefetcher.oracle)
        self.uses_fields = tuple(dict.fromkeys((*self.evictor.uses_fields,
                                                *self.prefetcher.uses_fields)))
        self._pf = self.prefetcher if self.prefetch else None  # None: switched off
        if type(self) is Composed:  # named systems built on it keep their own label
            self.label = (f"composed: evictor {self.evictor.name} + prefetcher "
                          f"{self.prefetcher.name}"
                          + (f" + admission {self.admission.name}" if self.admission else "")
                          + (f" + misses {self.miss_handler.name}" if self.miss_handler else ""))

    def _parts(self):
        return [("evictor", self.evictor), ("prefetcher", self.prefetcher),
                ("admission", self.admission)]

    def use_policy_kernels(self, choice: str) -> Composed:
        super().use_policy_kernels(choice)
        for _, part in self._parts():  # a joint prefetcher's system (fmoe_maps, eamc)
            if hasattr(part, "use_policy_kernels"):
                part.use_policy_kernels(choice)
        return self

    def bind(self, ctx):
        super().bind(ctx)
        for where, part in self._parts():
            if part is None:
                continue
            try:
                part.bind(ctx)
            except KnobError as exc:  # a range that depends on the model or the budget
                raise KnobError(f"{self._prefix[where]}{exc}") from exc
        self._route_direct()

    def _route_direct(self) -> None:
        """Where a hook would only forward to the evictor, bind the evictor's method in its
        place (an instance attribute), so the engine calls it without this extra frame: the
        events and their order are the same (a subclass's own hook is left alone)."""
        cls, pf = type(self), self._pf

        def silent(name: str) -> bool:  # the prefetcher ignores this event
            return pf is None or getattr(type(pf), name) is getattr(Prefetcher, name)

        if self.admission is None and cls.choose_victim is Composed.choose_victim:
            self.choose_victim = self.evictor.choose_victim
        if silent("on_insert") and cls.on_load is Composed.on_load:
            self.on_load = self.evictor.on_insert
        if silent("on_evict") and cls.on_evict is Composed.on_evict:
            self.on_evict = self.evictor.on_evict
        # an evictor without recency or counts needs no key list per layer step
        self._on_access = (None if type(self.evictor).on_access is Evictor.on_access
                           else self.evictor.on_access)
        # parts that read the layer step's routing itself (router scores, the whole layer)
        self._observers = [part.on_layer_routed for part, base in
                           ((self.evictor, Evictor), (self.miss_handler, MissHandler))
                           if part is not None
                           and type(part).on_layer_routed is not base.on_layer_routed]

    def needs_calibration(self) -> bool:
        return self._pf is not None and self._pf.needs_calibration()

    def warmup(self, calibration) -> None:
        if self._pf is not None:
            self._pf.warmup(calibration)

    def on_request_start(self, request, now_ms):
        if self._pf is not None:
            self._pf.on_request_start(request, now_ms)

    def on_layer_routed(self, routing, now_ms):
        if self._on_access is not None:
            base = routing.layer * self.ctx.num_experts
            self._on_access(routing.iteration, routing.layer,
                            [base + e for e in routing.experts], now_ms)
        for observe in self._observers:
            observe(routing, now_ms)
        if self._pf is not None:
            self._pf.on_layer_routed(routing, now_ms)

    def propose_prefetch(self, now_ms):
        return self._pf.propose(now_ms) if self._pf is not None else None

    def choose_victim(self, candidates, incoming, demand, now_ms):
        victim = self.evictor.choose_victim(candidates, incoming, demand, now_ms)
        if (victim is not None and not demand and self.admission is not None
                and not self.admission.admit(incoming, victim, now_ms)):
            return None
        return victim

    def on_load(self, key, demand, now_ms):
        self.evictor.on_insert(key, demand, now_ms)
        if self._pf is not None:
            self._pf.on_insert(key, demand, now_ms)

    def on_evict(self, key, now_ms):
        self.evictor.on_evict(key, now_ms)
        if self._pf is not None:
            self._pf.on_evict(key, now_ms)

    def on_step_end(self, iteration, now_ms):
        self.evictor.on_step_end(iteration, now_ms)
        if self._pf is not None:
            self._pf.on_step_end(iteration, now_ms)

    def on_request_end(self, request, now_ms):
        if self._pf is not None:
            self._pf.on_request_end(request, now_ms)

    def describe(self):
        out = super().describe()
        for where, part in self._parts():
            out[where] = None if part is None else part.describe()
        if self.miss_handler is not None:  # absent: fetch (older records have no key)
            out["miss_handler"] = self.miss_handler.describe()
        return out


def _none() -> Prefetcher:
    from systems.prefetchers.none import NoPrefetch

    return NoPrefetch()
