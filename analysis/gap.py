"""Decompose a system's loads minus Belady's by counterfactual key-level replays
(definitions: docs/metrics.md, "Gap to Belady").

A replay walks the access sequence (core/access.py) from an empty cache of C slots with
demand fetches only, through an evictor's interface (systems/evictors/base.py), as the
engine's layer step does with no prefetch: per step on_access(keys); the resident keys of the
step are pinned, the missing ones are fetched in ascending key order, each asking
choose_victim (free slot first); a fetch refused while the cache is full waits, with the rest
behind it, until the step's loaded experts have run (in order, unpinning each, retrying after
each). now_ms is the step's number (a replay has no clock). It counts loads (cold included).

  moebench gap [hydra overrides]    run the config (simulated) and print its decomposition
"""

from __future__ import annotations

import sys

from core.view import IterationInfo, SystemContext
from systems.evictors.base import Evictor
from systems.evictors.belady import BeladyEvictor
from systems.oracle.bypass import Bypass

TERMS = ("gap", "prefetch_engine", "victims", "admission", "residual")


class _Candidates:
    """The replay's evictable keys (resident, not pinned); iteration ascending."""

    __slots__ = ("_cache", "_pinned", "full")

    def __init__(self, cache: set, pinned: set, full: bool):
        self._cache, self._pinned, self.full = cache, pinned, full

    def __contains__(self, key: int) -> bool:
        return key in self._cache and key not in self._pinned

    def first_of(self, keys) -> int | None:
        return next((k for k in keys if k in self), None)

    def __iter__(self):
        return iter(sorted(k for k in self._cache if k not in self._pinned))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def context(trace, capacity_slots: int, max_batch: int, expert_bytes: int = 1) -> SystemContext:
    return SystemContext(
        num_layers=trace.num_layers, num_experts=trace.num_experts, top_k=trace.top_k,
        expert_bytes=expert_bytes, capacity_slots=capacity_slots,
        capacity_bytes=capacity_slots * expert_bytes, max_batch=max_batch,
        moe_layer_stacks=tuple(trace.meta["moe_layer_stacks"]),
        trace_fields=tuple(f for f in ("weights", "probs", "spec_topk", "embeddings", "prompts")
                           if f not in trace.missing_fields()), trace=trace)


class _Replay:
    """The cache of one replay: resident keys, the evictor that picks victims, loads so far."""

    def __init__(self, ctx: SystemContext, evictor: Evictor):
        self.evictor, self.cap, self.cache, self.loads = evictor, ctx.capacity_slots, set(), 0

    def load(self, key: int, pinned: set, now: float) -> bool:
        """Fetch `key` (a victim from the evictor when full); False if the evictor refuses."""
        cache, evictor = self.cache, self.evictor
        full = len(cache) >= self.cap
        victim = evictor.choose_victim(_Candidates(cache, pinned, full), key, True, now)
        if victim is None:
            if full:
                return False
        else:
            if victim not in cache or victim in pinned:
                raise RuntimeError(f"{evictor.name} chose victim {victim}, not evictable")
            cache.discard(victim)
            evictor.on_evict(victim, now)
        cache.add(key)
        evictor.on_insert(key, True, now)
        self.loads += 1
        return True

    def step(self, b: int, keys, now: float) -> None:
        """One step: its resident keys pinned, the missing ones fetched in order; a refused
        fetch waits, with the rest behind it, for the step's loaded experts to run."""
        order = [k for k in keys if k in self.cache]
        pinned = set(order)
        deferred = []
        for k in keys:
            if k in pinned:
                continue
            if not deferred and self.load(k, pinned, now):
                pinned.add(k)
                order.append(k)
            else:
                deferred.append(k)
        self._run(b, order, pinned, deferred, now)

    def _run(self, b: int, order: list, pinned: set, deferred: list, now: float) -> None:
        """Run the loaded experts in order, unpinning each and retrying the deferred fetches
        after each, until every key of the step has run."""
        i = 0
        while i < len(order) or deferred:
            if i < len(order):
                pinned.discard(order[i])
                i += 1
            elif not deferred or not self.load(deferred[0], pinned, now):
                raise RuntimeError(f"{self.evictor.name}: no victim at step {b} with every "
                                   "loaded expert run")
            else:
                pinned.add(deferred[0])
                order.append(deferred.pop(0))
            while deferred and self.load(deferred[0], pinned, now):
                pinned.add(deferred[0])
                order.append(deferred.pop(0))


