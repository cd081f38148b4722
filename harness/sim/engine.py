"""The one engine loop every system runs in (contract: docs/engine.md).

Per iteration (a batched prefill or decode step) and per layer: the dense part runs on the
compute stream; at a MoE layer the routing is revealed, the system is told and may replace
the prefetch queue; then the layer's experts run one at a time: ready residents first
(ascending id), then in-flight copies by ready time, then demand fetches in ascending id.
Only the running expert must be resident, so a cache smaller than a layer's expert set still
makes progress (a demand fetch with no free slot and no evictable victim waits until an
expert of the layer has run). One copy engine: demand fetches go ahead of queued
prefetches, an in-flight copy is never preempted, a copy reserves its slot when issued.

Two drivers share the per-MoE-layer step (`_moe_layer`: routing reveal, system hooks, copies,
ordered expert execution, recorder). Trace replay: `run()` with a SimBackend advances a
virtual clock by the cost model. Live: `run(driver=...)` hands each iteration to a driver
(harness/live/driver.py) that runs the real model; the model's MoE blocks call back `live_layer`,
the backend copies real weights (`load_expert` / `evict_expert`), each expert runs through
the driver's `run(expert, ready_estimate_ms) -> (wait_ms, end_ms)` (wait_ms: how long compute
waited for that expert's copy, the access's stall) and times come from the backend's real
clock (`now_ms`). Live routing must match the trace (recorded from the same greedy
generation, or replayed into the router); systems see the same LayerRouting either way.
"""

from __future__ import annotations

import time
from collections import deque

from core.blocks import BlockIndex
from core.schedule import Scheduler
from core.view import IterationInfo, LayerRouting, RequestInfo, SystemContext
from harness.sim.cache import ExpertCache
from harness.sim.recorder import ACC_COLS, DEMAND, HIT, LATE, MISS, PREFETCH, PRELOAD, Recorder
from systems.base import System


class EngineError(RuntimeError):
    """The run cannot proceed (e.g. a system refuses every victim while the cache is full)."""


