"""`moebench reproduce --launcher ray`: two small experiments (Table 1's glob of systems and
the EAMC capacity sweep, one seed, tiny requests) handed to a local Ray instance with 2 CPUs
as one sweep write the same run folders, records and report files, byte for byte, as the
same command run one job after another (Hydra's basic launcher, `--jobs 1`). Ray's HOME,
temp dir and session stay in a short folder of the test's own, with no dashboard.

About 21 s on the 2-core development machine (66 s while other jobs kept both cores busy):
it runs in `make test`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

EXPERIMENTS = ("table1", "eamc_capacity")
TINY = ("workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2")
FOLDERS = tuple(f"{name}-calibration_requests=2,workload.num_requests=2,workload.output_len=2,"
                "workload.prompt_len=8" for name in EXPERIMENTS)
MACHINE = ("timing", "environment")  # the blocks of a record that describe the machine


def _reproduce(cwd: Path, extra: list[str], env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moebench.cli", "reproduce", *EXPERIMENTS, "--seeds", "1",
           "--results", "r", *(f"--override={o}" for o in TINY), *extra]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _outputs(results: Path) -> dict[str, bytes | dict]:
    """{path under results: report file bytes, or a record less its machine blocks}."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((results / folder).iterdir()):
            key = f"{folder}/{path.name}"
            if path.is_dir():
                record = json.loads((path / "result.json").read_text())
                out[key] = {k: v for k, v in record.items() if k not in MACHINE}
            elif path.name != "multirun.yaml":  # it names the launcher
                out[key] = path.read_bytes()
    return out


def test_ray_runs_the_suite_as_one_sweep_like_a_local_run():
    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None or \
            importlib.util.find_spec("ray") is None:
        pytest.skip("ray or its Hydra launcher not installed (pip install -e '.[sweep]')")
    # Ray's unix sockets live under its temp dir, whose path must stay short (107 bytes)
    short = Path(tempfile.mkdtemp(prefix="mbrep", dir="/tmp"))
    try:
        local, remote, home, ray_tmp = (short / n for n in ("local", "ray", "home", "rt"))
        for folder in (local, remote, home, ray_tmp):
            folder.mkdir()
        env = {**{k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"},
               "MOEBENCH_SHARED_DATA": str(short / "absent"), "HOME": str(home),
               "RAY_TMPDIR": str(ray_tmp), "RAY_USAGE_STATS_ENABLED": "0"}
        done = _reproduce(local, ["--jobs", "1"], env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        ray = _reproduce(remote, ["--launcher", "ray", "--launcher-arg=ray.init.num_cpus=2",
                                  "--launcher-arg=ray.init.include_dashboard=false",
                                  f"--launcher-arg=ray.init._temp_dir={ray_tmp}"], env)
        if ray.returncode != 0 and "ray.init" in ray.stderr and \
                not (remote / "r" / FOLDERS[0]).is_dir():
            pytest.skip(f"Ray cannot start on this machine: {ray.stderr.strip()[-500:]}")
        assert ray.returncode == 0, ray.stdout[-2000:] + ray.stderr[-3000:]
        # one launcher call: table1's 11 systems + eamc_capacity's 7 capacities for
        # moe_infinity and its variant, one seed: 11 + 14
        assert "reproduce: 25 jobs in one sweep" in ray.stdout
        assert "hydra/launcher=ray" in ray.stdout
        assert "reproduce table1: 11 done, 0 failed, 0 skipped" in ray.stdout
        assert "reproduce eamc_capacity: 14 done, 0 failed, 0 skipped" in ray.stdout
        want, got = _outputs(local / "r"), _outputs(remote / "r")
        assert sorted(got) == sorted(want)
        assert len([k for k in got if k.endswith((".md", ".csv", ".tex", ".png", ".pdf"))]) \
            == 10
        for key in want:
            assert got[key] == want[key], key
        assert list(ray_tmp.glob("session_*")), "Ray's session is not in the test's folder"
    finally:
        shutil.rmtree(short, ignore_errors=True)
