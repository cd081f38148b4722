"""Several GPUs in whole runs: one GPU is the single-GPU engine, bytes conserve per link,
replication never adds host traffic, every bad key is refused (docs/gpus.md).

DeepSeek-V2-Lite: an expert is 3 x 2048 x 1408 bf16 = 17,301,504 bytes, a token's hidden
state 2048 x 2 = 4096 bytes; 26 MoE layers x 64 experts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.specs import SpecError
from harness.runner.assembly import assemble, build_engine
from harness.runner.config import compose_config
from harness.runner.run import execute
from harness.sim.recorder import MISS

EXPERT_BYTES, TOKEN_BYTES, L, E = 3 * 2048 * 1408 * 2, 2048 * 2, 26, 64
SMALL = ["workload.num_requests=6", "workload.prompt_len=24", "workload.output_len=8",
         "calibration_requests=8", "progress=false", "expert_cache_gb=1"]
PLACEMENTS = ("shard_expert", "shard_layer", "replicate_hot")


def engine_of(tmp_path, *overrides):
    run = assemble(compose_config([*SMALL, *overrides], run_name="t",
                                  results_dir=str(tmp_path)))
    engine = build_engine(run)
    for system in engine.systems:
        if system.needs_calibration():
            system.warmup(run.calibration)
    return run, engine


def several(n: int, placement: str) -> list[str]:
    return ["hardware/peer=pcie4_p2p", f"hardware.num_gpus={n}", f"placement={placement}"]


def same_tables(a: dict, b: dict) -> bool:
    return all(np.array_equal(np.asarray(a[t][c]), np.asarray(b[t][c]),
                              equal_nan=np.asarray(a[t][c]).dtype.kind == "f")
               for t in a for c in a[t])


@pytest.mark.parametrize("system", ["lru", "oracle", "fmoe", "moe_infinity", "layer_offload"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_one_gpu_with_any_placement_is_the_single_gpu_run(tmp_path, system, placement):
    _, alone = engine_of(tmp_path, f"system={system}")
    _, placed = engine_of(tmp_path, f"system={system}", f"placement={placement}")
    assert (alone.core, placed.core) == ("compiled", "python")
    assert same_tables(alone.run().tables(), placed.run().tables())
    assert placed.gpu_metrics()["num_gpus"] == 1


def test_one_gpu_with_a_placement_at_batch_4(tmp_path):
    _, alone = engine_of(tmp_path, "system=fmoe", "max_batch=4")
    _, placed = engine_of(tmp_path, "system=fmoe", "max_batch=4", "placement=shard_expert")
    assert same_tables(alone.run().tables(), placed.run().tables())


def remote_pairs(trace, gpu_of, n: int) -> int:
    """(token, expert) entries whose expert runs off the token's home GPU (request r % n),
    counted from the trace's top-k rows."""
    out = 0
    for r in range(trace.num_requests):
        for s in range(int(trace.output_len[r])):
            for layer in range(trace.num_layers):
                rows = trace.block_rows(r, s, layer)
                out += sum(gpu_of(layer, int(e)) != r % n for e in rows.ravel())
    return out


