"""table1_q4: Table 1's systems with 4-bit experts beside bf16 ones, on Table 1's setting
(DeepSeek-V2-Lite, one RTX A5000, batch 1, prompt 512, decode 32) at 80 requests per run;
conf/experiment/table1_q4.yaml. Not a published table: what quantising the experts changes
in the ordering.

Every Table 1 system runs in three arms, dense weights bf16 in all: bf16 experts with the
cache the GPU leaves (Table 1's rule); 4-bit experts with the same GPU memory, which then
holds every expert; and 4-bit experts in a cache of the bf16 arm's 1243 slots, where a
policy still decides what is resident. A 4-bit expert is a quarter of the bytes (a quarter
of each copy) and pays its dequantisation on every call (hardware.dequant_gparams_per_s,
docs/quantization.md). The table puts the orderings side by side: each system's mean TPOT
over seeds with its 95 % t-interval, its rank in each arm, and Kendall's tau-b of each 4-bit
ordering against the bf16 one. Table 1's own outputs are untouched: its runs and tables are
results/table1/, these results/table1_q4/.
"""

from __future__ import annotations

import math

from analysis.repro import stats, values
from analysis.repro.output import grouped_bars, new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.table1 import ORDER
from harness.runner.config import TABLE1_GLOB

TITLE = "Table 1 with 4-bit experts (DeepSeek-V2-Lite, RTX A5000)"
# The bf16 arm's cache holds 1243 experts (20.04 GiB // 17,301,504 B at Table 1's context);
# the same 1243 at 4 bits (4,325,376 B each): 1243 * 4,325,376 / 2**30 = 41019 / 8192 GiB
SLOTS_16 = 1243
SLOTS_GIB = SLOTS_16 * 4_325_376 / 2**30  # 5.0072021484375, exact
# arm -> (expert bits, expert_cache_gb: None = what the GPU leaves, words)
ARMS = {"16bit": (16, None, "bf16 experts"),
        "4bit": (4, None, "4-bit experts, the same GPU memory"),
        "4bit_1243": (4, SLOTS_GIB, f"4-bit experts, the bf16 arm's {SLOTS_16} slots")}
# relative: TPOTs within 0.1 % of the lowest of their group tie. A cost model built from
# [C] and [G] constants does not resolve smaller differences (at 4 bits most systems are
# within 0.02 ms of the 25.6 ms compute floor), and float summation order is no order.
TIES = 1e-3


def rank(means: dict[str, float], rel: float = TIES) -> dict[str, float]:
    """1 = the lowest value; values within `rel` (relative) of the lowest of their group
    share the mean of the group's ranks."""
    order = sorted(means, key=means.get)
    out, start = {}, 0
    for i in range(1, len(order) + 1):
        first = means[order[start]]
        if i == len(order) or means[order[i]] - first > rel * abs(first):
            for k in order[start:i]:
                out[k] = (start + 1 + i) / 2
            start = i
    return out


