"""No tracked source, test or config file holds an absolute path of a machine.

Data is found through core/shared_data.py (MOEBENCH_SHARED_DATA or ../shared/data beside the
checkout) and results through `results_dir`, so a clone works wherever it sits. The checkout's
own location and its parent are computed here, at test time, and must appear nowhere; any
other absolute path (two or more segments, after a blank, quote, '=', '(' or ',') must be in
ALLOWED, each entry saying why it is the same on every machine.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".ini", ".txt")
SCANNED_NAMES = ("Makefile", "run")  # the Makefile and .ci/run
ALLOWED = {
    "/usr/bin/env": "shebang of .ci/run and scripts: finds bash on any POSIX system",
    "/proc/cpuinfo": "the Linux kernel's CPU description (harness/runner/provenance.py), "
                     "fixed by the kernel, the same path on every Linux machine",
    "/dev/null": "the POSIX null device",
    "/proc/nope": "a path under Linux's /proc, where no process can create a folder: the "
                  "unusable trace cache of tests/runner/test_fault_matrix.py",
    "/proc/self/status": "the Linux kernel's view of the running process (VmRSS, "
                         "harness/bench/process.py), the same path on every Linux machine",
    "/proc/self/clear_refs": "writing 5 resets the running process's peak RSS (Linux; "
                             "harness/bench/sim_child.py measures the engine stage's own peak)",
    "/sys/devices/system/cpu/cpu0/cache": "the Linux kernel's description of CPU 0's caches "
                                          "(harness/live/calibrate_cpu.py sizes its weight "
                                          "copies past the last-level cache), the same path "
                                          "on every Linux machine",
    "/proc/meminfo": "the Linux kernel's memory counters (MemAvailable: the runner refuses a "
                     "run too large for the machine, harness/runner/footprint.py)",
}
# A Hydra defaults-list entry names a config group from the config root (written here with
# '|' for '/': `- override |hardware|host: x`, `- |system|evictor@_here_: lru`): a group
# path, not a file path.
HYDRA_GROUP = re.compile(r"^\s*- (?:override )?/[\w/]+(?:@[\w.]+)?:")
ABSOLUTE = re.compile(r"(?:^|(?<=[\s'\"=(,\[]))/[A-Za-z][\w.+-]*(?:/[\w.+-]+)+")


def tracked_files() -> list[Path]:
    proc = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout ({proc.stderr.strip()}): the tracked set is unknown")
    paths = [ROOT / rel for rel in proc.stdout.splitlines()]
    return [p for p in paths if p.is_file() and (p.suffix in SCANNED_SUFFIXES
                                                 or p.name in SCANNED_NAMES)]


def _slashed(text: str) -> str:
    """Examples are written with '|' for '/' so that this file passes its own check."""
    return text.replace("|", "/")


def test_the_pattern_finds_what_it_should():
    line = _slashed('a = "|home|me|data.csv"; b = Path("|work|x")  # 1|2, GB|s, "|t.parquet"')
    assert ABSOLUTE.findall(line) == [_slashed("|home|me|data.csv"), _slashed("|work|x")]
    assert ABSOLUTE.findall(_slashed("cmd --out |tmp|run_2|out")) == [_slashed("|tmp|run_2|out")]
    assert ABSOLUTE.findall("override /model: x, a/b/c, $(VENV)/bin/python, d/L") == []


def test_no_tracked_file_holds_a_machine_path():
    here, parent = str(ROOT), str(ROOT.parent)
    found = []
    for path in tracked_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            rel = path.relative_to(ROOT)
            if here in line or f"{parent}/" in line:
                found.append(f"{rel}:{n}: names this checkout's location: {line.strip()}")
            if path.suffix == ".yaml" and HYDRA_GROUP.match(line):
                continue
            for hit in ABSOLUTE.findall(line):
                if hit not in ALLOWED:
                    found.append(f"{rel}:{n}: absolute path {hit!r}")
    assert not found, "\n".join(found)
