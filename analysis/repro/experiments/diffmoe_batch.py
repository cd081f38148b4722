"""diffmoe_batch: Diff-MoE (SC'25) throughput from batch 1 to 128 (Switch-base-128 and
Switch-large-128 on an H200, 5 % of the experts cached) against on_demand and moe_infinity,
and moe_infinity's miss rate from batch 1 to 16; conf/experiment/diffmoe_batch.yaml.

The cache is 5 % of the model's routed experts at fp32 (1.35 GiB = 76 of Switch-base's 1,536
experts; 4.8 GiB = 153 of Switch-large's 3,072). The paper's 0.68 GB for 5 % matches 5 % of
Switch-base's decoder experts at fp32 (or of all its experts at bf16): its FasterTransformer
build caches decoder layers only, and fetches encoder experts on demand (docs/systems.md).
Throughput is generated tokens per second of makespan (prefill included), miss rate is
1 - hit_rate_decode: decode accesses that were not resident hits (misses and late prefetches).
"""

from __future__ import annotations

from analysis.repro.spec import Experiment, Sweep
from analysis.repro.verdict import ClaimRow

PAPER = "Diff-MoE (SC'25, doi 10.1145/3712285.3759903) batch experiment"
SYSTEMS = ("diff_moe", "on_demand", "moe_infinity")
MODELS = ("switch_base_128", "switch_large_128")
# 5 % of each model's routed experts at fp32 in GiB: 0.05 * MoE layers * 128 * expert bytes /
# 2^30 (expert bytes from the authors' eval_cache.py, paper_numbers.md A3)
CACHE_GIB = {"switch_base_128": round(0.05 * 12 * 128 * 18874368 / 2**30, 6),  # 1.35
             "switch_large_128": round(0.05 * 24 * 128 * 33554432 / 2**30, 6)}  # 4.8
# paper_numbers.md A3 [R]: "Throughput is 2.74x / 2.22x / 1.55x that of DeepSpeed / Pre-gated
# MoE / MoE-Infinity"; the batch it refers to is not in the text we have.
PAPER_SPEEDUP = {"on_demand": 2.74, "moe_infinity": 1.55}
# paper_numbers.md A3 [R], H200, Switch-Base, XSum: MoE-Infinity's miss rate with 5 % of the
# experts cached, batch -> miss rate
PAPER_MISS = {1: 0.0691, 16: 0.6884}


def _cell(runs, model, system, batch, col):
    hit = runs[(runs["model"] == model) & (runs["system"] == system)
               & (runs["max_batch"] == batch) & (runs["status"] == "valid")]
    return None if hit.empty else hit.iloc[0][col]


def _div(a, b):
    return a / b if a is not None and b else None


def table(runs):
    """One row per model and batch: each system's tokens/s, diff_moe's factors over the two
    baselines, moe_infinity's decode miss rate (the paper's beside it)."""
    import pandas as pd

    rows = []
    for model in [m for m in MODELS if (runs["model"] == m).any()]:
        for b in sorted(int(x) for x in runs[runs["model"] == model]["max_batch"].unique()):
            tok = {s: _cell(runs, model, s, b, "tokens_per_s") for s in SYSTEMS}
            hit = _cell(runs, model, "moe_infinity", b, "hit_rate_decode")
            paper_miss = PAPER_MISS.get(b) if model == "switch_base_128" else None
            rows.append({
                "model": model, "batch": b,
                "requests": _cell(runs, model, "diff_moe", b, "requests"),
                **{f"{s}_tok_s": tok[s] for s in SYSTEMS},
                "vs_on_demand_ratio": _div(tok["diff_moe"], tok["on_demand"]),
                "vs_moe_infinity_ratio": _div(tok["diff_moe"], tok["moe_infinity"]),
                "moe_infinity_miss_rate": None if hit is None else 1.0 - hit,
                "paper_miss_rate": paper_miss,
                "on_demand_headroom": _cell(runs, model, "on_demand", b, "headroom")})
    first = runs.iloc[0]
    caches = ", ".join(f"{m} {CACHE_GIB[m]:.2f} GiB" for m in MODELS)
    header = [f"# {PAPER}, SIMULATED", "",
              f"Switch-base-128 and Switch-large-128 (fp32 experts) on {first['hardware']}, "
              f"prompt 256, {first['routing']} routing, static batches; expert cache 5 % of "
              f"the routed experts ({caches}). tok_s: generated tokens per second of "
              "makespan; vs_*_ratio = diff_moe tok_s / the baseline's (the paper: 2.74x over "
              "DeepSpeed = on_demand, 1.55x over MoE-Infinity); miss rate: moe_infinity's "
              "decode accesses that were not resident hits (the paper: Switch-base, 6.91 % at "
              "batch 1, 68.84 % at 16). on_demand_headroom: its TPOT / compute floor."]
    notes = ["The paper's factors are single numbers whose batch the text we have does not "
             "give; the claims take the largest factor over the sweep and name its batch.",
             "The paper's 0.68 GB for 5 % of the experts is 5 % of Switch-base's decoder "
             "experts at fp32 (its build caches decoder layers only), or of all its experts "
             "at bf16; ours caches 5 % of all routed experts at fp32 and manages encoder "
             "layers the same way."]
    return pd.DataFrame(rows), header, notes


