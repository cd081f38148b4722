"""Table 1 writer: exact columns, paper values beside the right rows, labels in the header, and
reports that refuse to mix runs (analysis/runs.py). Expected values are literals by hand."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from analysis.table1 import main
from harness.runner.config import compose_config
from harness.runner.run import run_config

TINY = ["workload.num_requests=3", "workload.prompt_len=16", "workload.output_len=4",
        "progress=false"]
# the named systems in analysis/table1.py's ORDER, then the named variants (systems/variants.py),
# which that ORDER does not list, by name
ALL = ["no_offload", "layer_offload", "on_demand", "lru", "moe_infinity", "fmoe", "diff_moe",
       "oracle", "diff_moe_floor_recency", "fmoe_admission", "moe_infinity_hysteresis"]


def _run(tmp_path, system, *extra, name=None):
    return run_config(compose_config(["experiment=table1", f"system={system}", *TINY, *extra],
                                     run_name=name or system, results_dir=str(tmp_path)))


def _rows(out):
    return list(csv.DictReader((out / "table1.csv").open()))


def test_table1_from_runs(tmp_path):
    for system in ("lru", "layer_offload", "on_demand", "no_offload", "oracle"):
        _run(tmp_path, system)
    out = tmp_path / "table1"
    assert main([str(out)]) == 2  # six systems never ran: a partial table is refused
    assert not (out / "table1.md").exists()
    assert main([str(out), "--allow-partial"]) == 0
    rows = _rows(out)
    assert list(rows[0]) == [
        "system", "bound", "paper_system", "status", "tpot_mean_ms", "paper_tpot_mean_ms",
        "tpot_ratio", "tpot_p99_ms", "paper_tpot_tail_ms", "compute_floor_ms", "headroom",
        "gpu_idle_ms_per_token", "paper_gpu_idle_ms", "hit_rate_decode", "h2d_gb_per_token"]
    for ext in ("md", "tex", "csv", "png", "pdf"):  # the suite's files, one report
        assert (out / f"table1.{ext}").is_file(), ext
    by = {r["system"]: r for r in rows}
    assert by["oracle"]["bound"] == "true" and by["lru"]["bound"] == "false"
    # MoE-Infinity Table 1: DeepSpeed 737/803/513, Mixtral-Offloading 1250/1530/754.
    assert (by["layer_offload"]["paper_tpot_mean_ms"], by["layer_offload"]["paper_tpot_tail_ms"],
            by["layer_offload"]["paper_gpu_idle_ms"]) == ("737.00", "803.00", "513.00")
    assert (by["lru"]["paper_tpot_mean_ms"], by["lru"]["paper_gpu_idle_ms"]) == ("1250.00",
                                                                                "754.00")
    assert by["layer_offload"]["paper_system"] == "DeepSpeed"
    lo = json.loads((out / "layer_offload" / "result.json").read_text())["metrics"]
    assert by["layer_offload"]["tpot_ratio"] == f"{lo['tpot_ms']['mean'] / 737:.2f}"
    assert by["on_demand"]["paper_tpot_mean_ms"] == ""
    assert by["no_offload"]["status"] == "oom" and by["no_offload"]["tpot_mean_ms"] == ""
    assert float(by["lru"]["tpot_mean_ms"]) > 0
    # compute floor and headroom from result.json, rounded by hand's rule (2 decimals)
    lru_m = json.loads((out / "lru" / "result.json").read_text())["metrics"]
    assert by["lru"]["compute_floor_ms"] == f"{lru_m['compute_floor_ms']:.2f}"
    assert by["lru"]["headroom"] == f"{lru_m['tpot_ms']['mean'] / lru_m['compute_floor_ms']:.2f}"
    assert float(by["lru"]["headroom"]) >= 1.0  # batch 1: stalls only add time
    assert by["no_offload"]["compute_floor_ms"] == "" and by["no_offload"]["headroom"] == ""
    # the hit rate column is the decode hit rate (prefill excluded, as in TPOT), 4 decimals
    lru = json.loads((out / "lru" / "result.json").read_text())["metrics"]
    assert by["lru"]["hit_rate_decode"] == f"{lru['hit_rate_decode']:.4f}"
    assert lru["hit_rate_decode"] != lru["hit_rate"]
    md = (out / "table1.md").read_text()
    assert "SIMULATED" in md and "SYNTHETIC routing" in md
    assert "hit rate over the expert accesses of decode iterations" in md
    assert "24 GB/s" in md and "unsupported" in md
    assert "PARTIAL" in md and "moe_infinity" in md.split("PARTIAL")[1].splitlines()[0]
    # the setting is not the paper's: the header says where
    assert "workload.num_requests = 3 (paper setting 290)" in md


def test_a_run_of_another_config_is_refused_with_the_key(tmp_path, capsys):
    _run(tmp_path, "lru")
    _run(tmp_path, "on_demand")
    _run(tmp_path, "on_demand", "hardware.h2d_gbps=16", name="on_demand_16")
    out = tmp_path / "table1"
    assert main([str(out), "--allow-partial"]) == 2
    err = capsys.readouterr().err
    assert "hardware.h2d_gbps" in err and "on_demand_16" in err
    assert not (out / "table1.csv").exists()
    # told that h2d is an axis, the rows become a column; lru at 16 GB/s is then missing
    assert main([str(out), "--axes", "hardware.h2d_gbps"]) == 2
    # the message lists the first ten missing (system, h2d) pairs in name order; with the
    # named variants lru's comes after them, so check that on_demand, run at both, is not
    # missing (lru at 16 GB/s missing shows in the rows below)
    err = capsys.readouterr().err
    assert "partial: no run for" in err and "on_demand (hardware.h2d_gbps" not in err
    assert main([str(out), "--axes", "hardware.h2d_gbps", "--allow-partial"]) == 0
    rows = _rows(out)
    assert [(r["system"], r["hardware.h2d_gbps"]) for r in rows] == [
        ("on_demand", "16"), ("on_demand", "24"), ("lru", "24")]
    assert main([str(out), "--allow-mixed", "--allow-partial"]) == 0
    assert "mixed (--allow-mixed): hardware.h2d_gbps" in (out / "table1.md").read_text()


def test_a_run_of_another_trace_is_refused(tmp_path, capsys):
    _run(tmp_path, "lru")
    _run(tmp_path, "on_demand")
    path = tmp_path / "table1" / "on_demand" / "result.json"
    r = json.loads(path.read_text())
    r["trace"]["sha256"] = "f" * 64  # same config, other routing (e.g. older generator code)
    path.write_text(json.dumps(r))
    assert main([str(tmp_path / "table1"), "--allow-partial"]) == 2
    assert "trace.sha256" in capsys.readouterr().err


def test_leftovers_and_duplicates(tmp_path, capsys):
    _run(tmp_path, "lru")
    out = tmp_path / "table1"
    shutil.copytree(out / "lru", out / ".lru.tmp-host-999")  # a killed write
    shutil.copytree(out / "lru", out / ".lru.old-host-998")
    assert main([str(out), "--allow-partial"]) == 0
    assert len(_rows(out)) == 1
    shutil.copytree(out / "lru", out / "lru_again")  # the same row twice
    assert main([str(out), "--allow-partial"]) == 2
    assert "two runs of the same row" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["{not json", "[]", '{"config": 1}'])
def test_a_malformed_result_is_named(tmp_path, capsys, content):
    _run(tmp_path, "lru")
    (tmp_path / "table1" / "bad").mkdir()
    (tmp_path / "table1" / "bad" / "result.json").write_text(content)
    assert main([str(tmp_path / "table1"), "--allow-partial"]) == 2
    assert "bad/result.json" in capsys.readouterr().err


def test_a_cache_sweep_gets_its_column_and_sweep_completeness(tmp_path, capsys):
    """What `moebench -m experiment=table1 system=lru,on_demand expert_cache_gb=4,8` leaves:
    Hydra's multirun.yaml names the swept keys; a missing point fails the report."""
    exp = tmp_path / "table1"
    for system in ("lru", "on_demand"):
        for gb in (4, 8):
            _run(tmp_path, system, f"expert_cache_gb={gb}", name=f"{system}-{gb}")
    (exp / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task:\n    - experiment=table1\n"
        "    - system=lru,on_demand\n    - expert_cache_gb=4,8,12\n")
    assert main([str(exp)]) == 2
    err = capsys.readouterr().err
    assert "lru (expert_cache_gb=12)" in err and "on_demand (expert_cache_gb=12)" in err
    assert main([str(exp), "--allow-partial"]) == 0
    rows = _rows(exp)
    assert [(r["system"], r["expert_cache_gb"], r["expert_cache_gib"]) for r in rows] == [
        ("on_demand", "4", "4.00"), ("on_demand", "8", "8.00"), ("lru", "4", "4.00"),
        ("lru", "8", "8.00")]
    md = (exp / "table1.md").read_text()
    assert "expert cache varies (a column)" in md and "Swept (columns): expert_cache_gb" in md


def test_every_system_gives_a_complete_table(tmp_path):
    for system in ALL:
        _run(tmp_path, system, "calibration_requests=2")
    assert main([str(tmp_path / "table1")]) == 0
    assert [r["system"] for r in _rows(tmp_path / "table1")] == ALL