GPU_OF = {"shard_expert": lambda n: lambda layer, e: e * n // E,
          "shard_layer": lambda n: lambda layer, e: layer * n // L}


@pytest.mark.parametrize("system", ["lru", "oracle", "fmoe"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_bytes_are_conserved_per_link(tmp_path, system, placement):
    run, engine = engine_of(tmp_path, f"system={system}", *several(4, placement))
    tables = engine.run().tables()
    m, links = engine.gpu_metrics(), engine.group.links
    # every copy into a GPU came over its host link or a peer link
    assert m["host_link_bytes"] + m["peer_copy_bytes"] == len(tables["transfers"]["key"]) * \
        EXPERT_BYTES
    assert m["peer_copy_bytes"] == m["peer_fetches"] * EXPERT_BYTES
    # the peer links carried the peer copies and the all-to-all, nothing else
    assert sum(map(sum, links.bytes)) == m["peer_link_bytes"] == \
        m["peer_copy_bytes"] + m["a2a_bytes"]
    assert m["host_link_bytes"] > 0 and m["a2a_bytes"] > 0
    if placement in GPU_OF:  # every token sent out comes back: dispatch = combine
        assert m["peer_fetches"] == 0
        assert links.bytes == [list(col) for col in zip(*links.bytes)]
        pairs = remote_pairs(run.trace, GPU_OF[placement](4), 4)
        assert m["a2a_bytes"] == 2 * pairs * TOKEN_BYTES
    elif system != "oracle":  # the oracle's early plan loads found no peer copy in yet
        assert m["peer_fetches"] > 0  # the hot experts moved between GPUs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replication_never_adds_host_bytes_or_oracle_misses(tmp_path, seed):
    # On a peer link that joins every pair of GPUs (pcie4_p2p): any GPU's copy can serve
    # another. Under bridged pairs it need not hold: a GPU of another pair reads the host.
    rows = []
    for n in (1, 2, 4, 6):
        row = []
        for system in ("oracle", "lru"):
            _, engine = engine_of(tmp_path, f"system={system}", f"seed={seed}",
                                  *several(n, "replicate_hot"))
            acc = engine.run().tables()["accesses"]
            row += [engine.gpu_metrics()["host_link_bytes"],
                    int(np.sum(np.asarray(acc["class"]) == MISS))]
        rows.append(row)
    for before, after in zip(rows, rows[1:]):
        oracle_host, oracle_misses, lru_host, _ = after
        assert oracle_host <= before[0] and oracle_misses <= before[1]
        assert lru_host <= before[2]
    assert rows[-1][0] < rows[0][0]  # and six GPUs do load less than one


def test_a_run_records_its_gpu_metrics(tmp_path):
    cfg = compose_config([*SMALL, "system=lru", *several(2, "shard_expert")], run_name="t",
                         results_dir=str(tmp_path))
    result = execute(assemble(cfg))
    record = json.loads((result.run_dir / "result.json").read_text())
    assert record["metrics"]["num_gpus"] == 2
    assert record["metrics"]["a2a_bytes"] > 0
    assert record["config"]["hardware"]["peer"]["name"] == "pcie4_p2p"


PEER = "hardware/peer=pcie4_p2p"


@pytest.mark.parametrize("overrides,message", [
    (["+hardware.num_gpus=2", "placement=shard_expert"], r"num_gpus: 2 GPUs need a peer link"),
    ([PEER], r"placement: 2 GPUs need a placement"),
    (["hardware/peer=nvlink_3090_bridge", "hardware.num_gpus=3", "placement=shard_expert"],
     r"num_gpus: nvlink_3090_bridge joins GPUs in bridged pairs"),
    ([PEER, "hardware.num_gpus=0", "placement=shard_expert"], r"hardware\.num_gpus: must be"),
    ([PEER, "hardware.num_gpus=2.5", "placement=shard_expert"], r"num_gpus: expected an int"),
    ([PEER, "hardware.num_gpus=65", "placement=shard_expert"],
     r"placement: shard_expert .* 65 GPUs for 64 experts per layer"),
    ([PEER, "hardware.num_gpus=27", "placement=shard_layer"],
     r"placement: shard_layer .* 27 GPUs for 26 MoE layers"),
    ([PEER, "placement=replicate_hot", "placement.hot_cache_fraction=0"],
     r"placement\.hot_cache_fraction"),
    ([PEER, "placement=replicate_hot", "placement.hot_cache_fraction=1.5"],
     r"placement\.hot_cache_fraction"),
    ([PEER, "placement=shard_expert", "hardware.peer.peer_gbps=0"], r"hardware\.peer\.peer_gbps"),
    ([PEER, "placement=shard_expert", "hardware.peer.topology=ring"],
     r"hardware\.peer\.topology"),
    ([PEER, "placement=shard_expert", "+hardware.peer.lanes=16"], r"hardware\.peer: unknown"),
    ([PEER, "placement=shard_expert", "engine_core=compiled"], r"engine_core: 'compiled'"),
    ([PEER, "placement=shard_expert", "system=ktransformers", "hardware/host=ddr5_dual_channel"],
     r"hardware\.num_gpus: several GPUs with bounded host memory"),
], ids=["no-peer", "no-placement", "odd-pairs", "zero", "fraction", "expert-shards",
        "layer-shards", "hot-0", "hot-1.5", "peer-gbps", "topology", "peer-key", "compiled",
        "cpu-misses"])
def test_bad_gpu_inputs_are_refused_before_anything_is_written(tmp_path, overrides, message):
    cfg = compose_config([*SMALL, *overrides], run_name="t", results_dir=str(tmp_path))
    with pytest.raises(SpecError, match=message):
        build_engine(assemble(cfg))
    assert not any(tmp_path.iterdir())
