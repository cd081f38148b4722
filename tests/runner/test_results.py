"""Result files: reproducibility across processes, provenance fields, OOM rows, config errors,
`_target_` safety, and that every config group composes and every experiment runs.

Expected values are hand-computed or literals from the conf yamls; the CLI runs as separate
processes where the point is "another process gives the same bytes" or "the exit status".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT

from core.specs import SpecError, hardware_spec_from_dict, model_spec_from_dict
from core.targets import build_target
from core.trace import trace_from_routing, write_trace
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.run import execute, run_config
from systems.base import System

CONF = ROOT / "conf"
TINY = ["workload.num_requests=4", "workload.prompt_len=16", "workload.output_len=4",
        "calibration_requests=2", "progress=false"]
PARQUETS = ("accesses", "tokens", "transfers")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A run replaying a trace file: the file fixes the requests (workload.num_requests is refused)
FILE_RUN = [o for o in TINY if not o.startswith("workload.num_requests=")]


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def strip_timing(text: str) -> str:
    """result.json text without its `timing` block (a flat dict, one key per line)."""
    out, n = re.subn(r'\n "timing": \{[^{}]*\}', "", text)
    assert n == 1, "result.json should hold exactly one flat timing block"
    return out


def column_bytes(path: Path) -> dict[str, list]:
    """Raw buffers of every column (after combining chunks), plus the schema metadata."""
    table = pq.read_table(path)
    out = {"__schema__": [str(table.schema), table.schema.metadata]}
    for name in table.column_names:
        arr = table.column(name).combine_chunks()
        out[name] = [None if b is None else b.to_pybytes() for b in arr.buffers()]
    return out


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The same config and seed run by two separate CLI processes (different working
    directories, same relative results_dir, so the configs are identical)."""
    base = tmp_path_factory.mktemp("repro")
    runs = []
    for name in ("A", "B"):
        cwd = base / name
        cwd.mkdir()
        proc = cli(["system=lru", *TINY, "results_dir=out"], cwd)
        assert proc.returncode == 0, proc.stderr
        (run_dir,) = (cwd / "out" / "default").iterdir()
        assert run_dir.name.startswith("lru,")  # system name, then the other overrides
        runs.append(run_dir)
    return runs


# ---- (a) reproducibility --------------------------------------------------------------------

def test_same_config_and_seed_is_byte_identical_across_processes(two_processes):
    a, b = two_processes
    text_a, text_b = (p.joinpath("result.json").read_text() for p in (a, b))
    assert strip_timing(text_a) == strip_timing(text_b)
    ra, rb = json.loads(text_a), json.loads(text_b)
    assert ra["timing"].keys() == rb["timing"].keys()  # only the values may differ
    for name in PARQUETS:
        ca, cb = column_bytes(a / f"{name}.parquet"), column_bytes(b / f"{name}.parquet")
        assert ca.keys() == cb.keys(), name
        for col in ca:
            assert ca[col] == cb[col], (name, col)


def test_other_seed_changes_the_trace(two_processes, tmp_path):
    seed0 = json.loads((two_processes[0] / "result.json").read_text())
    same = run_config(compose_config(["system=lru", *TINY], run_name="s0",
                                     results_dir=str(tmp_path)))
    other = run_config(compose_config(["system=lru", "seed=1", *TINY], run_name="s1",
                                      results_dir=str(tmp_path)))
    # In-process composition reproduces the CLI's trace; another seed does not.
    assert same["trace"]["sha256"] == seed0["trace"]["sha256"]
    assert same["config_sha256"] == seed0["config_sha256"]
    assert other["trace"]["sha256"] != seed0["trace"]["sha256"]
    assert other["config_sha256"] != seed0["config_sha256"]
    assert other["seed"] == 1


# ---- (b) provenance -------------------------------------------------------------------------

