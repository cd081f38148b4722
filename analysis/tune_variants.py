"""`moebench tune-variants`: choose each named variant's knobs (systems/variants.py) on the
tuning split, never on a measured setting.

The tuning split is the Table 1 setting (DeepSeek-V2-Lite, RTX A5000 at 24 GB/s, batch 1,
prompt 512, decode 32) on seeds TUNING_SEEDS. Every synthetic stream (model-wide and task
preferences, the measured and the calibration requests, embeddings) is drawn from
core.rng.stream(seed, name), so seeds >= 1000 share no request with the measured settings,
which use seeds 0-4 and their own request streams, nor with their calibration splits. The grid
is small (SIMULATED, a few minutes on two cores); the chosen value of a knob set is the one with
the lowest mean TPOT over the tuning seeds (ties: the first in grid order), and the variant's
yaml must carry it (the last column says whether it does).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from multiprocessing import get_context
from pathlib import Path

import yaml

from core.paths import CONF_DIR
from systems.variants import VARIANTS

TUNING_SEEDS = (1000, 1001)
MEASURED_SEEDS = range(5)  # the experiments' seeds (0-4): never tuned on
TUNING_REQUESTS = 40  # measured and calibration requests per tuning run
BASE = ("experiment=table1", f"workload.num_requests={TUNING_REQUESTS}",
        f"calibration_requests={TUNING_REQUESTS}", "progress=false", "blas_threads=1")
# variant -> knob -> values tried; every knob here is ours (neither paper nor code gives it).
# A chosen value must lie inside its grid: one at an edge means the grid is extended.
GRIDS: dict[str, dict[str, tuple]] = {
    "moe_infinity_hysteresis": {"admit_margin": (8.0, 16.0, 24.0, 32.0, 48.0),
                                "own_weight": (0.25, 0.5, 0.75),
                                "match_top": (1, 4)},
    "fmoe_admission": {"admission_margin": (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)},
    "diff_moe_floor_recency": {"min_val": (-1.0, 0.0, 0.5)},
}


def combos(variant: str) -> list[dict]:
    """The grid of `variant` as knob dicts, in grid order (the first knob slowest)."""
    grid = GRIDS[variant]
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def choose(rows: list[dict]) -> dict:
    """The row with the lowest `tpot_mean_ms`; ties go to the first row (grid order)."""
    best = rows[0]
    for row in rows[1:]:
        if row["tpot_mean_ms"] < best["tpot_mean_ms"]:
            best = row
    return best


def yaml_knobs(variant: str) -> dict:
    """The knobs the variant's conf/system yaml sets."""
    return yaml.safe_load((CONF_DIR / "system" / f"{variant}.yaml").read_text())


def _run(job: tuple[str, dict, int, str]) -> dict:
    from harness.runner.config import compose_config
    from harness.runner.run import run_config

    variant, knobs, seed, out = job
    overrides = [*BASE, f"system={variant}", f"seed={seed}",
                 *(f"system.{k}={v}" for k, v in knobs.items())]
    name = "-".join([variant, f"seed{seed}", *(f"{k}_{v}" for k, v in knobs.items())])
    try:
        result = run_config(compose_config(overrides, run_name=name, results_dir=out))
    except Exception as exc:  # a plain error: some library exceptions do not pickle back
        raise RuntimeError(f"{name}: {type(exc).__name__}: {exc}") from None
    if result["status"] != "valid":
        raise RuntimeError(f"{name}: {result['status']} ({result.get('reason')})")
    m = result["metrics"]
    return {"variant": variant, "seed": seed, **knobs, "tpot_ms": m["tpot_ms"]["mean"],
            "pf_per_token": m["prefetches_per_decode_token"],
            "precision": m["prefetch_precision"]}


def tune(variants: list[str], jobs: int, out: str) -> dict[str, tuple[list[dict], dict]]:
    """Run every grid point of `variants` on every tuning seed; per variant the rows (knobs,
    TPOT per seed and its mean, prefetches per decode token) and the chosen row."""
    work = [(v, knobs, seed, out) for v in variants for knobs in combos(v)
            for seed in TUNING_SEEDS]
    with get_context("fork").Pool(jobs) as pool:
        runs = pool.map(_run, work, chunksize=1)
    tables = {}
    for v in variants:
        rows = []
        for knobs in combos(v):
            mine = [r for r in runs if r["variant"] == v and all(r[k] == x for k, x in
                                                                  knobs.items())]
            row = {**knobs, **{f"tpot_ms_seed{r['seed']}": r["tpot_ms"] for r in mine}}
            row["tpot_mean_ms"] = sum(r["tpot_ms"] for r in mine) / len(mine)
            row["pf_per_token"] = sum(r["pf_per_token"] for r in mine) / len(mine)
            rows.append(row)
        tables[v] = (rows, choose(rows))
    return tables


def render(tables: dict[str, tuple[list[dict], dict]]) -> tuple[str, bool]:
    """Markdown: one table per variant, the chosen row marked, and whether its yaml holds
    the chosen values; True when every yaml does."""
    lines, all_match = [], True
    for v, (rows, best) in tables.items():
        knobs = list(GRIDS[v])
        conf = yaml_knobs(v)
        match = all(conf.get(k) == best[k] for k in knobs)
        all_match &= match
        cols = [*knobs, *(f"TPOT seed {s} ms" for s in TUNING_SEEDS), "mean TPOT ms",
                "prefetches / decode token", "chosen"]
        lines += [f"### {v}", "", "| " + " | ".join(cols) + " |",
                  "|" + " --- |" * len(cols)]
        for row in rows:
            cells = [str(row[k]) for k in knobs]
            cells += [f"{row[f'tpot_ms_seed{s}']:.2f}" for s in TUNING_SEEDS]
            cells += [f"{row['tpot_mean_ms']:.2f}", f"{row['pf_per_token']:.2f}",
                      "**chosen**" if row is best else ""]
            lines.append("| " + " | ".join(cells) + " |")
        chosen = ", ".join(f"{k}={best[k]}" for k in knobs)
        yaml_now = ", ".join(f"{k}={conf.get(k)}" for k in knobs)
        lines += ["", f"chosen: {chosen}; conf/system/{v}.yaml: {yaml_now} "
                      f"({'matches' if match else 'DIFFERS: update the yaml'})", ""]
    return "\n".join(lines), all_match


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench tune-variants", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--variants", help="comma-separated variants (default: every one in "
                                       "systems/variants.py)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel runs (default 2)")
    ap.add_argument("--out", help="results folder for the runs (default: a temporary one)")
    args = ap.parse_args(argv)
    known = [v for vs in VARIANTS.values() for v in vs]
    variants = args.variants.split(",") if args.variants else known
    unknown = sorted(set(variants) - set(GRIDS))
    if unknown:
        ap.error(f"--variants: no grid for {unknown}; known: {sorted(GRIDS)}")
    print(f"tuning split: Table 1 setting, seeds {list(TUNING_SEEDS)}, {TUNING_REQUESTS} "
          f"measured + {TUNING_REQUESTS} calibration requests per run (SIMULATED, synthetic)",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(args.out).resolve()) if args.out else tmp
        md, ok = render(tune(variants, args.jobs, out))
    print(md)
    return 0 if ok else 1
