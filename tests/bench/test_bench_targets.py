"""The targets `moebench bench-sim` checks (harness/bench/sim_targets.py) on hand-made figures:
each limit is met at the limit and missed just past it; systems with state of their own
(history, plans) have their memory figure reported with its parts, not judged."""

from harness.bench.sim_targets import checks


def _by_name(rows):
    return {name: (value, passed) for name, value, _, passed in rows}


def test_ratio_cost_and_memory_limits():
    figures = {
        # binding costs: measured against the Table 1 runs beside them (1.1 and 2.01); the
        # ones through each child's reference loop (1.05, 2.5) and the absolute ones (the
        # machine was slower at batch 32) are reported only
        "lru": {"status": "ok", "ratio": 0.12, "accesses_per_cpu_s": 1000.0,
                "cost_vs_base_1000_requests": 1.1, "cost_vs_base_batch32": 2.01,
                "ratio_1000_requests": 0.12 / 1.05, "ratio_batch32": 0.12 / 2.5,
                "accesses_per_cpu_s_1000_requests": 1000.0 / 1.05,
                "accesses_per_cpu_s_batch32": 1000.0 / 3.0,
                "bytes_per_access_beyond_trace": 64.0, "peak_rss_mb_1000_requests": 1025.0},
        "fmoe": {"status": "ok", "ratio": 0.0299, "accesses_per_cpu_s": 100.0},
        "on_demand": {"status": "ok", "ratio": 0.5, "accesses_per_cpu_s": 100.0,
                      "bytes_per_access_beyond_trace": 64.5},
        "no_offload": {"status": "oom"},
    }
    got = _by_name(checks(figures, {"status": "ok", "cpu_s": 60.5, "largest_run_mb": 20.0}))
    assert got["lru ratio"] == (0.12, True)
    assert got["fmoe ratio"][1] is False
    assert got["lru cost at 1000 req / Table 1 (runs alternated in one process)"] == (1.1, True)
    assert got["lru cost at batch 32 / Table 1 (runs alternated in one process)"] == (2.01, False)
    via_reference = got["lru cost at batch 32 / Table 1, via each child's reference loop"]
    assert abs(via_reference[0] - 2.5) < 1e-9 and via_reference[1] is None
    absolute = got["lru cost at batch 32 / Table 1, absolute CPU s per access"]
    assert abs(absolute[0] - 3.0) < 1e-9 and absolute[1] is None
    assert got["lru engine+recorder B/access beyond trace"] == (64.0, True)
    assert got["on_demand engine+recorder B/access beyond trace"] == (64.5, False)
    assert got["lru 1000-request run peak RSS MB"] == (1025.0, False)
    assert got["Table 1 sweep CPU s (8 systems, generation included)"] == (60.5, False)
    assert got["largest Table 1 run folder MB"] == (20.0, True)
    assert not any(name.startswith("no_offload") for name in got)


def test_policy_state_is_reported_not_judged():
    names = ("oracle", "fmoe", "moe_infinity", "diff_moe")
    figures = {name: {"status": "ok", "ratio": 0.5, "accesses_per_cpu_s": 1.0,
                      "bytes_per_access_beyond_trace": 200.0} for name in names}
    figures["diff_moe"].update(bytes_per_access_beyond_trace_built=18.2,
                               bytes_per_access_beyond_trace_warmed=40.0,
                               bytes_per_access_beyond_trace_warmup_peak=76.6)
    rows = [r for r in checks(figures, None) if "B/access" in r[0]]
    assert len(rows) == 4 and all(r[1] == 200.0 and r[3] is None for r in rows)
    assert all("policy's state included" in r[0] for r in rows)
    diff = next(r[0] for r in rows if r[0].startswith("diff_moe"))
    assert "B/access built 18, warmed 40, warm-up peak 77" in diff
