"""How fMoE's claims read an experiment's runs: paired by seed (analysis/repro/values.py),
averaged as the paper averages, and turned into Estimates (analysis/repro/stats.py).

Both versions of the paper are claimed where their numbers differ (paper_numbers.md A2 = the
EuroSys'26 text, A2-v1 = the arXiv v1 the project was built from); the claim ids say which
(`.v1.`, `.eurosys.`). A relative change of the paper is a ratio 1 + change (TPOT -46 % ->
0.54: fMoE's TPOT / the baseline's; hit rate +14 % -> 1.14: fMoE's hit rate / the
baseline's). A hit-rate comparison judged as a difference uses the miss rate (1 - hit rate),
so that lower is better everywhere, as the pairs and ordering verdicts read it.
"""

from __future__ import annotations

import math

from analysis.repro import stats, values

V1 = "arXiv v1 (brief; paper_numbers.md A2-v1)"
EUROSYS = "EuroSys'26 / arXiv v2 (paper_numbers.md A2)"
BOTH = "arXiv v1 and EuroSys'26 (paper_numbers.md A2-v1 and A2)"
AVERAGED = ("per seed, the mean over the model x dataset cells of fMoE's relative change "
            "(x / baseline - 1), as the paper averages its percentages over three models; "
            "then the 95 % t-interval of log(1 + that mean) over seeds")


def labelled(runs, label, **extra):
    """A copy of the frame with `label` (label(result)) and each `extra` column
    (name -> fn(result)), so values.by_seed can select on them; `miss_rate` = 1 - hit_rate."""
    out = runs.copy()
    out["label"] = [label(r) for r in runs["_result"]]
    for col, fn in extra.items():
        out[col] = [fn(r) for r in runs["_result"]]
    out["miss_rate"] = [None if h is None or (isinstance(h, float) and math.isnan(h))
                        else 1.0 - float(h) for h in runs["hit_rate"]]
    return out


def cells(frame, keys: tuple[str, ...], **where) -> list[tuple]:
    """The distinct values of `keys` among the valid rows matching `where`, sorted."""
    ok = frame[frame["status"] == "valid"]
    for k, v in where.items():
        ok = ok[[x == v for x in ok[k]]]
    return sorted({tuple(r[k] for k in keys) for r in ok.to_dict("records")}, key=str)


def averaged_ratio(frame, num: str, den: str, column: str,
                   keys: tuple[str, ...] = ("model", "dataset"),
                   within: tuple[str, ...] | None = None, per_seed: bool = False):
    """1 + the mean over cells of (num's column / den's - 1), per seed, as an Estimate over
    seeds (AVERAGED). `within`: the baselines averaged over as well (num against each of
    them, every cell): the headline's mean over baselines. A seed counts only where every
    cell (and baseline) has both values; None when no seed does. `per_seed`: the
    {seed: 1 + mean change} itself, for a further average (headline_ratio)."""
    dens = within or (den,)
    grid = [(d, c) for d in dens for c in cells(frame, keys, label=d)]
    changes: dict[int, list[float]] = {}
    for d, cell in grid:
        where = dict(zip(keys, cell))
        a = values.by_seed(frame, column, label=num, **where)
        b = values.by_seed(frame, column, label=d, **where)
        for s in set(a) & set(b):
            if b[s] > 0:
                changes.setdefault(s, []).append(a[s] / b[s] - 1.0)
    full = {s: 1.0 + math.fsum(v) / len(v) for s, v in changes.items() if len(v) == len(grid)}
    full = {s: v for s, v in full.items() if v > 0}
    if per_seed:
        return full if grid else {}
    return stats.log_mean(full) if grid and full else None


def headline_ratio(frame, system: str, bases: tuple[str, ...], columns: tuple[str, ...]
                   ) -> stats.Estimate | None:
    """1 + the mean over `columns` of each column's mean change against all `bases` (every
    cell), per seed, then over seeds: each column weighs alike, as the abstract's one
    latency figure averages TTFT and TPOT reductions alike."""
    per = [averaged_ratio(frame, system, bases[0], c, within=bases, per_seed=True)
           for c in columns]
    seeds = set.intersection(*(set(p) for p in per)) if per else set()
    both = {s: 1.0 + math.fsum(p[s] - 1.0 for p in per) / len(per) for s in seeds}
    both = {s: v for s, v in both.items() if v > 0}
    return stats.log_mean(both) if both else None


def differences(frame, pairs: list[tuple[dict, dict]], column: str
                ) -> tuple[list[stats.Estimate] | None, list[str]]:
    """Paired-by-seed differences a - b for each (a, b) selection; the selections with no
    common seed are returned by name (the claim says which are missing)."""
    diffs, missing = [], []
    for a, b in pairs:
        est = values.seed_difference(frame, a, b, column)
        if est is None:
            missing.append(f"{a} - {b}")
        else:
            diffs.append(est)
    return (diffs or None), missing


def missing_note(missing: list[str]) -> str | None:
    return f"no paired run for: {'; '.join(missing)}" if missing else None


def location(frame, key: str, grid: tuple, column: str, paper, **where):
    """(where the curve is lowest: geometric mean over seeds of each seed's argmin on the grid,
    curve(grid[0]) - curve(paper) paired by seed); (None, None) without runs."""
    curves = {g: values.by_seed(frame, column, **{key: g}, **where) for g in grid}
    seeds = set.intersection(*(set(c) for c in curves.values())) if curves else set()
    if not seeds:
        return None, None
    best = {s: float(min(grid, key=lambda g: (curves[g][s], g))) for s in seeds}
    falls = values.seed_difference(frame, {key: grid[0], **where}, {key: paper, **where},
                                   column)
    return stats.log_mean(best), falls


def _setting_key(row: dict) -> str:
    """A run's setting without its seed: what the seeds of one table row share."""
    import json

    from harness.runner.results import NON_SEMANTIC_KEYS

    res = row["_result"]
    cfg = {k: v for k, v in (res.get("config") or {}).items()
           if k != "seed" and k not in NON_SEMANTIC_KEYS}
    # the system's identity (a variant has its own name), not its describe() counters,
    # which differ between seeds
    s = res.get("system") or {}
    parts = [s.get("name"), (s.get("evictor") or {}).get("name"),
             (s.get("prefetcher") or {}).get("name")]
    return json.dumps([row.get("model"), parts, cfg], sort_keys=True, default=str)


def collapse(runs):
    """One row per setting: each numeric metric the mean over its valid seeds, `seeds` their
    count, `_result` the first valid seed's (its config names the setting). The tables show
    these means; the claims read the seeds themselves (values.by_seed)."""
    import pandas as pd

    from analysis.repro.frame import METRICS

    groups: dict[str, list[dict]] = {}
    for r in runs.to_dict("records"):
        groups.setdefault(_setting_key(r), []).append(r)
    out = []
    for rows in groups.values():
        ok = [r for r in rows if r["status"] == "valid"]
        first = dict((ok or rows)[0])
        for col in (c for c in (*METRICS, "requests") if c in first):
            vals = [float(r[col]) for r in ok if r.get(col) is not None and r[col] == r[col]]
            first[col] = math.fsum(vals) / len(vals) if vals else None
        first["seeds"] = len(ok)
        out.append(first)
    return pd.DataFrame(out, columns=[*runs.columns, "seeds"])
