"""`moebench compare` and `moebench cdf` on a tiny sweep made here:
system x expert_cache_gb x seed, with the multirun.yaml Hydra would write. Expected values are
recomputed in the test from each run's result.json and tokens.parquet (pandas, by hand), the
t quantile from the published table."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from analysis import cdf, compare
from analysis.runs import collect
from analysis.sweepstats import mean_ci, t_quantile_975
from harness.runner.config import compose_config
from harness.runner.run import run_config

SWEEP = {"system": ["lru", "on_demand"], "expert_cache_gb": [2, 4], "seed": [0, 1, 2]}
BASE = ["workload.num_requests=4", "workload.prompt_len=16", "workload.output_len=4",
        "calibration_requests=4", "progress=false", "experiment_name=sw"]
T975 = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 30: 2.0423}  # Student t tables


def _sweep(root, sweep, base):
    for combo in itertools.product(*sweep.values()):
        over = [f"{k}={v}" for k, v in zip(sweep, combo)]
        run_config(compose_config([*base, *over], run_name="-".join(map(str, combo)),
                                  results_dir=str(root)))
    task = [f"{k}={','.join(map(str, v))}" for k, v in sweep.items()] + base
    (root / "sw" / "multirun.yaml").write_text(
        yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
    return root / "sw"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("cmp"), SWEEP, BASE)


def _results(folder):
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/result.json")}


def test_t_quantile_matches_the_table():
    for df, t in T975.items():
        assert t_quantile_975(df) == pytest.approx(t, abs=1e-4)
    assert mean_ci([3.0]) == (3.0, None, 1)
    mean, half, n = mean_ci([1.0, 2.0, 6.0])  # mean 3, s = sqrt(7)
    assert (mean, n) == (3.0, 3) and half == pytest.approx(4.3027 * math.sqrt(7 / 3), rel=1e-4)


def test_compare_table_csv_and_seed_interval(sweep, tmp_path, capsys):
    out = tmp_path / "a"
    assert compare.main([str(sweep), "--x", "expert_cache_gb", "--y", "tpot_ms", "--out",
                         str(out)]) == 0
    stem = out / "compare_expert_cache_gb_tpot_ms"
    tidy = pd.read_csv(f"{stem}.csv")
    res = _results(sweep)
    assert len(tidy) == 12 and list(tidy.columns) == ["run", "system", "expert_cache_gb", "seed",
                                                     "status", "tpot_ms"]
    for _, row in tidy.iterrows():  # each run's value is its result.json TPOT mean
        assert row["tpot_ms"] == res[row["run"]]["metrics"]["tpot_ms"]["mean"]
    md = stem.with_suffix(".md").read_text()
    assert "SIMULATED, synthetic routing" in md and "Student t-interval" in md
    for system, gb in itertools.product(SWEEP["system"], SWEEP["expert_cache_gb"]):
        v = [res[f"{system}-{gb}-{s}"]["metrics"]["tpot_ms"]["mean"] for s in SWEEP["seed"]]
        mean, half = np.mean(v), 4.3027 * np.std(v, ddof=1) / math.sqrt(3)
        rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in md.splitlines()
                if ln.startswith(f"| {system} ")]
        cells = next(c for c in rows if float(c[1]) == gb)
        assert cells[4] == "3"
        assert float(cells[2]) == pytest.approx(mean, rel=1e-3)
        assert float(cells[3]) == pytest.approx(half, rel=1e-3, abs=1e-9)
    assert "wrote" in capsys.readouterr().out


def test_compare_outputs_are_byte_identical_on_rerun(sweep, tmp_path):
    for name in ("a", "b"):
        assert compare.main([str(sweep), "--x", "system", "--by", "expert_cache_gb", "--y",
                             "hit_rate", "--out", str(tmp_path / name)]) == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == [f"compare_system_hit_rate.{e}" for e in ("csv", "md", "pdf", "png")]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    pdf = (tmp_path / "a" / "compare_system_hit_rate.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf
    assert (tmp_path / "a" / "compare_system_hit_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_refuses_unswept_keys_and_mixed_traces(sweep, tmp_path, capsys):
    assert compare.main([str(sweep), "--x", "max_batch", "--y", "tpot_ms",
                         "--out", str(tmp_path)]) == 2
    assert "--x max_batch: not a swept key" in capsys.readouterr().err
    assert compare.main([str(sweep), "--x", "expert_cache_gb", "--y", "no_such",
                         "--out", str(tmp_path)]) == 2
    assert "--y no_such: no such metric" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    shutil.copytree(sweep, mixed)
    path = mixed / "lru-2-0" / "result.json"
    r = json.loads(path.read_text())
    r["config"]["workload"]["prompt_len"] = 17  # a difference nobody swept
    path.write_text(json.dumps(r))
    assert compare.main([str(mixed), "--x", "expert_cache_gb", "--y", "tpot_ms"]) == 2
    assert "workload.prompt_len" in capsys.readouterr().err
    r["config"]["workload"]["prompt_len"] = 16
    r["trace"]["sha256"] = "0" * 64  # same config, another trace
    path.write_text(json.dumps(r))
    assert compare.main([str(mixed), "--x", "expert_cache_gb", "--y", "tpot_ms"]) == 2
    assert "trace.sha256" in capsys.readouterr().err


def _by_hand(run_dir, arrival_ms):
    tok = pq.read_table(run_dir / "tokens.parquet").to_pandas()
    g = tok.groupby("request")["time_ms"]
    first = tok[tok["token_index"] == 0].set_index("request")["time_ms"]
    last, count = g.max(), g.size()
    tpot = ((last - first) / (count - 1))[count > 1]
    return {"tpot": tpot.to_numpy(), "ttft": (first - arrival_ms).to_numpy(),
            "e2e": (last - arrival_ms).to_numpy()}


def test_cdf_per_request_values_and_vllm_table(sweep, tmp_path, capsys):
    res = _results(sweep)
    run = "lru-2-1"
    hand = _by_hand(sweep / run, 0.0)  # offline arrivals: every request at t = 0
    for metric in ("tpot", "ttft", "e2e"):
        got = cdf.request_latency(res[run], sweep / run, metric)
        np.testing.assert_allclose(np.sort(got), np.sort(hand[metric]), rtol=0, atol=1e-9)
        # the engine's own summary in result.json, computed from the run's arrival times
        want = res[run]["metrics"][f"{metric}_ms"]
        for stat, value in cdf.stats(got).items():
            assert value == pytest.approx(want[stat], rel=1e-12)
    assert cdf.main([str(sweep), "--metric", "tpot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    block = out.split("lru, expert_cache_gb=2 (SIMULATED, synthetic routing)")[1]
    lines = block.splitlines()
    per_seed = [res[f"lru-2-{s}"]["metrics"]["tpot_ms"] for s in SWEEP["seed"]]
    n_req = sum(len(_by_hand(sweep / f"lru-2-{s}", 0.0)["tpot"]) for s in SWEEP["seed"])
    assert lines[1] == f"{'Requests:':<40}{n_req}"
    assert lines[2].strip("-") == "Time per Output Token (excl. 1st token)"
    for line, stat, name in zip(lines[3:7], ("mean", "p50", "p90", "p99"),
                                ("Mean", "Median", "P90", "P99")):
        v = [p[stat] for p in per_seed]
        assert line == (f"{f'{name} TPOT (ms):':<40}{np.mean(v):.2f} ± "
                        f"{4.3027 * np.std(v, ddof=1) / math.sqrt(3):.2f}")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"cdf_tpot.{e}" for e in ("csv", "md", "pdf", "png")]
    table = pd.read_csv(tmp_path / "cdf_tpot.csv")
    assert len(table) == 4 and set(table["seeds"]) == {3}


def test_cdf_ttft_with_poisson_arrivals(tmp_path, capsys):
    base = [*BASE, "arrivals=poisson", "workload.arrivals.rate_rps=20", "max_batch=2"]
    folder = _sweep(tmp_path / "r", {"system": ["lru", "on_demand"]}, base)
    runs = collect(folder)
    assert runs.axes == []
    for r in runs.results:  # arrival times from the regenerated trace, checked by sha
        got = cdf.request_latency(r, folder / r.folder, "ttft")
        for stat, value in cdf.stats(got).items():
            assert value == pytest.approx(r["metrics"]["ttft_ms"][stat], rel=1e-12)
    assert cdf.main([str(folder), "--metric", "e2e", "--out", str(tmp_path / "o")]) == 0
    assert "Mean E2EL (ms):" in capsys.readouterr().out


def test_a_swept_prompts_node_is_an_axis_by_its_dataset_name():
    """fmoe_overall sweeps `workload.prompts={dataset: sharegpt, ...},{dataset: arena_hard,
    ...}`: the rows differ in their traces, so the axis must tell them apart by dataset."""
    from analysis.runs import RunRecord, axis_value, check_mixing

    def run(dataset, sha, cfg=None):
        cfg = cfg or {"workload": {"prompts": {"dataset": dataset,
                                               "path": f"/d/{dataset}.jsonl"}}}
        return RunRecord({"config": cfg, "system": {"name": "lru"},
                          "trace": {"sha256": sha}}, folder=dataset)

    a, b = run("sharegpt", "aa" * 32), run("arena_hard", "bb" * 32)
    assert axis_value(a["config"], "workload.prompts") == "sharegpt"
    assert check_mixing([a, b], ["workload.prompts"]) == []
    assert check_mixing([a, run("arena_hard", "bb" * 32, a["config"])],
                        ["workload.prompts"]) != []
