"""A results folder as a pandas table: one row per run, the settings that vary between its
runs as columns, and the metrics every experiment reads (definitions: docs/metrics.md).

Only result.json files are read, through analysis/runs.py's checks (`checked_frame`); nothing
is rerun. A run that is not valid (oom) keeps its row with empty metrics and its status and
reason; a failure record is a note, and its row counts as missing.
"""

from __future__ import annotations

from pathlib import Path

from analysis.runs import collect, flatten
from harness.runner.results import NON_SEMANTIC_KEYS

# column -> dotted key of result["metrics"] (a latency block: its mean unless named)
METRICS = {
    "tpot_mean_ms": "tpot_ms.mean", "tpot_p99_ms": "tpot_ms.p99", "ttft_mean_ms": "ttft_ms.mean",
    "ttft_p99_ms": "ttft_ms.p99", "e2e_mean_ms": "e2e_ms.mean", "e2e_p99_ms": "e2e_ms.p99",
    "hit_rate": "hit_rate", "hit_rate_decode": "hit_rate_decode", "misses": "misses",
    "accesses": "accesses", "compute_floor_ms": "compute_floor_ms", "headroom": "headroom",
    "decode_stall_ms_per_token": "decode_stall_ms_per_token",
    "h2d_gb_per_token": "h2d_gb_per_token", "tokens_per_s": "tokens_per_s",
    "makespan_ms": "makespan_ms", "tokens": "tokens", "goodput_rps": "goodput_rps",
}
# never columns of their own: names, bookkeeping, or what the routing column says
_SKIP = (*NON_SEMANTIC_KEYS, "routing", "calibration_routing", "system._target_")


def _metric(metrics: dict | None, dotted: str):
    node = metrics or {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def routing_of(result: dict) -> str:
    trace = result.get("trace") or {}
    if trace.get("synthetic", True):
        return "synthetic"
    return f"real: {trace.get('routing_source')} ({trace.get('num_requests')} requests)"


def run_rows(results: list[dict]) -> list[dict]:
    """One dict per run: system, status, routing, model, hardware, the seed, every config
    key that varies between the runs (dotted), the expert cache in GiB, METRICS."""
    flat = [flatten(r["config"]) for r in results]
    keys = sorted({k for f in flat for k in f})
    varying = [k for k in keys if not any(k == s or k.startswith(f"{s}.") for s in _SKIP)
               and len({repr(f.get(k)) for f in flat}) > 1]
    rows = []
    for r, f in zip(results, flat):
        m = r.get("metrics") if r["status"] == "valid" else None
        row = {"run": r.folder, "system": r["system"].get("name"), "status": r["status"],
               "reason": r.get("reason"), "routing": routing_of(r),
               "model": (r.get("model") or {}).get("name"), "hardware": r.get("hardware"),
               "expert_cache_gib": (r.get("memory") or {}).get("expert_cache_bytes", 0) / 2**30,
               "requests": (r.get("trace") or {}).get("num_requests"),
               "seed": f.get("seed")}  # a column even where one seed ran (reports group by it)
        row.update({k: f.get(k) for k in varying if k not in row})
        row.update({col: _metric(m, key) for col, key in METRICS.items()})
        row["_result"] = r
        rows.append(row)
    return rows


def checked_frame(folder: Path, *, axes: list[str] | None = None, allow_mixed: bool = False,
                  allow_partial: bool = False, expected_count: int | None = None):
    """The runs of one report through analysis/runs.collect (refuse to mix, completeness:
    ReportError says why), as `frame` does; failure records are notes, not rows. The
    DataFrame's attrs carry `axes`, `missing` and `notes` for the table's header."""
    import pandas as pd

    from harness.runner.config import system_names

    runs = collect(Path(folder), axes=axes, allow_mixed=allow_mixed,
                   allow_partial=allow_partial, expected_systems=system_names(),
                   system_names=system_names(), expected_count=expected_count)
    out = pd.DataFrame(run_rows(runs.results))
    out.attrs.update(axes=list(runs.axes), missing=list(runs.missing), notes=list(runs.notes))
    return out