def kendall_tau_b(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau-b of two paired sequences (ties corrected); None with fewer than two
    pairs or when one sequence is constant."""
    n0 = len(a) * (len(a) - 1) // 2
    s = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            ties_a += da == 0
            ties_b += db == 0
            s += (da * db > 0) - (da * db < 0)
    den = math.sqrt((n0 - ties_a) * (n0 - ties_b))
    return s / den if den else None


def arm_of(result: dict) -> str | None:
    cfg = result["config"]
    key = (float(cfg["model"]["expert_bits"]), cfg.get("expert_cache_gb"))
    return next((a for a, (b, gib, _) in ARMS.items() if (b, gib) == key), None)


def _frame(runs):
    return runs.assign(arm=[arm_of(r) for r in runs["_result"]])


def _systems(runs) -> list[str]:
    at = {n: i for i, n in enumerate(ORDER)}
    return sorted(set(runs["system"]), key=lambda s: (at.get(s, len(ORDER)), s))


def orderings(frame) -> tuple[dict, dict, dict]:
    """({(system, arm): Estimate of its TPOT}, {arm: {system: rank}}, {4-bit arm: (tau-b
    against the bf16 ordering, the systems valid in both)})."""
    cells = {}
    for s in _systems(frame):
        for a in ARMS:
            got = values.by_seed(frame, "tpot_mean_ms", system=s, arm=a)
            cells[(s, a)] = stats.mean(got) if got else None
    ranks = {a: rank({s: e.mean for (s, w), e in cells.items() if w == a and e is not None})
             for a in ARMS}
    taus = {}
    for a in ("4bit", "4bit_1243"):
        both = [s for s in _systems(frame) if s in ranks["16bit"] and s in ranks[a]]
        taus[a] = (kendall_tau_b([ranks["16bit"][s] for s in both],
                                 [ranks[a][s] for s in both]), both)
    return cells, ranks, taus


def _row(frame, system, cells, ranks) -> dict:
    out = {"system": system, "bound": system == "oracle"}
    for a in ARMS:
        e = cells[(system, a)]
        out.update({f"tpot_{a}_ms": None if e is None else e.mean,
                    f"tpot_{a}_low_ms": None if e is None else e.low,
                    f"tpot_{a}_high_ms": None if e is None else e.high,
                    f"rank_{a}": ranks[a].get(system)})
    for a in ("4bit", "4bit_1243"):
        r16, r4 = ranks["16bit"].get(system), ranks[a].get(system)
        out[f"rank_change_{a}"] = None if r16 is None or r4 is None else r4 - r16
    out["hit_rate_decode_4bit_1243"] = values.seed_mean(frame, "hit_rate_decode",
                                                        system=system, arm="4bit_1243")
    return out


def _arm_line(frame, arm: str) -> str | None:
    """An arm's cache (GiB and experts) and compute floor (every system of a seed replays
    one trace: one floor per seed, averaged over seeds)."""
    rows = frame[(frame["arm"] == arm) & (frame["status"] == "valid")]
    if not len(rows):
        return None
    r = rows.iloc[0]["_result"]
    cache, eb = r["memory"]["expert_cache_bytes"], r["model"]["expert_bytes"]
    floor = rows.groupby("seed")["compute_floor_ms"].first().mean()
    return (f"{arm} ({ARMS[arm][2]}): {cache / 2**30:.2f} GiB hold {cache // eb} of the "
            f"{r['model']['moe_layers'] * r['model']['experts']} experts, compute floor "
            f"{floor:.2f} ms")


def _tau_line(taus) -> str:
    def say(a):
        tau, both = taus[a]
        why = "n/a (every system ties in one of the two)" if tau is None else f"{tau:.3f}"
        return f"{a} against 16bit, over the {len(both)} systems valid in both: {why}"
    return "Kendall tau-b of the orderings: " + "; ".join(say(a) for a in taus) + "."


def table(runs):
    """One row per system: TPOT (mean over seeds, 95 % t-interval) and rank in each arm,
    the rank changes, the decode hit rate with the bf16 arm's slots; Kendall's tau-b of each
    4-bit ordering against the bf16 one in the header."""
    import pandas as pd

    frame = _frame(runs)
    cells, ranks, taus = orderings(frame)
    tab = pd.DataFrame([_row(frame, s, cells, ranks) for s in _systems(frame)])
    arms = [line for a in ARMS if (line := _arm_line(frame, a))]
    header = [f"# {TITLE}, SIMULATED", "",
              f"DeepSeek-V2-Lite on an RTX A5000 (host link 24 GB/s), batch 1, "
              f"{runs.iloc[0]['requests']} requests per run (prompt 512, 32 output tokens), "
              f"{runs.iloc[0]['routing']} routing; dense weights bf16 in every arm. Arms: "
              + "; ".join(arms) + " (a 4-bit floor includes the dequantisation).",
              "tpot_<arm>: mean over seeds of each run's mean TPOT (ms per decoded token), "
              "with the 95 % t-interval over seeds (low, high); rank 1 = the lowest TPOT among "
              f"the systems valid in that arm (TPOTs within {TIES:.1%} of the lowest of "
              "their group tie and share their mean rank); rank_change_<arm> = rank there - "
              "rank at 16 bits; `bound`: the oracle reads the future.", _tau_line(taus)]
    return tab, header, _notes(frame, ranks)


def _notes(frame, ranks) -> list[str]:
    notes = []
    missing = [f"{s} ({a})" for s in _systems(frame) for a in ARMS if s not in ranks[a]]
    if missing:
        notes.append("No valid run (oom: the experts do not all fit) for "
                     + ", ".join(missing) + ".")
    for a, r in ranks.items():
        if len(r) > 1 and len(set(r.values())) == 1:
            why = (" Its cache holds every expert, so after the prefill no decode step waits "
                   "for a copy: the policies differ in the prefill (TTFT), not in TPOT."
                   if _holds_all(frame, a) else "")
            notes.append(f"{a}: every system ties (within {TIES:.1%}).{why}")
    notes.append("Experts at 4 bits are nominal: HQQ-style scales and zero-points are not "
                 "counted in their bytes. Dense weights stay bf16 in every arm.")
    return notes


def _holds_all(frame, arm: str) -> bool:
    """Whether the arm's expert cache holds every expert of the model."""
    rows = frame[frame["arm"] == arm]
    r = rows.iloc[0]["_result"]
    total = r["model"]["moe_layers"] * r["model"]["experts"] * r["model"]["expert_bytes"]
    return r["memory"]["expert_cache_bytes"] >= total


def figure(tab, runs):
    """TPOT per system in each arm (mean over seeds)."""
    fig, ax = new_figure(f"{TITLE}: TPOT", runs.iloc[0]["routing"], width=10.0)
    series = {ARMS[a][2]: [None if v != v else v for v in tab[f"tpot_{a}_ms"]] for a in ARMS}
    grouped_bars(ax, list(tab["system"]), series, "TPOT mean (ms)", log=True)
    ax.tick_params(axis="x", labelrotation=30)
    return fig


def claims(tab, runs, real):
    """None: no paper published this table."""
    return []


EXPERIMENT = Experiment(
    name="table1_q4", title=TITLE,
    mirrors="not a published table: Table 1's systems with 4-bit experts beside bf16",
    sweeps=(Sweep((f"system={TABLE1_GLOB}", "model.expert_bits=16,4")),
            Sweep((f"system={TABLE1_GLOB}", "model.expert_bits=4",
                   f"expert_cache_gb={SLOTS_GIB!r}"))),
    table=table, figure=figure, claims=claims,
    cannot_express=("the accuracy lost at 4 bits: the simulator times the model, it does not "
                    "run it",
                    "fused dequantising matmul kernels (Marlin, HQQ's Triton kernels): the "
                    "dequantisation is charged as one unfused pass (docs/quantization.md)"),
    notes=("Scaled down: 80 requests per run (Table 1: 290); the calibration split is Table "
           "1's 290 requests.",))
