"""Host DRAM over an NVMe drive: where an expert's bytes are before the host link copies them.

The contract is docs/hardware.md. In short:
- Host DRAM holds `host.expert_capacity_bytes // expert_bytes` experts; unbounded (no
  `hardware.host`, or every expert fits) it holds them all and nothing here costs time.
- Bounded, the lowest keys start in DRAM (layer 0 first), the rest on NVMe. A read of an
  expert that is not in DRAM goes to the NVMe link: it waits for one of `queue_depth` slots,
  its first byte arrives `latency_us` later, and the drive's bandwidth serves one read at a
  time (reads in flight overlap their latencies, not their bytes). Its slot in DRAM is
  reserved when the read is issued, evicting the victim the host evictor (a zoo evictor)
  names; with every DRAM expert busy (being read by a copy or the CPU) the read bypasses DRAM
  through a staging buffer and is not kept.
- A GPU copy of an expert read from NVMe is staged and pipelined: it starts once the link is
  free and the first `chunk_mb` is in DRAM, and ends no earlier than the last chunk's copy
  after the read (`copy_times`).

The host evictor sees what DRAM sees: each read of an expert from DRAM (for a GPU copy or a
CPU run) is an `on_access` of that key (with the running iteration and the key's layer), a
read from NVMe is then its `on_insert` (after `choose_victim` / `on_evict` when DRAM is
full), and `on_step_end` closes each iteration. It does not see the GPU's hits: DRAM is a
second level that serves the GPU's misses and prefetches (as a page cache serves reads).
A clairvoyant evictor (belady) plans on the GPU's routed stream, not on these reads, and is
refused here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from core.spec_base import GIB, SpecError
from harness.sim.copies import EngineError
from systems.evictors.lru import LRUEvictor


@dataclass
class Tiers:
    """A run's memory tiers as configured: the profile's `hardware.host` and `hardware.nvme`
    (HostSpec / NvmeSpec or None), the host evictor (a built zoo Evictor; None: lru) and the
    link's bandwidth (1e9 B/s). `check` refuses what cannot run (SpecError naming the key);
    `active` says whether the run needs the tiered step at all."""

    host: object
    nvme: object
    evictor: object
    link_gbps: float

    def bounded(self, model) -> bool:
        return (self.host is not None
                and self.host.expert_capacity_bytes < model.total_expert_bytes)

    def check(self, model, system) -> None:
        if self.evictor is not None and self.evictor.bound:
            raise SpecError(f"host_evictor: {self.evictor.name} plans on the GPU's routed "
                            "stream, not on the reads host DRAM serves; pick a non-clairvoyant "
                            "zoo evictor")
        handler = system.miss_handler
        if handler is not None and handler.runs_on_cpu and self.host is None:
            raise SpecError(f"system.miss_handler: {handler.name} runs experts on the host CPU, "
                            "whose cost model is hardware.host (pick hardware/host=...)")
        if not self.bounded(model):
            return
        host_gib = self.host.expert_capacity_bytes / GIB
        if self.host.expert_capacity_bytes < model.expert_bytes:
            raise SpecError(f"hardware.host: dram_gb - reserve_gb = {host_gib:.2f} GiB holds "
                            f"no expert ({model.expert_bytes} bytes each)")
        need = model.total_expert_bytes / GIB
        if self.nvme is None:
            raise SpecError(f"hardware.host: the experts need {need:.2f} GiB and host DRAM "
                            f"leaves {host_gib:.2f} GiB; give an NVMe tier for the rest "
                            "(hardware/nvme=...) or more hardware.host.dram_gb")
        if self.nvme.capacity_bytes < model.total_expert_bytes:
            raise SpecError(f"hardware.nvme.capacity_gb: {self.nvme.capacity_gb} GiB cannot "
                            f"hold the model's experts ({need:.2f} GiB)")

    def active(self, system, model) -> bool:
        handler = system.miss_handler
        self.check(model, system)
        return (handler is not None and handler.runs_on_cpu) or self.bounded(model)

    def host_tier(self, model, ctx) -> HostTier:
        """The run's DRAM tier (inputs as `check` accepts them)."""
        evictor = self.evictor
        if evictor is None:
            evictor = LRUEvictor()
        return HostTier(self.host, self.nvme if self.bounded(model) else None,
                        model.expert_bytes, ctx.total_experts, evictor, ctx, self.link_gbps)


class NvmeLink:
    """The drive's queue slots and bandwidth; `read(t)` -> (first chunk ms, last byte ms)."""

    def __init__(self, nvme, expert_bytes: int):
        self.latency_ms = nvme.latency_us / 1e3
        self.read_ms = expert_bytes / (nvme.read_gbps * 1e6)
        self.chunk_ms = min(nvme.chunk_mb * 1e6, expert_bytes) / (nvme.read_gbps * 1e6)
        self.slots = [0.0] * nvme.queue_depth  # a heap of the times each slot frees
        self.bandwidth_free_ms = 0.0

    def read(self, t: float) -> tuple[float, float]:
        begin = max(t, self.slots[0])
        xfer = max(begin + self.latency_ms, self.bandwidth_free_ms)
        end = xfer + self.read_ms
        self.bandwidth_free_ms = end
        heapq.heapreplace(self.slots, end)
        return xfer + self.chunk_ms, end


