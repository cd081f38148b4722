"""Several GPUs: a peer fetch and an all-to-all step worked by hand (docs/gpus.md)."""

from __future__ import annotations

import pytest
from helpers import FixedBackend, meta_for, tiny_model

from core.gpu_specs import peer_spec_from_dict
from core.trace import trace_from_routing
from harness.sim.engine import Engine
from harness.sim.gpus import Gpus, PeerLinks
from harness.sim.recorder import DEMAND, MISS
from systems.on_demand import OnDemand
from systems.placements.base import Placement
from systems.placements.shard_expert import ShardExpert

# tiny_model: an expert is 2 x 64 x 128 bf16 = 32768 B; a token's hidden state 64 x 2 = 128 B.
EXPERT_BYTES, TOKEN_BYTES = 32768, 128
# A peer link that moves an expert in 1 ms after 0.5 ms of latency: 1.5 ms per expert,
# 0.5 + 128 / 32768 = 0.50390625 ms per one-token message (exact in binary).
PEER = peer_spec_from_dict({"name": "p", "display_name": "p", "peer_gbps": EXPERT_BYTES / 1e6,
                            "peer_latency_us": 500, "topology": "all"}, "hardware.peer")
MESSAGE_MS = 0.5 + TOKEN_BYTES / EXPERT_BYTES


class EverywhereAll(Placement):
    """Every expert may live on every GPU and runs on the token's own GPU."""

    name = "everywhere"

    def owners_of(self, layer, expert, num_gpus, num_layers, num_experts):
        return tuple(range(num_gpus))


def engine(routings, placement, num_gpus=2, layers=1, top_k=1):
    """One request per routing (prompt 1, output 1: one prefill iteration each), all arriving
    at 0 and run one at a time; dense 1 ms, expert 1 ms, host copy 2 ms; on_demand on each
    GPU (no preload, no prefetch)."""
    model = tiny_model(layers=layers, experts=4, top_k=top_k)
    reqs = [{"id": f"r{i}", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
             "routing": [routing]} for i, routing in enumerate(routings)]
    trace = trace_from_routing(meta_for(model), reqs)
    gpus = Gpus(num_gpus, PEER, placement, host_gbps=1.0, host_latency_us=0.0,
                make_system=OnDemand)
    return Engine(model, FixedBackend(copy_ms=2.0), trace, OnDemand(),
                  capacity_bytes=4 * EXPERT_BYTES, gpus=gpus)


def test_a_miss_comes_from_the_peer_that_holds_it():
    # r0 (GPU 0): dense 0..1; expert 0 is nowhere: host copy on GPU 0's link 1..3, runs 3..4.
    # r1 (GPU 1): dense 4..5; expert 0 is on GPU 0 since 3: peer copy 5..6.5 (0.5 latency +
    #   1 ms of bytes), runs 6.5..7.5. GPU 1's host link is never used.
    e = engine([[[0]], [[0]]], EverywhereAll())
    t = e.run().tables()
    tr, acc = t["transfers"], t["accesses"]
    assert tr["key"].tolist() == [0, 0]
    assert tr["kind"].tolist() == [DEMAND, DEMAND]
    assert tr["start_ms"].tolist() == [1.0, 5.0]
    assert tr["ready_ms"].tolist() == [3.0, 6.5]
    assert acc["class"].tolist() == [MISS, MISS]
    assert acc["stall_ms"].tolist() == [2.0, 1.5]
    assert t["tokens"]["time_ms"].tolist() == [4.0, 7.5]
    m = e.gpu_metrics()
    assert (m["host_link_bytes"], m["peer_fetches"], m["peer_copy_bytes"]) == \
        (EXPERT_BYTES, 1, EXPERT_BYTES)
    assert (m["a2a_bytes"], m["peer_link_bytes"]) == (0, EXPERT_BYTES)
    assert [cp.host_copies for cp in e.group.gpu_copies] == [1, 0]


def test_an_all_to_all_step_by_hand():
    # shard_expert on 2 GPUs, 4 experts: 0, 1 on GPU 0; 2, 3 on GPU 1. r0 (home GPU 0)
    # routes its token to experts 1 and 2. Dense 0..1; the token leaves for GPU 1 at 1 and
    # arrives at 1 + MESSAGE_MS. GPU 0: expert 1 from its host link 1..3, runs 3..4.
    # GPU 1: expert 2 from its own host link from the token's arrival, 2 ms, then runs 1 ms;
    # its output leaves at once and is back on GPU 0 one message later: the layer ends there.
    e = engine([[[1, 2]]], ShardExpert(), top_k=2)
    t = e.run().tables()
    arrive = 1.0 + MESSAGE_MS
    tr, acc = t["transfers"], t["accesses"]
    assert tr["key"].tolist() == [1, 2]
    assert tr["start_ms"].tolist() == [1.0, arrive]
    assert tr["ready_ms"].tolist() == [3.0, arrive + 2.0]
    assert acc["expert"].tolist() == [1, 2]
    assert acc["need_ms"].tolist() == [1.0, arrive]
    assert acc["start_ms"].tolist() == [3.0, arrive + 2.0]
    assert t["tokens"]["time_ms"].tolist() == [arrive + 3.0 + MESSAGE_MS]
    m = e.gpu_metrics()
    assert m["a2a_bytes"] == 2 * TOKEN_BYTES and m["peer_messages"] == 2
    assert m["host_link_bytes"] == 2 * EXPERT_BYTES and m["peer_fetches"] == 0
    assert e.group.links.bytes == [[0, TOKEN_BYTES], [TOKEN_BYTES, 0]]


