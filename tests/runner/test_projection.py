"""In-memory projections of a trace (Trace.project, load_routing(fields=...)): a run holds only
the per-token fields its system reads, and nothing it records changes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_trace, tiny_model

from core.specs import model_spec_from_dict
from core.trace import TraceError, write_trace
from harness.runner.assembly import load_routing
from harness.runner.config import compose_config
from harness.runner.run import run_config
from harness.runner.run_types import RunMemo

TINY = ["workload.num_requests=3", "workload.prompt_len=16", "workload.output_len=4",
        "progress=false", "trace_cache_dir=null"]


def test_project_keeps_the_identity_and_drops_the_arrays(tmp_path):
    model = tiny_model(layers=2, experts=4, top_k=2)
    tr = random_trace(model, 2, 3, 3, seed=1, with_spec=True)
    tr.weights = np.full(tr.topk.shape, 0.5, np.float16)  # [N, k]
    sha, missing = tr.content_sha256(), tr.missing_fields()
    p = tr.project(["spec_topk"])
    assert p.weights is None and p.spec_topk is tr.spec_topk and p.topk is tr.topk
    assert p.content_sha256() == sha  # the whole trace's, not recomputed without weights
    assert p.missing_fields() == missing  # a dropped field is not missing from the trace
    assert p.dropped_fields == ("weights",) and tr.weights is not None
    assert tr.project(["weights", "spec_topk", "probs"]) is tr  # nothing to drop
    with pytest.raises(TraceError, match="projection without weights"):
        write_trace(p, tmp_path / "p.npz")


def test_load_routing_projects_and_widens_on_demand():
    memo = RunMemo()
    cfg = compose_config(TINY + ["seed=11"])
    model = model_spec_from_dict(cfg["model"], "model")
    lean = load_routing(cfg, model, "measure", fields=("spec_topk",), memo=memo)
    assert lean.probs is None and lean.weights is None and lean.spec_topk is not None
    full = load_routing(cfg, model, "measure", memo=memo)  # every field: generated again
    assert full.probs is not None and full.weights is not None and not full.dropped_fields
    assert full.content_sha256() == lean.content_sha256()
    np.testing.assert_array_equal(full.topk, lean.topk)
    assert load_routing(cfg, model, "measure", fields=("probs",), memo=memo) is full  # covered
    assert load_routing(cfg, model, "measure", fields=("probs",)) is not full  # no memo


def test_a_run_records_the_whole_traces_sha(tmp_path):
    memo = RunMemo()
    cfg = compose_config(TINY + ["system=lru", "seed=12"], results_dir=str(tmp_path))
    model = model_spec_from_dict(cfg["model"], "model")
    result = run_config(cfg, memo)
    (held,) = memo.traces.values()  # lru reads spec_topk only: the held copy dropped the rest
    assert set(held.dropped_fields) == {"weights", "probs"}
    assert len(memo.floors) == 1  # the run's compute floor, kept for the memo's next run
    whole = load_routing(cfg, model, "measure")
    assert result["trace"]["sha256"] == whole.content_sha256()
    assert result["trace"]["missing_fields"] == whole.missing_fields()
