"""Which engine core runs a replay: the compiled twins or the pure-Python reference.

The pure-Python classes (cache.py, recorder.py, copies.py, step.py with executor.py) are the
reference: they define every rule, run live backends (a driver and its executor) and are
what docs/engine.md describes. The compiled core (fast_state.pyx, fast_copies.pyx,
fast_step.pyx; built by `pip install` when a C++ compiler is present) repeats them for trace
replay with C arrays instead of dicts, and must give identical tables: tests/
test_fast_core.py runs both on every system over several traces. `engine_core` (config key,
not in the config hash: it never changes a result) chooses: auto (compiled when built and
the backend is the simulator), compiled, python.
"""

from __future__ import annotations

from harness.sim.cache import ExpertCache
from harness.sim.copies import CopyEngine, EngineError
from harness.sim.executor import SimExecutor
from harness.sim.recorder import Recorder
from harness.sim.step import LayerStep
from harness.sim.step_tiers import TieredLayerStep

CORES = ("auto", "compiled", "python")

try:  # built in place by `pip install -e .` (setup.py); absent without a C++ compiler
    from harness.sim import fast_copies, fast_state, fast_step
    COMPILED_ERROR = None
except ImportError as exc:
    fast_copies = fast_state = fast_step = None
    COMPILED_ERROR = f"{type(exc).__name__}: {exc}"


def compiled_available() -> bool:
    return COMPILED_ERROR is None


def resolve(core: str, backend, tiered: bool = False, several_gpus: bool = False) -> str:
    """'compiled' or 'python' for `core` (one of CORES) with this backend; `tiered`: the run
    has memory tiers or CPU-run misses (docs/hardware.md), `several_gpus` several GPUs or a
    placement (docs/gpus.md), which only the python core runs."""
    if core not in CORES:
        raise EngineError(f"engine_core: must be one of {', '.join(CORES)}, got {core!r}")
    moves_weights = any(getattr(backend, name, None) is not None
                        for name in ("load_expert", "evict_expert"))
    if core == "auto":
        return ("compiled" if compiled_available() and not moves_weights and not tiered
                and not several_gpus else "python")
    if core == "compiled":
        if tiered:
            raise EngineError("engine_core: 'compiled' has no memory tiers or CPU-run misses; "
                              "this run needs 'python' (or auto)")
        if several_gpus:
            raise EngineError("engine_core: 'compiled' runs one GPU; several GPUs or a "
                              "placement need 'python' (or auto)")
        if not compiled_available():
            raise EngineError(f"engine_core: 'compiled' is not built ({COMPILED_ERROR}); "
                              "reinstall with a C++ compiler (pip install -e .) or use "
                              "'python'")
        if moves_weights:
            raise EngineError("engine_core: 'compiled' replays traces only; a backend that "
                              "moves weights runs on 'python'")
    return core


def make_state(core: str, capacity_bytes: int, expert_bytes: int, n_keys: int):
    """(cache, recorder) of the resolved core."""
    if core == "compiled":
        return (fast_state.FastCache(capacity_bytes, expert_bytes, n_keys),
                fast_state.FastRecorder(expert_bytes))
    return ExpertCache(capacity_bytes, expert_bytes), Recorder(expert_bytes)


def make_step(core: str, index, view, hooks, cache, rec, backend, num_experts: int,
              tier=None, miss_handler=None):
    """(copy engine, layer step) of the resolved core; with a host `tier` (tiers.py), the
    python core's tiered step (step_tiers.py), which asks `miss_handler` about misses."""
    n_keys = num_experts * index.L
    if core == "compiled":
        copies = fast_copies.FastCopyEngine(hooks, cache, rec, backend, n_keys)
        return copies, fast_step.FastLayerStep(index, view, hooks, copies, cache, rec,
                                               backend, num_experts)
    copies = CopyEngine(hooks, cache, rec, backend, n_keys)
    if tier is not None:
        copies.tier = tier if tier.bounded else None
        handler = miss_handler if miss_handler is not None and miss_handler.runs_on_cpu else None
        return copies, TieredLayerStep(index, view, hooks, copies, cache, rec,
                                       SimExecutor(backend), num_experts, tier, handler, backend)
    return copies, LayerStep(index, view, hooks, copies, cache, rec, SimExecutor(backend),
                             num_experts)