class HostCandidates:
    """The DRAM experts evictable at one instant, as the GPU cache's view offers them."""

    __slots__ = ("tier", "now_ms", "full")

    def __init__(self, tier: HostTier, now_ms: float):
        self.tier, self.now_ms, self.full = tier, now_ms, True

    def __contains__(self, key: int) -> bool:
        return self.tier.evictable(key, self.now_ms)

    def first_of(self, keys) -> int | None:
        for key in keys:
            if self.tier.evictable(key, self.now_ms):
                return key
        return None

    def __iter__(self):
        tier, now = self.tier, self.now_ms
        return iter(sorted(k for k in tier.ready_ms if tier.evictable(k, now)))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class HostTier:
    """Built by Tiers.host_tier from inputs Tiers.check accepted: bounded, DRAM holds at
    least one expert and an NVMe tier holds the rest."""

    def __init__(self, host, nvme, expert_bytes: int, n_keys: int, evictor, ctx, link_gbps):
        self.expert_bytes, self.num_experts = expert_bytes, ctx.num_experts
        self.info = None  # the running iteration (IterationInfo), set by the layer step
        room = n_keys if host is None else host.expert_capacity_bytes // expert_bytes
        self.capacity_slots = min(n_keys, room)
        self.bounded = self.capacity_slots < n_keys
        self.evictor = evictor if self.bounded else None
        self.reads = self.hits = self.evictions = self.bypasses = 0
        self.ready_ms: dict[int, float] = {}  # key -> ms its bytes are in DRAM
        self.busy_ms: dict[int, float] = {}  # key -> end of the last copy or CPU run of it
        self.peak_slots = 0
        self.link_chunk_ms = 0.0
        if not self.bounded:
            return
        self.nvme = NvmeLink(nvme, expert_bytes)
        self.link_chunk_ms = min(nvme.chunk_mb * 1e6, expert_bytes) / (link_gbps * 1e6)
        self.ready_ms = dict.fromkeys(range(self.capacity_slots), 0.0)
        self.peak_slots = self.capacity_slots
        self.evictor.bind(replace(ctx, capacity_slots=self.capacity_slots,
                                  capacity_bytes=self.capacity_slots * expert_bytes))
        for key in self.ready_ms:
            self.evictor.on_insert(key, False, 0.0)
        self._view = HostCandidates(self, 0.0)

    # ---- what the engine asks -----------------------------------------------------------
    def evictable(self, key: int, now: float) -> bool:
        t = self.ready_ms.get(key)
        return t is not None and t <= now and self.busy_ms.get(key, 0.0) <= now

    def stage(self, key: int, t: float, demand: bool) -> tuple[float, float]:
        """Expert `key` is wanted from DRAM at `t`: (first chunk ms, whole expert ms) in DRAM,
        reading it from NVMe if it is not there."""
        if not self.bounded:
            return t, t
        self.evictor.on_access(self.info, key // self.num_experts, [key], t)
        ready = self.ready_ms.get(key)
        if ready is not None:
            self.hits += 1
            ready = ready if ready > t else t
            return ready, ready
        self.reads += 1
        first, landed = self.nvme.read(t)
        if len(self.ready_ms) >= self.capacity_slots and not self._make_room(key, demand, t):
            self.bypasses += 1
            return first, landed
        self.ready_ms[key] = landed
        self.peak_slots = max(self.peak_slots, len(self.ready_ms))
        self.evictor.on_insert(key, demand, t)
        return first, landed

    def copy_times(self, key: int, issue: float, start: float, copy_ms: float, demand: bool):
        """(start, ready) of a GPU copy of `key` issued at `issue` on a link free at `start`:
        staged through DRAM and pipelined by chunks."""
        first, landed = self.stage(key, issue, demand)
        if first > start:
            start = first
        # the last chunk leaves after it lands (later than start + copy_ms only while the
        # read is still streaming when the copy starts)
        ready = max(start + copy_ms, landed + self.link_chunk_ms)
        self.hold(key, ready)
        return start, ready

    def hold(self, key: int, until: float) -> None:
        """`key` is being read from DRAM until `until` (not evictable before)."""
        if self.bounded and self.busy_ms.get(key, 0.0) < until:
            self.busy_ms[key] = until

    def _make_room(self, incoming: int, demand: bool, t: float) -> bool:
        view = self._view
        view.now_ms = t
        victim = self.evictor.choose_victim(view, incoming, demand, t)
        if victim is None or not self.evictable(victim, t):
            if victim is not None:
                raise EngineError(f"host_evictor {self.evictor.name} named {victim}, which is "
                                  "not an evictable expert in host DRAM")
            return False
        del self.ready_ms[victim]
        self.busy_ms.pop(victim, None)
        self.evictions += 1
        self.evictor.on_evict(victim, t)
        return True

    # ---- what the engine forwards to the host evictor ---------------------------------------
    def on_routed(self, info) -> None:
        """The running iteration (the one a DRAM read belongs to)."""
        self.info = info

    def on_step_end(self, info, now: float) -> None:
        if self.bounded:
            self.evictor.on_step_end(info, now)

    def summary(self) -> dict:
        """Metrics of the DRAM tier (bytes conserve: nvme_read_bytes = nvme_reads x expert)."""
        return {"host_slots": self.capacity_slots if self.bounded else None,
                "nvme_reads": self.reads, "nvme_read_bytes": self.reads * self.expert_bytes,
                "host_hits": self.hits, "host_evictions": self.evictions,
                "host_bypasses": self.bypasses,
                "peak_host_expert_bytes": self.peak_slots * self.expert_bytes}
