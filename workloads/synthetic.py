"""Synthetic routing source: the project's embedded default (no model, no data files).

Model. For request r of task j, MoE layer l, expert e and token position t (the t-th token that
passes layer l in that request) the router logit is

    score[r,l,t,e] = task_pref_std * A[j,l,e] + request_pref_std * B[r,l,e] + X[r,l,t,e]
                     + token_noise_std * n[r,l,t,e]
    X[t] = stickiness * X[t-1] + sticky_std * sqrt(1 - stickiness**2) * n[t]   (AR(1), std sticky_std)

A, B ~ N(0, 1); n is i.i.d. unit-variance noise. Because X[t] already contains n[t], the
token-to-token correlation of the score drops sharply after one token and then decays slowly
(geometric in `stickiness`), the shape measured on real DeepSeek-V2-Lite routing (share of a
token's experts also used by the token d positions earlier: 0.27, 0.21, 0.18, 0.16, 0.15 for
d = 1, 2, 4, 8, 16; 0.094 if random). Routed experts are the top-k of the score; `weights` is
the softmax over the chosen scores; `probs` the softmax over all E experts, averaged over the
tokens of a step; `spec_topk` at layer l is the top-k of layer l+1's scores plus
N(0, guess_noise_std) noise, searched among layer l+1's top-2k experts (the only ones such noise
can plausibly promote).

Speed: the time loop works on one cache-sized chunk of requests at a time; noise comes from
random bytes through a 256-level Gaussian quantile table; top-k packs the expert id into the
low mantissa bits of the (positive, offset) float score and uses np.partition on int32, which
is several times faster than argpartition.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from harness.rng import stream
from harness.specs import ModelSpec
from harness.trace import Trace, id_dtype
from workloads.tasks import PAPER_TASK_COUNTS, task_mix

CHUNK_REQUESTS = 32  # requests per inner loop; fixed so that output never depends on it
SCORE_OFFSET = 32.0  # scores are shifted positive so float bits sort like integers
EMBEDDER = "synthetic-task-centroid"
PROBS_PREFILL_TOKENS = 64  # prefill `probs` = mean over <= ~64 evenly spaced prompt tokens
_U16_MEAN, _U16_STD = 32767.5, math.sqrt((65536**2 - 1) / 12)  # raw uniform uint16 noise


@dataclass
class SyntheticConfig:
    """All knobs of the synthetic routing source (recorded in trace meta['generator'])."""

    seed: int = 0
    num_requests: int = 290  # one request per task of the default mix
    prompt_len: int = 512  # tokens per prompt (all requests)
    output_len: int = 32  # generated tokens per request = steps (step 0 is the prefill)
    # (dataset slug, number of tasks); default: MoE-Infinity's BIG-bench/FLAN/MMLU mix
    tasks: list = field(default_factory=lambda: [list(t) for t in PAPER_TASK_COUNTS])
    split: str = "measure"  # "measure" / "calibration": same tasks, different requests
    arrival_ms: float = 0.0  # request i arrives at i * arrival_ms; 0 = static batch
    # Calibrated (tests/test_synthetic.py prints the comparison) against real DeepSeek-V2-Lite
    # prefill routing at matched prompt length (~128 tokens): entropy 5.57 of 6 bits, top
    # expert 0.066 of routings, 97% of experts used, consecutive reuse 0.27.
    layer_pref_std: float = 0.15  # model-level popularity: busiest expert ~1.8x the mean
    task_pref_std: float = 0.6  # sets within-prompt skew shared by a task; same-task similarity
    request_pref_std: float = 0.6  # sets within-prompt skew (entropy, top share, fraction used)
    sticky_std: float = 0.9  # sets the slow part of reuse (lag >= 2: 0.18-0.15 real)
    stickiness: float = 0.9  # AR(1) coefficient per token: decay of reuse with lag
    token_noise_std: float = 1.0  # fast noise std (unit of the score scale)
    fast_stickiness: float = 0.3  # AR(1) coefficient of the fast noise: reuse at lags 1-2
    guess_noise_std: float = 0.5  # next-layer guess error; ~0.8 of guessed experts correct
    embed_dim: int = 384  # as all-MiniLM-L6-v2
    embed_noise: float = 1.0  # request noise vs unit task centroid (same-task cosine ~0.5)

    def score_bound(self) -> float:
        """Largest |score| the bounded noise allows (prefs clipped at 4.5 sigma, the AR state
        clipped at 6 sigma every 32 tokens, uniform noise within +-sqrt(3))."""
        def ar_max(std: float, rho: float) -> float:
            innov = std * math.sqrt(1 - rho * rho) * math.sqrt(3)
            return max(6 * std, 6 * std * rho**31 + innov * (1 - rho**31) / (1 - rho))

        return (6 * (self.layer_pref_std + self.task_pref_std + self.request_pref_std)
                + ar_max(self.sticky_std, self.stickiness)
                + ar_max(self.token_noise_std, self.fast_stickiness)
                + math.sqrt(3) * self.guess_noise_std)

    def check(self) -> None:
        ints = ("num_requests", "prompt_len", "output_len", "embed_dim")
        for name in ints:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"synthetic.{name}: must be >= 1")
        for name in ("stickiness", "fast_stickiness"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"synthetic.{name}: must be in [0, 1)")
        stds = ("layer_pref_std", "task_pref_std", "request_pref_std", "sticky_std", "token_noise_std",
                "guess_noise_std", "embed_noise", "arrival_ms")
        for name in stds:
            v = float(getattr(self, name))
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"synthetic.{name}: must be finite and >= 0")
        if self.score_bound() > SCORE_OFFSET - 1:  # keeps offset scores positive
            raise ValueError(f"synthetic: |score| can reach {self.score_bound():.1f}; "
                             f"the *_std knobs must keep it below {SCORE_OFFSET - 1}")
        if not self.split or "/" in self.split:
            raise ValueError("synthetic.split: non-empty name without '/'")


def _skewed(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Standardised Gumbel draws (mean 0, std 1, right-skewed): a few strongly preferred
    experts per row, as the real sample's high top-expert share at high entropy needs."""
    return (rng.gumbel(size=shape) - np.euler_gamma) * (math.sqrt(6) / math.pi)


