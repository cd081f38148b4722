"""Summary metrics from the recorded tables (definitions: docs/metrics.md)."""

from __future__ import annotations

import numpy as np

from core.blocks import next_layer_rows
from harness.sim.recorder import DEMAND, HIT, LATE, MISS, PREFETCH, PRELOAD

_QUERIES = 1 << 20  # churn queries per step (bounds its temporaries to ~50 MB)


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


def iteration_starts(tokens: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration (numbered 0.. in order; every iteration has a token): start ms and
    whether it is a prefill, [n_iterations] each."""
    it = tokens["iteration"]
    n = int(it.max()) + 1 if len(it) else 0
    start, prefill = np.zeros(n), np.zeros(n, dtype=bool)
    start[it], prefill[it] = tokens["iteration_start_ms"], tokens["prefill"]
    return start, prefill


def iteration_at(start_ms: np.ndarray, t_ms: np.ndarray) -> np.ndarray:
    """The iteration whose window [start_i, start_i+1) holds each time (the last iteration's
    window is open-ended, so idle time belongs to the iteration before it); -1 before the
    first iteration."""
    return np.searchsorted(start_ms, t_ms, side="right") - 1


def _previous_iteration(tokens: dict) -> np.ndarray:
    """Per token row: the iteration that produced the same request's previous token, -1 for
    token 0."""
    req, idx = tokens["request"], tokens["token_index"]
    order = np.lexsort((idx, req))  # by request, then token index
    prev = np.full(len(req), -1, dtype=np.int64)
    same = (req[order[1:]] == req[order[:-1]]) & (idx[order[1:]] == idx[order[:-1]] + 1)
    prev[order[1:][same]] = tokens["iteration"][order[:-1][same]]
    return prev


def prefetch_churn(transfers: dict, tokens: dict) -> np.ndarray:
    """Which transfers are churned prefetches, bool [n_transfers] (docs/metrics.md); the
    transfer rows are in transfer_id order, as the recorder and transfers.parquet have them.

    A prefetch copy of key k issued in iteration i (`iteration_at` its issue_ms) is churn when
    an earlier copy of k was evicted inside the window of iteration i, or inside the window of
    the previous iteration of one of i's member requests (the iteration of its previous
    token). Copies of one key are sequential (a key is loaded again only after its eviction),
    so in transfer order a key's eviction times never decrease.
    """
    key, kind, evict = transfers["key"], transfers["kind"], transfers["evict_ms"]
    n = len(key)
    churn = np.zeros(n, dtype=bool)
    start, _ = iteration_starts(tokens)
    pref = np.flatnonzero(kind == PREFETCH)
    it = iteration_at(start, transfers["issue_ms"][pref])
    pref, it = pref[it >= 0], it[it >= 0]
    if not len(pref):
        return churn
    end = np.append(start[1:], np.inf)  # [n_it] window ends
    # Copies grouped by key in transfer order; a copy's earlier copies precede it in its group.
    order = np.lexsort((np.arange(n), key))
    k_sorted = key[order]
    group0 = np.searchsorted(k_sorted, k_sorted, side="left")
    earlier = np.empty(n, dtype=np.int64)
    earlier[order] = np.arange(n) - group0  # earlier copies of the same key
    evicted = ~np.isnan(evict[order])  # only a key's last copy can still be resident
    ev_key, ev_ms = k_sorted[evicted], evict[order][evicted]
    # Queries (prefetch row, window): iteration i, then each member's previous iteration.
    tok_it = tokens["iteration"]
    by_it = np.argsort(tok_it, kind="stable")
    bounds = np.searchsorted(tok_it[by_it], np.arange(len(start) + 1))
    members = bounds[it + 1] - bounds[it]  # [n_pref] members of each prefetch's iteration
    q_pref = np.repeat(np.arange(len(pref)), members)  # [n_pref * members] one per member
    # position in by_it of each (prefetch, member): its iteration's first token row + rank
    rank_shift = np.repeat(bounds[it] - np.cumsum(members) + members, members)
    prev_it = _previous_iteration(tokens)[by_it[rank_shift + np.arange(len(q_pref))]]
    q_pref = np.concatenate([np.arange(len(pref)), q_pref[prev_it >= 0]])
    q_win_all = np.concatenate([it, prev_it[prev_it >= 0]])
    # "An eviction of q_key in [start, end) among its first `earlier` copies": exact integer
    # search over (key, rank of time). The ranks are those of the eviction times and every
    # iteration's window bounds: a superset of the queried bounds keeps their order and ties.
    n_ev, n_it = len(ev_ms), len(start)
    times, rank = np.unique(np.concatenate([ev_ms, start, end]), return_inverse=True)
    width = len(times) + 1
    ev_code = ev_key * width + rank[:n_ev]
    lo_rank, hi_rank = rank[n_ev:n_ev + n_it], rank[n_ev + n_it:]  # [n_it] each
    for a in range(0, len(q_pref), _QUERIES):  # in chunks: bounds the [queries] temporaries
        q = pref[q_pref[a:a + _QUERIES]]  # the prefetch row of each query
        q_key, q_win = key[q], q_win_all[a:a + _QUERIES]
        lo = np.searchsorted(ev_code, q_key * width + lo_rank[q_win], side="left")
        hi = np.searchsorted(ev_code, q_key * width + hi_rank[q_win], side="left")
        cap = np.searchsorted(ev_key, q_key, side="left") + earlier[q]
        churn[q[lo < np.minimum(hi, cap)]] = True
    return churn


def spec_recall(trace) -> float | None:
    """Share of next-layer experts guessed (docs/metrics.md, `spec_recall`); None without
    spec_topk. Over every token row at layer l that guesses layer l + 1 (an id != E) and whose
    layer l + 1 is in the same stack: |guess & true top-k at l + 1| / (rows * k)."""
    spec, topk = trace.spec_topk, trace.topk
    if spec is None:
        return None
    E, k = trace.num_experts, trace.top_k
    rows, nxt = next_layer_rows(np.diff(trace.block_offsets), trace.meta["moe_layer_stacks"])
    guessed = (spec[rows] != E).any(axis=1)
    rows, nxt = rows[guessed], nxt[guessed]
    if not len(rows):
        return None
    # [k, n] each, a contiguous row per column: k * k flat compares, ~20x faster than .any()
    guess = np.ascontiguousarray(spec[rows].T)
    true = np.ascontiguousarray(topk[nxt].T)
    found = 0
    for t in true:  # a true expert is found when any guess column names it
        hit = np.zeros(len(rows), dtype=bool)
        for g in guess:
            hit |= g == t
        found += int(np.count_nonzero(hit))
    return found / (len(rows) * k)


def _share(num, den) -> float | None:
    return float(num / den) if den else None


def policy_quality(acc: dict, tr: dict, tok: dict, expert_bytes: int) -> dict:
    """Hit rate by phase and what the prefetches did (docs/metrics.md, "Policy quality")."""
    cls, decode_acc = acc["class"], ~acc["prefill"]
    start, it_prefill = iteration_starts(tok)
    pref = tr["kind"] == PREFETCH
    used = pref & (tr["first_use_access"] >= 0)
    # A prefetch is late when its first use waited for the copy (that access is `late`).
    late = cls[tr["first_use_access"][used]] == LATE  # [prefetches used]
    it = iteration_at(start, tr["issue_ms"][pref])
    n_pref, n_used, n_late = int(np.sum(pref)), int(np.sum(used)), int(np.sum(late))
    n_demand = int(np.sum(tr["kind"] == DEMAND))
    n_decode_tokens, n_tokens = int(np.sum(~tok["prefill"])), len(tok["request"])
    return {
        "hit_rate_decode": _share(np.sum(cls[decode_acc] == HIT), np.sum(decode_acc)),
        "hit_rate_prefill": _share(np.sum(cls[~decode_acc] == HIT), np.sum(~decode_acc)),
        "prefetches_used": n_used, "prefetches_unused": n_pref - n_used,
        "prefetches_late": n_late,
        "prefetch_precision": _share(n_used, n_pref),
        # Would-be misses: first uses of prefetched or demand-fetched copies; turned into
        # hits: the prefetched ones that were ready in time.
        "prefetch_recall": _share(n_used - n_late, n_used + n_demand),
        "prefetch_churn": _share(np.sum(prefetch_churn(tr, tok)), n_pref),
        "prefetches_per_decode_token": _share(
            np.sum((it >= 0) & ~it_prefill[np.maximum(it, 0)]), n_decode_tokens),
        "unused_prefetch_bytes_per_token": _share((n_pref - n_used) * expert_bytes, n_tokens),
    }


def summarize(tables: dict, arrival_ms: np.ndarray, expert_bytes: int,
              slo_ttft_ms: float = 2000.0, slo_tpot_ms: float = 200.0) -> dict:
    acc, tr, tok = tables["accesses"], tables["transfers"], tables["tokens"]
    cls = acc["class"]
    n_acc = len(cls)
    hits, late, misses = (int(np.sum(cls == c)) for c in (HIT, LATE, MISS))
    kind = tr["kind"]
    pref = kind == PREFETCH
    h2d_bytes = int(np.sum(tr["bytes"]))  # every copy, preloads included (all are timed)
    n_tokens = len(tok["request"])
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
        **policy_quality(acc, tr, tok, expert_bytes),
        "demand_fetches": int(np.sum(kind == DEMAND)),
        "h2d_bytes": h2d_bytes,
        "h2d_bytes_per_token": h2d_bytes / n_tokens if n_tokens else None,
        "h2d_gb_per_token": h2d_bytes / n_tokens / 1e9 if n_tokens else None,
        "preload_bytes": int(np.sum(tr["bytes"][kind == PRELOAD])),
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
