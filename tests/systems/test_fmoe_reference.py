"""fMoE's fast paths against its plain rule (systems/fmoe/rule.py), on random stores and
random eviction histories with ties (test_fmoe_fast's, its probabilities rounded):
`ExpertMapStore.match` (semantic and trajectory, small and large stores, python and
compiled) returns the rule's maps and scores, bit for bit, and the eviction scores' victim
is the rule's after every change."""

from __future__ import annotations

import numpy as np
import pytest
from test_fmoe_fast import _ops

from systems.fmoe import rule
from systems.fmoe.eviction import EvictionScores
from systems.fmoe.kernels import load_kernels
from systems.fmoe.maps import DECODE, PREFILL, ExpertMapStore, unit
from systems.fmoe.maps_trajectory import SMALL_STORE

FAST = load_kernels()
PATHS = [pytest.param(None, id="python"),
         pytest.param(FAST, id="compiled", marks=pytest.mark.skipif(
             FAST is None, reason="systems/fmoe/kernels not built (pip install -e .)"))]


def _store_inputs(rng, n, L, E, D):
    """n maps [n, L, E] with exact repeats and near ties, embeddings [n, D] shared by runs
    (a request's maps share its prompt) and repeated, some missing; kinds mixed."""
    maps = rng.dirichlet(np.full(E, 0.4), size=(n, L)).astype(np.float16)
    maps[1::5] = maps[0::5][:len(maps[1::5])]  # exact ties: the first row wins
    maps = maps.astype(np.float32)
    maps[3::7, :, 0] += 2.0 ** -24  # a grid step off a float16 value
    embs = np.repeat(rng.standard_normal((n // 3 + 1, D)), 3, axis=0)[:n].astype(np.float16)
    embs[n // 2:] = embs[:n - n // 2]  # the same prompts again, later rows
    has = rng.random(n) < 0.8
    kinds = (rng.random(n) < 0.5).astype(np.int8)
    return maps, embs, has, kinds


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("n,L,E", [(6, 3, 4), (40, 5, 8), (SMALL_STORE + 45, 4, 12)])
@pytest.mark.parametrize("skip_first", [False, True])  # a decode step skips layer 0
def test_store_matches_equal_the_rule(fast, n, L, E, skip_first):
    rng = np.random.default_rng(n * 10 + L + skip_first)
    D = 6
    maps, embs, has, kinds = _store_inputs(rng, n, L, E, D)
    active = {PREFILL: list(range(L)), DECODE: list(range(int(skip_first), L))}
    store = ExpertMapStore(n, L, E, 1, active=active, fast=fast)
    store.add(maps, embs, has, kinds, chunk=64)
    assert store.replaced == 0 and (fast is None or store.fast is not None)
    for t in range(12):
        kind = int(rng.integers(2))
        distance = int(rng.integers(1, len(active[kind])))
        src = int(rng.integers(n))
        probs = maps[src] if t % 3 else rng.dirichlet(np.ones(E), size=L).astype(np.float32)
        if t % 4 == 1:
            probs = probs.astype(np.float16)
        emb = (None if t % 5 == 4 else
               unit(np.asarray(embs[src] if t % 2 else rng.standard_normal(D), np.float32)))
        want = rule.iteration_matches(maps, embs, has, kinds, probs, emb, kind, active[kind],
                                      distance)
        assert store.match(probs, emb, kind, distance) == want, t
        if emb is not None:
            for same in (True, False):
                assert store.match_semantic(emb, kind, same) == rule.semantic_match(
                    embs, has, kinds, emb, kind, same), (t, same)


class _Plain:
    """The state the rule reads, kept from the same changes: p, freq, last use, residency
    and protection (a count of the predictions naming each key when `counted`)."""

    def __init__(self, L, E):
        n, self.E = L * E, E
        self.p, self.freq, self.last_use = [1.0 / E] * n, [0.0] * n, [0] * n
        self.resident, self.cnt = [False] * n, [0] * n

    def apply(self, op, counted):
        if op[0] == "route":
            for e in op[2]:
                self.freq[op[1] * self.E + e] += 1.0
                self.last_use[op[1] * self.E + e] = op[3]
        elif op[0] == "set_p":
            lo = op[1] * self.E
            rows = op[2] if op[3] else [self.p[lo:lo + self.E], *op[2]]
            self.p[lo:lo + self.E] = [max(col) for col in zip(*rows)]
        elif op[0] == "protect":
            for k in op[1]:
                self.cnt[k] = self.cnt[k] - 1 if counted else 0
            for k in op[2]:
                self.cnt[k] = self.cnt[k] + 1 if counted else 1
        elif op[0] in ("load", "evict"):
            self.resident[op[1]] = op[0] == "load"

    def victim(self, candidates, demand):
        return rule.victim(self.p, self.freq, self.last_use, self.resident,
                           [c > 0 for c in self.cnt], candidates, demand)


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("L,E", [(2, 4), (4, 24)])
def test_eviction_victim_equals_the_rule(fast, counted, L, E):
    rng = np.random.default_rng(L * E + counted)
    scores, plain = EvictionScores(L, E, fast), _Plain(L, E)
    asked = 0
    for op in _ops(rng, L, E, 3000):
        if op[0] == "order":
            continue
        if op[0] == "set_p":  # probabilities rounded to quarters: many equal scores
            op = (*op[:2], [[round(x * 4) / 4 for x in row] for row in op[2]], op[3])
        if op[0] == "protect" and counted:  # dropped keys were added before
            op = (op[0], [k for k in op[1] if plain.cnt[k] > 0], op[2])
        if op[0] == "victim":
            assert scores.victim(*op[1:]) == plain.victim(*op[1:]), op
            asked += 1
            continue
        plain.apply(op, counted)
        if op[0] == "protect":
            scores.protect(op[1], op[2], counted)
        else:
            getattr(scores, op[0])(*op[1:])
    assert asked > 300
