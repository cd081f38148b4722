"""The synthetic generator's inner loop: one chunk of requests through every token position
(score model: workloads/synthetic.py).

Per position the loop draws raw noise bits, advances the AR(1) state and selects each
(layer, request) row's top-k of E packed keys. It is arranged for one core, and so that the
stored bits are the ones a plain per-position loop gives:

- Raw words are drawn for BLOCK_POSITIONS positions in one `random_raw` call: PCG64 emits one
  word sequence however it is split, and each position's words keep their order (noise
  [c, L, E] uint16, then the cross-layer bytes [c, L, E] uint8).
- Per position, arrays are layer-major, [L, requests, E], and the cross-layer copies run on
  the block's noise as [L, positions, requests, E]: a layer's slice is one contiguous run
  (a gather and a select per layer), and the per-position arithmetic runs on contiguous
  arrays. Moving to these layouts moves rows of E values, which is cheap; values never move
  between rows, so every reduction over E (the softmax sums) sees the same operands in the
  same order.
- Only the recurrence (z = rho * z + alpha * w) runs position by position; alpha * w,
  beta * w, the keys, the sort and the chosen weights run on the whole block. Every float
  operation is the same elementwise operation on the same operands, in the same order.
- The rows of a short last chunk's padding requests are drawn (the stream must advance
  identically) but never computed: a request's scores depend on its own rows only.
- Each row's keys are sorted in full (numpy's SIMD sort of distinct int32 keys): its last k
  are the top k, largest first, with no second sort. A sort of distinct keys has one result
  on every SIMD path.
"""

from __future__ import annotations

import math

import numpy as np

from core import numerics
from workloads.cross_layer import copy_layers_layer_major
from workloads.half import to_float16
from workloads.token_latent import add_latent

