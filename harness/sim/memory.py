"""GPU memory plan: the expert cache gets what the GPU leaves after the rest (sized once)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from core.specs import GIB, HardwareSpec, ModelSpec, SpecError


@dataclass(frozen=True)
class MemoryPlan:
    gpu_bytes: int
    dense_bytes: int  # resident weights: attention, shared experts, dense layers, embeddings
    kv_bytes: int  # KV cache at the run's maximum context x batch
    reserve_bytes: int  # runtime reserve (CUDA context, activations, allocator slack)
    available_bytes: int  # what is left for routed experts (may be <= 0)
    expert_cache_bytes: int  # the budget the run uses
    explicit: bool  # True when set by expert_cache_gb

    def as_dict(self) -> dict:
        return asdict(self)


def plan_memory(model: ModelSpec, hw: HardwareSpec, max_context_tokens: int, max_batch: int,
                expert_cache_gb: float | None = None) -> MemoryPlan:
    kv = model.kv_bytes_per_token * max_context_tokens * max_batch
    available = hw.gpu_mem_bytes - model.dense_bytes - kv - hw.runtime_reserve_bytes
    budget = max(0, available)
    if expert_cache_gb is not None:
        gb = expert_cache_gb
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb):
            raise SpecError(f"expert_cache_gb: expected a finite number, got {gb!r}")
        explicit = int(float(gb) * GIB)
        if not explicit > 0:
            raise SpecError(f"expert_cache_gb: must be positive, got {expert_cache_gb!r}")
        if explicit < model.expert_bytes:
            raise SpecError(f"expert_cache_gb: {expert_cache_gb} GiB holds no expert of "
                            f"{model.name} ({model.expert_bytes} bytes each)")
        if explicit > available:
            raise SpecError(
                f"expert_cache_gb: {expert_cache_gb} GiB exceeds what GPU memory leaves for "
                f"experts on {hw.name} with {model.name}: {available / GIB:.2f} GiB "
                f"(= {hw.gpu_mem_gb} GiB - dense {model.dense_bytes / GIB:.2f} - KV "
                f"{kv / GIB:.2f} - reserve {hw.runtime_reserve_gb})")
        budget = explicit
    return MemoryPlan(hw.gpu_mem_bytes, model.dense_bytes, kv, hw.runtime_reserve_bytes,
                      available, budget, expert_cache_gb is not None)
