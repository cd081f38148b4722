"""Routing statistics of a trace or a raw routing recording (definitions: docs/routing.md).

Every statistic works on per-request sequences: int [L, T, k] expert ids per MoE layer and
token position (all steps of the request in order), -1 where the token has no record at that
layer (a gap in a recording, or a layer the token does not pass). Within-request statistics
are averaged over requests with at least `min_tokens` tokens at a layer (each request counts
once); the reuse-distance CDF pools every routing.
"""

from __future__ import annotations

import math

import numpy as np

LAGS = (1, 2, 4, 8, 16)
CDF_DISTANCES = (1, 2, 4, 8, 16, 32, 64, 128)
HEAVY_TOKEN_SHARE = 1 / 3  # "reused heavily": the expert serves >= 1/3 of the layer's tokens
KMEANS_DIMS = 32  # K-means runs on this many principal components of the activation vectors
GUESS_POSITIONS = 64  # frequency-guess accuracy is sampled at about this many positions
KMAX = 50  # groups: best silhouette for k in 2..KMAX (docs/routing.md)


def request_sequences(tr, field: str = "topk") -> list[np.ndarray]:
    """Per request int16 [L, T, k]: `field` rows (topk or spec_topk) by layer and position."""
    L, k = tr.num_layers, tr.top_k
    arr = getattr(tr, field)
    counts = np.diff(tr.block_offsets)
    out = []
    for r in range(tr.num_requests):
        b0, b1 = int(tr.step_offsets[r]) * L, int(tr.step_offsets[r + 1]) * L
        row_layer = np.repeat(np.arange(b0, b1) % L, counts[b0:b1])  # layer of each row
        rows = arr[tr.block_offsets[b0]:tr.block_offsets[b1]]
        order = np.argsort(row_layer, kind="stable")  # by layer, steps stay in order
        per_layer = np.bincount(row_layer, minlength=L)
        pos = np.arange(len(order)) - np.repeat(np.cumsum(per_layer) - per_layer, per_layer)
        seq = np.full((L, int(per_layer.max()), k), -1, np.int16)
        seq[row_layer[order], pos] = rows[order]
        out.append(seq)
    return out


def one_hot(seq: np.ndarray, E: int) -> np.ndarray:
    """bool [L, T, E]: expert e routed for token t at layer l (gaps are all False)."""
    sets = np.zeros(seq.shape[:2] + (E + 1,), bool)
    np.put_along_axis(sets, np.where(seq < 0, E, seq).astype(np.int64), True, axis=-1)
    return sets[..., :E]


def entropy_bits(p: np.ndarray) -> np.ndarray:
    """Shannon entropy (bits) over the last axis of distributions p [..., E]."""
    return -(p * np.log2(np.where(p > 0, p, 1.0))).sum(-1)