SCORE_OFFSET = 32.0  # scores are shifted positive so float bits sort like integers
PROBS_PREFILL_TOKENS = 64  # prefill `probs` averages every max(1, P // 64)-th prompt token
BLOCK_POSITIONS = 8  # positions per block: amortises numpy's per-call cost, stays in L2
_U16_MEAN, _U16_STD = 32767.5, math.sqrt((65536**2 - 1) / 12)  # raw uniform uint16 noise


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of float32 scores [..., n] with |x| < SCORE_OFFSET - 1 (no
    overflow, no underflow to 0): core.numerics.exp and numpy's fixed-order sum over the
    (contiguous) last axis, not a BLAS product with ones, whose order depends on the kernel."""
    p = numerics.exp(x)
    p *= (1 / p.sum(axis=-1))[..., None]
    return p


class Workspace:
    """Arrays reused from chunk to chunk (by name, while shape and dtype match): a fresh
    multi-megabyte array costs a page fault per 4 KiB on first touch, about as much as a
    pass over it."""

    def __init__(self):
        self._arrays = {}
        self.blocks = {}  # (tb, n): _Block

    def empty(self, name: str, shape: tuple, dtype) -> np.ndarray:
        arr = self._arrays.get(name)
        if arr is None or arr.shape != shape or arr.dtype != dtype:
            arr = self._arrays[name] = np.empty(shape, dtype)
        return arr

    def zeros(self, name: str, shape: tuple, dtype) -> np.ndarray:
        arr = self.empty(name, shape, dtype)
        arr.fill(0)
        return arr


def route_chunk(rng, pref, cfg, n0, counts, t_max, k, keep, n, idt, cross=None,
                with_probs=True, ws: Workspace | None = None, latent=None):
    """Route one chunk of requests through all layers and token positions.

    pref float32 [c, L, E] (bounded log-preferences) of the chunk's c members, of which the
    first n are real (the rest pad a short last chunk); per member prefill tokens n0 int
    [c, L] and tokens per (step, layer) counts [c, S, L] (0 past a request's last step);
    keep: mask of a packed key's score bits; cross: the cross-layer map
    (workloads/cross_layer.py) or None; latent: None or (loadings, the chunk's factors
    [t_max, c, stacks, rank]) (workloads/token_latent.py); with_probs False: probs stay 0
    -> (ids idt [t_max, L, n, k] and weights float16 [t_max, L, n, k]: each (position,
    layer, request)'s top-k experts, largest score first, and the softmax over their scores;
    probs float32 [n, S, L, E]: router probabilities averaged over each step).
    """
    c, L, E = pref.shape
    rho, a = cfg.stickiness, cfg.sticky_std
    # Raw uint16 noise w (mean _U16_MEAN) drives X; the means are folded into a shifted state
    # z = X + mz and into `base`, so the loop only multiplies and adds.
    alpha = np.float32(a * math.sqrt(1 - rho * rho) / _U16_STD)
    beta = np.float32(cfg.token_noise_std / _U16_STD)
    mz = float(alpha) * _U16_MEAN / (1 - rho)
    base = (pref[:n] + np.float32(SCORE_OFFSET - mz - float(beta) * _U16_MEAN)).astype(
        np.float32)
    z = np.clip(numerics.standard_normal(rng, (c, L, E)), -6, 6).astype(np.float32)[:n]
    z = z * np.float32(a) + np.float32(mz)  # stationary start
    state = _State(base.transpose(1, 0, 2).copy(), z.transpose(1, 0, 2).copy(),  # [L, n, E]
                   alpha, beta, rho, (np.float32(mz - 6 * a), np.float32(mz + 6 * a)))
    ws = ws if ws is not None else Workspace()
    cand = ws.empty("cand", (t_max, L, n, k), np.int32)  # packed top-k keys, ascending
    acc = _ProbsAccumulator(n0[:n], counts[:n], t_max, E, with_probs, ws)
    for t0 in range(0, t_max, BLOCK_POSITIONS):
        tb = min(BLOCK_POSITIONS, t_max - t0)
        if (tb, n) not in ws.blocks:
            ws.blocks[tb, n] = _Block(tb, n, L, E, cross, ws)
        blk = ws.blocks[tb, n]
        w, u8 = _noise(rng, tb, c, L, E, cross)  # the padding's words are drawn, not used
        blk.load_noise(w[:, :n], None if u8 is None else u8[:, :n])
        y = blk.scores(state, t0)  # score + SCORE_OFFSET, float32 [tb, L, n, E]
        if latent is not None:  # blk.wf (the noise) is spent: the scratch of the products
            add_latent(y, latent[1][t0:t0 + tb, :n], latent[0], blk.wf)
        acc.add(y, t0)
        cand[t0:t0 + tb] = blk.top_keys(keep, k)
    ids, weights = _finish(cand, keep, idt, ws)
    return ids, weights, acc.finish()


class _State:
    """The AR(1) state z [L, n, E] (shifted: X + mz) and the constants of the recurrence."""

    def __init__(self, base, z, alpha, beta, rho, zlim):
        self.base, self.z, self.alpha, self.beta = base, z, alpha, beta
        self.rho, self.zlim = np.float32(rho), zlim


class _Block:
    """Buffers of one block of tb positions, each layer-major: [tb, L, n, E]."""

    def __init__(self, tb: int, n: int, L: int, E: int, cross, ws: Workspace):
        shape = (tb, L, n, E)
        self.wf, self.y = (ws.empty(f"block/{name}", shape, np.float32) for name in "wy")
        self.tmp = ws.empty("block/tmp", shape[1:], np.float32)
        self.cross = cross
        if cross is not None:  # noise for the copies, layer-major: [L, tb, n, E]
            self.w, self.fresh = (ws.empty(f"block/{name}", (L, tb, n, E), np.uint16)
                                  for name in ("w", "fresh"))
            self.moved = ws.empty("block/moved", (tb, n, E), np.uint16)
        self.expert = np.tile(np.arange(E, dtype=np.int32), tb * L * n)  # a key's expert id

    def load_noise(self, w: np.ndarray, u8: np.ndarray | None) -> None:
        """self.wf = the block's noise w uint16 [tb, n, L, E] as float32 [tb, L, n, E]
        (exact), after the cross-layer copies driven by the bytes u8 [tb, n, L, E]."""
        if self.cross is None:
            np.copyto(self.wf, w.transpose(0, 2, 1, 3))
            return
        # the copies run layer by layer on contiguous [tb, n, E] slices; moving to and from
        # that layout moves rows of E values, then runs of n * E
        np.copyto(self.w, w.transpose(2, 0, 1, 3))
        np.copyto(self.fresh, u8.transpose(2, 0, 1, 3))
        copy_layers_layer_major(self.w, self.fresh, self.moved, self.cross)
        np.copyto(self.wf, self.w.transpose(1, 0, 2, 3))

    def scores(self, st: _State, t0: int) -> np.ndarray:
        """Scores + SCORE_OFFSET float32 [tb, L, n, E] of the block's positions; advances
        st.z in place. Per position: z = z * rho + w * alpha (clipped to +-6 sigma every 32
        positions), score = (base + z) + w * beta: float32, in that order."""
        tmp = self.tmp
        for i, (w, y) in enumerate(zip(self.wf, self.y)):
            st.z *= st.rho
            st.z += np.multiply(w, st.alpha, out=tmp)  # X[t] + mz
            if (t0 + i) % 32 == 31:  # keep |X| <= 6 sigma so offset scores stay positive
                np.clip(st.z, *st.zlim, out=st.z)
            np.add(st.base, st.z, out=y)
            y += np.multiply(w, st.beta, out=tmp)
        return self.y

    def top_keys(self, keep, k: int) -> np.ndarray:
        """The k largest packed keys of every row, ascending: int32 [tb, L, n, k] (a view;
        self.y becomes the keys). A key is the score's float bits (positive, so they sort
        like the floats) with the low bits replaced by the expert id: no ties, id
        recoverable."""
        keys = self.y.view(np.int32)
        keys &= keep
        keys.reshape(-1)[:] |= self.expert
        keys.sort(axis=-1)
        return keys[..., -k:]


def _finish(cand, keep, idt, ws: Workspace, block=16):
    """Top-k ids and weights [T, L, n, k], largest score first, from each row's k largest
    packed keys int32 [T, L, n, k] (ascending), `block` positions at a time: large enough
    that numpy's per-call cost vanishes in the softmax's ~25 passes, small enough to stay
    in cache."""
    ids = ws.empty("ids", cand.shape, idt)
    weights = ws.empty("weights", cand.shape, np.float16)
    for t0 in range(0, len(cand), block):
        top = cand[t0:t0 + block, ..., ::-1]  # largest first
        ids[t0:t0 + block] = top & ~keep
        chosen = (top & keep).view(np.float32)  # the chosen scores' float bits, contiguous
        chosen -= np.float32(SCORE_OFFSET)
        weights[t0:t0 + block] = to_float16(_softmax_few(chosen))  # over the chosen experts
    return ids, weights


def _softmax_few(x: np.ndarray) -> np.ndarray:
    """softmax(x) for a short last axis (n < 8), the same bits: numpy sums fewer than 8
    values of a row left to right (its pairwise sum starts at 8), and so do these column
    additions, without numpy's per-row reduction cost."""
    n = x.shape[-1]
    if n >= 8:
        return softmax(x)
    p = numerics.exp(x)
    total = p[..., 0].copy()
    for j in range(1, n):
        total += p[..., j]
    p *= (1 / total)[..., None]
    return p


