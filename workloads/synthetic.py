"""Synthetic routing source: the project's embedded default (no model, no data files).

Model. For request r of task j, MoE layer l, expert e and the t-th token through layer l:

    score[r,l,t,e] = layer_pref_std * G[l,e] + dataset_pref_std * D[d(j),l,e]
                     + group_pref_std * C[d(j),g(j),l,e] + task_pref_std * A[j,l,e]
                     + request_pref_std * B[r,l,e] + X[r,l,t,e] + token_noise_std * n[r,l,t,e]
                     + token_latent_std * sum_i W[i,l,e] * z[r,t,i]
    X[t] = stickiness * X[t-1] + sticky_std * sqrt(1 - stickiness**2) * n[t]  (std sticky_std)

(d(j), g(j): task j's dataset and activation group, workloads/structure.py; W [rank, L, E]
seeded loadings with unit-norm (l, e) columns and z[r,t] [rank] the token's own N(0, 1)
factors, workloads/token_latent.py.) G, D, C, A, B are standardised Gumbel draws
(right-skewed: a few hot experts per row, which real routing's high top-expert share at high
entropy needs); n is unit-variance uniform noise.
As X[t] contains n[t], the score's token-to-token correlation drops after one token, then decays
geometrically, as in real DeepSeek-V2-Lite routing (share of a token's experts also used d tokens
earlier: 0.27, 0.21, 0.18, 0.16, 0.15 for d = 1, 2, 4, 8, 16; random 0.094).

Cross-layer coupling (g = cross_layer_corr, workloads/cross_layer.py): per token and entry,
with probability g, n[l] copies n[l-1] of a fixed partner expert (a seeded permutation per
layer pair), so a token's experts at one layer point to likely experts at the next.

Routed experts =
top-k of the score; `weights` = softmax over the chosen scores; `probs` = softmax over all E,
averaged over a step's tokens (prefill: over every max(1, P // 64)-th prompt token, to save
time); `spec_topk` at layer l = a guess of layer l+1's experts from this token's layer-l
experts alone, through a transition table fitted on a separate split of the same seed
(workloads/spec_guess.py): what a real system knows at that moment, never layer l+1's scores.

Request-level inputs (workloads/requests.py, docs/serving.md): by default every request has
prompt_len and output_len (`lengths: fitted` draws them per request from real length data,
workloads/lengths.py) and its task from the synthetic mix. `arrivals` can give each request
its own arrival and lengths, and `prompts` real tasks, texts and embeddings; with prompts the
request term B[r] is mixed with a term driven by the prompt's embedding (`coupling`).

Speed (one core): requests go through the time loop in chunks (workloads/synthetic_route.py:
blocks of positions, layer-major copies, buffers reused); noise is raw uint16 bits; top-k packs
the expert id into the low mantissa bits of the (offset, positive) float score and sorts the
int32 keys. Validation, the next-layer guesses and the float16 casts work in row blocks, so a
1,000-request trace is generated in little more memory than it holds.

Portable (docs/trace-format.md, "Portable determinism"): the same bits on every CPU, BLAS
kernel and numpy SIMD path. Gumbel and normal draws, exp and softmax come from
core/numerics.py and numpy's fixed-order sums, no BLAS; stored top-k rows are sorted by
score, largest first, never in partition order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np

from core import numerics
from core.blocks import linked_layers
from core.rng import stream
from core.specs import ModelSpec
from core.trace import Trace, id_dtype
from workloads import spec_guess
from workloads.cross_layer import cross_layer_map
from workloads.half import to_float16
from workloads.presets import resolve
from workloads.requests import plan_requests
from workloads.structure import (
    STRUCTURE_FIELDS,
    embedding_centroids,
    skewed,
    structure_on,
    structure_prefs,
    unit_rows,
)
from workloads.synthetic_config import SyntheticConfig
from workloads.synthetic_route import Workspace, route_chunk
from workloads.token_latent import chunk_factors, latent_loadings

CHUNK_REQUESTS = 32  # requests per inner loop; fixed so that output never depends on it
EMBEDDER = "synthetic-task-centroid"


def _geometry(stacks: tuple[str, ...], P: int, S: int):
    """Per-request layout: prefill tokens n0 [L], tokens per (step, layer) [S, L], row
    pattern (token position pt, layer pl) [rows per request], positions per layer t_max."""
    enc = np.array([s == "encoder" for s in stacks])
    enc_dec = bool(enc.any())
    n0 = np.where(enc | (not enc_dec), P, 1).astype(np.int64)
    counts = np.ones((S, len(stacks)), np.int64)
    counts[:, enc] = 0
    counts[0] = n0
    starts = n0[None, :] + np.arange(S)[:, None] - 1  # first token position of (step, layer)
    starts[0] = 0
    c, s = counts.ravel(), starts.ravel()
    first = np.repeat(np.cumsum(c) - c, c)
    pt = np.repeat(s, c) + np.arange(int(c.sum())) - first
    pl = np.repeat(np.tile(np.arange(len(stacks)), S), c)
    return n0, counts, pt, pl, int(pt.max()) + 1


def _task_prefs(cfg: SyntheticConfig, task_datasets: list[str], L: int, E: int, memo: dict):
    """Model-, dataset-, group- and task-level preferences [num_tasks, L, E] (task_datasets:
    each task's dataset slug [num_tasks]). They depend on the seed, the score model and the
    task list only (every split shares the same tasks), so `memo` keeps them for the next
    split of the same trace (~80 ns per Gumbel draw)."""
    key = tuple(task_datasets)
    if key not in memo:
        task_pref = skewed(stream(cfg.seed, "synthetic/task-prefs"), (len(key), L, E))
        task_pref *= cfg.task_pref_std
        task_pref += cfg.layer_pref_std * skewed(stream(cfg.seed, "synthetic/layer-prefs"),
                                                 (L, E))
        if structure_on(cfg):  # off: nothing added, the generator before the terms
            task_pref += structure_prefs(cfg, task_datasets, L, E)
        memo[key] = task_pref
    return memo[key]


def _route(model: ModelSpec, cfg: SyntheticConfig, plan, with_probs: bool,
           memo: dict | None = None) -> dict:
    """Route every request of `plan`: topk, weights [N, k], probs [steps * L, E] (zeros when
    not with_probs), step offsets [R + 1] and rows per (step, layer) block. memo: see
    _task_prefs."""
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    R, S_r = plan.num_requests, plan.output_len  # steps per request [R]
    stacks = tuple(model.moe_layer_stacks)
    shape_of = list(zip(plan.prompt_len.tolist(), S_r.tolist()))
    geo = {ps: _geometry(stacks, *ps) for ps in dict.fromkeys(shape_of)}  # n0, counts, pt, pl, T
    row_offsets = np.concatenate([[0], np.cumsum([len(geo[ps][2]) for ps in shape_of])])
    steps = np.concatenate([[0], np.cumsum(S_r.astype(np.int64))])
    task_pref = _task_prefs(cfg, plan.task_datasets, L, E, {} if memo is None else memo)
    idt = id_dtype(E)
    id_bits = max(1, (E - 1).bit_length())
    keep = np.int32(~((1 << id_bits) - 1))  # mask of the score bits of a packed key
    pref_clip = cfg.pref_clip()
    cross = cross_layer_map(cfg, stacks, E)
    latent = latent_loadings(cfg, stacks, E)  # None when token_latent_std = 0
    N = int(row_offsets[-1])
    topk, weights = np.empty((N, k), idt), np.empty((N, k), np.float16)
    probs = (np.empty if with_probs else np.zeros)((int(steps[-1]) * L, E), np.float16)
    ws = Workspace()
    for c0 in range(0, R, CHUNK_REQUESTS):
        rng = stream(cfg.seed, f"synthetic/{cfg.split}/routing/chunk{c0 // CHUNK_REQUESTS:06d}")
        n = min(CHUNK_REQUESTS, R - c0)
        # A short last chunk is padded with copies of its last request: the draws keep their
        # shapes, and each request's scores depend only on its own row, so the padding's rows
        # are drawn but never computed.
        members = np.minimum(np.arange(c0, c0 + CHUNK_REQUESTS), R - 1)
        b = plan.request_term(skewed(rng, (CHUNK_REQUESTS, L, E)), members, cfg.seed)
        pref = task_pref[plan.task_index[members]] + cfg.request_pref_std * b
        pref = np.clip(pref, -pref_clip, pref_clip).astype(np.float32)
        s_max = int(S_r[members].max())
        n0 = np.stack([geo[shape_of[m]][0] for m in members])  # [c, L]
        counts = np.zeros((CHUNK_REQUESTS, s_max, L), np.int64)
        for i, m in enumerate(members):
            counts[i, :S_r[m]] = geo[shape_of[m]][1]
        t_max = max(geo[shape_of[m]][4] for m in members)
        z = None if latent is None else (latent, chunk_factors(
            cfg, c0 // CHUNK_REQUESTS, t_max, CHUNK_REQUESTS, latent[2]))
        ids, w, pr = route_chunk(rng, pref, cfg, n0, counts, t_max, k, keep, n, idt, cross,
                                 with_probs, ws, z)  # [t_max, L, n, k] x2, [n, S, L, E]
        # row j of request i's output is position pt[j] of layer pl[j]: row
        # (pt * L + pl) * n + i of the chunk's [t_max, L, n] outputs
        idx = np.concatenate([(geo[shape_of[c0 + i]][2] * L + geo[shape_of[c0 + i]][3]) * n
                              + i for i in range(n)])
        rows = slice(row_offsets[c0], row_offsets[c0 + n])
        np.take(ids.reshape(-1, k), idx, axis=0, out=topk[rows], mode="clip")
        np.take(w.reshape(-1, k), idx, axis=0, out=weights[rows], mode="clip")
        for i in range(n if with_probs else 0):  # float32 [S, L, E] -> float16 rows
            probs[steps[c0 + i] * L:steps[c0 + i + 1] * L] = to_float16(
                pr[i, :S_r[c0 + i]].reshape(-1, E))
    block_counts = np.concatenate([geo[ps][1].ravel() for ps in shape_of])
    return {"topk": topk, "weights": weights, "probs": probs, "steps": steps,
            "block_counts": block_counts}


def _spec_table(model: ModelSpec, cfg: SyntheticConfig, memo: dict | None = None) -> np.ndarray:
    """The next-layer guess table of this seed and score model, fitted on the `spec-fit`
    split (workloads/spec_guess.py): synthetic task mix, fixed lengths, no probs."""
    fit_cfg = replace(cfg, split=spec_guess.FIT_SPLIT, num_requests=spec_guess.FIT_REQUESTS,
                      prompt_len=spec_guess.FIT_PROMPT_LEN, output_len=spec_guess.FIT_OUTPUT_LEN,
                      lengths="fixed", arrivals=None, prompts=None)
    fit = _route(model, fit_cfg, plan_requests(fit_cfg, model), with_probs=False, memo=memo)
    return spec_guess.fit_table(fit["topk"], fit["block_counts"],
                                tuple(model.moe_layer_stacks), model.num_experts)


def _embeddings(cfg: SyntheticConfig, plan) -> np.ndarray:
    """The plan's prompt embeddings, else each request's task centroid plus request noise."""
    if plan.embeddings is not None:
        return plan.embeddings
    centroids = unit_rows(embedding_centroids(cfg, plan.task_datasets, unit_rows(
        numerics.standard_normal(stream(cfg.seed, "synthetic/task-centroids"),
                                 (plan.num_tasks, cfg.embed_dim)))))
    emb_rng = stream(cfg.seed, f"synthetic/{cfg.split}/embeddings")
    return unit_rows(centroids[plan.task_index] + cfg.embed_noise * numerics.standard_normal(
        emb_rng, (plan.num_requests, cfg.embed_dim)) / math.sqrt(cfg.embed_dim))


def _generator_meta(cfg: SyntheticConfig, preset: str | None) -> dict:
    """meta['generator']: the knobs, without those a default trace never had (so traces
    made before a knob existed stay identical)."""
    # version 5: the token latent (workloads/token_latent.py); version 4: dataset and group
    # terms (workloads/structure.py); version 3: next-layer guesses from the past only
    # (workloads/spec_guess.py); version 2: portable arithmetic (core/numerics.py;
    # docs/trace-format.md)
    on = structure_on(cfg)
    version = 5 if cfg.token_latent_std else (4 if on else 3)
    generator = {"name": "workloads.synthetic", "version": version, **asdict(cfg)}
    if preset is not None:  # the file that supplied values (workloads/presets.py)
        generator["preset"] = f"workloads/presets/{preset}.yaml"
    for key in STRUCTURE_FIELDS if not on else ():  # off: absent, traces stay as before
        del generator[key]
    for key in ("arrivals", "prompts"):  # absent when unset: default traces stay as they were
        if generator[key] is None:
            del generator[key]
    if not cfg.token_latent_std:  # off: absent, traces made before the knob stay identical
        del generator["token_latent_std"]
    if not cfg.cross_layer_corr:  # off: absent, so traces made before the knob stay identical
        del generator["cross_layer_corr"]
    if cfg.lengths == "fixed":  # length_source is not used
        del generator["length_source"]
    generator["tasks"] = [[str(d), int(n)] for d, n in cfg.tasks]
    return generator


def generate_trace(model: ModelSpec, cfg: SyntheticConfig) -> Trace:
    """A valid synthetic routing trace for `model`: cfg.num_requests requests, or as many as
    cfg.arrivals gives (request-level inputs: workloads/requests.py)."""
    cfg, preset = resolve(cfg, model.name)  # unset score knobs: the model's preset, defaults
    cfg.check()
    plan = plan_requests(cfg, model)
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    R = plan.num_requests
    stacks = tuple(model.moe_layer_stacks)
    memo = {}  # task preferences, shared with the spec-fit split
    routed = _route(model, cfg, plan, with_probs=True, memo=memo)
    linked = linked_layers(stacks)
    spec = spec_guess.guess_rows(
        routed["topk"], spec_guess.compact_row_layers(routed["block_counts"], L),
        _spec_table(model, cfg, memo) if linked.any() else np.zeros((L, E, E), np.int32), linked,
        cfg.spec_noise_nats, stream(cfg.seed, f"synthetic/{cfg.split}/spec-noise"))
    emb = _embeddings(cfg, plan)
    meta = {
        "num_moe_layers": L, "num_experts": E, "top_k": k, "moe_layer_stacks": list(stacks),
        "model": model.name, "synthetic": True, "routing_source": "synthetic",
        "embedder": EMBEDDER, "generator": _generator_meta(cfg, preset),
    }
    meta.update(plan.meta)  # arrival, length, prompt, tokenizer and embedder provenance
    steps = routed["steps"]
    return Trace(
        meta=meta, request_ids=[f"{cfg.split}/{i}" for i in plan.request_ids],
        datasets=plan.datasets, tasks=plan.tasks, prompt_len=plan.prompt_len.astype(np.int32),
        output_len=plan.output_len.astype(np.int32),
        arrival_ms=plan.arrival_ms.astype(np.float64), step_offsets=steps,
        block_offsets=np.concatenate([[0], np.cumsum(routed["block_counts"])]),
        topk=routed["topk"], weights=routed["weights"], probs=routed["probs"], spec_topk=spec,
        embeddings=emb.astype(np.float16), has_embedding=np.ones(R, bool), prompts=plan.texts,
    ).validate()