class Engine:
    def __init__(self, model, backend, trace, system: System, capacity_bytes: int,
                 max_batch: int = 1, progress: bool = False):
        if trace.num_layers != model.num_moe_layers or trace.num_experts != model.num_experts:
            raise EngineError(f"trace shape (L={trace.num_layers}, E={trace.num_experts}) does "
                              f"not match model {model.name} (L={model.num_moe_layers}, "
                              f"E={model.num_experts})")
        self.model, self.backend, self.trace, self.system = model, backend, trace, system
        self.cache = ExpertCache(capacity_bytes, model.expert_bytes)
        if self.cache.capacity_slots < 1:
            raise EngineError(f"expert cache of {capacity_bytes} bytes holds no expert "
                              f"({model.expert_bytes} bytes each)")
        self.max_batch, self.progress = max_batch, progress
        self.E, self.L = model.num_experts, model.num_moe_layers
        self.n_keys = self.E * self.L
        self.rec = Recorder(model.expert_bytes)
        self.queue: deque[tuple[int, float]] = deque()  # (key, proposed_ms) prefetches
        self.copy_free_ms = 0.0
        self.copy_ms = backend.expert_copy_ms
        self.policy_s = 0.0
        # system.prefetch=false: propose_prefetch is never asked, the queue stays empty
        self._asks = bool(system.prefetch)
        self._wants_load = type(system).on_load is not System.on_load
        self._wants_evict = type(system).on_evict is not System.on_evict
        self._expert_ms_memo: dict[int, float] = {}  # tokens -> expert call ms
        # Real backends move weights; the simulator has no such hooks (None: no call).
        self._load_fn = getattr(backend, "load_expert", None)
        self._evict_fn = getattr(backend, "evict_expert", None)
        self._exec = None  # live: runs one expert, returns (wait_ms, end_ms)
        self._driver = None
        self._live_iter = None  # live: (IterationInfo, members) of the running iteration
        self.index = BlockIndex(trace)
        # Bind now, so a history-based system can use its context in warmup().
        t0 = time.perf_counter()
        system.bind(SystemContext(
            num_layers=self.L, num_experts=self.E, top_k=trace.top_k,
            expert_bytes=model.expert_bytes, capacity_slots=self.cache.capacity_slots,
            capacity_bytes=self.cache.capacity_bytes, max_batch=max_batch,
            moe_layer_stacks=tuple(trace.meta["moe_layer_stacks"]),
            trace_fields=tuple(f for f in ("weights", "probs", "spec_topk", "embeddings",
                                           "prompts") if f not in trace.missing_fields()),
            trace=trace if system.oracle else None))
        self.policy_s += time.perf_counter() - t0

    # ---- copy engine ------------------------------------------------------------------------
    def _load(self, key: int, kind: int, proposed: float, issue: float, start: float) -> bool:
        """Ask the system for a victim, evict it, reserve the slot, commit the copy."""
        cands = self.cache.candidates(issue)
        t0 = time.perf_counter()
        victim = self.system.choose_victim(cands, key, kind == DEMAND, issue)
        self.policy_s += time.perf_counter() - t0
        if victim is None:
            if self.cache.is_full():
                return False
        elif not self.cache.evictable(victim, issue):
            raise EngineError(f"system {self.system.name} chose victim {victim} for {key}, "
                              "which is not evictable (absent, pinned or in flight)")
        else:
            self.rec.evicted(self.cache.evict(victim, issue), issue)
            if self._evict_fn is not None:
                self._evict_fn(victim)
            if self._wants_evict:
                t0 = time.perf_counter()
                self.system.on_evict(victim, issue)
                self.policy_s += time.perf_counter() - t0
        ready = start + self.copy_ms
        self.cache.reserve(key, ready, self.rec.transfer(key, kind, proposed, issue, start, ready))
        if self._load_fn is not None:
            self._load_fn(key, kind)
        self.copy_free_ms = ready
        if self._wants_load:
            t0 = time.perf_counter()
            self.system.on_load(key, kind == DEMAND, issue)
            self.policy_s += time.perf_counter() - t0
        return True

    def _advance(self, t: float) -> None:
        """Start queued prefetches whose start time is <= t, in queue order."""
        q, ready_ms = self.queue, self.cache.ready_ms
        while q:
            key, proposed = q[0]
            start = self.copy_free_ms if self.copy_free_ms > proposed else proposed
            if start > t:
                return
            q.popleft()
            if key in ready_ms:
                continue
            if not self._load(key, PREFETCH, proposed, start, start):
                self.rec.prefetch_dropped += 1

    def _set_queue(self, proposal, now: float) -> None:
        if proposal is not None:
            ready_ms = self.cache.ready_ms
            if proposal and (min(proposal) < 0 or max(proposal) >= self.n_keys):
                bad = [k for k in proposal if not 0 <= k < self.n_keys][:5]
                raise EngineError(f"system {self.system.name} proposed invalid expert keys "
                                  f"{bad} (valid: 0..{self.n_keys - 1})")
            self.queue = deque([(k, now) for k in proposal if k not in ready_ms])

    def _demand(self, key: int, now: float) -> bool:
        start = self.copy_free_ms if self.copy_free_ms > now else now
        return self._load(key, DEMAND, now, now, start)

    # ---- main loop --------------------------------------------------------------------------
    def run(self, driver=None) -> Recorder:
        """Replay the trace; with a driver, run each iteration for real (docs/real-backend.md)."""
        tr, system = self.trace, self.system
        self._driver = driver
        if driver is not None and self.max_batch != 1:
            raise EngineError("live runs support max_batch = 1 only")
        now, index = self._preload(system.initial_residents()), 0  # serving starts after it
        sched = Scheduler(tr.arrival_ms, tr.output_len, self.max_batch)
        bar = _progress(tr.num_requests, system.name, self.progress)
        while not sched.done():
            nxt = sched.next_iteration(now)
            if nxt is None:
                now = max(now, sched.next_arrival_ms())
                continue
            kind, members = nxt
            if kind == "prefill":
                t0 = time.perf_counter()
                for r, _ in members:
                    system.on_request_start(self._request(r), now)
                self.policy_s += time.perf_counter() - t0
            now = self._iteration(index, kind, members, now)
            for r in sched.finish_iteration(members):
                t0 = time.perf_counter()
                system.on_request_end(self._request(r), now)
                self.policy_s += time.perf_counter() - t0
                self.cache.check_invariants()
                if bar is not None:
                    bar.update(1)
            index += 1
        if bar is not None:
            bar.close()
        self.rec.peak_cache_bytes = self.cache.peak_bytes
        return self.rec

    def _request(self, r: int) -> RequestInfo:
        tr = self.trace
        emb = None
        if tr.embeddings is not None and tr.has_embedding[r]:
            emb = tr.embeddings[r]
        prompt = tr.prompts[r] if tr.prompts is not None else None
        return RequestInfo(r, tr.request_ids[r], tr.datasets[r], tr.tasks[r],
                           int(tr.prompt_len[r]), int(tr.output_len[r]),
                           float(tr.arrival_ms[r]), emb, prompt)

    def _preload(self, keys) -> float:
        """Timed copies back to back from 0 (docs/engine.md, "Preloads"); the last ready ms."""
        keys = list(dict.fromkeys(int(k) for k in keys))
        if len(keys) > self.cache.capacity_slots:
            raise EngineError(f"system {self.system.name} preloads {len(keys)} experts; the "
                              f"cache holds {self.cache.capacity_slots}")
        for key in keys:
            if not 0 <= key < self.n_keys:
                raise EngineError(f"system {self.system.name} preloads invalid key {key}")
            t = self.copy_free_ms
            self.copy_free_ms = ready = t + self.copy_ms
            self.cache.reserve(key, ready, self.rec.transfer(key, PRELOAD, 0.0, t, t, ready))
            if self._load_fn is not None:
                self._load_fn(key, PRELOAD)
        return self.copy_free_ms

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
        for layer in self.model.layers:
            n, kv, pairs = stats[layer.stack]
            if n == 0:
                continue
            memo_key = (layer.stack, layer.dense_params)
            if memo_key not in dense_memo:
                dense_memo[memo_key] = self.backend.dense_ms(layer, n, kv, pairs)
            now += dense_memo[memo_key]
            if layer.moe_index >= 0:
                now = self._moe_layer(info, layer.moe_index, members, now)
        now += self.backend.iteration_ms(len(members))
        return self._end_iteration(info, members, start, now)

    def _end_iteration(self, info: IterationInfo, members, start: float, now: float) -> float:
        """Start due prefetches, record the iteration, tell the system, take its proposal."""
        self._advance(now)
        self.rec.iteration(info.index, info.kind, start, now, members)
        t0 = time.perf_counter()
        self.system.on_step_end(info, now)
        proposal = self.system.propose_prefetch(now) if self._asks else None
        self.policy_s += time.perf_counter() - t0
        self._set_queue(proposal, now)
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
        the shared step below, with `run(expert, ready_ms) -> (wait_ms, end_ms)` doing the
        real work. The caller has checked that live routing matches the trace block."""
        if self._live_iter is None:
            raise EngineError(f"MoE layer {layer} ran outside a live iteration")
        info, members = self._live_iter
        self._exec = run
        try:
            self._moe_layer(info, layer, members, self.backend.now_ms())
        finally:
            self._exec = None

    def trace_rows(self, layer: int):
        """Live: the trace's top-k ids [n_tokens, k] of the running iteration at `layer`."""
        info, members = self._live_iter
        r, s = members[0]
        return self.trace.block_rows(r, s, layer)

    def _moe_layer(self, info: IterationInfo, layer: int, members, now: float) -> float:
        if self.queue:
            self._advance(now)
        index = self.index
        if len(members) == 1:  # batch 1: the block's own union, precomputed
            r, s = members[0]
            b = (index.step_off[r] + s) * self.L + layer
            blocks = {r: b}
            b0, b1 = index.bounds[b], index.bounds[b + 1]
            experts, counts, owner = index.ids[b0:b1], index.cnts[b0:b1], None
        else:
            blocks = {r: index.block(r, s, layer) for r, s in members}
            experts, counts, owner = index.union(blocks)
        if not experts:
            return now
        t0 = time.perf_counter()
        self.system.on_layer_routed(LayerRouting(info, layer, experts, counts, index, blocks), now)
        proposal = self.system.propose_prefetch(now) if self._asks else None
        self.policy_s += time.perf_counter() - t0
        self._set_queue(proposal, now)
        cache, base = self.cache, layer * self.E
        ready_ms, in_use = cache.ready_ms, cache.in_use
        # Run order: ready residents (ascending id), in-flight by ready time, demand fetches.
        order, late, missing = [], None, None
        for e, c in zip(experts, counts):
            t = ready_ms.get(base + e)
            if t is None:
                if missing is None:
                    missing = []
                missing.append((e, c))
            elif t <= now:
                order.append((e, c, False))
            else:
                if late is None:
                    late = []
                late.append((t, e, c))
        run = self._exec
        if missing is None and late is None and not self.queue and run is None:
            # Every expert is ready and nothing can be copied meanwhile: run back to back.
            now = self._run_ready(experts, counts, base, owner, members[0][0], now)
            self.rec.block(info.index, layer)
            return now
        in_use.update([base + e for e, _, _ in order])
        if late:
            late.sort()
            order.extend((e, c, False) for _, e, c in late)
            in_use.update([base + e for _, e, _ in late])
        deferred = []
        if missing:
            for e, c in missing:
                if not deferred and self._demand(base + e, now):
                    in_use.add(base + e)
                    order.append((e, c, True))
                else:
                    deferred.append((e, c))
        # The layer's demand fetches are committed first; newly queued prefetches start behind.
        queue = self.queue
        if queue:
            self._advance(now)
        rec = self.rec
        acc, first_use = rec._acc, rec.tr_first_use
        transfer_of = cache.transfer_of
        memo = self._expert_ms_memo
        first_owner = members[0][0]
        # One access per expert, run one at a time on the compute stream.
        i, n = 0, len(order)
        while i < n or deferred:
            if i == n:
                self._unblock(deferred, order, base, now, layer)
                queue, n = self.queue, len(order)
                continue
            e, c, is_miss = order[i]
            i += 1
            key = base + e
            ready = ready_ms[key]
            if ready > now:
                start, cls = ready, (MISS if is_miss else LATE)
            else:
                start, cls = now, (MISS if is_miss else HIT)
            tid = transfer_of[key]
            if first_use[tid] < 0:
                first_use[tid] = len(acc) // ACC_COLS
            if run is None:
                dur = memo.get(c)
                if dur is None:
                    dur = memo[c] = self.backend.expert_ms(c)
                acc.extend((e, cls, tid, now, start, first_owner if owner is None else owner[e]))
                now = start + dur
            else:  # live: the backend waits for the copy, runs the expert, reads its clock
                wait_ms, end = run(e, start)
                start = now + wait_ms
                acc.extend((e, cls, tid, now, start, first_owner if owner is None else owner[e]))
                now = end
            if queue:
                self._advance(now)
            in_use.discard(key)
            if deferred:
                self._retry(deferred, order, base, now)
                n = len(order)
        rec.block(info.index, layer)
        return now

    def _run_ready(self, experts, counts, base, owner, first_owner, now) -> float:
        """All of a layer's experts are ready and the copy engine has no queue: every access
        is a hit and the experts run back to back (the common decode case, kept lean)."""
        acc, first_use = self.rec._acc, self.rec.tr_first_use
        transfer_of, memo = self.cache.transfer_of, self._expert_ms_memo
        for e, c in zip(experts, counts):
            tid = transfer_of[base + e]
            if first_use[tid] < 0:
                first_use[tid] = len(acc) // ACC_COLS
            dur = memo.get(c)
            if dur is None:
                dur = memo[c] = self.backend.expert_ms(c)
            acc.extend((e, HIT, tid, now, now, first_owner if owner is None else owner[e]))
            now += dur
        return now

    def _unblock(self, deferred, order, base: int, now: float, layer: int) -> None:
        """Every runnable expert has run and demand fetches still wait: ask the system again."""
        t0 = time.perf_counter()
        proposal = self.system.propose_prefetch(now) if self._asks else None
        self.policy_s += time.perf_counter() - t0
        self._set_queue(proposal, now)
        self._advance(now)
        if not self._retry(deferred, order, base, now):
            raise EngineError(
                f"system {self.system.name}: no victim for a demand fetch at layer {layer} "
                f"while the cache is full ({self.cache.capacity_slots} slots)")

    def _retry(self, deferred, order, base: int, now: float) -> bool:
        """Issue deferred demand fetches in order while room allows; True if any progressed."""
        progressed = False
        while deferred:
            e, c = deferred[0]
            key = base + e
            if key in self.cache.ready_ms:  # a queued prefetch brought it in meanwhile
                order.append((e, c, False))
            elif self._demand(key, now):
                order.append((e, c, True))
            else:
                break
            deferred.pop(0)
            self.cache.in_use.add(key)
            progressed = True
        return progressed


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