def _uniform(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Unit-variance zero-mean uniform noise, 65536 levels, float32 `shape` (bounded +-1.73)."""
    w = rng.bit_generator.random_raw(-(-math.prod(shape) // 4)).view(np.uint16)
    return ((w[:math.prod(shape)].astype(np.float32) - np.float32(_U16_MEAN))
            * np.float32(1 / _U16_STD)).reshape(shape)


def _geometry(stacks: tuple[str, ...], P: int, O: int):
    """Per-request layout: prefill tokens n0 [L], tokens per (step, layer) [O, L], row
    pattern (token position pt, layer pl) [rows per request], positions per layer t_max."""
    enc = np.array([s == "encoder" for s in stacks])
    enc_dec = bool(enc.any())
    n0 = np.where(enc | (not enc_dec), P, 1).astype(np.int64)
    counts = np.ones((O, len(stacks)), np.int64)
    counts[:, enc] = 0
    counts[0] = n0
    starts = n0[None, :] + np.arange(O)[:, None] - 1  # first token position of (step, layer)
    starts[0] = 0
    c, s = counts.ravel(), starts.ravel()
    first = np.repeat(np.cumsum(c) - c, c)
    pt = np.repeat(s, c) + np.arange(int(c.sum())) - first
    pl = np.repeat(np.tile(np.arange(len(stacks)), O), c)
    return n0, counts, pt, pl, int(pt.max()) + 1


def _route_chunk(rng, pref, cfg, n0, counts, t_max, k2, keep):
    """Route one chunk of requests through all layers and token positions.

    pref float32 [c, L, E] (bounded log-preferences) -> (cand int32 [t_max, c, L, k2]: the
    top-k2 scores of each (position, request, layer) as float bits with the expert id in the
    low bits; probs float32 [c, O, L, E]: router probabilities averaged over each step).
    """
    c, L, E = pref.shape
    O = counts.shape[0]
    ids = np.arange(E, dtype=np.int32)
    # Two AR(1) states driven by the same raw uint16 noise w (mean _U16_MEAN): slow z
    # (std sticky_std) and fast f (std token_noise_std). Their means are folded into `base`
    # (shifted states), so the loop only multiplies and adds.
    rs, rf = cfg.stickiness, cfg.fast_stickiness
    alpha = np.float32(cfg.sticky_std * math.sqrt(1 - rs * rs) / _U16_STD)
    beta = np.float32(cfg.token_noise_std * math.sqrt(1 - rf * rf) / _U16_STD)
    mz, mf = float(alpha) * _U16_MEAN / (1 - rs), float(beta) * _U16_MEAN / (1 - rf)
    base = (pref + np.float32(SCORE_OFFSET - mz - mf)).astype(np.float32)
    z = np.clip(rng.standard_normal((c, L, E), dtype=np.float32), -6, 6)
    z = z * np.float32(cfg.sticky_std) + np.float32(mz)  # stationary start
    f = np.clip(rng.standard_normal((c, L, E), dtype=np.float32), -6, 6)
    f = f * np.float32(cfg.token_noise_std) + np.float32(mf)
    zlim = (np.float32(mz - 6 * cfg.sticky_std), np.float32(mz + 6 * cfg.sticky_std))
    flim = (np.float32(mf - 6 * cfg.token_noise_std), np.float32(mf + 6 * cfg.token_noise_std))
    y, p, tmp = (np.empty((c, L, E), np.float32) for _ in range(3))
    cand = np.empty((t_max, c, L, k2), np.int32)
    probs = np.zeros((c, O, L, E), np.float32)
    ones = np.ones(E, np.float32)
    stride = max(1, int(n0.max()) // PROBS_PREFILL_TOKENS)
    for t in range(t_max):
        w = rng.bit_generator.random_raw(c * L * E // 4).view(np.uint16).reshape(c, L, E)
        z *= np.float32(rs)
        np.multiply(w, alpha, out=tmp)
        z += tmp
        f *= np.float32(rf)
        np.multiply(w, beta, out=tmp)
        f += tmp
        if t % 32 == 31:  # keep both states within 6 sigma so scores stay positive
            np.clip(z, *zlim, out=z)
            np.clip(f, *flim, out=f)
        np.add(base, z, out=y)
        y += f  # score + SCORE_OFFSET, float32 [c, L, E]
        step = np.where(t < n0, 0, t - n0 + 1)  # step of position t at each layer, [L]
        live = (step < O) & (counts[np.minimum(step, O - 1), np.arange(L)] > 0)
        live &= (step > 0) | (t % stride == 0)  # prefill probs: every stride-th token
        if live.any():
            np.subtract(y, np.float32(SCORE_OFFSET), out=p)
            np.exp(p, out=p)
            p *= (1 / (p @ ones))[..., None]  # per-token router probabilities
            if live.all() and (step == step[0]).all():
                probs[:, step[0]] += p
            else:
                probs[:, step[live], np.flatnonzero(live)] += p[:, live]
        v = y.view(np.int32)
        v &= keep
        v |= ids  # low bits carry the expert id: no ties, id recoverable
        cand[t] = np.partition(v, E - k2, axis=-1)[..., E - k2:]
    probs[:, 0] /= ((n0 - 1) // stride + 1)[None, :, None]  # prefill: mean over sampled tokens
    return cand, probs


def _top_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """The k largest packed keys of each row (unordered): int32 [..., k]."""
    return np.partition(keys, keys.shape[-1] - k, axis=-1)[..., keys.shape[-1] - k:]


def generate_trace(model: ModelSpec, cfg: SyntheticConfig) -> Trace:
    """A valid synthetic routing trace of cfg.num_requests requests for `model`."""
    cfg.check()
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    R, P, O = int(cfg.num_requests), int(cfg.prompt_len), int(cfg.output_len)
    k2 = min(E, 2 * k)
    stacks = tuple(model.moe_layer_stacks)
    mix = task_mix([tuple(t) for t in cfg.tasks])
    n_tasks = len(mix)
    task_of = np.arange(R) % n_tasks  # round-robin: the first n_tasks requests cover every task
    n0, counts, pt, pl, t_max = _geometry(stacks, P, O)
    rows_per_req = len(pt)
    # Task-level state depends on seed only, so both splits share the same tasks.
    task_pref = _skewed(stream(cfg.seed, "synthetic/task-prefs"), (n_tasks, L, E))
    task_pref *= cfg.task_pref_std
    task_pref += cfg.layer_pref_std * _skewed(stream(cfg.seed, "synthetic/layer-prefs"), (L, E))  # model-level popularity, shared by all tasks
    centroids = stream(cfg.seed, "synthetic/task-centroids").standard_normal(
        (n_tasks, cfg.embed_dim))
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)

    idt = id_dtype(E)
    id_bits = max(1, (E - 1).bit_length())
    keep = np.int32(~((1 << id_bits) - 1))  # mask of the score bits of a packed key
    g_bits = max(1, (k2 - 1).bit_length())
    g_keep = np.int32(~((1 << g_bits) - 1))
    pref_clip = 6 * (cfg.layer_pref_std + cfg.task_pref_std + cfg.request_pref_std)
    same_stack = np.array([stacks[i + 1] == stacks[i] for i in range(L - 1)], bool)
    # row r * rows_per_req + i of the chunk's output is position pt[i] of layer pl[i]
    gather_base = pt * (CHUNK_REQUESTS * L) + pl
    N = R * rows_per_req
    topk, spec = np.empty((N, k), idt), np.empty((N, k), idt)
    weights, probs = np.empty((N, k), np.float16), np.empty((R * O * L, E), np.float16)
    for c0 in range(0, R, CHUNK_REQUESTS):
        rng = stream(cfg.seed, f"synthetic/{cfg.split}/routing/chunk{c0 // CHUNK_REQUESTS:06d}")
        n = min(CHUNK_REQUESTS, R - c0)
        tasks_c = np.arange(c0, c0 + CHUNK_REQUESTS) % n_tasks  # full chunk: prefix-stable
        pref = (task_pref[tasks_c]
                + cfg.request_pref_std * _skewed(rng, (CHUNK_REQUESTS, L, E)))
        pref = np.clip(pref, -pref_clip, pref_clip).astype(np.float32)
        cand, pr = _route_chunk(rng, pref, cfg, n0, counts, t_max, k2, keep)
        top = _top_keys(cand, k)  # int32 [T, c, L, k]
        w = (top & keep).view(np.float32)
        w -= np.float32(SCORE_OFFSET)
        np.exp(w, out=w)  # |score| < SCORE_OFFSET - 1: no overflow, no underflow to 0
        w /= (w @ np.ones(k, np.float32))[..., None]  # softmax over the chosen experts
        # Next-layer guess made at layer l: layer l+1's top-k2 scores plus noise, re-ranked;
        # the candidate index (not the expert id) goes into the low bits this time.
        nxt = (cand[:, :, 1:] & keep).view(np.float32)
        nxt += np.float32(cfg.guess_noise_std) * _uniform(rng, nxt.shape)
        gkey = (nxt.view(np.int32) & g_keep) | np.arange(k2, dtype=np.int32)
        pos = _top_keys(gkey, k) & ~g_keep
        guess = np.full(top.shape, E, idt)
        guess[:, :, :-1] = np.take_along_axis(cand[:, :, 1:] & ~keep, pos, axis=-1)
        guess[:, :, :-1][:, :, ~same_stack] = E  # the token does not pass through layer l+1
        idx = (gather_base[None, :] + np.arange(n)[:, None] * L).ravel()
        rows = slice(c0 * rows_per_req, (c0 + n) * rows_per_req)
        topk[rows] = (top & ~keep).astype(idt).reshape(-1, k).take(idx, axis=0)
        weights[rows] = w.astype(np.float16).reshape(-1, k).take(idx, axis=0)
        spec[rows] = guess.reshape(-1, k).take(idx, axis=0)
        probs[c0 * O * L:(c0 + n) * O * L] = pr[:n].reshape(-1, E)

    emb_rng = stream(cfg.seed, f"synthetic/{cfg.split}/embeddings")
    emb = centroids[task_of] + cfg.embed_noise * emb_rng.standard_normal(
        (R, cfg.embed_dim)) / math.sqrt(cfg.embed_dim)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    seen: dict[int, int] = {}
    request_ids = []
    for j in task_of.tolist():
        request_ids.append(f"{cfg.split}/{mix[j][1]}/{seen.get(j, 0)}")
        seen[j] = seen.get(j, 0) + 1
    meta = {
        "num_moe_layers": L, "num_experts": E, "top_k": k, "moe_layer_stacks": list(stacks),
        "model": model.name, "synthetic": True, "routing_source": "synthetic",
        "embedder": EMBEDDER, "generator": {"name": "workloads.synthetic", "version": 1,
                                            **asdict(cfg)},
    }
    meta["generator"]["tasks"] = [[str(d), int(n)] for d, n in cfg.tasks]
    steps = np.concatenate([[0], np.cumsum(np.full(R, O, np.int64))])
    block_counts = np.tile(counts.ravel(), R)
    return Trace(
        meta=meta, request_ids=request_ids, datasets=[mix[j][0] for j in task_of],
        tasks=[mix[j][1] for j in task_of], prompt_len=np.full(R, P, np.int32),
        output_len=np.full(R, O, np.int32),
        arrival_ms=np.arange(R, dtype=np.float64) * float(cfg.arrival_ms),
        step_offsets=steps, block_offsets=np.concatenate([[0], np.cumsum(block_counts)]),
        topk=topk, weights=weights, probs=probs, spec_topk=spec,
        embeddings=emb.astype(np.float16), has_embedding=np.ones(R, bool),
    ).validate()
