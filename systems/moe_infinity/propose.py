"""moe_infinity's prefetch proposal (systems/moe_infinity/system.py): the non-resident keys of
highest priority reuse * (1 - d/L) that the gate allows, and once the cache is full only
those the admission rule lets displace the next victim.

Keys are layer * E + expert; rankings go highest first, ties by the lowest key. The
compiled kernel (kernels/fast.pyx) runs the same rule in one pass over the keys; the numpy
code here, without it, gives the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from systems.moe_infinity.requests import ARGMAX_TOP


def proposal(score: np.ndarray, w: np.ndarray, apen: np.ndarray, victim: int, margin: float,
             m: int, var: tuple[np.ndarray | None, list[int]], var_of: Callable[[int], float],
             var_at: Callable[[np.ndarray], np.ndarray], fast=None) -> list[int]:
    """Up to m keys by score * w (w: the current layer's weight row [L*E]; apen: 0 where the
    gate allows a key, -inf elsewhere), admitted over `victim` (< 0: no victim, the cache
    has room). A key's variance is the max over `rows` of plane[rows, key] for var = (plane
    [N, L*E], rows), zero for plane None; the numpy path reads it through var_of / var_at
    at the few keys it tests. fast: kernels/fast.pyx, the same rule in one pass."""
    if fast is not None and m <= ARGMAX_TOP:
        return fast.propose(score, w, apen, var[0], var[1], victim, margin, m)
    if victim < 0:
        return top(score, w, apen, m)
    return admitted(score, w, apen, victim, margin, m, var_of, var_at)


def top(score: np.ndarray, w: np.ndarray, apen: np.ndarray, m: int) -> list[int]:
    """The m allowed keys of highest prio = score * w > 0: repeated argmax, which returns
    the lowest of equal keys."""
    prio = score * w
    prio += apen
    out: list[int] = []
    for _ in range(m):
        k = int(prio.argmax())
        if not prio[k] > 0:
            break
        out.append(k)
        prio[k] = -np.inf
    return out


def admitted(score: np.ndarray, w: np.ndarray, apen: np.ndarray, victim: int, margin: float,
             m: int, var_of: Callable[[int], float],
             var_at: Callable[[np.ndarray], np.ndarray], fast=None) -> list[int]:
    """top among the keys admitted over `victim`: score - sv > margin * sqrt(var + var
    victim). Leaving the incoming key's variance out of the margin gives a lower bound T of
    it (sqrt and the products are monotone), and score - sv > T needs score > (sv + T)
    (1 - 1e-12) whatever the rounding: only the few keys above that get their variance."""
    sv, var_victim = score.item(victim), var_of(victim)
    low = margin * math.sqrt(var_victim)
    allowed = score + apen  # -inf where the gate holds
    cand = np.flatnonzero(allowed > (sv + low) * (1.0 - 1e-12))
    if not len(cand):
        return []
    ok = score.take(cand) - sv > margin * np.sqrt(var_at(cand) + var_victim)
    keys = cand[ok].tolist()
    if not keys:
        return []  # the usual case
    ranked = sorted((-p, k) for k, p in zip(keys, (score[keys] * w[keys]).tolist()) if p > 0)
    return [k for _, k in ranked[:m]]
