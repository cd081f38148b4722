"""moe_infinity's compiled kernels (systems/moe_infinity/kernels) against its numpy code:
the same decisions and the same bits. Whole runs of the system with the kernels and with
them switched off (policy_kernels python, systems/base.py) must give identical tables,
reports and row arrays, over knobs that take every path (match_top above ARGMAX_TOP and
max_proposal above it run numpy for that part); the proposal kernel is also checked alone
on scores with many ties. Skips when the kernels are not built."""

from __future__ import annotations

import numpy as np
import pytest

from harness.runner.assembly import assemble, build_engine
from harness.runner.config import compose_config
from systems.moe_infinity import propose, requests, rule
from systems.moe_infinity.kernels import PYTHON, load_kernels
from systems.moe_infinity.system import MoEInfinity

KERNELS = load_kernels()
pytestmark = pytest.mark.skipif(KERNELS.fast is None, reason="moe_infinity kernels not built")

BASE = ["experiment=table1", "workload.prompt_len=40", "workload.output_len=6",
        "calibration_requests=8", "progress=false", "trace_cache_dir=null",
        "workload.num_requests=8", "expert_cache_gb=3"]


class _PerRowKernels(MoEInfinity):
    """The per-row kernels alone: no TableKernel (kernels/rows.pyx) on the batch path."""

    def bind(self, ctx):
        super().bind(ctx)
        self.kernels = load_kernels(rows=False)
        self.table = requests.RequestTable(ctx.num_layers, ctx.num_experts, self.capacity,
                                           self.own_weight, self.iteration_query,
                                           rows=ctx.max_batch, kernels=self.kernels)


def _run(batch: int, knobs: dict, fast: bool, rows: bool = True) -> dict:
    """One run; fast False: the numpy code (policy_kernels python); rows False: the per-row
    kernels alone."""
    cls = MoEInfinity if rows else _PerRowKernels
    system = cls(eamc_capacity=10, **knobs).use_policy_kernels("auto" if fast else "python")
    run = assemble(compose_config(BASE + [f"max_batch={batch}"]), system=system,
                   all_fields=True)
    engine = build_engine(run)
    system.warmup(run.calibration)
    rec = engine.run()
    tab = system.table
    rows = {name: getattr(tab, name).copy() for name in
            ("eam", "q", "dots", "norm2", "own", "own_n", "mix", "acc", "blend", "parts")}
    return {"tables": rec.tables(), "describe": system.describe(), "rows": rows,
            "score": system.score.copy(), "fast": tab.views[0].kernel is not None,
            "rows_kernel": tab.kernel is not None}


def _assert_same(a: dict, b: dict) -> None:
    assert a["describe"] == b["describe"]
    assert np.array_equal(a["score"], b["score"])
    for name, arr in a["rows"].items():
        assert np.array_equal(arr, b["rows"][name]), name
    for name, table in a["tables"].items():
        for col, values in table.items():
            np.testing.assert_array_equal(values, b["tables"][name][col],
                                          err_msg=f"{name}.{col}")


@pytest.mark.parametrize("knobs", [
    {},
    {"iteration_query": False, "match_top": 2, "max_proposal": 3},
    {"own_weight": 0.0, "admit_margin": 0.5},
    {"match_top": 12, "max_proposal": 12, "admit_margin": 2.0},
    {"own_weight": 1.0, "admit_margin": 0.0, "refetch_guard": False},
])
@pytest.mark.parametrize("batch", [1, 4])
def test_kernels_give_the_numpy_bits(batch, knobs):
    a, b = (_run(batch, knobs, fast) for fast in (True, False))
    assert a["fast"] and not b["fast"]
    _assert_same(a, b)


@pytest.mark.skipif(KERNELS.rows is None, reason="moe_infinity rows kernel not built")
@pytest.mark.parametrize("knobs", [
    {},
    {"iteration_query": False, "match_top": 3},
    {"own_weight": 0.0},
    {"match_top": 9, "max_proposal": 9},  # rankings above MAX_TOP: predict_one's lists
])
def test_batch_kernel_gives_the_numpy_bits(knobs):
    """Batch 6 (every layer of the 8 requests goes through the batch path, many rows at
    once): the batch kernel (TableKernel) gives the numpy path's and the per-row kernels'
    tables, reports and row arrays."""
    table = _run(6, knobs, True)
    per_row = _run(6, knobs, True, rows=False)
    numpy = _run(6, knobs, False)
    assert table["rows_kernel"] and not per_row["rows_kernel"] and not numpy["fast"]
    _assert_same(table, numpy)
    _assert_same(per_row, numpy)


