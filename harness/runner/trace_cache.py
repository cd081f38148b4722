"""Generated traces shared on disk by every job of a sweep (and by later sweeps).

    <trace_cache_dir>/<version>/<key>.npz        one synthetic trace (trace v1, uncompressed)
    <trace_cache_dir>/<version>/.<key>.lock      flock held while one process generates it

trace_cache_dir (conf/config.yaml, default `.trace_cache` where moebench runs, git-ignored;
null: no cache) is kept apart from results_dir: it is a cache, not a result, and a run refused
for bad input leaves results_dir as it was even when its trace was already generated.
<version> is 16 hex digits of the code version below; writing a trace removes the folders
of other code versions that the cache itself created (each holds the marker file
`.moebench-trace-cache`; nothing unmarked, no symlink, nothing outside the root is ever
removed), so the cache holds one code version's traces (a Table 1 trace is about 126 MB
uncompressed) instead of growing with every edit. A root that cannot be used (a file, a
read-only or full disk) gives one warning and an uncached run.

The key is the sha256 of the generator config (what load_routing memoizes in memory: model
name, expert bits, the workload dict with its split, seed and request count), the whole model
spec (an override of a model field under the same model name must not find the other
model's trace) and the code version, the same identity as a run's (harness/runner/
provenance.py, code_identity: HEAD plus a digest of the uncommitted changes; outside a git
checkout, the installed version plus a digest of every source file and config). Any code
change is a new key: a stale trace is never read, at the price of regenerating after an
unrelated edit.

A miss takes the key's lock, looks again (another job may have just written it), generates,
and writes atomically (core/trace.write_trace: hidden temporary sibling, then one rename), so
N jobs that start together generate the trace once and the others wait for it, then read it.
The lock is an flock: a killed generator releases it and the next job generates. Files are
read with core.trace.read_trace (checksum checked, no pickle); an unreadable file is
regenerated in place. A hit gives the same content sha256 as generating; the reader's own
additions to `meta` (format, version, checksum) are dropped and `source` is the generator's,
so result.json is the same for a hit and a miss. Delete the folder to reclaim space.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import re
import shutil
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from core.trace import Trace, TraceError, read_trace, write_trace
from harness.runner.provenance import code_identity, code_version
from harness.runner.results import canonical_json

# The file that marks a version folder as the cache's own; only marked folders are pruned
MARKER = ".moebench-trace-cache"
_VERSION_NAME = re.compile(r"[0-9a-f]{16}")
# meta keys read_trace adds that a generated trace does not carry
_READER_META = ("format", "version", "content_sha256")
_GENERATED_SOURCE = next(f.default for f in dataclasses.fields(Trace) if f.name == "source")


@lru_cache(maxsize=1)
def code_key() -> str:
    """The code version part of the key, once per process (a sweep's job runs one code)."""
    return code_identity(code_version())


def cache_key(generator_key: str, model) -> str:
    """32 hex digits naming (generator config, model spec, code version)."""
    text = canonical_json({"generator": generator_key, "model": dataclasses.asdict(model),
                           "code": code_key()})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def version_dir() -> str:
    """The per-code-version folder name: 16 hex digits of code_key()."""
    return hashlib.sha256(code_key().encode()).hexdigest()[:16]


def cache_path(root: str | os.PathLike, key: str) -> Path:
    return Path(root) / version_dir() / f"{key}.npz"


def _mark(folder: Path) -> None:
    """Claim a version folder the cache created as its own (only marked folders are ever
    removed)."""
    (folder / MARKER).write_text("moebench trace cache: this folder may be removed\n")


def _prune_other_versions(root: Path, keep: str) -> None:
    """Remove the cache folders of other code versions that this cache created: a real
    folder (no symlink) directly under the root, named like a version and holding the
    cache's marker. Anything else under the root is left alone, so trace_cache_dir pointed
    at a folder of the user's (even results/) deletes nothing of theirs. Best effort: a
    folder another process is writing may be recreated, and a reader that loses a file
    regenerates it."""
    for other in root.iterdir() if root.is_dir() and not root.is_symlink() else ():
        if (other.name != keep and _VERSION_NAME.fullmatch(other.name) and not other.is_symlink()
                and other.is_dir() and (other / MARKER).is_file()):
            shutil.rmtree(other, ignore_errors=True)


def _read(path: Path) -> Trace | None:
    """The cached trace as the generator returns it, or None when absent or unreadable."""
    if not path.is_file():
        return None
    try:
        tr = read_trace(path)
    except (TraceError, OSError) as exc:
        print(f"moebench: warning: trace cache {path}: {exc}; generating it again",
              file=sys.stderr)
        return None
    for key in _READER_META:
        tr.meta.pop(key, None)
    tr.source = _GENERATED_SOURCE
    return tr


class _KeyLock:
    """Blocking flock on `.<key>.lock`: one generator per key at a time, across processes."""

    def __init__(self, path: Path):
        self.path = path.with_name(f".{path.stem}.lock")
        self.fd: int | None = None

    def __enter__(self) -> _KeyLock:
        folder = self.path.parent
        if not folder.exists():  # created here, so the cache's own: marked for pruning
            folder.mkdir(parents=True, exist_ok=True)
            _mark(folder)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # waits while another job generates this trace
        return self

    def __exit__(self, *exc) -> None:
        # The lock file stays (hidden, a few bytes): unlinking it while another process waits
        # on it would let a third lock a new file and generate beside it.
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def cached_trace(root: str | os.PathLike, generator_key: str, model,
                 generate: Callable[[], Trace]) -> Trace:
    """The trace `generate()` makes, from the shared cache under `root` when a job already
    made it. A cache folder that cannot be used (not a folder, not writable, a full disk)
    costs the cache, never the run: one warning, and the trace is generated uncached."""
    path = cache_path(root, cache_key(generator_key, model))
    tr = _read(path)
    if tr is not None:
        return tr
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(_KeyLock(path))
        except OSError as exc:
            print(f"moebench: warning: trace cache {root} is not usable ({exc}); generating "
                  "the trace without it", file=sys.stderr)
            return generate()
        tr = _read(path)  # written while this job waited for the lock
        if tr is not None:
            return tr
        tr = generate()
        try:
            _prune_other_versions(Path(root), path.parent.name)
            write_trace(tr, path, compress=False)
        except OSError as exc:  # a full or read-only disk costs the cache, never the run
            print(f"moebench: warning: trace cache {path} not written: {exc}", file=sys.stderr)
    return tr
