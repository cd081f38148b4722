"""mixtral_offloading_ablation: Mixtral-Offloading (arXiv 2312.17238) Table 2, tokens/s of
Mixtral-8x7B at batch 1 with 2- and 3-bit experts and 4-bit attention on four GPUs, for the
full method and its ablations; conf/experiment/mixtral_offloading_ablation.yaml.

Configs are composed systems (docs/systems.md, the policy zoo): full = lru_per_layer +
spec_next_layer (system=lru by construction), no preload = lru_per_layer + none, no LRU & no
preload = evict_after_use + none. The sweep's fourth pair, evict_after_use + spec_next_layer,
is not in the paper and is shown for reference. The cache holds k experts per layer (k = 2
on the RTX 3060, 4 elsewhere, as the paper) for every config. Every expert call pays its
dequantisation at the GPU profile's rate for its width (hardware.dequant_gparams_per_s,
docs/quantization.md), the cost HQQ's 2- and 3-bit experts add to the paper's layers.
"naive (accelerate)" is not run: see cannot_express.

Claims pair the configs by seed (analysis/repro/stats.py): full's tokens/s over each
ablation's per device and width, and the ordering full > no preload > no LRU with its
adjacent paired differences.
"""

from __future__ import annotations

from analysis.repro import values
from analysis.repro.spec import Experiment, Sweep
from analysis.repro.values import seed_mean
from analysis.repro.verdict import ClaimRow

PAPER = "Mixtral-Offloading (arXiv 2312.17238) Table 2"
EXP = "mixtral_offloading_ablation"
DEVICES = ("a100_80g_sxm", "rtx_3080_mobile", "rtx_3060", "t4")
BITS = (2, 3)
SLOTS_PER_LAYER = {"rtx_3060": 2}  # the paper's k; 4 on the other GPUs
EXPERT_BYTES = {2: 44040192, 3: 66060288}  # 3 * 4096 * 14336 params * bits / 8
FULL, NO_PRELOAD, NO_LRU, NAIVE = "full", "no preload", "no LRU & no preload", "naive"
EXTRA = "no LRU, preload (not in the paper)"
# (evictor module, prefetcher module) of the composed system -> config
CONFIGS = {("lru_per_layer", "spec_next_layer"): FULL, ("lru_per_layer", "none"): NO_PRELOAD,
           ("evict_after_use", "none"): NO_LRU, ("evict_after_use", "spec_next_layer"): EXTRA}
ORDER = (FULL, NO_PRELOAD, NO_LRU, EXTRA, NAIVE)
LATE_GUESSES = ("a guess lands in time when a layer's compute outlasts an expert copy: at "
                "batch 1 a MoE layer computes in 1.1 ms on the A100 and 3.9-5.6 ms on the "
                "other GPUs, mostly dequantisation, against 1.8-6.8 ms per copy; a late or "
                "wrong guess still evicts a cached expert")
# paper_numbers.md A4 [R], Table 2, tokens/s: (bits, config) -> per device in DEVICES order.
# The 3-bit naive 3060 entry, 1.791, is as printed (paper_numbers.md marks it "sic").
PAPER_TOK_S = {
    (2, FULL): (3.061, 2.655, 2.278, 2.092), (2, NO_PRELOAD): (2.918, 2.227, 2.051, 1.567),
    (2, NO_LRU): (2.265, 1.758, 1.547, 1.168), (2, NAIVE): (1.392, 1.059, 0.919, 0.661),
    (3, FULL): (2.845, 2.475, 2.038, 1.603), (3, NO_PRELOAD): (2.683, 2.024, 1.857, 1.365),
    (3, NO_LRU): (2.055, 1.595, 1.346, 1.061), (3, NAIVE): (1.246, 0.914, 1.791, 0.580)}


def cache_gib(device: str, bits: int) -> float:
    """k experts per MoE layer (32) at `bits`, in GiB (exact: 5.25, 2.625, 7.875, 3.9375)."""
    return SLOTS_PER_LAYER.get(device, 4) * 32 * EXPERT_BYTES[bits] / 2**30


