"""Every experiment of the suite: the modules of analysis/repro/experiments/, in ORDER (the
order of docs/reproduction.md and of results/claims.md), each defining `EXPERIMENT`."""

from __future__ import annotations

import importlib
import pkgutil

from analysis.repro import experiments

ORDER = ("table1", "moe_infinity_models", "eamc_capacity", "workload_shift", "long_context",
         "fmoe_overall", "fmoe_online", "fmoe_cache_limit", "fmoe_prefetch_distance",
         "fmoe_store_capacity", "fmoe_batch", "fmoe_ablation", "diffmoe_batch",
         "mixtral_offloading_ablation", "routing_fidelity", "table1_q4", "tiers", "gpus")


def _load() -> dict:
    found = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__)
                   if not m.name.startswith("_"))
    rank = {n: i for i, n in enumerate(ORDER)}
    out = {}
    for name in sorted(found, key=lambda n: (rank.get(n, len(ORDER)), n)):
        exp = importlib.import_module(f"{experiments.__name__}.{name}").EXPERIMENT
        if exp.name != name:
            raise ValueError(f"analysis/repro/experiments/{name}.py: EXPERIMENT.name is "
                             f"{exp.name!r}; it must be the module's name")
        out[name] = exp
    return out


EXPERIMENTS = _load()


def names() -> list[str]:
    return list(EXPERIMENTS)
