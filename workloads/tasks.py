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


def dataset_task_order(datasets: list[str], datasets_of_tasks: list[str],
                       last_first: bool = False) -> list[int]:
    """Indices of the tasks of `datasets`, dataset by dataset in the given order; within a
    dataset the tasks keep their order in `datasets_of_tasks` (the dataset of each task, in
    the mix's or the loaders' order), or the reverse with `last_first`. Task shifts
    (workload.task_order, workload.calibration_tasks; docs/routing.md)."""
    out = []
    for d in datasets:
        mine = [j for j, dj in enumerate(datasets_of_tasks) if dj == d]
        out += mine[::-1] if last_first else mine
    return out


def task_blocks(order: list[int], n: int, block: int) -> list[int]:
    """The task of each of n requests served in blocks: request i takes task
    order[(i // block) % len(order)], so `block` consecutive requests share a task and the
    order repeats when n > block * len(order). block 1 and the whole mix in mix order is the
    default round-robin (request i takes task i % len(mix))."""
    if not order or block < 1:
        raise ValueError(f"task blocks: need tasks and block >= 1, got {len(order)}, {block}")
    return [order[(i // block) % len(order)] for i in range(n)]


def prompts_in_blocks(shuffled: list, loaded: list, datasets: list | None, block: int,
                      n: int) -> list:
    """n dataset prompts (objects with .dataset and .task) served in task blocks
    (task_blocks): the tasks of `datasets` (all, as loaded, when None), dataset by dataset,
    each dataset's tasks in the order they first appear in `loaded`; each task's prompts in
    the seeded order of `shuffled`, cycled when a task serves more than it has."""
    by_task: dict[tuple, list] = {}
    for p in shuffled:
        by_task.setdefault((p.dataset, p.task), []).append(p)
    seen = [t for t in dict.fromkeys((p.dataset, p.task) for p in loaded) if t in by_task]
    names = datasets or list(dict.fromkeys(d for d, _ in seen))
    tasks = [seen[j] for j in dataset_task_order(names, [d for d, _ in seen])]
    served: dict[tuple, int] = {}
    chosen = []
    for j in task_blocks(list(range(len(tasks))), n, block):
        k = served.get(tasks[j], 0)
        served[tasks[j]] = k + 1
        chosen.append(by_task[tasks[j]][k % len(by_task[tasks[j]])])
    return chosen
