"""Run one configuration (model x hardware x system x workload) and write its result:
`run_config(cfg)` is `execute(assemble(cfg))` (harness/runner/assembly.py)."""

from __future__ import annotations

import gc
import time
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from core.trace import Trace
from harness.runner.assembly import assemble, build_engine, gpus_of, load_routing
from harness.runner.floor import compute_floor_ms, headroom
from harness.runner.provenance import code_version, environment, run_id
from harness.runner.results import RESULT_SCHEMA_VERSION, config_hash
from harness.runner.run_types import Result, Run, RunMemo
from harness.runner.store import RunLock, commit
from harness.sim.metrics import spec_recall, summarize
from harness.sim.tables import full_tables
from systems.base import System

__all__ = ["execute", "load_routing", "run_config"]


def run_config(cfg: dict, memo: RunMemo | None = None) -> dict:
    """Run one configuration; writes results/<experiment>/<run>/ and returns result.json's
    content (`execute(assemble(cfg, memo))`, whose Result also names the folder)."""
    return execute(assemble(cfg, memo)).record()


def execute(run: Run) -> Result:
    """Run an assembled run; writes its folder (valid or oom) and returns its Result.

    Every input was checked by `assemble`, and the engine (which binds the system's knobs) is
    built before the run folder's lock is taken, so a bad input exits with SpecError /
    TraceError and leaves the results folder as it was. Anything raised later (the engine's
    own errors, a full disk) also leaves the folder as it was: the caller decides whether a
    failure record may be written (harness/runner/sweep.py). Loggers are the caller's too:
    they run after this returns, outside the job's `timeout_s`."""
    result = _header(run)
    engine = None if run.oom else build_engine(run)
    with RunLock(run.run_dir):
        # An exception here (EngineError, a full disk, ...) leaves the folder as it was; the
        # caller records it (harness/runner/sweep.py) under the store's rule.
        tables, times = _simulate(run, engine, result) if engine is not None else (None, {})
        result.trace = _trace_info(run.trace, run.system)
        result.calibration_trace = _trace_info(run.calibration)
        result.timing = _timing(run, result, times, engine)
        commit(run.run_dir, result.record(), tables, run.trace.request_ids)
    return result


def _header(run: Run) -> Result:
    """The record's fields known before the engine runs."""
    cfg, code, config_sha = run.cfg, code_version(), config_hash(run.cfg)
    result = Result(run_dir=run.run_dir, schema_version=RESULT_SCHEMA_VERSION,
                    run_id=run_id(config_sha, code), experiment=cfg.get("experiment_name"),
                    run_name=cfg.get("run_name"), config=cfg, config_sha256=config_sha,
                    git=code, environment=environment(), seed=cfg["seed"],
                    model=run.model.summary(), hardware=run.hw.name,
                    system=run.system.describe(), memory=run.plan.as_dict())
    if run.oom:
        result.status, result.reason = "oom", run.oom
    return result


def _simulate(run: Run, engine, result: Result) -> tuple[dict, dict]:
    """Warm the system up, run the engine, fill the result's metrics; (stored tables, the
    stages' seconds)."""
    times = {"warmup_s": 0.0}
    if run.calibration is not None:
        t_warm = time.perf_counter()
        for system in engine.systems:  # one per GPU (harness/sim/step_gpus.py)
            if system.needs_calibration():
                system.warmup(run.calibration)
        times["warmup_s"] = time.perf_counter() - t_warm
    # Metrics of the trace alone before this run, so that their transient arrays (the floor's
    # replay, freed with its engine's cycles; the guesses' rows) are not held beside this
    # run's filled recorder.
    gpus = replace(gpus_of(run.cfg, run.hw, run.calibration),
                   placement_slots=run.plan.expert_cache_bytes // run.model.expert_bytes)
    floor_ms = compute_floor_ms(run.model, run.hw, run.trace, run.engine.max_batch,
                                run.memo.floors, gpus)
    gc.collect()
    recall = spec_recall(run.trace) if "spec_topk" in run.system.uses_fields else None
    t_run = time.perf_counter()
    rec = engine.run()
    times["engine_run_s"] = time.perf_counter() - t_run
    # Stored columns (views of the recorder's arrays); the summary computes only the derived
    # columns it reads, dropped before the files are written.
    tables = rec.stored_tables()
    cfg = run.cfg
    m = summarize(full_tables(tables), run.trace.arrival_ms, run.model.expert_bytes,
                  float(cfg["slo_ttft_ms"]), float(cfg["slo_tpot_ms"]))
    m["peak_expert_cache_bytes"] = int(rec.peak_cache_bytes)
    m["spec_recall"] = recall  # null unless the system reads guesses
    m["compute_floor_ms"] = floor_ms  # the TPOT with every expert resident, no stall
    m["headroom"] = headroom(m["tpot_ms"]["mean"], floor_ms)
    tier = engine.tier_metrics()  # only runs with memory tiers or CPU-run misses have them
    if tier is not None:
        m.update(tier)
    gpus = engine.gpu_metrics()  # only runs with several GPUs or a placement have them
    if gpus is not None:
        m.update(gpus)
    result.metrics = m
    # Diagnostics that are not per-access facts (not in the parquet files).
    result.engine = {"prefetches_dropped": int(rec.prefetch_dropped), "core": engine.core,
                     "policy_kernels": run.system.policy_kernels}
    if engine.group is not None:  # several GPUs or a placement: what the placement chose
        result.engine["placement"] = engine.group.placement.describe()
    result.system = run.system.describe()
    return tables, times


def _timing(run: Run, result: Result, times: dict, engine) -> dict:
    """wall_s from the start of assembly, engine_s from after the memory plan (the
    calibration trace's loading, the record's header and the engine's construction)."""
    run_s = times.get("engine_run_s", 0.0)
    n_acc = result.metrics["accesses"] if result.metrics else 0
    return {
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - run.started,
        "engine_s": time.perf_counter() - run.planned,
        "warmup_s": times.get("warmup_s", 0.0), "engine_run_s": run_s,
        "accesses_per_s": n_acc / run_s if run_s > 0 else None,
        "policy_s": engine.policy_s if engine is not None else None,
    }


def _trace_info(tr: Trace | None, system: System | None = None) -> dict | None:
    if tr is None:
        return None
    missing = tr.missing_fields()
    info = {"sha256": tr.content_sha256(), "source": tr.source, "synthetic": tr.synthetic,
            "routing_source": tr.routing_source, "num_requests": tr.num_requests,
            "prompt_len_mean": float(np.mean(tr.prompt_len)),
            "output_len_mean": float(np.mean(tr.output_len)), "missing_fields": missing}
    for key in ("arrivals", "prompts", "lengths_from", "tokenizer", "tokenizer_info", "embedder"):
        if key in tr.meta:  # workload provenance (workloads/requests.py)
            info[key] = tr.meta[key]
    if system is not None:
        info["missing_fields_used_by_system"] = [f for f in system.uses_fields if f in missing]
    return info
