"""The logger group (harness/runner/logger.py): checks, runs.csv (one row per run_id, header
once, concurrent writers), wandb offline by default with the run's id, and wandb never
failing or blocking a run (missing, or a dead endpoint): the local results stay identical to
logger=none.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT

from core.specs import SpecError
from harness.runner import logger
from harness.runner.config import compose_config
from harness.runner.sweep import run_job

TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2", "progress=false"]
MACHINE = ("timing", "environment")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "OPENBLAS_CORETYPE" and not k.startswith("WANDB_")}
    return {**env, **extra}


def _cli(args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def _record(run_dir: Path) -> tuple[dict, dict]:
    """result.json without the machine blocks and the logger choice, and the parquet bytes."""
    result = json.loads((run_dir / "result.json").read_text())
    result = {k: v for k, v in result.items() if k not in MACHINE}
    result["config"] = {k: v for k, v in result["config"].items() if k != "logger"}
    return result, {p.name: p.read_bytes() for p in sorted(run_dir.glob("*.parquet"))}


# ---- checks ---------------------------------------------------------------------------------

def test_old_wandb_spelling_names_the_logger_group(tmp_path):
    proc = _cli(["+wandb=true", *TINY, f"results_dir={tmp_path}"])
    assert proc.returncode == 2
    assert "logger=wandb" in proc.stderr and proc.stderr.startswith("moebench: error: wandb:")
    assert not (tmp_path / "default").exists()


@pytest.mark.parametrize("node,msg", [
    ({"name": "syslog"}, r"^logger: must be one of"),
    ({"name": "csv", "path": "x"}, r"^logger\.path: unknown key of logger=csv"),
    ({"name": "wandb", "mode": "sometimes"}, r"^logger\.mode: must be one of"),
    ({"name": "wandb", "tags": "a"}, r"^logger\.tags: must be a list"),
    ({"name": "wandb", "timeout_s": 1}, r"^logger\.timeout_s: must be"),
    ({"name": "wandb", "max_table_rows": -1}, r"^logger\.max_table_rows: must be"),
])
def test_bad_logger_settings_are_refused(node, msg):
    full = {**compose_config(["logger=wandb"])["logger"], **node} if node["name"] == "wandb" \
        else node
    with pytest.raises(SpecError, match=msg):
        logger.check_logger({"logger": full})


def test_logger_is_not_in_the_hash_or_the_folder_name():
    none = compose_config(TINY)
    wb = compose_config([*TINY, "logger=wandb", "logger.project=p"])
    from harness.runner.results import config_hash
    from harness.runner.store import default_run_name

    assert config_hash(none) == config_hash(wb)
    h = config_hash(none)
    assert default_run_name(["logger=wandb", "logger.project=p"], "lru", h) == \
        default_run_name([], "lru", h) == f"lru-{h[:8]}"


# ---- csv ------------------------------------------------------------------------------------

def test_csv_rows(tmp_path):
    results = {}
    for system in ("lru", "on_demand", "lru"):  # the rerun replaces its row
        cfg = compose_config([*TINY, f"system={system}", "logger=csv"], run_name=system,
                             results_dir=str(tmp_path))
        results[system] = run_job(cfg, multirun=False, system_name=system)["result"]
    text = (tmp_path / "default" / "runs.csv").read_text()
    assert text.count("run_id,") == 1  # one header
    rows = list(csv.DictReader(text.splitlines()))
    assert sorted(r["system"] for r in rows) == ["lru", "on_demand"]
    for row in rows:
        want = results[row["system"]]
        assert row["run_id"] == want["run_id"] and row["status"] == "valid"
        assert float(row["metrics.tpot_ms.mean"]) == want["metrics"]["tpot_ms"]["mean"]
        assert int(row["metrics.accesses"]) == want["metrics"]["accesses"]
        assert row["system"] == want["system"]["name"] and row["config.seed"] == "0"
        assert row["trace_sha256"] == want["trace"]["sha256"]


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from harness.runner.logger import append_csv_row
    for i in range(15):
        row = {{"run_id": f"{{sys.argv[1]}}-{{i}}", "status": "valid", "metrics.x": i}}
        if i % 5 == 0:
            row["metrics.extra_" + sys.argv[1]] = 1.5  # a new column: the file is rewritten
        append_csv_row(Path({path!r}), row)
""")


def test_concurrent_csv_writers_lose_no_row(tmp_path):
    path = tmp_path / "exp" / "runs.csv"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(path=str(path)), f"w{n}"],
                              cwd=ROOT, env=_env(), stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errs
    rows = list(csv.DictReader(path.read_text().splitlines()))
    assert sorted(r["run_id"] for r in rows) == sorted(
        f"w{n}-{i}" for n in range(4) for i in range(15))
    assert path.read_text().count("run_id") == 1
    assert {f"metrics.extra_w{n}" for n in range(4)} <= set(rows[0])
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]


# ---- wandb ----------------------------------------------------------------------------------

def _wandb_env(tmp_path: Path, **extra) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return _env(HOME=str(home), WANDB_DIR=str(tmp_path / "wandb"),
                WANDB_CACHE_DIR=str(home / "cache"), WANDB_CONFIG_DIR=str(home / "config"),
                WANDB_DATA_DIR=str(home / "data"), **extra)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens


def test_dead_endpoint_never_blocks_a_run(tmp_path):
    pytest.importorskip("wandb")
    base = [*TINY, "run_name=r", f"results_dir={tmp_path / 'res'}"]
    assert _cli([*base, "logger=none"]).returncode == 0
    want = _record(tmp_path / "res" / "default" / "r")
    env = _wandb_env(tmp_path, WANDB_MODE="online", WANDB_API_KEY="x" * 40,
                     WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}")
    t0 = time.perf_counter()
    proc = _cli([*base, "logger=wandb", "logger.timeout_s=20"], env=env, timeout=120)
    took_s = time.perf_counter() - t0
    print(f"dead-endpoint wandb run: {took_s:.1f} s")
    assert proc.returncode == 0, proc.stderr
    assert took_s < 60
    assert "online init failed" in proc.stderr and "logged offline" in proc.stderr
    assert _record(tmp_path / "res" / "default" / "r") == want


def test_offline_by_default_with_the_run_id(tmp_path):
    pytest.importorskip("wandb")
    proc = _cli([*TINY, "logger=wandb", "run_name=r", f"results_dir={tmp_path / 'res'}"],
                env=_wandb_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads((tmp_path / "res" / "default" / "r" / "result.json").read_text())[
        "run_id"]
    offline = list((tmp_path / "wandb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 1, proc.stderr
    assert (offline[0] / f"run-{run_id}.wandb").is_file()
    assert f"wandb sync {offline[0]}" in proc.stderr


def test_missing_wandb_is_a_warning(tmp_path, monkeypatch, capsys):
    cfg = compose_config([*TINY, "logger=wandb"], results_dir=str(tmp_path))
    real = logger.importlib.util.find_spec
    monkeypatch.setattr(logger.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    result = run_job(cfg, multirun=False, system_name="lru")["result"]
    assert result["status"] == "valid"
    assert "wandb package is not installed" in capsys.readouterr().err
