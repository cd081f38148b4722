"""Bring your own routing: read per-token routing records and write trace v1.

Two input layouts (docs/routing.md, "Importing routing"), JSONL (optionally .gz) or CSV:

- records: one token at one layer per line/row. Fields (first alias found wins):
    request  request_id | prompt_id | problem_id   (optional; default: one request "0")
    layer    layer | layer_id                      (sorted distinct values -> MoE layers 0..L-1)
    position token_pos | token_idx | position      (token position within the request)
    experts  experts | expert_ids                  (JSON list, or "3 5" / "3;5" in CSV)
    weights  weights | gating_probs                (optional)
    text     token_text | token                    (optional, kept for nothing but checks)
    prompt   prompt                                (optional request text)
- nested: one request per line: {"prompt_id", "prompt", "moe_layers", "experts":
  [layer][token][k]} (the shared DeepSeek-V2-Lite sample's layout).

Values are parsed strictly (workloads/import_fields.py): no float or bool is taken as an
integer, ids are in [0, E), weights finite and >= 0, given on every record or on none; an
error names file:line and the field.

Recordings are usually prefill-only (one forward pass over a prompt). `to_trace` can replay
the last `decode_tokens` tokens as teacher-forced decode steps: a recording of T tokens
becomes prompt_len T - N, output_len N + 1 (step 0 = prefill of the first T - N tokens, steps
1..N = tokens T - N .. T - 1, one per step). N is cut to T - 1 for shorter requests.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.trace import Trace, TraceError, id_dtype
from workloads.import_fields import (
    RoutingImportError,
    nested_ids,
    pick,
    prompt_field,
    record_fields,
)

GAPS = ("error", "drop")  # what to do with a (layer, position) that has no record
# A request's dense arrays [L, T, k] (T = its largest position + 1; ids int64, weights float32)
# may hold at most this many (layer, position) cells per record of it that the file holds:
# a record fills one cell, so a complete recording fills them all (gaps='error' needs that;
# the Mixtral sample fills 97 %), and 16 still lets gaps='drop' keep a recording of every
# 16th position. It bounds the arrays by the file's own size, at 16 x 12 x k bytes a record
# (a record is at least ~8 bytes of CSV or ~40 of JSON), so a position of 10**12 in a small
# file is an error at its line, not a 466 TiB allocation.
MAX_CELLS_PER_RECORD = 16


@dataclass
class RoutedRequest:
    """One request's recorded routing: ids int64 [L, T, k], -1 where no record exists."""

    id: str
    ids: np.ndarray
    weights: np.ndarray | None = None  # float32 [L, T, k], NaN where missing
    prompt: str | None = None


# A gzip member may inflate to at most this much: JSONL routing compresses 5-20x (the shared
# DeepSeek-V2-Lite sample: 9x), so a file that claims more is a bomb, refused before it fills
# memory (the trace reader's own bound, core/trace_file.py, is 32x plus 64 MiB).
GZIP_FLOOR_BYTES = 64 * 2**20
GZIP_EXPANSION = 100


def _gunzip(path: Path, raw: bytes) -> bytes:
    """The decompressed bytes, read in pieces and refused past the bound above."""
    limit = GZIP_FLOOR_BYTES + GZIP_EXPANSION * len(raw)
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
        while chunk := fh.read(2**20):
            out += chunk
            if len(out) > limit:
                raise RoutingImportError(
                    f"{path.name}: inflates to more than {limit} bytes ({GZIP_EXPANSION}x its "
                    f"{len(raw)} bytes plus {GZIP_FLOOR_BYTES}); not a routing recording")
    return bytes(out)