def paper_tok_s(device, bits, config):
    vals = PAPER_TOK_S.get((bits, config))
    return None if vals is None else vals[DEVICES.index(device)]


def _setting(row, key):
    """A config value: the frame's column when it varies, else the run's recorded config."""
    if key in row and row[key] is not None and row[key] == row[key]:
        return row[key]
    node = row["_result"]["config"]
    for part in key.split("."):
        node = node[part]
    return node


def _config(row):
    ev = str(_setting(row, "system.evictor._target_")).split(".")[-2]
    pf = str(_setting(row, "system.prefetcher._target_")).split(".")[-2]
    return CONFIGS.get((ev, pf), f"{ev} + {pf}")


def _frame(runs):
    """The runs with two columns the claims select on: `config` (CONFIGS) and `bits`."""
    recs = runs.to_dict("records")
    return runs.assign(config=[_config(r) for r in recs],
                       bits=[int(_setting(r, "model.expert_bits")) for r in recs])


def _full_over(frame, dev, bits, cfg):
    """full's tokens/s over cfg's, paired by seed (an Estimate), or None."""
    cell = {"hardware": dev, "bits": bits}
    return values.seed_ratio(frame, {**cell, "config": FULL}, {**cell, "config": cfg},
                             column="tokens_per_s")


def table(runs):
    """One row per device, bits and config: ours (mean over seeds) and the paper's tokens/s,
    full / config (geometric mean of the per-seed factors)."""
    import pandas as pd

    frame = _frame(runs)
    rows = []
    for dev in DEVICES:
        for bits in BITS:
            for cfg in ORDER:
                cell = {"hardware": dev, "bits": bits, "config": cfg}
                tok, paper = seed_mean(frame, "tokens_per_s", **cell), paper_tok_s(dev, bits, cfg)
                if tok is None and paper is None:
                    continue
                factor = _full_over(frame, dev, bits, cfg) if tok is not None else None
                pfull = paper_tok_s(dev, bits, FULL)
                rows.append({
                    "device": dev, "bits": bits, "config": cfg, "k": SLOTS_PER_LAYER.get(dev, 4),
                    "seeds": len(values.by_seed(frame, "tokens_per_s", **cell)),
                    "tok_s": tok, "paper_tok_s": paper,
                    "full_over_config_ratio": None if factor is None else factor.mean,
                    "paper_full_over_config_ratio": pfull / paper if paper else None,
                    **{c: seed_mean(frame, c, **cell)
                       for c in ("hit_rate_decode", "headroom", "h2d_gb_per_token")}})
    first = runs.iloc[0]
    header = [f"# {PAPER}, SIMULATED", "",
              f"Mixtral-8x7B, batch 1, {first['requests']} requests per cell, "
              f"{first['routing']} routing; experts at 2 or 3 bits, dense weights at 4 bits; "
              "cache of k experts per layer (k = 2 on the RTX 3060, 4 elsewhere) for every "
              "config. tok_s: generated tokens per second of makespan, mean over seeds; "
              "full_over_config_ratio = full tok_s / the config's, geometric mean of the "
              "per-seed factors (the paper's beside it); headroom: the config's TPOT / "
              "compute floor (dequantisation included). Absolute tokens/s are not comparable "
              "(the paper's include its framework's overheads): compare factors."]
    notes = ["naive (Accelerate) rows carry the paper's numbers only (not expressible).",
             "The paper's model sizes (17.54 / 21.37 GB with 4-bit attention) imply about 3.1 "
             "and 3.9 bits per expert parameter with HQQ's scales and zero-points; we copy the "
             "nominal 2 and 3 bits, so every config's copies are smaller by the same factor.",
             "Prefetch (full against no preload) pays where a layer's compute outlasts an "
             "expert copy, dequantisation included: on the RTX 3080 Mobile (a batch-1 MoE "
             "layer 3.9-4.1 ms, a copy 1.8-2.8 ms) and the T4 at 2 bits (5.3 against 4.6 ms). "
             "It does not on the A100 (1.1 against 1.8-2.7 ms), the T4 at 3 bits (5.6 against "
             "6.8 ms) or the RTX 3060 (4.7-5.0 against 3.7-5.5 ms, where k = 2 slots per layer "
             "leave a wrong guess half the layer's cache to evict): a late or wrong guess still "
             "evicts a cached expert.",
             "The dequantisation rates are [C] on the A100 and [G] on the other three GPUs "
             "(their memory bandwidth is [G]), for one unfused pass (docs/quantization.md); "
             "the paper's code fuses dequantisation into its Triton matmuls, whose speed is "
             "not modelled. The verdicts of full against no preload move with these rates.",
             "The shared real Mixtral sample has no next-layer guesses, so the full config "
             "cannot run on it; no real-routing sweep."]
    return pd.DataFrame(rows), header, notes


