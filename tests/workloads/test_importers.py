"""Bring your own routing: JSONL/CSV records and nested per-request JSONL -> trace v1, the
teacher-forced decode replay, input errors, the shared samples, and Table 1 on an import."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import shared

from core.trace import TraceError, read_trace, write_trace
from workloads.importers import RoutingImportError, main, read_routing, to_trace

SHAPE = {"num_moe_layers": 2, "num_experts": 4, "top_k": 2}
# request "a": 3 tokens; layer 0 ids (0,1) (1,2) (2,3), layer 1 ids (3,0) (0,1) (1,2)
RECORDS = [{"request_id": "a", "layer": lay, "token_pos": t, "experts": [(t + 3 * lay) % 4,
            (t + 3 * lay + 1) % 4], "weights": [0.75, 0.25], "token_text": f"w{t}"}
           for lay in (0, 1) for t in (2, 0, 1)]  # any order


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_records_with_teacher_forced_decode(tmp_path):
    reqs, sha = read_routing(_write_jsonl(tmp_path / "r.jsonl", RECORDS))
    assert len(sha) == 64 and [r.id for r in reqs] == ["a"]
    tr = to_trace(reqs, SHAPE, "r.jsonl", decode_tokens=1)
    # 3 tokens, last one replayed as decode: prompt 2, output 2 (prefill + 1 decode step)
    assert tr.prompt_len.tolist() == [2] and tr.output_len.tolist() == [2]
    assert tr.block_rows(0, 0, 0).tolist() == [[0, 1], [1, 2]]
    assert tr.block_rows(0, 0, 1).tolist() == [[3, 0], [0, 1]]
    assert tr.block_rows(0, 1, 0).tolist() == [[2, 3]] and tr.block_rows(0, 1, 1).tolist() == [
        [1, 2]]
    assert np.allclose(tr.weights.astype(float), [[0.75, 0.25]] * 6)
    assert not tr.synthetic and tr.routing_source == "imported:r.jsonl"
    assert tr.meta["import"]["teacher_forced_decode"] is True
    whole = to_trace(reqs, SHAPE, "r.jsonl", decode_tokens=10)  # cut to T - 1 = 2
    assert whole.prompt_len.tolist() == [1] and whole.output_len.tolist() == [3]


def test_csv_records_and_round_trip(tmp_path):
    lines = ["prompt_id,layer_id,position,expert_ids"]
    lines += [f"p{r},{lay},{t},{t % 4} {(t + 1) % 4}" for r in (1, 2) for lay in (5, 7)
              for t in range(4)]  # layer ids 5, 7 -> MoE layers 0, 1
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    assert main([str(tmp_path / "r.csv"), str(tmp_path / "t.npz"), "--model",
                 "mixtral_8x7b"]) == 2  # 2 layers, Mixtral has 32: clear error, no file
    assert not (tmp_path / "t.npz").exists()
    reqs, _ = read_routing(tmp_path / "r.csv")
    tr = to_trace(reqs, SHAPE, "r.csv", decode_tokens=2)
    write_trace(tr, tmp_path / "t.npz")
    back = read_trace(tmp_path / "t.npz")
    assert back.request_ids == ["p1", "p2"] and back.weights is None
    assert back.block_rows(1, 2, 1).tolist() == [[3, 0]]  # p2, last token (t = 3), layer 7


@pytest.mark.parametrize("edit, message", [
    (lambda rs: rs[0].pop("layer"), "r.jsonl:1: field 'layer' missing"),
    (lambda rs: rs[1].update(experts=[1]), "r.jsonl:2: field 'experts': 1 ids, expected 2"),
    (lambda rs: rs.append(dict(rs[0])), "layer 0 position 2 appears twice"),
    (lambda rs: rs[2].update(experts="x y"), "r.jsonl:3: field 'experts'"),
])
def test_bad_records_name_file_and_line(tmp_path, edit, message):
    rows = [dict(r) for r in RECORDS]
    edit(rows)
    with pytest.raises(RoutingImportError, match=message):
        read_routing(_write_jsonl(tmp_path / "r.jsonl", rows))


def test_gaps_ids_and_shape_are_checked(tmp_path):
    rows = [r for r in RECORDS if not (r["layer"] == 1 and r["token_pos"] == 1)]
    reqs, _ = read_routing(_write_jsonl(tmp_path / "g.jsonl", rows))
    with pytest.raises(TraceError, match="no record for layer 1 position 1"):
        to_trace(reqs, SHAPE, "g.jsonl")
    tr = to_trace(reqs, SHAPE, "g.jsonl", gaps="drop")  # position 1 removed at every layer
    assert tr.prompt_len.tolist() == [2] and tr.block_rows(0, 0, 0).tolist() == [[0, 1], [2, 3]]
    with pytest.raises(TraceError, match="expert id 3 >= num_experts 3"):
        to_trace(read_routing(_write_jsonl(tmp_path / "r.jsonl", RECORDS))[0],
                 {**SHAPE, "num_experts": 3}, "r")
    with pytest.raises(TraceError, match="the model needs 3 MoE layers"):
        to_trace(reqs, {**SHAPE, "num_moe_layers": 3}, "g", gaps="drop")
    dup = [dict(r, experts=[1, 1]) if i == 0 else r for i, r in enumerate(RECORDS)]
    with pytest.raises(TraceError, match="repeats an expert id"):
        to_trace(read_routing(_write_jsonl(tmp_path / "d.jsonl", dup))[0], SHAPE, "d")


def test_nested_gzip_layout(tmp_path):
    rows = [{"prompt_id": 7, "prompt": "hi there", "experts": [[[0, 1], [2, 3]], [[1, 2],
                                                                                   [0, 3]]]}]
    with gzip.open(tmp_path / "n.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(rows[0]) + "\n")
    reqs, _ = read_routing(tmp_path / "n.jsonl.gz")
    tr = to_trace(reqs, SHAPE, "n.jsonl.gz", decode_tokens=1)
    assert tr.prompts == ["hi there"] and tr.request_ids == ["7"]
    assert tr.block_rows(0, 1, 1).tolist() == [[0, 3]]


def test_shared_samples_import():
    mixtral = shared("routing_mixtral_sample", "routing_raw.jsonl")
    deepseek = shared("routing_deepseek_v2_lite_sample",
                      "prefill_routing_prompts_0001_1000.jsonl.gz")
    reqs, _ = read_routing(mixtral, duplicates="first")
    assert len(reqs) == 1 and reqs[0].ids.shape == (32, 135, 2)
    assert (reqs[0].ids < 0).any(axis=2).sum() == 122  # recorded gaps (layer, position)
    tr = to_trace(reqs, {"num_moe_layers": 32, "num_experts": 8, "top_k": 2}, "mx",
                  gaps="drop")
    assert tr.meta["import"]["dropped_positions"] == 135 - int(tr.prompt_len[0])
    reqs, _ = read_routing(deepseek)
    assert len(reqs) == 999
    first = json.loads(gzip.open(deepseek, "rt").readline())
    tr = to_trace(reqs[:20], {"num_moe_layers": 26, "num_experts": 64, "top_k": 6}, "ds",
                  decode_tokens=8)
    n = len(first["tokens"])
    assert int(tr.prompt_len[0]) + int(tr.output_len[0]) - 1 == n
    assert tr.block_rows(0, 8, 25).tolist() == [first["experts"][25][n - 1]]
    assert tr.prompts[0] == first["prompt"]


def test_table1_header_names_an_imported_trace(tmp_path):
    from analysis.table1 import main as table1_main
    from harness.runner.config import compose_config
    from harness.runner.run import run_config

    rng = np.random.default_rng(0)
    rows = [{"request_id": f"q{r}", "layer": lay, "token_pos": t,
             "experts": rng.choice(64, 6, replace=False).tolist()}
            for r in range(2) for lay in range(26) for t in range(12)]
    src = _write_jsonl(tmp_path / "mine.jsonl", rows)
    assert main([str(src), str(tmp_path / "mine.npz"), "--model", "deepseek_v2_lite",
                 "--decode-tokens", "4"]) == 0
    for system in ("lru", "on_demand"):
        run_config(compose_config(["experiment=table1", f"system={system}", "progress=false",
                                   f"routing={tmp_path / 'mine.npz'}"],
                                  run_name=system, results_dir=str(tmp_path)))
    assert table1_main([str(tmp_path / "table1"), "--allow-partial"]) == 0  # a subset of systems
    md = (tmp_path / "table1" / "table1.md").read_text()
    assert "routing from mine.npz (imported:mine.jsonl)" in md and "SYNTHETIC" not in md


def test_request_range_is_parsed_and_checked(tmp_path):
    from workloads.importers import _span

    assert _span("1:3", 3) == (1, 3) and _span(":2", 3) == (0, 2) and _span("2:", 3) == (2, 3)
    for bad in ("2:2", "0:4", "x", "1:2:3"):
        with pytest.raises(ValueError, match="--requests"):
            _span(bad, 3)
    src = _write_jsonl(tmp_path / "r.jsonl", RECORDS)  # one request: 1:2 is out of range
    out = tmp_path / "t.npz"
    assert main([str(src), str(out), "--model", "deepseek_v2_lite", "--requests", "1:2"]) == 2
    assert not out.exists()


# ---- strict values: (edit of the 6 records, file:line: field message, written by hand) ------
def _set(i, **fields):
    return lambda rs: rs[i].update(fields)


NAN, INF = float("nan"), float("inf")  # json.dumps writes NaN / Infinity, json.loads reads them
BAD_VALUES = [
    (_set(1, weights=[NAN, 0.25]), "r.jsonl:2: field 'weights': nan is not a finite number in "
                                   "[0, 65504]"),
    (_set(1, weights=[INF, 0.25]), "r.jsonl:2: field 'weights': inf is not a finite number in "
                                   "[0, 65504]"),
    (_set(2, weights=[-7, 0.25]), "r.jsonl:3: field 'weights': -7 is not a finite number in "
                                  "[0, 65504]"),
    (_set(0, weights=[1e6, 0.25]), "r.jsonl:1: field 'weights': 1000000.0 is not a finite "
                                   "number in [0, 65504]"),
    (_set(0, weights=[True, 0.25]), "r.jsonl:1: field 'weights': expected a list of numbers, "
                                    "got [True, 0.25]"),
    (_set(0, weights=0.5), "r.jsonl:1: field 'weights': expected a list of numbers, got 0.5"),
    (lambda rs: rs[3].pop("weights"), "r.jsonl:4: field 'weights' missing, but line 1 has them "
                                      "(give weights on every record or on none)"),
    (_set(1, experts=[3.7, 1]), "r.jsonl:2: field 'experts': 3.7 is not an integer expert id"),
    (_set(1, experts=[True, 2]), "r.jsonl:2: field 'experts': True is not an integer expert id"),
    (_set(4, experts=[-1, 2]), "r.jsonl:5: field 'experts': expert id -1 < 0"),
    (_set(4, experts=["3", "x"]), "r.jsonl:5: field 'experts': 'x' is not an integer expert id"),
    (_set(0, experts=7), "r.jsonl:1: field 'experts': expected a list of integers, got 7"),
    (_set(0, layer=1.5), "r.jsonl:1: field 'layer': 1.5 is not an integer"),
    (_set(5, token_pos=True), "r.jsonl:6: field 'position': True is not an integer"),
    (_set(5, token_pos=-2), "r.jsonl:6: field 'position': -2 < 0"),
    (_set(0, prompt=5), "r.jsonl:1: field 'prompt': expected a string or null, got int"),
]


@pytest.mark.parametrize("edit, message", BAD_VALUES, ids=[m.split(": ", 1)[1][:40]
                                                            for _, m in BAD_VALUES])
def test_bad_values_are_errors_not_coerced(tmp_path, edit, message):
    rows = [dict(r) for r in RECORDS]
    edit(rows)
    with pytest.raises(RoutingImportError) as err:
        read_routing(_write_jsonl(tmp_path / "r.jsonl", rows))
    assert str(err.value) == message


def test_non_object_line_and_ids_beyond_the_model(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n[1, 2]\n")
    with pytest.raises(RoutingImportError, match=r"^r\.jsonl:2: expected a JSON object \(one "
                                                  r"record\), got list$"):
        read_routing(path)
    # E = 3: the first record (layer 0, token 2) routes to experts 2 and 3
    with pytest.raises(RoutingImportError, match=r"^r\.jsonl:1: field 'experts': expert id 3 "
                                                  r"out of range \[0, 3\)$"):
        read_routing(_write_jsonl(path, RECORDS), num_experts=3)


@pytest.mark.parametrize("experts, message", [
    ([[[0, 1]], [[2, 3.7]]], "expected [layer][token][k] integers of equal lengths"),
    ([[[0, 1]], [[2, True]]], "expected [layer][token][k] integers of equal lengths"),
    ([[[0, 1]], [[2]]], "expected [layer][token][k] integers of equal lengths"),
    ([[[0, 1]], [[-1, 2]]], "expert id -1 out of range [0, 4)"),
    ([[[0, 1]], [[2, 9]]], "expert id 9 out of range [0, 4)"),
    ([[[]], [[]]], "shape (2, 1, 0), expected [layers, tokens >= 1, k >= 1]"),
])
def test_nested_ids_are_strict(tmp_path, experts, message):
    path = tmp_path / "n.jsonl"
    path.write_text(json.dumps({"prompt_id": 1, "experts": [[[0, 1]], [[1, 2]]]}) + "\n"
                    + json.dumps({"prompt_id": 2, "experts": experts}) + "\n")
    with pytest.raises(RoutingImportError) as err:
        read_routing(path, fmt="nested", num_experts=4)
    assert str(err.value) == f"n.jsonl:2: field 'experts': {message}"


@pytest.mark.parametrize("cells, message", [
    ("0,0,3.7 1,", "r.csv:3: field 'experts': '3.7' is not an integer expert id"),
    ("0,0,3 1,nan 0.5", "r.csv:3: field 'weights': 'nan' is not a finite number in [0, 65504]"),
    ("2.0,0,3 1,", "r.csv:3: field 'layer': '2.0' is not an integer"),
])
def test_csv_cells_are_strict(tmp_path, cells, message):
    # the first data row (line 2) is fine and has no weights
    (tmp_path / "r.csv").write_text("layer,position,experts,weights\n0,1,0 1,\n" + cells + "\n")
    with pytest.raises(RoutingImportError) as err:
        read_routing(tmp_path / "r.csv")
    assert str(err.value) == message


def test_weights_are_never_dropped_silently():
    from workloads.importers import RoutedRequest

    ids = np.array([[[0, 1]], [[2, 3]]])  # 2 layers, 1 token, top-2
    with_w = RoutedRequest("a", ids, weights=np.full((2, 1, 2), 0.5, np.float32))
    without = RoutedRequest("b", ids)
    with pytest.raises(TraceError, match=r"^x: field 'weights': some recorded tokens have "
                                         r"weights and some do not"):
        to_trace([with_w, without], SHAPE, "x")
    assert to_trace([with_w], SHAPE, "x").weights.tolist() == [[0.5, 0.5]] * 2
