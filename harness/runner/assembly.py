"""One way to assemble a run: `assemble(cfg) -> Run`, the typed inputs `execute` runs.

A Run holds the checked specs (model, hardware), the system, the traces (measure and, when
the system warms up, calibration) as the runner loads them, the memory plan and the engine's
settings. The runner (harness/runner/run.py), the benches (harness/bench/) and the validation
tool (harness/live/validate.py) build their runs here, so each runs what the runner runs.

What the runs of one process share (generated traces, compute floors) lives in a `RunMemo`
its owner creates and passes: the launcher (moebench/cli.py) holds one for the jobs it runs;
a run given none keeps nothing after it returns.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from core.knobs import KnobError
from core.specs import (
    HardwareSpec,
    ModelSpec,
    SpecError,
    hardware_spec_from_dict,
    model_spec_from_dict,
)
from core.targets import build_target
from core.trace import PROJECTABLE, Trace, TraceError, read_trace
from harness.runner.footprint import check_fits
from harness.runner.results import canonical_json
from harness.runner.run_types import EngineSettings, Run, RunMemo
from harness.runner.runconfig import check_run_config
from harness.runner.trace_cache import cached_trace
from harness.sim import cores
from harness.sim.backend_sim import SimBackend, dequant_ms
from harness.sim.copies import EngineError
from harness.sim.engine import Engine
from harness.sim.gpus import Gpus
from harness.sim.memory import MemoryPlan, plan_memory
from harness.sim.tiers import Tiers
from systems.base import System
from systems.evictors.base import Evictor
from systems.placements.base import Placement


def context_length(trace: Trace) -> int:
    """The longest context of the trace: prompt plus output tokens of its longest request."""
    return int(np.max(trace.prompt_len.astype(np.int64) + trace.output_len))


def memory_plan(model, hw, trace: Trace, max_batch: int,
                expert_cache_gb: float | None = None) -> MemoryPlan:
    """The GPU memory plan of a run of `trace` (its KV cache at the trace's longest context)."""
    return plan_memory(model, hw, context_length(trace), max_batch, expert_cache_gb)


def at_batch(run: Run, max_batch: int) -> Run:
    """The same run at another batch size (its memory plan again)."""
    plan = memory_plan(run.model, run.hw, run.trace, max_batch, run.cfg.get("expert_cache_gb"))
    return replace(run, plan=plan, engine=replace(run.engine, max_batch=max_batch))


def build_system(cfg: dict) -> System:
    """The config's system (`_target_` allowlisted) with the config's `policy_kernels` (checked
    by check_run_config): a fresh one for each run that replays an assembled Run."""
    system = build_target(cfg["system"], "system", System)
    return system.use_policy_kernels(cfg.get("policy_kernels", "auto"))


def assemble(cfg: dict, memo: RunMemo | None = None, *, model: ModelSpec | None = None,
             hw: HardwareSpec | None = None, system: System | None = None,
             all_fields: bool = False) -> Run:
    """Check every input of the run and load what it reads; raises SpecError / TraceError
    (nothing written). `model`, `hw`, `system`: given instead of the config's. The traces
    hold the per-token fields the system reads (every field with `all_fields`)."""
    started = time.perf_counter()
    memo = RunMemo() if memo is None else memo
    run_dir = check_run_config(cfg)
    model = model or model_spec_from_dict(cfg["model"], "model")
    hw = hw or hardware_spec_from_dict(cfg["hardware"], "hardware")
    system = system or build_system(cfg)
    dequant_ms(model, hw)  # quantized experts need the profile's rate for their width
    check_fits(cfg, model, system)  # a run that cannot fit is refused before its trace exists
    # host, NVMe and CPU-run misses (docs/hardware.md; `active` checks them first)
    tiered = tiers_of(cfg, hw).active(system, model)
    gpus = gpus_of(cfg, hw)  # several GPUs and the placement (docs/gpus.md)
    gpus.check(model, tiered=tiered)
    try:  # the compiled core runs neither: refused here, before anything is written
        cores.resolve(cfg.get("engine_core", "auto"), None, tiered, gpus.active())
    except EngineError as exc:
        raise SpecError(str(exc)) from exc
    fields = None if all_fields else system.uses_fields
    trace = check_shape(load_routing(cfg, model, "measure", fields=fields, memo=memo), model)
    settings = EngineSettings.of(cfg)
    plan = memory_plan(model, hw, trace, settings.max_batch, cfg.get("expert_cache_gb"))
    planned = time.perf_counter()
    oom = oom_reason(model, hw, plan, system, gpus)
    calib = None
    placement = gpus.placement
    if oom is None and (system.needs_calibration()
                        or (placement is not None and placement.needs_calibration())):
        calib = check_shape(load_routing(cfg, model, "calibration", cfg["calibration_requests"],
                                         fields=fields, memo=memo), model)
    return Run(cfg=cfg, run_dir=run_dir, model=model, hw=hw, system=system, trace=trace,
               calibration=calib, plan=plan, engine=settings, oom=oom, memo=memo,
               started=started, planned=planned)


def tiers_of(cfg: dict, hw: HardwareSpec) -> Tiers:
    """The run's memory tiers, with a fresh host evictor (config group host_evictor, a zoo
    evictor; absent: lru)."""
    node = cfg.get("host_evictor")
    evictor = None if node is None else build_target(node, "host_evictor", Evictor)
    return Tiers(hw.host, hw.nvme, evictor, hw.h2d_gbps)


def gpus_of(cfg: dict, hw: HardwareSpec, calibration: Trace | None = None) -> Gpus:
    """The run's GPUs: the profile's count and peer link, a fresh placement (config group
    placement; absent: none) fitted to `calibration` when it ranks experts, and a builder of
    each further GPU's system."""
    node = cfg.get("placement")
    placement = None if node is None else build_target(node, "placement", Placement)
    fitted = placement is not None and calibration is not None and placement.needs_calibration()
    if fitted:
        placement.fit(calibration)
    return Gpus(hw.num_gpus, hw.peer, placement, hw.h2d_gbps, hw.h2d_latency_us,
                make_system=lambda: build_system(cfg),
                calibration_sha=calibration.content_sha256() if fitted else None)


def build_engine(run: Run, system: System | None = None) -> Engine:
    """The engine of the run, which binds the system (the run's own unless given): a knob out
    of range for this model or budget is an input error (exit 2, nothing written)."""
    s = run.engine
    try:
        return Engine(run.model, SimBackend(run.model, run.hw), run.trace,
                      run.system if system is None else system, run.plan.expert_cache_bytes,
                      s.max_batch, progress=s.progress, time_policy=s.time_policy, core=s.core,
                      tiers=tiers_of(run.cfg, run.hw),
                      gpus=gpus_of(run.cfg, run.hw, run.calibration))
    except KnobError as exc:
        raise SpecError(f"system.{exc}") from exc


def oom_reason(model, hw, plan: MemoryPlan, system: System,
               gpus: Gpus | None = None) -> str | None:
    if plan.available_bytes <= 0:
        return f"dense weights, KV cache and reserve need more than {hw.gpu_mem_gb} GiB"
    if plan.expert_cache_bytes < model.expert_bytes:
        return (f"the {plan.expert_cache_bytes / 2**30:.3f} GiB left for experts holds no "
                f"expert ({model.expert_bytes} bytes each)")
    if not system.needs_all_experts:
        return None
    if gpus is not None and gpus.active():  # each GPU holds the experts it may hold
        need = model.expert_bytes * gpus.placement.most_keys(
            gpus.num_gpus, model.num_moe_layers, model.num_experts,
            plan.expert_cache_bytes // model.expert_bytes)
        if plan.expert_cache_bytes < need:
            return (f"the experts one GPU may hold under placement {gpus.placement.name} need "
                    f"up to {need / 2**30:.2f} GiB; each GPU leaves "
                    f"{plan.expert_cache_bytes / 2**30:.2f} GiB for them")
    elif plan.expert_cache_bytes < model.total_expert_bytes:
        return (f"all experts need {model.total_expert_bytes / 2**30:.2f} GiB; the GPU leaves "
                f"{plan.expert_cache_bytes / 2**30:.2f} GiB for them")
    return None
    return None


# ---- traces ---------------------------------------------------------------------------------
def _memo_key(cfg: dict, model, split: str, path, num_requests: int | None):
    """(key, workload): the file's identity (a file rewritten under the same path is read
    again), or the generator config's."""
    if path:
        st = Path(path).stat()
        return f"file:{Path(path).resolve()}:{st.st_mtime_ns}:{st.st_size}", None
    workload = dict(cfg["workload"])
    workload["split"] = split
    workload["seed"] = int(cfg["seed"])
    if num_requests is not None:
        workload["num_requests"] = num_requests
    return canonical_json({"model": model.name, "bits": model.expert_bits, **workload}), workload


def load_routing(cfg: dict, model, split: str, num_requests: int | None = None,
                 fields=None, memo: RunMemo | None = None) -> Trace:
    """The run's trace: a trace file when `routing` is set, else the synthetic generator.

    `fields`: the per-token fields (weights, probs, spec_topk) the caller reads; the others
    are left out of the copy kept in memory (Trace.project: the sha256 stays the whole
    trace's). None keeps them all. `memo`: where the copy is kept for later calls; a copy
    there that lacks a field asked for is read or generated again (the same trace: the
    generator is seeded)."""
    path = cfg.get("routing") if split == "measure" else cfg.get("calibration_routing")
    key, workload = _memo_key(cfg, model, split, path, num_requests)
    traces = {} if memo is None else memo.traces
    want = set(PROJECTABLE if fields is None else fields)
    held = traces.get(key)
    if held is None or want & set(held.dropped_fields):
        # keep what the copy held before too: a sweep's next job may read it again
        had = set(PROJECTABLE) - set(held.dropped_fields) if held is not None else set()
        full = read_trace(path) if path else _generate(cfg, model, key, workload)
        full.content_sha256()  # of the whole trace, before any field is left out
        traces[key] = held = full if fields is None else full.project(want | had)
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


def check_shape(tr: Trace, model) -> Trace:
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
