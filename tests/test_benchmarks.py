"""The benchmark commands run end to end on tiny settings (their figures are not asserted:
speed targets are checked by the commands' printed figures, not by tests)."""

from __future__ import annotations

import json

import numpy as np

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
