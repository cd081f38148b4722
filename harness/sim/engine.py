"""The one engine loop every system runs in (contract: docs/engine.md).

Per iteration (a batched prefill or decode step) and per layer: the dense part runs on the
compute stream; at a MoE layer the shared step (harness/sim/step.py) reveals the routing,
tells the system, takes its prefetch proposal and runs the layer's experts through an
executor (harness/sim/executor.py); copies go through the copy engine (harness/sim/copies.py):
one link, demand fetches ahead of queued prefetches, an in-flight copy never preempted, a copy
reserving its slot when issued.

Two drivers, one step. Trace replay: `run()` advances a virtual clock by the cost model (a
SimBackend and a SimExecutor). Live: `run(driver=...)` hands each iteration to a driver
(harness/live/driver.py) that runs the real model and whose executor runs each expert for
real; the model's MoE blocks call back `live_layer(layer, run)` with the block's expert
callback `run(expert, ready_estimate_ms) -> (wait_ms, end_ms)`, which the live executor
uses (`bind_layer`); the backend copies real weights (`load_expert` / `evict_expert`) and
times come from its real clock (`now_ms`). Live routing must match the trace (recorded from
the same greedy generation, or replayed into the router); systems see the same LayerRouting
either way.
"""

from __future__ import annotations

import time
from dataclasses import replace

from core.blocks import BlockIndex
from core.schedule import Scheduler
from core.view import IterationInfo, RequestInfo, RoutingView, SystemContext
from harness.sim import cores
from harness.sim.cache import ExpertCache
from harness.sim.copies import EngineError
from harness.sim.gpus import GpuAccesses, Gpus
from harness.sim.hooks import Hooks
from harness.sim.recorder import Recorder
from harness.sim.step_gpus import GpuGroup, MultiGpuStep
from harness.sim.tiers import Tiers
from systems.base import System

__all__ = ["Engine", "EngineError"]


