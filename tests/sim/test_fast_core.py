"""The compiled engine core against its pure-Python reference (harness/sim/cores.py).

Every system of conf/system (and a few composed pairs) runs on both cores over several
traces: batch 1, a static batch of 8, online Poisson arrivals with continuous batching, a
cache tighter than a prefill layer (deferred demand fetches), and an encoder-decoder model.
The accesses, transfers and tokens tables must be identical, column by column and dtype by
dtype, and so must what the system reports of itself. Skips when the core is not built.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import with_variants

from harness.runner.assembly import assemble, build_engine
from harness.runner.config import compose_config, system_names
from harness.sim import cores
from harness.sim.copies import EngineError

pytestmark = pytest.mark.skipif(not cores.compiled_available(),
                                reason=f"compiled core not built: {cores.COMPILED_ERROR}")

BASE = ["experiment=table1", "workload.prompt_len=40", "workload.output_len=6",
        "calibration_requests=6", "progress=false", "trace_cache_dir=null"]
SETTINGS = {
    "b1": ["workload.num_requests=6", "expert_cache_gb=4"],
    "b8": ["workload.num_requests=10", "expert_cache_gb=4", "max_batch=8"],
    "online": ["workload.num_requests=12", "expert_cache_gb=4", "max_batch=8",
               "arrivals=poisson", "workload.arrivals.rate_rps=5"],
    "tight": ["workload.num_requests=5", "expert_cache_gb=1.2"],
    "switch": ["workload.num_requests=5", "model=switch_base_128", "expert_cache_gb=0.5"],
}
COMPOSED = [["system/evictor=lfu", "system/prefetcher=predictor"],
            ["system/evictor=fifo", "system/prefetcher=eamc"],
            ["system/evictor=belady", "system/prefetcher=spec_next_layer"],
            ["system/evictor=lifo_inactive", "system/prefetcher=fmoe_maps"]]
SEED_KNOBS = {"moe_infinity": ["system.eamc_capacity=5"], "fmoe": ["system.store_capacity=6"]}
PER_SYSTEM = with_variants(SEED_KNOBS)
TIMING_FREE = {"oracle", "belady", "belady_bypass", "belady_lookahead"}  # need a fixed schedule


def run(overrides: list[str], core: str):
    r = assemble(compose_config(BASE + overrides), all_fields=True)
    r = replace(r, engine=replace(r.engine, core=core))
    system = r.system
    engine = build_engine(r)
    assert engine.core == core
    if r.calibration is not None:
        system.warmup(r.calibration)
    try:
        rec = engine.run()
    except EngineError as exc:  # both cores must fail alike
        return {"error": str(exc)}
    return {"tables": rec.tables(), "describe": system.describe(),
            "dropped": rec.prefetch_dropped, "peak": engine.cache.peak_bytes}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    if "error" in a:
        assert a == b
        return
    assert (a["describe"], a["dropped"], a["peak"]) == (b["describe"], b["dropped"], b["peak"])
    for name, table in a["tables"].items():
        other = b["tables"][name]
        assert list(table) == list(other), name
        for col, values in table.items():
            assert values.dtype == other[col].dtype, (name, col)
            np.testing.assert_array_equal(values, other[col], err_msg=f"{name}.{col}")


CASES = [(s, k) for s in system_names() for k in SETTINGS
         if not (s in TIMING_FREE and k == "online")]


@pytest.mark.parametrize(("system", "setting"), CASES)
def test_cores_give_identical_tables(system, setting):
    overrides = [f"system={system}", *SETTINGS[setting], *PER_SYSTEM.get(system, [])]
    assert_same(run(overrides, "python"), run(overrides, "compiled"))


@pytest.mark.parametrize("parts", COMPOSED, ids=lambda p: "+".join(x.split("=")[1] for x in p))
@pytest.mark.parametrize("setting", ["b1", "b8", "tight"])
def test_composed_pairs_identical(parts, setting):
    overrides = ["system=composed", *parts, *SETTINGS[setting]]
    assert_same(run(overrides, "python"), run(overrides, "compiled"))


def test_errors_and_choice():
    with pytest.raises(EngineError, match="engine_core: must be one of"):
        cores.resolve("fast", object())

    class Moves:
        def load_expert(self, key, kind):
            pass

    assert cores.resolve("auto", Moves()) == "python"
    with pytest.raises(EngineError, match="replays traces only"):
        cores.resolve("compiled", Moves())


def test_recorder_hands_its_columns_to_the_tables():
    """The stored tables own the recorded values (fast_column.h release): they outlive the
    recorder, keep their dtypes and stay writable; a column never written is empty."""
    import gc

    from harness.sim.fast_state import FastRecorder

    rec = FastRecorder(100)
    rec.reserve(4, 2)
    for row in ((3, 0, -1, 1.0, 1.5, 7), (5, 1, 0, 2.0, 2.5, 7), (9, 2, -1, 3.0, 3.5, 8)):
        rec.add_access(row)
        if row[0] == 5:
            rec.block(0, 0)  # accesses 0 and 1
    rec.block(1, 2)  # access 2
    stored = rec.stored_tables()
    assert rec.stored_tables() is stored
    del rec
    gc.collect()
    acc = stored["accesses"]
    assert acc["expert"].tolist() == [3, 5, 9] and acc["expert"].dtype == np.int32
    assert acc["class"].tolist() == [0, 1, 2] and acc["class"].dtype == np.int8
    assert acc["need_ms"].tolist() == [1.0, 2.0, 3.0] and acc["need_ms"].dtype == np.float64
    assert acc["request"].tolist() == [7, 7, 8]
    assert acc["iteration"].tolist() == [0, 0, 1] and acc["layer"].tolist() == [0, 0, 2]
    acc["start_ms"][0] = 9.0  # writable, as arrays the tables build
    assert acc["start_ms"].tolist() == [9.0, 2.5, 3.5]
    tr = stored["transfers"]
    assert len(tr["key"]) == 0 and tr["key"].dtype == np.int64
