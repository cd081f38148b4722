"""The composed system (systems/composed.py): equivalences with the named systems it
re-expresses, the zoo's prefetchers with another evictor, the prefetch switch, nested
`_target_` checks, event forwarding and the frequency prefetcher's rule by hand.

Equivalences are checked through the runner on whole result tables: composed(lru, none) is
on_demand and composed(lru_per_layer, spec_next_layer) is lru, at batch 1, batch 4 and a
cache tighter than a prefill layer's experts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT

from core.specs import SpecError
from core.targets import build_target
from core.view import IterationInfo, SystemContext
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.parquet_io import read_tables
from harness.runner.run import execute, run_config
from harness.runner.run_types import Result
from harness.sim.recorder import PREFETCH
from systems.admission import Admission
from systems.base import System
from systems.composed import Composed
from systems.evictors.base import Evictor
from systems.prefetchers.base import Prefetcher
from systems.prefetchers.frequency import FrequencyPrefetch

BASE = ["experiment=table1", "workload.prompt_len=32", "workload.output_len=6",
        "calibration_requests=6", "progress=false"]
SETTINGS = {
    "b1": ["workload.num_requests=5", "expert_cache_gb=4"],
    "b4": ["workload.num_requests=8", "expert_cache_gb=4", "max_batch=4"],
    "tight": ["workload.num_requests=5", "expert_cache_gb=2"],
}
COMPOSED_AS = {
    "on_demand": ["system=composed", "system/evictor=lru", "system/prefetcher=none"],
    "lru": ["system=composed", "system/evictor=lru_per_layer",
            "system/prefetcher=spec_next_layer"],
}


def _run(tmp_path, overrides, name) -> Result:
    return execute(assemble(compose_config([*BASE, *overrides], run_name=name,
                                           results_dir=str(tmp_path))))


def _tables(run_dir: Path) -> dict:
    """{table: {column: raw bytes of its values}}: NaN (an expert never evicted) compares
    equal to NaN, unlike in a list of floats."""
    return {name: {c: np.ascontiguousarray(v).tobytes() for c, v in cols.items()}
            for name, cols in read_tables(Path(run_dir)).items()}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("named", sorted(COMPOSED_AS))
def test_composed_parts_reproduce_the_named_system(tmp_path, named, setting):
    ref = _run(tmp_path, [f"system={named}", *SETTINGS[setting]], f"{named}-{setting}")
    got = _run(tmp_path, [*COMPOSED_AS[named], *SETTINGS[setting]], f"c-{named}-{setting}")
    assert ref.status == got.status == "valid", (ref.reason, got.reason)
    assert got.system["name"] == "composed"
    assert got.metrics == ref.metrics
    a, b = _tables(ref.run_dir), _tables(got.run_dir)
    assert a == b
    # the settings make the comparison mean something: evictions happen, lru prefetches
    assert ref.metrics["misses"] > 0
    if named == "lru":
        kinds = pq.read_table(ref.run_dir / "transfers.parquet").column("kind")
        assert PREFETCH in kinds.to_pylist()


@pytest.mark.parametrize("prefetcher", ["fmoe_maps", "eamc", "predictor", "frequency"])
def test_history_prefetchers_run_with_the_global_lru_evictor(tmp_path, prefetcher):
    r = _run(tmp_path, ["system=composed", "system/evictor=lru",
                        f"system/prefetcher={prefetcher}", *SETTINGS["b1"]], prefetcher)
    assert r.status == "valid", r.reason
    assert r.metrics["prefetches_issued"] > 0
    assert r.system["prefetcher"]["name"] == prefetcher
    assert r.system["evictor"]["name"] == "lru"
    # the history-based ones were warmed from the calibration split
    assert (r.calibration_trace is not None) == (prefetcher != "frequency")


def test_prefetch_false_turns_the_composed_prefetcher_off(tmp_path):
    parts = ["system=composed", "system/evictor=lru_per_layer",
             "system/prefetcher=spec_next_layer", *SETTINGS["b1"]]
    on = _run(tmp_path, parts, "on")
    off = _run(tmp_path, [*parts, "system.prefetch=false"], "off")
    assert on.metrics["prefetches_issued"] > 0
    assert off.metrics["prefetches_issued"] == 0 and off.system["prefetch"] is False
    kinds = pq.read_table(off.run_dir / "transfers.parquet").column("kind").to_pylist()
    assert PREFETCH not in kinds
    # off equals the evictor alone: lru with its prefetch off
    ref = _run(tmp_path, ["system=lru", "system.prefetch=false", *SETTINGS["b1"]], "lru-off")
    assert off.metrics == ref.metrics


def test_the_documented_command_line_composes():
    cfg = compose_config(["system=composed", "system/evictor=lfu",
                          "system/prefetcher=spec_next_layer"])
    system = build_target(cfg["system"], "system", System)
    d = system.describe()
    assert d["evictor"]["name"] == "lfu" and d["prefetcher"]["name"] == "spec_next_layer"
    assert d["prefetcher"]["max_proposal"] is None and system.uses_fields == ("spec_topk",)


# ---- nested _target_ checks: refused once, under the full key --------------------------------

def _composed(**parts):
    node = {"_target_": "systems.composed.Composed",
            "evictor": {"_target_": "systems.evictors.lru.LRUEvictor"}}
    node.update(parts)
    return node


@pytest.mark.parametrize("part, node, message", [
    ("evictor", {"_target_": "os.system"},
     r"^system\.evictor\._target_: 'os\.system' is not a class of this project"),
    ("prefetcher", {"_target_": "builtins.eval"},
     r"^system\.prefetcher\._target_: 'builtins\.eval' is not a class of this project"),
    ("admission", {"_target_": "harness.runner.assembly.Path"},
     r"^system\.admission\._target_: 'harness\.runner\.assembly\.Path' is not a class"),
    ("evictor", {"_target_": "systems.prefetchers.none.NoPrefetch"},
     r"^system\.evictor\._target_: 'systems\.prefetchers\.none\.NoPrefetch' is not a Evictor$"),
    ("prefetcher", {"_target_": "systems.evictors.lru.LRUEvictor"},
     r"^system\.prefetcher\._target_: 'systems\.evictors\.lru\.LRUEvictor' is not a Prefetcher"),
    ("evictor", {"_target_": "systems.evictors.lru_per_layer.LRUPerLayer",
                 "slots_per_layer": 0},
     r"^system\.evictor\.slots_per_layer: must be an integer >= 1 or null \(auto\), got 0$"),
    ("prefetcher", {"_target_": "systems.prefetchers.spec_next_layer.SpecNextLayer",
                    "colour": 1},
     r"^system\.prefetcher: .*unexpected keyword argument 'colour'"),
    ("evictor", "lru", r"^system\.evictor: must be a config node with a _target_, got 'lru'$"),
])
def test_bad_nested_part_is_refused_naming_its_full_key(part, node, message):
    with pytest.raises(SpecError, match=message) as err:
        build_target(_composed(**{part: node}), "system", System)
    assert str(err.value).count("system.") == 1  # prefixed once, not wrapped twice


def test_bad_nested_part_reaches_the_runner_user_once(tmp_path):
    cfg = compose_config([*BASE, "system=composed", "system/evictor=lru_per_layer",
                          "system.evictor.slots_per_layer=100000", *SETTINGS["b1"]],
                         run_name="x", results_dir=str(tmp_path))
    with pytest.raises(SpecError, match=r"^system\.evictor\.slots_per_layer: must be an "
                                        r"integer in \[1, 64\] or null \(auto\), got 100000"):
        run_config(cfg)
    cfg = compose_config([*BASE, "system=composed", "system.evictor._target_=os.system",
                          *SETTINGS["b1"]], run_name="y", results_dir=str(tmp_path))
    with pytest.raises(SpecError, match=r"^system\.evictor\._target_: 'os\.system'"):
        run_config(cfg)
    assert not (tmp_path / "table1").exists()  # refused before any folder was made


# ---- event forwarding, by hand -----------------------------------------------------------------

class _Cands:
    def __init__(self, keys, full=True):
        self.keys, self.full = list(keys), full

    def __contains__(self, key):
        return key in self.keys

    def first_of(self, order):
        return next((k for k in order if k in self.keys), None)


class _LogEvictor(Evictor):
    name = "log"

    def __init__(self):
        self.log = []

    def on_access(self, iteration, layer, keys, now_ms):
        self.log.append(("access", layer, list(keys)))

    def on_insert(self, key, demand, now_ms):
        self.log.append(("insert", key, demand))

    def on_evict(self, key, now_ms):
        self.log.append(("evict", key))

    def choose_victim(self, candidates, incoming, demand, now_ms):
        return candidates.first_of(sorted(candidates.keys)) if candidates.full else None


class _LogPrefetcher(Prefetcher):
    name = "logp"

    def __init__(self):
        self.log = []

    def on_layer_routed(self, routing, now_ms):
        self.log.append(("routed", routing.layer))

    def propose(self, now_ms):
        return [7]

    def on_insert(self, key, demand, now_ms):
        self.log.append(("insert", key))

    def on_evict(self, key, now_ms):
        self.log.append(("evict", key))


class _OddOnly(Admission):
    name = "odd_only"

    def admit(self, incoming, victim, now_ms):
        return incoming % 2 == 1


class _Routing:
    def __init__(self, layer, experts):
        self.iteration = IterationInfo(0, "decode", ((0, 1),), 0.0)
        self.layer, self.experts, self.counts = layer, experts, [1] * len(experts)


def _ctx():
    return SystemContext(num_layers=2, num_experts=4, top_k=1, expert_bytes=1,
                         capacity_slots=3, capacity_bytes=3, max_batch=1,
                         moe_layer_stacks=("decoder", "decoder"), trace_fields=())


def test_events_are_forwarded_to_the_parts_and_admission_declines_prefetches():
    ev, pf = _LogEvictor(), _LogPrefetcher()
    s = Composed(evictor=ev, prefetcher=pf, admission=_OddOnly())
    s.bind(_ctx())
    s.on_layer_routed(_Routing(1, [0, 3]), 0.0)
    assert ev.log == [("access", 1, [4, 7])] and pf.log == [("routed", 1)]
    assert s.propose_prefetch(0.0) == [7]
    full = _Cands([2, 5])
    assert s.choose_victim(full, 6, True, 0.0) == 2  # demand: admission is not asked
    assert s.choose_victim(full, 6, False, 0.0) is None  # even key: declined
    assert s.choose_victim(full, 7, False, 0.0) == 2
    assert s.choose_victim(_Cands([2], full=False), 6, False, 0.0) is None  # a free slot
    assert ev.log == [("access", 1, [4, 7])]  # the queries changed nothing
    s.on_evict(2, 0.0)
    s.on_load(7, False, 0.0)
    assert ev.log[1:] == [("evict", 2), ("insert", 7, False)]
    assert pf.log[1:] == [("evict", 2), ("insert", 7)]
    d = s.describe()
    assert (d["evictor"], d["prefetcher"], d["admission"]) == (
        {"name": "log"}, {"name": "logp"}, {"name": "odd_only"})


def test_prefetch_off_leaves_the_prefetcher_without_events():
    ev, pf = _LogEvictor(), _LogPrefetcher()
    s = Composed(evictor=ev, prefetcher=pf, prefetch=False)
    s.bind(_ctx())
    s.on_layer_routed(_Routing(0, [1]), 0.0)
    s.on_load(1, True, 0.0)
    assert s.propose_prefetch(0.0) is None and pf.log == []
    assert ev.log == [("access", 0, [1]), ("insert", 1, True)]
    assert not s.needs_calibration()


def test_composed_without_an_evictor_is_refused():
    with pytest.raises(SpecError, match=r"^system\.evictor: a composed system needs"):
        build_target({"_target_": "systems.composed.Composed"}, "system", System)


# ---- frequency prefetcher by hand ---------------------------------------------------------------

def test_frequency_proposes_the_next_layers_most_counted_experts_ties_lowest_id():
    p = FrequencyPrefetch(max_proposal=2)
    p.bind(_ctx())
    p.on_layer_routed(_Routing(1, [2, 3]), 0.0)  # layer 1: {2: 1, 3: 1}
    assert p.propose(0.0) == []  # layer 0 (wrapped): nothing counted yet
    p.on_layer_routed(_Routing(0, [1]), 0.0)  # layer 0: {1: 1}
    assert p.propose(0.0) == [4 + 2, 4 + 3]  # tie 2 vs 3: the lower id first
    p.on_layer_routed(_Routing(1, [3]), 0.0)  # layer 1: {2: 1, 3: 2}
    p.on_layer_routed(_Routing(1, [0, 1, 2]), 0.0)  # layer 1: {0: 1, 1: 1, 2: 2, 3: 2}
    assert p.propose(0.0) == [1]  # next layer 0 holds only expert 1 so far
    p.on_layer_routed(_Routing(0, [0]), 0.0)
    assert p.propose(0.0) == [4 + 2, 4 + 3]
    assert np.array_equal(p.counts, [[1, 1, 0, 0], [1, 1, 2, 2]])


def test_table1_runs_exactly_the_named_systems_and_variants():
    """`make reproduce-table1` runs the suite's table1 experiment, whose sweep is
    system_names(): the eight named systems and the three named variants of seed systems
    (systems/variants.py), each its own row (written out here, independently of the config
    folder)."""
    import re

    from analysis.repro.experiments.table1 import EXPERIMENT
    from harness.runner.config import NOT_IN_TABLE1, TABLE1_GLOB, system_names

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"reproduce-table1:.*?\n\t\$\(MOEBENCH\) reproduce table1 ", makefile,
                     re.S)
    assert [s.overrides for s in EXPERIMENT.sweeps] == [(f"system={TABLE1_GLOB}",)] * 2
    excluded = re.search(r"glob\(\*,exclude=\[([^\]]*)\]\)", TABLE1_GLOB).group(1).split(",")
    assert sorted(excluded) == sorted(NOT_IN_TABLE1)
    assert system_names() == sorted(["no_offload", "on_demand", "layer_offload", "lru",
                                     "moe_infinity", "fmoe", "diff_moe", "oracle",
                                     "moe_infinity_hysteresis", "fmoe_admission",
                                     "diff_moe_floor_recency"])
