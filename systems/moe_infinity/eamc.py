"""MoE-Infinity's expert activation matrix collection (EAMC) and the EAM helpers around it.

An EAM is one request's token counts [L, E] (tokens routed to each expert of each MoE layer,
prefill and decode). The collection stores up to `capacity` of them with prefix norms, so a
partial EAM (the layers seen so far) can be matched by cosine over those layers only. Used by
systems/moe_infinity/system.py; the policy itself lives there.
"""

from __future__ import annotations

import numpy as np


class EAMC:
    """Expert activation matrix collection: up to `capacity` EAMs [L, E] with prefix norms.

    Stored layer-major, `cols` [L*E, width] (one column per EAM; width grows by doubling up to
    the capacity, so a row is no longer than the entries stored need), so that matching one
    layer's k routed experts reads k contiguous short rows. float64 holding integer token
    counts: every dot product of counts is exact (its sums stay far below 2**53), so the BLAS
    kernel's summation order cannot change a match (docs/trace-format.md, "Portable
    determinism"). A row-major
    copy, `rows` [capacity, L*E + L], makes summing a few matched entries (predicted) read
    contiguous rows; its last L columns are each entry's layer totals (`totals`, the row sums
    of its EAM), so one sum of rows gives a prediction's counts and denominators. It doubles
    the collection's memory (13 MB at 1000 entries of 26 x 64)."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        if capacity < 1:
            raise ValueError(f"moe_infinity: eamc_capacity must be >= 1, got {capacity}")
        self.capacity, self.L, self.E = capacity, num_layers, num_experts
        self.cols = np.zeros((num_layers * num_experts, min(capacity, 64)))
        LE = num_layers * num_experts
        self.rows = np.zeros((capacity, LE + num_layers))  # the same, one row per EAM, + totals
        self.totals = self.rows[:, LE:]  # [slot, l]: tokens of layer l (row sums), a view
        # per slot: every layer has tokens (then so has any sum of entries including it)
        self.all_layers = [False] * capacity
        self.prefix = np.zeros((num_layers, capacity))  # [l, slot]: sum of squares, layers 0..l
        # [l, slot]: 1 / sqrt(prefix) (0 for an empty prefix)
        self.inv_norm = np.zeros((num_layers, capacity))
        # [L*E] every stored EAM's counts summed, kept with each insert: the whole collection's
        # prediction (predicted()) without summing n columns at every request start
        self.sum_counts = np.zeros(LE)
        self.n = 0
        self.replaced = 0
        self.version = 0  # bumped on every insert: cached dot products are then stale

    def insert(self, eam: np.ndarray) -> int:
        """Store an EAM [L, E]; when full, overwrite the most similar entry. Returns its slot."""
        eam = np.asarray(eam, dtype=np.float64)
        if self.n < self.capacity:
            slot = self.n
            self.n += 1
        else:
            slot = int(np.argmax(self.cosine(eam.ravel())))
            self.replaced += 1
            self.sum_counts -= self.cols[:, slot]  # integers: exact, as a fresh sum
        if slot >= self.cols.shape[1]:
            wider = np.zeros((len(self.cols), min(self.capacity, 2 * self.cols.shape[1])))
            wider[:, :self.cols.shape[1]] = self.cols
            self.cols = wider
        self.cols[:, slot] = eam.ravel()
        self.sum_counts += self.cols[:, slot]
        self.rows[slot, :eam.size] = eam.ravel()
        self.totals[slot] = eam.sum(axis=1)
        self.all_layers[slot] = bool(self.totals[slot].all())
        self.prefix[:, slot] = np.cumsum(np.square(eam, dtype=np.float64).sum(axis=1))
        p = self.prefix[:, slot]
        self.inv_norm[:, slot] = np.divide(1.0, np.sqrt(p), out=np.zeros_like(p), where=p > 0)
        self.version += 1
        return slot

    def entry(self, slot: int) -> np.ndarray:
        """Stored EAM [L, E] of one slot."""
        return self.cols[:, slot].reshape(self.L, self.E)

    def cosine(self, flat_eam: np.ndarray, upto_layer: int | None = None) -> np.ndarray:
        """Cosine [n] of an EAM (flattened [L*E]) with every entry, over layers 0..upto_layer."""
        lim = self.L - 1 if upto_layer is None else upto_layer
        width = (lim + 1) * self.E
        q = np.asarray(flat_eam[:width], dtype=np.float64)
        dots = q @ self.cols[:width, :self.n]
        norm2 = float(np.dot(q, q))
        denom = np.sqrt(norm2 * self.prefix[lim, :self.n])
        return np.divide(dots, denom, out=np.zeros(len(dots)), where=denom > 0)

    def query(self, flat_eam: np.ndarray, upto_layer: int | None = None) -> tuple[int, float]:
        """Best match (slot, cosine); ties go to the lowest slot."""
        cos = self.cosine(flat_eam, upto_layer)
        best = int(np.argmax(cos))
        return best, float(cos[best])

    def predicted(self, slots: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Predicted EAM of matched entries (None: every stored entry), flattened [L*E]: their
        token counts summed, then row-normalised per layer (all-zero rows stay zero); and the
        variance of each share as a binomial estimate from the row's n counts, s (1 - s) / n.
        Sums of integer counts are exact, so the order of the entries cannot change either."""
        if slots is None:
            counts = self.sum_counts.copy()
        else:
            counts = self.rows[list(slots)].sum(axis=0)[:self.L * self.E]
        counts = counts.reshape(self.L, self.E)
        return share_and_variance(counts)

    def summed_rows(self, slots: np.ndarray) -> np.ndarray:
        """For R sets of m slots ([R, m] ints): their rows summed, [R, L*E + L] (counts, then
        the layer totals that divide them in predicted()). Integer sums: exact in any order."""
        acc = self.rows[slots[:, 0]]
        for j in range(1, slots.shape[1]):
            acc += self.rows[slots[:, j]]
        return acc


