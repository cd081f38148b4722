"""fMoE's compiled loops (systems/fmoe/kernels, chosen by the config's policy_kernels) against
the pure-Python reference: the trajectory step on small and large stores, the eviction
scores' edits op by op, and whole runs whose store exceeds the small-store size (the golden
settings keep 12 maps), at batch 1 and 4: the same values, the same tables."""

from __future__ import annotations

import numpy as np
import pytest
from test_golden_systems import table_sha

from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.run import execute
from systems.fmoe.eviction import PROTECTED_TIER, EvictionScores
from systems.fmoe.kernels import load_kernels
from systems.fmoe.maps import DECODE, PREFILL, ExpertMapStore, TrajectoryState
from systems.fmoe.maps_trajectory import SMALL_STORE
from systems.fmoe.predictions import LayerGroup, from_store

FAST = load_kernels()  # the compiled loops; the python ones: fast None (the default)
pytestmark = pytest.mark.skipif(FAST is None,
                                reason="systems/fmoe/kernels not built (pip install -e .)")


@pytest.mark.parametrize("n", [40, SMALL_STORE + 61])
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("maps16", [True, False])  # maps exact in float16: the float16 block
def test_trajectory_step_equals_python(n, half, maps16):
    rng = np.random.default_rng(n)
    L, E = 5, 19
    maps = rng.dirichlet(np.full(E, 0.3), size=(n, L)).astype(np.float32)
    if maps16:
        maps = maps.astype(np.float16).astype(np.float32)
    maps[n // 2] = maps[n // 3]  # an exact tie: the first index wins
    queries = [maps[i] for i in range(0, n, 7)]
    queries += [rng.dirichlet(np.ones(E), size=L).astype(np.float32) for _ in range(4)]
    queries = [q.astype(np.float16) if half else q for q in queries]
    fast = ExpertMapStore(n, L, E, 1, fast=FAST)
    slow = ExpertMapStore(n, L, E, 1)
    for store in (fast, slow):
        store.add(maps, None, np.zeros(n, bool), np.ones(n, np.int8))
    assert fast.fast is not None and fast.exact32 and slow.fast is None
    assert (fast.cols16 is not None) == (maps16 and fast.fast.HALF_OK)
    for kind in (PREFILL, DECODE):
        states = [TrajectoryState(n, kind, len(queries), s.fast) for s in (fast, slow)]
        for pos in range(L):
            q = np.stack([x[pos] for x in queries])
            assert fast.observe_many(states[0], pos, q) == slow.observe_many(states[1], pos, q)


@pytest.mark.parametrize("smooth", [0.0, 0.25])
def test_predictions_equal_python(smooth):
    rng = np.random.default_rng(11)
    n, L, E = 30, 3, 16
    maps = rng.dirichlet(np.full(E, 0.2), size=(n, L)).astype(np.float16)
    maps[5, 1] = 0  # a layer without tokens: no prediction
    fast = ExpertMapStore(n, L, E, 1, fast=FAST)
    slow = ExpertMapStore(n, L, E, 1)
    for store in (fast, slow):
        store.add(maps, None, np.zeros(n, bool), np.ones(n, np.int8))
    for layer in range(L):
        for j in range(n):
            for score in (-0.5, 0.0, 0.3, 0.8, 1.0, 1.5):
                for delta in (True, False):
                    got = [from_store(s, layer, [j], [score], 2.0, 2, smooth, delta)[0]
                           for s in (fast, slow)]
                    assert (got[0] is None) == (got[1] is None)
                    if got[0] is not None:
                        a, b = got
                        assert (a.keys, a.probs, a.row, a.score) == (b.keys, b.probs, b.row,
                                                                     b.score)
        # several rows at once (a batch): delta_ids_many's rule, and the layer's merged group
        for delta in (True, False):
            scores = rng.uniform(-0.2, 1.2, size=n).tolist()
            got = [from_store(s, layer, list(range(n)), scores, 2.0, 3, smooth, delta)
                   for s in (fast, slow)]
            assert [None if x is None else (x.keys, x.probs, x.row, x.score) for x in got[0]] \
                == [None if x is None else (x.keys, x.probs, x.row, x.score) for x in got[1]]
            preds = [x for x in got[0] if x is not None]
            g = LayerGroup(preds, 3, FAST)
            h = LayerGroup(preds, 3)
            assert (list(g.best_p.items()), list(g.use.items())) == (list(h.best_p.items()),
                                                                     list(h.use.items()))


def _ops(rng, L, E, steps):
    """A random stream of the eviction state's changes and questions."""
    n, clock = L * E, 0
    for _ in range(steps):
        what = rng.integers(7)
        if what == 0:
            clock += 1
            yield "route", int(rng.integers(L)), sorted(set(rng.integers(E, size=3).tolist())), \
                clock
        elif what == 1:
            # one to five rows (the python path: pairwise up to two, numpy's above), ties too
            rows = [rng.dirichlet(np.ones(E)).tolist() for _ in range(rng.integers(1, 5))]
            rows += rows[:rng.integers(2)]
            yield "set_p", int(rng.integers(L)), rows, bool(rng.integers(2))
        elif what == 2:
            yield "protect", rng.integers(n, size=3).tolist(), rng.integers(n, size=4).tolist()
        elif what in (3, 4):
            yield ("load" if what == 3 else "evict"), int(rng.integers(n))
        elif what == 5:
            yield "order", bool(rng.integers(4) == 0)
        else:
            yield "victim", set(rng.integers(n, size=rng.integers(1, n)).tolist()), \
                bool(rng.integers(2))


@pytest.mark.parametrize("counted", [False, True])
def test_eviction_edits_equal_python(counted):
    rng = np.random.default_rng(3 + counted)
    L, E = 4, 24
    fast = EvictionScores(L, E, FAST)
    slow = EvictionScores(L, E)
    assert fast.kernel is not None and slow.kernel is None
    for op in _ops(rng, L, E, 4000):
        got = []
        for s in (fast, slow):
            if op[0] == "route":
                s.route(*op[1:])
            elif op[0] == "set_p":
                s.set_p(*op[1:])
            elif op[0] == "protect":
                # protect's contract: dropped keys were added before (counts stay >= 0)
                held = [k for k in op[1] if s.protect_cnt[k] > 0] if counted else op[1]
                s.protect(held, op[2], counted)
            elif op[0] in ("load", "evict"):
                getattr(s, op[0])(op[1])
            elif op[0] == "victim":
                got.append(s.victim(*op[1:]))
            else:
                entries = s.order(deeper=op[1])
                got.append(None if entries is None else list(entries))
        assert fast.victims.entries == slow.victims.entries, op
        assert len(got) in (0, 2) and (not got or got[0] == got[1]), op
    for name in ("p", "freq", "last_use", "resident", "penalty", "protect_cnt", "visits"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert max(fast.penalty) in (0.0, PROTECTED_TIER)
    with pytest.raises(ValueError, match="a prediction row has 3 entries, not 24"):
        fast.set_p(0, [[0.5] * E, [0.1, 0.2, 0.7]], True)


@pytest.mark.parametrize("batch", [1, 4])
def test_runs_with_a_large_store_equal_python(batch, tmp_path):
    # 40 calibration requests of 8 steps: 320 maps, more than SMALL_STORE, into 300 rows
    # (replacements); the run's requests add theirs.
    overrides = ["experiment=table1", "workload.prompt_len=48", "workload.output_len=8",
                 "workload.num_requests=10", "calibration_requests=40", "expert_cache_gb=4",
                 f"max_batch={batch}", "progress=false", "system=fmoe",
                 "system.store_capacity=300"]

    def run(name):
        cfg = compose_config(overrides, run_name=name, results_dir=str(tmp_path))
        result = execute(assemble(cfg))
        assert result.status == "valid"
        return result.metrics, table_sha(result.run_dir)

    fast = run("fast")
    overrides.append("policy_kernels=python")
    assert fast == run("python")


def test_float16_copy_gives_way_to_float32():
    # Maps exact in float16, then one that is not: the store switches to the float32 block,
    # built from every map so far, and matches as the python path does.
    rng = np.random.default_rng(5)
    n, L, E = 20, 3, 8
    maps = rng.dirichlet(np.ones(E), size=(n, L)).astype(np.float16).astype(np.float32)
    odd = rng.dirichlet(np.ones(E), size=(1, L)).astype(np.float32)
    fast = ExpertMapStore(n + 1, L, E, 1, fast=FAST)
    slow = ExpertMapStore(n + 1, L, E, 1)
    for store in (fast, slow):
        store.add(maps, None, np.zeros(n, bool), np.ones(n, np.int8))
    assert (fast.cols16 is not None) == fast.fast.HALF_OK
    for store in (fast, slow):
        store.add(odd, None, np.zeros(1, bool), np.ones(1, np.int8))
    assert fast.cols16 is None
    assert np.array_equal(fast.float32_cols(), slow.float32_cols())
    states = [TrajectoryState(n + 1, DECODE, 2, s.fast) for s in (fast, slow)]
    for pos in range(L):
        q = np.stack([odd[0, pos], maps[3, pos]])
        assert fast.observe_many(states[0], pos, q) == slow.observe_many(states[1], pos, q)
