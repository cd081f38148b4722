"""Short names of a workload's prompts and arrivals, as the config groups spell them.

`moebench` prints them on a run's line and reports use them for the `prompts` / `arrivals`
axes of a sweep. They are read back from the composed `workload` mapping (conf/prompts and
conf/arrivals write workload.prompts and workload.arrivals), so a run keeps its label after
any `workload.*` override.
"""

from __future__ import annotations


def prompts_name(workload: dict) -> str:
    """`synthetic` without prompts, else the dataset name (`mmlu`; a list joins with `+`)."""
    spec = workload.get("prompts") if isinstance(workload, dict) else None
    if not isinstance(spec, dict):
        return "synthetic"
    names = spec.get("dataset")
    return "+".join(map(str, names)) if isinstance(names, list) else str(names)


def arrivals_name(workload: dict) -> str:
    """`offline` (all at t = 0), `fixed <gap> ms`, `poisson`, `gamma` or `azure_<kind>`."""
    spec = workload.get("arrivals") if isinstance(workload, dict) else None
    if not isinstance(spec, dict):
        gap = workload.get("arrival_ms", 0.0) if isinstance(workload, dict) else 0.0
        return "offline" if not gap else f"fixed {gap:g} ms"
    process = spec.get("process")
    return f"azure_{spec.get('kind', 'conv')}" if process == "azure" else str(process)


def inputs_label(config: dict) -> str:
    """`prompts=mmlu arrivals=poisson` for a run config; a trace file (routing=FILE) fixes
    both, its routing having come from them."""
    if config.get("routing"):
        return "prompts and arrivals of the trace file"
    workload = config.get("workload") or {}
    return f"prompts={prompts_name(workload)} arrivals={arrivals_name(workload)}"
