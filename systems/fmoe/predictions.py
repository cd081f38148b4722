"""fMoE's predictions (systems/fmoe/system.py) and the small per-hook work on them: the prefetch
proposal and the expected use of proposed keys.

A prediction names k to E keys of one layer, so the work per hook is a few dozen numbers:
python lists and python floats (IEEE doubles, the same roundings as numpy's float64) are
cheaper there than numpy's per-call overhead, and give the same values and order.
"""

from __future__ import annotations

import numpy as np


class Prediction:
    """Experts predicted for one layer of an iteration by one match.

    keys: [k'] layer * E + expert ids, most probable first; probs: [k'] their probabilities;
    row: [E] the layer's probabilities (the eviction p). Python lists."""

    __slots__ = ("layer", "ready_ms", "keys", "probs", "row", "score", "applied", "_prob_of")

    def __init__(self, layer, ready_ms, keys, probs, row, score=1.0):
        self.layer, self.ready_ms = layer, ready_ms
        self.keys, self.probs, self.row = _list(keys), _list(probs), _list(row)
        self.score = score  # the match's cosine
        self.applied = False  # its row has been written into the eviction probabilities
        self._prob_of: dict[int, float] | None = None

    def prob_of(self) -> dict[int, float]:
        """{key: probability} of the predicted keys (built once: admission asks often)."""
        if self._prob_of is None:
            self._prob_of = dict(zip(self.keys, self.probs))
        return self._prob_of

    def copy(self) -> Prediction:
        """The same prediction, not yet applied (a semantic match queued again)."""
        x = Prediction(self.layer, self.ready_ms, self.keys, self.probs, self.row, self.score)
        x._prob_of = self._prob_of
        return x


def _list(x) -> list:
    return x if type(x) is list else np.asarray(x).tolist()


def from_store(store, layer: int, idx: list[int], score: list[float], ready_ms: float,
               top_k: int, smooth: float, delta: bool = True) -> list[Prediction | None]:
    """The delta-rule predictions of stored maps idx [m] at `layer` for matches scoring
    `score` [m]; None for a map whose layer had no tokens. smooth: the weight moved toward 1/E
    in the probabilities read from the rows (0: as stored). delta=False: each row's top-k
    (the rule at score 1; the prediction keeps the match's score). The rows are copied
    (lists): the store may replace them while a prediction waits."""
    one = len(idx) == 1
    pick = score if delta else [1.0] * len(idx)
    if one and store.fast is not None:  # compiled: the same lists (kernels/fast.pyx)
        j = idx[0]
        got = store.fast.delta_one(store.mass[layer, j], store.order[layer, j],
                                   store.maps[layer, j], pick[0], top_k, smooth,
                                   layer * store.E)
        return [None if got is None else Prediction(layer, ready_ms, *got, score[0])]
    if store.fast is not None:  # several rows: each as delta_ids_many decides
        got = store.fast.delta_rows(store.mass[layer], store.order[layer], store.maps[layer],
                                    list(idx), list(pick), top_k, smooth, layer * store.E)
        return [None if g is None else Prediction(layer, ready_ms, *g, s)
                for g, s in zip(got, score)]
    ids = ([store.delta_ids(layer, idx[0], pick[0], top_k)] if one else
           store.delta_ids_many(layer, idx, pick, top_k))
    rows = store.maps[layer, idx[0]][None] if one else store.maps[layer, idx]  # [m, E]
    if smooth:
        rows = (1.0 - smooth) * rows + smooth / store.E
    lo = layer * store.E
    return [None if i is None else
            Prediction(layer, ready_ms, [lo + e for e in i], [row[e] for e in i], row, s)
            for i, row, s in zip(ids, rows.tolist(), score)]


def proposal(usable: list[Prediction], pos: dict[int, int], pos_now: int) -> list[int]:
    """Keys by priority p / (l - l_now) descending, ties lowest key (numpy's lexsort((keys,
    -prio)) order: the same quotients, compared as python floats). One request: every pair
    is kept (merged_proposal merges several requests' predictions)."""
    items: list[tuple[float, int]] = []
    for x in usable:
        dist = pos[x.layer] - pos_now
        items.extend(zip([-(p / dist) for p in x.probs], x.keys))
    items.sort()
    return [k for _, k in items]


def expected_use(usable: list[Prediction], top_k: int) -> dict[int, float]:
    """Expected use of each proposed key in its predicted iteration: the match's score times
    the map's share of top-k slots, min(1, k * p); the best over predictions."""
    out: dict[int, float] = {}
    for x in usable:
        s = max(x.score, 0.0)
        for key, p in zip(x.keys, x.probs):
            u = s * min(1.0, top_k * p)
            if u > out.get(key, -1.0):
                out[key] = u
    return out


class LayerGroup:
    """The usable predictions of one layer (several requests) merged: per key, the best
    probability and the best expected use. A layer's predictions arrive together and stay
    usable for several hooks, so a group is built once (`groups` keeps it)."""

    __slots__ = ("preds", "best_p", "use")

    def __init__(self, preds: list[Prediction], top_k: int, fast=None):
        self.preds = preds
        if fast is not None:  # compiled (kernels/fast.pyx): the same tables
            self.best_p, self.use = fast.group_tables(preds, top_k)
            return
        best: dict[int, float] = {}
        for x in preds:
            for k, p in zip(x.keys, x.probs):
                if p > best.get(k, -1.0):
                    best[k] = p
        self.best_p = best
        self.use = expected_use(preds, top_k)


def groups(usable: list[Prediction], cache: dict[int, LayerGroup],
           top_k: int, fast=None) -> dict[int, LayerGroup]:
    """The usable predictions grouped by layer; groups whose predictions are unchanged are
    taken from `cache`, which is replaced by the result (fast: as LayerGroup takes it)."""
    by_layer: dict[int, list[Prediction]] = {}
    for x in usable:
        by_layer.setdefault(x.layer, []).append(x)
    out = {}
    for layer, preds in by_layer.items():
        g = cache.get(layer)
        out[layer] = g if g is not None and g.preds == preds else LayerGroup(preds, top_k, fast)
    cache.clear()
    cache.update(out)
    return out


def merged_proposal(grouped: dict[int, LayerGroup], pos: dict[int, int],
                    pos_now: int) -> list[int]:
    """The proposal of several requests' predictions: pairs (-(p / dist), key) sorted, each
    key at its first place. That place is its smallest -(p / dist), the one of its best p
    (division by a positive dist is monotone), so sorting each key once at
    -(best p / dist) gives the same list."""
    items: list[tuple[float, int]] = []
    for layer, g in grouped.items():
        dist = pos[layer] - pos_now
        items.extend((-(p / dist), k) for k, p in g.best_p.items())
    items.sort()
    return [k for _, k in items]
