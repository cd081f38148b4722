"""moe_infinity's compiled kernels, built in place by `pip install -e .` (setup.py) when a C
compiler is present: fast.pyx (one request row's arithmetic, RowKernel; the proposal; the
lowest evictable rank) and rows.pyx (the batch path's member rows in one call, TableKernel),
both over the C helpers of fast.h / fast_c.pxd. They give the numpy code's bits
(tests/systems/test_moe_infinity_fast.py). The system loads them in bind, as the config's
`policy_kernels` says (systems/base.py)."""

from __future__ import annotations

from typing import NamedTuple

from systems.base import compiled_kernel


class Kernels(NamedTuple):
    fast: object | None = None  # kernels/fast.pyx; None: the numpy code
    rows: object | None = None  # kernels/rows.pyx; used with `fast` only


PYTHON = Kernels()  # the numpy code everywhere


def load_kernels(choice: str = "auto", rows: bool = True) -> Kernels:
    """The kernels that are built, for `choice` auto; none for python. rows False: the
    per-row kernels alone (tests)."""
    fast = compiled_kernel("systems.moe_infinity.kernels.fast", choice)
    table = compiled_kernel("systems.moe_infinity.kernels.rows", choice) if rows else None
    return Kernels(fast, table)
