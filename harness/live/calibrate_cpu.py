"""The host CPU's expert cost for `moebench calibrate`, and the timing helpers it shares.

SimBackend.cpu_expert_ms runs a missed expert on the host CPU in
    max(expert bytes / mem_gbps, 2 * tokens * expert params / cpu_tflops) + cpu_expert_overhead_us
plus the hidden states over the link and back (the GPU profile's link, not measured here).
This module measures the three host parameters with torch on this CPU (docs/calibration.md,
"The host CPU"):
  dtype    bfloat16 or float32, whichever runs the expert faster (a probe at 1 token and the
           largest count; `--cpu-dtype` forces one)
  memory   a sum over a buffer of at least twice the last-level cache: DRAM read GB/s
  expert   one routed expert FFN (the calibrated model's shape) at 1..128 tokens, cycling through
           copies of its weights that together exceed the last-level cache, as a missed
           expert's weights are cold
  fit      the formula above by least squares (fit_cpu_expert)
and writes them as a host profile that core.specs.host_spec_from_dict accepts.
"""

from __future__ import annotations

import datetime
import itertools
import os
import platform
import re
import statistics
import time
from pathlib import Path

import numpy as np
import yaml

from core.atomic import write_text
from core.specs import host_spec_from_dict

MIB, GIB = 2**20, 2**30
CPU_FULL = {"tokens": [1, 2, 4, 8, 16, 32, 64, 128], "min_stream_bytes": GIB,
            "max_bytes": 2 * GIB, "probe_budget_s": 0.1}
# --quick (tests): cache-sized buffers, so the quick figures are not DRAM figures
CPU_QUICK = {"tokens": [1, 4, 16, 64, 128], "min_stream_bytes": 16 * MIB,
             "max_bytes": 16 * MIB, "probe_budget_s": 0.02}
# A median this many times the fastest call of its point means the CPU was busy
NOISY_SPREAD = 3.0
# [G] host RAM the experts cannot have: OS, Python and torch, pinned staging buffers
RESERVE_GB, RESERVE_MAX_FRACTION = 4.0, 0.25


class Timer:
    """Median wall time of fn() in ms: CUDA events on a GPU, perf_counter on the CPU. The
    fastest repetition of the last call is kept as `last_min_ms`."""

    def __init__(self, torch, device: str, budget_s: float):
        self.torch, self.cuda, self.budget_s = torch, device.startswith("cuda"), budget_s
        self.last_min_ms = float("nan")

    def __call__(self, fn, stream=None, max_reps: int = 50) -> float:
        fn()  # warm-up (allocator, kernel selection, page faults)
        times: list[float] = []
        spent = 0.0
        while len(times) < 3 or (spent < self.budget_s and len(times) < max_reps):
            if self.cuda:
                start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
                s = stream or self.torch.cuda.current_stream()
                start.record(s)
                fn()
                end.record(s)
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            times.append(ms)
            spent += ms / 1e3
        self.last_min_ms = min(times)
        return statistics.median(times)


def ffn_weights(torch, h: int, f: int, matrices: int, device, dtype):
    """Weights of one FFN: [h, f] up (and gate for 3 matrices), [f, h] down."""
    def weight(rows: int, cols: int):
        return torch.randn(rows, cols, device=device, dtype=dtype) * 0.02
    return [weight(h, f) for _ in range(matrices - 1)] + [weight(f, h)]


def run_ffn(torch, x, ws):
    """x [T, h] -> [T, h]: SwiGLU for 3 matrices, ReLU for 2."""
    if len(ws) == 3:
        return (torch.nn.functional.silu(x @ ws[0]) * (x @ ws[1])) @ ws[2]
    return torch.relu(x @ ws[0]) @ ws[1]


