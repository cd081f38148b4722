"""Summary metrics from the recorded tables (definitions: docs/metrics.md)."""

from __future__ import annotations

import numpy as np

from harness.recorder import DEMAND, HIT, LATE, MISS, PREFETCH, PRELOAD


def _stats(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": float(np.mean(values)), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99))}


def request_latencies(tokens: dict, arrival_ms: np.ndarray) -> dict[str, np.ndarray]:
    """Per request TTFT, E2E and TPOT (ms) from the per-token table."""
    req, idx, t = tokens["request"], tokens["token_index"], tokens["time_ms"]
    n = len(arrival_ms)
    count = np.bincount(req, minlength=n)
    first = np.full(n, np.nan)
    first[req[idx == 0]] = t[idx == 0]
    admitted = np.full(n, np.nan)  # start of the request's prefill iteration
    admitted[req[idx == 0]] = tokens["iteration_start_ms"][idx == 0]
    last = np.full(n, -np.inf)
    np.maximum.at(last, req, t)
    last[count == 0] = np.nan
    ttft = first - arrival_ms
    e2e = last - arrival_ms
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(count > 1, (e2e - ttft) / (count - 1), np.nan)
    return {"ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": tpot, "queue_ms": admitted - arrival_ms,
            "tokens": count}


def slo_goodput(lat: dict[str, np.ndarray], makespan_ms: float, slo_ttft_ms: float,
                slo_tpot_ms: float) -> dict:
    """Requests meeting both latency SLOs, and their rate over the makespan.

    A request meets the SLOs when it completed (produced a token), its TTFT <= slo_ttft_ms and
    its TPOT <= slo_tpot_ms; a one-token request has no TPOT and meets that SLO vacuously.
    goodput_rps = those requests / (makespan_ms / 1e3), the same denominator as tokens_per_s.
    """
    done = lat["tokens"] > 0
    ttft_ok = done & (lat["ttft_ms"] <= slo_ttft_ms)
    tpot = lat["tpot_ms"]
    tpot_ok = done & (np.isnan(tpot) | (tpot <= slo_tpot_ms))
    met = int(np.sum(ttft_ok & tpot_ok))
    n_done = int(np.sum(done))
    per_s = makespan_ms / 1e3
    return {
        "slo_ttft_ms": float(slo_ttft_ms), "slo_tpot_ms": float(slo_tpot_ms),
        "requests_completed": n_done, "requests_meeting_slo": met,
        "requests_meeting_ttft_slo": int(np.sum(ttft_ok)),
        "requests_meeting_tpot_slo": int(np.sum(tpot_ok)),
        "slo_attainment": met / n_done if n_done else None,
        "goodput_rps": met / per_s if per_s > 0 else None,
        "requests_per_s": n_done / per_s if per_s > 0 else None,
    }


def summarize(tables: dict, arrival_ms: np.ndarray, expert_bytes: int,
              slo_ttft_ms: float = 2000.0, slo_tpot_ms: float = 200.0) -> dict:
    acc, tr, tok = tables["accesses"], tables["transfers"], tables["tokens"]
    cls = acc["class"]
    n_acc = len(cls)
    hits, late, misses = (int(np.sum(cls == c)) for c in (HIT, LATE, MISS))
    kind = tr["kind"]
    loaded = kind != PRELOAD
    pref = kind == PREFETCH
    h2d_bytes = int(np.sum(tr["bytes"][loaded]))
    n_tokens = len(tok["request"])
    # Recall: accesses not resident when their iteration began, and of those the ones a
    # prefetch served (docs/metrics.md).
    not_resident = acc["ready_ms"] > acc["iteration_start_ms"]
    by_prefetch = not_resident & (acc["issued_by"] == PREFETCH)
    lat = request_latencies(tok, arrival_ms)
    tpot = lat["tpot_ms"][~np.isnan(lat["tpot_ms"])]
    makespan_ms = float(np.max(tok["time_ms"]) - np.min(arrival_ms)) if n_tokens else 0.0
    stall = float(np.sum(acc["stall_ms"]))
    decode_stall = float(np.sum(acc["stall_ms"][~acc["prefill"]]))
    n_decode_tokens = int(np.sum(~tok["prefill"]))
    return {
        "accesses": n_acc, "hits": hits, "late_prefetches": late, "misses": misses,
        "hit_rate": hits / n_acc if n_acc else None,
        "prefetches_issued": int(np.sum(pref)),
        "prefetches_used": int(np.sum(pref & (tr["first_use_access"] >= 0))),
        "prefetch_precision": (float(np.sum(pref & (tr["first_use_access"] >= 0)) / np.sum(pref))
                               if np.sum(pref) else None),
        "prefetch_recall": (float(np.sum(by_prefetch) / np.sum(not_resident))
                            if np.sum(not_resident) else None),
        "demand_fetches": int(np.sum(kind == DEMAND)),
        "h2d_bytes": h2d_bytes,
        "h2d_bytes_per_token": h2d_bytes / n_tokens if n_tokens else None,
        "h2d_gb_per_token": h2d_bytes / n_tokens / 1e9 if n_tokens else None,
        "preload_bytes": int(np.sum(tr["bytes"][~loaded])),
        "gpu_stall_ms": stall,
        "gpu_stall_ms_per_token": stall / n_tokens if n_tokens else None,
        "decode_stall_ms_per_token": (decode_stall / n_decode_tokens
                                      if n_decode_tokens else None),
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / (makespan_ms / 1e3) if makespan_ms > 0 else None,
        "makespan_ms": makespan_ms,
        "queue_ms": _stats(lat["queue_ms"]),
        "ttft_ms": _stats(lat["ttft_ms"]),
        "tpot_ms": _stats(tpot),
        "e2e_ms": _stats(lat["e2e_ms"]),
        "expert_bytes": int(expert_bytes),
        **slo_goodput(lat, makespan_ms, slo_ttft_ms, slo_tpot_ms),
    }
