"""fmoe_online: fMoE's online serving run (arXiv 2502.05370 v1 Fig. 10, paper_numbers.md
A2-v1 and the brief; v2 = EuroSys'26, A2): Mixtral-8x7B on one RTX 3090, requests replayed
from the Azure LLM inference trace at 2.91 req/s with continuous batching; end-to-end
latency CDF per system; conf/experiment/fmoe_online.yaml (its comments give the choices the
paper leaves open).

Systems as in fmoe_overall: layer_offload (DeepSpeed-Inference), lru (Mixtral-Offloading),
ProMoE = composed(lfu_perfect, promoe), moe_infinity and fmoe (d = 3, the paper's for Mixtral), and
beside them, never judged, their variants moe_infinity_hysteresis and fmoe_admission.
Arrivals: the 2023 conversation trace from the shared data (azure_llm_traces, docs/serving.md)
when present; otherwise, offline, a documented stand-in: Gamma gaps at 2.91 req/s with the
coefficient of variation of the trace window used (first 256 rows of
AzureLLMInferenceTrace_conv.csv, sha256 2f1e5b666d4e3055: gap CV 1.454, measured once with
workloads.arrivals.read_azure_csv). The table and the figure name the source used.

Claims: v1 (the brief, Fig. 10) says fMoE's end-to-end request latency is clearly lower
than every baseline's in online serving, for three models; the EuroSys text gives only the
setting. Rule, fixed before running: pairs, fMoE's mean end-to-end latency minus each
baseline's, paired by seed, every difference claimed negative. Ours is Mixtral alone.
"""

from __future__ import annotations

from analysis.repro.experiments._fmoe_claims import (
    V1,
    collapse,
    differences,
    labelled,
    missing_note,
)
from analysis.repro.experiments._fmoe_sweeps import RANK, VARIANTS
from analysis.repro.experiments.fmoe_overall import ORDER, PAPER_NAMES, PROMOE_EVICTOR, system_label
from analysis.repro.output import new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.repro.verdict import ClaimRow
from core.shared_data import shared_file

PAPER = "fMoE (arXiv 2502.05370 v2) online serving (Azure trace)"
AZURE = ("azure_llm_traces", "AzureLLMInferenceTrace_conv.csv")
STANDIN_CV = 1.454  # gap CV of rows 0-255 of the conv trace (sha256 2f1e5b666d4e3055)
# The suite's scale (the config keeps the paper's 256 requests): the first 64 arrivals of the
# window at 2.91 req/s, and 64 calibration requests for the history-based systems' warm-up
SCALE = ("workload.num_requests=64", "calibration_requests=64")


def arrival_overrides() -> tuple[str, ...]:
    path = shared_file(*AZURE)
    if path is not None:
        return (f"workload.arrivals.path='{str(path.resolve())}'",)
    return ("arrivals=gamma", "workload.arrivals.kind=null", f"workload.arrivals.cv={STANDIN_CV}")


def sweeps() -> tuple[Sweep, ...]:
    arr = (*SCALE, *arrival_overrides())
    return (Sweep(("system=layer_offload,lru,moe_infinity,fmoe," + ",".join(VARIANTS), *arr)),
            Sweep(("system=composed", f"system/evictor={PROMOE_EVICTOR}",
                   "system/prefetcher=promoe", *arr)))


def arrivals_source(result: dict) -> str:
    a = (result.get("trace") or {}).get("arrivals") or {}
    if a.get("process") == "azure":
        return (f"Azure trace {a.get('source')} rows {a.get('rows')} (sha256 "
                f"{str(a.get('sha256'))[:16]}), rescaled to {a.get('rate_rps'):.2f} req/s")
    return (f"STAND-IN: {a.get('process')} gaps, cv {a.get('cv')}, {a.get('rate_rps')} req/s "
            "(the Azure trace was absent)")


