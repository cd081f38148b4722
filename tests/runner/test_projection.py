"""In-memory projections of a trace (Trace.project, load_routing(fields=...)): a run holds only
the per-token fields its system reads, and nothing it records changes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_trace, tiny_model

from core.specs import model_spec_from_dict
from core.trace import TraceError, write_trace
from harness.runner import run as runner
from harness.runner.config import compose_config

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
    runner._TRACE_MEMO.clear()
    cfg = compose_config(TINY + ["seed=11"])
    model = model_spec_from_dict(cfg["model"], "model")
    lean = runner.load_routing(cfg, model, "measure", fields=("spec_topk",))
    assert lean.probs is None and lean.weights is None and lean.spec_topk is not None
    full = runner.load_routing(cfg, model, "measure")  # every field: generated again
    assert full.probs is not None and full.weights is not None and not full.dropped_fields
    assert full.content_sha256() == lean.content_sha256()
    np.testing.assert_array_equal(full.topk, lean.topk)
    assert runner.load_routing(cfg, model, "measure", fields=("probs",)) is full  # covered
    runner._TRACE_MEMO.clear()


def test_a_run_records_the_whole_traces_sha(tmp_path):
    runner._TRACE_MEMO.clear()
    cfg = compose_config(TINY + ["system=lru", "seed=12"], results_dir=str(tmp_path))
    model = model_spec_from_dict(cfg["model"], "model")
    result = runner.run_config(cfg)
    kept = runner._TRACE_MEMO  # lru reads spec_topk only: the held copy dropped the rest
    (held,) = [t for t in kept.values()]
    assert set(held.dropped_fields) == {"weights", "probs"}
    runner._TRACE_MEMO.clear()
    whole = runner.load_routing(cfg, model, "measure")
    assert result["trace"]["sha256"] == whole.content_sha256()
    assert result["trace"]["missing_fields"] == whole.missing_fields()
    runner._TRACE_MEMO.clear()
