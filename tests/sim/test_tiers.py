"""Memory tiers and CPU-run misses: timelines worked by hand (docs/hardware.md)."""

from __future__ import annotations

import pytest
from helpers import FixedBackend, meta_for, tiny_model

from core.spec_base import GIB
from core.tier_specs import host_spec_from_dict, nvme_spec_from_dict
from core.trace import trace_from_routing
from core.view import SystemContext
from harness.sim.copies import EngineError
from harness.sim.engine import Engine
from harness.sim.recorder import CPU, DEMAND, HIT, MISS, PRELOAD
from harness.sim.tiers import NvmeLink, Tiers
from systems.base import System
from systems.miss_handlers.cpu import CpuMisses
from systems.on_demand import OnDemand

EXPERT_BYTES = 2 * 64 * 128 * 2  # tiny_model: 2 matrices, hidden 64, ffn 128, bf16 = 32768


def host(slots: int | None = None):
    """A host whose DRAM holds `slots` tiny experts (None: far more than any model here)."""
    dram = 1.0 if slots is None else slots * EXPERT_BYTES / GIB
    return host_spec_from_dict({"name": "h", "display_name": "h", "dram_gb": dram,
                                "reserve_gb": 0, "mem_gbps": 10, "cpu_tflops": 1,
                                "cpu_expert_overhead_us": 0})


def nvme(queue_depth: int = 1):
    """Round numbers for a tiny expert: latency 0.5 ms, a whole read 1 ms, a chunk
    (8192 B, a quarter expert) 0.25 ms."""
    return nvme_spec_from_dict({"name": "n", "display_name": "n", "capacity_gb": 1,
                                "read_gbps": EXPERT_BYTES / 1e6, "latency_us": 500,
                                "queue_depth": queue_depth, "chunk_mb": 8192 / 1e6})


# The link copies a whole expert in 2 ms (FixedBackend copy_ms=2), so a chunk in 0.5 ms.
LINK_GBPS = EXPERT_BYTES / 2e6


def test_nvme_reads_overlap_latency_not_bandwidth():
    # Three reads asked at 0; latency 0.5, 1 ms of bytes each, first chunk 0.25 after start.
    # Depth 2: r1 bytes 0.5..1.5; r2 begins at 0 too, its bytes wait for r1: 1.5..2.5;
    #   r3 waits for a slot (r1's, 1.5), latency to 2.0, bytes after r2: 2.5..3.5.
    two = NvmeLink(nvme(queue_depth=2), EXPERT_BYTES)
    assert [two.read(0.0) for _ in range(3)] == [(0.75, 1.5), (1.75, 2.5), (2.75, 3.5)]
    # Depth 1: each read waits for the one before: 0.5..1.5, 2.0..3.0, 3.5..4.5.
    one = NvmeLink(nvme(queue_depth=1), EXPERT_BYTES)
    assert [one.read(0.0) for _ in range(3)] == [(0.75, 1.5), (2.25, 3.0), (3.75, 4.5)]


def staged_run():
    """2 MoE layers, 4 experts, top-1, one request (prefill 1 token, one decode step);
    routing: iteration 0 -> expert 0 (layer 0), 3 (layer 1); iteration 1 -> 2, 3.
    Dense 1 ms, expert 1 ms, copy 2 ms, 8 GPU slots; host DRAM holds 2 experts (keys 0, 1
    at the start), host evictor lru."""
    model = tiny_model(layers=2, experts=4, top_k=1)
    req = {"id": "a", "prompt_len": 1, "output_len": 2, "arrival_ms": 0.0,
           "routing": [[[[0]], [[3]]], [[[2]], [[3]]]]}
    trace = trace_from_routing(meta_for(model), [req])
    engine = Engine(model, FixedBackend(copy_ms=2.0), trace, OnDemand(),
                    capacity_bytes=8 * model.expert_bytes,
                    tiers=Tiers(host(2), nvme(), None, LINK_GBPS))
    return engine, engine.run().tables()


def test_staged_nvme_fetch_by_hand():
    engine, t = staged_run()
    # it 0: dense L0 0..1. Key 0 is in DRAM: its copy takes the link 1..3; runs 3..4.
    #   Dense L1 4..5. Key 7 (layer 1, expert 3) is on NVMe: read asked at 5, bytes
    #   5.5..6.5, first chunk in DRAM at 5.75. DRAM is full: lru names key 1 (recency 1, 0,
    #   7: key 1 was never touched). The copy starts at 5.75 and ends at
    #   max(5.75 + 2, 6.5 + 0.5) = 7.75; expert 3 runs 7.75..8.75 (stall 2.75).
    # it 1: dense L0 8.75..9.75. Key 2 on NVMe: bytes 10.25..11.25, first chunk 10.5;
    #   lru names key 0 (recency 0, 7, 2); the copy runs 10.5..12.5 and expert 2
    #   12.5..13.5. Dense L1 13.5..14.5; key 7 is on the GPU: a hit 14.5..15.5.
    tr, acc = t["transfers"], t["accesses"]
    assert tr["key"].tolist() == [0, 7, 2]
    assert tr["kind"].tolist() == [DEMAND, DEMAND, DEMAND]
    assert tr["issue_ms"].tolist() == [1.0, 5.0, 9.75]
    assert tr["start_ms"].tolist() == [1.0, 5.75, 10.5]
    assert tr["ready_ms"].tolist() == [3.0, 7.75, 12.5]
    assert acc["class"].tolist() == [MISS, MISS, MISS, HIT]
    assert acc["start_ms"].tolist() == [3.0, 7.75, 12.5, 14.5]
    assert acc["stall_ms"].tolist() == [2.0, 2.75, 2.75, 0.0]
    m = engine.tier_metrics()
    assert (m["nvme_reads"], m["host_hits"], m["host_evictions"]) == (2, 1, 2)
    assert m["nvme_read_bytes"] == 2 * EXPERT_BYTES
    assert sorted(engine.tier.ready_ms) == [2, 7]


