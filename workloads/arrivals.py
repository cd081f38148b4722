"""Request arrivals: Poisson and Gamma processes, and replay of the Azure LLM inference traces.

An arrival source gives R request arrival times in ms (the first at 0, non-decreasing) and, for
a trace, each request's prompt and output length in tokens. The config is the workload's
`arrivals` mapping (docs/serving.md):

    process: poisson | gamma | azure
    rate_rps: mean rate, requests per second of (R - 1) gaps; azure: null keeps the trace's
    cv: coefficient of variation of the gaps (gamma only; 1 = Poisson, > 1 burstier)
    path, kind, download, cache_dir, start: azure only (local CSV, code|conv, ...)
    rate_scale: azure only, multiplies the trace's rate (2 = twice as many requests per second)
    max_requests: cap on the number of requests (with the workload's num_requests)
    lengths: azure only, take prompt/output lengths from the trace (default true)

Azure traces (CC-BY-4.0, Splitwise, ISCA 2024): CSV with `TIMESTAMP,ContextTokens,
GeneratedTokens`; 2023 timestamps look like `2023-11-16 18:17:03.9799600` (no zone), 2024 ones
like `2024-05-10 00:00:00.009930+00:00`. Both are read; a time without zone is UTC.
"""

from __future__ import annotations

import calendar
import csv
import hashlib
import math
import os
import re
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from core.atomic import write_bytes
from core.rng import stream
from core.specs import SpecError

AZURE_REPO = "https://github.com/Azure/AzurePublicDataset"
# The 2023 traces (one hour each) as committed in the repository above.
AZURE_2023_URL = ("https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
                  "AzureLLMInferenceTrace_{kind}.csv")
AZURE_KINDS = ("code", "conv")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# Prompt or output tokens of one request, at most (docs/serving.md): above the context of
# every model in conf/model (DeepSeek-V3's 128K is the largest), and it keeps one request's
# routing arrays within a few GiB. Replayed counts and the synthetic lengths are checked.
MAX_REQUEST_TOKENS = 2**20
DOWNLOAD_TIMEOUT_S = 20.0
KEYS = {"process", "rate_rps", "cv", "path", "kind", "download", "cache_dir", "start",
        "rate_scale", "max_requests", "lengths"}
_COUNT = re.compile(r"\s*[0-9]+\s*")  # plain decimal digits: no sign, exponent, "_" or dot
_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
                 r"(Z|[+-]\d{2}:?\d{2})?")


class ArrivalError(SpecError):
    """Bad workload input (arrival or prompt config, trace file); the message names the key,
    or the file and line. A SpecError, so `moebench` reports it without a traceback."""


@dataclass
class Arrivals:
    arrival_ms: np.ndarray  # float64 [R], first 0, non-decreasing
    prompt_len: np.ndarray | None = None  # int64 [R] (traces with lengths only)
    output_len: np.ndarray | None = None  # int64 [R]
    provenance: dict = field(default_factory=dict)  # recorded in trace meta["arrivals"]


# ---- processes ---------------------------------------------------------------------------

def gamma_arrivals(n: int, rate_rps: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """n arrival times (ms): the first at 0, then i.i.d. Gamma gaps of mean 1000 / rate_rps ms
    and coefficient of variation cv (shape 1 / cv**2; cv = 1 is the exponential: Poisson)."""
    shape = 1.0 / (cv * cv)
    gaps_ms = rng.gamma(shape, (1000.0 / rate_rps) / shape, size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps_ms)])


# ---- Azure trace -------------------------------------------------------------------------

def parse_timestamp_ns(text: str) -> int:
    """ns since the Unix epoch of an Azure trace timestamp (2023 or 2024 format)."""
    m = _TS.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]'")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    try:
        datetime(y, mo, d, h, mi, s)  # rejects month 13, Feb 30, hour 24, ...
    except ValueError as exc:
        raise ValueError(f"timestamp {text!r}: {exc}") from None
    secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        hh, mm = int(zone[1:3]), int(zone[-2:])
        secs -= sign * (hh * 3600 + mm * 60)  # local time minus its offset = UTC
    return secs * 10**9 + int(frac.ljust(9, "0")) if frac else secs * 10**9


