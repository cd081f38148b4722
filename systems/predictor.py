"""Next-layer expert predictor for diff_moe: numpy only, trained on a calibration trace.

Score of expert j at layer l+1, given the union U of this step's experts at layer l (with
c_i tokens routed to i) and the previous iteration's union at layer l+1 (token share r_j):

    trans_j = k * sum_i c_i * T[l][i, j] / sum_i c_i     T[l][i] = P(j at l+1 | i at l, same token)
    score_j = (1 - beta) * trans_j + beta * r_j

T is counted over calibration tokens (every prompt token with stride `prefill_stride`, every
decoded token) with add-`smoothing` towards layer l+1's popularity. beta is picked from
`recency_grid` by held-out precision: T is fitted on the first (1 - holdout_fraction) of the
calibration requests and scored on the rest, then refitted on all of them.

Accuracy (docs/systems.md, diff_moe): held-out requests decoded in lock-step groups of the
run's max_batch, steps s >= 2, layer pairs (l, l+1) in one stack. The guess is the top-m
experts by score with m = |U| (= top_k at batch 1); the truth is the step's union at l+1.
precision = sum |guess & truth| / sum |guess|, recall = sum |guess & truth| / sum |truth|.
Baseline "same experts": guess = U itself.

Portable (docs/trace-format.md, "Portable determinism"): T is rounded to multiples of 2**-30
and multiplied only by integer token counts, so every matrix product is exact (its sums
stay far below 2**23) and the scores do not depend on the BLAS kernel; the division by the
token total comes after, elementwise.
"""

from __future__ import annotations

import numpy as np

from core.blocks import linked_layers
from core.knobs import float_knob, int_knob, numbers_knob
from core.numerics import on_grid

T_GRID_BITS = 30  # transition probabilities: multiples of 2**-30


def check_predictor_knobs(recency_grid, holdout_fraction, prefill_stride, smoothing):
    """The predictor's knobs as diff_moe names them, checked (KnobError) and normalised:
    (recency_grid tuple, holdout_fraction, prefill_stride, smoothing)."""
    grid = tuple(numbers_knob(recency_grid, "recency_grid", lo=0.0, hi=1.0))
    holdout = float_knob(holdout_fraction, "holdout_fraction", lo=0.0, hi=1.0, lo_open=True,
                         hi_open=True)
    stride = int_knob(prefill_stride, "train_prefill_stride", lo=1)
    # 0 would divide by zero for experts never seen in calibration
    alpha = float_knob(smoothing, "smoothing", lo=0.0, lo_open=True)
    return grid, holdout, stride, alpha


