"""`make bench-policies`: decision overhead of the history-based systems, on one CPU core.

  - MoE-Infinity: EAMC query at 1K and 10K stored EAMs of the DeepSeek-V2-Lite shape (26 x 64):
    the incremental query the system runs after each MoE layer (update the dot products with
    the layer's new counts, then cosine + argmax), the same query from scratch (cosine over
    every layer), and the whole per-layer step (EAM bookkeeping + query).
    The paper reports 21 us (1K) and 226 us (10K) per query (Appendix B).
  - fMoE: all matching of one decode iteration (one semantic + L - d trajectory matches) at 1K
    stored maps.
  - Diff-MoE: one step's decision (priority update, tier replacement, next-layer prediction)
    at one MoE layer, and per iteration (x L).
Times are medians over repeated calls (perf_counter); inputs are random but shaped like the
real thing (counts for EAMs, Dirichlet rows for maps). Wall times of numpy code on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from core.specs import model_spec_from_dict
from core.view import SystemContext
from harness.runner.config import compose_config
from harness.runner.run import load_routing

PAPER_US = {"eamc_1k": 21.0, "eamc_10k": 226.0}


def _median_us(fn, calls: int, rounds: int = 5) -> float:
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def _ctx(model, slots: int) -> SystemContext:
    return SystemContext(num_layers=model.num_moe_layers, num_experts=model.num_experts,
                         top_k=model.top_k, expert_bytes=model.expert_bytes,
                         capacity_slots=slots, capacity_bytes=slots * model.expert_bytes,
                         max_batch=1, moe_layer_stacks=tuple(model.moe_layer_stacks),
                         trace_fields=("weights", "probs", "spec_topk", "embeddings"))


def bench_eamc(model, n_entries: int, rng) -> tuple[float, float, float]:
    """(full query us, incremental query us, whole per-layer step us) at n_entries EAMs."""
    from systems.moe_infinity.system import MoEInfinity

    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    system = MoEInfinity(eamc_capacity=n_entries)
    system.bind(_ctx(model, L * E // 2))
    # EAMs of 543-token requests: k experts per token and layer
    eams = rng.multinomial(543 * k, np.full(E, 1 / E), size=(n_entries, L)).astype(np.float32)
    for eam in eams:
        system.eamc.insert(eam)
    query = rng.multinomial(543 * k, np.full(E, 1 / E), size=L).astype(np.float64).ravel()
    full_us = _median_us(lambda i: system.eamc.query(query), 200)
    # a request-level query state (cumulative EAM), as the paper times one query
    st = system.request_state(iteration_query=False)
    ids = [sorted(rng.choice(E, k, replace=False).tolist()) for _ in range(L)]
    ones = [1] * k
    step_us = _median_us(lambda i: system.observe(st, i % L, ids[i % L], ones, False), 2000)
    keys = [[layer * E + e for e in ids[layer]] for layer in range(L)]
    match_us = _median_us(lambda i: system.match(st, keys[i % L], ones, L - 1), 2000)
    return full_us, match_us, step_us


def bench_fmoe(model, n_maps: int, rng) -> float:
    from systems.fmoe.kernels import load_kernels
    from systems.fmoe.maps import DECODE, ExpertMapStore

    L, E = model.num_moe_layers, model.num_experts
    store = ExpertMapStore(n_maps, L, E, distance=3, fast=load_kernels())
    maps = rng.dirichlet(np.full(E, 0.3), size=(n_maps, L)).astype(np.float32)  # [N, L, E]
    embs = rng.standard_normal((n_maps, 384)).astype(np.float32)
    embs /= np.linalg.norm(embs, axis=1, keepdims=True)
    store.add(maps, embs, np.ones(n_maps, bool), np.full(n_maps, DECODE, np.int8))
    probs = rng.dirichlet(np.full(E, 0.3), size=L).astype(np.float32)
    return _median_us(lambda i: store.match(probs, embs[i % n_maps], DECODE), 50) / 1e3


def bench_diff_moe(model, rng) -> float:
    from systems.diff_moe import DiffMoE

    cfg = compose_config(["experiment=table1", "workload.num_requests=8"])
    calib = load_routing(cfg, model, "calibration", 32)
    system = DiffMoE()
    system.bind(_ctx(model, 1236))  # the Table 1 budget in experts
    system.warmup(calib)
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    steps = [(i % L, sorted(rng.choice(E, k, replace=False).tolist())) for i in range(L * 64)]
    return _median_us(lambda i: system.decide(steps[i % len(steps)][0], steps[i % len(steps)][1],
                                              [1] * k), len(steps))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench bench-policies")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    model = model_spec_from_dict(compose_config(["experiment=table1"])["model"], "model")
    L = model.num_moe_layers
    print(f"bench-policies: {model.name} shape ({L} MoE layers x {model.num_experts} experts, "
          f"top-{model.top_k}); wall time per call, median of 5 rounds, numpy on one process")
    print("| policy step | entries | ours | paper |")
    print("| --- | --- | --- | --- |")
    for n, key in ((1000, "eamc_1k"), (10000, "eamc_10k")):
        full_us, match_us, step_us = bench_eamc(model, n, rng)
        print(f"| MoE-Infinity EAMC query, incremental (one MoE layer's new counts) | {n} | "
              f"{match_us:.1f} us | {PAPER_US[key]:.0f} us |")
        print(f"| MoE-Infinity EAMC query, from scratch over {L} layers | {n} | {full_us:.1f} us "
              f"| |")
        print(f"| MoE-Infinity per-layer step (EAM update + query) | {n} | {step_us:.1f} us | |")
    fmoe_ms = bench_fmoe(model, 1000, rng)
    print(f"| fMoE map matching per decode iteration (1 semantic + {L - 3} trajectory) | 1000 | "
          f"{fmoe_ms * 1e3:.0f} us | < 50 ms synchronous overhead |")
    step_us = bench_diff_moe(model, rng)
    print(f"| Diff-MoE decision per step (one layer) | - | {step_us:.1f} us | |")
    print(f"| Diff-MoE decision per iteration (x {L} layers) | - | {step_us * L:.0f} us | |")
    return 0