def figure(tab, runs):
    """Grouped bars per device and bits: tokens/s relative to 'no LRU & no preload', ours
    (simulated) and the paper's (measured)."""
    from analysis.repro.output import grouped_bars, new_figure

    groups, series = [], {}
    for (dev, bits), part in tab.groupby(["device", "bits"], sort=False):
        ref = part.set_index("config")
        groups.append(f"{dev}\n{bits}-bit")
        for cfg in (FULL, NO_PRELOAD, NAIVE):
            for who, col, base in (("ours", "tok_s", "tok_s"),
                                   ("paper", "paper_tok_s", "paper_tok_s")):
                name = f"{cfg} ({who})"
                val = base_val = None
                if cfg in ref.index and NO_LRU in ref.index:
                    val, base_val = ref.loc[cfg, col], ref.loc[NO_LRU, base]
                ok = val is not None and base_val and val == val and base_val == base_val
                if who == "ours" and cfg == NAIVE:
                    continue  # not expressible: no bar of ours
                series.setdefault(name, []).append(val / base_val if ok else None)
    fig, ax = new_figure(f"{PAPER}: tokens/s relative to 'no LRU & no preload'",
                         runs.iloc[0]["routing"], width=10.0)
    grouped_bars(ax, groups, series, "tokens/s / no LRU & no preload's", log=True)
    # one colour per config; the paper's bars hatched beside ours
    colour = {FULL: "C0", NO_PRELOAD: "C1", NAIVE: "C4"}
    for bars in ax.containers:
        cfg, who = bars.get_label().rsplit(" (", 1)
        for bar in bars:
            bar.set_facecolor(colour[cfg])
            bar.set_hatch("//" if who.startswith("paper") else "")
            bar.set_edgecolor("white" if who.startswith("paper") else colour[cfg])
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_ylim(0.5, 4.0)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    return fig


def _ordering(frame, dev, bits):
    """Our order of full, no preload and no LRU (mean tokens/s, best first) and the adjacent
    differences in the paper's order, or (None, None) when a config is missing."""
    trio = (FULL, NO_PRELOAD, NO_LRU)
    cell = {"hardware": dev, "bits": bits}
    toks = {c: seed_mean(frame, "tokens_per_s", config=c, **cell) for c in trio}
    # tokens/s is higher-is-better, so the paper's "i beats i + 1" is tok(i + 1) - tok(i) < 0:
    # the negative difference verdict.py's ordering rule (written for latencies) reads
    diffs = [values.seed_difference(frame, {**cell, "config": nxt}, {**cell, "config": cur},
                                    column="tokens_per_s")
             for cur, nxt in zip(trio, trio[1:])]
    if None in toks.values() or None in diffs:
        return None, None
    return sorted(trio, key=lambda c: -toks[c]), diffs


