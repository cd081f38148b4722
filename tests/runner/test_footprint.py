"""The runner's memory estimate (harness/runner/footprint.py): trace sizes against generated
traces' own array sizes, sizes and accesses by hand, the refusal naming its key (through
check_fits and through the CLI, results folder untouched), and one run's estimate against its
peak RSS measured in a child process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, snapshot

from core.specs import SpecError, model_spec_from_dict
from core.targets import build_target
from core.trace import ARRAY_FIELDS, read_trace, write_trace
from core.trace_file import declared_arrays
from harness.runner import footprint as fp
from harness.runner.config import compose_config
from harness.runner.footprint_sizes import (
    HEADER_OBJECT_FACTOR,
    REQUEST_OBJECT_BYTES,
    file_size,
    synthetic_size,
    union_size,
)
from systems.base import System
from workloads.synthetic import SyntheticConfig, generate_trace

GIB = 2**30


def _setup(*overrides: str):
    cfg = compose_config(["trace_cache_dir=null", *overrides])
    return (cfg, model_spec_from_dict(cfg["model"], "model"),
            build_target(cfg["system"], "system", System))


def _array_bytes(tr) -> int:
    return sum(getattr(tr, f).nbytes for f in ARRAY_FIELDS if getattr(tr, f) is not None)


@pytest.mark.parametrize("model_name", ["deepseek_v2_lite", "switch_base_128", "deepseek_v3"])
def test_trace_bytes_are_a_generated_trace_arrays(model_name):
    """Decoder-only uint8 ids, encoder-decoder, uint16 ids (256 experts): the estimate's
    arrays are the generated trace's, byte for byte, plus the request objects."""
    _, model, _ = _setup(f"model={model_name}")
    w = SyntheticConfig(num_requests=3, prompt_len=5, output_len=3, embed_dim=8)
    tr = generate_trace(model, w)
    size = synthetic_size(w, model, ("spec_topk",), batch=1)
    assert size.full_bytes == _array_bytes(tr) + 3 * REQUEST_OBJECT_BYTES
    kept = tr.project({"spec_topk"})
    assert size.kept_bytes == _array_bytes(kept) + 3 * REQUEST_OBJECT_BYTES
    assert size.blocks == len(tr.block_offsets) - 1 and size.requests == 3


def test_sizes_and_accesses_by_hand():
    """DeepSeek-V2-Lite (26 layers, 64 experts, top-6), 3 requests, prompt 4, output 2."""
    cfg, model, system = _setup("system=lru", "workload.num_requests=3", "workload.prompt_len=4",
                                "workload.output_len=2", "+workload.embed_dim=8")
    w = SyntheticConfig(num_requests=3, prompt_len=4, output_len=2, embed_dim=8)
    size = synthetic_size(w, model, ("spec_topk",), batch=1)
    # rows 3 * (26 * 4 + 26) = 390, blocks 3 * 2 * 26 = 156; topk and spec_topk 390 * 6,
    # weights 390 * 6 * 2, probs 156 * 64 * 2; offsets (157 + 4) * 8, per request 17 + 16
    assert size.full_bytes == 2340 + 2340 + 4680 + 19968 + 1288 + 3 * 33 + 1200 == 31915
    assert size.kept_bytes == 31915 - 4680 - 19968 == 7267
    # per request and layer: prefill union 64 * (1 - (58/64)**4) = 20.83099, one decode 6
    assert size.accesses == round(3 * 26 * (20.830993652 + 6)) == 2093
    est = fp.estimate(cfg, model, system)
    assert est.phase == "replaying the trace"
    assert est.total_bytes == fp.BASE_BYTES + 7267 + 2093 * (6 + 54) + 2093 * 110
    assert est.total_bytes == sum(est.parts.values())


def test_union_and_batched_accesses_by_hand():
    _, model, _ = _setup()
    assert union_size(0, 64, 6) == 0 and union_size(2, 64, 6) == pytest.approx(11.4375)
    assert union_size(1, 64, 6) == pytest.approx(6) and union_size(10**6, 64, 6) == 64
    # 4 requests, prompt 1, output 3, batch 2 arriving at once: 2 groups x 26 layers x
    # (prefill of 2 tokens + 2 decode steps of 2 tokens) x 11.4375; alone: 4 x 26 x 3 x 6
    w = SyntheticConfig(num_requests=4, prompt_len=1, output_len=3)
    assert synthetic_size(w, model, (), batch=2).accesses == round(2 * 26 * 3 * 11.4375) == 1784
    spread = SyntheticConfig(num_requests=4, prompt_len=1, output_len=3, arrival_ms=5.0)
    assert synthetic_size(spread, model, (), batch=2).accesses == 4 * 26 * 3 * 6 == 1872