def _noise(rng, tb: int, c: int, L: int, E: int, cross):
    """Raw noise of tb positions in one draw: per position the words of w [c, L, E] uint16,
    then (coupling on) those of the copy bytes [c, L, E] uint8, as the per-position draws
    gave them -> (w uint16 [tb, c, L, E], u8 uint8 [tb, c, L, E] or None), views of the
    words (c * L * E is a multiple of 8: c is CHUNK_REQUESTS)."""
    n16, n8 = c * L * E // 4, (c * L * E // 8 if cross is not None else 0)
    raw = rng.bit_generator.random_raw(tb * (n16 + n8)).reshape(tb, n16 + n8)
    w = raw[:, :n16].view(np.uint16).reshape(tb, c, L, E)
    return w, (raw[:, n16:].view(np.uint8).reshape(tb, c, L, E) if n8 else None)


class _ProbsAccumulator:
    """Router probabilities per (request, step, layer), float32 [n, S, L, E]: the mean over a
    step's tokens (decode: its one token; prefill: every stride-th prompt token), summed in
    position order."""

    def __init__(self, n0, counts, t_max, E, with_probs, ws: Workspace):
        n, S, L = counts.shape
        self.n0 = n0
        self.probs = ws.zeros("probs", (n, S, L, E), np.float32)
        self.stride = np.maximum(1, n0.max(axis=1) // PROBS_PREFILL_TOKENS)[:, None]  # [n, 1]
        tpos = np.arange(t_max, dtype=np.int32)[:, None, None]
        self.steps = np.maximum(tpos - n0.astype(np.int32) + 1, 0)  # step of position t [T, n, L]
        live = (self.steps < S) & (counts[np.arange(n)[:, None],
                                          np.minimum(self.steps, S - 1), np.arange(L)] > 0)
        live &= (self.steps > 0) | (tpos % self.stride == 0)  # decode, every stride-th prefill
        live &= with_probs
        self.live = live
        # one step for every request and layer: a plain slice add
        self.uniform = live.all(axis=(1, 2)) & (self.steps == self.steps[:, :1, :1]).all(
            axis=(1, 2))
        self.any_live = live.any(axis=(1, 2))

    def add(self, y: np.ndarray, t0: int) -> None:
        """Add the probabilities of the block's live positions (y: scores + SCORE_OFFSET,
        [tb, L, n, E])."""
        ts = [t0 + i for i in range(len(y)) if self.any_live[t0 + i]]
        if not ts:
            return
        p = softmax(y[np.array(ts) - t0] - np.float32(SCORE_OFFSET))  # [positions, L, n, E]
        for i, t in enumerate(ts):  # in position order: the sums' rounding as one by one
            pt = p[i].transpose(1, 0, 2)  # [n, L, E]
            if self.uniform[t]:
                self.probs[:, self.steps[t, 0, 0]] += pt
            else:
                req, lay = np.nonzero(self.live[t])
                self.probs[req, self.steps[t, req, lay], lay] += pt[req, lay]

    def finish(self) -> np.ndarray:
        self.probs[:, 0] /= ((self.n0 - 1) // self.stride + 1)[:, :, None]  # prefill mean
        return self.probs
