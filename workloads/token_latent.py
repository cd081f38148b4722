"""Token latent of the synthetic score (`token_latent_std`; docs/routing.md, "Generator
parameters").

Per token (position t of request r) and stack, LATENT_RANK factors z[t, r] ~ N(0, 1)
(clipped to +-6) are drawn; layer l adds

    token_latent_std * sum_i W[i, l, e] * z[t, r, i]

to expert e's score, W a fixed seeded loading matrix [r, L, E] whose (l, e) columns have unit
norm, so the term has std token_latent_std for every (l, e). Why: a token's experts at
adjacent layers then share a cause that several experts of each layer load on, as in real
routing where an expert points to several likely successors (cross-layer mutual information
0.546 bits on the DeepSeek-V2-Lite fit split against 0.13 from the one-partner copies of
workloads/cross_layer.py). A token's factors are its own: nothing reads a later token. Each
stack (encoder, decoder) has its own factors, as another token passes it. 0 = off: nothing is
drawn, traces are as before the knob.
"""

from __future__ import annotations

import math

import numpy as np

from core import numerics
from core.rng import stream

LATENT_RANK = 2  # factors per token: rank 2 gives 2-3x the mutual information of rank 4
# or 16 at the same std (fit seed, DeepSeek-V2-Lite shape): each factor moves many experts
CLIP = 6.0  # |z| <= 6: keeps the term within score_bound


def latent_bound(std: float) -> float:
    """Largest |term|: unit-norm columns times a clipped z, ||z|| <= 6 sqrt(rank)."""
    return std * CLIP * math.sqrt(LATENT_RANK)


def latent_loadings(cfg, stacks: tuple[str, ...], E: int):
    """None (off), or (W float32 [rank, L, E] scaled by token_latent_std, group int64 [L]: the
    stack index of each layer, count of stacks). Model-level, like G: every split shares W."""
    s = float(cfg.token_latent_std or 0)
    if s == 0:
        return None
    L = len(stacks)
    w = numerics.standard_normal(stream(cfg.seed, "synthetic/token-latent-loadings"),
                                 (LATENT_RANK, L, E))
    sq = w[0] * w[0]
    for i in range(1, LATENT_RANK):  # fixed order: the same norm bits everywhere
        sq += w[i] * w[i]
    w *= s / np.sqrt(sq)
    group = np.cumsum([0] + [a != b for a, b in zip(stacks[1:], stacks[:-1])]).astype(np.int64)
    return w.astype(np.float32), group, int(group[-1]) + 1


def chunk_factors(cfg, chunk: int, t_max: int, c: int, n_stacks: int) -> np.ndarray:
    """The factors of one chunk's c members (padding included: the draws keep their shape),
    float32 [t_max, c, stacks, rank], from the chunk's own stream."""
    rng = stream(cfg.seed, f"synthetic/{cfg.split}/token-latent/chunk{chunk:06d}")
    z = numerics.standard_normal(rng, (t_max, c, n_stacks, LATENT_RANK))
    return np.clip(z, -CLIP, CLIP).astype(np.float32)


def add_latent(y: np.ndarray, z: np.ndarray, latent, tmp: np.ndarray) -> None:
    """y float32 [tb, L, n, E] += the term of the block's factors z float32 [tb, n, stacks,
    rank]; tmp float32 [tb, L, n, E] scratch. One multiply and one add per factor, in factor
    order (no BLAS, no fused operations): the same bits on every CPU."""
    w, group, _ = latent
    for i in range(LATENT_RANK):
        zi = z[:, :, group, i].transpose(0, 2, 1)[..., None]  # [tb, L, n, 1]
        np.multiply(w[i][None, :, None, :], zi, out=tmp)
        y += tmp