def test_accesses_of_one_token_requests_are_the_engines(tmp_path):
    """Prompt 1, output 1: each request has top-k = 6 experts at each of 26 layers."""
    from harness.runner.run import run_config

    cfg, model, system = _setup("system=on_demand", "workload.num_requests=3",
                                "workload.prompt_len=1", "workload.output_len=1",
                                "progress=false", f"results_dir={tmp_path}")
    w = SyntheticConfig(num_requests=3, prompt_len=1, output_len=1)
    assert synthetic_size(w, model, (), batch=1).accesses == 3 * 26 * 6
    assert run_config(cfg)["metrics"]["accesses"] == 3 * 26 * 6


def test_file_sizes_are_its_declared_arrays(tmp_path):
    _, model, _ = _setup()
    tr = generate_trace(model, SyntheticConfig(num_requests=4, prompt_len=1, output_len=1))
    write_trace(tr, tmp_path / "t.npz")
    back = read_trace(tmp_path / "t.npz")
    arrays = declared_arrays(tmp_path / "t.npz")
    assert {f: s for f, (s, _) in arrays.items() if f != "header_json"} == {
        f: getattr(back, f).shape for f in ARRAY_FIELDS if getattr(back, f) is not None}
    header = int(np.prod(arrays["header_json"][0]))
    size = file_size(arrays, model, ())
    assert size.full_bytes == _array_bytes(back) + header * (1 + HEADER_OBJECT_FACTOR)
    dropped = back.weights.nbytes + back.probs.nbytes + back.spec_topk.nbytes
    assert size.kept_bytes == _array_bytes(back) - dropped + header * HEADER_OBJECT_FACTOR
    assert (size.requests, size.blocks, size.accesses) == (4, 4 * 26, 4 * 26 * 6)


@pytest.mark.fault
@pytest.mark.parametrize("overrides, message", [
    (("workload.num_requests=10000000",),
     r"^workload\.num_requests: 10000000 requests need about \d+\.?\d* TiB .*trace "),
    (("+workload.embed_dim=1000000000",), r"^workload\.embed_dim: 1000000000 embedding"),
    (("workload.prompt_len=1048576", "workload.num_requests=100"), r"^workload\.prompt_len: "),
    (("system=moe_infinity", "calibration_requests=10000000"),
     r"^calibration_requests: 10000000 calibration requests need .*calibration \d"),
])
def test_refusal_names_the_key_and_the_memory(overrides, message):
    cfg, model, system = _setup(*overrides)
    with pytest.raises(SpecError, match=message) as err:
        fp.check_fits(cfg, model, system, available=16 * GIB)
    assert "this machine has 16.0 GiB available" in str(err.value)


def test_table1_fits_and_a_trace_file_is_named(tmp_path):
    cfg, model, system = _setup("experiment=table1", "system=lru")
    assert fp.check_fits(cfg, model, system, available=16 * GIB).total_bytes < GIB
    tr = generate_trace(model, SyntheticConfig(num_requests=2, prompt_len=1, output_len=1))
    write_trace(tr, tmp_path / "t.npz")
    cfg["routing"] = str(tmp_path / "t.npz")
    with pytest.raises(SpecError, match=r"^routing: t\.npz needs about"):
        fp.check_fits(cfg, model, system, available=2**20)


@pytest.mark.fault
@pytest.mark.parametrize("override, key", [("workload.num_requests=10000000",
                                            "workload.num_requests: 10000000 requests"),
                                           ("+workload.embed_dim=1000000000",
                                            "workload.embed_dim: 1000000000")])
def test_cli_refuses_before_generating_and_writes_nothing(tmp_path, override, key):
    results = tmp_path / "results"
    (results / "earlier").mkdir(parents=True)
    (results / "earlier" / "result.json").write_text("{}\n")
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "moebench.cli", override,
                           f"results_dir={results}", "trace_cache_dir=null", "progress=false"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"moebench: error: {key}"), done.stderr
    assert "available (MemAvailable)" in done.stderr and "Traceback" not in done.stderr
    assert snapshot(tmp_path) == before


def test_estimate_is_within_30_percent_of_a_measured_run():
    """100 requests of the Table 1 setting under lru, run in a fresh child (about 4 s)."""
    from harness.bench.memory import TOLERANCE, estimate_bytes, measure_peak

    overrides = ("experiment=table1", "system=lru", "workload.num_requests=100")
    got = measure_peak(overrides)
    assert got["status"] == "valid"
    assert abs(estimate_bytes(overrides)["bytes"] / got["peak_bytes"] - 1) <= TOLERANCE == 0.30
