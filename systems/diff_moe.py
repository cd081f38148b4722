"""diff_moe: Diff-MoE (SC'25, doi 10.1145/3712285.3759903): priority-tiered expert caches for
batched MoE inference, over the engine's one pool of slots.

Tiers (this system's bookkeeping; docs/systems.md has the rules, knobs and divergences):
- high (HPC), per layer: the `high` experts of the layer most often in a step's union of the
  calibration trace. Preloaded, never named as victims.
- medium (MPC), per layer: `medium` members, first the next-hottest profiled experts
  (preloaded). After each layer's routing, every expert of the layer updates its priority:
  routed +1 (at most max_val); idle -dec_in if in HPC/MPC, -dec_out otherwise (at least
  min_val). A member whose priority is below `threshold` is replaced by a routed non-member
  whose priority is at or above it: lowest member first, highest candidate first.
- low (LPC), shared: every other resident expert (demand fetches of cold experts, prefetches,
  demoted members). First in line for eviction once used (see `choose_victim`).
A numpy predictor (systems/predictor.py) trained on the calibration trace guesses the next
layer's experts; the guesses not resident are prefetched into the LPC.

Slots: slots per layer = floor((cache slots - low reserve) / MoE layers), at most E; high =
round(slots / 3) (the authors' (3, 1), (6, 2), (13, 4)); the LPC gets the rest, >= 1 slot.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from core.blocks import block_expert_counts
from core.knobs import KnobError, float_knob, int_knob
from systems.base import System
from systems.predictor import NextLayerPredictor, PredictorRuntime, check_predictor_knobs

MEDIUM, HIGH = 1, 2


def split_slots(capacity: int, layers: int, experts: int, low_reserve: int,
                per_layer: int | None = None, high: int | None = None) -> tuple[int, int, int]:
    """(HPC+MPC slots per layer, HPC slots per layer, LPC slots) for a cache of `capacity`."""
    if per_layer is None:
        per_layer = (capacity - low_reserve) // layers
        if per_layer < 1:  # the reserve does not fit: shrink it to one LPC slot
            per_layer = (capacity - 1) // layers
    per_layer = max(0, min(per_layer, experts))
    if per_layer * layers > capacity or (per_layer < experts and per_layer * layers == capacity):
        raise KnobError(f"slots_per_layer: {per_layer} slots per layer x {layers} layers leaves "
                        f"no low-priority slot in a cache of {capacity} experts")
    high = round(per_layer / 3) if high is None else int_knob(
        high, "high_slots", lo=0, hi=per_layer, note=f"{per_layer} slots per layer")
    return per_layer, high, capacity - per_layer * layers


class DiffMoE(System):
    name = "diff_moe"
    label = "Diff-MoE (high/medium/low priority expert caches + next-layer predictor)"

    def __init__(self, slots_per_layer: int | None = None, high_slots: int | None = None,
                 low_slots: int | None = None, max_val: float = 2.0, threshold: float = 1.0,
                 dec_in: float = 0.4, dec_out: float = 0.2, min_val: float | None = 0.0,
                 recency_grid=(0.0, 0.25, 0.5, 0.75),
                 holdout_fraction: float = 0.2, train_prefill_stride: int = 8,
                 smoothing: float = 1.0, prefetch: bool = True):
        super().__init__(prefetch)  # false: tiers only, no predictor
        int_knob(slots_per_layer, "slots_per_layer", lo=1, null="auto")
        int_knob(high_slots, "high_slots", lo=0, null="round(slots_per_layer / 3)")
        int_knob(low_slots, "low_slots", lo=1, null="2 * min(E, max_batch * top_k)")
        self.max_val = float_knob(max_val, "max_val", lo=0.0)
        self.threshold = float_knob(threshold, "threshold")
        self.dec_in = float_knob(dec_in, "dec_in", lo=0.0)
        self.dec_out = float_knob(dec_out, "dec_out", lo=0.0)
        self.min_val = float_knob(min_val, "min_val", hi=self.max_val, null="no floor",
                                  note="the floor cannot be above max_val")
        grid, _, _, _ = check_predictor_knobs(recency_grid, holdout_fraction,
                                              train_prefill_stride, smoothing)
        self.cfg = {"slots_per_layer": slots_per_layer, "high_slots": high_slots,
                    "low_slots": low_slots, "max_val": max_val, "threshold": threshold,
                    "dec_in": dec_in, "dec_out": dec_out, "min_val": min_val,
                    "recency_grid": list(grid),
                    "holdout_fraction": holdout_fraction,
                    "train_prefill_stride": train_prefill_stride, "smoothing": smoothing}
        self.pred: NextLayerPredictor | None = None
        self.runtime: PredictorRuntime | None = None  # the predictor's run-time side
        self.profiled = False

    # ---- setup ------------------------------------------------------------------------------
    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        low = int_knob(self.cfg["low_slots"], "low_slots", lo=1, hi=ctx.capacity_slots,
                       null="2 * min(E, max_batch * top_k)",
                       note=f"the cache holds {ctx.capacity_slots} experts")
        int_knob(self.cfg["slots_per_layer"], "slots_per_layer", lo=1, hi=E, null="auto",
                 note=f"the model has {E} experts per layer")
        # Default reserve: one layer's union of a decode step for the running layer, as many
        # again for the next layer's prefetches.
        low = 2 * min(E, ctx.max_batch * ctx.top_k) if low is None else low
        self.per_layer, self.high, self.low = split_slots(
            ctx.capacity_slots, L, E, low, self.cfg["slots_per_layer"], self.cfg["high_slots"])
        self.medium = self.per_layer - self.high
        self.cap = max(0, self.low - 1)  # prefetches per proposal
        self.prio = np.zeros((L, E))  # [L, E] priorities
        self.floor = None if self.min_val is None else np.full(E, self.min_val)  # [E]
        self.dec = np.full((L, E), self.dec_out)  # [L, E] decay: dec_in for HPC/MPC members
        self.tier = [0] * (L * E)  # key -> 0 (low / not a member), MEDIUM or HIGH
        self.mpc: list[set[int]] = [set() for _ in range(L)]  # member ids per layer
        self.mpc_ids = [np.zeros(0, np.intp) for _ in range(L)]  # the same, ascending arrays
        self.resident: set[int] = set()  # keys resident or in flight (we pick every victim)
        self.lpc_used: OrderedDict[int, None] = OrderedDict()  # used LPC keys, evict first
        self.lpc_fresh: OrderedDict[int, None] = OrderedDict()  # prefetched, not used yet
        self.proposal: list[int] | None = None

    def warmup(self, calibration) -> None:
        """Profiling pass over the calibration split: hot experts per layer, predictor."""
        ctx = self.ctx
        L, E = ctx.num_layers, ctx.num_experts
        per_step = block_expert_counts(calibration).reshape(-1, L, E)  # [S, L, E] tokens
        steps = (per_step > 0).sum(axis=0)  # [L, E] steps whose union holds each expert
        for layer in range(L):
            order = sorted(range(E), key=lambda e: (-steps[layer, e], e))[:self.per_layer]
            for rank, e in enumerate(order):
                self._set_tier(layer, e, HIGH if rank < self.high else MEDIUM)
            self.mpc_ids[layer] = np.array(sorted(self.mpc[layer]), dtype=np.intp)
        self.profiled = True
        if self.prefetch:
            c = self.cfg
            self.pred = NextLayerPredictor(L, E, ctx.top_k, ctx.moe_layer_stacks,
                                           c["recency_grid"], c["holdout_fraction"],
                                           c["train_prefill_stride"], c["smoothing"])
            self.pred.fit(calibration, ctx.max_batch)
            self.runtime = PredictorRuntime(self.pred)

    def initial_residents(self):
        if not self.profiled:
            raise ValueError("diff_moe needs warmup(calibration) before the run: its high- and "
                             "medium-priority caches come from a profiling pass")
        keys = [k for k, t in enumerate(self.tier) if t]
        self.resident.update(keys)
        return keys

    def _set_tier(self, layer: int, e: int, tier: int) -> None:
        key = layer * self.ctx.num_experts + e
        self.tier[key] = tier
        self.dec[layer, e] = self.dec_in if tier else self.dec_out
        if tier == MEDIUM:
            self.mpc[layer].add(e)
        else:
            self.mpc[layer].discard(e)

    # ---- per step ---------------------------------------------------------------------------
    def on_layer_routed(self, routing, now_ms):
        if self.runtime is not None:
            self.runtime.new_step(routing.iteration)
        self.proposal = self.decide(routing.layer, routing.experts, routing.counts)

    def decide(self, layer: int, experts: list[int], counts: list[int]) -> list[int]:
        """One step at one layer: update priorities and tiers for the step's union `experts`
        (ascending ids, `counts` tokens each); return the keys to prefetch for layer + 1."""
        E = self.ctx.num_experts
        base = layer * E
        p = self.prio[layer]  # [E] view
        # numpy methods (take/put) rather than fancy indexing or reductions: a step is ~10
        # small-array calls, each a fixed cost
        act = np.array(experts, dtype=np.intp)
        p_act = np.minimum(p.take(act) + 1.0, self.max_val)
        p -= self.dec[layer]  # idle decay (the routed ones are overwritten below)
        if self.floor is not None:
            np.maximum(p, self.floor, out=p)  # [E] floor array: faster than a python scalar
        p.put(act, p_act)
        # LPC order: a routed LPC expert goes to the back of the used list (evictable as soon
        # as it has run); unused prefetches of this layer were wrong guesses: to the front.
        tier, used, fresh = self.tier, self.lpc_used, self.lpc_fresh
        if fresh:
            for key in [k for k in fresh if k // E == layer]:
                del fresh[key]
                used[key] = None
                used.move_to_end(key, last=False)
        cands = []
        for e in experts:
            key = base + e
            if key in used:
                used.move_to_end(key)
            if not tier[key]:  # routed, so its priority is >= 1 + min_val
                cands.append(e)
        if cands:
            self._replace(layer, cands, p)
        if self.runtime is None:
            return []
        # top-m guesses for layer + 1, m = this step's union size (none without LPC room)
        top = self.runtime.guess(layer, act, counts, min(len(experts), E) if self.cap else 0)
        nxt, resident = base + E, self.resident
        out = [nxt + e for e in top if nxt + e not in resident]
        return out[:self.cap]  # at most LPC slots - 1: one is never a prefetch in flight

    def _replace(self, layer: int, cands: list[int], p: np.ndarray) -> None:
        """Lowest-priority MPC members below threshold give way to the highest candidates
        at or above it (ties: lowest id first on both sides)."""
        thr, E = self.threshold, self.ctx.num_experts
        cands = [e for e in cands if p[e] >= thr]
        members = self.mpc_ids[layer]  # [n] ascending ids
        free = self.medium - len(members)
        if not cands:
            return
        pm = p.take(members)  # [n]
        low = int(pm.argmin()) if len(members) else -1  # first minimum: the lowest id
        if free <= 0 and (low < 0 or pm[low] >= thr):
            return
        # ascending priority, ties by lowest id (members are ascending, the sort is stable)
        low_first = ([int(members[low])] if len(cands) == 1 and free <= 0 else
                     members[pm.argsort(kind="stable")].tolist())
        if len(cands) > 1:
            cands.sort(key=lambda e: (-p[e], e))
        for e in cands:
            if free > 0:
                free -= 1
            elif low_first and p[low_first[0]] < thr:
                out = low_first.pop(0)
                self._set_tier(layer, out, 0)
                key = layer * E + out
                if key in self.resident:  # demoted: an idle LPC expert, evicted first
                    self.lpc_used[key] = None
                    self.lpc_used.move_to_end(key, last=False)
            else:
                break
            self._set_tier(layer, e, MEDIUM)
            key = layer * E + e
            self.lpc_used.pop(key, None)
            self.lpc_fresh.pop(key, None)
        self.mpc_ids[layer] = np.array(sorted(self.mpc[layer]), dtype=np.intp)

    def propose_prefetch(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    # ---- cache events -----------------------------------------------------------------------
    def on_load(self, key, demand, now_ms):
        self.resident.add(key)
        if not self.tier[key]:
            (self.lpc_used if demand else self.lpc_fresh)[key] = None

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        # Used LPC experts first; a demand fetch may also take an unused prefetch. Members
        # of the high and medium tiers are never victims: when no LPC expert can go, the
        # engine defers the demand fetch until one of the layer's experts has run (the LPC
        # has >= 1 slot and, with its prefetch cap, always one not in flight).
        victim = candidates.first_of(self.lpc_used)
        if victim is None and demand:
            victim = candidates.first_of(self.lpc_fresh)
        return victim

    def on_evict(self, key, now_ms):
        self.resident.discard(key)
        self.lpc_used.pop(key, None)
        self.lpc_fresh.pop(key, None)

    def describe(self):
        out = super().describe()
        out["knobs"] = dict(self.cfg)
        if hasattr(self, "per_layer"):
            out["slots"] = {"per_layer": self.per_layer, "high_per_layer": self.high,
                            "medium_per_layer": self.medium, "low": self.low}
        if self.pred is not None:
            out["predictor"] = dict(self.pred.report)
        return out


class DiffMoEFloorRecency(DiffMoE):
    """The named variant (systems/variants.py): the seed class with a name of its own; its
    knob values are set in conf/system/diff_moe_floor_recency.yaml."""

    name = "diff_moe_floor_recency"
    label = "Diff-MoE + ours: priority floor, recency term in the next-layer predictor"
