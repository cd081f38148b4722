"""The rules and the report of `moebench holdout-check` (analysis/routing_holdout.py).

Per Table 1 system (SIMULATED timings; the synthetic side labelled SYNTHETIC):

  real       mean and p99 over the measured requests of each request's TPOT (docs/metrics.md
             `tpot_ms`), with the 95 % request-level percentile bootstrap
             (analysis/repro/stats.py `bootstrap_statistic`)
  synthetic  the same per seed; the mean over seeds with its 95 % t-interval
  within     synthetic mean inside the band around the real point: +-TPOT_TOL (mean) or
             +-P99_TOL (p99), each side widened to the real bootstrap bound where that lies
             further out (the issue's "or within the real replay's 95 % bootstrap interval
             when that is wider")
  rank       by mean TPOT among the seed systems that ran (1 = fastest; equal values share
             the better rank); a rank swap is a pair ordered strictly one way on real routing
             and strictly the other way on synthetic

Routing statistics: every measured (non-estimate) target of
analysis/routing_targets/deepseek_v2_lite.yaml, measured as the targets were (the whole
recording of each prompt; the last STAT_DECODE_TOKENS tokens teacher-forced as the decode
window) on the real measured prompts and on each synthetic seed's measured trace (prompt +
decode tokens, the same lengths). A statistic is within when the synthetic mean over seeds
meets the target's tolerance (and bound) around the real held-out value.
"""

from __future__ import annotations

import json
import math

import numpy as np

from analysis.repro import stats
from analysis.routing_fidelity import load_targets, target_text, within

TPOT_TOL = 0.05
P99_TOL = 0.10
STAT_DECODE_TOKENS = 31  # as the targets (analysis/routing_targets/deepseek_v2_lite.yaml)
METRICS = (("tpot_mean", TPOT_TOL, lambda a: a.mean(axis=1)),
           ("tpot_p99", P99_TOL, lambda a: np.percentile(a, 99, axis=1)))


def band(real: stats.Estimate, tol: float) -> tuple[float, float]:
    """The accepted range for a synthetic value: real +- tol, widened to the real interval."""
    low, high = real.mean * (1 - tol), real.mean * (1 + tol)
    if real.judged:
        low, high = min(low, real.low), max(high, real.high)
    return low, high


def within_band(value: float, real: stats.Estimate, tol: float) -> bool:
    low, high = band(real, tol)
    return low <= value <= high


def ranks(values: dict[str, float]) -> dict[str, int]:
    """1 = smallest value; equal values share the better rank."""
    return {s: 1 + sum(v < values[s] for v in values.values()) for s in values}


