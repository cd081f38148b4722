"""Routing structure the papers' policies rely on (definitions: docs/routing.md, "Structure").

analysis/characterize.py measures reuse, entropy, groups and cross-layer links over whole
requests; this module adds what MoE-Infinity, fMoE and Diff-MoE build on, at the scope each
paper uses:

- per-request reuse in the decode phase (MoE-Infinity Appendix B, "< 5 % / Mixtral 25 %");
- K-means groups, the largest group's share and group transitions per dataset (Table 2);
- activation similarity within and across tasks and datasets (behind Table 3's shifts);
- entropy of the expert distribution as decode iterations aggregate (fMoE Fig. 3);
- per-layer global hotness, the top 5 % of experts' share of accesses (Diff-MoE);
- temporal locality over the next 1-4 decode steps (Diff-MoE).

Inputs are per-request int [L, T, k] expert ids, -1 where a token has no record at a layer
(analysis.characterize.request_sequences), and the decode window of each request, int
[L, D, k] (`decode_sequences` for a trace; `teacher_forced` for a prefill-only recording).
"""

from __future__ import annotations

import math

import numpy as np

from analysis.characterize import (
    HEAVY_TOKEN_SHARE,
    cosine_matrix,
    entropy_bits,
    one_hot,
    request_groups,
)

HOT_EXPERT_SHARE = 0.05  # Diff-MoE's global hotness: the top 5 % of a layer's experts
LOCALITY_STEPS = (1, 2, 3, 4)  # "used again within the next d decode steps"
AGGREGATE_STEPS = (1, 2, 4, 8, 16)  # fMoE Fig. 3c: entropy after n aggregated iterations
MIN_DECODE_STEPS = 8  # a request's layer counts in decode statistics with >= 8 decode tokens
MIN_GROUP_REQUESTS = 8  # K-means per dataset needs at least this many requests
ALL = "all"  # the dataset key when the routing carries no dataset labels


def decode_sequences(tr) -> list[np.ndarray]:
    """Per request int16 [L, D, k]: the experts of decode steps 1..S-1 (D = S - 1) at each
    layer, -1 where the step routes nothing at that layer (an encoder layer while decoding).
    A batch-1 trace routes one token per decode step and layer."""
    L, k = tr.num_layers, tr.top_k
    counts = np.diff(tr.block_offsets)  # rows per block [S_total * L]
    out = []
    for r in range(tr.num_requests):
        s0, s1 = int(tr.step_offsets[r]) + 1, int(tr.step_offsets[r + 1])
        blocks = (np.arange(s0, s1)[None, :] * L + np.arange(L)[:, None])  # [L, D]
        seq = np.full(blocks.shape + (k,), -1, np.int16)
        has = counts[blocks] > 0
        seq[has] = tr.topk[tr.block_offsets[blocks[has]]]
        out.append(seq)
    return out


def teacher_forced(seqs: list[np.ndarray], steps: int) -> list[np.ndarray]:
    """The last `steps` positions of each request [L, T, k] as its decode window [L, steps, k],
    for prefill-only recordings: the recorded continuation stands in for generated tokens
    (docs/routing.md, "Prefill-only recordings and decode"). Requests with fewer than
    steps + 1 tokens are left out, so every window has the same length."""
    return [s[:, s.shape[1] - steps:] for s in seqs if s.shape[1] > steps]


def reused_share(dec: list[np.ndarray], E: int, min_steps: int = MIN_DECODE_STEPS):
    """MoE-Infinity's per-request reuse: per request and layer, the share of the layer's E
    experts that serve at least HEAVY_TOKEN_SHARE of the request's decode tokens there; mean
    over layers with >= min_steps decode tokens, then over requests. None without one."""
    values = []
    for seq in dec:
        n = (seq[..., 0] >= 0).sum(1)  # decode tokens per layer [L]
        keep = n >= min_steps
        if keep.any():
            counts = one_hot(seq, E).sum(1)[keep]  # [L', E] decode tokens per expert
            values.append(float((counts >= HEAVY_TOKEN_SHARE * n[keep][:, None]).mean()))
    return float(np.mean(values)) if values else None