def host_ram_gb() -> float:
    """Installed RAM in GiB (sysconf's physical pages: /proc/meminfo's MemTotal on Linux)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def _free_bytes() -> int:
    """RAM free now (MemAvailable; sysconf's free pages where /proc/meminfo is absent)."""
    try:
        text = Path("/proc/meminfo").read_text()
        return int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1)) * 1024
    except (OSError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def llc_bytes() -> int:
    """Size of the last-level cache as sysfs lists it for cpu0 (32 MiB where unknown)."""
    best = (0, 32 * MIB)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            m = re.fullmatch(r"(\d+)([KMG]?)", (index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if m and level >= best[0]:
            best = (level, int(m.group(1)) * {"": 1, "K": 2**10, "M": MIB, "G": GIB}[m.group(2)])
    return best[1]


def cpu_name() -> str:
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        m = None
    return m.group(1).strip() if m else (platform.processor() or platform.machine())


def _pick_dtype(torch, shape: tuple[int, int, int], tokens: list[int], choice: str,
                budget_s: float) -> tuple[object, dict]:
    """(dtype, probe): `choice` unless "auto"; else the dtype whose expert time at 1 token
    plus at the largest count is lower (bf16 kernels are slow on CPUs without bf16 units)."""
    if choice != "auto":
        return getattr(torch, choice), {"choice": choice, "reason": "--cpu-dtype"}
    h, f, matrices = shape
    timer, probe = Timer(torch, "cpu", budget_s), {}
    for dtype in (torch.bfloat16, torch.float32):
        ws = ffn_weights(torch, h, f, matrices, "cpu", dtype)
        xs = {n: torch.randn(n, h, dtype=dtype) for n in (tokens[0], tokens[-1])}
        probe[str(dtype).removeprefix("torch.")] = {
            n: timer(lambda x=x, ws=ws: run_ffn(torch, x, ws)) for n, x in xs.items()}
    best = min(probe, key=lambda name: sum(probe[name].values()))
    return getattr(torch, best), {"choice": "auto", "reason": "faster in the probe",
                                  "probe_ms": probe}


def _expert_points(torch, timer: Timer, shape, dtype, tokens, pool_bytes: int) -> dict:
    """Median ms of one expert call per token count, each call on the next copy of the
    weights (copies enough to fill pool_bytes, so the weights come from DRAM, not a cache)."""
    h, f, matrices = shape
    base = ffn_weights(torch, h, f, matrices, "cpu", dtype)
    nbytes = sum(w.numel() * w.element_size() for w in base)
    copies = max(1, -(-pool_bytes // nbytes))
    pool = itertools.cycle([base] + [[w.clone() for w in base] for _ in range(copies - 1)])
    points = []
    for n in tokens:
        x = torch.randn(n, h, dtype=dtype)
        ms = timer(lambda x=x: run_ffn(torch, x, next(pool)))
        points.append({"tokens": n, "ms": ms, "min_ms": timer.last_min_ms})
    return {"copies": copies, "pool_bytes": copies * nbytes, "points": points}


def measure_host(torch, shape: tuple[int, int, int], quick: bool, threads: int,
                 dtype_choice: str, budget_s: float) -> dict:
    """The CPU sweep with torch.set_num_threads(threads), restored afterwards; `shape` is one
    expert's (hidden, ffn width, matrices)."""
    cfg = CPU_QUICK if quick else CPU_FULL
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtype, choice = _pick_dtype(torch, shape, cfg["tokens"], dtype_choice,
                                    cfg["probe_budget_s"])
        llc = llc_bytes()
        # twice the cache, at most max_bytes and a quarter of the free RAM
        room = min(cfg["max_bytes"], _free_bytes() // 4)
        timer = Timer(torch, "cpu", budget_s)
        stream_bytes = min(max(cfg["min_stream_bytes"], 2 * llc), room) // 4 * 4
        buf = torch.ones(stream_bytes // 4, dtype=torch.float32)
        stream_ms = timer(buf.sum)
        del buf
        pool_bytes = min(2 * llc, room)
        sweep = _expert_points(torch, timer, shape, dtype, cfg["tokens"], pool_bytes)
    finally:
        torch.set_num_threads(before)
    h, f, matrices = shape
    params = matrices * h * f
    m = {"threads": threads, "dtype": str(dtype).removeprefix("torch."), "dtype_choice": choice,
         "cpu": cpu_name(), "llc_bytes": llc, "quick": quick,
         "stream": {"bytes": stream_bytes, "ms": stream_ms,
                    "gbps": stream_bytes / stream_ms / 1e6},
         "expert": {"hidden": h, "ffn": f, "matrices": matrices, "params": params,
                    "bytes": params * torch.empty((), dtype=dtype).element_size()},
         **sweep}
    m["fit"] = fit_cpu_expert([p["tokens"] for p in m["points"]], [p["ms"] for p in m["points"]],
                              m["expert"]["bytes"], params, m["stream"]["gbps"])
    for p, fit_ms in zip(m["points"], m["fit"].pop("fit_ms")):
        p.update(tflops=2 * p["tokens"] * params / p["ms"] / 1e9, fit_ms=fit_ms)
    return m


def _line(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of t against n by least squares in relative error (rows weighted
    1/t, as the fit is scored); through the origin when the intercept or the slope comes out
    negative (noise), so neither is ever negative."""
    w = 1.0 / t
    if len(n) > 1:
        (a, b), *_ = np.linalg.lstsq(np.stack([w, n * w], axis=1), np.ones_like(t), rcond=None)
        if a >= 0 and b > 0:
            return float(a), float(b)
    return 0.0, float((n * w) @ np.ones_like(t) / ((n * w) @ (n * w)))


def _candidates(n: np.ndarray, t: np.ndarray, stream_ms: float | None):
    """(plateau points, mem_ms, source, ms per token, overhead ms) for every split of the
    sorted points into a plateau (the first s, s >= 1) and a line (the rest, >= 2 points)."""
    for s in range(1, len(n) - 1):
        intercept, per_token = _line(n[s:], t[s:])
        plateau = float((1 / t[:s]).sum() / (1 / t[:s] ** 2).sum())  # least relative error
        plateau_ms = plateau - intercept  # the plateau less the overhead
        if stream_ms is not None:
            residual = t[:s] - np.maximum(stream_ms, n[:s] * per_token)
            yield s, stream_ms, "stream", per_token, max(0.0, float(residual.mean()))
        if plateau_ms > 0:
            yield s, plateau_ms, "expert plateau", per_token, intercept


def fit_cpu_expert(tokens, times_ms, expert_bytes: float, expert_params: float,
                   stream_gbps: float | None = None) -> dict:
    """Fit t(n) = max(mem_ms, n * ms_per_token) + overhead to measured expert times.

    The points, sorted by tokens, are split into a plateau (the first s, s >= 1) and a line
    through the rest (least squares in relative error, intercept and slope never negative):
    the slope gives cpu_tflops. Memory time and overhead come, for each split, two ways: (a)
    the line's intercept is the overhead and mem_ms = plateau level - overhead (the level
    with the least squared relative error over the plateau); (b) mem_ms is the plain
    bandwidth measurement (`stream_gbps`) and the overhead the plateau's mean residual against
    max(mem_ms, flops), clipped at 0. The candidate with the least sum of squared relative
    errors wins (`mem_from` says which; (b) on a tie, as where every point is FLOP-bound and
    the times say nothing of memory). Times generated by the formula come back exactly.
    """
    order = np.argsort(tokens)
    n = np.asarray(tokens, dtype=np.float64)[order]
    t = np.asarray(times_ms, dtype=np.float64)[order]
    stream_ms = expert_bytes / (stream_gbps * 1e6) if stream_gbps else None
    best = None
    for s, mem_ms, mem_from, per_token, overhead in _candidates(n, t, stream_ms):
        pred = np.maximum(mem_ms, n * per_token) + overhead
        score = float((((pred - t) / t) ** 2).sum())
        if best is None or score < best[0] - 1e-12:  # a tie keeps the measured bandwidth
            best = (score, s, mem_ms, mem_from, per_token, overhead, pred)
    if best is None:
        raise ValueError("fit_cpu_expert: needs 3 points or more and a plateau above the "
                         "line's intercept, or stream_gbps")
    _, s, mem_ms, mem_from, per_token, overhead, pred = best
    fit_ms = np.empty_like(pred)
    fit_ms[order] = pred
    return {"mem_gbps": expert_bytes / mem_ms / 1e6,
            "cpu_tflops": 2 * expert_params / per_token / 1e9,
            "cpu_expert_overhead_us": overhead * 1e3, "plateau_points": s, "mem_from": mem_from,
            "worst_rel_err": float(np.max(np.abs(pred - t) / t)), "fit_ms": fit_ms.tolist()}


def _host_yaml(name: str, m: dict, command: str) -> tuple[dict, str]:
    """The host profile and its yaml text, each value tagged with where it came from."""
    fit, day = m["fit"], datetime.date.today().isoformat()
    dram = host_ram_gb()
    here = f"[R] measured here {day}"
    profile = {
        "name": name,
        "display_name": f"{m['cpu']}, {m['threads']} thread(s), torch {m['dtype']} "
                        f"(calibrated{', quick' if m['quick'] else ''})",
        "dram_gb": round(dram, 3),
        "reserve_gb": round(min(RESERVE_GB, dram * RESERVE_MAX_FRACTION), 3),
        "mem_gbps": round(fit["mem_gbps"], 3), "cpu_tflops": round(fit["cpu_tflops"], 6),
        "cpu_expert_overhead_us": round(fit["cpu_expert_overhead_us"], 3)}
    notes = {
        "dram_gb": f"{here}: total RAM (sysconf, /proc/meminfo MemTotal)",
        "reserve_gb": f"[G] OS, Python and torch, staging buffers: min({RESERVE_GB:g} GiB, "
                      f"dram_gb * {RESERVE_MAX_FRACTION:g}); not measured",
        "mem_gbps": f"{here}: " + (
            "expert bytes / (small-token plateau - overhead); a plain sum read "
            f"{m['stream']['gbps']:.2f} GB/s" if fit["mem_from"] != "stream" else
            "a plain sum's read rate (it fit the expert times best)"),
        "cpu_tflops": f"{here}: 2 * expert params / the slope of the larger token counts",
        "cpu_expert_overhead_us": f"{here}: " + (
            "that line's intercept" if fit["mem_from"] != "stream" else
            "the small-token times less max(memory, FLOP) time")}
    head = (f"# Host CPU, calibrated on {platform.node()}, {day}, by\n# `{command}`:\n"
            f"# torch {m['dtype']} kernels, torch.set_num_threads({m['threads']}). Raw points "
            f"and the fit\n# (worst relative error {fit['worst_rel_err']:.0%}): "
            f"../{name}.sweep.json, key \"cpu\".\n# torch's CPU kernels, not "
            f"kTransformers' AMX or llama.cpp kernels: a lower bound\n"
            f"# on what optimised CPU kernels reach (docs/calibration.md).\n")
    if m["quick"]:
        head += "# --quick: a scaled-down expert and cache-sized buffers, not DRAM figures.\n"
    body = "".join(yaml.safe_dump({k: v}, width=10**6).rstrip("\n")
                   + (f"  # {notes[k]}\n" if k in notes else "\n") for k, v in profile.items())
    return profile, head + body


def write_host_profile(folder: Path, name: str, m: dict, command: str) -> tuple[dict, Path]:
    """<folder>/host/<name>.yaml, written once host_spec_from_dict accepts what it will read."""
    profile, text = _host_yaml(name, m, command)
    host_spec_from_dict(yaml.safe_load(text), where=f"calibrated host profile {name}")
    path = folder / "host" / f"{name}.yaml"
    write_text(path, text)
    return profile, path


def cpu_report(m: dict) -> list[str]:
    fit = m["fit"]
    e = m["expert"]
    lines = [f"host CPU: {m['cpu']}, {m['threads']} thread(s), {m['dtype']} "
             f"({m['dtype_choice']['reason']}); expert {e['hidden']} x {e['ffn']} x "
             f"{e['matrices']}, {m['copies']} weight copies ({m['pool_bytes'] / MIB:.0f} MiB, "
             f"last-level cache {m['llc_bytes'] / MIB:.0f} MiB)",
             f"host memory read bandwidth: {m['stream']['gbps']:.2f} GB/s "
             f"(sum over {m['stream']['bytes'] / MIB:.0f} MiB)",
             f"{'cpu expert':<12}{'tokens':>8}{'ms':>10}{'fit ms':>10}{'error':>8}"]
    lines += [f"{'':<12}{p['tokens']:>8}{p['ms']:>10.4f}{p['fit_ms']:>10.4f}"
              f"{(p['fit_ms'] - p['ms']) / p['ms']:>8.1%}" for p in m["points"]]
    lines.append(f"fit max(bytes/mem, flops/peak) + overhead: mem {fit['mem_gbps']:.2f} GB/s "
                 f"(from the {fit['mem_from']}), {fit['cpu_tflops']:.4f} TFLOP/s, overhead "
                 f"{fit['cpu_expert_overhead_us']:.1f} us; worst relative error "
                 f"{fit['worst_rel_err']:.1%}")
    spread = max(p["ms"] / p["min_ms"] for p in m["points"])
    if spread > NOISY_SPREAD:
        lines.append(f"warning: a median is {spread:.0f}x its fastest call: the CPU was busy "
                     f"(other processes, threads descheduled); rerun on an idle machine or "
                     f"with --cpu-threads 1")
    return lines
