"""Sweeps through the Hydra launchers of the `sweep` extra (docs/sweeps.md, "Launchers"): joblib,
submitit's local executor and a local Ray instance each run a two-job sweep whose results
equal the default launcher's, and leave no process behind. Ray's HOME, temp dir and session
stay in the test's own temporary folder, with no dashboard.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2", "progress=false", "system=lru,on_demand"]
MACHINE = ("timing", "environment")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    return {**env, **extra}


def _sweep(results: Path, launcher: list[str], env: dict | None = None, timeout: int = 120):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "moebench.cli", "-m", *launcher, *TINY,
                           f"results_dir={results}"], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - t0


def _records(results: Path) -> dict[str, dict]:
    """{run folder: result.json less the machine blocks} of one sweep."""
    out = {}
    for path in sorted((results / "default").glob("*/result.json")):
        result = json.loads(path.read_text())
        out[path.parent.name] = {k: v for k, v in result.items() if k not in MACHINE}
    return out


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name `text` (leftover workers of a launcher)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{proc.name}: {cmd[:200]}")
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    """The same sweep through Hydra's default (sequential, in-process) launcher."""
    results = tmp_path_factory.mktemp("basic") / "res"
    proc, _ = _sweep(results, [])
    assert proc.returncode == 0, proc.stderr
    records = _records(results)
    assert len(records) == 2
    return records


def _check(results: Path, proc, took_s: float, reference: dict, name: str) -> None:
    print(f"{name} sweep: {took_s:.1f} s")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = _records(results)
    for run in reference.values():  # the records name their own results_dir
        run["config"].pop("results_dir", None)
    for run in got.values():
        run["config"].pop("results_dir", None)
    assert got == reference
    assert took_s < 60
    assert not _processes_mentioning(str(results)), _processes_mentioning(str(results))


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (pip install -e '.[sweep]')")


def test_joblib_sweep(tmp_path, reference):
    _needs("hydra_plugins.hydra_joblib_launcher")
    results = tmp_path / "res"
    proc, took_s = _sweep(results, ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    _check(results, proc, took_s, reference, "joblib")


def test_submitit_local_sweep(tmp_path, reference):
    _needs("hydra_plugins.hydra_submitit_launcher")
    results = tmp_path / "res"
    logs = tmp_path / "submitit"
    proc, took_s = _sweep(results, ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=2",
                                    f"hydra.launcher.submitit_folder={logs}/%j"])
    _check(results, proc, took_s, reference, "submitit_local")
    assert list(logs.glob("*/*_log.out")), "submitit wrote no job logs in the test's folder"


def test_ray_sweep(tmp_path, reference):
    _needs("hydra_plugins.hydra_ray_launcher")
    # Ray's unix sockets live under its temp dir, whose path must stay short (107 bytes):
    # pytest's tmp_path is too long, so a short folder of the test's own, removed after.
    short = Path(tempfile.mkdtemp(prefix="mbray", dir="/tmp"))
    try:
        home, ray_tmp, results = short / "home", short / "ray", short / "res"
        home.mkdir()
        ray_tmp.mkdir()
        env = _env(HOME=str(home), RAY_TMPDIR=str(ray_tmp), RAY_USAGE_STATS_ENABLED="0")
        proc, took_s = _sweep(results, [
            "hydra/launcher=ray", "+hydra.launcher.ray.init.include_dashboard=false",
            "+hydra.launcher.ray.init.num_cpus=2", f"+hydra.launcher.ray.init._temp_dir={ray_tmp}"],
            env=env)
        if proc.returncode != 0 and "ray.init" in proc.stderr and not _records(results):
            pytest.skip(f"Ray cannot start on this machine: {proc.stderr.strip()[-500:]}")
        _check(results, proc, took_s, reference, "ray")
        assert list(ray_tmp.glob("session_*")), "Ray's session is not in the test's folder"
        assert not _processes_mentioning(str(ray_tmp)), _processes_mentioning(str(ray_tmp))
    finally:
        shutil.rmtree(short, ignore_errors=True)
