"""Task and dataset structure of the synthetic score model (workloads/synthetic.py).

Each task j of dataset d gets, on top of its own preference A[j]:

    dataset_pref_std * D[d, l, e] + group_pref_std * C[d, g(j), l, e]

D [L, E] is one draw per dataset, C [G, L, E] one per activation group of that dataset
(standardised Gumbel draws, like the other preference terms). Streams are named by the
dataset slug, never by its position in `workload.tasks`: a dataset routes the same whatever
else is in the mix.

Group of a task (`group_of_tasks`): within a dataset, in the order of its task indices (the
order round-robin and task-block plans serve them), a Markov chain: the first task draws a
group from the weights w_g = r**g / sum(r**g), g = 0..G-1 (r = group_decay; skewed sizes, so
K-means finds a largest group as MoE-Infinity's Table 2 reports); every next task keeps the
previous task's group with probability group_stay, else draws again from w. So the groups
of consecutive requests follow P(g -> g) = stay + (1 - stay) w_g, P(g -> h) = (1 - stay) w_h,
and the stationary shares are w. A task's group depends on its own and earlier tasks' draws
only: no term reads a later request.

Portable: uniform draws are core.numerics.uniform (exact), the weights are products and sums
of Python floats in a fixed order (no pow, whose last bits depend on the C library).
"""

from __future__ import annotations

import math

import numpy as np

from core import numerics
from core.rng import stream

STRUCTURE_FIELDS = ("dataset_pref_std", "group_pref_std", "groups_per_dataset", "group_decay",
                    "group_stay")


def structure_on(cfg) -> bool:
    """Whether the dataset or group term is active (else nothing is drawn for it)."""
    return bool(cfg.dataset_pref_std) or (bool(cfg.groups_per_dataset)
                                           and bool(cfg.group_pref_std))


def group_weights(groups: int, decay: float) -> list[float]:
    """Stationary group shares [G]: r**g normalised, r = decay in (0, 1]."""
    w, x = [], 1.0
    for _ in range(groups):
        w.append(x)
        x *= decay
    total = math.fsum(w)
    return [v / total for v in w]


def group_of_tasks(cfg, slug: str, num_tasks: int) -> np.ndarray:
    """int64 [num_tasks]: the activation group of each of a dataset's tasks, in task order
    (module docstring: the chain). Two uniform draws per task, stay and choice."""
    u = numerics.uniform(stream(cfg.seed, f"synthetic/groups/{slug}"), (num_tasks, 2))
    cum = np.cumsum(group_weights(int(cfg.groups_per_dataset), float(cfg.group_decay)))
    fresh = np.minimum(np.searchsorted(cum, u[:, 1], side="right"), len(cum) - 1)
    out = np.empty(num_tasks, np.int64)
    for j in range(num_tasks):
        out[j] = out[j - 1] if j and u[j, 0] < cfg.group_stay else fresh[j]
    return out


def skewed(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Standardised Gumbel draws (mean 0, std 1, right-skewed): a few strongly preferred
    experts per row, as the real sample's high top-expert share at high entropy needs.
    core.numerics draws them (the same bits on every CPU). Every preference term uses them."""
    return (numerics.gumbel(rng, shape) - np.euler_gamma) * (math.sqrt(6) / math.pi)


def structure_prefs(cfg, task_datasets: list[str], L: int, E: int) -> np.ndarray:
    """float64 [num_tasks, L, E]: the dataset and group terms of every task (zeros when
    off). task_datasets: the dataset slug of each task, in task-index order."""
    out = np.zeros((len(task_datasets), L, E))
    if not structure_on(cfg):
        return out
    labels = np.asarray(task_datasets)
    for slug in dict.fromkeys(task_datasets):
        mine = np.nonzero(labels == slug)[0]  # this dataset's tasks, in task order
        if cfg.dataset_pref_std:
            out[mine] += cfg.dataset_pref_std * skewed(
                stream(cfg.seed, f"synthetic/dataset-prefs/{slug}"), (L, E))
        if cfg.groups_per_dataset and cfg.group_pref_std:
            centroids = skewed(stream(cfg.seed, f"synthetic/group-prefs/{slug}"),
                                (int(cfg.groups_per_dataset), L, E))
            out[mine] += cfg.group_pref_std * centroids[group_of_tasks(cfg, slug, len(mine))]
    return out


def embedding_centroids(cfg, task_datasets: list[str], own: np.ndarray) -> np.ndarray:
    """float64 [num_tasks, D]: the synthetic prompt-embedding centroid of each task before
    normalisation. own [num_tasks, D]: each task's own unit centroid. With the structure on,
    dataset and group centroids (unit normal directions, streams named by slug) are mixed in
    with the weights of their routing terms, so two tasks' embedding cosine follows how much
    routing preference they share (same dataset, same group); off: `own` unchanged."""
    if not structure_on(cfg):
        return own
    D = own.shape[1]
    out = cfg.task_pref_std * own
    labels = np.asarray(task_datasets)
    for slug in dict.fromkeys(task_datasets):
        mine = np.nonzero(labels == slug)[0]
        rng = stream(cfg.seed, f"synthetic/dataset-centroids/{slug}")
        out[mine] += cfg.dataset_pref_std * unit_rows(numerics.standard_normal(rng, (1, D)))
        if cfg.groups_per_dataset and cfg.group_pref_std:
            rng = stream(cfg.seed, f"synthetic/group-centroids/{slug}")
            cent = unit_rows(numerics.standard_normal(rng, (int(cfg.groups_per_dataset), D)))
            out[mine] += cfg.group_pref_std * cent[group_of_tasks(cfg, slug, len(mine))]
    return out


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of x [n, D] scaled to unit norm (elementwise ops and numpy's fixed-order sum)."""
    return x / np.sqrt(np.square(x).sum(axis=1, keepdims=True))
