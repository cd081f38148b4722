"""Every summary metric in result.json recomputed independently from the parquet files.

Definitions (the metrics issue): an access is one (iteration, layer, expert) in the union of
the iteration's tokens, classed hit / late / miss; hit rate = hits / accesses (also over
prefill and decode iterations apart); prefetch precision = prefetch transfers used / issued;
recall = first uses of prefetched copies that were ready / first uses of prefetched or
demand-fetched copies; churn, prefetch counts and spec recall as tests/metric_refs.py; per request
TTFT = first token - arrival, E2E = last token - arrival, TPOT = (E2E - TTFT) / (tokens - 1),
reported as mean, p50, p90, p99 (numpy linear percentiles); tokens/s = tokens / (last token -
first arrival); H2D bytes per token = transfer bytes (timed preloads too) / tokens; GPU stall
per token = sum(start - need) / tokens (decode: over decode accesses and decode tokens).

The recomputation below reads only the parquet files, the trace (the run's input) and the
config's arrival spacing, and joins tables by id itself rather than trusting joined columns.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
from metric_refs import churn_reference, iterations, spec_recall_reference

from core.specs import model_spec_from_dict
from core.trace import write_trace
from harness.runner.config import compose_config
from harness.runner.parquet_io import read_tables
from harness.runner.run import load_routing, run_config
from harness.sim.recorder import CLASS_NAMES, KIND_NAMES

HIT, LATE, MISS = (CLASS_NAMES.index(n) for n in ("hit", "late", "miss"))
PREFETCH, DEMAND, PRELOAD = (KIND_NAMES.index(n) for n in ("prefetch", "demand", "preload"))
TINY = ["workload.num_requests=4", "workload.prompt_len=16", "workload.output_len=4",
        "calibration_requests=2", "progress=false"]
# lru: requests 40 ms apart, batch 1; on_demand: static batch of 2 (decode unions span two
# requests' tokens). An 8 GiB expert cache holds 496 of DeepSeek-V2-Lite's 1,664 experts
# (16.5 MiB each): decode iterations (<= 2 x 6 x 26 = 312 experts) can hit, prefills evict.
# lru_file: the lru case's trace written to a file with every arrival 100 ms later and replayed
# with routing=<file> (the first arrival is not 0, so makespan must subtract it).
# lru_batch2: requests 5 ms apart at batch 2 in the 8 GiB cache: a request's prefill runs
# between another's decode steps, and prefetches evict (churn is not vacuous).
CASES = {
    "lru": ["system=lru", "workload.arrival_ms=40.0"],
    "lru_file": ["system=lru", "workload.arrival_ms=40.0"],
    "on_demand": ["system=on_demand", "max_batch=2", "expert_cache_gb=8"],
    "lru_batch2": ["system=lru", "max_batch=2", "expert_cache_gb=8", "workload.arrival_ms=5.0"],
}
SHIFT_MS = 100.0
REL = 1e-9


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(f"metrics_{name}")
    cfg = compose_config([*CASES[name], *TINY], run_name=name, results_dir=str(out))
    model = model_spec_from_dict(cfg["model"])
    arrival = np.arange(cfg["workload"]["num_requests"]) * float(cfg["workload"]["arrival_ms"])
    if name == "lru_file":
        synth = load_routing(cfg, model, "measure")
        shifted = dataclasses.replace(synth, arrival_ms=synth.arrival_ms + SHIFT_MS, _sha=None)
        write_trace(shifted, out / "shifted.npz")
        cfg["routing"] = str(out / "shifted.npz")
        arrival = arrival + SHIFT_MS
    result = run_config(cfg)
    assert result["status"] == "valid", result["reason"]
    run_dir = out / "default" / name
    tables = read_tables(run_dir)  # every column, derived ones recomputed from the files
    for table in ("accesses", "tokens"):  # the files' own strings, not a numeric column
        ids = pq.read_table(run_dir / f"{table}.parquet", columns=["request_id"])
        tables[table]["request_id"] = ids.column(0).to_numpy()
    trace = load_routing(cfg, model, "measure")
    assert trace.content_sha256() == result["trace"]["sha256"]
    assert np.array_equal(trace.arrival_ms, arrival)
    return {"name": name, "cfg": cfg, "result": result, "m": result["metrics"],
            "acc": tables["accesses"], "tok": tables["tokens"], "tr": tables["transfers"],
            "trace": trace, "arrival": arrival, "expert_bytes": model.expert_bytes}


def approx(x):
    return pytest.approx(x, rel=REL, abs=1e-12)


def _iterations(tok) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for it, r, s in zip(tok["iteration"].tolist(), tok["request"].tolist(),
                        tok["token_index"].tolist()):
        out.setdefault(it, []).append((r, s))
    return out


def _prefill_iterations(tok) -> set[int]:
    """An iteration is a prefill when its tokens are first tokens; never mixed."""
    out = set()
    for it, members in _iterations(tok).items():
        first = {s == 0 for _, s in members}
        assert len(first) == 1, f"iteration {it} mixes prefill and decode"
        if first == {True}:
            out.add(it)
    return out


# ---- the access table itself ----------------------------------------------------------------

def test_accesses_are_the_union_of_each_iterations_tokens(run):
    acc, tok, trace = run["acc"], run["tok"], run["trace"]
    L, S = trace.num_layers, trace.step_offsets
    expected = set()
    for it, members in _iterations(tok).items():
        for layer in range(L):
            union = set()
            for r, s in members:
                b = (int(S[r]) + s) * L + layer
                rows = trace.topk[trace.block_offsets[b]:trace.block_offsets[b + 1]]
                union |= set(rows.ravel().tolist())
            expected |= {(it, layer, e) for e in union}
    got = list(zip(acc["iteration"].tolist(), acc["layer"].tolist(), acc["expert"].tolist()))
    assert len(got) == len(set(got)), "an (iteration, layer, expert) recorded twice"
    assert set(got) == expected
    assert run["m"]["accesses"] == len(expected)


def test_tokens_table_matches_the_trace(run):
    tok, trace = run["tok"], run["trace"]
    count = np.bincount(tok["request"], minlength=trace.num_requests)
    assert count.tolist() == trace.output_len.tolist()
    for r in range(trace.num_requests):
        idx = np.sort(tok["token_index"][tok["request"] == r])
        assert idx.tolist() == list(range(int(trace.output_len[r])))


def test_accounting_identities(run):
    m, acc, tr, eb = run["m"], run["acc"], run["tr"], run["expert_bytes"]
    assert m["hits"] + m["late_prefetches"] + m["misses"] == m["accesses"] == len(acc["class"])
    assert set(np.unique(acc["class"]).tolist()) <= {HIT, LATE, MISS}
    assert set(np.unique(acc["bytes"]).tolist()) <= {0, eb}
    assert m["expert_bytes"] == eb
    assert (tr["bytes"] == eb).all()
    # Bytes are charged once per copy (preloads are copies too), at its first use.
    assert int(acc["bytes"].sum()) == eb * int((tr["first_use_access"] >= 0).sum())
    assert m["misses"] > 0 and m["hits"] > 0  # the configuration exercises both


def test_access_timing_is_consistent(run):
    acc, tr = run["acc"], run["tr"]
    row_of = {int(t): i for i, t in enumerate(tr["transfer_id"])}
    rows = np.array([row_of[int(t)] for t in acc["transfer_id"]])
    ready, kind = tr["ready_ms"][rows], tr["kind"][rows]
    assert np.array_equal(acc["ready_ms"], ready)
    assert np.array_equal(acc["issued_by"], kind)
    # An expert starts when both the compute stream and its copy are there.
    assert np.allclose(acc["start_ms"], np.maximum(acc["need_ms"], ready), rtol=0, atol=1e-9)
    assert (acc["start_ms"] - acc["need_ms"] >= 0).all()
    cls = acc["class"]
    assert (ready[cls == HIT] <= acc["need_ms"][cls == HIT]).all()
    assert (ready[cls == LATE] > acc["need_ms"][cls == LATE]).all()
    assert (kind[cls == LATE] == PREFETCH).all()
    assert (kind[cls == MISS] == DEMAND).all()
    # Every demand fetch is used, at a miss.
    demand = tr["kind"] == DEMAND
    assert (tr["first_use_access"][demand] >= 0).all()
    assert (cls[tr["first_use_access"][demand]] == MISS).all()


# ---- summary metrics recomputed -------------------------------------------------------------

def test_counts_and_rates(run):
    m, acc, tr = run["m"], run["acc"], run["tr"]
    cls = acc["class"]
    hits, late, misses = (int(np.sum(cls == c)) for c in (HIT, LATE, MISS))
    assert (m["hits"], m["late_prefetches"], m["misses"]) == (hits, late, misses)
    assert m["accesses"] == hits + late + misses
    assert m["hit_rate"] == approx(hits / (hits + late + misses))
    pref = tr["kind"] == PREFETCH
    used = pref & (tr["first_use_access"] >= 0)
    assert m["prefetches_issued"] == int(pref.sum())
    assert m["prefetches_used"] == int(used.sum())
    if pref.sum():
        assert m["prefetch_precision"] == approx(used.sum() / pref.sum())
    else:
        assert m["prefetch_precision"] is None
    assert m["demand_fetches"] == int(np.sum(tr["kind"] == DEMAND))
    if run["name"] == "lru":
        assert pref.sum() > 0  # speculative prefetch ran, so precision was computed
    if run["name"] == "on_demand":
        assert pref.sum() == 0 and m["prefetch_recall"] in (0.0, None)


def test_prefetch_recall(run):
    # Would-be misses: accesses that are the first use of a prefetched or demand-fetched copy;
    # turned into hits: those of class hit (a demand fetch's first use is its miss).
    m, acc, tr = run["m"], run["acc"], run["tr"]
    kind_of = dict(zip(tr["transfer_id"].tolist(), tr["kind"].tolist()))
    first_use = set(tr["first_use_access"][tr["kind"] != PRELOAD].tolist()) - {-1}
    would_miss = turned = 0
    for a, (tid, cls) in enumerate(zip(acc["transfer_id"].tolist(), acc["class"].tolist())):
        if a in first_use:
            assert kind_of[tid] in (PREFETCH, DEMAND)
            would_miss += 1
            turned += cls == HIT
    assert would_miss > 0
    assert m["prefetch_recall"] == approx(turned / would_miss)


def _in_prefill(table, tok) -> np.ndarray:
    """Per row of an accesses or tokens table: its iteration is a prefill (from the tokens)."""
    prefill = _prefill_iterations(tok)
    return np.array([it in prefill for it in table["iteration"].tolist()], dtype=bool)


def test_hit_rate_by_phase(run):
    m, acc, tok = run["m"], run["acc"], run["tok"]
    in_prefill = _in_prefill(acc, tok)
    for phase, key in ((True, "hit_rate_prefill"), (False, "hit_rate_decode")):
        cls = acc["class"][in_prefill == phase]
        assert m[key] == approx(np.sum(cls == HIT) / len(cls))


def test_prefetch_counts(run):
    m, acc, tr, tok = run["m"], run["acc"], run["tr"], run["tok"]
    its, prefill = iterations(tok), _prefill_iterations(tok)
    used = unused = late = in_decode = 0
    for kind, first, issue in zip(tr["kind"].tolist(), tr["first_use_access"].tolist(),
                                  tr["issue_ms"].tolist()):
        if kind != PREFETCH:
            continue
        used, unused = used + (first >= 0), unused + (first < 0)
        late += first >= 0 and int(acc["class"][first]) == LATE
        owner = max(i for i, (start, _) in its.items() if start <= issue)
        in_decode += owner not in prefill
    n_decode = sum(1 for it in tok["iteration"].tolist() if it not in prefill)
    assert (m["prefetches_used"], m["prefetches_unused"], m["prefetches_late"]) == (
        used, unused, late)
    assert m["prefetches_late"] == m["late_prefetches"]  # a late access waits on a prefetch
    assert m["prefetches_per_decode_token"] == approx(in_decode / n_decode)
    assert m["unused_prefetch_bytes_per_token"] == approx(
        unused * run["expert_bytes"] / len(tok["request"]))
    if run["name"] == "on_demand":
        assert m["prefetches_per_decode_token"] == 0.0 and m["prefetch_churn"] is None


def test_prefetch_churn(run):
    m = run["m"]
    churned, total = churn_reference(run["tr"], run["tok"])
    assert m["prefetch_churn"] == (approx(churned / total) if total else None)
    if run["name"] == "lru_batch2":
        assert 0 < churned < total  # the case exercises both sides of the rule
        # and a request's previous iteration is not always the one before (a prefill between)
        its = iterations(run["tok"])
        step_it = {m: it for it, (_, ms) in its.items() for m in ms}
        assert any(step_it[(r, s - 1)] != it - 1 for it, (_, ms) in its.items()
                   for r, s in ms if s > 0)


def test_spec_recall(run):
    # lru reads spec_topk (the synthetic trace has it); on_demand reads no guesses.
    want = spec_recall_reference(run["trace"]) if run["name"] != "on_demand" else None
    assert run["m"]["spec_recall"] == (None if want is None else approx(want))
    if run["name"] != "on_demand":
        assert 0 < want < 1


def _percentiles(values: list[float]) -> dict:
    v = np.array(values, dtype=np.float64)
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50, method="linear")),
            "p90": float(np.percentile(v, 90, method="linear")),
            "p99": float(np.percentile(v, 99, method="linear"))}


def test_latencies(run):
    m, tok, arrival = run["m"], run["tok"], run["arrival"]
    ttft, e2e, tpot, queue = [], [], [], []
    for r in range(len(arrival)):
        times = tok["time_ms"][tok["request"] == r]
        idx = tok["token_index"][tok["request"] == r]
        starts = tok["iteration_start_ms"][tok["request"] == r]
        queue.append(float(starts[idx == 0][0]) - arrival[r])
        first = float(times[idx == 0][0])
        last = float(times.max())
        ttft.append(first - arrival[r])
        e2e.append(last - arrival[r])
        if len(times) > 1:
            tpot.append((e2e[-1] - ttft[-1]) / (len(times) - 1))
    for name, values in (("ttft_ms", ttft), ("e2e_ms", e2e), ("tpot_ms", tpot),
                         ("queue_ms", queue)):
        want = _percentiles(values)
        for stat in ("mean", "p50", "p90", "p99"):
            assert m[name][stat] == approx(want[stat]), (name, stat)
    assert all(t > 0 for t in ttft)
    assert all(q >= 0 for q in queue)


def test_every_metric_is_covered(run):
    # A metric added to harness/sim/metrics.py must get an independent recomputation here
    # (compute_floor_ms and headroom: tests/runner/test_floor_metric.py).
    covered = {"accesses", "hits", "late_prefetches", "misses", "hit_rate",
               "hit_rate_decode", "hit_rate_prefill", "prefetch_churn", "prefetches_unused",
               "prefetches_late", "prefetches_per_decode_token",
               "unused_prefetch_bytes_per_token", "spec_recall",
               "prefetches_issued", "prefetches_used", "prefetch_precision", "prefetch_recall",
               "demand_fetches", "h2d_bytes", "h2d_bytes_per_token", "h2d_gb_per_token",
               "preload_bytes", "gpu_stall_ms", "gpu_stall_ms_per_token",
               "decode_stall_ms_per_token", "tokens", "tokens_per_s", "makespan_ms", "queue_ms",
               "ttft_ms", "tpot_ms", "e2e_ms", "expert_bytes", "peak_expert_cache_bytes",
               "slo_ttft_ms", "slo_tpot_ms", "requests_completed", "requests_meeting_slo",
               "requests_meeting_ttft_slo", "requests_meeting_tpot_slo", "slo_attainment",
               "goodput_rps", "requests_per_s", "compute_floor_ms", "headroom"}
    assert set(run["m"]) == covered


def test_slo_goodput(run):
    # Independent recomputation (docs/metrics.md, "SLO goodput"); hand-worked table in
    # tests/workloads/test_online.py.
    m, tok, arrival, cfg = run["m"], run["tok"], run["arrival"], run["cfg"]
    assert (m["slo_ttft_ms"], m["slo_tpot_ms"]) == (cfg["slo_ttft_ms"], cfg["slo_tpot_ms"])
    ttft_ok = tpot_ok = both = 0
    for r in range(len(arrival)):
        times = np.sort(tok["time_ms"][tok["request"] == r])
        a = times[0] - arrival[r] <= cfg["slo_ttft_ms"]
        b = len(times) == 1 or (times[-1] - times[0]) / (len(times) - 1) <= cfg["slo_tpot_ms"]
        ttft_ok, tpot_ok, both = ttft_ok + a, tpot_ok + b, both + (a and b)
    makespan_s = (float(tok["time_ms"].max()) - float(arrival.min())) / 1e3
    assert m["requests_completed"] == len(arrival)
    assert (m["requests_meeting_ttft_slo"], m["requests_meeting_tpot_slo"],
            m["requests_meeting_slo"]) == (ttft_ok, tpot_ok, both)
    assert m["goodput_rps"] == approx(both / makespan_s)
    assert m["requests_per_s"] == approx(len(arrival) / makespan_s)
    assert m["slo_attainment"] == approx(both / len(arrival))


def test_peak_cache_bytes_from_transfers(run):
    # Slots are reserved when a copy is issued and freed at eviction; at equal times the
    # eviction comes first (a load evicts its victim, then reserves).
    tr, eb = run["tr"], run["expert_bytes"]
    events = [(t, 1) for t in tr["issue_ms"]] + [(t, -1) for t in tr["evict_ms"] if t == t]
    level = peak = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        level += d
        peak = max(peak, level)
    assert run["m"]["peak_expert_cache_bytes"] == peak * eb


def test_throughput_and_bytes(run):
    m, tok, tr, acc, arrival = run["m"], run["tok"], run["tr"], run["acc"], run["arrival"]
    n_tok = len(tok["request"])
    assert m["tokens"] == n_tok == int(run["trace"].output_len.sum())
    makespan = float(tok["time_ms"].max()) - float(arrival.min())
    assert m["makespan_ms"] == approx(makespan)
    assert m["tokens_per_s"] == approx(n_tok / (makespan / 1000.0))
    loads = int(tr["bytes"].sum())  # preloads are timed copies too
    assert m["h2d_bytes"] == loads
    assert m["h2d_bytes_per_token"] == approx(loads / n_tok)
    assert m["h2d_gb_per_token"] == approx(loads / n_tok / 1e9)
    assert m["preload_bytes"] == int(tr["bytes"][tr["kind"] == PRELOAD].sum())
    stall = float(np.sum(acc["start_ms"] - acc["need_ms"]))
    assert m["gpu_stall_ms"] == approx(stall)
    assert m["gpu_stall_ms_per_token"] == approx(stall / n_tok)


def test_decode_stall(run):
    m, tok, acc = run["m"], run["tok"], run["acc"]
    is_pre_acc, is_pre_tok = _in_prefill(acc, tok), _in_prefill(tok, tok)
    assert np.array_equal(acc["prefill"], is_pre_acc)
    assert np.array_equal(tok["prefill"], is_pre_tok)
    decode_stall = float(np.sum((acc["start_ms"] - acc["need_ms"])[~is_pre_acc]))
    n_decode = int((~is_pre_tok).sum())
    # 4 requests x 4 tokens, the first of each from a prefill: 12 decode tokens.
    assert n_decode == 12
    assert m["decode_stall_ms_per_token"] == approx(decode_stall / n_decode)


def test_batching_shape(run):
    """The two cases really differ in the way they are meant to."""
    its = _iterations(run["tok"])
    widest = max(len(v) for v in its.values())
    if run["name"] in ("on_demand", "lru_batch2"):
        assert widest == 2
        assert run["result"]["memory"]["expert_cache_bytes"] == 8 * 2**30
    else:
        assert widest == 1
        assert run["arrival"][1] - run["arrival"][0] == 40.0
    if run["name"] == "lru_file":
        assert run["result"]["trace"]["source"] == "shifted.npz"
        assert run["arrival"][0] == SHIFT_MS


def test_request_ids_name_the_trace_requests(run):
    ids = np.array(run["trace"].request_ids, dtype=object)
    for table in ("acc", "tok"):
        t = run[table]
        assert list(t["request_id"]) == list(ids[t["request"]])
