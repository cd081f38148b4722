"""Arrival processes and Azure trace replay (workloads/arrivals.py).

Expected values are worked out by hand or with the standard library's datetime, never with
the code under test.
"""

from __future__ import annotations

import urllib.error
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from helpers import shared

from core.specs import SpecError
from workloads import arrivals as arr
from workloads.arrivals import ArrivalError, make_arrivals, parse_timestamp_ns, read_azure_csv

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _csv(tmp_path: Path, rows: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def _ns(dt: datetime) -> int:
    """ns since the epoch of an aware datetime (microsecond precision)."""
    whole = int(dt.replace(microsecond=0).timestamp())
    return whole * 10**9 + dt.microsecond * 1000


# ---- processes ---------------------------------------------------------------------------

@pytest.mark.parametrize("process,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_process_rate_and_burstiness(process, cv):
    n = 20001
    spec = {"process": process, "rate_rps": 2.0}
    if process == "gamma":
        spec["cv"] = cv
    t = make_arrivals(spec, n, seed=7, split="measure").arrival_ms
    gaps = np.diff(t)
    assert t[0] == 0.0 and len(t) == n and (gaps >= 0).all()
    # mean gap 500 ms: standard error 500 * cv / sqrt(20000) <= 10.6 ms; allow 4 sigma
    assert abs(gaps.mean() - 500.0) < 4 * 500 * cv / np.sqrt(n - 1)
    assert abs(gaps.std() / gaps.mean() - cv) < 0.1 * cv
    # rate measured the way docs/serving.md defines it: (R - 1) gaps over the span
    assert abs((n - 1) / (t[-1] / 1e3) - 2.0) < 0.12


def test_seeds_and_splits():
    spec = {"process": "gamma", "rate_rps": 1.5, "cv": 2.0}
    a = make_arrivals(spec, 50, seed=1, split="measure").arrival_ms
    assert np.array_equal(a, make_arrivals(spec, 50, seed=1, split="measure").arrival_ms)
    assert not np.array_equal(a, make_arrivals(spec, 50, seed=2, split="measure").arrival_ms)
    assert not np.array_equal(a, make_arrivals(spec, 50, seed=1, split="calibration").arrival_ms)
    # a longer run starts with the same arrivals (the gaps are drawn in one stream)
    assert np.array_equal(a[:20], make_arrivals(spec, 20, seed=1, split="measure").arrival_ms)
    assert len(make_arrivals({**spec, "max_requests": 7}, 50, 1, "measure").arrival_ms) == 7


@pytest.mark.parametrize("spec,key", [
    ({"process": "poisson"}, "rate_rps"),
    ({"process": "poisson", "rate_rps": -1}, "rate_rps"),
    ({"process": "gamma", "rate_rps": 1, "cv": 0}, "cv"),
    ({"process": "poisson", "rate_rps": 1, "cv": 2}, "cv"),
    ({"process": "uniform", "rate_rps": 1}, "process"),
    ({"process": "poisson", "rate_rps": 1, "rate": 2}, "unknown"),
    ({"process": "poisson", "rate_rps": 1, "max_requests": 0}, "max_requests"),
    ({"process": "poisson", "rate_rps": 1, "path": "x.csv"}, "path"),
])
def test_bad_config_names_key(spec, key):
    with pytest.raises(SpecError, match=key):
        make_arrivals(spec, 10, 0, "measure")


# ---- Azure timestamps --------------------------------------------------------------------

def test_timestamp_2023_format():
    ref = datetime(2023, 11, 16, 18, 17, 3, 979960, tzinfo=UTC)
    assert parse_timestamp_ns("2023-11-16 18:17:03.9799600") == _ns(ref)  # 7 digits, no zone
    assert parse_timestamp_ns("2023-11-16 18:17:03.9799601") == _ns(ref) + 100  # 100 ns
    assert parse_timestamp_ns("2023-11-16 18:17:03") == _ns(ref.replace(microsecond=0))


def test_timestamp_2024_format_with_offset():
    ref = datetime.fromisoformat("2024-05-10 00:00:00.009930+00:00")
    assert parse_timestamp_ns("2024-05-10 00:00:00.009930+00:00") == _ns(ref)
    # 02:00 at +02:00 is midnight UTC; 23:00 the day before at -01:00 is also midnight UTC
    assert parse_timestamp_ns("2024-05-10 02:00:00.009930+02:00") == _ns(ref)
    assert parse_timestamp_ns("2024-05-09 23:00:00.009930-01:00") == _ns(ref)
    assert parse_timestamp_ns("2024-05-10T00:00:00.009930Z") == _ns(ref)


def test_both_formats_replay_the_same_times(tmp_path):
    t0 = datetime(2024, 5, 10, tzinfo=UTC)
    offsets_ms = [0.0, 250.5, 1000.0, 1000.0, 4000.25]
    rows23, rows24 = [], []
    for i, ms in enumerate(offsets_ms):
        t = t0 + timedelta(milliseconds=ms)
        rows23.append(f"{t:%Y-%m-%d %H:%M:%S}.{t.microsecond:06d}0,{100 + i},{10 + i}")
        rows24.append(f"{t.isoformat(sep=' ')},{100 + i},{10 + i}")
    spec = {"process": "azure", "lengths": True}
    a = make_arrivals({**spec, "path": str(_csv(tmp_path, rows23, "a.csv"))}, 5, 0, "measure")
    b = make_arrivals({**spec, "path": str(_csv(tmp_path, rows24, "b.csv"))}, 5, 0, "measure")
    np.testing.assert_allclose(a.arrival_ms, offsets_ms, atol=1e-6)
    np.testing.assert_allclose(b.arrival_ms, offsets_ms, atol=1e-6)
    assert a.prompt_len.tolist() == [100, 101, 102, 103, 104]
    assert b.output_len.tolist() == [10, 11, 12, 13, 14]
    assert a.provenance["source"] == "file:a.csv" and len(a.provenance["sha256"]) == 64


# ---- Azure replay: selection, rate scaling, lengths --------------------------------------

ROWS = ["2023-11-16 18:00:01.0000000,10,1", "2023-11-16 18:00:00.0000000,20,2",
        "2023-11-16 18:00:01.5000000,30,3", "2023-11-16 18:00:03.0000000,40,4"]


def test_replay_sorts_caps_and_scales(tmp_path):
    path = str(_csv(tmp_path, ROWS))
    # rows sorted by time: 0 s (20, 2), 1 s (10, 1), 1.5 s (30, 3), 3 s (40, 4)
    a = make_arrivals({"process": "azure", "path": path}, 4, 0, "measure")
    assert a.arrival_ms.tolist() == [0.0, 1000.0, 1500.0, 3000.0]
    assert a.prompt_len.tolist() == [20, 10, 30, 40] and a.output_len.tolist() == [2, 1, 3, 4]
    assert a.provenance["trace_rate_rps"] == pytest.approx(1.0)  # 3 gaps over 3 s
    # rate_rps 2: times halve; rate_scale 4: quarter
    b = make_arrivals({"process": "azure", "path": path, "rate_rps": 2.0}, 4, 0, "measure")
    np.testing.assert_allclose(b.arrival_ms, [0.0, 500.0, 750.0, 1500.0])
    c = make_arrivals({"process": "azure", "path": path, "rate_scale": 4}, 4, 0, "measure")
    np.testing.assert_allclose(c.arrival_ms, [0.0, 250.0, 375.0, 750.0])
    # request cap and start row: rows 1..2 of the sorted trace, times from the first of them
    d = make_arrivals({"process": "azure", "path": path, "start": 1, "max_requests": 2}, 256, 0,
                      "measure")
    assert d.arrival_ms.tolist() == [0.0, 500.0] and d.prompt_len.tolist() == [10, 30]
    e = make_arrivals({"process": "azure", "path": path, "lengths": False}, 4, 0, "measure")
    assert e.prompt_len is None and e.output_len is None
    with pytest.raises(SpecError, match="rate_rps or rate_scale"):
        make_arrivals({"process": "azure", "path": path, "rate_rps": 1, "rate_scale": 2}, 4, 0,
                      "measure")
    with pytest.raises(SpecError, match="has 4"):
        make_arrivals({"process": "azure", "path": path}, 5, 0, "measure")


@pytest.mark.parametrize("row,column", [
    ("2023-11-16 18:00:02.1,abc,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,5,0", "GeneratedTokens"),
    ("2023-11-16 18:00:02.1,5,-2", "GeneratedTokens"),
    ("16/11/2023 18:00:02,5,3", "TIMESTAMP"),
    ("2023-13-16 18:00:02,5,3", "TIMESTAMP"),
    ("2023-02-30 18:00:02,5,3", "TIMESTAMP"),
    ("2023-11-16 18:00:02,5", "3"),
    # token counts: integers in [1, 2**20], written in plain digits
    ("2023-11-16 18:00:02.1,1000000000,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,1048577,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,5,1048577", "GeneratedTokens"),
    ("2023-11-16 18:00:02.1,1e9,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,2.5,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,1_000,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,nan,3", "ContextTokens"),
    ("2023-11-16 18:00:02.1,5,inf", "GeneratedTokens"),
    ("2023-11-16 18:00:02.1,,3", "ContextTokens"),
])
def test_bad_row_names_file_and_line(tmp_path, row, column):
    path = _csv(tmp_path, [ROWS[0], ROWS[1], row, ROWS[2]])
    with pytest.raises(ArrivalError) as err:
        read_azure_csv(path)
    msg = str(err.value)
    assert f"{path}:4:" in msg and column in msg  # header is line 1, the bad row line 4


def test_token_count_bound_is_inclusive_and_named(tmp_path):
    path = _csv(tmp_path, [ROWS[0], "2023-11-16 18:00:02.1,1048576,1048576"])
    _, ctx, gen = read_azure_csv(path)
    assert ctx.tolist()[-1] == 2**20 and gen.tolist()[-1] == 2**20
    bad = _csv(tmp_path, [ROWS[0], "2023-11-16 18:00:02.1,1048577,7"], name="bad.csv")
    with pytest.raises(ArrivalError) as err:
        read_azure_csv(bad)
    assert str(err.value) == (f"{bad}:3: column ContextTokens: '1048577' is not an integer in "
                              "[1, 1048576] (tokens per request)")


def test_bad_header_names_file(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("time,in,out\n2023-11-16 18:00:00,1,1\n")
    with pytest.raises(ArrivalError, match=r"h\.csv:1: header"):
        read_azure_csv(path)


# ---- getting the file: local path, cache, download, offline ------------------------------

def test_missing_path_offline_fails_fast(tmp_path, monkeypatch):
    calls = []

    def offline(url, timeout):
        calls.append((url, timeout))
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(arr.urllib.request, "urlopen", offline)
    spec = {"process": "azure", "kind": "code", "cache_dir": str(tmp_path)}
    with pytest.raises(SpecError, match=r"workload\.arrivals\.path") as err:
        make_arrivals(spec, 4, 0, "measure")
    assert "AzureLLMInferenceTrace_code.csv" in str(err.value)
    assert calls == [(arr.AZURE_2023_URL.format(kind="code"), arr.DOWNLOAD_TIMEOUT_S)]
    with pytest.raises(SpecError, match=r"workload\.arrivals\.path is not set and download is off"):
        make_arrivals({**spec, "download": False}, 4, 0, "measure")
    assert len(calls) == 1  # download: false never touches the network
    with pytest.raises(SpecError, match=r"workload\.arrivals\.path: .* is not a file"):
        make_arrivals({"process": "azure", "path": str(tmp_path / "nope.csv")}, 4, 0, "measure")


def test_download_is_cached_atomically(tmp_path, monkeypatch):
    body = (HEADER + ROWS[0] + "\n" + ROWS[3] + "\n").encode()

    class Resp:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return body

    monkeypatch.setattr(arr.urllib.request, "urlopen", lambda url, timeout: Resp())
    spec = {"process": "azure", "kind": "conv", "cache_dir": str(tmp_path)}
    a = make_arrivals(spec, 2, 0, "measure")
    assert a.arrival_ms.tolist() == [0.0, 2000.0]
    assert a.provenance["source"] == arr.AZURE_2023_URL.format(kind="conv")
    cached = list((tmp_path / "azure_llm_traces").iterdir())
    assert [p.name for p in cached] == ["AzureLLMInferenceTrace_conv.csv"]  # no temp files left
    monkeypatch.setattr(arr.urllib.request, "urlopen", None)  # second call: from the cache
    assert make_arrivals(spec, 2, 0, "measure").arrival_ms.tolist() == [0.0, 2000.0]


@pytest.mark.parametrize("kind,rows,gap_s", [("code", 8819, 0.052), ("conv", 19366, 4.314579)])
def test_shared_azure_2023_traces(kind, rows, gap_s):
    path = shared("azure_llm_traces", f"AzureLLMInferenceTrace_{kind}.csv")
    t, ctx, gen = read_azure_csv(path)
    assert len(t) == rows  # SOURCES.md
    # first two rows (SOURCES.md / the file head): code 18:17:03.97996 -> 18:17:04.03196,
    # conv 18:15:46.68059 -> 18:15:50.995169 (4.314579 s)
    assert (t[1] - t[0]) / 1e9 == pytest.approx(gap_s, abs=1e-6)
    first = {"code": (4808, 10), "conv": (374, 44)}[kind]
    assert (int(ctx[0]), int(gen[0])) == first
    a = make_arrivals({"process": "azure", "kind": kind, "path": str(path), "rate_rps": 2.91,
                       "max_requests": 256}, 290, 0, "measure")
    assert len(a.arrival_ms) == 256
    assert 255 / (a.arrival_ms[-1] / 1e3) == pytest.approx(2.91)
