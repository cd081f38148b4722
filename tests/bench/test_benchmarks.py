"""The benchmark commands run end to end on tiny settings (their figures are not asserted:
speed targets are checked by the commands' printed figures, not by tests)."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from core.specs import model_spec_from_dict
from harness.bench import behaviour as bench_behaviour
from harness.bench import policies as bench_policies
from harness.runner.config import compose_config


def test_bench_behaviour_tiny(tmp_path, capsys):
    rc = bench_behaviour.main(["--requests", "4", "--batches", "1,2",
                               "--results-dir", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith("bench-behaviour: SIMULATED, synthetic routing")
    runs = json.loads(out.strip().splitlines()[-1])
    assert runs["simulated"] and runs["synthetic_routing"]
    assert set(runs["runs"]) == {f"{s}_b{b}" for s in bench_behaviour.SYSTEMS for b in (1, 2)}
    for m in runs["runs"].values():
        assert 0 <= m["misses"] <= m["accesses"] and m["tokens_per_s"] > 0
    assert (tmp_path / "bench_behaviour" / "moe_infinity_b2" / "result.json").exists()


def test_bench_policies_parts_run():
    model = model_spec_from_dict(compose_config(["experiment=table1"])["model"], "model")
    rng = np.random.default_rng(0)
    full_us, match_us, step_us = bench_policies.bench_eamc(model, 20, rng)
    assert min(full_us, match_us, step_us) > 0
    assert bench_policies.bench_fmoe(model, 20, rng) > 0


def test_reference_lru_hand_walked():
    from harness.bench.reference_lru import replay

    # One layer, quota 2, two slots. Prefill loads 0 and 1; decode: 2 evicts 0 (the least
    # recent), then 0 evicts 1; then 2 hits.
    stream = [(0, [0, 1], 1), (0, [2], 0), (0, [0], 0), (0, [2], 0)]
    assert replay(stream, 1, 2, 2) == {"hits_decode": 1, "misses_decode": 2,
                                       "hits_prefill": 0, "misses_prefill": 2}
    # Two layers, quota 1, two slots: a 2-expert block keeps both (0 is in use, a slot is
    # free); layer 1 then finds the cache full and its own layer empty, so it borrows layer
    # 0's least recent expert (0): 1 still hits, and so does 5.
    stream = [(0, [0, 1], 1), (1, [5], 0), (0, [1], 0), (1, [5], 0)]
    assert replay(stream, 2, 2, 1) == {"hits_decode": 2, "misses_decode": 1,
                                       "hits_prefill": 0, "misses_prefill": 2}


def test_reference_stream_is_the_engine_order(tmp_path):
    from core.access import access_sequence
    from harness.bench.reference_lru import access_stream
    from harness.runner.run import load_routing

    cfg = compose_config(["experiment=table1", "workload.num_requests=2",
                          "trace_cache_dir=null"])
    model = model_spec_from_dict(cfg["model"], "model")
    trace = load_routing(cfg, model, "measure")
    seq = access_sequence(trace, 1)
    E = trace.num_experts
    keys = [layer * E + e for layer, experts, _ in access_stream(trace) for e in experts]
    assert keys == seq.keys


def test_bench_sim_tiny_json(tmp_path, capsys):
    from harness.bench import sim as bench_sim

    path = tmp_path / "bench_sim.json"
    rc = bench_sim.main(["--requests", "2", "--repeats", "1", "--min-cpu-s", "0",
                         "--systems", "lru,on_demand", "--skip-1000", "--skip-batch32",
                         "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith("bench-sim: SIMULATED engine timing on synthetic routing")
    assert "ratio engine/reference" in out and "reference check" in out and ": match" in out
    doc = json.loads(path.read_text())
    assert doc["simulated"] and doc["synthetic_routing"]
    assert set(doc["systems"]) == {"lru", "on_demand"}
    for fig in doc["systems"].values():
        assert fig["status"] == "ok"
        assert fig["accesses"] > 0 and fig["accesses_per_cpu_s"] > 0
        assert fig["reference_accesses_per_cpu_s"] > 0 and fig["ratio"] > 0
        assert fig["peak_rss_mb"] >= fig["peak_rss_engine_mb"] > 0
    for fig in doc["details"]["2 requests, batch 1"].values():
        # one run (no CPU floor), one reference after it: the pair is the ratio
        assert len(fig["engine_cpu_s_runs"]) == len(fig["reference_cpu_s_runs"]) == 1
        assert fig["pair_ratios"] == [fig["ratio"]]
        # the RSS once the Engine is built is under the peak that follows it; no warm-up here
        assert fig["bytes_per_access_beyond_trace_built"] <= fig["bytes_per_access_beyond_trace"]
        assert "bytes_per_access_beyond_trace_warmed" not in fig
    lru, od = doc["systems"]["lru"], doc["systems"]["on_demand"]
    assert lru["accesses"] == od["accesses"]  # the same trace, the same access sets
    check = doc["reference_check"]
    assert check["match"] and check["engine"] == check["reference"]
    counts = check["reference"]
    assert sum(counts.values()) == lru["accesses"]
    assert counts["misses_prefill"] > 0 and counts["hits_decode"] > 0


def test_each_run_is_measured_against_the_reference_runs_beside_it():
    from harness.bench.sim_child import paired_ratios

    # runs of 2, 3, 3 CPU-s and reference runs of 1, 2, 4 after each, same access counts:
    # run 0 against 1 (0.5), run 1 against (1 + 2) / 2 (0.5), run 2 against (2 + 4) / 2 (1.0)
    assert paired_ratios(100, [2.0, 3.0, 3.0], 100, [1.0, 2.0, 4.0]) == [0.5, 0.5, 1.0]
    # twice the engine's accesses in the same time: twice the ratio
    assert paired_ratios(200, [2.0], 100, [1.0]) == [1.0]


def test_scaling_cost_alternates_with_the_table1_setting_in_one_child():
    from harness.bench.sim_child import child

    one = child("lru", 3, 1, 1, 0.0, False)  # the Table 1 setting alone: no base runs
    assert "cost_vs_base" not in one
    # batch 8 on the same 3 requests: the base runs replay that trace at batch 1
    b8 = child("lru", 3, 8, 2, 0.0, False, (3, 1))
    assert b8["base_accesses"] == one["accesses"] > b8["accesses"]  # unions within blocks
    # fewer requests than the base: the base generates its own (larger) trace
    small = child("lru", 2, 1, 1, 0.0, False, (3, 1))
    assert small["base_accesses"] == one["accesses"] > small["accesses"]
    for r in (b8, small):
        runs, bases = r["engine_cpu_s_runs"], r["base_cpu_s_runs"]
        assert len(runs) == len(bases) == len(r["cost_vs_base_runs"])
        # run 0 against the base run after it; later runs against the mean of those beside
        n, bn = r["accesses"], r["base_accesses"]
        want = [(runs[0] / n) / (bases[0] / bn)] + [
            (t / n) / ((a + b) / 2 / bn) for t, a, b in zip(runs[1:], bases, bases[1:])]
        assert r["cost_vs_base_runs"] == pytest.approx(want, rel=1e-12)
        assert r["cost_vs_base"] == pytest.approx(statistics.median(want), rel=1e-12)


def test_moebench_turns_numpy_huge_pages_off_unless_the_user_set_them():
    import os
    import subprocess
    import sys

    code = "import os, moebench, numpy; print(os.environ['NUMPY_MADVISE_HUGEPAGE'])"
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    for given, want in ((None, "0"), ("1", "1")):
        run_env = env if given is None else {**env, "NUMPY_MADVISE_HUGEPAGE": given}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want
