"""What an experiment module (analysis/repro/experiments/<name>.py) declares: `EXPERIMENT`.

An experiment mirrors one published table or figure. Its fixed setting is
conf/experiment/<name>.yaml (request counts and seeds pinned so the suite fits its time
budget); its sweeps are Hydra multirun overrides run after `experiment=<name>`, writing into
results/<name>/ (or results/<name>_real/ for sweeps on a real routing sample). `table`,
`figure` and `claims` read the runs only (analysis/repro/frame.py), never rerun anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The seeds every sweep runs at unless it sets `seed` itself (analysis/repro/plan.py);
# `moebench reproduce --seeds N` runs the first N
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Sweep:
    """One `moebench -m experiment=<name> <overrides>` call. `real`: it replays the shared
    real routing sample of `real_model` (skipped, and said so, when the sample is absent)."""

    overrides: tuple[str, ...]
    real: bool = False


@dataclass(frozen=True)
class Experiment:
    name: str  # results/<name>/, conf/experiment/<name>.yaml, make reproduce-<name>
    title: str  # a line for the table and the figure
    mirrors: str  # the paper, table or figure it reproduces
    sweeps: tuple[Sweep, ...]
    # frame (analysis/repro/frame.py) -> the table: pandas DataFrame with, where the paper
    # has a value, `paper`, `ours` and `ratio` (ours / paper) columns beside the setting
    table: Callable
    # (table, frame) -> a matplotlib Figure: grouped bars for latency tables, lines for
    # sweeps, CDFs for online runs; labelled SIMULATED and with the routing source
    figure: Callable
    # (table, frame, real frame or None) -> [verdict.ClaimRow]
    claims: Callable
    cannot_express: tuple[str, ...] = ()  # what the simulator does not model here
    real_model: str | None = None  # deepseek_v2_lite or mixtral_8x7b: a real sample exists
    notes: tuple[str, ...] = field(default=())  # printed under the table
    seeds: tuple[int, ...] = SEEDS  # `seed=` of every sweep that does not set it itself
