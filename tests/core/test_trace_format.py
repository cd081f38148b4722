"""Trace format v1: round trip, version and checksum checks, corruption, validation messages.

Every trace here is written out by hand (core.trace.trace_from_routing over literal routing)
and every expected value (shapes, offsets, token counts, messages' request / step / layer) is
worked out from that literal routing, not taken from the code under test.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hand_traces import E, K, build, requests_two
from hypothesis import given, settings
from hypothesis import strategies as st

from core.trace import Trace, TraceError, read_trace, trace_from_routing, write_trace


def with_optionals(tr: Trace) -> Trace:
    """Attach every optional field (before any checksum is computed)."""
    n = len(tr.topk)  # 3+3+1+1 + 1+1+1+1+1+1 = 14 rows
    S, L = 5, 2
    rng = np.random.default_rng(7)
    tr.weights = rng.random((n, K)).astype(np.float16)
    tr.probs = rng.random((S * L, E)).astype(np.float16)
    tr.spec_topk = np.full((n, K), E, dtype=tr.topk.dtype)  # "no guess" everywhere ...
    tr.spec_topk[0] = [2, 3]  # ... except the first token
    tr.embeddings = rng.standard_normal((2, 8)).astype(np.float16)
    tr.has_embedding = np.array([True, False])
    tr.meta["embedder"] = "test-embedder"
    return tr.validate()


def npz_arrays(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a trace file by hand with numpy, letting `edit(arrays, header)` change it."""
    arrays = npz_arrays(src)
    header = json.loads(arrays["header_json"].tobytes().decode())
    edit(arrays, header)
    arrays["header_json"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(dst, **arrays)
    return dst


# ---- shape of a hand-built trace ------------------------------------------------------------

def test_hand_trace_offsets_and_blocks():
    tr = build()
    # steps: r0 has 2, r1 has 3 -> offsets [0, 2, 5]; blocks = 5 steps * 2 layers.
    assert tr.step_offsets.tolist() == [0, 2, 5]
    # tokens per block in order (r0 s0 l0, r0 s0 l1, r0 s1 l0, ...): 3,3,1,1,1,1,1,1,1,1
    assert tr.block_offsets.tolist() == [0, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert tr.topk.shape == (14, 2)
    assert tr.block_rows(0, 0, 1).tolist() == [[3, 0], [0, 2], [1, 3]]
    assert tr.block_rows(1, 2, 0).tolist() == [[1, 3]]
    assert tr.topk.dtype == np.uint8  # 4 experts + sentinel fit a byte


# ---- write / read round trip ----------------------------------------------------------------

ARRAY_NAMES = ("prompt_len", "output_len", "arrival_ms", "step_offsets", "block_offsets",
               "topk", "weights", "probs", "spec_topk", "embeddings", "has_embedding")


def test_round_trip_keeps_every_array_and_sha(tmp_path):
    tr = with_optionals(build())
    path = tmp_path / "two.npz"
    sha = write_trace(tr, path)
    assert len(sha) == 64 and int(sha, 16) >= 0
    back = read_trace(path)
    for name in ARRAY_NAMES:
        a, b = getattr(tr, name), getattr(back, name)
        assert b is not None, name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert back.request_ids == ["r0", "r1"]
    assert back.datasets == ["mmlu", "flan"] and back.tasks == ["algebra", "qa"]
    assert back.prompts == ["two plus two", "why"]
    assert back.meta["embedder"] == "test-embedder"
    assert back.content_sha256() == sha == tr.content_sha256()
    assert back.missing_fields() == []
    assert back.source == "two.npz"
    # The file itself, read by hand: format name, version 1.x, stored checksum, no pickles.
    raw = npz_arrays(path)
    head = json.loads(raw["header_json"].tobytes().decode())
    assert head["meta"]["format"] == "moe-offload-bench-trace"
    assert head["meta"]["version"].split(".")[0] == "1"
    assert head["meta"]["content_sha256"] == sha
    assert head["requests"]["id"] == ["r0", "r1"]
    assert raw["topk"].tolist() == tr.topk.tolist()


def test_round_trip_without_optionals_keeps_them_absent(tmp_path):
    tr = build(requests=[{**r, "prompt": None} for r in requests_two()])
    path = tmp_path / "bare.npz"
    sha = write_trace(tr, path)
    back = read_trace(path)
    assert back.content_sha256() == sha
    for name in ("weights", "probs", "spec_topk", "embeddings", "has_embedding"):
        assert getattr(back, name) is None, name
    assert back.prompts is None
    assert set(back.missing_fields()) == {"weights", "probs", "spec_topk", "embeddings",
                                          "prompts"}


def test_content_sha_changes_with_content():
    a, b = build(), build()
    assert a.content_sha256() == b.content_sha256()
    reqs = requests_two()
    reqs[1]["routing"][2][1] = [[2, 1]]  # one expert id differs (r1, step 2, layer 1)
    assert build(reqs).content_sha256() != a.content_sha256()
    reqs = requests_two()
    reqs[0]["dataset"] = "bbh"  # request table is covered too
    assert build(reqs).content_sha256() != a.content_sha256()


def test_missing_fields_lists_absent_optionals():
    tr = build()  # has prompts, nothing else optional
    assert set(tr.missing_fields()) == {"weights", "probs", "spec_topk", "embeddings"}
    tr2 = build()
    tr2.weights = np.ones((14, K), np.float16)
    assert set(tr2.missing_fields()) == {"probs", "spec_topk", "embeddings"}


# ---- versions -------------------------------------------------------------------------------

def test_reader_rejects_unknown_major_version(tmp_path):
    src = tmp_path / "ok.npz"
    write_trace(build(), src)

    def bump(arrays, header):
        header["meta"]["version"] = "2.0"

    bad = rewrite(src, tmp_path / "v2.npz", bump)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    assert "v2.npz" in str(err.value) and "meta.version" in str(err.value)


def test_reader_accepts_newer_minor_version(tmp_path):
    src = tmp_path / "ok.npz"
    sha = write_trace(build(), src)

    def minor(arrays, header):
        header["meta"]["version"] = "1.9"

    assert read_trace(rewrite(src, tmp_path / "v19.npz", minor)).content_sha256() == sha


def test_reader_rejects_other_format_name(tmp_path):
    src = tmp_path / "ok.npz"
    write_trace(build(), src)

    def rename(arrays, header):
        header["meta"]["format"] = "something-else"

    with pytest.raises(TraceError, match=r"fmt\.npz.*meta\.format"):
        read_trace(rewrite(src, tmp_path / "fmt.npz", rename))


# ---- checksum and corruption ----------------------------------------------------------------

@pytest.mark.parametrize("what", ["topk", "arrival_ms", "dataset"])
def test_edited_content_fails_checksum(tmp_path, what):
    src = tmp_path / "ok.npz"
    write_trace(build(), src)

    def edit(arrays, header):
        if what == "topk":
            arrays["topk"] = arrays["topk"].copy()
            arrays["topk"][0] = [0, 3]  # was [0, 1]; still valid, different content
        elif what == "arrival_ms":
            arrays["arrival_ms"] = arrays["arrival_ms"] + 1.0
        else:
            header["requests"]["dataset"][1] = "mmlu"

    bad = rewrite(src, tmp_path / "edited.npz", edit)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    assert "edited.npz" in str(err.value) and "meta.content_sha256" in str(err.value)


def test_every_flipped_byte_is_caught_or_harmless(tmp_path):
    """Any single corrupted byte gives a TraceError naming the file, or (zip bookkeeping
    such as timestamps) a trace with exactly the original content."""
    src = tmp_path / "ok.npz"
    sha = write_trace(build(), src)
    raw = src.read_bytes()
    bad = tmp_path / "flipped.npz"
    caught = 0
    for pos in range(len(raw)):
        data = bytearray(raw)
        data[pos] ^= 0xFF
        bad.write_bytes(bytes(data))
        try:
            tr = read_trace(bad)
        except TraceError as exc:
            assert str(exc).startswith("flipped.npz:"), (pos, str(exc))
            caught += 1
        else:
            assert tr.content_sha256() == sha, pos
    assert caught > len(raw) // 2  # array payloads are most of the file


def test_truncated_file_is_a_clear_error(tmp_path):
    src = tmp_path / "ok.npz"
    write_trace(build(), src)
    raw = src.read_bytes()
    bad = tmp_path / "short.npz"
    for n in [0, 1, 10, len(raw) // 3, len(raw) // 2, len(raw) - 30, len(raw) - 1]:
        bad.write_bytes(raw[:n])
        with pytest.raises(TraceError) as err:
            read_trace(bad)
        assert str(err.value).startswith("short.npz:"), n


def test_missing_file_and_not_a_trace(tmp_path):
    with pytest.raises(TraceError, match="nothere.npz"):
        read_trace(tmp_path / "nothere.npz")
    other = tmp_path / "plain.npz"
    np.savez(other, x=np.arange(3))
    with pytest.raises(TraceError, match=r"plain\.npz.*header_json"):
        read_trace(other)


def test_header_without_model_shape_is_a_trace_error(tmp_path):
    src = tmp_path / "ok.npz"
    write_trace(build(), src)

    def drop(arrays, header):
        del header["meta"]["num_experts"]

    with pytest.raises(TraceError, match=r"noshape\.npz.*meta\.num_experts"):
        read_trace(rewrite(src, tmp_path / "noshape.npz", drop))


# ---- property: random small traces round-trip and block_rows returns what was written ------

@st.composite
def small_traces(draw):
    L = draw(st.integers(1, 3))
    n_exp = draw(st.integers(2, 6))
    k = draw(st.integers(1, n_exp))
    reqs = []
    for i in range(draw(st.integers(1, 3))):
        p, o = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        routing = [[[draw(st.permutations(range(n_exp)))[:k] for _ in range(p if s == 0 else 1)]
                    for _ in range(L)] for s in range(o)]
        reqs.append({"id": f"q{i}", "prompt_len": p, "output_len": o,
                     "arrival_ms": float(i), "routing": routing})
    meta = {"num_moe_layers": L, "num_experts": n_exp, "top_k": k,
            "moe_layer_stacks": ["decoder"] * L}
    return meta, reqs


@settings(max_examples=25, deadline=None)
@given(small_traces())
def test_property_round_trip(case):
    meta, reqs = case
    tr = trace_from_routing(meta, reqs)
    with tempfile.TemporaryDirectory() as d:
        sha = write_trace(tr, Path(d) / "p.npz")
        back = read_trace(Path(d) / "p.npz")
    assert back.content_sha256() == sha
    for r, req in enumerate(reqs):
        for s, step in enumerate(req["routing"]):
            for layer, rows in enumerate(step):
                assert back.block_rows(r, s, layer).tolist() == [list(x) for x in rows]
