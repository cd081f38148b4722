"""Result files: result.json (schema v1) and per-access / per-token / per-transfer parquet.

A run directory is written whole into a temporary sibling and renamed into place, so a
failed run leaves no partial result behind. result.json is written with sorted keys and a
fixed indent; everything except its `timing` block is byte-identical for the same config
and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

RESULT_SCHEMA_VERSION = "1.0"
PARQUET_SCHEMA_VERSION = "1.0"
# Config keys that change where or how a run is shown, not what it computes.
NON_SEMANTIC_KEYS = ("progress", "results_dir", "run_name", "experiment_name", "wandb")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def config_hash(config: dict) -> str:
    semantic = {k: v for k, v in config.items() if k not in NON_SEMANTIC_KEYS}
    return hashlib.sha256(canonical_json(semantic).encode()).hexdigest()


def git_info() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, timeout=10)
    try:
        sha = git("rev-parse", "HEAD")
        if sha.returncode != 0:
            return {"sha": None, "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"sha": sha.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}


def package_versions() -> dict:
    out = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in ("moe-offload-bench", "numpy", "pyarrow", "hydra-core", "omegaconf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _parquet(columns: dict[str, np.ndarray], path: Path, schema_name: str, run_id: str,
             request_ids: list[str] | None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(next(iter(columns.values()))) if columns else 0
    arrays = {"run_id": pa.array([run_id] * n, type=pa.string())}
    if request_ids is not None and "request" in columns:
        # The trace's request id for each row, dictionary-encoded (a few bytes per row).
        arrays["request_id"] = pa.DictionaryArray.from_arrays(
            pa.array(columns["request"], type=pa.int32()), pa.array(request_ids, pa.string()))
    arrays.update({k: pa.array(v) for k, v in columns.items()})
    table = pa.table(arrays)
    table = table.replace_schema_metadata({
        b"moebench.schema": schema_name.encode(),
        b"moebench.schema_version": PARQUET_SCHEMA_VERSION.encode()})
    pq.write_table(table, path, compression="zstd")


def write_run(run_dir: Path, result: dict, tables: dict | None,
              request_ids: list[str] | None = None) -> Path:
    """Write result.json (+ parquet tables) atomically into run_dir; returns run_dir."""
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.parent / f".{run_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        if tables is not None:
            run_id = result["run_id"]
            for name in ("accesses", "tokens", "transfers"):
                _parquet(tables[name], tmp / f"{name}.parquet", name, run_id, request_ids)
        text = json.dumps(result, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False)
        (tmp / "result.json").write_text(text + "\n")
        if run_dir.exists():
            old = run_dir.parent / f".{run_dir.name}.old-{os.getpid()}"
            os.replace(run_dir, old)
            os.replace(tmp, run_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, run_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return run_dir


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())
