"""Portable determinism (docs/trace-format.md, "Portable determinism"): every OpenBLAS kernel
x numpy SIMD level this CPU can run gives one trace sha256, one calibration sha256, the same
core.numerics bits and an identical result.json for every system (apart from `timing` and
`environment`). The lowest SIMD level also turns off glibc's FMA/AVX2 variants of exp and
log (which numpy's samplers and the math module call). Each combination is a subprocess
(tests/portable_child.py); one the CPU cannot execute is skipped with a printed reason and a
warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("portable_child.py")
# OPENBLAS_CORETYPE -> the /proc/cpuinfo flags its kernels execute (SSE3 is "pni" there)
KERNELS = {"Haswell": {"avx2", "fma"},
           "SkylakeX": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"},
           "Sandybridge": {"avx"}, "Prescott": {"pni"}}


def cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def simd_levels() -> tuple[dict[str, dict], list[str]]:
    """Environments of the SIMD levels: every path on; numpy's AVX512 groups off; every
    group numpy dispatches off (its baseline only) and glibc's FMA/AVX2 math off. Only
    groups numpy finds on this CPU can be disabled. Returns (levels, reasons for the levels
    skipped)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    found = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    avx512 = [f for f in found if f.startswith("AVX512") or f == "X86_V4"]
    levels, skipped = {"all": {"NPY_DISABLE_CPU_FEATURES": ""}}, []
    if avx512:
        levels["no-avx512"] = {"NPY_DISABLE_CPU_FEATURES": " ".join(avx512)}
    else:
        skipped.append("no-avx512: numpy finds no AVX512 group on this CPU")
    if len(found) > len(avx512):
        levels["baseline"] = {"NPY_DISABLE_CPU_FEATURES": " ".join(found),
                              "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA"}
    else:
        skipped.append("baseline: numpy dispatches nothing beyond AVX512 groups here")
    return levels, skipped


def combinations() -> tuple[list[tuple[str, dict]], list[str]]:
    """[(label, environment)] and the skip reasons."""
    flags = cpu_flags()
    levels, skipped = simd_levels()
    combos = []
    for kernel, needs in KERNELS.items():
        if flags is None:
            skipped.append(f"{kernel}: no /proc/cpuinfo to check its instructions")
            continue
        if not needs <= flags:
            skipped.append(f"{kernel}: the CPU lacks {' '.join(sorted(needs - flags))}")
            continue
        combos += [(f"{kernel}/{name}", {"OPENBLAS_CORETYPE": kernel, **level})
                   for name, level in levels.items()]
    if not combos:  # e.g. not x86: the SIMD levels on the kernel OpenBLAS picks itself
        combos = [(f"default/{name}", level) for name, level in levels.items()]
    return combos, skipped


def run_child(combo, tmp: Path) -> dict:
    label, combo_env = combo
    work = tmp / label.replace("/", "-")
    work.mkdir()
    env = {**os.environ, **combo_env, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    proc = subprocess.run([sys.executable, str(CHILD), str(work / "out.json")], cwd=work,
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{label}: child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((work / "out.json").read_text())


def first_difference(a, b, path: str = "") -> str:
    """Where two JSON values first differ, as a key path with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return first_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} vs {b!r}"


def test_one_trace_and_one_result_on_every_kernel_and_simd_path(tmp_path):
    combos, skipped = combinations()
    for reason in skipped:
        print(f"test_portable: skipped {reason}")
        warnings.warn(f"test_portable: skipped {reason}", stacklevel=1)
    if len(combos) < 2:
        pytest.skip(f"fewer than two combinations run here ({skipped})")
    with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: two children at a time
        outs = dict(zip([c[0] for c in combos], pool.map(lambda c: run_child(c, tmp_path),
                                                         combos)))
    ref_label, ref = combos[0][0], outs[combos[0][0]]
    assert len(ref["results"]) >= 8, sorted(ref["results"])
    for label, out in outs.items():
        for key in ("trace", "calibration", "numerics", "matching"):
            assert out[key] == ref[key], f"{key} sha256: {label} {out[key][:16]} vs " \
                                         f"{ref_label} {ref[key][:16]}"
        for system, result in out["results"].items():
            if result != ref["results"][system]:
                where = first_difference(result, ref["results"][system])
                note = (" (the checkout changed while the test ran: rerun)"
                        if where.startswith(".git") else "")
                raise AssertionError(f"{system}: {label} vs {ref_label} differ at {where}{note}")
    print(f"test_portable: {len(combos)} combinations, trace {ref['trace'][:16]}")