def read_azure_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time_ns int64 [n], context tokens int64 [n], generated tokens int64 [n]) in file order.

    A row that does not parse raises ArrivalError naming the file, line and column.
    """
    path = Path(path)
    times, ctx, gen = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != list(AZURE_COLUMNS):
            raise ArrivalError(f"{path}:1: header is {header!r}; expected "
                               f"{','.join(AZURE_COLUMNS)} (Azure LLM inference trace)")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) < 3:
                raise ArrivalError(f"{path}:{line}: {len(row)} columns; expected 3 "
                                   f"({','.join(AZURE_COLUMNS)})")
            try:
                times.append(parse_timestamp_ns(row[0]))
            except ValueError as exc:
                raise ArrivalError(f"{path}:{line}: column TIMESTAMP: {exc}") from None
            for col, value, out in ((1, row[1], ctx), (2, row[2], gen)):
                n = int(value) if _COUNT.fullmatch(value) else 0
                if not 1 <= n <= MAX_REQUEST_TOKENS:
                    raise ArrivalError(f"{path}:{line}: column {AZURE_COLUMNS[col]}: "
                                       f"{value!r} is not an integer in [1, "
                                       f"{MAX_REQUEST_TOKENS}] (tokens per request)")
                out.append(n)
    if not times:
        raise ArrivalError(f"{path}: no data rows")
    return np.array(times, np.int64), np.array(ctx, np.int64), np.array(gen, np.int64)


def azure_trace_path(kind: str, path: str | None, *, download: bool = True,
                     cache_dir: str | None = None) -> tuple[Path, str]:
    """(local CSV, where it came from): `path` if given, else the cached or downloaded 2023
    trace. Fails fast, naming workload.arrivals.path, when it cannot be had."""
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ArrivalError(f"workload.arrivals.path: {p} is not a file")
        return p, f"file:{p.name}"
    url = AZURE_2023_URL.format(kind=kind)
    cache = Path(cache_dir or os.environ.get("MOEBENCH_CACHE", "~/.cache/moebench")).expanduser()
    local = cache / "azure_llm_traces" / url.rsplit("/", 1)[1]
    if local.is_file():
        return local, url
    hint = (f"set workload.arrivals.path to a local copy of AzureLLMInferenceTrace_{kind}.csv "
            f"(from {AZURE_REPO}, data/; 2024 week-long traces: see its "
            f"AzureLLMInferenceDataset2024.md)")
    if not download:
        raise ArrivalError(f"workload.arrivals.path is not set and download is off: {hint}")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            body = resp.read()
    except OSError as exc:  # URLError, timeouts, DNS failure: offline
        raise ArrivalError(f"workload.arrivals.path is not set and {url} could not be "
                           f"downloaded ({exc}); {hint}") from None
    write_bytes(local, body)  # atomic: no partial file under the cached name
    return local, url


# ---- config -> arrivals ------------------------------------------------------------------

def _positive(spec: dict, key: str, default=None) -> float | None:
    value = spec.get(key, default)
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise ArrivalError(f"workload.arrivals.{key}: must be a number > 0, got {value!r}")
    return v


def _count(spec: dict, num_requests: int) -> int:
    cap = spec.get("max_requests")
    if cap is None:
        return int(num_requests)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ArrivalError(f"workload.arrivals.max_requests: must be an integer >= 1, got {cap!r}")
    return min(int(num_requests), cap)


def make_arrivals(spec: dict, num_requests: int, seed: int, split: str) -> Arrivals:
    """Arrivals for one trace split from the workload's `arrivals` mapping.

    Processes draw from stream(seed, "arrivals/<split>"), so the measure and calibration
    splits get different times. An Azure replay uses rows start.. of the trace for both
    splits (calibration only warms up history; its timing is not used).
    """
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise ArrivalError(f"workload.arrivals: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    process = spec.get("process")
    n = _count(spec, num_requests)
    if process in ("poisson", "gamma"):
        for key in ("path", "kind", "rate_scale", "start"):
            if spec.get(key) is not None:
                raise ArrivalError(f"workload.arrivals.{key}: only for process azure")
        rate = _positive(spec, "rate_rps")
        if rate is None:
            raise ArrivalError(f"workload.arrivals.rate_rps: required for process {process}")
        cv = 1.0 if process == "poisson" else _positive(spec, "cv", 1.0)
        if process == "poisson" and spec.get("cv") not in (None, 1, 1.0):
            raise ArrivalError("workload.arrivals.cv: poisson has cv 1; use process gamma")
        times = gamma_arrivals(n, rate, cv, stream(seed, f"arrivals/{split}"))
        return Arrivals(times, provenance={"process": process, "rate_rps": rate, "cv": cv,
                                           "num_requests": n, "stream": f"arrivals/{split}"})
    if process != "azure":
        raise ArrivalError(f"workload.arrivals.process: {process!r}; use poisson, gamma or azure")
    return _azure(spec, n)


def _azure(spec: dict, n: int) -> Arrivals:
    kind = spec.get("kind", "conv")
    if kind not in AZURE_KINDS:
        raise ArrivalError(f"workload.arrivals.kind: {kind!r}; use code or conv")
    if spec.get("cv") is not None:
        raise ArrivalError("workload.arrivals.cv: not used by process azure (replayed)")
    rate, scale = _positive(spec, "rate_rps"), _positive(spec, "rate_scale")
    if rate is not None and scale is not None:
        raise ArrivalError("workload.arrivals: set rate_rps or rate_scale, not both")
    start = spec.get("start") or 0
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ArrivalError(f"workload.arrivals.start: must be an integer >= 0, got {start!r}")
    path, origin = azure_trace_path(kind, spec.get("path"), download=spec.get("download", True),
                                    cache_dir=spec.get("cache_dir"))
    t_ns, ctx, gen = read_azure_csv(path)
    if start + n > len(t_ns):
        raise ArrivalError(f"workload.arrivals: {n} requests from row {start} need {start + n} "
                           f"rows; {path} has {len(t_ns)} (lower num_requests/max_requests)")
    order = np.argsort(t_ns, kind="stable")[start:start + n]  # arrival order; ties keep file order
    rel_ms = (t_ns[order] - t_ns[order[0]]) / 1e6
    span_ms = float(rel_ms[-1])
    trace_rate = (n - 1) / (span_ms / 1e3) if span_ms > 0 else None
    factor = 1.0
    if rate is not None:
        if trace_rate is None:
            raise ArrivalError("workload.arrivals.rate_rps: the selected rows span no time")
        factor = rate / trace_rate
    elif scale is not None:
        factor = scale
    use_lengths = spec.get("lengths", True)
    if not isinstance(use_lengths, bool):
        raise ArrivalError(f"workload.arrivals.lengths: must be true or false, got {use_lengths!r}")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    prov = {"process": "azure", "kind": kind, "source": origin, "sha256": sha,
            "rows": [start, start + n],
            "num_requests": n, "trace_rate_rps": trace_rate,
            "rate_rps": trace_rate * factor if trace_rate else None, "time_scale": 1.0 / factor,
            "lengths": use_lengths, "license": "CC-BY-4.0 (Azure/AzurePublicDataset)"}
    return Arrivals(rel_ms / factor, ctx[order] if use_lengths else None,
                    gen[order] if use_lengths else None, prov)
