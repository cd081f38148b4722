"""One system at one setting of `moebench bench-sim` (harness/bench/sim.py), in a fresh child
process: its engine runs, the reference loop beside each, and, at a setting that is not the
Table 1 one (1,000 requests, batch 32), the engine at the Table 1 setting beside each too.

Why the engine at the Table 1 setting: the issue's scaling targets compare the engine's
per-access cost at 1,000 requests (batch 32) with its cost at 290 requests (batch 1). Taken
from two child processes, each over its own reference loop, that comparison carried the
children's drift: the reference loop's median moved by up to 30 % between children on a
shared 2-core VM, more than the engine did. Run alternately in one process, each run's cost
is measured against the Table 1 runs on either side of it, in the same state of the machine.
"""

from __future__ import annotations

import gc
import math
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.bench.process import cpu_s_of, current_rss_mb, peak_rss_mb, reset_peak, trim_heap

if TYPE_CHECKING:  # imported late: the child's first figures are taken before its imports
    from harness.runner.run_types import Run

# A setting's engine runs continue past --repeats until they add up to --min-cpu-s (at most
# MAX_RUNS runs): the reference loop beside them varies by up to 65 % run to run on a shared
# 2-core VM, and more pairs steady the median where runs are cheap.
MAX_RUNS = 7


def paired_ratios(n_acc: int, run_cpu_s: list[float], ref_n: int,
                  ref_cpu_s: list[float]) -> list[float]:
    """Engine / reference accesses per CPU-s of each run. Reference run i follows engine run
    i, so run i > 0 lies between reference runs i - 1 and i and is measured against their
    mean; run 0 (its memory figures and result writing come first) against the one after."""
    beside = [ref_cpu_s[0]] + [(a + b) / 2 for a, b in zip(ref_cpu_s, ref_cpu_s[1:])]
    return [(n_acc / run) / (ref_n / ref) for run, ref in zip(run_cpu_s, beside)]


def _setting(system_name: str, requests: int, max_batch: int) -> tuple[Run, float]:
    """The run of one setting, assembled as the runner assembles it (its traces hold the
    per-token fields the system reads), and the CPU seconds that took (trace generation,
    above all)."""
    from harness.runner.assembly import assemble
    from harness.runner.config import compose_config

    # No on-disk trace cache: every child generates its trace, so generation is timed alike.
    cfg = compose_config(["experiment=table1", f"workload.num_requests={requests}",
                          f"max_batch={max_batch}", "progress=false", "trace_cache_dir=null",
                          f"system={system_name}"])
    return cpu_s_of(lambda: assemble(cfg))


def _system(s: Run):
    """A fresh system of the run, as the runner builds it."""
    from harness.runner.assembly import build_system

    return build_system(s.cfg)


def one_run(s: Run, system, notes: dict, memory: dict | None = None):
    """One engine run from the in-memory traces to the summary: (CPU-s parts, tables and
    metrics, accesses). `memory` (first run only) gets the RSS at each stage."""
    from core.blocks import BlockIndex
    from harness.runner.assembly import build_engine
    from harness.sim.metrics import summarize
    from harness.sim.tables import full_tables

    parts = {}
    for t in (s.trace, s.calibration):  # every run builds its indexes, as a fresh process does
        if t is not None:
            BlockIndex.forget(t)
    gc.collect()  # the run before's tables and engine, before the heap is trimmed
    notes["heap_trimmed"] = trim_heap()  # every run starts as a fresh process's would
    t0, ru0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    engine = build_engine(s, system)
    parts["engine_init_s"] = time.process_time() - t0
    notes["engine_core"] = engine.core
    if memory is not None:  # the Engine with its index, recorder and system bound
        memory["built"] = current_rss_mb()
    if s.calibration is not None:
        _, parts["warmup_s"] = cpu_s_of(lambda: system.warmup(s.calibration))
        if memory is not None:  # + the policy's history (and the warm-up's peak)
            memory["warmed"], memory["warmup_peak"] = current_rss_mb(), peak_rss_mb()
    rec, parts["run_s"] = cpu_s_of(engine.run)
    if memory is not None:  # traces + the engine (index, cache) and the recorder's columns
        memory["engine"] = peak_rss_mb()
    tables, parts["tables_s"] = cpu_s_of(rec.stored_tables)  # as harness/runner/run.py
    if memory is not None:  # + the stored tables (per-access iteration and layer)
        memory["tables"] = peak_rss_mb()
    slo = (float(s.cfg["slo_ttft_ms"]), float(s.cfg["slo_tpot_ms"]))
    metrics, parts["summarize_s"] = cpu_s_of(lambda: summarize(
        full_tables(tables), s.trace.arrival_ms, s.model.expert_bytes, *slo))
    if memory is not None:  # + the summary's transient columns
        memory["metrics"] = peak_rss_mb()
    parts["total_s"] = time.process_time() - t0
    # The kernel's share (page faults of fresh arrays, above all): user and system CPU
    ru = resource.getrusage(resource.RUSAGE_SELF)
    parts["user_s"], parts["sys_s"] = ru.ru_utime - ru0.ru_utime, ru.ru_stime - ru0.ru_stime
    return parts, {"tables": tables, "metrics": metrics}, rec.num_accesses