def entropy_growth(dec: list[np.ndarray], E: int, k: int,
                   min_steps: int = MIN_DECODE_STEPS) -> dict:
    """Entropy (bits) of a layer's expert distribution aggregated over a request's first n
    decode tokens, for n in AGGREGATE_STEPS and over all of them ("request"); mean over
    requests of the mean over layers with enough tokens. n = 1 is the iteration-level map
    (log2 k for one token's k distinct experts: top-k ids carry no gate probabilities).
    `entropy_growth` = (request - iteration) / (log2 E - log2 k): how far aggregation moves
    the distribution from one iteration's towards uniform over all E (0..1)."""
    per_n: dict = {n: [] for n in (*AGGREGATE_STEPS, "request")}
    for seq in dec:
        valid = seq[..., 0] >= 0  # [L, D]
        n_tok = valid.sum(1)  # [L]
        order = np.argsort(~valid, axis=1, kind="stable")  # a layer's tokens first, gaps last
        seq = np.take_along_axis(seq, order[..., None], axis=1)
        cum = np.cumsum(one_hot(seq, E), axis=1, dtype=np.int32)  # [L, D, E]
        for n in per_n:
            need = min_steps if n == "request" else n
            keep = n_tok >= need
            if not keep.any():
                continue
            at = (n_tok - 1) if n == "request" else np.full_like(n_tok, n - 1)
            c = cum[np.nonzero(keep)[0], at[keep]].astype(float)  # [L', E]
            per_n[n].append(float(entropy_bits(c / c.sum(-1, keepdims=True)).mean()))
    mean = {n: float(np.mean(v)) if v else None for n, v in per_n.items()}
    out = {f"entropy_steps{n}_bits": mean[n] for n in AGGREGATE_STEPS}
    out["entropy_iteration_bits"] = mean[1]
    out["entropy_request_bits"] = mean["request"]
    span = math.log2(E) - math.log2(k)
    out["entropy_growth"] = (None if mean[1] is None or mean["request"] is None or span <= 0
                             else (mean["request"] - mean[1]) / span)
    return out


def hot_share(seqs: list[np.ndarray], E: int, share: float = HOT_EXPERT_SHARE) -> dict:
    """Per layer, the share of all routings (every token of every request) that go to its
    ceil(share * E) most used experts; mean over layers with routings, beside the uniform
    value ceil(share * E) / E."""
    top = max(1, math.ceil(share * E - 1e-9))
    load = np.sum([one_hot(s, E).sum(1) for s in seqs], axis=0).astype(float)  # [L, E]
    load = load[load.sum(1) > 0]
    top_load = -np.sort(-load, axis=1)[:, :top].sum(1)
    return {"hot5_share": float((top_load / load.sum(1)).mean()) if len(load) else None,
            "hot5_uniform": top / E}


def temporal_locality(dec: list[np.ndarray], E: int, k: int) -> dict:
    """P(an expert a token uses at a decode step is used at the same layer in one of the next
    d decode steps), pooled over requests, layers, steps and experts whose step t + d exists,
    for d in LOCALITY_STEPS; beside random routing's 1 - (1 - k/E)^d. A step with a gap at
    the layer (a raw recording) counts as not using the expert."""
    hits = {d: 0 for d in LOCALITY_STEPS}
    total = dict(hits)
    for seq in dec:
        sets = one_hot(seq, E)  # [L, D, E]
        valid = seq[..., 0] >= 0  # [L, D]
        D = sets.shape[1]
        for d in LOCALITY_STEPS:
            if D <= d:
                continue
            now = sets[:, :D - d] & valid[:, d:, None]  # used at t, step t + d exists
            later = np.zeros_like(now)
            for j in range(1, d + 1):
                later |= sets[:, j:D - d + j]
            hits[d] += int((now & later).sum())
            total[d] += int(now.sum())
    out = {}
    for d in LOCALITY_STEPS:
        out[f"locality_within{d}"] = hits[d] / total[d] if total[d] else None
        out[f"locality_random{d}"] = 1 - (1 - k / E) ** d
    return out


