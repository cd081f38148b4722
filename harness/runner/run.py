"""Build one configuration (model x hardware x system x workload), run it, write the result."""

from __future__ import annotations

import gc
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from core.knobs import KnobError
from core.specs import SpecError, hardware_spec_from_dict, model_spec_from_dict
from core.targets import build_target
from core.trace import PROJECTABLE, Trace, TraceError, read_trace
from harness.runner.floor import compute_floor_ms, headroom
from harness.runner.footprint import check_fits
from harness.runner.provenance import code_version, environment, run_id
from harness.runner.results import (
    RESULT_SCHEMA_VERSION,
    canonical_json,
    config_hash,
)
from harness.runner.runconfig import check_run_config
from harness.runner.store import RunLock, commit
from harness.runner.trace_cache import cached_trace
from harness.sim.backend_sim import SimBackend
from harness.sim.engine import Engine
from harness.sim.memory import plan_memory
from harness.sim.metrics import spec_recall, summarize
from harness.sim.tables import full_tables
from systems.base import System

_TRACE_MEMO: dict[str, Trace] = {}  # multirun jobs in one process share generated traces


def load_routing(cfg: dict, model, split: str, num_requests: int | None = None,
                 fields=None) -> Trace:
    """The run's trace: a trace file when `routing` is set, else the synthetic generator.

    `fields`: the per-token fields (weights, probs, spec_topk) the caller reads; the others
    are left out of the copy kept in memory (Trace.project: the sha256 stays the whole
    trace's). None keeps them all. A memoised copy that lacks a field asked for is read or
    generated again (the same trace: the generator is seeded)."""
    path = cfg.get("routing") if split == "measure" else cfg.get("calibration_routing")
    if path:  # the file's identity: a file rewritten under the same path is read again
        st = Path(path).stat()
        key = f"file:{Path(path).resolve()}:{st.st_mtime_ns}:{st.st_size}"
    else:
        workload = dict(cfg["workload"])
        workload["split"] = split
        workload["seed"] = int(cfg["seed"])
        if num_requests is not None:
            workload["num_requests"] = num_requests
        key = canonical_json({"model": model.name, "bits": model.expert_bits, **workload})
    want = set(PROJECTABLE if fields is None else fields)
    held = _TRACE_MEMO.get(key)
    if held is None or want & set(held.dropped_fields):
        # keep what the copy held before too: a sweep's next job may read it again
        had = set(PROJECTABLE) - set(held.dropped_fields) if held is not None else set()
        full = read_trace(path) if path else _generate(cfg, model, key, workload)
        full.content_sha256()  # of the whole trace, before any field is left out
        _TRACE_MEMO[key] = held = full if fields is None else full.project(want | had)
    return held


def _generate(cfg: dict, model, key: str, workload: dict) -> Trace:
    synth_cfg = build_target(workload, "workload")
    from workloads.synthetic import generate_trace

    def generate() -> Trace:
        try:
            return generate_trace(model, synth_cfg)
        except ValueError as exc:  # the workload's own checks name their `workload.` key
            raise SpecError(str(exc)) from exc

    root = cfg.get("trace_cache_dir")  # a sweep's jobs share traces on disk (trace_cache.py)
    return cached_trace(root, key, model, generate) if isinstance(root, str) and root \
        else generate()


def _check_shape(tr: Trace, model) -> Trace:
    """A routing trace recorded for another model, or one with no request, is an input error,
    not a failed run."""
    if tr.num_requests == 0:
        raise TraceError(f"{tr.source}: field 'prompt_len': the trace holds no request")
    want = {"num_moe_layers": model.num_moe_layers, "num_experts": model.num_experts,
            "top_k": model.top_k, "moe_layer_stacks": list(model.moe_layer_stacks)}
    for key, value in want.items():
        got = tr.meta.get(key)
        if (list(got) if key == "moe_layer_stacks" else got) != value:
            raise TraceError(f"{tr.source}: field 'meta.{key}' is {got!r}; model "
                             f"{model.name} needs {value!r}")
    return tr


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


def _engine(model, hw, trace, system, plan, max_batch: int, cfg) -> Engine:
    """Build the engine, which binds the system: a knob out of range for this model or budget
    is an input error (exit 2, nothing written), not a failed run."""
    try:
        return Engine(model, SimBackend(model, hw), trace, system, plan.expert_cache_bytes,
                      max_batch, progress=cfg["progress"],
                      time_policy=bool(cfg.get("time_policy", False)),
                      core=cfg.get("engine_core", "auto"))
    except KnobError as exc:
        raise SpecError(f"system.{exc}") from exc


def _oom_reason(model, hw, plan, system) -> str | None:
    if plan.available_bytes <= 0:
        return f"dense weights, KV cache and reserve need more than {hw.gpu_mem_gb} GiB"
    if plan.expert_cache_bytes < model.expert_bytes:
        return (f"the {plan.expert_cache_bytes / 2**30:.3f} GiB left for experts holds no "
                f"expert ({model.expert_bytes} bytes each)")
    if system.needs_all_experts and plan.expert_cache_bytes < model.total_expert_bytes:
        return (f"all experts need {model.total_expert_bytes / 2**30:.2f} GiB; the GPU leaves "
                f"{plan.expert_cache_bytes / 2**30:.2f} GiB for them")
    return None