def table(runs):
    """One row per system: end-to-end latency (mean, p50, p90, p99), TTFT and TPOT, hit rate;
    the frame's columns are means over seeds, the percentiles the first seed's."""
    import pandas as pd

    rows = []
    for r in collapse(runs).to_dict("records"):
        res, m = r["_result"], (r["_result"].get("metrics") or {})
        e2e, ttft = m.get("e2e_ms") or {}, m.get("ttft_ms") or {}
        name = system_label(res)
        rows.append({"system": name, "paper_system": PAPER_NAMES.get(name, ""),
                     "status": r["status"], "seeds": r["seeds"], "e2e_mean_ms": r["e2e_mean_ms"],
                     "e2e_p50_ms": e2e.get("p50"), "e2e_p90_ms": e2e.get("p90"),
                     "e2e_p99_ms": e2e.get("p99"), "ttft_p50_ms": ttft.get("p50"),
                     "ttft_p99_ms": ttft.get("p99"), "tpot_mean_ms": r["tpot_mean_ms"],
                     "tpot_p99_ms": r["tpot_p99_ms"], "hit_rate": r["hit_rate"],
                     "makespan_s": None if r["makespan_ms"] is None else r["makespan_ms"] / 1e3,
                     "goodput_rps": r["goodput_rps"]})
    tab = pd.DataFrame(sorted(rows, key=lambda x: RANK.get(x["system"], 9)))
    first = runs.iloc[0]
    cfg = first["_result"]["config"]
    header = [f"# {PAPER}, SIMULATED", "",
              f"Mixtral-8x7B on {first['hardware']}, {first['requests']} requests, max batch "
              f"{cfg['max_batch']} (continuous batching), {first['routing']} routing; arrivals: "
              f"{arrivals_source(first['_result'])}. Latencies per request from arrival "
              "(queueing included); goodput at the SLOs TTFT "
              f"{cfg['slo_ttft_ms']:g} ms and TPOT {cfg['slo_tpot_ms']:g} ms."]
    notes = ["The offered load (2.91 req/s of ~125-token answers) is far above what one "
             "simulated RTX 3090 serves with Mixtral's experts offloaded (about 13 ms per "
             "expert copy), so queues grow through the run and end-to-end latency is mostly "
             "queueing: it ranks the systems by throughput.",
             "Means (e2e_mean_ms, TPOT, hit rate) over the seeds run; the percentiles are the "
             "first seed's. v1's claim (fMoE lowest) is judged in results/claims.md."]
    return tab, header, notes


def figure(tab, runs):
    """End-to-end latency CDF per system (analysis/cdf.py reads each run's tokens.parquet)."""
    import numpy as np

    from analysis.cdf import request_latency
    from harness.runner.store import run_dir_of

    fig, ax = new_figure(f"{PAPER}: end-to-end latency per request", runs.iloc[0]["routing"])
    results = sorted((r["_result"] for r in runs.to_dict("records") if r["status"] == "valid"),
                     key=lambda res: RANK.get(system_label(res), 9))
    for res in results:
        name = system_label(res)
        values = np.sort(request_latency(res, run_dir_of(res["config"]), "e2e")) / 1e3
        ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                label=f"{name} ({PAPER_NAMES.get(name, '')})")
    ax.set_xlabel("end-to-end latency per request (s, arrival to last token)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.text(0.01, 0.98, arrivals_source(results[0]) if results else "", transform=ax.transAxes,
            fontsize=6, va="top", color="0.35")
    return fig


def claims(tab, runs, real):
    """v1: fMoE's end-to-end latency below every baseline's (module docstring's rule)."""
    frame = labelled(runs, system_label)
    pairs = [({"label": "fmoe"}, {"label": b}) for b in ORDER if b != "fmoe"]
    diffs, missing = differences(frame, pairs, "e2e_mean_ms")
    return [ClaimRow(
        "fmoe_online.v1.e2e_lowest", "fmoe_online", f"{V1}, Fig. 10",
        "in online serving (Azure trace), fMoE's end-to-end request latency is below every "
        "baseline's", "pairs", paper="fMoE lowest", ours="fMoE minus each baseline",
        diffs=diffs, averaged="mean end-to-end latency (ms), paired by seed",
        note="; ".join(filter(None, ["Mixtral-8x7B only (the paper: three models)",
                                     missing_note(missing)])))]


EXPERIMENT = Experiment(
    name="fmoe_online", title=PAPER, mirrors=f"{PAPER}: end-to-end latency CDF",
    sweeps=sweeps(), table=table, figure=figure, claims=claims,
    cannot_express=("the serving frameworks' own scheduling and per-request overheads",),
    notes=("Scaled down from the paper for the suite's time budget: 64 of its 256 requests "
           "(the trace's first 64 arrivals, still at 2.91 req/s) and 64 calibration requests "
           "(conf/experiment/fmoe_online.yaml keeps 256; SCALE in fmoe_online.py).",))