def rank_swaps(real: dict[str, float], synthetic: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs (a, b) of systems both sides rank, a faster than b on one side and strictly
    slower on the other."""
    both = [s for s in real if s in synthetic]
    return [(a, b) for i, a in enumerate(both) for b in both[i + 1:]
            if (real[a] - real[b]) * (synthetic[a] - synthetic[b]) < 0]


def routing_statistics(real: list, synthetic: dict) -> dict:
    """{"real": structure of the real measured prompts (int [L, T, k] each), "synthetic":
    {seed: structure of that seed's measured trace}}."""
    from analysis.characterize import request_sequences
    from analysis.routing_structure import structure, teacher_forced
    from workloads.importers import model_shape

    shape = model_shape("deepseek_v2_lite")

    def measure(seqs):
        return structure(seqs, teacher_forced(seqs, STAT_DECODE_TOKENS), shape["num_experts"],
                         shape["top_k"])

    return {"real": measure(real),
            "synthetic": {seed: measure(request_sequences(tr))
                          for seed, tr in synthetic.items()}}


def _estimate_text(e: stats.Estimate | None) -> str:
    return "" if e is None else e.text(4)


def system_rows(runs: dict, ranked: list[str]) -> tuple[list[dict], list[str]]:
    """One dict per system (numbers, for the CSV) and the misses in words."""
    rows, misses = [], []
    points = {"real": {}, "synthetic": {}}
    for system, real in runs["real"].items():
        synth = {s: o for s, o in runs["synthetic"][system].items() if o["status"] == "valid"}
        row = {"system": system, "real_status": real["status"],
               "synthetic_valid_seeds": len(synth)}
        if real["status"] != "valid" or not synth:
            row["note"] = real.get("reason") or "no valid synthetic run"
            rows.append(row)
            continue
        for name, tol, fn in METRICS:
            r = stats.bootstrap_statistic(real["tpot_ms"], fn)
            y = stats.mean({s: float(fn(o["tpot_ms"][None, :])[0]) for s, o in synth.items()})
            low, high = band(r, tol)
            ok = within_band(y.mean, r, tol)
            row.update({f"real_{name}_ms": r.mean, f"real_{name}_low_ms": r.low,
                        f"real_{name}_high_ms": r.high, f"synthetic_{name}_ms": y.mean,
                        f"synthetic_{name}_low_ms": y.low, f"synthetic_{name}_high_ms": y.high,
                        f"{name}_ratio": y.mean / r.mean, f"{name}_band_low_ms": low,
                        f"{name}_band_high_ms": high, f"{name}_within": ok,
                        f"_{name}": (r, y)})
            if not ok:
                misses.append(f"{system}: {name.replace('_', ' ')} SYNTHETIC "
                              f"{y.mean:.2f} ms is {100 * (y.mean / r.mean - 1):+.1f} % of real "
                              f"{r.mean:.2f} ms, outside [{low:.2f}, {high:.2f}]")
        hr_real = real["hit_rate_decode"]
        hr_syn = float(np.mean([o["hit_rate_decode"] for o in synth.values()]))
        row.update({"real_hit_rate_decode": hr_real, "synthetic_hit_rate_decode": hr_syn})
        if not (row["tpot_mean_within"] and row["tpot_p99_within"]):
            misses[-1] += (f"; decode hit rate SYNTHETIC {hr_syn:.3f} vs real {hr_real:.3f} "
                           f"({'more' if hr_syn > hr_real else 'fewer'} hits: the synthetic "
                           f"routing is {'easier' if hr_syn > hr_real else 'harder'} to cache "
                           "for this policy)")
        if system in ranked:
            points["real"][system] = row["real_tpot_mean_ms"]
            points["synthetic"][system] = row["synthetic_tpot_mean_ms"]
        rows.append(row)
    rk_real, rk_syn = ranks(points["real"]), ranks(points["synthetic"])
    swaps = rank_swaps(points["real"], points["synthetic"])
    swapped = {s for pair in swaps for s in pair}
    for row in rows:
        s = row["system"]
        if s in rk_real:
            row.update(rank_real=rk_real[s], rank_synthetic=rk_syn[s], rank_swap=s in swapped)
    for a, b in swaps:
        misses.append(f"rank swap: {a} vs {b}: real {points['real'][a]:.2f} vs "
                      f"{points['real'][b]:.2f} ms, SYNTHETIC {points['synthetic'][a]:.2f} vs "
                      f"{points['synthetic'][b]:.2f} ms")
    return rows, misses


def stat_rows(got: dict, targets: list[dict]) -> tuple[list[dict], list[str]]:
    """One dict per measured target: fit target, real held-out value, synthetic mean over
    seeds (and the seeds' range), within the tolerance around the real held-out value."""
    rows, misses = [], []
    for t in targets:
        if t["estimate"]:
            continue  # no real value to hold out (task labels the sample lacks)
        key = t["statistic"]
        real = got["real"].get(key)
        per_seed = [v[key] for v in got["synthetic"].values() if v.get(key) is not None]
        syn = float(np.mean(per_seed)) if per_seed else None
        ok = None if real is None else within(syn, {**t, "target": real})
        rows.append({"statistic": key, "fit_target": target_text(t),
                     "tolerance": float(t["tolerance"]), "real_heldout": real,
                     "synthetic": syn, "synthetic_seed_min": min(per_seed, default=None),
                     "synthetic_seed_max": max(per_seed, default=None),
                     "within": {True: "yes", False: "no", None: "n/a"}[ok],
                     "real_within_fit_target": {True: "yes", False: "no", None: "n/a"}[
                         within(real, t)]})
        if ok is False:
            misses.append(f"{key}: SYNTHETIC {syn:.4g} vs real held-out {real:.4g} "
                          f"(tolerance {float(t['tolerance']):g}; fit target "
                          f"{target_text(t)})")
    return rows, misses


def _cell(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def system_markdown(rows: list[dict]) -> str:
    import pandas as pd

    table = []
    for r in rows:
        cells = {"system": r["system"]}
        for name, _, _ in METRICS:
            est = r.get(f"_{name}")
            words = name.replace("tpot_", "TPOT ")
            cells[f"real {words} ms [95 % CI]"] = _estimate_text(est[0] if est else None)
            cells[f"SYNTHETIC {words} ms [95 % CI]"] = _estimate_text(est[1] if est else None)
            cells[f"{words} ratio"] = _cell(r.get(f"{name}_ratio"), 3)
            cells[f"{words} within"] = _cell(r.get(f"{name}_within"))
        cells["decode hit rate real / SYNTH."] = (
            f"{r['real_hit_rate_decode']:.3f} / {r['synthetic_hit_rate_decode']:.3f}"
            if "real_hit_rate_decode" in r else "")
        cells["rank real / SYNTH."] = (f"{r['rank_real']} / {r['rank_synthetic']}"
                                       if "rank_real" in r else "")
        cells["rank swap"] = _cell(r.get("rank_swap")).replace("yes", "SWAP").replace(
            "NO", "no")
        if r.get("note"):
            cells["system"] += f" ({r['real_status']}: {r['note']})"
        table.append(cells)
    return pd.DataFrame(table).to_markdown(index=False, disable_numparse=True)


def figure(rows: list[dict], split: str, path) -> bool:
    """Mean TPOT per system, real and SYNTHETIC, with their 95 % intervals."""
    from analysis.repro.output import new_figure, write_figure

    shown = [r for r in rows if r.get("_tpot_mean")]
    if not shown:
        return False
    fig, ax = new_figure(f"DeepSeek-V2-Lite held-out check ({split}): mean TPOT", "real vs "
                         "SYNTHETIC", width=9.0)
    x = np.arange(len(shown))
    for dx, side, name in ((-0.18, 0, "real (bootstrap CI)"), (0.18, 1, "SYNTHETIC (seeds CI)")):
        est = [r["_tpot_mean"][side] for r in shown]
        lo = [e.mean - (e.low if e.judged else e.mean) for e in est]
        hi = [(e.high if e.judged else e.mean) - e.mean for e in est]
        ax.errorbar(x + dx, [e.mean for e in est], yerr=[lo, hi], fmt="o", capsize=3,
                    label=name)
    ax.set_xticks(list(x), [r["system"] for r in shown], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TPOT mean (ms)")
    ax.legend(fontsize=7)
    write_figure(fig, path.parent, path.stem)
    return True


def write_report(out, split: str, runs: dict, got: dict, ranked: list[str],
                 config: dict) -> list:
    """holdout.md, holdout.csv (systems), holdout_stats.csv, holdout.json (provenance) and
    holdout.png under `out`; the paths written."""
    import pandas as pd

    from core.atomic import write_json, write_text

    rows, sys_misses = system_rows(runs, ranked)
    srows, stat_misses = stat_rows(got, load_targets("deepseek_v2_lite"))
    code = config["code"]
    prompts = config["prompts"]
    head = [f"# DeepSeek-V2-Lite held-out check, {split} split: SYNTHETIC vs real routing "
            "(timings SIMULATED)", "",
            f"Real: prompts {prompts['measured'][0]}-{prompts['measured'][1]} measured, "
            f"{prompts['warmup'][0]}-{prompts['warmup'][1]} warm the history-based systems "
            f"up (fit split {config['fit_prompts'][0]}-{config['fit_prompts'][1]} not used); "
            f"the last {config['decode_tokens']} tokens of each prompt are teacher-forced "
            f"decode steps (file records {config['records']}, 0-based: the sample lacks "
            f"prompt 317). SYNTHETIC: seeds {config['seeds']}, the same per-request lengths. "
            "Table 1 setting (RTX A5000 at 24 GB/s, batch 1, bf16). Code "
            f"{(code.get('sha') or '?')[:12]}{' (dirty)' if code.get('dirty') else ''}.",
            "", f"Rules: mean TPOT within {TPOT_TOL:.0%} and p99 within {P99_TOL:.0%} of the "
            "real replay, or within its 95 % bootstrap interval where wider; ranks by mean "
            "TPOT over the seed systems (variants shown, not ranked).", ""]
    body = [system_markdown(rows), "", "## Routing statistics (measured split)", "",
            pd.DataFrame([{k: _cell(v, 4) for k, v in r.items()} for r in srows]).to_markdown(
                index=False, disable_numparse=True), "", "## Misses", ""]
    misses = sys_misses + stat_misses
    body += [f"- {m}" for m in misses] or ["- none: every target met, no rank swap"]
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "holdout.md", out / "holdout.csv", out / "holdout_stats.csv",
             out / "holdout.json"]
    write_text(paths[0], "\n".join(head + body) + "\n")
    plain = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    write_text(paths[1], pd.DataFrame(plain).to_csv(index=False, lineterminator="\n"))
    write_text(paths[2], pd.DataFrame(srows).to_csv(index=False, lineterminator="\n"))
    write_json(paths[3], json.loads(json.dumps({**config, "misses": misses}, default=str)))
    if figure(rows, split, out / "holdout.png"):
        paths.append(out / "holdout.png")
    return paths
