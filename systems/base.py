"""The System interface: the questions the engine asks a policy (docs/engine.md).

A system is pure Python over expert keys (key = layer * num_experts + expert id). It never
imports torch and never sees routing that has not happened yet (except `oracle` systems,
which receive the whole trace in `bind`). The engine owns the loop, the clock and the cache;
a system only answers.
"""

from __future__ import annotations

import importlib

from core.knobs import KnobError, bool_knob
from core.view import IterationInfo, LayerRouting, RequestInfo, SystemContext

# Stored EAMs / expert maps: 100x the papers' 1000. The matchers keep L * E floats per entry
# (several arrays for fmoe), so more would need gigabytes before the first request.
HISTORY_CAP = 100_000

# The config's `policy_kernels` (conf/config.yaml): auto runs a system's compiled kernels when
# they are built (its package's kernels/ folder), python its python rules; the same decisions.
POLICY_KERNELS = ("auto", "python")


def check_policy_kernels(choice: str) -> str:
    if choice not in POLICY_KERNELS:
        raise KnobError(f"policy_kernels: must be one of {', '.join(POLICY_KERNELS)}, "
                        f"got {choice!r}")
    return choice


def compiled_kernel(module: str, choice: str):
    """The compiled module `module` when `choice` is auto and it is built; else None (the
    python rule runs)."""
    if check_policy_kernels(choice) == "python":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:  # optional: absent without a compiler
        return None


class System:
    """Base policy: fetch on demand, no prefetch, evict the lowest evictable key."""

    # Every attribute the runner and the engine read (harness/runner/run.py, harness/sim):
    name = "base"  # the conf/system/<name>.yaml stem; in result.json and tables
    label = ""  # who the system stands for, shown in tables
    oracle = False  # True: receives the full trace (future routing) in bind()
    needs_all_experts = False  # True: the runner writes status "oom" unless every expert fits
    uses_fields: tuple[str, ...] = ()  # optional trace fields read; fallbacks in docs/systems.md
    prefetch = True  # set per instance by __init__ (subclasses call super().__init__(prefetch))
    policy_kernels = "auto"  # the config's policy_kernels (use_policy_kernels), read in bind
    # systems/miss_handlers MissHandler asked which missed experts run on the host CPU
    # (docs/hardware.md); None: every miss is fetched
    miss_handler = None

    def __init__(self, prefetch: bool = True):
        # `system.prefetch=false` is the one switch that turns a system's prefetch off: the
        # engine then never asks propose_prefetch, and systems may skip building proposals.
        self.prefetch = bool_knob(prefetch, "prefetch")

    def use_policy_kernels(self, choice: str) -> System:
        """auto: the compiled kernels when built; python: the python rules (the runner passes
        the config's `policy_kernels` before bind; systems without kernels ignore it)."""
        self.policy_kernels = check_policy_kernels(choice)
        return self

    def bind(self, ctx: SystemContext) -> None:
        """Called once before the run."""
        self.ctx = ctx

    def needs_calibration(self) -> bool:
        """True: the runner loads the calibration split and calls warmup() before the run.
        Default: the class overrides warmup (a composed system asks its parts)."""
        return type(self).warmup is not System.warmup

    def warmup(self, calibration) -> None:
        """History-based systems build their history from a disjoint calibration trace."""

    def initial_residents(self) -> list[int]:
        """Keys copied into the empty cache before serving starts (timed, counted in h2d
        bytes; docs/engine.md, "Preloads")."""
        return []

    def on_request_start(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def on_layer_routed(self, routing: LayerRouting, now_ms: float) -> None:
        pass

    def propose_prefetch(self, now_ms: float) -> list[int] | None:
        """Ordered keys to prefetch; replaces the queued (not in-flight) ones. None: no change."""
        return None

    def choose_victim(self, candidates, incoming: int, demand: bool, now_ms: float) -> int | None:
        """Asked before every load; a pure query (it must not change the system's state: the
        engine may ask and then not load). Return an evictable key from `candidates` to make
        room, or None to use a free slot (or, for a prefetch, to decline it when the cache is
        full). The engine reports the eviction it then makes through on_evict."""
        if not candidates.full:
            return None
        for key in candidates:
            return key
        return None

    def on_load(self, key: int, demand: bool, now_ms: float) -> None:
        """A copy of `key` was committed (after choose_victim); not called for preloads."""

    def on_evict(self, key: int, now_ms: float) -> None:
        """`key` left the cache to make room for a load (the victim choose_victim named)."""

    def on_step_end(self, iteration: IterationInfo, now_ms: float) -> None:
        pass

    def on_request_end(self, request: RequestInfo, now_ms: float) -> None:
        pass

    def describe(self) -> dict:
        """Parameters recorded in result.json."""
        return {"name": self.name, "label": self.label, "oracle": self.oracle,
                "prefetch": self.prefetch}