class NextLayerPredictor:
    def __init__(self, num_layers: int, num_experts: int, top_k: int, stacks: tuple[str, ...],
                 recency_grid=(0.0, 0.25, 0.5, 0.75), holdout_fraction: float = 0.2,
                 prefill_stride: int = 8, smoothing: float = 1.0):
        self.grid, self.holdout, self.stride, self.alpha = check_predictor_knobs(
            recency_grid, holdout_fraction, prefill_stride, smoothing)
        self.L, self.E, self.k = num_layers, num_experts, top_k
        # predicting l+1 from l is only meaningful when the same token passes through both
        self.linked = linked_layers(stacks).tolist()
        self.T = on_grid(np.full((num_layers, num_experts, num_experts), 1.0 / num_experts),
                         T_GRID_BITS)
        self.beta = 0.0
        self.report: dict = {}

    # ---- training ---------------------------------------------------------------------------
    def fit(self, trace, batch: int = 1) -> dict:
        """Choose beta on held-out requests decoded in groups of `batch`, refit T on every
        request; returns the held-out accuracy."""
        R = trace.num_requests
        n_hold = max(1, int(round(R * self.holdout))) if R > 1 else 0
        train, hold = np.arange(R - n_hold), np.arange(R - n_hold, R)
        self.T = self._transitions(trace, train if n_hold else np.arange(R))
        per_beta = ({b: self._evaluate(trace, hold, b, batch) for b in self.grid}
                    if n_hold else {})
        if per_beta:
            self.beta = max(self.grid, key=lambda b: (per_beta[b]["precision"], -b))
            best = per_beta[self.beta]
            self.report = {
                "heldout_requests": int(n_hold), "batch": int(batch), "pairs": best["pairs"],
                "beta": self.beta,
                "precision": best["precision"], "recall": best["recall"],
                "transition_only_precision": per_beta[self.grid[0]]["precision"]
                if self.grid[0] == 0.0 else None,
                "same_experts_precision": best["base_precision"],
                "same_experts_recall": best["base_recall"]}
        else:
            self.report = {"heldout_requests": 0, "note": "one calibration request: no hold-out"}
        self.T = self._transitions(trace, np.arange(R))
        return self.report

    def _pairs(self, trace, requests, layer):
        """Token rows of `layer` and the same tokens' rows at layer + 1 (prefill strided)."""
        L, off = self.L, trace.block_offsets
        steps = [np.arange(trace.step_offsets[r], trace.step_offsets[r + 1]) for r in requests]
        g = np.concatenate(steps) if steps else np.zeros(0, np.int64)
        first = np.concatenate([np.arange(len(s)) == 0 for s in steps]) if steps else g
        b = g * L + layer
        n, n_next = off[b + 1] - off[b], off[b + 2] - off[b + 1]
        ok = (n == n_next) & (n > 0)
        b, n, first = b[ok], n[ok], np.asarray(first, bool)[ok]
        stride = np.where(first, self.stride, 1)
        cnt = (n + stride - 1) // stride
        total = int(cnt.sum())
        pos = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)  # index within block
        rows = np.repeat(off[b], cnt) + pos * np.repeat(stride, cnt)
        return rows, rows + np.repeat(n, cnt)  # block b + 1 starts right after block b

    def _transitions(self, trace, requests) -> np.ndarray:
        L, E, k = self.L, self.E, self.k
        T = np.full((L, E, E), 1.0 / E)
        for layer in range(L):
            if not self.linked[layer]:
                continue
            rows, nxt = self._pairs(trace, requests, layer)
            a = trace.topk[rows].astype(np.int64)  # [n, k] ids at layer
            c = trace.topk[nxt].astype(np.int64)  # [n, k] same tokens at layer + 1
            flat = (a[:, :, None] * E + c[:, None, :]).ravel()  # every (i, j) of a token
            counts = np.bincount(flat, minlength=E * E).reshape(E, E).astype(np.float64)
            pop = np.bincount(c.ravel(), minlength=E) + 1.0
            prior = pop / pop.sum()  # [E] popularity of layer + 1
            # row i: next-layer choices of tokens that chose i, each token contributing k picks
            T[layer] = (counts / k + self.alpha * prior) / (
                counts.sum(1, keepdims=True) / k + self.alpha)
        return on_grid(T, T_GRID_BITS)

    def _evaluate(self, trace, requests, beta: float, batch: int) -> dict:
        """Precision/recall of the guesses on `requests` decoded in lock-step groups of
        `batch` (steps s >= 2 that every request of the group reaches)."""
        E, k, L, off = self.E, self.k, self.L, trace.block_offsets
        batch = max(1, min(batch, len(requests)))
        groups = np.asarray(requests)[:len(requests) // batch * batch].reshape(-1, batch)
        steps = [trace.step_offsets[grp][None, :] + np.arange(
            2, int(trace.output_len[grp].min()))[:, None] for grp in groups]  # [S_g, batch]
        g = np.concatenate(steps) if steps else np.zeros((0, batch), np.int64)  # [n, batch]
        hit = guessed = truth_n = base_hit = pairs = 0

        def union(blocks):  # [n, batch] blocks of one token each -> [n, E] tokens per expert
            n = len(blocks)
            ids = trace.topk[off[blocks]].astype(np.int64).reshape(n, -1)  # [n, batch * k]
            flat = (np.arange(n)[:, None] * E + ids).ravel()
            return np.bincount(flat, minlength=n * E).reshape(n, E).astype(np.float64)

        for layer in range(L):
            if not self.linked[layer] or len(g) == 0:
                continue
            b = g * L + layer
            one = np.ones(len(g), bool)  # decoder-only: always; encoder layers decode nothing
            for blk in (b, b + 1, b + 1 - L):  # this layer, the next, the next one step back
                one &= ((off[blk + 1] - off[blk]) == 1).all(1)
            b = b[one]
            if len(b) == 0:
                continue
            cur, nxt, prev = union(b), union(b + 1) > 0, union(b + 1 - L)
            score = (1.0 - beta) * k * (cur @ self.T[layer]) / cur.sum(1, keepdims=True)
            score += beta * k * prev / prev.sum(1, keepdims=True)
            m = (cur > 0).sum(1, keepdims=True)  # [n, 1] guesses = this layer's union size
            rank = np.argsort(np.argsort(-score, axis=1, kind="stable"), axis=1)
            guess = rank < m
            hit += int((guess & nxt).sum())
            base_hit += int(((cur > 0) & nxt).sum())
            guessed += int(m.sum())
            truth_n += int(nxt.sum())
            pairs += len(b)
        return {"pairs": pairs, "precision": hit / max(1, guessed),
                "recall": hit / max(1, truth_n), "base_precision": base_hit / max(1, guessed),
                "base_recall": base_hit / max(1, truth_n)}

    # ---- runtime ----------------------------------------------------------------------------
    def recency(self, act: np.ndarray, counts: list[int]) -> np.ndarray:
        """[E] beta * token shares (summing to beta * k) of one step's union at a layer."""
        r = np.zeros(self.E)
        n = sum(counts)
        if n == len(counts):  # one token per expert
            r.put(act, self.beta)
        else:
            r.put(act, np.array(counts, dtype=np.float64) * (self.beta * self.k / n))
        return r

    def scores(self, layer: int, act: np.ndarray, counts: list[int],
               recent: np.ndarray | None) -> np.ndarray:
        """[E] scores for layer + 1 from this step's union at `layer` (ids `act`, tokens per
        id) and `recency()` of the previous iteration's union at layer + 1 (or None)."""
        n = sum(counts)
        c = np.zeros(self.E)  # [E] token counts: c @ T is exact
        c.put(act, 1.0 if n == len(counts) else np.array(counts, dtype=np.float64))
        s = (c @ self.T[layer]) * ((1.0 - self.beta) * self.k / n)  # [E]
        if recent is not None:
            s += recent
        return s


class PredictorRuntime:
    """The run-time side of a fitted predictor, one implementation for diff_moe and the
    `predictor` prefetcher (systems/prefetchers/predictor.py): the previous iteration's union
    per layer (the recency term, used only when the same requests decode again) and the
    top-m guess for the next layer."""

    def __init__(self, pred: NextLayerPredictor):
        self.pred = pred
        self.recent: list = [None] * pred.L  # last union per layer: beta * token shares [E]
        self.prev_requests: tuple[int, ...] = ()
        self.iteration, self.same_batch = -1, False

    def new_step(self, iteration) -> None:
        """Once per iteration (IterationInfo): is this the last batch decoding again?"""
        if iteration.index != self.iteration:
            reqs = tuple(r for r, _ in iteration.members)
            self.same_batch = iteration.kind == "decode" and reqs == self.prev_requests
            self.prev_requests, self.iteration = reqs, iteration.index

    def guess(self, layer: int, act: np.ndarray, counts: list[int], m: int) -> list[int]:
        """Record this step's union at `layer` (ids `act`, tokens each) for the next iteration;
        return the m best-scored expert ids of layer + 1, best first, ties by lowest id
        ([] when layer + 1 is not the same tokens' next layer, or m = 0)."""
        pred = self.pred
        if pred.beta > 0.0 and layer > 0 and pred.linked[layer - 1]:
            self.recent[layer] = pred.recency(act, counts)  # read at layer - 1, next step
        if not pred.linked[layer] or m <= 0:
            return []
        score = pred.scores(layer, act, counts,
                            self.recent[layer + 1] if self.same_batch else None)
        return (-score).argsort(kind="stable")[:m].tolist()  # [m] best first, ties: low id