def replay(seq, ctx: SystemContext, evictor: Evictor) -> int:
    """Loads of `evictor` on `seq` (core.access.AccessSequence), demand only, from empty."""
    evictor.bind(ctx)
    cache = _Replay(ctx, evictor)
    last_it, info = -1, None
    for b, it, layer, keys in seq.blocks():
        if it != last_it:
            if info is not None:
                evictor.on_step_end(info, float(b))
            info, last_it = IterationInfo(it, seq.iteration_kinds[it], (), float(b)), it
        now = float(b)
        evictor.on_access(info, layer, keys, now)
        cache.step(b, keys, now)
    return cache.loads


def decompose(seq, ctx: SystemContext, system_loads: int, make_evictor,
              bypass: bool = False) -> dict:
    """Terms of docs/metrics.md for a system of `system_loads` copies (preloads included)
    whose victims are `make_evictor()` (a fresh evictor per call) and whose demand
    admission is always (bypass=False) or Belady's (bypass=True, belady_bypass)."""
    def adm(ev):
        return Bypass(ev) if bypass else ev

    cells = {
        "belady": replay(seq, ctx, BeladyEvictor()),
        "system_demand": replay(seq, ctx, adm(make_evictor())),
        "belady_victims": replay(seq, ctx, adm(BeladyEvictor())),
        "belady_admission": replay(seq, ctx, Bypass(make_evictor())),
    }
    gap = system_loads - cells["belady"]
    terms = {"gap": gap,
             "prefetch_engine": system_loads - cells["system_demand"],
             "victims": cells["system_demand"] - cells["belady_victims"],
             "admission": cells["system_demand"] - cells["belady_admission"]}
    terms["residual"] = gap - terms["prefetch_engine"] - terms["victims"] - terms["admission"]
    return {"system_loads": system_loads, **cells, **terms}


def system_parts(system):
    """(make_evictor, bypass) for a built system, or None where no evictor is definable."""
    from systems.composed import Composed
    from systems.oracle.system import Oracle

    if isinstance(system, Oracle):
        return BeladyEvictor, False
    if not isinstance(system, Composed):
        return None
    ev = system.evictor
    if isinstance(ev, Bypass):
        return (lambda: _fresh(ev.victims)), True
    return (lambda: _fresh(ev)), False


def _fresh(evictor: Evictor) -> Evictor:
    import copy

    return copy.deepcopy(evictor)  # unbound: bind() builds its state


def main(argv: list[str]) -> int:
    import tempfile

    from core.specs import SpecError, model_spec_from_dict
    from core.targets import build_target
    from core.trace import TraceError
    from harness.runner.config import compose_config
    from harness.runner.run import load_routing, run_config
    from systems.base import System

    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg = compose_config(argv, run_name="gap", results_dir=tmp)
            handler = build_target(cfg["system"], "system", System).miss_handler
            if handler is not None and handler.runs_on_cpu:
                print(f"moebench gap: misses handled by {handler.name} run on the host CPU "
                      "instead of loading: the decomposition compares loads of systems that "
                      "fetch every miss (docs/metrics.md, \"Gap to Belady\")", file=sys.stderr)
                return 1
            if cfg.get("placement") is not None:
                print("moebench gap: the decomposition replays one GPU's cache; a run with a "
                      "placement over several GPUs (docs/gpus.md) has one cache per GPU",
                      file=sys.stderr)
                return 1
            result = run_config(cfg)
        except (SpecError, TraceError) as exc:
            print(f"moebench gap: error: {exc}", file=sys.stderr)
            return 2
    if result["status"] != "valid":
        print(f"moebench gap: the run is {result['status']}: {result['reason']}", file=sys.stderr)
        return 1
    parts = system_parts(build_target(cfg["system"], "system", System))
    if parts is None:
        print(f"moebench gap: {result['system']['name']} has no separable evictor "
              "(a joint design); nothing to decompose", file=sys.stderr)
        return 1
    from core.access import access_sequence
    from core.precision import results_label

    model = model_spec_from_dict(cfg["model"], "model")
    trace = load_routing(cfg, model, "measure")
    eb = model.expert_bytes
    ctx = context(trace, result["memory"]["expert_cache_bytes"] // eb, cfg["max_batch"], eb)
    out = decompose(access_sequence(trace, cfg["max_batch"]), ctx,
                    result["metrics"]["h2d_bytes"] // eb, *parts)
    lossy = results_label([result])  # weights below 16 bits (core/precision.py)
    print(f"# Gap to Belady loads, {result['system']['name']} (SIMULATED, "
          f"{'synthetic' if trace.synthetic else 'recorded'} routing"
          f"{f', {lossy}' if lossy else ''}), "
          f"{ctx.capacity_slots} slots\n\n| quantity | loads |\n|---|---|")
    for key, value in out.items():
        print(f"| {key} | {value} |")
    return 0
