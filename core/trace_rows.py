"""Checks over the per-token rows of a trace in blocks of rows (core/trace.py's validate):
small temporaries that stay in cache, never an [N, k] copy of the arrays."""

from __future__ import annotations

import numpy as np


def first_repeat(topk: np.ndarray, rows: int) -> int | None:
    """First row of topk [N, k] holding an id twice, or None: column pairs compared over
    blocks of `rows` rows transposed to [k, rows] (no sort, no [N, k] temporaries)."""
    for r0 in range(0, len(topk), rows):
        cols = np.ascontiguousarray(topk[r0:r0 + rows].T)  # [k, rows]
        dup = np.zeros(cols.shape[1], bool)
        for i in range(len(cols)):
            for j in range(i):
                dup |= cols[i] == cols[j]
        if dup.any():
            return r0 + int(np.argmax(dup))
    return None


def all_finite(arr: np.ndarray, nonneg: bool, rows: int) -> bool:
    """All values finite (and, with nonneg, none < 0), over blocks of `rows` rows. float16
    bits below 0x7C00 (sign clear, exponent not all ones) are finite and >= 0: one max()
    decides."""
    if not arr.size or (arr.dtype == np.float16 and int(arr.view(np.uint16).max()) < 0x7C00):
        return True
    flat = arr.reshape(len(arr), -1) if arr.ndim else arr.reshape(1)
    blocks = (flat[r0:r0 + rows] for r0 in range(0, len(flat), rows))
    return all(np.isfinite(b).all() and not (nonneg and (b < 0).any()) for b in blocks)