def child(system_name: str, requests: int, max_batch: int, repeats: int, min_cpu_s: float,
          check: bool, base: tuple[int, int] | None = None) -> dict:
    """One system at one setting, in this (fresh) process; returns its figures. base: the
    Table 1 setting (requests, max_batch) whose engine runs alternate with this setting's."""
    out = {"system": system_name, "requests": requests, "max_batch": max_batch,
           "rss_start_mb": peak_rss_mb()}
    s = _assembled(system_name, requests, max_batch, out)
    if s.oom is not None:
        out["status"] = "oom"
        return out
    # Run 0 gives the memory figures and the written result; the reference's stream (and the
    # Table 1 setting's traces) are built after them, so they are not in those peaks.
    first, n_acc = _first_run(s, out)
    ref = _Reference(s)
    b = None if base is None else _base_setting(s, system_name, requests, base)
    runs, refs, bases = _alternate(s, b, ref, first, out, repeats, min_cpu_s)
    out.update(_figures(n_acc, runs, refs, ref.n))
    if bases:
        out.update(_base_figures(n_acc, runs, bases, base))
    if check:
        out["reference_check"] = _check(s, refs[0][0])
    return out


def _assembled(system_name: str, requests: int, max_batch: int, out: dict) -> Run:
    """The setting's run, with the CPU seconds and memory its traces took."""
    s, out["trace_gen_cpu_s"] = _setting(system_name, requests, max_batch)
    out["peak_rss_trace_mb"] = peak_rss_mb()  # imports + trace generation
    # What the traces keep: generation's freed temporaries go back first (otherwise the
    # engine reuses their pages unseen and its own memory reads up to 45 B/access low)
    gc.collect()
    trim_heap()
    out["rss_after_trace_mb"] = current_rss_mb()
    out["peak_reset"] = reset_peak()
    return s


def _first_run(s: Run, out: dict) -> tuple[dict, int]:
    """Run 0: the memory at each stage, the compute floor's and the result writing's CPU
    seconds, the whole run's peak; (its CPU-s parts, its accesses)."""
    from harness.runner.floor import compute_floor_ms
    from harness.runner.results import write_run

    memory: dict = {}
    parts, last, n_acc = one_run(s, _system(s), out, memory)
    out.update(peak_rss_engine_mb=memory["engine"], peak_rss_tables_mb=memory["tables"],
               peak_rss_metrics_mb=memory["metrics"], rss_engine_built_mb=memory["built"],
               rss_warmed_mb=memory.get("warmed"), peak_rss_warmup_mb=memory.get("warmup_peak"))
    _, out["compute_floor_cpu_s"] = cpu_s_of(
        lambda: compute_floor_ms(s.model, s.hw, s.trace, s.engine.max_batch))
    with tempfile.TemporaryDirectory() as tmp:
        result = {"run_id": "bench-sim", "config": s.cfg, "metrics": last["metrics"]}
        _, out["write_cpu_s"] = cpu_s_of(lambda: write_run(Path(tmp) / "run", result,
                                                           last["tables"], s.trace.request_ids))
    # The whole run: trace generation, engine, tables, metrics, result writing.
    out["peak_rss_mb"] = max(peak_rss_mb(), out["peak_rss_trace_mb"])
    if out["rss_after_trace_mb"] is not None and out["peak_reset"]:
        _bytes_per_access(out, n_acc)
    last = None  # free the tables before the reference loop
    gc.collect()
    return parts, n_acc


def _bytes_per_access(out: dict, n_acc: int) -> None:
    for name, key in (("", "peak_rss_engine_mb"), ("_with_tables", "peak_rss_tables_mb"),
                      ("_with_metrics", "peak_rss_metrics_mb"),
                      ("_built", "rss_engine_built_mb"), ("_warmed", "rss_warmed_mb"),
                      ("_warmup_peak", "peak_rss_warmup_mb")):
        if out[key] is not None:  # no warm-up: no warmed figures
            out["bytes_per_access_beyond_trace" + name] = (
                (out[key] - out["rss_after_trace_mb"]) * 2**20 / max(n_acc, 1))


