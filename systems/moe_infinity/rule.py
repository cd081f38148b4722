"""MoE-Infinity's rule in plain numpy, from scratch at every question: the reference that the
incremental paths (requests.py, batch.py, ranks.py, propose.py) and the compiled kernels are
tested against (tests/systems/test_moe_infinity.py, test_moe_infinity_fast.py). Read top to
bottom; no state, no caches.

1. A request's EAM (expert activation matrix) [L, E]: tokens routed to each expert of each
   layer so far.
2. Matching: the `m` stored EAMs of highest cosine with the request's query EAM over the
   layers seen (ties: the lowest slot).
3. The predicted EAM P: the matched EAMs' counts summed, then row-normalised per layer
   (share s = count / n, n the layer's total; all-zero layers stay zero); each share's
   variance is binomial, s (1 - s) / n.
4. The predicted reuse: P blended with the request's own row-normalised EAM on the layers it
   has reached, P + w (own - P) (w: `own_weight`; unreached layers keep P), with variance
   (1 - w)^2 var(P) + w^2 own (1 - own) / n_own.
5. Prefetch by reuse * (1 - d / L) (d: layers ahead, cyclic), highest first, ties by lowest
   key; evict the resident of lowest reuse (ties: lowest key); with `admit_margin` a prefetch
   displaces the victim only if its reuse exceeds the victim's by more than that many standard
   errors, sqrt(var_in + var_victim).
"""

from __future__ import annotations

import numpy as np


def match(stored: np.ndarray, query: np.ndarray, layers: int, m: int) -> list[int]:
    """Step 2: the slots of the m stored EAMs [n, L, E] of highest cosine with `query` [L, E]
    over its first `layers` layers, best first (ties: the lowest slot)."""
    q = query[:layers].ravel()
    dots = stored[:, :layers].reshape(len(stored), -1) @ q
    norms = np.sqrt(np.square(stored[:, :layers].reshape(len(stored), -1)).sum(axis=1))
    cos = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return [j for _, j in sorted((-c, j) for j, c in enumerate(cos.tolist()))][:m]


def predicted(matched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 3: P and var(P), flattened [L*E], of the matched EAMs [m, L, E]."""
    counts = matched.sum(axis=0)  # integer counts: exact in any order
    n = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, n, out=np.zeros_like(counts), where=n > 0)
    var = np.divide(share * (1.0 - share), n, out=np.zeros_like(share), where=n > 0)
    return share.ravel(), var.ravel()


def reuse(p: np.ndarray, pvar: np.ndarray, eam: np.ndarray,
          own_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Step 4: the predicted reuse and its variance [L*E] from P, var(P) [L*E] and the
    request's own EAM [L, E]."""
    L, E = eam.shape
    w = own_weight
    n = eam.sum(axis=1, keepdims=True)
    reached = n[:, 0] > 0
    inv = np.divide(1.0, n, out=np.zeros_like(n), where=n > 0)  # a row times 1 / n
    own = eam * inv
    own_var = (own * (1.0 - own) * inv).ravel()
    own = own.ravel()
    mix = np.repeat(np.where(reached, w, 0.0), E)
    keep2 = np.repeat(np.where(reached, (1.0 - w) * (1.0 - w), 1.0), E)
    mix2 = np.repeat(np.where(reached, w * w, 0.0), E)
    return p + mix * (own - p), keep2 * pvar + mix2 * own_var


def proposal(score: np.ndarray, weight: np.ndarray, allowed: np.ndarray, m: int,
             victim: int = -1, margin: float = 0.0, var: np.ndarray | None = None) -> list[int]:
    """Step 5: up to m keys by score * weight > 0 among `allowed` (highest first, ties by
    lowest key); with a victim (>= 0), only the keys whose score beats the victim's by more
    than margin * sqrt(var + var[victim])."""
    prio = score * weight
    ok = allowed & (prio > 0)
    if victim >= 0:
        ok &= (score - score[victim]) > margin * np.sqrt(var + var[victim])
    return [k for _, k in sorted(zip((-prio[ok]).tolist(), np.flatnonzero(ok).tolist()))][:m]


def lowest(score: np.ndarray, keys) -> int:
    """Step 5's victim: the key of lowest score among `keys` (ties: the lowest key); -1 for
    none."""
    return min(((score[k], k) for k in keys), default=(0, -1))[1]
