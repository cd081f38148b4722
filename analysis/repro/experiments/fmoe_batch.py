"""fmoe_batch: fMoE's batch-size sweep, max_batch 1 to 4 (arXiv 2502.05370 v2 = EuroSys'26;
paper_numbers.md A2), fMoE against DeepSpeed-Inference (layer_offload), Mixtral-Offloading
(lru), ProMoE (composed(lfu, promoe)) and MoE-Infinity on Mixtral-8x7B, one RTX 3090 at its
own expert cache; conf/experiment/fmoe_batch.yaml. All 12 requests arrive at t = 0, so every
batch is full until the queue drains (continuous batching).

Claims: none. The text of the paper we read (paper_numbers.md A2) gives no number or ordering
for this sweep, so nothing is tested (no invented claims).
"""

from __future__ import annotations

from analysis.repro.experiments._fmoe_sweeps import (
    NAMES,
    PROMOE,
    RANK,
    SOURCE,
    config,
    lines,
    num,
    ratio,
    setting,
)
from analysis.repro.experiments.fmoe_overall import system_label
from analysis.repro.output import new_figure
from analysis.repro.spec import Experiment, Sweep

PAPER = f"{SOURCE} batch size"
GRID = (1, 2, 3, 4)
BATCHES = "max_batch=" + ",".join(map(str, GRID))


def table(runs):
    """One row per (batch, system): TPOT, TTFT (queueing included), hit rate, throughput,
    headroom, and the system's TPOT / fMoE's at the same batch."""
    import pandas as pd

    cells = {(int(config(r["_result"], "max_batch")), system_label(r["_result"])): r
             for r in runs.to_dict("records")}
    rows = []
    for (batch, name), r in sorted(cells.items(), key=lambda kv: (kv[0][0],
                                                                  RANK.get(kv[0][1], 9))):
        f = cells.get((batch, "fmoe"), {})
        rows.append({"max_batch": batch, "system": name, "paper_system": NAMES.get(name, ""),
                     "status": r["status"], "tpot_mean_ms": num(r["tpot_mean_ms"]),
                     "ttft_mean_ms": num(r["ttft_mean_ms"]), "hit_rate": num(r["hit_rate"]),
                     "tokens_per_s": num(r["tokens_per_s"]), "headroom": num(r["headroom"]),
                     "fmoe_tpot_speedup": ratio(r["tpot_mean_ms"], f.get("tpot_mean_ms"))})
    tab = pd.DataFrame(rows)
    header = [f"# {PAPER}, SIMULATED", "", setting(runs, (
        "Every request arrives at t = 0 (continuous batching up to max_batch); the RTX 3090's "
        "own expert cache; fMoE d = 3; ProMoE = composed(lfu, promoe). fmoe_tpot_speedup = "
        "the system's TPOT / fMoE's at the same batch (> 1: fMoE faster); tokens_per_s = "
        "generated tokens per second of the whole run; headroom = TPOT / compute floor."))]
    notes = ["A batch step runs the union of its requests' experts per layer: a larger batch "
             "touches more experts per step, so each step waits for more copies over the one "
             "link; TTFT includes the time a request queued for a batch slot."]
    return tab, header, notes


def figure(tab, runs):
    """TPOT (log) and hit rate against max_batch, one line per system."""
    fig, ax = new_figure("", runs.iloc[0]["routing"], width=8.0, height=7.0)
    ax.remove()
    axes = fig.subplots(2, 1, sharex=True)
    fig.suptitle(f"{PAPER} (Mixtral-8x7B, RTX 3090)", fontsize=10)
    ok = tab[tab["status"] == "valid"]
    for a, col, ylabel in ((axes[0], "tpot_mean_ms", "TPOT mean (ms, simulated, log)"),
                           (axes[1], "hit_rate", "expert hit rate")):
        lines(a, ok, "max_batch", col, "system",
              {k: f"{k} ({v})" for k, v in NAMES.items()}, RANK)
        a.set_ylabel(ylabel)
    axes[0].set_yscale("log")
    axes[1].set_xticks(GRID)
    axes[1].set_xlabel("max batch (requests decoded together)")
    axes[1].get_legend().remove()
    return fig


def claims(tab, runs, real):
    return []  # the paper states no number or ordering for this sweep (module docstring)


EXPERIMENT = Experiment(
    name="fmoe_batch", title=PAPER, mirrors=f"{PAPER}: batch 1 to 4",
    sweeps=(Sweep(("system=layer_offload,lru,moe_infinity,fmoe", BATCHES)),
            Sweep((*PROMOE, BATCHES))),
    table=table, figure=figure, claims=claims,
    cannot_express=("the frameworks' own overheads and batching schedulers (as in "
                    "fmoe_overall)",),
    notes=("Scaled down from the paper for the suite's time budget "
           "(conf/experiment/fmoe_batch.yaml): synthetic prompts, 12 requests of 32 output "
           "tokens, all arriving at once.",))
