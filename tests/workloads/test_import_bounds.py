"""`moebench import-routing` bounds a request's positions by the records the file holds
(workloads/importers.py, MAX_CELLS_PER_RECORD): an error at the line of the largest position,
before any request's arrays are allocated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from workloads import importers
from workloads.importers import MAX_CELLS_PER_RECORD, RoutingImportError, read_routing


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _rec(pos: int, layer: int, rid: str = "q", k: int = 2) -> dict:
    return {"request_id": rid, "layer": layer, "token_pos": pos, "experts": list(range(k))}


def test_the_bound_by_hand(tmp_path):
    """3 records over 2 layers allow 16 * 3 // 2 = 24 positions: 23 is read, 24 is not."""
    assert MAX_CELLS_PER_RECORD == 16
    base = [_rec(0, 0), _rec(0, 1)]
    reqs, _ = read_routing(_write(tmp_path / "ok.jsonl", [*base, _rec(23, 0)]))
    assert reqs[0].ids.shape == (2, 24, 2)
    with pytest.raises(RoutingImportError, match=r"^bad\.jsonl:3: field 'position': 24 is "
                                                 r"beyond .* 3 records over 2 layers, which "
                                                 r"allow positions below 24"):
        read_routing(_write(tmp_path / "bad.jsonl", [*base, _rec(24, 0)]))


@pytest.mark.fault
def test_refused_before_any_array_is_allocated(tmp_path, monkeypatch):
    """A good request first, the far position in the second: no request's arrays exist."""
    made = []

    def full(shape, *args, **kwargs):
        made.append(shape)
        return np.full(shape, *args, **kwargs)

    monkeypatch.setattr(importers.np, "full", full)
    records = [_rec(0, 0, "a"), _rec(0, 1, "a"), _rec(0, 0, "b"), _rec(10**12, 1, "b")]
    with pytest.raises(RoutingImportError, match=r"^in\.jsonl:4: field 'position'"):
        read_routing(_write(tmp_path / "in.jsonl", records))
    assert made == []


@pytest.mark.fault
def test_cli_exits_2_naming_file_line_and_field(tmp_path):
    """Position 0 at 10 layers, then 10**12 at one: under 1 KB of JSONL."""
    src = _write(tmp_path / "in.jsonl", [_rec(0, lay, k=6) for lay in range(10)]
                 + [_rec(10**12, 3, k=6)])
    assert src.stat().st_size < 1024
    done = subprocess.run([sys.executable, "-m", "moebench.cli", "import-routing", str(src),
                           str(tmp_path / "out.npz"), "--model", "deepseek_v2_lite"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("moebench import-routing: error: in.jsonl:11: field "
                                  "'position': 1000000000000 is beyond"), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.npz").exists()