class Engine:
    def __init__(self, model, backend, trace, system: System, capacity_bytes: int,
                 max_batch: int = 1, progress: bool = False, time_policy: bool = False,
                 core: str = "auto", tiers: Tiers | None = None, gpus: Gpus | None = None):
        if trace.num_layers != model.num_moe_layers or trace.num_experts != model.num_experts:
            raise EngineError(f"trace shape (L={trace.num_layers}, E={trace.num_experts}) does "
                              f"not match model {model.name} (L={model.num_moe_layers}, "
                              f"E={model.num_experts})")
        self.model, self.backend, self.trace, self.system = model, backend, trace, system
        self.max_batch, self.progress = max_batch, progress
        self.E, self.L = model.num_experts, model.num_moe_layers
        # memory tiers or CPU-run misses (docs/hardware.md): None unless the run has them
        tiers = tiers if tiers is not None and tiers.active(system, model) else None
        # several GPUs or a placement (docs/gpus.md): None unless the run has them
        gpus = gpus if gpus is not None and gpus.active() else None
        if gpus is not None:
            gpus.check(model, tiered=tiers is not None)
        # compiled or python (harness/sim/cores.py): the same results, another speed
        self.core = cores.resolve(core, backend, tiered=tiers is not None,
                                  several_gpus=gpus is not None)
        self.cache, self.rec = cores.make_state(self.core, capacity_bytes, model.expert_bytes,
                                                self.E * self.L)
        if self.cache.capacity_slots < 1:
            raise EngineError(f"expert cache of {capacity_bytes} bytes holds no expert "
                              f"({model.expert_bytes} bytes each)")
        self._driver = None
        self._live_iter = None  # live: (IterationInfo, members) of the running iteration
        # Bind now, so a history-based system can use its context in warmup(); the hooks
        # are taken after it, since bind may route a hook straight to a part (composed).
        t0 = time.perf_counter()
        ctx = SystemContext(
            num_layers=self.L, num_experts=self.E, top_k=trace.top_k,
            expert_bytes=model.expert_bytes, capacity_slots=self.cache.capacity_slots,
            capacity_bytes=self.cache.capacity_bytes, max_batch=max_batch,
            moe_layer_stacks=tuple(trace.meta["moe_layer_stacks"]),
            trace_fields=tuple(f for f in ("weights", "probs", "spec_topk", "embeddings",
                                           "prompts") if f not in trace.missing_fields()),
            trace=trace if system.oracle else None)
        if gpus is not None:  # each GPU's system plans on what its GPU runs (docs/gpus.md)
            gpus.placement.bind(gpus.num_gpus, self.L, self.E,
                                gpus.placement_slots or self.cache.capacity_slots)
        system.bind(self._gpu_context(ctx, gpus, 0))
        self._bind_s = time.perf_counter() - t0
        # time_policy: each hook call is timed into policy_s (off: plain bound methods)
        self.hooks = Hooks(system, time_policy)
        self.index = BlockIndex.of(trace)
        if self.core == "compiled":  # at most one access per union entry, one row per block
            self.rec.reserve(len(self.index.ids_array), len(self.index.bounds_array) - 1)
        self.tier = None if tiers is None else tiers.host_tier(model, ctx)
        self.group = None
        if gpus is not None:
            self._several_gpus(gpus, ctx, capacity_bytes, backend, time_policy)
            return
        self.copies, self.step = cores.make_step(self.core, self.index, RoutingView(self.index),
                                                 self.hooks, self.cache, self.rec, backend,
                                                 self.E, self.tier, system.miss_handler)

    def _several_gpus(self, gpus: Gpus, ctx: SystemContext, capacity_bytes: int, backend,
                      time_policy: bool) -> None:
        """One system, cache and copy engine per GPU (harness/sim/step_gpus.py); the group
        stands where the single GPU's hooks, cache and copy engine stand."""
        systems = [self.system]
        for g in range(1, gpus.num_gpus):
            systems.append(gpus.make_system())
            systems[-1].bind(self._gpu_context(ctx, gpus, g))
        caches = [self.cache] + [ExpertCache(capacity_bytes, self.model.expert_bytes)
                                 for _ in systems[1:]]
        view = RoutingView(self.index)
        self.group = GpuGroup(gpus, systems, caches, self.rec, backend, self.model,
                              self.index, view, time_policy)
        self.hooks = self.copies = self.cache = self.group
        self.step = MultiGpuStep(self.group, self.index, view, self.rec, self.E)

    def _gpu_context(self, ctx: SystemContext, gpus: Gpus | None, gpu: int) -> SystemContext:
        """GPU `gpu`'s context: its share of each layer's experts and, for a system that
        reads the future, of the access sequence."""
        if gpus is None:
            return ctx
        owners, E = gpus.placement.owners, self.E
        share = tuple(sum(gpu in owners[layer * E + e] for e in range(E))
                      for layer in range(self.L))
        accesses = (None if ctx.trace is None else
                    GpuAccesses(gpus.placement, self.trace, self.max_batch, gpu))
        return replace(ctx, layer_share=share, gpu_accesses=accesses)

    @property
    def systems(self) -> list[System]:
        """The system of each GPU (one GPU: the run's system)."""
        return [self.system] if self.group is None else list(self.group.systems)

    def gpu_metrics(self) -> dict | None:
        """Bytes per link and peer fetches (docs/gpus.md); None on one GPU without a
        placement."""
        return None if self.group is None else self.group.metrics()

    def tier_metrics(self) -> dict | None:
        """The host tier's and the CPU's counts (docs/hardware.md); None without tiers."""
        if self.tier is None:
            return None
        cpu = getattr(self.step, "cpu", None)
        return {**self.tier.summary(), "cpu_runs": cpu.runs if cpu is not None else 0,
                "cpu_busy_ms": cpu.busy_ms if cpu is not None else 0.0}

    @property
    def policy_s(self) -> float | None:
        """Wall seconds spent inside the system's hooks (bind included); None unless the
        engine was built with time_policy=True."""
        return self._bind_s + self.hooks.policy_s if self.hooks.timed else None

    # ---- main loop --------------------------------------------------------------------------
    def run(self, driver=None) -> Recorder:
        """Replay the trace; with a driver, run each iteration for real (docs/real-backend.md)."""
        tr = self.trace
        if driver is not None:
            if self.group is not None:
                raise EngineError("live runs have one GPU (hardware.num_gpus 1, no placement)")
            if self.core != "python":
                raise EngineError("live runs need engine_core 'python' (the driver's "
                                  "executor runs inside the python layer step)")
            if self.max_batch != 1:
                raise EngineError("live runs support max_batch = 1 only")
            self._driver, self.step.executor = driver, driver.executor
        # serving starts after the preloads
        now = (self.copies.preload(self.system.initial_residents()) if self.group is None
               else self.group.preload_all())
        index = 0
        sched = Scheduler(tr.arrival_ms, tr.output_len, self.max_batch)
        bar = _progress(tr.num_requests, self.system.name, self.progress)
        while not sched.done():
            nxt = sched.next_iteration(now)
            if nxt is None:
                now = max(now, sched.next_arrival_ms())
                continue
            kind, members = nxt
            if kind == "prefill":
                self._tell_requests("start", members, now)
            now = self._iteration(index, kind, members, now)
            finished = sched.finish_iteration(members)
            self._tell_requests("end", finished, now)
            if bar is not None:
                bar.update(len(finished))
            index += 1
        if bar is not None:
            bar.close()
        self.rec.peak_cache_bytes = self.cache.peak_bytes
        return self.rec

    def _tell_requests(self, what: str, requests, now: float) -> None:
        """on_request_start for (request, step) members; on_request_end for finished
        requests (each followed by a cache invariant check)."""
        hooks = self.hooks
        for item in requests:
            if what == "start":
                hooks.on_request_start(self._request(item[0]), now)
            else:
                hooks.on_request_end(self._request(item), now)
                self.cache.check_invariants()

    def _request(self, r: int) -> RequestInfo:
        tr = self.trace
        emb = None
        if tr.embeddings is not None and tr.has_embedding[r]:
            emb = tr.embeddings[r]
        prompt = tr.prompts[r] if tr.prompts is not None else None
        return RequestInfo(r, tr.request_ids[r], tr.datasets[r], tr.tasks[r],
                           int(tr.prompt_len[r]), int(tr.output_len[r]),
                           float(tr.arrival_ms[r]), emb, prompt)

    def _token_stats(self, members) -> dict[str, tuple[int, int, int]]:
        """Per stack: (new tokens, KV entries read, attention (query, key) pairs)."""
        enc_dec = self.model.architecture == "encoder_decoder"
        stats = {"encoder": [0, 0, 0], "decoder": [0, 0, 0]}
        for r, s in members:
            p = int(self.trace.prompt_len[r])
            if enc_dec:
                if s == 0:
                    _add(stats["encoder"], p, p, p * p)
                _add(stats["decoder"], 1, s + 1 + p, s + 1 + p)
            elif s == 0:
                _add(stats["decoder"], p, p, p * (p + 1) // 2)
            else:
                _add(stats["decoder"], 1, p + s, p + s)
        return {k: tuple(v) for k, v in stats.items()}

    def _iteration(self, index: int, kind: str, members, now: float) -> float:
        start = now
        info = IterationInfo(index, kind, tuple(members), start)
        if self._driver is not None:
            return self._live_iteration(info, members, start)
        stats = self._token_stats(members)
        dense_memo: dict[tuple[str, int], float] = {}
        moe_step = self.step.run
        for layer in self.model.layers:
            n, kv, pairs = stats[layer.stack]
            if n == 0:
                continue
            memo_key = (layer.stack, layer.dense_params)
            if memo_key not in dense_memo:
                dense_memo[memo_key] = self.backend.dense_ms(layer, n, kv, pairs)
            now += dense_memo[memo_key]
            if layer.moe_index >= 0:
                now = moe_step(info, layer.moe_index, members, now)
        now += self.backend.iteration_ms(len(members))
        return self._end_iteration(info, members, start, now)

    def _end_iteration(self, info: IterationInfo, members, start: float, now: float) -> float:
        """Start due prefetches, record the iteration, tell the system, take its proposal."""
        self.copies.advance(now)
        self.rec.iteration(info.index, info.kind, start, now, members)
        self.hooks.on_step_end(info, now)
        if self.tier is not None:
            self.tier.on_step_end(info, now)
        self.copies.ask(now)
        return now

    def _live_iteration(self, info: IterationInfo, members, start: float) -> float:
        """The driver runs the model's forward for this iteration; its MoE blocks call back
        live_layer. Dense compute, LM head and framework time are on the backend's clock."""
        self._live_iter = (info, members)
        try:
            self._driver.iteration(info, members)
        finally:
            self._live_iter = None
        return self._end_iteration(info, members, start, max(self.backend.now_ms(), start))

    def live_layer(self, layer: int, run) -> None:
        """Called from inside a live forward at MoE layer `layer` after its router ran:
        the shared step, its live executor running each expert through the block's callback
        `run(expert, ready_estimate_ms) -> (wait_ms, end_ms)`. The caller has checked that
        live routing matches the trace block."""
        if self._live_iter is None:
            raise EngineError(f"MoE layer {layer} ran outside a live iteration")
        info, members = self._live_iter
        executor = self.step.executor
        executor.bind_layer(run)
        try:
            self.step.run(info, layer, members, self.backend.now_ms())
        finally:
            executor.bind_layer(None)

    def trace_rows(self, layer: int):
        """Live: the trace's top-k ids [n_tokens, k] of the running iteration at `layer`."""
        info, members = self._live_iter
        r, s = members[0]
        return self.trace.block_rows(r, s, layer)


def _add(acc: list, n: int, kv: int, pairs: int) -> None:
    acc[0] += n
    acc[1] += kv
    acc[2] += pairs


def _progress(total: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    # disable=None: no bar when stderr is not a terminal (CI logs, captured output).
    return tqdm(total=total, desc=f"{name}", unit="req", leave=False, disable=None)