@pytest.mark.skipif(KERNELS.rows is None, reason="moe_infinity rows kernel not built")
def test_bincount_kernel_is_the_numpy_count():
    """Top-k ids of the trace's dtypes: the same counts [R, E]; other dtypes: None (the
    numpy code counts them); an id past E: an error, not a write past the row."""
    from systems.moe_infinity import batch

    rng = np.random.default_rng(0)
    kernel = KERNELS.rows  # a table without kernels (PYTHON): numpy counts
    for dtype, E in ((np.uint8, 64), (np.uint16, 300)):
        rows = [rng.integers(0, E, (t, 4)).astype(dtype) for t in (1, 7, 3, 20)]
        rows.append(rows[1][::2])  # strided
        want = batch.bincount_rows(rows, E, requests.RequestTable(2, E, 4, 0.5, True,
                                                                  kernels=PYTHON))
        got = kernel.bincount_rows(rows, E)
        assert got.dtype == np.float64 and np.array_equal(got, want)
    assert kernel.bincount_rows([np.zeros((2, 2), dtype=np.int64)], 8) is None
    with pytest.raises(ValueError):
        kernel.bincount_rows([np.full((1, 2), 9, dtype=np.uint8)], 8)


@pytest.mark.parametrize("seed", range(6))
def test_proposal_kernel_is_the_numpy_rule(seed):
    """Scores on a grid of quarters (many ties), a gate, one to three variance rows or none,
    with and without a victim: the kernel's keys are numpy's top / admitted."""
    rng = np.random.default_rng(seed)
    n, m = 64, int(rng.integers(1, 9))
    score = rng.integers(0, 5, n) / 4.0
    w = rng.integers(0, 3, n) / 2.0
    apen = np.where(rng.random(n) < 0.3, -np.inf, 0.0)
    plane = rng.integers(0, 4, (3, n)) / 64.0
    for rows in ([], [1], [0, 2], [2, 0, 1]):
        var_plane = plane if rows else None

        def var_at(keys, rows=rows):
            return plane[rows][:, keys].max(axis=0) if rows else np.zeros(len(keys))

        def var_of(key, rows=rows):
            return max(plane[r, key] for r in rows) if rows else 0.0

        for victim in (-1, int(rng.integers(0, n))):
            for margin in (0.0, 0.5, 3.0):
                want = (propose.top(score, w, apen, m) if victim < 0 else
                        propose.admitted(score, w, apen, victim, margin, m, var_of, var_at))
                got = KERNELS.fast.propose(score, w, apen, var_plane, rows, victim, margin, m)
                assert got == want, (rows, victim, margin)


@pytest.mark.parametrize("seed", range(4))
def test_lowest_evictable_kernel_is_the_numpy_search(seed):
    """Ranks with ties and inf (absent keys), candidates of every size: the same key, and
    the ranks restored after the search."""
    from systems.moe_infinity import ranks as ranks_mod

    rng = np.random.default_rng(seed)
    ranks = np.where(rng.random(96) < 0.4, np.inf, rng.integers(0, 6, 96) / 4.0)
    for frac in (0.0, 0.05, 0.5, 1.0):
        cands = {int(k) for k in np.flatnonzero(rng.random(96) < frac)}
        for c in (cands, None):
            before = ranks.copy()
            got = KERNELS.fast.lowest_evictable(ranks, c)
            assert np.array_equal(ranks, before)
            assert ranks_mod.lowest_evictable(ranks, c) == got
            finite = [k for k in (range(96) if c is None else c) if ranks[k] != np.inf]
            assert got == rule.lowest(ranks, finite)


@pytest.mark.parametrize("n, m", [(1, 1), (5, 4), (514, 4), (1000, 3), (1000, 8)])
def test_match_kernel_keeps_the_m_best_with_lowest_slot_ties(n, m):
    """match's top-m scan (four products at a time once m are kept) over a collection of
    small counts, many equal cosines, and n not a multiple of 4: the ranking of an exact
    sort on (-dot * inv_norm, slot) over the first n slots, and dots gained only there."""
    from systems.moe_infinity.eamc import EAMC

    rng = np.random.default_rng(n + m)
    L, E = 3, 8
    c = EAMC(1000, L, E)
    stored = rng.integers(0, 3, size=(n, L, E)).astype(float)
    for eam in stored:
        c.insert(eam)
    tab = requests.RequestTable(L, E, 1000, 0.5, True, kernels=KERNELS)
    st = tab.new_state()
    kernel = tab.views[st.row].kernel
    keys, counts = [1, 8 + 2, 16 + 5], [2.0, 1.0, 3.0]
    slots, top = kernel.match(c.cols, keys, counts, c.inv_norm[L - 1], c.n, m)
    dots = [sum(k * c.cols[key, j] for key, k in zip(keys, counts)) for j in range(n)]
    scaled = [d * c.inv_norm[L - 1, j] for j, d in enumerate(dots)]
    want = [j for _, j in sorted((-s, j) for j, s in enumerate(scaled))][:m]
    assert list(slots) == want and top == scaled[want[0]]
    query = np.zeros(L * E)
    query[keys] = counts
    assert rule.match(stored, query.reshape(L, E), L, m) == want  # the rule's ranking
    np.testing.assert_array_equal(tab.dots[st.row, :n], dots)
    assert not tab.dots[st.row, n:].any()
