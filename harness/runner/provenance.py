"""Where a result came from: the code version, and the machine it ran on.

`code_version()` is part of a result's identity: `run_id` hashes the config together with the
git commit and the exact uncommitted changes (tracked edits anywhere in the checkout, plus
untracked files in the project's source and config folders, which a run may load: a new
conf/system/*.yaml, a new systems/*.py). An installed copy (no checkout of its own) has no
commit: its code is the package version and a digest of its source files (`source_sha256`),
which also changes with any edit. Two runs share a run_id only when they ran the same config
on the same code; resume (harness/runner/sweep.py) and the trace cache
(harness/runner/trace_cache.py) compare the same identity, `code_identity()`.

`environment()` describes the machine (BLAS kernel, numpy SIMD features, package versions,
host). It explains a difference between machines but never decides one: results are
byte-identical across machines apart from this block and `timing` (docs/trace-format.md,
"Portable determinism"), and cross-machine comparisons drop both by name
(`MACHINE_KEYS`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from core.paths import PROJECT_ROOT

# Untracked files here can change what a run does; elsewhere (results/, notes) they cannot.
SOURCE_PATHS = ("systems", "workloads", "harness", "analysis", "conf", "pyproject.toml")
# What an installed copy runs (.py under the packages) and reads (conf/**/*.yaml)
PACKAGE_DIRS = ("core", "systems", "workloads", "harness", "analysis", "moebench")
PACKAGES = ("moe-offload-bench", "numpy", "pyarrow", "hydra-core", "omegaconf",
            "threadpoolctl")
# result.json blocks that describe the machine or the wall clock, never the result
MACHINE_KEYS = ("timing", "environment")


def code_version(root: Path = PROJECT_ROOT) -> dict:
    """In a git checkout {"sha", "dirty", "dirty_files", "dirty_sha256"}: HEAD, and a digest
    of every uncommitted change. Elsewhere (an installed copy) those four are None and
    "version" (the installed distribution's, None when it has no metadata) and
    "source_sha256" (`source_sha256(root)`) name the code."""
    git = _git_version(root)
    if git is not None:
        return git
    try:
        version = metadata.version("moe-offload-bench")
    except metadata.PackageNotFoundError:
        version = None
    return {"sha": None, "dirty": None, "dirty_files": None, "dirty_sha256": None,
            "version": version, "source_sha256": source_sha256(root)}


def _git_version(root: Path) -> dict | None:
    """code_version's git block, or None when root is not the top of a git checkout (an
    installed copy in a virtual environment inside some checkout is not that checkout)."""
    def _git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30)

    try:
        head = _git("rev-parse", "--show-toplevel", "HEAD")
        lines = head.stdout.decode().split("\n")
        if head.returncode != 0 or Path(lines[0]).resolve() != Path(root).resolve():
            return None
        tracked = _git("diff", "HEAD", "--binary").stdout  # staged and unstaged edits
        changed = _git("diff", "HEAD", "--name-only").stdout.decode().split()
        untracked = _git("ls-files", "--others", "--exclude-standard", "-z", "--",
                         *SOURCE_PATHS).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        return None
    untracked = sorted(p for p in untracked if p)
    h = hashlib.sha256(tracked)
    for rel in untracked:
        path = root / rel
        h.update(f"\0untracked {rel}\0".encode())
        if path.is_file():
            h.update(path.read_bytes())
    files = sorted(set(changed) | set(untracked))
    return {"sha": lines[1].strip(), "dirty": bool(files),
            "dirty_files": files[:50], "dirty_sha256": h.hexdigest() if files else None}


@lru_cache(maxsize=4)
def source_sha256(root: Path = PROJECT_ROOT) -> str:
    """sha256 of every .py under the packages and every conf/**/*.yaml below root, each
    named by its relative path, in sorted order: the code an installed copy runs. Once per
    process: an installed copy does not change under a running sweep."""
    files = [p for folder in PACKAGE_DIRS for p in (root / folder).rglob("*.py")]
    files += list((root / "conf").rglob("*.yaml"))
    h = hashlib.sha256()
    for rel in sorted(p.relative_to(root).as_posix() for p in files):
        h.update(f"\0{rel}\0".encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def code_known(code: dict) -> bool:
    """Whether code_version's dict names the code (a git sha or a source digest)."""
    return bool(code.get("sha") or code.get("source_sha256"))


def code_identity(code: dict) -> str:
    """The code part of a run's identity, from code_version's dict (or a result's `git`
    block): HEAD and the uncommitted changes' digest, else the installed version and its
    source digest."""
    if code.get("sha") is None and code.get("source_sha256"):
        return f"version:{code.get('version')}|{code['source_sha256']}"
    return f"{code.get('sha')}|{code.get('dirty_sha256')}"


def run_id(config_sha256: str, code: dict) -> str:
    """16 hex digits naming (config, code version): the same config on other code differs."""
    key = f"{config_sha256}|{code_identity(code)}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def package_versions() -> dict:
    out = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _blas() -> list[dict]:
    """Each BLAS/OpenMP library numpy loaded: its API, kernel ('Haswell', ...), threads."""
    try:
        import numpy  # noqa: F401  (loads its BLAS, which threadpoolctl then finds)
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"note": "threadpoolctl not installed"}]
    keep = ("internal_api", "architecture", "num_threads", "version", "threading_layer")
    return [{k: info.get(k) for k in keep} for info in threadpool_info()]


def _numpy_simd() -> dict:
    try:
        from numpy._core._multiarray_umath import (  # the public show_runtime() prints these
            __cpu_baseline__,
            __cpu_dispatch__,
            __cpu_features__,
        )
    except ImportError:
        return {}
    return {"baseline": list(__cpu_baseline__),
            "dispatch_found": [f for f in __cpu_dispatch__ if __cpu_features__.get(f)],
            "disabled_by_env": os.environ.get("NPY_DISABLE_CPU_FEATURES")}


@lru_cache(maxsize=1)
def environment() -> dict:
    """The machine and its numerical libraries (same for every run of one process)."""
    env_vars = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                "NPY_DISABLE_CPU_FEATURES", "PYTHONHASHSEED")
    return {
        "host": {"name": platform.node(), "system": platform.system(),
                 "release": platform.release(), "machine": platform.machine(),
                 "cpu": _cpu_model(), "cpus": os.cpu_count()},
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "blas": _blas(),
        "numpy_simd": _numpy_simd(),
        "env": {k: os.environ.get(k) for k in env_vars},
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