def run_config(cfg: dict) -> dict:
    """Run one configuration; writes results/<experiment>/<run>/ and returns result.json.

    Every input is checked before the run folder's lock is taken, so a bad input exits with
    SpecError / TraceError and leaves the results folder as it was. Anything raised later
    (the engine's own errors, a full disk) also leaves the folder as it was: the caller
    decides whether a failure record may be written (harness/runner/sweep.py). Loggers are
    the caller's too: they run after this returns, outside the job's `timeout_s`."""
    t_wall = time.perf_counter()
    run_dir = check_run_config(cfg)
    model = model_spec_from_dict(cfg["model"], "model")
    hw = hardware_spec_from_dict(cfg["hardware"], "hardware")
    system = build_target(cfg["system"], "system", System)
    system.use_policy_kernels(cfg.get("policy_kernels", "auto"))  # checked: check_run_config
    max_batch = cfg["max_batch"]
    check_fits(cfg, model, system)  # a run that cannot fit is refused before its trace exists
    trace = _check_shape(load_routing(cfg, model, "measure", fields=system.uses_fields), model)
    max_ctx = int(np.max(trace.prompt_len.astype(np.int64) + trace.output_len))
    plan = plan_memory(model, hw, max_ctx, max_batch, cfg.get("expert_cache_gb"))
    code, config_sha = code_version(), config_hash(cfg)
    result = {
        "schema_version": RESULT_SCHEMA_VERSION, "run_id": run_id(config_sha, code),
        "experiment": cfg.get("experiment_name"), "run_name": cfg.get("run_name"),
        "config": cfg, "config_sha256": config_sha, "git": code,
        "environment": environment(), "seed": cfg["seed"],
        "backend": "sim", "simulated": True,
        "model": model.summary(), "hardware": hw.name, "system": system.describe(),
        "memory": plan.as_dict(), "status": "valid", "reason": None, "metrics": None,
    }
    tables, warmup_s, run_s, engine, calib = None, 0.0, 0.0, None, None
    t_engine = time.perf_counter()
    oom = _oom_reason(model, hw, plan, system)
    if oom:
        result["status"], result["reason"] = "oom", oom
    else:
        if system.needs_calibration():
            calib = _check_shape(
                load_routing(cfg, model, "calibration", cfg["calibration_requests"],
                             fields=system.uses_fields), model)
        engine = _engine(model, hw, trace, system, plan, max_batch, cfg)
    with RunLock(run_dir):
        if engine is not None:
            # An exception here (EngineError, a full disk, ...) leaves the folder as it was;
            # the caller records it (harness/runner/sweep.py) under the store's rule.
            if calib is not None:
                t_warm = time.perf_counter()
                system.warmup(calib)
                warmup_s = time.perf_counter() - t_warm
            # Metrics of the trace alone before this run, so that their transient arrays
            # (the floor's replay, freed with its engine's cycles; the guesses' rows) are
            # not held beside this run's filled recorder.
            floor_ms = compute_floor_ms(model, hw, trace, max_batch)
            gc.collect()
            recall = spec_recall(trace) if "spec_topk" in system.uses_fields else None
            t_run = time.perf_counter()
            rec = engine.run()
            run_s = time.perf_counter() - t_run
            # Stored columns (views of the recorder's arrays); the summary computes only
            # the derived columns it reads, dropped before the files are written.
            tables = rec.stored_tables()
            result["metrics"] = summarize(full_tables(tables), trace.arrival_ms,
                                          model.expert_bytes, float(cfg["slo_ttft_ms"]),
                                          float(cfg["slo_tpot_ms"]))
            result["metrics"]["peak_expert_cache_bytes"] = int(rec.peak_cache_bytes)
            result["metrics"]["spec_recall"] = recall  # null unless the system reads guesses
            m = result["metrics"]  # the TPOT with every expert resident, no stall
            m["compute_floor_ms"] = floor_ms
            m["headroom"] = headroom(m["tpot_ms"]["mean"], m["compute_floor_ms"])
            # Diagnostics that are not per-access facts (not in the parquet files).
            result["engine"] = {"prefetches_dropped": int(rec.prefetch_dropped),
                                "core": engine.core,
                                "policy_kernels": cfg.get("policy_kernels", "auto")}
            result["system"] = system.describe()
        result["trace"] = _trace_info(trace, system)
        result["calibration_trace"] = _trace_info(calib)
        n_acc = result["metrics"]["accesses"] if result["metrics"] else 0
        result["timing"] = {
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - t_wall, "engine_s": time.perf_counter() - t_engine,
            "warmup_s": warmup_s, "engine_run_s": run_s,
            "accesses_per_s": n_acc / run_s if run_s > 0 else None,
            "policy_s": engine.policy_s if tables is not None else None,
        }
        commit(run_dir, result, tables, trace.request_ids)  # valid or oom: always written
    result["_run_dir"] = str(run_dir)
    return result
