"""Memory tiers in whole runs: bytes conserved per tier, a monotone bound, clear errors.

Host and NVMe parts are given inline (not the conf/hardware/host|nvme profiles), so these
checks hold whatever the profiles say. DeepSeek-V2-Lite's expert is 3 x 2048 x 1408 bf16 =
17,301,504 bytes; 26 MoE layers x 64 experts = 1,664 experts.
"""

from __future__ import annotations

import pytest

from core.specs import SpecError
from harness.runner.assembly import assemble, build_engine
from harness.runner.config import compose_config
from harness.runner.run import execute

EXPERT_BYTES = 3 * 2048 * 1408 * 2
NVME = ("+hardware.nvme={name:n,display_name:n,capacity_gb:100,read_gbps:7,latency_us:80,"
        "queue_depth:4,chunk_mb:4}")
SMALL = ["workload.num_requests=3", "workload.prompt_len=24", "workload.output_len=6",
         "calibration_requests=4", "progress=false", "expert_cache_gb=2"]


def host(slots: int) -> str:
    """A host whose DRAM holds exactly `slots` DeepSeek-V2-Lite experts."""
    return ("+hardware.host={name:h,display_name:h,dram_gb:%r,reserve_gb:0,mem_gbps:80,"
            "cpu_tflops:2,cpu_expert_overhead_us:50}" % (slots * EXPERT_BYTES / 2**30))


def cfg_of(tmp_path, *overrides, name="t"):
    return compose_config([*SMALL, *overrides], run_name=name, results_dir=str(tmp_path))


@pytest.mark.parametrize("overrides", [
    ["system=lru"],
    ["system=fmoe", "system.store_capacity=12", "host_evictor=lfu"],
    ["system=composed", "system/miss_handler=cost_based", "host_evictor=fifo"],
], ids=["lru", "fmoe-lfu", "cost_based-fifo"])
def test_bytes_are_conserved_per_tier(tmp_path, overrides):
    run = assemble(cfg_of(tmp_path, host(600), NVME, *overrides))
    engine = build_engine(run)
    tables = engine.run().tables()
    m, tier = engine.tier_metrics(), engine.tier
    n_copies = len(tables["transfers"]["key"])
    # every expert that reached the GPU or the CPU was read from DRAM or from NVMe
    assert m["host_hits"] + m["nvme_reads"] == n_copies + m["cpu_runs"]
    assert m["nvme_read_bytes"] == m["nvme_reads"] * EXPERT_BYTES
    # DRAM: what started there, plus what NVMe reads kept, less what left, is what is there
    kept = m["nvme_reads"] - m["host_bypasses"]
    assert 600 + kept - m["host_evictions"] == len(tier.ready_ms) <= 600
    assert m["peak_host_expert_bytes"] <= 600 * EXPERT_BYTES
    assert m["nvme_reads"] > 0 and m["host_evictions"] > 0  # the tier was exercised


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_more_dram_never_adds_oracle_nvme_reads_or_demand_misses(tmp_path, seed):
    # The oracle's GPU decisions plan on the routing alone; its DRAM reads are what the GPU
    # fetches, served by an lru host (a stack algorithm: a larger DRAM holds a superset).
    rows = []
    for slots in (150, 500, 1000, 1600):
        cfg = cfg_of(tmp_path, host(slots), NVME, "system=oracle", f"seed={seed}",
                     name=f"o{seed}-{slots}")
        m = execute(assemble(cfg)).record()["metrics"]
        rows.append((m["nvme_reads"], m["demand_fetches"], m["misses"]))
    for smaller, larger in zip(rows, rows[1:]):
        assert larger[0] <= smaller[0] and larger[1] <= smaller[1] and larger[2] <= smaller[2]
    assert rows[0][0] > rows[-1][0]  # and DRAM does matter here


def test_unbounded_host_changes_nothing(tmp_path):
    # A host that holds every expert, with an NVMe tier that is then never read: the same
    # tables and metrics as the run without either.
    plain = execute(assemble(cfg_of(tmp_path, "system=lru", name="plain"))).record()
    tiered = execute(assemble(cfg_of(tmp_path, "system=lru", host(1664), NVME,
                                     name="tiered"))).record()
    assert tiered["metrics"] == plain["metrics"]