def _naive(bits):
    paper = [paper_tok_s(dev, bits, NAIVE) for dev in DEVICES]
    sic = (" The 3-bit RTX 3060 entry, 1.791, is as printed (sic): above that column's 'no LRU "
           "& no preload' 1.346 and close to full's 2.038, so likely a misprint; it is shown, "
           "not used." if bits == 3 else "")
    return ClaimRow(
        f"{EXP}.full_vs_naive.{bits}bit", EXP, PAPER,
        f"full faster than naive offloading with Accelerate ({bits}-bit, every device)",
        "not_expressible", paper=paper,
        note="the paper does not say what Accelerate offloads or keeps; if it fetches the "
             "routed experts and keeps none, its rule is 'no LRU & no preload', and the rest "
             "of its gap is Accelerate's own implementation, which the simulator does not "
             "model." + sic)


def claims(tab, runs, real):
    """Per device and bits: full's factor over no preload and over no LRU, and the ordering
    of the three, all paired by seed; a not-expressible row per width for naive."""
    frame = _frame(runs)
    out = []
    for dev in DEVICES:
        for bits in BITS:
            cell = f"{dev}, {bits}-bit"
            for cfg, tag in ((NO_PRELOAD, "no_preload"), (NO_LRU, "no_lru")):
                out.append(ClaimRow(
                    f"{EXP}.full_vs_{tag}.{dev}.{bits}bit", EXP, PAPER,
                    f"full faster than {cfg} ({cell})", "ratio",
                    paper=paper_tok_s(dev, bits, FULL) / paper_tok_s(dev, bits, cfg),
                    ours=_full_over(frame, dev, bits, cfg), baseline=cfg,
                    headroom=values.headroom(frame, hardware=dev, bits=bits, config=cfg),
                    note=LATE_GUESSES if cfg == NO_PRELOAD else None))
            ours, diffs = _ordering(frame, dev, bits)
            out.append(ClaimRow(
                f"{EXP}.ordering.{dev}.{bits}bit", EXP, PAPER,
                f"tokens/s: full > no preload > no LRU ({cell})", "ordering",
                paper=[FULL, NO_PRELOAD, NO_LRU], ours=ours, diffs=diffs,
                note="differences: tokens/s of the next config minus this one's (negative: "
                     "the paper's order); naive left out: not expressible"))
    return out + [_naive(bits) for bits in BITS]


def _sweeps():
    """One sweep per width and cache size (the 3060's k = 2 needs its own budget); each runs
    the four (evictor, prefetcher) pairs."""
    pairs = ("system/evictor=lru_per_layer,evict_after_use",
             "system/prefetcher=spec_next_layer,none")
    out = []
    for bits in BITS:
        for devs in (("a100_80g_sxm", "rtx_3080_mobile", "t4"), ("rtx_3060",)):
            out.append(Sweep((f"hardware={','.join(devs)}", f"model.expert_bits={bits}",
                              f"expert_cache_gb={cache_gib(devs[0], bits)!r}", *pairs)))
    return tuple(out)


EXPERIMENT = Experiment(
    name="mixtral_offloading_ablation", title=PAPER,
    mirrors=f"{PAPER} (paper_numbers.md A4)", sweeps=_sweeps(), table=table, figure=figure,
    claims=claims,
    cannot_express=(
        "naive offloading with Accelerate: the paper does not say which modules it offloads "
        "or how much GPU memory it keeps, and its gap to 'no LRU & no preload' (the same "
        "rule) is Accelerate's implementation (per-tensor hooks, synchronous copies)",
        "the paper's framework overheads (its 0.33-1.7 s per token against our compute "
        "floor of 34-179 ms, dequantisation included) and its fused Triton dequantising "
        "matmuls: the dequantisation is charged as one unfused pass at the GPU profile's "
        "rate (docs/quantization.md)",
        "the paper's b = 4 on-device staging buffers: copies land in the k-per-layer cache",
        "the paper's prompts (not stated): 32-token synthetic prompts"),
    notes=("Scaled down: 6 requests of 32 prompt and 32 output tokens per cell; the paper "
           "measures interactive generation.",))
