"""The defects a probe of faults and bad inputs found, one test each (the store's matrix is
tests/runner/test_fault_matrix.py, the size bounds tests/workloads/test_import_bounds.py).
Expected values are literals or read from the files the test wrote itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import snapshot

from analysis.runs import ReportError, collect
from core.specs import SpecError, model_spec_from_dict
from core.trace import write_trace
from harness.runner import trace_cache
from harness.runner.config import compose_config
from harness.runner.overrides import check_sweep, experiment_folder
from harness.runner.store import check_component, default_run_name

pytestmark = pytest.mark.fault
TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=3",
        "calibration_requests=2", "progress=false", "trace_cache_dir=null"]


def cli(args, cwd: Path, **kw):
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240, **kw)


# ---- 1. the trace cache removes only what it created ---------------------------------------
def test_the_trace_cache_never_removes_a_folder_it_did_not_create(tmp_path):
    """`trace_cache_dir=results` once wiped every 16-character folder beside the cache's own
    (results/fmoe_cache_limit/ among them): only marked folders of the cache go."""
    root = tmp_path / "results"
    mine = {name: root / name for name in ("fmoe_cache_limit", "0123456789abcdef", "table1")}
    for folder in mine.values():
        folder.mkdir(parents=True)
        (folder / "result.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (root / "fedcba9876543210").symlink_to(outside)  # a link named like a version folder
    stale = root / "00000000ffffffff"  # an older version folder the cache itself made
    stale.mkdir()
    (stale / trace_cache.MARKER).write_text("")
    cfg = compose_config(TINY)
    model = model_spec_from_dict(cfg["model"], "model")
    from core.targets import build_target
    from workloads.synthetic import generate_trace

    workload = {**cfg["workload"], "split": "measure", "seed": 0}
    trace_cache.cached_trace(root, "k", model,
                             lambda: generate_trace(model, build_target(workload, "workload")))
    assert not stale.exists()
    for folder in mine.values():
        assert (folder / "result.json").read_text() == "{}"
    assert (outside / "keep").read_text() == "x" and (root / "fedcba9876543210").is_symlink()
    new = trace_cache.cache_path(root, trace_cache.cache_key("k", model)).parent
    assert (new / trace_cache.MARKER).is_file()


# ---- 2. no two jobs of a sweep share a folder ----------------------------------------------
@pytest.mark.parametrize("overrides,jobs", [
    (["system=lru,on_demand", "run_name=same"], 2),
    (["system=lru,on_demand", "seed=0,1", "run_name=a,b"], 8),  # run_name is swept too
])
def test_a_sweep_whose_jobs_share_run_name_is_refused(overrides, jobs):
    with pytest.raises(SpecError, match=rf"^run_name: .* for a sweep of {jobs} jobs"):
        check_sweep(overrides, multirun=True)
    check_sweep(overrides[:-1], multirun=True)  # without run_name: a folder per job
    check_sweep(["system=lru", "run_name=x"], multirun=True)  # one job, one name


def test_the_cli_refuses_a_shared_run_name_before_any_job(tmp_path):
    done = cli(["-m", "system=lru,on_demand", "run_name=same", *TINY,
                f"results_dir={tmp_path / 'r'}"], tmp_path)
    assert done.returncode == 2 and "run_name:" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()


# ---- 3. names: bytes, repeated keys ---------------------------------------------------------
def test_a_name_is_limited_in_bytes_too():
    name = "é" * 150  # 150 characters, 300 bytes in UTF-8
    with pytest.raises(SpecError, match=r"^run_name: .* 300 bytes in UTF-8, more than 200"):
        check_component("run_name", name)
    assert check_component("run_name", "é" * 100) == "é" * 100


def test_a_repeated_override_names_one_folder():
    sha = "1a2b3c4d" + "0" * 56
    assert default_run_name(["seed=1", "seed=2"], "lru", sha) == default_run_name(
        ["seed=2"], "lru", sha) == "lru,seed=2-1a2b3c4d"


# ---- 4. a Table 1 run of another setting gets its own folder --------------------------------
def test_an_experiment_run_of_another_setting_goes_to_its_own_folder():
    assert experiment_folder(["experiment=table1", "system=on_demand"]) is None
    assert experiment_folder(["experiment=table1", "system=on_demand", "progress=false",
                              "timeout_s=5"]) is None  # not semantic
    assert experiment_folder(["experiment=table1", "system=lru",
                              "workload.num_requests=30"]) == "table1-workload.num_requests=30"
    assert experiment_folder(["experiment=table1", "workload.num_requests=30",
                              "experiment_name=mine"]) is None  # the user's choice wins
    a = experiment_folder(["experiment=table1", "routing=data/a/x.npz"])
    b = experiment_folder(["experiment=table1", "routing=data/b/x.npz"])
    assert a.startswith("table1-routing=x.npz@") and a != b  # one file name, two folders
    assert check_component("experiment_name", a) == a
    assert experiment_folder(["system=lru", "seed=3"]) is None  # no experiment pinned


def test_the_readme_table1_override_never_lands_beside_the_pinned_runs(tmp_path):
    done = cli(["experiment=table1", "system=on_demand", *TINY, "results_dir=r"], tmp_path)
    assert done.returncode == 0, done.stderr
    folders = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert folders == ["table1-calibration_requests=2,workload.num_requests=2,"
                       "workload.output_len=3,workload.prompt_len=8"], folders


# ---- 5. a trace file fixes its requests; a trace with no decode step -------------------------
def test_num_requests_beside_a_trace_file_is_refused():
    with pytest.raises(SpecError, match=r"^workload.num_requests: routing=FILE replays every"):
        check_sweep(["routing=x/t.npz", "workload.num_requests=40"], multirun=False)


def test_a_trace_with_no_decode_step_runs_and_prints_its_line(tmp_path):
    """An import without --decode-tokens: every request is one prefill step, so TPOT is
    undefined; the summary line says n/a instead of crashing."""
    from core.trace import trace_from_routing

    meta = {"num_moe_layers": 26, "num_experts": 64, "top_k": 6,
            "moe_layer_stacks": ["decoder"] * 26}
    step = [[list(range(6))] * 4 for _ in range(26)]  # 4 prompt tokens, 26 layers
    path = tmp_path / "prefill.npz"
    write_trace(trace_from_routing(meta, [{"id": "a", "prompt_len": 4, "output_len": 1,
                                           "routing": [step]}]), path)
    done = cli(["system=lru", f"routing={path}", "progress=false", "trace_cache_dir=null",
                "results_dir=r"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "valid, TPOT mean n/a ms" in done.stdout


# ---- 6. reports: NaN, truncated tables ------------------------------------------------------
def test_a_result_holding_nan_is_refused(tmp_path):
    run = tmp_path / "exp" / "a"
    run.mkdir(parents=True)
    (run / "result.json").write_text('{"config": {}, "system": {}, "status": "valid", '
                                     '"metrics": {"tpot_ms": {"mean": NaN}}}')
    with pytest.raises(ReportError, match=r"a/result.json: not a readable result.json .*NaN"):
        collect(tmp_path / "exp")


def test_cdf_names_a_truncated_token_table(tmp_path):
    from analysis.cdf import main as cdf
    from harness.runner.run import run_config

    run_config(compose_config(["system=lru", *TINY], run_name="a", results_dir=str(tmp_path)))
    table = tmp_path / "default" / "a" / "tokens.parquet"
    table.write_bytes(table.read_bytes()[:100])
    assert cdf([str(tmp_path / "default"), "--metric", "tpot", "--out",
                str(tmp_path / "out")]) == 2


# ---- 7. import-routing's output ------------------------------------------------------------
@pytest.mark.parametrize("target", ["folder", "itself"])
def test_import_routing_refuses_an_output_that_is_no_new_file(tmp_path, capsys, target):
    from workloads.importers import main as import_routing

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"request_id": "q", "layer": 0, "token_pos": 0,
                               "experts": [0, 1, 2, 3, 4, 5]}) + "\n")
    out = tmp_path if target == "folder" else src
    before = snapshot(tmp_path)
    assert import_routing([str(src), str(out), "--model", "deepseek_v2_lite"]) == 2
    err = capsys.readouterr().err
    assert ("is a folder" if target == "folder" else "is the input file") in err
    assert snapshot(tmp_path) == before


# ---- 8. the suite says when a sweep never started ------------------------------------------
def test_reproduce_reports_a_sweep_that_started_no_run(tmp_path, monkeypatch, capsys):
    from analysis.repro import suite

    monkeypatch.setattr(suite, "launcher_overrides",
                        lambda *a: ["hydra/launcher=no_such_launcher"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOEBENCH_SHARED_DATA", str(tmp_path / "absent"))
    code = suite.reproduce(["table1"], tmp_path / "r", ["workload.num_requests=2"])
    err = capsys.readouterr().err
    assert code != 0
    assert "the sweep stopped before any run started" in err
    assert "some runs failed" not in err
    # nothing written, not even the sweep's hidden state folder
    assert os.path.isdir(tmp_path / "r") is False or not list((tmp_path / "r").rglob("*"))


def test_fresh_deletes_only_the_folders_it_writes(tmp_path, monkeypatch):
    from analysis.repro import suite

    results = tmp_path / "r"
    mine = results / "table1-workload.num_requests=2"
    for folder in (mine, results / "table1_real-workload.num_requests=2", results / "table1",
                   results / "zoo"):
        folder.mkdir(parents=True)
        (folder / "keep.txt").write_text("x")
    monkeypatch.setattr(suite, "run_jobs", lambda *a: None)  # no run: only the deletion counts
    monkeypatch.setenv("MOEBENCH_SHARED_DATA", str(tmp_path / "absent"))
    suite.reproduce(["table1"], results, ["workload.num_requests=2"], jobs=1, fresh=True)
    assert sorted(p.name for p in results.iterdir()) == ["table1", "zoo"]