def test_copy_waits_for_the_last_chunk_when_the_link_is_faster():
    # A link that copies an expert in 0.5 ms (a chunk in 0.125) against a 1 ms read: the
    # copy of a key read at 0 starts with the first chunk (0.75) and ends after the last
    # chunk lands (1.5) and is copied: 1.625, not 0.75 + 0.5.
    model = tiny_model(layers=1, experts=4, top_k=1)
    tier = Tiers(host(1), nvme(), None, EXPERT_BYTES / 0.5e6).host_tier(model, _ctx(model))
    tier.ready_ms.clear()  # start with DRAM empty
    assert tier.copy_times(3, 0.0, 0.0, 0.5, True) == (0.75, 1.625)


def _ctx(model):
    return SystemContext(num_layers=model.num_moe_layers, num_experts=model.num_experts,
                         top_k=model.top_k, expert_bytes=model.expert_bytes, capacity_slots=8,
                         capacity_bytes=8 * model.expert_bytes, max_batch=1,
                         moe_layer_stacks=model.moe_layer_stacks, trace_fields=())


class CpuBackend(FixedBackend):
    """FixedBackend with a CPU: every CPU-run expert takes cpu_ms."""

    def __init__(self, cpu_ms: float, **kw):
        super().__init__(**kw)
        self.cpu_ms = cpu_ms

    def cpu_expert_ms(self, n_tokens):
        return self.cpu_ms


class PlacedOnCpu(System):
    """Expert 0 of layer 0 preloaded; every miss runs on the CPU."""

    name = "placed"
    miss_handler = CpuMisses()

    def initial_residents(self):
        return [0]


def test_cpu_run_miss_by_hand():
    # 1 MoE layer, 4 experts, top-2; prefill 1 token -> {0, 1}, decode -> {0, 2}.
    # Preload: key 0 copies 0..2; serving starts at 2.
    # it 0: dense 2..3. Expert 0 is a hit on the GPU 3..4; expert 1 runs on the CPU from the
    #   layer's start, 3..6. The GPU waits for it: its row needs 4, starts 6 (stall 2).
    # it 1: dense 6..7. Expert 0 hit 7..8; expert 2 on the CPU 7..10 (stall 2).
    model = tiny_model(layers=1, experts=4, top_k=2)
    trace = trace_from_routing(meta_for(model), [{
        "id": "a", "prompt_len": 1, "output_len": 2, "arrival_ms": 0.0,
        "routing": [[[[0, 1]]], [[[0, 2]]]]}])
    engine = Engine(model, CpuBackend(3.0, copy_ms=2.0), trace, PlacedOnCpu(),
                    capacity_bytes=8 * model.expert_bytes,
                    tiers=Tiers(host(), None, None, LINK_GBPS))
    t = engine.run().tables()
    acc, tr = t["accesses"], t["transfers"]
    assert tr["kind"].tolist() == [PRELOAD]
    assert acc["expert"].tolist() == [0, 1, 0, 2]
    assert acc["class"].tolist() == [HIT, CPU, HIT, CPU]
    assert acc["transfer_id"].tolist() == [0, -1, 0, -1]
    assert acc["need_ms"].tolist() == [3.0, 4.0, 7.0, 8.0]
    assert acc["start_ms"].tolist() == [3.0, 6.0, 7.0, 10.0]
    assert acc["stall_ms"].tolist() == [0.0, 2.0, 0.0, 2.0]
    assert t["tokens"]["time_ms"].tolist() == [6.0, 10.0]
    m = engine.tier_metrics()
    assert (m["cpu_runs"], m["cpu_busy_ms"], m["nvme_reads"]) == (2, 6.0, 0)


def test_tiers_need_the_python_core():
    model = tiny_model(layers=1, experts=4, top_k=1)
    trace = trace_from_routing(meta_for(model), [{
        "id": "a", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
        "routing": [[[[0]]]]}])
    with pytest.raises(EngineError, match="engine_core: 'compiled' has no memory tiers"):
        Engine(model, FixedBackend(), trace, OnDemand(), 8 * model.expert_bytes,
               core="compiled", tiers=Tiers(host(2), nvme(), None, LINK_GBPS))
