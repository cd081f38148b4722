"""fmoe_ablation: fMoE's ablation (arXiv 2502.05370 v1 Fig. 12, the brief; v2 = EuroSys'26,
paper_numbers.md A2): the expert hit rate over its design steps and over eviction rules, on
Mixtral-8x7B with one RTX 3090 at its own expert cache (19.5 GiB, 59 of 256 experts);
conf/experiment/fmoe_ablation.yaml.

Design steps, composed from the policy zoo (docs/systems.md) with one evictor throughout, each
run under both LRU and LFU:
  no prefetch      composed(<evictor>, none): the floor the prefetchers add to
  speculate        composed(<evictor>, spec_next_layer): the trace's next-layer guesses
  hit count        composed(<evictor>, frequency): the next layer's most counted experts
  map T            composed(<evictor>, fmoe_maps) with semantic_matching=false and
                   delta_rule=false: maps matched by trajectory alone, each prediction the
                   matched row's top-k
  map T+S          the same with semantic matching (delta_rule=false)
  map T+S+delta    composed(<evictor>, fmoe_maps): fMoE's whole matching
Eviction: fMoE's maps with LRU, with LFU, and the fmoe system (its own p * freq eviction, with
the protection of prefetched experts that goes with it); beside it, never judged, its named
variant fmoe_admission (systems/variants.py: the same with our admission rule).
Claims (v1, Fig. 12; the EuroSys text read gives none), as hit rates compared through the
miss rate (1 - hit rate, lower is better) paired by seed, every design step under LFU (the
papers' steps vary the tracking with one cache; LFU is the zoo evictor nearest fMoE's
p x freq rule, which only the fmoe system has). LFU is the zoo's `lfu`, the in-cache LFU the
paper's comparison means (libCacheSim's: a count restarts when the expert is re-inserted; the
counts-kept rule these rows ran before is `lfu_perfect`, docs/decisions/2026-12-06-lfu-names.md):
  12a ordering  map T+S+delta above map T+S above map T (the hit rate rises as each of fMoE's
                features is added)
  12a pairs     the full design (map T+S+delta) above every other step
  12a pairs     hit count (request-level counts) below every other step
  12b pairs     fMoE's own caching (the fmoe system) above its maps under LRU and under LFU
"""

from __future__ import annotations

from analysis.repro.experiments._fmoe_claims import (
    V1,
    collapse,
    differences,
    labelled,
    missing_note,
)
from analysis.repro.experiments._fmoe_sweeps import FMOE_VARIANT, SOURCE, num, setting
from analysis.repro.output import grouped_bars, new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.repro.values import seed_mean
from analysis.repro.verdict import ClaimRow

PAPER = f"{SOURCE} ablation"
EVICTORS = ("lru", "lfu")
# design step -> (the zoo prefetcher that expresses it, its knobs that differ from default)
STEPS = {"no prefetch": ("none", {}), "speculate": ("spec_next_layer", {}),
         "hit count": ("frequency", {}),
         "map T": ("fmoe_maps", {"semantic_matching": False, "delta_rule": False}),
         "map T+S": ("fmoe_maps", {"delta_rule": False}), "map T+S+delta": ("fmoe_maps", {})}
_KNOBS = ("semantic_matching", "delta_rule")  # fmoe_maps' ablation switches (default true)
EVICTION_NAMES = {"lru": "LRU", "lfu": "LFU", "fmoe": "fMoE's (p x freq)",
                  FMOE_VARIANT: "fMoE's + our admission (variant)"}
OWN = ("fmoe", FMOE_VARIANT)  # systems with their own eviction: the seed and its variant
CLAIM_EVICTOR = "lfu"  # the one cache every design step is compared under (module docstring)
PAPER_STEPS = ("speculate", "hit count", "map T", "map T+S", "map T+S+delta")  # Fig. 12a
FULL, COUNTS = "map T+S+delta", "hit count"


def _parts(result: dict) -> tuple[str, str | None]:
    """(evictor, design step) of a run; the fmoe system (and its variant) is (its name,
    map T+S+delta)."""
    s = result["system"]
    if s.get("name") in OWN:
        return s["name"], "map T+S+delta"
    node = result["config"]["system"].get("prefetcher") or {}
    name = (s.get("prefetcher") or {}).get("name")
    knobs = {k: node[k] for k in _KNOBS if k in node and node[k] is False}
    step = next((st for st, (pf, kn) in STEPS.items() if pf == name and kn == knobs), None)
    return (s.get("evictor") or {}).get("name"), step


