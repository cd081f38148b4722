"""The types of one run: what it reads (`Run`, built by harness/runner/assembly.py) and what
it writes (`Result`, built by harness/runner/run.py `execute`, serialised to result.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.specs import HardwareSpec, ModelSpec
from core.trace import Trace
from harness.sim.memory import MemoryPlan
from systems.base import System


@dataclass
class RunMemo:
    """Traces (keyed by the generator config or the file's identity) and compute floors
    (keyed by trace, specs and batch) that later runs of the same owner reuse."""
    traces: dict[str, Trace] = field(default_factory=dict)
    floors: dict[tuple, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs: none of these changes what a run records (bar `max_batch`)."""
    max_batch: int = 1
    progress: bool = False
    time_policy: bool = False
    core: str = "auto"

    @classmethod
    def of(cls, cfg: dict) -> EngineSettings:
        return cls(max_batch=cfg["max_batch"], progress=cfg["progress"],
                   time_policy=bool(cfg.get("time_policy", False)),
                   core=cfg.get("engine_core", "auto"))


@dataclass
class Run:
    """Everything one run reads, checked; `execute` (harness/runner/run.py) runs it."""
    cfg: dict
    run_dir: Path
    model: ModelSpec
    hw: HardwareSpec
    system: System
    trace: Trace
    calibration: Trace | None  # loaded when the system warms up and the run fits
    plan: MemoryPlan
    engine: EngineSettings
    oom: str | None  # why the run cannot fit the GPU (written as status oom), else None
    memo: RunMemo
    started: float  # time.perf_counter() when assembly began (the run's wall time)
    planned: float  # time.perf_counter() after the memory plan (the engine's time)


@dataclass
class Result:
    """One finished run (status valid or oom): `record()` is its result.json; `run_dir` the
    folder that holds it (not part of the record)."""
    run_dir: Path
    schema_version: str
    run_id: str
    experiment: str | None
    run_name: str | None
    config: dict
    config_sha256: str
    git: dict
    environment: dict
    seed: int
    model: dict
    hardware: str
    system: dict
    memory: dict
    status: str = "valid"
    reason: str | None = None
    metrics: dict | None = None
    engine: dict | None = None  # diagnostics of a run that ran (absent from an oom record)
    trace: dict | None = None
    calibration_trace: dict | None = None
    timing: dict = field(default_factory=dict)
    backend: str = "sim"
    simulated: bool = True

    def record(self) -> dict:
        """result.json's content."""
        out = {"schema_version": self.schema_version, "run_id": self.run_id,
               "experiment": self.experiment, "run_name": self.run_name,
               "config": self.config, "config_sha256": self.config_sha256, "git": self.git,
               "environment": self.environment, "seed": self.seed, "backend": self.backend,
               "simulated": self.simulated, "model": self.model, "hardware": self.hardware,
               "system": self.system, "memory": self.memory, "status": self.status,
               "reason": self.reason, "metrics": self.metrics}
        if self.engine is not None:
            out["engine"] = self.engine
        out.update(trace=self.trace, calibration_trace=self.calibration_trace,
                   timing=self.timing)
        return out