def test_ports_serialise_messages_that_share_a_side():
    # Two messages from GPU 0 at 0: the second waits for the first's send side; a third to
    # GPU 0 from GPU 2 meanwhile uses other sides and overlaps.
    links = PeerLinks(PEER, 3, host_gbps=1.0, host_latency_us=0.0)
    assert links.send(0, 1, EXPERT_BYTES, 0.0) == (0.0, 1.5)
    assert links.send(0, 2, EXPERT_BYTES, 0.0) == (1.5, 3.0)
    assert links.send(2, 0, EXPERT_BYTES, 0.0) == (0.0, 1.5)


def test_unbridged_pairs_go_through_host_memory():
    # pairs: 0-1 and 2-3 bridged; 1 -> 2 crosses host memory at the host link's rate with
    # two copies' latency (host 0.032768 GB/s = 1 ms per expert, latency 100 us each).
    pairs = peer_spec_from_dict({**PEER.__dict__, "topology": "pairs"}, "hardware.peer")
    links = PeerLinks(pairs, 4, host_gbps=EXPERT_BYTES / 1e6, host_latency_us=100.0)
    assert links.send(0, 1, EXPERT_BYTES, 0.0) == (0.0, 1.5)
    assert links.send(1, 2, EXPERT_BYTES, 0.0) == pytest.approx((0.0, 1.2))
    assert links.direct(2, 3) and not links.direct(1, 2)


def test_a_gpus_share_of_the_access_sequence_keeps_every_block():
    # Two requests (GPU 0 and GPU 1 under r % 2), one token each, 2 layers, 4 experts,
    # shard_expert: experts 0, 1 on GPU 0, 2, 3 on GPU 1. Sequence (it, layer): keys
    # (0,0): 0 2 | (0,1): 4 5 | (1,0): 0 1 | (1,1): 6 7. GPU 1 keeps 2 | - | - | 6 7.
    from core.access import access_sequence
    from harness.sim.gpus import GpuAccesses

    model = tiny_model(layers=2, experts=4, top_k=2)
    reqs = [{"id": "a", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
             "routing": [[[[0, 2]], [[1, 0]]]]},
            {"id": "b", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
             "routing": [[[[1, 0]], [[2, 3]]]]}]
    trace = trace_from_routing(meta_for(model), reqs)
    placement = ShardExpert()
    placement.bind(2, 2, 4, capacity_slots=4)
    full = access_sequence(trace, 1)
    assert full.keys == [0, 2, 4, 5, 0, 1, 6, 7]
    mine = access_sequence(trace, 1, GpuAccesses(placement, trace, 1, 1))
    assert mine.keys == [2, 6, 7]
    assert mine.block_starts == [0, 1, 1, 1, 3]  # four blocks, two of them empty here
    assert mine.block_at(1, 1) == 3 and mine.block_keys(3) == [6, 7]


def test_an_oracle_on_each_gpu_plans_its_own_accesses():
    # Four one-token requests (experts 0, 1, 0, 2) on experts every GPU may hold, an oracle
    # on each GPU: GPU 0 runs requests 0 and 2 (expert 0), GPU 1 requests 1 and 3 (experts
    # 1, 2); each plan preloads what its GPU runs and nothing else.
    from systems.oracle.system import Oracle

    model = tiny_model(layers=1, experts=4, top_k=1)
    reqs = [{"id": f"r{i}", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
             "routing": [[[e]]]} for i, e in enumerate((0, 1, 0, 2))]
    trace = trace_from_routing(meta_for(model), reqs)
    gpus = Gpus(2, PEER, EverywhereAll(), host_gbps=1.0, host_latency_us=0.0,
                make_system=Oracle)
    e = Engine(model, FixedBackend(copy_ms=2.0), trace, Oracle(),
               capacity_bytes=4 * EXPERT_BYTES, gpus=gpus)
    e.run()
    assert [s.preload for s in e.group.systems] == [[0], [1, 2]]
    assert [sorted(c.ready_ms) for c in e.group.caches] == [[0], [1, 2]]