def request_profiles(seqs: list[np.ndarray], E: int, k: int) -> np.ndarray:
    """float [R, L*E]: each request's token share per (layer, expert), its EAM row-normalised
    by tokens x k (the activation vector of docs/routing.md)."""
    rows = []
    for seq in seqs:
        n = np.maximum((seq[..., 0] >= 0).sum(1), 1)[:, None]  # [L, 1]
        rows.append((one_hot(seq, E).sum(1) / n / k).ravel())
    return np.stack(rows)


def task_similarity(profiles: np.ndarray, tasks, datasets) -> dict:
    """Mean activation cosine over request pairs of the same task, of the same dataset but
    another task, and of different datasets; the task contrast (same task - other dataset)
    and the dataset contrast (same dataset, other task - other dataset). None where no pair."""
    cos = cosine_matrix(profiles)
    t, d = np.asarray(tasks), np.asarray(datasets)
    iu = np.triu_indices(len(cos), 1)
    same_t = (t[:, None] == t[None])[iu]
    same_d = (d[:, None] == d[None])[iu]
    c = cos[iu]

    def mean(mask):
        return float(c[mask].mean()) if mask.any() else None

    out = {"cos_same_task": mean(same_t), "cos_same_dataset": mean(same_d & ~same_t),
           "cos_other_dataset": mean(~same_d)}
    other = out["cos_other_dataset"]
    for key, of in (("task_contrast", "cos_same_task"), ("dataset_contrast", "cos_same_dataset")):
        out[key] = None if other is None or out[of] is None else out[of] - other
    return out


def groups_by_dataset(profiles: np.ndarray, datasets, seed: int = 0) -> dict:
    """K-means groups (analysis.characterize.request_groups) of each dataset's requests, in
    trace order: `groups.<ds>`, `largest_group_share.<ds>` (the largest group's share of the
    dataset's requests, MoE-Infinity Table 2's "normalised max group") and
    `transition_max.<ds>`. Datasets with fewer than MIN_GROUP_REQUESTS requests are skipped."""
    d = np.asarray(datasets)
    out = {}
    for name in dict.fromkeys(d.tolist()):
        mine = profiles[d == name]
        if len(mine) < MIN_GROUP_REQUESTS:
            continue
        got = request_groups(mine, seed)
        if got.get("groups") is None:
            continue
        out[f"groups.{name}"] = got["groups"]
        out[f"largest_group_share.{name}"] = float(np.bincount(got["labels"]).max()
                                                   / len(mine))
        out[f"transition_max.{name}"] = got["transition_max"]
    return out


def structure(seqs: list[np.ndarray], dec: list[np.ndarray], E: int, k: int, tasks=None,
              datasets=None, seed: int = 0, groups: bool = True) -> dict:
    """Every statistic of this module, flat: keys as in docs/routing.md ("Structure").
    tasks / datasets: one label per request of `seqs` (None: no task statistics). K-means
    runs per dataset and over all requests (key "all", what an unlabelled sample allows)."""
    st: dict = {"reused_share_decode": reused_share(dec, E)}
    st.update(entropy_growth(dec, E, k))
    st.update(hot_share(seqs, E))
    st.update(temporal_locality(dec, E, k))
    profiles = request_profiles(seqs, E, k)
    if tasks is not None and datasets is not None:
        st.update(task_similarity(profiles, tasks, datasets))
    if groups:
        st.update(groups_by_dataset(profiles, [ALL] * len(seqs), seed))
        if datasets is not None:
            st.update(groups_by_dataset(profiles, datasets, seed))
    return st


def render_structure(st: dict, decode_requests: int) -> str:
    """Markdown lines for `moebench characterize`: every statistic of `structure`."""
    lines = ["", f"Structure (analysis/routing_structure.py; decode statistics over "
                 f"{decode_requests} decode windows):", "", "| statistic | value |", "|---|---|"]
    for key, value in st.items():
        shown = "n/a" if value is None else (f"{value:.4f}" if isinstance(value, float)
                                             else str(value))
        lines.append(f"| {key} | {shown} |")
    return "\n".join(lines) + "\n"