def test_result_json_provenance(two_processes):
    res = [json.loads((p / "result.json").read_text()) for p in two_processes]
    r = res[0]
    for key in ("schema_version", "run_id", "config", "config_sha256", "git", "environment",
                "seed", "trace", "status", "metrics", "timing", "simulated"):
        assert key in r, key
    assert r["schema_version"].split(".")[0] == "1"
    assert HEX64.match(r["config_sha256"])
    assert res[1]["config_sha256"] == r["config_sha256"]
    assert r["run_id"] and r["run_id"] == res[1]["run_id"]
    assert r["status"] == "valid" and r["reason"] is None
    assert r["simulated"] is True
    assert r["seed"] == 0 and r["config"]["seed"] == 0
    assert r["trace"]["synthetic"] is True
    assert HEX64.match(r["trace"]["sha256"])
    assert r["trace"]["num_requests"] == 4
    assert r["config"]["system"]["_target_"] == "systems.lru.LRU"
    assert r["config"]["workload"]["num_requests"] == 4
    assert isinstance(r["metrics"], dict) and r["metrics"]["tokens"] == 4 * 4
    for key in ("created_utc", "wall_s"):
        assert key in r["timing"]
    # git: when this checkout is a repository, the sha is one of its commits (not compared
    # with HEAD, which another commit may have moved since the run).
    assert set(r["git"]) >= {"sha", "dirty"}
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0:
        sha = r["git"]["sha"]
        assert re.fullmatch(r"[0-9a-f]{40}", sha)
        kind = subprocess.run(["git", "cat-file", "-t", sha], cwd=ROOT, capture_output=True,
                              text=True)
        assert kind.stdout.strip() == "commit"
        assert isinstance(r["git"]["dirty"], bool)
    packages = r["environment"]["packages"]
    assert packages["numpy"] == np.__version__
    assert packages["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "pyarrow" in packages and "hydra-core" in packages


def test_memory_plan_by_hand(two_processes):
    r = json.loads((two_processes[0] / "result.json").read_text())
    mem = r["memory"]
    gib = 2**30
    # DeepSeek-V2-Lite: 27 layers x 576 KV elements (MLA latent 512 + RoPE key 64) x 2 bytes
    # = 31,104 B per token; context 16 + 4 = 20 tokens, batch 1.
    assert mem["kv_bytes"] == 27 * 576 * 2 * 20
    assert mem["gpu_bytes"] == 24 * gib and mem["reserve_bytes"] == int(1.5 * gib)
    assert mem["available_bytes"] == (24 * gib - mem["dense_bytes"] - mem["kv_bytes"]
                                      - int(1.5 * gib))
    assert mem["expert_cache_bytes"] == mem["available_bytes"] and mem["explicit"] is False
    # The peak resident expert bytes never exceed the budget.
    assert 0 < r["metrics"]["peak_expert_cache_bytes"] <= mem["expert_cache_bytes"]


def test_explicit_expert_cache_is_the_budget(tmp_path):
    r = run_config(compose_config(["system=on_demand", "expert_cache_gb=0.5", *TINY],
                                  run_name="ec", results_dir=str(tmp_path)))
    assert r["status"] == "valid"
    assert r["memory"]["expert_cache_bytes"] == 2**29 and r["memory"]["explicit"] is True
    assert r["metrics"]["peak_expert_cache_bytes"] <= 2**29


# ---- (c) OOM rows ---------------------------------------------------------------------------

def test_no_offload_on_small_gpu_is_an_oom_row(tmp_path):
    proc = cli(["system=no_offload", "hardware.gpu_mem_gb=12", *TINY,
                f"results_dir={tmp_path}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any("oom" in line for line in proc.stdout.splitlines()), proc.stdout
    (run_dir,) = [p for p in (tmp_path / "default").iterdir() if p.is_dir()]
    assert run_dir.name.startswith("no_offload,")
    r = json.loads((run_dir / "result.json").read_text())
    assert r["status"] == "oom"
    assert isinstance(r["reason"], str) and r["reason"]
    assert r["metrics"] is None
    assert sorted(p.name for p in run_dir.iterdir()) == ["result.json"]


def test_dense_weights_alone_over_gpu_is_oom(tmp_path):
    # DeepSeek-V2-Lite's dense weights are ~2.4 GiB: a 2 GiB GPU leaves nothing for experts.
    r = execute(assemble(compose_config(["system=on_demand", "hardware.gpu_mem_gb=2", *TINY],
                                        run_name="tiny_gpu", results_dir=str(tmp_path))))
    assert r.status == "oom" and r.reason and "engine" not in r.record()
    assert r.memory["available_bytes"] <= 0
    assert (r.run_dir / "result.json").is_file() and not list(r.run_dir.glob("*.parquet"))


# ---- (d) corrupt trace ----------------------------------------------------------------------

def _small_trace_file(path: Path) -> Path:
    meta = {"num_moe_layers": 1, "num_experts": 4, "top_k": 2,
            "moe_layer_stacks": ["decoder"]}
    write_trace(trace_from_routing(meta, [{"id": "x", "prompt_len": 1, "output_len": 2,
                                           "routing": [[[[0, 1]]], [[[2, 3]]]]}]), path)
    return path


@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_corrupt_routing_file_is_a_clear_error(tmp_path, kind):
    path = _small_trace_file(tmp_path / "routing_in.npz")
    raw = path.read_bytes()
    bad = tmp_path / f"corrupt_{kind}.npz"
    bad.write_bytes(raw[: len(raw) // 2] if kind == "truncated" else b"not a trace" * 10)
    results = tmp_path / "results"
    proc = cli(["system=lru", *FILE_RUN, f"routing={bad}", f"results_dir={results}"], tmp_path)
    assert proc.returncode != 0
    assert bad.name in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not results.exists() or not any(results.rglob("result.json"))


def test_routing_file_for_another_model_is_a_clear_error(tmp_path):
    """A valid trace of a 1-layer, 4-expert model replayed on DeepSeek-V2-Lite (26 MoE layers,
    64 experts): an input error naming the file and field, not a 'failed' result row."""
    path = _small_trace_file(tmp_path / "other_model.npz")
    results = tmp_path / "results"
    proc = cli(["system=on_demand", *FILE_RUN, f"routing={path}", f"results_dir={results}"],
               tmp_path)
    assert proc.returncode != 0
    assert "other_model.npz" in proc.stderr and "num_moe_layers" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not results.exists() or not any(results.rglob("result.json"))


# ---- (e) config errors name the key ---------------------------------------------------------

def test_expert_cache_larger_than_memory_is_refused(tmp_path):
    cfg = compose_config(["system=lru", "expert_cache_gb=100", *TINY], run_name="big",
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match="expert_cache_gb"):
        run_config(cfg)
    assert not any(tmp_path.rglob("result.json"))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc"])
def test_bad_expert_cache_is_refused(tmp_path, value):
    cfg = compose_config(["system=lru", f"expert_cache_gb={value}", *TINY], run_name="zero",
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match="expert_cache_gb"):
        run_config(cfg)


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "abc"])
def test_bad_max_batch_is_refused(tmp_path, value):
    cfg = compose_config(["system=lru", f"max_batch={value}", *TINY], run_name="mb",
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match="max_batch"):
        run_config(cfg)
    assert not any(tmp_path.rglob("result.json"))


def test_unknown_hardware_key_cli(tmp_path):
    proc = cli(["system=lru", "+hardware.foo=1", *TINY, f"results_dir={tmp_path}"], tmp_path)
    assert proc.returncode != 0
    assert "foo" in proc.stderr and "hardware" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.rglob("result.json"))


@pytest.mark.parametrize("override, key", [
    ("hardware.h2d_gbps=0", "h2d_gbps"),
    ("hardware.h2d_gbps=-3", "h2d_gbps"),
    ("hardware.hbm_gbps=nan", "hbm_gbps"),
    ("hardware.gpu_mem_gb=0", "gpu_mem_gb"),
])
def test_non_positive_hardware_value_names_key(tmp_path, override, key):
    cfg = compose_config(["system=lru", override, *TINY], run_name="hw",
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match=rf"hardware\.{key}"):
        run_config(cfg)
    assert not any(tmp_path.rglob("result.json"))


# ---- (f) _target_ stays inside the project --------------------------------------------------

def test_system_target_outside_project_is_refused(tmp_path):
    cfg = compose_config(["system=lru", "system._target_=os.system", *TINY],
                         run_name="evil", results_dir=str(tmp_path))
    assert cfg["system"]["_target_"] == "os.system"  # the override did reach the config
    with pytest.raises(SpecError, match=r"system\._target_"):
        run_config(cfg)
    marker = tmp_path / "pwned"
    cfg["system"] = {"_target_": "os.system", "command": f"touch {marker}"}
    with pytest.raises(SpecError, match=r"system\._target_"):
        run_config(cfg)
    assert not marker.exists()
    assert not any(tmp_path.rglob("result.json"))


@pytest.mark.parametrize("target", [
    "os.system",
    "subprocess.Popen",
    "builtins.eval",
    "harness.runner.run.Path",  # pathlib.Path re-exported by a project module
    "core.trace.field",  # dataclasses.field, a function
    "workloads.synthetic.SyntheticConfig",  # a project class, but not a System
    None,
    42,
])
def test_build_target_refuses(target):
    node = {"slots_per_layer": None} if target is None else {"_target_": target}
    with pytest.raises(SpecError, match="_target_"):
        build_target(node, "system", System)


@pytest.mark.parametrize("target", ["harness.runner.run.Path", "core.trace.field",
                                    "harness.runner.run.run_config", "os.system"])
def test_workload_target_must_be_a_project_class(target):
    """Workloads have no base class to check, so a name that a project module merely imports
    (pathlib.Path in harness.runner.run) or a function must still be refused."""
    with pytest.raises(SpecError, match=r"workload\._target_"):
        build_target({"_target_": target}, "workload")


def test_build_target_builds_project_class():
    sys_ = build_target({"_target_": "systems.on_demand.OnDemand"}, "system", System)
    assert isinstance(sys_, System) and sys_.name == "on_demand"


# ---- (g) every config group composes; every experiment runs ---------------------------------

def _stems(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_config_group_composes(tmp_path):
    models, hardware, systems = _stems("model"), _stems("hardware"), _stems("system")
    assert len(models) >= 11 and len(hardware) >= 6 and len(systems) >= 5
    n = max(len(models), len(hardware), len(systems))
    seen = {"model": set(), "hardware": set(), "system": set()}
    for i in range(n):  # one composition covers one file of each group
        m, h, s = models[i % len(models)], hardware[i % len(hardware)], systems[i % len(systems)]
        cfg = compose_config([f"model={m}", f"hardware={h}", f"system={s}"],
                             results_dir=str(tmp_path))
        spec = model_spec_from_dict(cfg["model"], "model")
        hw = hardware_spec_from_dict(cfg["hardware"], "hardware")
        system = build_target(cfg["system"], "system", System)
        assert spec.name == m and hw.name == h and system.name == s
        assert spec.num_moe_layers >= 1 and spec.expert_bytes > 0
        seen["model"].add(m)
        seen["hardware"].add(h)
        seen["system"].add(s)
    assert seen == {"model": set(models), "hardware": set(hardware), "system": set(systems)}


def test_table1_experiment_composes(tmp_path):
    cfg = compose_config(["experiment=table1"], results_dir=str(tmp_path))
    assert cfg["experiment_name"] == "table1"
    assert cfg["model"]["name"] == "deepseek_v2_lite"
    assert cfg["hardware"]["name"] == "rtx_a5000"
    assert cfg["hardware"]["h2d_gbps"] == 24
    assert cfg["workload"]["num_requests"] == 290
    assert cfg["workload"]["prompt_len"] == 512
    assert cfg["workload"]["output_len"] == 32
    assert cfg["max_batch"] == 1
    assert cfg["calibration_requests"] == 290
    assert cfg["model"]["expert_bits"] == 16


@pytest.mark.parametrize("experiment", _stems("experiment"))
def test_every_experiment_smoke_runs(tmp_path, experiment):
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text()
    assert "# @package _global_" in text.splitlines()[0]
    # lengths=fixed: an experiment may draw per-request lengths (fmoe_online, docs/serving.md)
    tiny = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=3",
            "workload.lengths=fixed", "calibration_requests=2", "progress=false"]
    cfg = compose_config([f"experiment={experiment}", *tiny], run_name="smoke",
                         results_dir=str(tmp_path))
    if (cfg["workload"].get("arrivals") or {}).get("process") == "azure":
        # a trace replay needs its CSV: a 2-row one here, lengths from the overrides above
        csv = tmp_path / "azure.csv"
        csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                       "2023-11-16 18:00:00.0000000,5,2\n2023-11-16 18:00:01.0000000,6,3\n")
        tiny += [f"workload.arrivals.path={csv}", "workload.arrivals.lengths=false"]
        cfg = compose_config([f"experiment={experiment}", *tiny], run_name="smoke",
                             results_dir=str(tmp_path))
    assert cfg["workload"]["num_requests"] == 2  # command line beats the experiment file
    r = run_config(cfg)
    assert r["status"] in ("valid", "oom"), r["reason"]
    exp_name = cfg["experiment_name"]
    assert (tmp_path / exp_name / "smoke" / "result.json").is_file()
    if r["status"] == "valid":
        assert r["metrics"]["tokens"] == 2 * 3
