"""moe_infinity's eviction ranks (systems/moe_infinity/system.py): the resident keys by predicted
reuse, the lowest one among the engine's evictable candidates, and the released code's
alternative rank (`freq_decay_eviction`).

Keys are layer * E + expert; ranks [L*E] are the score where resident and inf elsewhere;
ties go to the lowest key.
"""

from __future__ import annotations

import numpy as np

_FEW = 8  # up to this many experts routed in the running layer, skipping them one by one is
# cheaper than the walk of its block (batch 1 decodes route top_k)


def lowest_evictable(ranks: np.ndarray, candidates=None, fast=None) -> int:
    """The key of lowest rank (ties: lowest key) among `candidates` if given; -1 if none.
    Skipped keys are set to inf while searching and restored after (the compiled kernel
    `fast`, kernels/fast.pyx: the same search in C)."""
    if fast is not None:
        return fast.lowest_evictable(ranks, candidates)
    skipped = []
    key = -1
    while True:
        k = int(ranks.argmin())
        if ranks[k] == np.inf:
            break
        if candidates is None or k in candidates:
            key = k
            break
        skipped.append((k, ranks[k]))
        ranks[k] = np.inf  # in use by the running layer or still in flight
    for k, value in skipped:
        ranks[k] = value
    return key


class ResidentRanks:
    """The ranks of the resident keys by the current scores, kept in step with loads and
    evictions between score updates.

    The running layer's experts are the usual keys that cannot be evicted (in use until they
    have run; at batch 32 nearly the whole layer), and they often rank lowest. When it routed
    many, `lowest` walks that layer's block in rank order with the engine's
    Candidates.first_of and searches the other keys by argmin in a copy with the block at
    inf, instead of one argmin per key skipped."""

    def __init__(self, num_keys: int, num_experts: int, fast=None):
        self.E, self.fast = num_experts, fast  # fast: kernels/fast.pyx or None (numpy)
        self.pen = np.full(num_keys, np.inf)  # 0 where resident: score + pen = ranks
        self.score = np.zeros(num_keys)
        self.layer = 0  # the running layer
        self.few = True  # it routed few experts
        self._ranks: np.ndarray | None = None  # caches, rebuilt when None
        self._outside: np.ndarray | None = None  # ranks with the running layer's block at inf
        self._order: list[int] | None = None  # the running layer's keys, lowest score first

    def set_scores(self, score: np.ndarray) -> None:
        """New scores (an array the caller no longer writes, except through set_block)."""
        self.score = score
        self._ranks = self._outside = self._order = None

    def set_block(self, blk: slice) -> None:
        """The scores changed on the running layer's block `blk` only."""
        if self._ranks is not None:
            np.add(self.score[blk], self.pen[blk], out=self._ranks[blk])
        self._order = None  # the block of _outside stays inf

    def set_layer(self, layer: int, routed: int) -> None:
        """The running layer and how many experts it routed (few: plain argmin search)."""
        self.few = routed <= _FEW
        if layer != self.layer:
            self.layer = layer
            self._outside = self._order = None

    def load(self, key: int) -> None:
        self.pen[key] = 0.0
        if self._ranks is not None:
            self._ranks[key] = self.score[key]
        if self._outside is not None and key // self.E != self.layer:
            self._outside[key] = self.score[key]

    def evict(self, key: int) -> None:
        self.pen[key] = np.inf
        if self._ranks is not None:
            self._ranks[key] = np.inf
        if self._outside is not None:
            self._outside[key] = np.inf

    def ranks(self) -> np.ndarray:
        if self._ranks is None:
            self._ranks = self.score + self.pen
        return self._ranks

    def lowest(self, candidates=None) -> int:
        """Resident key with the lowest rank (ties: lowest key), among `candidates` if
        given; -1 if none."""
        ranks = self.ranks()
        if candidates is None or self.few:
            return lowest_evictable(ranks, candidates, self.fast)
        blk = slice(self.layer * self.E, (self.layer + 1) * self.E)
        if self._order is None:  # stable: equal scores keep the lowest key first
            order = np.argsort(self.score[blk], kind="stable")
            self._order = (order + blk.start).tolist()
        if self._outside is None:
            self._outside = ranks.copy()
            self._outside[blk] = np.inf
        first_of = getattr(candidates, "first_of", None)  # the engine's; a test's set lacks it
        inside = (first_of(self._order) if first_of is not None  # evictable: resident
                  else next((k for k in self._order if k in candidates), None))
        outside = lowest_evictable(self._outside, candidates, self.fast)
        if inside is None:
            return outside
        if outside < 0:
            return inside
        return min((ranks[inside], inside), (ranks[outside], outside))[1]


def released_layer_factor(num_layers: int, num_experts: int) -> np.ndarray:
    """The released code's layer ("topology") factor of eviction, [L, L*E]: row c is for the
    current layer c, normalised over all keys, + 1e-6 (expert_priority_score.priority_score).
    It splits the layers in halves (a leftover of encoder-decoder Switch, applied to every
    model): layers of the current half up to c get 1, later ones of that half 1 - i/n (first
    half) or (i - n) / (n + 1) (second half, i - n counted from its start); the other half
    keeps its later-layer rule. n = L // 2; a single layer (n = 0) gets a uniform factor."""
    n, i = num_layers // 2, np.arange(num_layers)
    if n == 0:
        return np.full((num_layers, num_layers * num_experts), 1.0 / num_experts + 1e-6)
    first, second = 1.0 - i / n, (i - n) / (n + 1.0)
    rows = []
    for c in range(num_layers):
        if c < n:
            t = np.where(i < n, np.where(i > c, first, 1.0), second)
        else:
            t = np.where(i < n, first, np.where(i > c, second, 1.0))
        rows.append(np.repeat(t / (t.sum() * num_experts), num_experts) + 1e-6)
    return np.array(rows)


def released_priority(reuse: np.ndarray, freq: np.ndarray, layer_factor: np.ndarray):
    """The released code's eviction priority [L*E] (lowest evicted first): the product of the
    layer factor, the predicted reuse and the access frequency of the resident experts, each
    normalised to sum 1 and shifted by 1e-6 (an all-zero factor counts as uniform). `freq`:
    accesses since the expert was loaded, 0 for absent keys; integer-valued, so its sum is
    exact."""
    out = layer_factor.copy()
    for f in (reuse, freq):
        total = float(f.sum())
        out *= (f / total if total > 0 else 1.0 / len(f)) + 1e-6
    return out