def _open_text(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(path, raw)
    return raw, io.StringIO(raw.decode("utf-8"))


def _rows(path: Path, text: io.StringIO):
    """(line number, dict) per record of a JSONL or CSV file."""
    if path.name.endswith((".csv", ".csv.gz")):
        for i, row in enumerate(csv.DictReader(text), start=2):
            yield i, row
        return
    for i, line in enumerate(text, start=1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RoutingImportError(f"{path.name}:{i}: not valid JSON ({exc.msg})") from exc
            if not isinstance(rec, dict):
                raise RoutingImportError(f"{path.name}:{i}: expected a JSON object (one record), "
                                         f"got {type(rec).__name__}")
            yield i, rec


def read_routing(path: str | os.PathLike, fmt: str = "auto", duplicates: str = "error",
                 num_experts: int | None = None) -> tuple[list[RoutedRequest], str]:
    """Parse a routing file -> (requests in first-seen order, sha256 of the file bytes).
    With `num_experts` (the model's E) an expert id >= E is an error at its line.

    duplicates: "error", or "first" to keep the first record of a repeated (request, layer,
    position) (the shared Mixtral sample logged its decode steps at position 0 after the
    prefill).
    """
    path = Path(path)
    if duplicates not in ("error", "first"):
        raise ValueError(f"duplicates: expected 'error' or 'first', got {duplicates!r}")
    try:
        raw, text = _open_text(path)
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise RoutingImportError(f"{path.name}: cannot read ({exc})") from exc
    sha = hashlib.sha256(raw).hexdigest()
    rows = _rows(path, text)
    first = next(rows, None)
    if first is None:
        raise RoutingImportError(f"{path.name}: no records")
    if fmt == "auto":
        fmt = "nested" if isinstance(first[1].get("experts"), list) and first[1]["experts"] and \
            isinstance(first[1]["experts"][0], list) else "records"
    if fmt not in ("records", "nested"):
        raise ValueError(f"format: expected 'auto', 'records' or 'nested', got {fmt!r}")
    records = [first, *rows]
    reqs = (_nested(path, records, num_experts) if fmt == "nested"
            else _records(path, records, duplicates, num_experts))
    return reqs, sha


def _nested(path: Path, records, num_experts: int | None) -> list[RoutedRequest]:
    out = []
    for line, rec in records:
        where = f"{path.name}:{line}"
        rid = pick(rec, "request", where, required=False)
        rid = f"line{line}" if rid in (None, "") else str(rid)
        if "experts" not in rec:
            raise RoutingImportError(f"{where}: field 'experts' missing")
        ids = nested_ids(rec["experts"], where, num_experts)
        out.append(RoutedRequest(id=rid, ids=ids, prompt=prompt_field(rec, where)))
    return out


def _records(path: Path, records, duplicates: str,
             num_experts: int | None) -> list[RoutedRequest]:
    table: dict[str, dict] = {}
    layers: set[int] = set()
    k = None
    weighted = None  # (line, has weights) of the first kept record: all records alike
    for line, rec in records:
        where = f"{path.name}:{line}"
        rid, layer, pos, experts, w = record_fields(rec, where, k, num_experts)
        k = len(experts)
        req = table.setdefault(rid, {"tokens": {}, "prompt": prompt_field(rec, where),
                                     "last": (-1, line)})  # (largest position, its line)
        key = (layer, pos)
        if key in req["tokens"]:
            if duplicates == "error":
                raise RoutingImportError(f"{where}: request {rid!r} layer {layer} position {pos} "
                                   "appears twice (use duplicates='first' to keep the first)")
            continue
        weighted = weighted or (line, w is not None)
        _check_weighted(where, w, weighted)
        req["tokens"][key] = (experts, w)
        req["last"] = max(req["last"], (pos, line))
        layers.add(layer)
    layer_index = {lay: i for i, lay in enumerate(sorted(layers))}
    for rid, req in table.items():  # every request's arrays bounded before any is allocated
        _check_cells(path, rid, req, len(layer_index))
    return [_routed(rid, req, layer_index, k) for rid, req in table.items()]


def _check_weighted(where: str, w: list | None, weighted: tuple[int, bool]) -> None:
    """A trace stores weights for every row or none: as the first kept record does."""
    if (w is not None) != weighted[1]:
        raise RoutingImportError(
            f"{where}: field 'weights' {'given' if w is not None else 'missing'}, but line "
            f"{weighted[0]} has {'none' if w is not None else 'them'} (give weights on "
            "every record or on none)")


def _routed(rid: str, req: dict, layer_index: dict[int, int], k: int) -> RoutedRequest:
    """One request's dense [L, T, k] ids and weights from its (layer, position) records."""
    T = 1 + req["last"][0]
    ids = np.full((len(layer_index), T, k), -1, np.int64)
    wts = np.full((len(layer_index), T, k), np.nan, np.float32)
    for (layer, pos), (experts, w) in req["tokens"].items():
        ids[layer_index[layer], pos] = experts
        if w is not None:
            wts[layer_index[layer], pos] = w
    has_w = not np.isnan(wts).all()
    return RoutedRequest(id=rid, ids=ids, weights=wts if has_w else None, prompt=req["prompt"])


def _check_cells(path: Path, rid: str, req: dict, num_layers: int) -> None:
    """The request's [num_layers, T, k] arrays hold at most MAX_CELLS_PER_RECORD cells per
    record it has in the file; else an error at the line of its largest position."""
    pos, line = req["last"]
    records = len(req["tokens"])
    most = MAX_CELLS_PER_RECORD * records // num_layers  # positions T the records allow
    if pos + 1 > most:
        raise RoutingImportError(
            f"{path.name}:{line}: field 'position': {pos} is beyond what the file describes: "
            f"request {rid!r} has {records} records over {num_layers} layers, which allow "
            f"positions below {most} ({MAX_CELLS_PER_RECORD} (layer, position) cells per "
            "record; a complete recording has one record per layer and position)")


def to_trace(requests: list[RoutedRequest], shape: dict, source: str, decode_tokens: int = 0,
             gaps: str = "error", provenance: dict | None = None) -> Trace:
    """Build a decoder-only trace v1. shape: num_moe_layers, num_experts, top_k (and
    optionally model). gaps="drop" removes token positions that lack a record at any layer."""
    L, E, k = int(shape["num_moe_layers"]), int(shape["num_experts"]), int(shape["top_k"])
    if gaps not in GAPS:
        raise ValueError(f"gaps: expected one of {GAPS}, got {gaps!r}")
    if decode_tokens < 0:
        raise ValueError("decode_tokens: must be >= 0")
    prompt_len, output_len, rows, wrows, blocks, dropped = [], [], [], [], [], 0
    for req in requests:
        ids, ok = _complete_positions(req, f"{source}: request {req.id!r}", (L, E, k), gaps)
        dropped += int((~ok).sum())
        T = ids.shape[1]
        n = min(decode_tokens, T - 1)
        prompt_len.append(T - n)
        output_len.append(n + 1)
        w = None if req.weights is None else req.weights[:, ok]
        # step 0: the first T - n tokens at each layer; then one token per step and layer
        for a, b in [(0, T - n)] + [(t, t + 1) for t in range(T - n, T)]:
            rows.extend(ids[:, a:b])
            blocks.extend([b - a] * L)
            wrows.extend(w[:, a:b] if w is not None else ())
    has_w = _has_weights(requests, source)
    meta = {"num_moe_layers": L, "num_experts": E, "top_k": k,
            "moe_layer_stacks": ["decoder"] * L, "synthetic": False,
            "routing_source": f"imported:{source}",
            "import": {"source": source, "decode_tokens": int(decode_tokens),
                       "teacher_forced_decode": decode_tokens > 0, "gaps": gaps,
                       "dropped_positions": dropped, **(provenance or {})}}
    if shape.get("model"):
        meta["model"] = shape["model"]
    out_len = np.array(output_len, np.int32)
    prompts = [r.prompt for r in requests]
    return Trace(meta=meta, request_ids=[r.id for r in requests],
                 datasets=["imported"] * len(requests), tasks=[source] * len(requests),
                 prompt_len=np.array(prompt_len, np.int32), output_len=out_len,
                 arrival_ms=np.zeros(len(requests)),
                 step_offsets=np.concatenate([[0], np.cumsum(out_len, dtype=np.int64)]),
                 block_offsets=np.concatenate([[0], np.cumsum(blocks, dtype=np.int64)]),
                 topk=np.concatenate(rows).astype(id_dtype(E)),
                 weights=np.concatenate(wrows).astype(np.float16) if has_w else None,
                 prompts=prompts if any(p is not None for p in prompts) else None,
                 source=source).validate()


def _complete_positions(req: RoutedRequest, where: str, shape: tuple[int, int, int],
                        gaps: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids [L, T, k] of the positions recorded at every layer, bool [T] of those kept) of
    one request, checked against the model's shape; an incomplete position is an error
    unless gaps='drop'."""
    L, E, k = shape
    if req.ids.shape[0] != L or req.ids.shape[2] != k:
        raise TraceError(f"{where}: {req.ids.shape[0]} layers of top-{req.ids.shape[2]}; "
                         f"the model needs {L} MoE layers of top-{k}")
    ok = (req.ids >= 0).all(axis=(0, 2))  # [T] positions recorded at every layer
    if not ok.all() and gaps == "error":
        lay, pos = np.argwhere((req.ids < 0).any(axis=2))[0]
        raise TraceError(f"{where}: no record for layer {lay} position {pos} "
                         f"({int((~ok).sum())} positions incomplete; gaps='drop' "
                         "removes them)")
    ids = req.ids[:, ok]  # [L, T, k]
    bad = (ids >= E).any(axis=(0, 2))
    if bad.any():
        raise TraceError(f"{where}: expert id {int(ids.max())} >= num_experts {E}")
    if (np.diff(np.sort(ids, axis=2), axis=2) == 0).any():
        raise TraceError(f"{where}: a token repeats an expert id in its top-{k}")
    if ids.shape[1] == 0:
        raise TraceError(f"{where}: no complete token positions")
    return ids, ok


def _has_weights(requests: list[RoutedRequest], source: str) -> bool:
    """Whether the trace stores weights: all requests have them for every recorded token,
    or none has any; anything between is an error."""
    with_w = [r.weights is not None for r in requests]
    if any(with_w) and (not all(with_w) or _weights_incomplete(requests)):
        raise TraceError(f"{source}: field 'weights': some recorded tokens have weights and "
                         "some do not; a trace stores them for every token or for none")
    return bool(requests) and all(with_w)


def _weights_incomplete(requests: list[RoutedRequest]) -> bool:
    """True when some recorded token lacks weights."""
    return any(np.isnan(r.weights[r.ids >= 0]).any() for r in requests if r.weights is not None)


def model_shape(name: str) -> dict:
    """num_moe_layers, num_experts, top_k and model name from conf/model/<name>.yaml."""
    import yaml

    from core.paths import CONF_DIR
    from core.specs import model_spec_from_dict

    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"--model: no conf/model/{name}.yaml")
    spec = model_spec_from_dict(yaml.safe_load(path.read_text()), where=name)
    if set(spec.moe_layer_stacks) != {"decoder"}:
        raise ValueError(f"--model {name}: only decoder-only models can be imported")
    return {"num_moe_layers": spec.num_moe_layers, "num_experts": spec.num_experts,
            "top_k": spec.top_k, "model": spec.name}


def _span(text: str, n: int) -> tuple[int, int]:
    """`START:STOP` (either side may be empty) checked against n requests."""
    try:
        a, b = text.split(":")
        start, stop = int(a) if a else 0, int(b) if b else n
    except ValueError:
        raise ValueError(f"--requests: expected START:STOP, got {text!r}") from None
    if not 0 <= start < stop <= n:
        raise ValueError(f"--requests: {text!r} is not a non-empty range within 0:{n}")
    return start, stop


def check_output(source: str, output: str) -> None:
    """The output must be a file path of its own: not a folder, not the input itself (the
    import would replace the routing it reads)."""
    out = Path(output)
    if out.is_dir():
        raise TraceError(f"{output}: is a folder; give the trace file to write (.npz)")
    if out.exists() and Path(source).exists() and out.samefile(source):  # links too
        raise TraceError(f"{output}: is the input file; writing it would replace the routing "
                         "being imported")


def main(argv: list[str]) -> int:
    """`moebench import-routing IN OUT --model NAME [--decode-tokens N] ...`"""
    from core.trace import write_trace

    ap = argparse.ArgumentParser(prog="moebench import-routing",
                                 description="Convert per-token routing (JSONL/CSV) to trace v1.")
    ap.add_argument("input", help="routing file: .jsonl, .jsonl.gz, .csv")
    ap.add_argument("output", help="trace v1 file to write (.npz)")
    ap.add_argument("--model", required=True, help="conf/model name giving L, E, k")
    ap.add_argument("--format", default="auto", choices=("auto", "records", "nested"))
    ap.add_argument("--decode-tokens", type=int, default=0,
                    help="replay the last N tokens as teacher-forced decode steps")
    ap.add_argument("--gaps", default="error", choices=GAPS)
    ap.add_argument("--duplicates", default="error", choices=("error", "first"))
    ap.add_argument("--requests", default=None, metavar="START:STOP",
                    help="keep requests START..STOP-1 in file order (e.g. a calibration split "
                         "0:500 and a measured split 500:1000)")
    args = ap.parse_args(argv)
    try:
        check_output(args.input, args.output)
        shape = model_shape(args.model)
        reqs, sha = read_routing(args.input, args.format, args.duplicates,
                                 num_experts=shape["num_experts"])
        provenance = {"input_sha256": sha, "format": args.format}
        if args.requests is not None:
            start, stop = _span(args.requests, len(reqs))
            reqs = reqs[start:stop]
            provenance["requests"] = f"{start}:{stop}"
        tr = to_trace(reqs, shape, Path(args.input).name, args.decode_tokens, args.gaps,
                      provenance=provenance)
        out_sha = write_trace(tr, args.output)
    except (TraceError, ValueError) as exc:
        print(f"moebench import-routing: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"wrote {args.output}: {tr.num_requests} requests, "
          f"{int(tr.block_offsets[-1])} token-layer rows, mean prompt "
          f"{float(np.mean(tr.prompt_len)):.1f}, decode steps {args.decode_tokens} "
          f"(teacher-forced), dropped positions {tr.meta['import']['dropped_positions']}; "
          f"sha256 {out_sha[:16]}")
    return 0