class _Reference:
    """The reference loop over the setting's trace at batch 1 (its stream built untimed)."""

    def __init__(self, s: Run):
        from harness.bench import reference_lru
        from harness.runner.assembly import memory_plan

        self.lru, self.layers = reference_lru, s.model.num_moe_layers
        self.slots = memory_plan(s.model, s.hw, s.trace, 1, s.cfg.get("expert_cache_gb")) \
            .expert_cache_bytes // s.model.expert_bytes
        self.per_layer = min(self.slots // self.layers, s.model.num_experts)
        self.stream = reference_lru.access_stream(s.trace)
        self.n = reference_lru.stream_accesses(self.stream)

    def __call__(self) -> tuple[dict, float]:
        return cpu_s_of(lambda: self.lru.replay(self.stream, self.layers, self.slots,
                                                self.per_layer))


def _base_setting(s: Run, system_name: str, requests: int, base: tuple[int, int]) -> Run:
    """The Table 1 setting: its own traces where the requests differ, else this setting's."""
    from harness.runner.assembly import at_batch

    return _setting(system_name, *base)[0] if base[0] != requests else at_batch(s, base[1])


def _alternate(s: Run, b: Run | None, reference: _Reference, first: dict, out: dict,
               repeats: int, min_cpu_s: float) -> tuple[list, list, list]:
    """Every engine run is followed by one run of the reference loop (same process, same
    trace, batch 1) and, with a base, one at the Table 1 setting: each run's ratio and cost
    see the machine in the same state; the medians of the runs' figures are binding.
    (engine runs' parts, reference runs, base runs)."""
    def base_run() -> tuple[float, int]:
        p, _, n = one_run(b, _system(b), {})
        return p["total_s"], n

    runs, refs, bases = [first], [reference()], [base_run()] if b is not None else []

    # At least `repeats` runs, more while the engine's runs (or the Table 1 runs beside them)
    # together stay short: a run of a second or two is as noisy as the reference beside it.
    def short() -> bool:
        return min(sum(p["total_s"] for p in runs),
                   sum(t for t, _ in bases) if bases else math.inf) < min_cpu_s

    while len(runs) < repeats or (short() and len(runs) < MAX_RUNS):
        parts, _, _ = one_run(s, _system(s), out)
        runs.append(parts)
        refs.append(reference())
        if b is not None:
            bases.append(base_run())
    return runs, refs, bases


def _figures(n_acc: int, runs: list[dict], refs: list, ref_n: int) -> dict:
    run_times, ref_times = [p["total_s"] for p in runs], [t for _, t in refs]
    med, ref_s = statistics.median(run_times), statistics.median(ref_times)
    pair_ratios = paired_ratios(n_acc, run_times, ref_n, ref_times)
    mid = min(runs, key=lambda p: abs(p["total_s"] - med))
    return dict(status="ok", accesses=n_acc, cpu_s=med, accesses_per_cpu_s=n_acc / med,
                cpu_s_parts=mid, sys_share=mid["sys_s"] / max(mid["user_s"] + mid["sys_s"], 1e-9),
                reference_accesses=ref_n, reference_cpu_s=ref_s,
                reference_accesses_per_cpu_s=ref_n / ref_s, reference_cpu_s_runs=ref_times,
                engine_cpu_s_runs=run_times, pair_ratios=pair_ratios,
                ratio=statistics.median(pair_ratios))


def _base_figures(n_acc: int, runs: list[dict], bases: list, base: tuple[int, int]) -> dict:
    """Cost per access here / at the Table 1 setting = the inverse of the paired ratio."""
    run_times = [p["total_s"] for p in runs]
    base_n, base_times = bases[0][1], [t for t, _ in bases]
    costs = [1 / r for r in paired_ratios(n_acc, run_times, base_n, base_times)]
    return dict(base_setting={"requests": base[0], "max_batch": base[1]}, base_accesses=base_n,
                base_cpu_s_runs=base_times, cost_vs_base_runs=costs,
                cost_vs_base=statistics.median(costs))


def _check(s: Run, ref_counts: dict) -> dict:
    """Hit / miss counts of `system=lru system.prefetch=false` per phase vs the reference."""
    from core.targets import build_target
    from harness.sim.tables import full_tables
    from systems.base import System

    node = dict(s.cfg["system"], prefetch=False)
    _, last, _ = one_run(s, build_target(node, "system", System), {})
    acc = full_tables(last["tables"])["accesses"]
    cls, prefill = acc["class"], acc["prefill"].astype(bool)
    engine = {}
    for phase, mask in (("decode", ~prefill), ("prefill", prefill)):
        engine[f"hits_{phase}"] = int((cls[mask] != 2).sum())  # hit or late (none at batch 1)
        engine[f"misses_{phase}"] = int((cls[mask] == 2).sum())
    return {"engine": engine, "reference": ref_counts, "match": engine == ref_counts,
            "system": "lru system.prefetch=false"}
