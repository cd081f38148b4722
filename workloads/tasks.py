"""Synthetic task labels standing in for the MoE-Infinity evaluation mix.

MoE-Infinity evaluates on 290 tasks: 166 from BIG-bench, 66 from FLAN and 58 from MMLU. The
synthetic routing source does not read those datasets; it only needs stable task labels so
that requests of one task share a routing preference and a prompt-embedding centroid.
Labels look like ``bigbench/synthetic_task_017``; dataset slugs match the folder names under
shared/data (bigbench, flan, mmlu).
"""

from __future__ import annotations

# (dataset slug, number of tasks): the MoE-Infinity mix, 166 + 66 + 58 = 290 tasks.
PAPER_TASK_COUNTS: tuple[tuple[str, int], ...] = (("bigbench", 166), ("flan", 66), ("mmlu", 58))


def task_label(dataset: str, index: int) -> str:
    """Stable synthetic label of the index-th task of a dataset."""
    return f"{dataset}/synthetic_task_{index:03d}"


def task_mix(counts: tuple[tuple[str, int], ...] | list) -> list[tuple[str, str]]:
    """(dataset, task label) for every task, datasets interleaved in proportion.

    Task j of a dataset with n tasks sits at fractional position (j + 0.5) / n; merging by that
    position spreads every dataset evenly, so any prefix of requests assigned round-robin
    keeps roughly the mix's proportions (matters when requests arrive over time).
    Deterministic: no randomness, ties broken by the order of `counts`.
    """
    keyed = []
    for d_index, (dataset, n) in enumerate(counts):
        if int(n) < 1 or not str(dataset) or "/" in str(dataset):
            raise ValueError(f"tasks: bad entry ({dataset!r}, {n!r}); need a slug and n >= 1")
        keyed += [((j + 0.5) / n, d_index, dataset, task_label(dataset, j)) for j in range(n)]
    labels = [label for _, _, _, label in keyed]
    if len(set(labels)) != len(labels):
        raise ValueError("tasks: a dataset is listed twice")
    return [(dataset, label) for _, _, dataset, label in sorted(keyed)]


def paper_task_mix() -> list[tuple[str, str]]:
    """The 290-task MoE-Infinity mix as synthetic (dataset, task label) pairs."""
    return task_mix(PAPER_TASK_COUNTS)
