"""Cross-layer coupling of the synthetic score noise (`cross_layer_corr`; docs/routing.md).

With g = cross_layer_corr, per token: n[l,t,e] is a copy of the token's n[l-1,t,src[l-1][e]]
with probability g (decided per entry), else a fresh draw; src[l] is a fixed random
permutation per layer pair, drawn once per seed like G (workloads/synthetic.py). So n, and X
through it, of expert src[l-1][e] at layer l-1 and expert e at layer l correlate by g: a
token's experts at one layer point to likely experts at the next, as in real routing
(docs/routing.md, "Cross-layer predictability"), while n stays i.i.d. uniform over tokens
and within a layer, so each layer's own statistics barely move. No coupling across stacks
(encoder -> decoder is another token). g = 0: no copies, no extra draws (the trace is as
before the knob).
"""

from __future__ import annotations

import numpy as np

from core.blocks import linked_layers
from core.rng import stream


def cross_layer_map(cfg, stacks: tuple[str, ...], E: int):
    """None (coupling off), or (src int64 [L-1, E]: the expert of layer l that hands its noise
    to expert j of layer l+1; threshold uint8 [L]: copy where a uniform byte is below it,
    0 at layer 0 and where the stack changes)."""
    g = float(cfg.cross_layer_corr)
    L = len(stacks)
    if g == 0 or L < 2:
        return None
    rng = stream(cfg.seed, "synthetic/cross-layer")  # model-level, like G: same for all splits
    src = np.stack([rng.permutation(E) for _ in range(L - 1)])  # [L-1, E]
    same = linked_layers(stacks)[:-1]  # [L-1]: layer l+1 in layer l's stack
    # P(byte < threshold) = threshold / 256: g rounded to the nearest 1/256
    threshold = np.concatenate([[0], np.where(same, min(255, round(256 * g)), 0)])
    return src, threshold.astype(np.uint8)


def copy_layers(w: np.ndarray, u8: np.ndarray, cross) -> None:
    """In place on token positions' noise uint16 [..., L, E] (one position [c, L, E], or a
    block of them [T, c, L, E]), layer after layer: entry (l, j) takes the (already copied)
    entry (l-1, src[l-1][j]) where u8 [..., L, E] is below the layer's threshold (probability
    cross_layer_corr). Marginals stay uniform; the noise of mapped experts in adjacent layers
    correlates by cross_layer_corr, in n and so in X. The reference: the generator runs
    copy_layers_layer_major, the same values (tests/workloads/test_synthetic.py)."""
    src, threshold = cross
    copy = u8 < threshold[:, None]  # bool [..., L, E]
    for layer in np.flatnonzero(threshold):
        np.copyto(w[..., layer, :], w[..., layer - 1, :].take(src[layer - 1], axis=-1),
                  where=copy[..., layer, :])


def copy_layers_layer_major(w: np.ndarray, fresh: np.ndarray, moved: np.ndarray,
                            cross) -> None:
    """copy_layers on layer-major noise, in place: w uint16 [L, ..., E] (e.g. [L, positions,
    requests, E]), fresh uint16 [L, ..., E] the copy bytes (overwritten), moved uint16
    [..., E] scratch. The same values as copy_layers, faster: each layer's slice is one
    contiguous run, and the select w = moved + (w - moved) * fresh (fresh 0 or 1; uint16
    wrap-around, so exact) replaces numpy's masked copy."""
    src, threshold = cross
    # fresh = 1 where byte >= threshold (no copy): byte + 256 - threshold reaches 256
    fresh += (256 - threshold.astype(np.uint16)).reshape((-1,) + (1,) * (fresh.ndim - 1))
    fresh >>= 8
    for layer in np.flatnonzero(threshold):
        np.take(w[layer - 1], src[layer - 1], axis=-1, out=moved, mode="clip")
        cur = w[layer]
        cur -= moved
        cur *= fresh[layer]
        cur += moved