@pytest.mark.parametrize("overrides, message", [
    ([host(600)], r"hardware.host: the experts need 26.81 GiB and host DRAM leaves 9.67"),
    ([host(600), NVME.replace("capacity_gb:100", "capacity_gb:20")],
     r"hardware.nvme.capacity_gb: 20.0 GiB cannot hold the model's experts \(26.81 GiB\)"),
    (["+hardware.host={name:h,display_name:h,dram_gb:0.01,"
      "reserve_gb:0,mem_gbps:80,cpu_tflops:2,cpu_expert_overhead_us:50}", NVME],
     r"hardware.host: dram_gb - reserve_gb = 0.01 GiB holds no expert"),
    (["system=composed", "system/miss_handler=cpu"],
     r"system.miss_handler: cpu runs experts on the host CPU"),
    ([host(600), NVME, "+host_evictor={_target_:systems.evictors.belady.BeladyEvictor}"],
     r"host_evictor: belady plans on the GPU's"),
    ([host(600), NVME, "engine_core=compiled"], r"engine_core: 'compiled' has no memory tiers"),
    ([host(600).replace("reserve_gb:0", "reserve_gb:20")], r"hardware.host.reserve_gb: 20"),
    ([NVME.replace("queue_depth:4", "queue_depth:2.5"), host(600)],
     r"hardware.nvme.queue_depth: expected an integer, got 2.5"),
    ([NVME.replace("latency_us:80", "latency_us:80,iops:3")],
     r"hardware.nvme: unknown key\(s\) \['iops'\]"),
    ([host(600).replace("mem_gbps:80", "mem_gbps:-1")],
     r"hardware.host.mem_gbps: must be a finite positive number, got -1"),
    (["+host_evictor={_target_:systems.prefetchers.none.NoPrefetch}"],
     r"host_evictor._target_: 'systems.prefetchers.none.NoPrefetch' is not a Evictor"),
    (["+hardware.dequant_gparams_per_s={x:3}"],
     r"hardware.dequant_gparams_per_s: key 'x' must be a bit-width from 1 to 15"),
], ids=["no-nvme", "small-nvme", "tiny-host", "cpu-no-host", "belady-host", "compiled",
        "reserve", "queue-depth", "unknown-key", "negative", "host-evictor-target",
        "dequant-width"])
def test_bad_tier_inputs_are_refused_before_anything_is_written(tmp_path, overrides, message):
    cfg = cfg_of(tmp_path, *overrides)
    with pytest.raises((SpecError, RuntimeError), match=message):
        run = assemble(cfg)
        build_engine(run)
    assert not any(tmp_path.iterdir())


def _zoo_evictors() -> dict[str, bool]:
    """{zoo evictor yaml stem: whether it is clairvoyant} from conf/system/evictor."""
    import yaml

    from core.paths import CONF_DIR
    from core.targets import build_target
    from systems.evictors.base import Evictor

    out = {}
    for path in sorted((CONF_DIR / "system" / "evictor").glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        out[path.stem] = build_target(node, "evictor", Evictor).bound
    return out


def test_every_non_clairvoyant_zoo_evictor_is_a_host_evictor(tmp_path):
    from core.paths import CONF_DIR

    zoo = _zoo_evictors()
    offered = {p.stem for p in (CONF_DIR / "host_evictor").glob("*.yaml")}
    assert offered == {name for name, bound in zoo.items() if not bound}
    for name in sorted(offered):
        cfg = cfg_of(tmp_path, host(300), NVME, "system=lru", f"host_evictor={name}",
                     "workload.num_requests=1", name=name)
        m = execute(assemble(cfg)).record()["metrics"]
        assert m["host_evictions"] > 0, name


def _zoo(group: str) -> list[str]:
    from core.paths import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "system" / group).glob("*.yaml"))


@pytest.mark.parametrize("handler", ["cpu", "cost_based"])
def test_miss_handlers_combine_with_every_evictor_and_prefetcher(tmp_path, handler):
    # each evictor under no prefetch, each prefetcher under lru: valid runs, some experts on
    # the CPU, and the accesses still partition into hit / late / miss / cpu
    parts = ([f"system/evictor={e}" for e in _zoo("evictor")]
             + [f"system/prefetcher={p}" for p in _zoo("prefetcher")])
    for part in parts:
        cfg = cfg_of(tmp_path, host(2000), "system=composed", part,
                     f"system/miss_handler={handler}", "workload.num_requests=1",
                     name=f"{handler}-{part.split('=')[1]}")
        m = execute(assemble(cfg)).record()["metrics"]
        assert m is not None and m["cpu_runs"] > 0, part
        assert m["hits"] + m["late_prefetches"] + m["misses"] + m["cpu_runs"] == m["accesses"]