def table(runs):
    """One row per design step and evictor (not-expressible steps once, with the reason),
    then fMoE's own eviction: hit rate (overall, decode), prefetch precision, TPOT."""
    import pandas as pd

    cells = {_parts(r["_result"]): r for r in collapse(runs).to_dict("records")}
    rows = []
    for step in STEPS:
        for ev in (*EVICTORS, *OWN) if step == "map T+S+delta" else EVICTORS:
            r = cells.get((ev, step))
            if r is None:
                continue
            m = r["_result"].get("metrics") or {}
            rows.append({"step": step, "evictor": EVICTION_NAMES[ev],
                         "system": ev if ev in OWN else f"composed({ev},{STEPS[step][0]})",
                         "status": r["status"], "seeds": r["seeds"],
                         "hit_rate": num(r["hit_rate"]),
                         "hit_rate_decode": num(r["hit_rate_decode"]),
                         "prefetch_precision": num(m.get("prefetch_precision")),
                         "tpot_mean_ms": num(r["tpot_mean_ms"]), "note": ""})
    tab = pd.DataFrame(rows, columns=["step", "evictor", "system", "status", "seeds", "hit_rate",
                                      "hit_rate_decode", "prefetch_precision", "tpot_mean_ms",
                                      "note"])
    header = [f"# {PAPER}, SIMULATED", "", setting(runs, (
        "Batch 1, the RTX 3090's own expert cache, fMoE d = 3. Each design step is one zoo "
        "prefetcher run under both evictors; evictor fMoE's = the fmoe system (its own "
        "eviction and protection of prefetched experts; the variant adds our admission rule, "
        "shown, not judged). hit_rate counts an "
        "access as a hit only when its expert is ready; prefetch_precision = share of the "
        "prefetched experts that were used (the first seed's); the rest means over the seeds "
        "run (`seeds`)."))]
    notes = ["hit count = the zoo's frequency prefetcher, counting from the run's start "
             "(warm_from_calibration false); the map steps warm their store on the 28 "
             "calibration requests.",
             "LRU is the zoo's global LRU. The cache (59 slots) is smaller than one token's "
             "64 expert uses (32 layers x top-2), so LRU evicts every expert before its layer "
             "comes round again: only a prefetch that lands in time can hit.",
             "LFU is the zoo's in-cache lfu (a count restarts when the expert is re-inserted; "
             "a prefetched copy lands with count 1). For the same reason no count outlives its "
             "copy: without prefetch it hits as rarely as LRU; a prefetched copy that is used "
             "reaches count 2 and outlasts the count-1 copies."]
    return tab, header, notes


def figure(tab, runs):
    """Hit rate per design step (groups), one bar per eviction rule."""
    fig, ax = new_figure(f"{PAPER}: expert hit rate per design step (Mixtral-8x7B, RTX 3090)",
                         runs.iloc[0]["routing"], width=9.0, height=4.6)
    groups = list(STEPS)
    series = {}
    for ev in (*EVICTORS, *OWN):
        name = EVICTION_NAMES[ev]
        at = tab[tab["evictor"] == name].set_index("step")["hit_rate"]
        series[f"eviction: {name}"] = [num(at.get(s)) if s in at.index else None for s in STEPS]
    grouped_bars(ax, groups, series, "expert hit rate")
    return fig


def _pairs(frame, cid: str, source: str, text: str, pairs, ours: str) -> ClaimRow:
    diffs, missing = differences(frame, pairs, "miss_rate")
    return ClaimRow(cid, "fmoe_ablation", source, text, "pairs", paper="as the claim says",
                    ours=ours, diffs=diffs, note=missing_note(missing),
                    averaged="miss rates (1 - hit rate) paired by seed")


def claims(tab, runs, real):
    """Fig. 12a's ordering of the map steps and its best and worst step; Fig. 12b's eviction."""
    frame = labelled(runs, lambda res: _parts(res)[0], step=lambda res: _parts(res)[1])
    ev = CLAIM_EVICTOR

    def at(step, evictor=ev):
        return {"label": evictor, "step": step}

    paper = [FULL, "map T+S", "map T"]
    means = {s: seed_mean(frame, "miss_rate", **at(s)) for s in paper}
    ours = sorted((s for s in paper if means[s] is not None), key=lambda s: means[s])
    diffs, missing = differences(frame, [(at(a), at(b)) for a, b in zip(paper, paper[1:])],
                                 "miss_rate")
    source = f"{V1}, Fig. 12a"
    out = [ClaimRow(
        "fmoe_ablation.v1.map_steps_order", "fmoe_ablation", source,
        "the hit rate rises as trajectory matching, semantic matching and the delta rule are "
        "added (map T < T+S < T+S+delta)", "ordering", paper=paper,
        ours=ours if len(ours) == len(paper) else None,
        diffs=diffs if diffs and not missing else None, note=missing_note(missing),
        averaged=f"miss rates paired by seed, all under {EVICTION_NAMES[ev]}")]
    others = [s for s in PAPER_STEPS if s != FULL]
    out.append(_pairs(frame, "fmoe_ablation.v1.full_design_highest", source,
                      "the full design (map T+S+delta) has the highest hit rate of the steps",
                      [(at(FULL), at(s)) for s in others], "full minus each other step"))
    others = [s for s in PAPER_STEPS if s != COUNTS]
    out.append(_pairs(frame, "fmoe_ablation.v1.hit_count_lowest", source,
                      "request-level hit counts have the lowest hit rate of the steps",
                      [(at(s), at(COUNTS)) for s in others], "each other step minus hit count"))
    out.append(_pairs(frame, "fmoe_ablation.v1.eviction_beats_lru_lfu", f"{V1}, Fig. 12b",
                      "fMoE's caching (p x freq) reaches a higher hit rate than LRU and LFU",
                      [(at(FULL, "fmoe"), at(FULL, e)) for e in EVICTORS],
                      "fmoe minus its maps under LRU, under LFU"))
    return out


EXPERIMENT = Experiment(
    name="fmoe_ablation", title=PAPER, mirrors=f"{PAPER}: hit rate per design step and eviction",
    sweeps=(Sweep(("system=composed", "system/evictor=" + ",".join(EVICTORS),
                   "system/prefetcher=" + ",".join(dict.fromkeys(p for p, _ in
                                                                 STEPS.values())))),
            Sweep(("system=composed", "system/evictor=" + ",".join(EVICTORS),
                   "system/prefetcher=fmoe_maps", "system.prefetcher.delta_rule=false",
                   "system.prefetcher.semantic_matching=true,false")),
            Sweep(("system=" + ",".join(OWN),))),
    table=table, figure=figure, claims=claims,
    notes=("Scaled down from the paper for the suite's time budget "
           "(conf/experiment/fmoe_ablation.yaml): synthetic prompts (their task-centroid "
           "embeddings give the semantic match something to find), 12 measured requests of 32 "
           "output tokens.",))