def per_request(seq: np.ndarray, E: int, k: int, min_tokens: int) -> dict:
    """Statistics of one request. A request with fewer than min_tokens tokens at every layer
    only adds to the aggregate load ("counts")."""
    sets = one_hot(seq, E)  # [L, T, E]
    valid = seq[..., 0] >= 0  # [L, T]
    n = valid.sum(1)  # tokens per layer [L]
    out: dict = {"counts": sets.sum(1)}  # [L, E] routings per expert
    keep = n >= min_tokens
    if not keep.any():
        return out
    for d in LAGS:  # share of a token's k experts also used d tokens earlier, same layer
        pairs = (valid[:, d:] & valid[:, :-d]).sum() if seq.shape[1] > d else 0
        out[f"reuse_lag{d}"] = (float((sets[:, d:] & sets[:, :-d]).sum() / (k * pairs))
                                if pairs else None)
    # reuse distance: tokens since the same expert was last used at the same layer
    L, T = valid.shape
    ids = seq.astype(np.int64)
    key = (np.arange(L)[:, None, None] * E + ids) * T + np.arange(T)[None, :, None]
    key = np.sort(key[ids >= 0])  # ordered by (layer, expert, position)
    same = (key[1:] // T) == (key[:-1] // T)
    out["distances"] = (key[1:] - key[:-1])[same]
    out["first_uses"] = int(len(key) - same.sum())
    counts = out["counts"][keep].astype(float)  # [L', E]
    p = counts / counts.sum(-1, keepdims=True)
    tokens = n[keep][:, None]
    out.update(entropy_bits=float(entropy_bits(p).mean()), top_share=float(p.max(-1).mean()),
               used=float((counts > 0).mean()), once=float((counts == 1).mean()),
               repeated=float((counts >= 2).mean()),
               heavy=float((counts >= HEAVY_TOKEN_SHARE * tokens).mean()))
    # frequency guess: before token t reaches a layer, guess the k experts this request used
    # most at that layer so far (ties: lower id). An actual expert is guessed when fewer
    # than k experts rank above it. Share of the actual experts guessed.
    # Evaluated at every stride-th position (at most ~GUESS_POSITIONS per layer) for speed.
    at = np.arange(1, T, max(1, T // GUESS_POSITIONS))
    seg = np.add.reduceat(sets, np.concatenate([[0], at]), axis=1, dtype=np.int16)
    before = np.cumsum(seg[:, :-1], axis=1, dtype=np.int16)  # [L, T', E] uses before t
    act = seq[:, at].astype(np.int64)  # [L, T', k]
    ok = act[..., 0] >= 0
    mine = np.take_along_axis(before, np.maximum(act, 0), axis=-1)[..., None]  # [L,T',k,1]
    above = (before[..., None, :] > mine) | ((before[..., None, :] == mine) & (
        np.arange(E) < act[..., None]))
    hit = (above.sum(-1) < k)[ok].sum()
    out["freq_guess_hit"] = float(hit / (k * ok.sum())) if ok.any() else None
    out["profile"] = np.where(keep[:, None], out["counts"] / np.maximum(n, 1)[:, None] / k, 0)
    return out


def _layer_pairs(seq: np.ndarray, perm: np.ndarray | None = None):
    """A token's experts at layer l and at layer l+1, for every (l, t) where the token has
    both: (layer int [n], at_l int [n, k], at_next int [n, k]). With perm [T], layer l+1's
    experts are those of token perm[t] instead (the shuffled baseline)."""
    src = np.arange(seq.shape[1]) if perm is None else perm
    ok = (seq[:-1, :, 0] >= 0) & (seq[1:, src, 0] >= 0)  # [L-1, T]
    lay, pos = np.nonzero(ok)
    return lay, seq[lay, pos].astype(np.int64), seq[lay + 1, src[pos]].astype(np.int64)


def _pair_counts(pairs, L1: int, E: int) -> np.ndarray:
    """int64 [L1, E, E]: count of (expert i at layer l, expert j at l+1) over every pair of
    a token's k and k experts."""
    lay, at_l, at_next = pairs
    key = (lay[:, None, None] * E + at_l[:, :, None]) * E + at_next[:, None, :]  # [n, k, k]
    return np.bincount(key.ravel(), minlength=L1 * E * E).reshape(L1, E, E)


def _hits(guess: np.ndarray, actual: np.ndarray) -> int:
    """Guessed ids int [n, k] that are among the actual (distinct) ids int [n, k]."""
    return int((guess[:, :, None] == actual[:, None, :]).any(-1).sum())


def cross_layer(seqs: list[np.ndarray], E: int, k: int, seed: int = 0) -> dict:
    """Per-token cross-layer predictability (docs/routing.md, "Cross-layer predictability").

    Fit half: even-indexed requests (a single request: its first half of tokens); test half:
    the rest. T[l][i, j] = P(expert j at layer l+1 | expert i at layer l, same token) from the
    fit half, add-one smoothed. For each test token and layer l < L-1, guess layer l+1's k
    experts as the k largest of sum over its layer-l experts i of T[l][i, :]; precision =
    share of the actual experts guessed, pooled over tokens and layers. Baselines: the fit
    half's k most used experts of layer l+1 ("popularity") and k / E. Model-free: mutual
    information (bits, mean over layer pairs) of (expert at l, expert at l+1) over every
    pair of the same token's experts, all requests, and the same with each request's layer
    l+1 tokens shuffled (seeded): what request-level preferences and estimation bias alone
    give. Index arithmetic only (no BLAS: matmul threads stall on a busy shared machine)."""
    if not seqs or seqs[0].shape[0] < 2:
        return {}
    L1 = seqs[0].shape[0] - 1
    if len(seqs) == 1:
        half = seqs[0].shape[1] // 2
        fit, test = [seqs[0][:, :half]], [seqs[0][:, half:]]
    else:
        fit, test = seqs[0::2], seqs[1::2]
    counts = sum(_pair_counts(_layer_pairs(seq), L1, E) for seq in fit)  # [L-1, E, E]
    trans = ((counts + 1) / (counts + 1).sum(-1, keepdims=True)).astype(np.float32)
    pop = np.argsort(-counts.sum(1), axis=-1, kind="stable")[:, :k]  # [L-1, k] by l+1 load
    hits = pop_hits = tokens = 0
    joint = counts.copy()  # all pairs of every request (both halves)
    for seq in test:
        pairs = _layer_pairs(seq)
        joint += _pair_counts(pairs, L1, E)
        lay, at_l, at_next = pairs
        score = trans[lay[:, None], at_l].sum(1)  # [n, E]
        guess = np.argpartition(-score, k - 1, axis=-1)[:, :k]
        hits += _hits(guess, at_next)
        pop_hits += _hits(pop[lay], at_next)
        tokens += len(lay)
    if not tokens:
        return {}
    rng = np.random.default_rng([seed, 7])
    shuffled = sum(_pair_counts(_layer_pairs(seq, rng.permutation(seq.shape[1])), L1, E)
                   for seq in seqs)
    return {"xl_precision": hits / (k * tokens), "xl_popularity": pop_hits / (k * tokens),
            "xl_random": k / E, "xl_mi_bits": _mutual_information(joint),
            "xl_mi_shuffled_bits": _mutual_information(shuffled)}


def _mutual_information(joint: np.ndarray) -> float:
    """Mean over layer pairs of the plug-in mutual information (bits) of counts [L-1, E, E]."""
    p = joint / np.maximum(joint.sum((1, 2), keepdims=True), 1e-12)
    indep = p.sum(2, keepdims=True) * p.sum(1, keepdims=True)
    ratio = np.where(p > 0, p / np.where(indep > 0, indep, 1), 1.0)
    return float((p * np.log2(ratio)).sum((1, 2)).mean())


def kmeans(x: np.ndarray, k: int, seed: int, restarts: int = 3) -> tuple[np.ndarray, float]:
    """Best (lowest inertia) of `restarts` seeded k-means++ runs; x float [n, d] ->
    (labels int [n], inertia)."""
    runs = [_kmeans_once(x, k, np.random.default_rng([seed, k, i])) for i in range(restarts)]
    return min(runs, key=lambda run: run[1])


def _kmeans_once(x: np.ndarray, k: int, rng, iters: int = 100) -> tuple[np.ndarray, float]:
    """k-means++ seeding, then Lloyd iterations until the labels stop changing."""
    n = len(x)
    centers = [x[rng.integers(n)]]
    d2 = ((x - centers[0]) ** 2).sum(1)
    for _ in range(1, k):
        i = rng.choice(n, p=d2 / d2.sum()) if d2.sum() > 0 else rng.integers(n)
        centers.append(x[i])
        d2 = np.minimum(d2, ((x - x[i]) ** 2).sum(1))
    c = np.array(centers)
    labels = np.full(n, -1)
    for _ in range(iters):
        dist = (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None]  # [n, k]
        new = dist.argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
        onehot = np.eye(k)[labels]  # [n, k]
        size = onehot.sum(0)
        c = np.where(size[:, None] > 0, onehot.T @ x / np.maximum(size, 1)[:, None], c)
    dist = (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None]
    return labels, float(np.maximum(dist[np.arange(n), labels], 0).sum())


def silhouette(dist: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette from a distance matrix [n, n] (points alone in a group score 0)."""
    k = int(labels.max()) + 1
    onehot = np.eye(k)[labels]  # [n, k]
    size = onehot.sum(0)
    sums = dist @ onehot  # [n, k] summed distance to each group
    own = size[labels] - 1
    a = np.where(own > 0, sums[np.arange(len(labels)), labels] / np.maximum(own, 1), 0)
    other = np.where(onehot > 0, np.inf, sums / np.maximum(size, 1))
    other[:, size == 0] = np.inf
    b = other.min(1)
    s = np.where(own > 0, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0)
    return float(s.mean())


def request_groups(profiles: np.ndarray, seed: int = 0, kmax: int = KMAX) -> dict:
    """K-means on L2-normalised activation vectors [R, L*E]; best silhouette k in 2..kmax."""
    x = profiles / np.maximum(np.linalg.norm(profiles, axis=1, keepdims=True), 1e-12)
    x = x - x.mean(0)
    eig, vec = np.linalg.eigh(x @ x.T)  # Gram matrix [R, R]: cheaper than an SVD of x
    top = np.argsort(eig)[::-1][:KMEANS_DIMS]
    x = vec[:, top] * np.sqrt(np.maximum(eig[top], 0))  # principal components [R, <=32]
    sq = (x * x).sum(1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * x @ x.T, 0))
    best = (-2.0, 0, None)
    scores = {}
    for k in range(2, min(kmax, len(x) - 1) + 1):
        labels, _ = kmeans(x, k, seed)
        scores[k] = silhouette(dist, labels)
        if scores[k] > best[0]:
            best = (scores[k], k, labels)
    if best[2] is None:
        return {"groups": None}
    return {"groups": best[1], "silhouette": best[0], "labels": best[2], "scores": scores,
            **transitions(best[2])}


def transitions(labels: np.ndarray, min_count: int = 5) -> dict:
    """Group of request i -> group of request i+1 (trace order): the largest transition
    probability out of groups left at least min_count times, and the median of such rows'
    largest probability."""
    k = int(labels.max()) + 1
    t = np.zeros((k, k))
    np.add.at(t, (labels[:-1], labels[1:]), 1)
    rows = t[t.sum(1) >= min_count]
    if not len(rows):
        return {"transition_max": None, "transition_rowmax_median": None}
    p = rows / rows.sum(1, keepdims=True)
    return {"transition_max": float(p.max()),
            "transition_rowmax_median": float(np.median(p.max(1)))}


def cosine_matrix(v: np.ndarray) -> np.ndarray:
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return v @ v.T


def adjacent_vs_random(profiles: np.ndarray) -> tuple[float, float]:
    """Mean activation cosine of requests i, i+1 vs of all pairs."""
    cos = cosine_matrix(profiles)
    n = len(cos)
    return float(np.diag(cos, 1).mean()), float((cos.sum() - np.trace(cos)) / (n * (n - 1)))


def semantic_coupling(profiles: np.ndarray, emb: np.ndarray) -> dict:
    """Over all request pairs: Pearson r and least-squares slope of activation cosine on
    prompt-embedding cosine, and the activation cosine of the 5% most similar prompt pairs."""
    iu = np.triu_indices(len(profiles), 1)
    a, e = cosine_matrix(profiles)[iu], cosine_matrix(emb.astype(np.float64))[iu]
    top = e >= np.quantile(e, 0.95)
    slope = float(np.cov(e, a)[0, 1] / np.var(e, ddof=1))
    return {"pearson_r": float(np.corrcoef(e, a)[0, 1]), "slope": slope,
            "act_cos_top5pct_prompt_pairs": float(a[top].mean()), "act_cos_all": float(a.mean())}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def characterize(seqs: list[np.ndarray], E: int, k: int, min_tokens: int = 16,
                 seed: int = 0, groups: bool = True) -> dict:
    """All statistics of docs/routing.md for per-request sequences [L, T, k]."""
    per = [per_request(s, E, k, min_tokens) for s in seqs]
    stats: dict = {"requests": len(seqs), "num_experts": E, "top_k": k,
                   "requests_measured": sum("entropy_bits" in p for p in per),
                   "random_reuse": k / E, "uniform_share": 1 / E}
    for key in [f"reuse_lag{d}" for d in LAGS] + ["entropy_bits", "top_share", "used", "once",
                                                    "repeated", "heavy", "freq_guess_hit"]:
        stats[key] = _mean(p.get(key) for p in per)
    dist = np.concatenate([p["distances"] for p in per if "distances" in p] + [[]])
    total = len(dist) + sum(p.get("first_uses", 0) for p in per)
    if total:
        stats["reuse_distance_cdf"] = {d: float((dist <= d).sum() / total)
                                       for d in CDF_DISTANCES}
        stats["first_use_share"] = float(1 - len(dist) / total)
    measured = [p["profile"] for p in per if "profile" in p]
    if not measured:
        return stats
    profiles = np.stack([m.ravel() for m in measured])  # [R', L*E] token share per expert
    stats["profile_requests"] = [i for i, p in enumerate(per) if "profile" in p]
    load = np.sum([p["counts"] for p in per], axis=0)  # [L, E] routings, all requests
    p_agg = load / np.maximum(load.sum(-1, keepdims=True), 1e-12)
    live = load.sum(-1) > 0
    stats["agg_entropy_bits"] = float(entropy_bits(p_agg[live]).mean())
    stats["agg_top_share"] = float(p_agg[live].max(-1).mean())
    stats["agg_busiest_over_mean"] = float((p_agg[live].max(-1) * E).mean())
    stats["layer_entropy_bits"] = entropy_bits(p_agg).tolist()
    stats["load"] = p_agg
    if len(profiles) >= 2:
        stats["cos_adjacent"], stats["cos_random"] = adjacent_vs_random(profiles)
    stats["profiles"] = profiles
    if groups and len(profiles) >= 4:
        stats.update(request_groups(profiles, seed))
    stats["max_entropy_bits"] = math.log2(E)
    stats.update(cross_layer(seqs, E, k, seed))
    return stats