def figure(tab, runs):
    """Left: tokens/s against batch (lines, log-log); right: moe_infinity's miss rate."""
    from analysis.repro.output import new_figure

    fig, ax = new_figure(f"{PAPER}", runs.iloc[0]["routing"], width=10.0)
    ax.remove()
    left, right = fig.subplots(1, 2)
    fig.suptitle(f"{PAPER}", fontsize=10)
    style = {"switch_base_128": "-", "switch_large_128": "--"}
    for model, part in tab.groupby("model", sort=False):
        for i, s in enumerate(SYSTEMS):
            pts = part.dropna(subset=[f"{s}_tok_s"])
            left.plot(pts["batch"], pts[f"{s}_tok_s"], style[model], color=f"C{i}",
                      marker="o", ms=3, label=f"{s}, {model}")
        pts = part.dropna(subset=["moe_infinity_miss_rate"])
        right.plot(pts["batch"], pts["moe_infinity_miss_rate"], style[model], color="C2",
                   marker="o", ms=3, label=f"ours (simulated), {model}")
    right.plot(list(PAPER_MISS), list(PAPER_MISS.values()), "k^", label="paper, Switch-base")
    for a in (left, right):
        a.set_xscale("log", base=2)
        a.set_xlabel("batch (requests decoded together)")
        a.legend(fontsize=6)
    left.set_yscale("log")
    left.set_ylabel("generated tokens/s")
    right.set_ylabel("moe_infinity decode miss rate")
    right.set_ylim(0, 1.05)
    return fig


def _best(tab, runs, model, base):
    """(largest diff_moe / base factor over the sweep, its batch, base's headroom there)."""
    part = tab[(tab["model"] == model)].dropna(subset=[f"vs_{base}_ratio"])
    if part.empty:
        return None, None, None
    row = part.loc[part[f"vs_{base}_ratio"].astype(float).idxmax()]
    batch = int(row["batch"])
    return float(row[f"vs_{base}_ratio"]), batch, _cell(runs, model, base, batch, "headroom")


def claims(tab, runs, real):
    """diff_moe's throughput factors over on_demand and moe_infinity (the sweep's largest, per
    model), and the growth of moe_infinity's miss rate from batch 1 to 16 (Switch-base)."""
    out = []
    for model in [m for m in MODELS if (tab["model"] == m).any()]:
        for base, name in (("on_demand", "DeepSpeed (on_demand)"),
                           ("moe_infinity", "MoE-Infinity")):
            ours, batch, head = _best(tab, runs, model, base)
            out.append(ClaimRow(
                f"diffmoe_batch.throughput_vs_{base}.{model}", "diffmoe_batch", PAPER,
                f"Diff-MoE throughput over {name}, {model}", "ratio",
                paper=PAPER_SPEEDUP[base], ours=ours, baseline=base, headroom=head,
                note=None if batch is None else
                f"ours: the sweep's largest factor, at batch {batch}; the paper's batch is "
                "not stated"))
    base = tab[tab["model"] == "switch_base_128"].set_index("batch")["moe_infinity_miss_rate"]
    m1, m16 = base.get(1), base.get(16)
    ok = m1 is not None and m16 is not None and m1 == m1 and m16 == m16 and m1 > 0
    out.append(ClaimRow(
        "diffmoe_batch.miss_growth", "diffmoe_batch", PAPER,
        "MoE-Infinity miss rate grows from batch 1 to 16 (5 % cached, Switch-base)", "ratio",
        paper=PAPER_MISS[16] / PAPER_MISS[1], ours=m16 / m1 if ok else None,
        baseline="moe_infinity at batch 1",
        note=(f"ours {m1:.3f} at batch 1 and {m16:.3f} at 16: our batch-1 miss rate caps the "
              f"growth at {1 / m1:.2f}x (synthetic Switch routing reuses few experts within a "
              "request; the paper's 6.91 % needs far more)") if ok else None))
    return out


def _sweeps():
    """Per model (its cache differs): batch 1-16 on 16 requests, and 32-128 on one batch of
    max_batch requests each (the interpolation keeps the largest runs to a single batch)."""
    out = []
    for model in MODELS:
        common = (f"model={model}", f"expert_cache_gb={CACHE_GIB[model]!r}",
                  f"system={','.join(SYSTEMS)}")
        out.append(Sweep((*common, "max_batch=1,2,4,8,16")))
        out.append(Sweep((*common, "max_batch=32,64,128", "workload.num_requests=${max_batch}")))
    return tuple(out)


EXPERIMENT = Experiment(
    name="diffmoe_batch", title=PAPER, mirrors=f"{PAPER} (paper_numbers.md A3)",
    sweeps=_sweeps(), table=table, figure=figure, claims=claims,
    cannot_express=(
        "beam search (the authors' beam 4): a batch here is B requests decoded in lock-step",
        "FasterTransformer's own kernels and overheads, and its encoder handling (it fetches "
        "encoder experts on demand and caches decoder layers only)",
        "the XSum prompts and their real Switch routing (no Switch routing sample exists; "
        "synthetic routing, not fitted to Switch)",
        "Pre-gated MoE (the paper's 2.22x): no system of the project runs it"),
    notes=("Scaled down: 16 output tokens per request; 16 requests per run up to batch 16, "
           "one batch of max_batch requests from 32 to 128.",))
