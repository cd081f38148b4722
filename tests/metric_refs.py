"""Reference computations of the policy-quality metrics (docs/metrics.md, "Policy quality"),
written apart from harness/sim/metrics.py: plain loops over parquet columns or the trace."""

from __future__ import annotations

import bisect
import math

from harness.sim.recorder import KIND_NAMES

PREFETCH = KIND_NAMES.index("prefetch")


def iterations(tok) -> dict[int, tuple[float, list[tuple[int, int]]]]:
    """{iteration: (start ms, [(request, step), ...])} from the tokens table."""
    out: dict[int, tuple[float, list]] = {}
    for it, r, s, t in zip(tok["iteration"].tolist(), tok["request"].tolist(),
                           tok["token_index"].tolist(), tok["iteration_start_ms"].tolist()):
        out.setdefault(it, (t, []))[1].append((r, s))
    return out


def iteration_of(its: dict, t_ms: float) -> int:
    """The last iteration that started at or before t_ms; -1 before the first."""
    order = sorted(its)
    return ([-1] + order)[bisect.bisect_right([its[i][0] for i in order], t_ms)]


def churn_reference(tr, tok) -> tuple[int, int]:
    """(churned prefetches, prefetches): a prefetch of key k issued in iteration i is churn
    when an earlier copy of k was evicted in [start of i, start of i + 1) or in the same
    window of a member request's previous iteration (the one that made its previous token)."""
    its = iterations(tok)
    step_iteration = {m: it for it, (_, ms) in its.items() for m in ms}

    def window(i):
        return its[i][0], its[i + 1][0] if i + 1 in its else math.inf

    evicted: dict[int, list[float]] = {}  # key -> eviction times of the copies seen so far
    churned = total = 0
    for row in sorted(range(len(tr["transfer_id"])), key=lambda j: int(tr["transfer_id"][j])):
        key = int(tr["key"][row])
        if int(tr["kind"][row]) == PREFETCH:
            total += 1
            i = iteration_of(its, float(tr["issue_ms"][row]))
            if i >= 0:
                wins = [window(i)] + [window(step_iteration[(r, s - 1)])
                                      for r, s in its[i][1] if s > 0]
                churned += any(lo <= t < hi for t in evicted.get(key, []) for lo, hi in wins)
        t = float(tr["evict_ms"][row])
        if not math.isnan(t):
            evicted.setdefault(key, []).append(t)
    return churned, total


def spec_recall_reference(trace) -> float | None:
    """Over tokens at layer l with a guess for l + 1 (ids != E) whose layer l + 1 is in the
    same stack: true experts at l + 1 found in the guess / true experts."""
    L, E = trace.num_layers, trace.num_experts
    stacks, off = trace.meta["moe_layer_stacks"], trace.block_offsets.tolist()
    found = total = 0
    for g in range(int(trace.step_offsets[-1])):
        for layer in range(L - 1):
            if stacks[layer] != stacks[layer + 1]:
                continue
            b = g * L + layer
            for j in range(off[b + 1] - off[b]):
                guess = {int(e) for e in trace.spec_topk[off[b] + j]} - {E}
                if guess:
                    true = {int(e) for e in trace.topk[off[b + 1] + j]}
                    found, total = found + len(guess & true), total + len(true)
    return found / total if total else None
