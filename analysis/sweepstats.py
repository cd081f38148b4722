"""Shared parts of the sweep reports (analysis/compare.py, analysis/cdf.py): the seed interval,
the SIMULATED / routing / LOSSY label and figures written byte-identically.

Seed interval: a point swept over n seeds shows the mean of its n values and the half-width
of the two-sided 95 % Student t-interval, t(0.975, n - 1) * s / sqrt(n), s the sample
standard deviation (ddof 1). It treats the seeds as independent draws of the same
experiment; one seed has no interval (half-width null).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from core.atomic import write_bytes
from core.precision import results_label

CI_NOTE = ("mean ± half-width of the two-sided 95 % Student t-interval over seeds "
           "(t(0.975, n-1) * s / sqrt(n), s with ddof 1)")


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 0.5 plus Simpson's rule on the density over [0, t]."""
    n = 4096  # even; the density is smooth, the error is far below the 1e-9 the root needs
    x = np.linspace(0.0, t, n + 1)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    weights = np.ones(n + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return 0.5 + float(np.dot(weights, pdf)) * (t / n) / 3.0


def t_quantile_975(df: int) -> float:
    """t(0.975, df) by bisection on the t distribution's CDF (no scipy dependency)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    lo, hi = 0.0, 64.0  # t(0.975, 1) = 12.71
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values) -> tuple[float | None, float | None, int]:
    """(mean, 95 % half-width or None, n) of the finite values; (None, None, 0) when none."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return None, None, 0
    if len(v) == 1:
        return float(v[0]), None, 1
    half = t_quantile_975(len(v) - 1) * float(np.std(v, ddof=1)) / math.sqrt(len(v))
    return float(np.mean(v)), half, len(v)


def routing_label(results: list[dict]) -> str:
    """`synthetic routing` or `routing <source>` (joined when runs differ)."""
    labels = sorted({"synthetic routing" if (r.get("trace") or {}).get("synthetic", True)
                     else f"routing {r['trace'].get('routing_source')}" for r in results})
    return ", ".join(labels)


def sim_label(results: list[dict]) -> str:
    """`SIMULATED, <routing>`, and `, LOSSY: ...` when a run's weights are below 16 bits
    (core/precision.py): the label of every sweep table and figure."""
    lossy = results_label(results)
    return f"SIMULATED, {routing_label(results)}" + (f", {lossy}" if lossy else "")


def save_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    """<stem>.png and <stem>.pdf, atomically, with no creation date or other varying metadata:
    the same figure gives the same bytes on every rerun."""
    import io

    paths = []
    for ext, meta in (("png", {"Software": None}),
                      ("pdf", {"CreationDate": None, "ModDate": None, "Producer": None,
                               "Creator": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=meta, dpi=120)
        path = Path(out_dir) / f"{stem}.{ext}"
        write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), or an error naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install -e '.[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def add_run_options(ap) -> None:
    """The options compare and cdf share: which runs, and where the files go."""
    ap.add_argument("--axes", help="comma-separated keys that may differ between runs "
                                   "(default: the keys multirun.yaml records as swept)")
    ap.add_argument("--out", help="output folder (default: the results folder)")
    ap.add_argument("--allow-mixed", action="store_true")
    ap.add_argument("--allow-partial", action="store_true")


def collect_runs(args, results_dir: Path):
    """analysis/runs.py collect() with the options of add_run_options."""
    from analysis.runs import collect
    from harness.runner.config import system_names

    return collect(Path(results_dir), axes=args.axes.split(",") if args.axes else None,
                   allow_mixed=args.allow_mixed, allow_partial=args.allow_partial,
                   system_names=system_names())