def share_and_variance(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts [L, E] -> per-layer shares and their binomial variances s (1 - s) / n (n: the
    row's counts), both flattened [L*E]; all-zero rows give zeros."""
    rows = counts.sum(axis=1, keepdims=True)
    if rows.all():  # the usual case, without the masked divisions (the same values)
        shares = counts / rows
        return shares.ravel(), (shares * (1.0 - shares) / rows).ravel()
    shares = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
    var = np.divide(shares * (1.0 - shares), rows, out=np.zeros_like(shares), where=rows > 0)
    return shares.ravel(), var.ravel()


def shares_into(counts: np.ndarray, totals: np.ndarray, share: np.ndarray, pvar: np.ndarray,
                all_positive: bool) -> None:
    """share_and_variance written into given arrays (the incremental rows' buffers): counts
    [..., L, E] over their layer totals [..., L, 1] into `share`, and s (1 - s) / n into
    `pvar`; `all_positive` false: the rows whose total is 0 stay 0."""
    if all_positive:
        np.divide(counts, totals, out=share)
        np.subtract(1.0, share, out=pvar)
        pvar *= share
        pvar /= totals
    else:
        share[:] = 0.0
        np.divide(counts, totals, out=share, where=totals > 0)
        np.subtract(1.0, share, out=pvar)
        pvar *= share
        np.divide(pvar, totals, out=pvar, where=totals > 0)


def top_ranked(idx: np.ndarray, values: np.ndarray, m: int) -> np.ndarray:
    """The at most m entries of `idx` with the highest `values[idx]`, highest first, ties by
    lowest index (ranked_keys as an array)."""
    return np.array(ranked_keys(values, m, idx), dtype=np.int64)


def ranked_keys(values: np.ndarray, m: int, idx: np.ndarray | None = None) -> list[int]:
    """The at most m entries of `idx` (None: every position of `values`) with the highest
    `values[idx]`, highest first, ties by lowest index. Which of several equal values at the
    cut np.partition keeps depends on numpy's SIMD sort, so every tie with the m-th highest is
    kept and an exact sort on (-value, index) picks: python's for a few, else lexsort."""
    v = values if idx is None else values[idx]
    if len(v) > m:
        kth = np.partition(v, len(v) - m)[len(v) - m]
        keep = np.flatnonzero(v >= kth)
        idx, v = (keep if idx is None else idx[keep]), v[keep]
    elif idx is None:
        idx = np.arange(len(v))
    if len(idx) > 64:
        return idx[np.lexsort((idx, -v))][:m].tolist()
    return [i for _, i in sorted(zip((-v).tolist(), idx.tolist()))][:m]


def request_eams(trace) -> list[np.ndarray]:
    """EAM [L, E] (token counts over prefill and decode, float32) of every request of a
    trace: one bincount of layer * E + expert over each request's rows (trace.topk ids are
    < E), which reads the trace once instead of building every block's dense counts."""
    L, E = trace.num_layers, trace.num_experts
    blocks, steps = trace.block_offsets, trace.step_offsets  # rows per block (step * L + layer)
    layer_base = np.arange(L) * E
    out = []
    for r in range(len(steps) - 1):
        b0, b1 = int(steps[r]) * L, int(steps[r + 1]) * L
        layer_of_row = np.repeat(np.tile(layer_base, (b1 - b0) // L), np.diff(blocks[b0:b1 + 1]))
        flat = (layer_of_row[:, None] + trace.topk[blocks[b0]:blocks[b1]]).ravel()
        out.append(np.bincount(flat, minlength=L * E).reshape(L, E).astype(np.float32))
    return out
