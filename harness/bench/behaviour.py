"""`make bench-behaviour`: how the seed systems behave as the batch grows (SIMULATED).

Two tables, both on the simulated backend with synthetic routing (labelled so):
  1. MoE-Infinity's miss rate at batch 1 and batch 16 with 5% of the experts cached. The
     Diff-MoE paper measured 6.91% -> 68.84% on Switch-Base with beam search in
     FasterTransformer; compare the direction, not the numbers.
  2. Throughput (generated tokens per second of makespan) of diff_moe, moe_infinity and
     on_demand from batch 1 to 64, at the same 5% budget.
Setting: Switch-Base-128 (the Diff-MoE paper's model) on an H200, prompt 256 (the authors'
seq_len), 32 output tokens, every request arriving at t = 0 (static batches). The hit rate and
TPOT of every system at the Table 1 budget are in `make reproduce-table1`'s table.
Every run's result.json is kept under results/bench_behaviour/.
"""

from __future__ import annotations

import argparse
import json

from core.specs import model_spec_from_dict
from harness.runner.config import compose_config
from harness.runner.run import run_config

SYSTEMS = ("on_demand", "moe_infinity", "diff_moe")


def _run(overrides: list[str], name: str, results_dir: str) -> dict:
    cfg = compose_config(overrides, run_name=name, results_dir=results_dir)
    cfg["experiment_name"] = "bench_behaviour"
    return run_config(cfg)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench bench-behaviour")
    ap.add_argument("--model", default="switch_base_128")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--cache-fraction", type=float, default=0.05)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    base_cfg = compose_config([f"model={args.model}"])
    model = model_spec_from_dict(base_cfg["model"], "model")
    cache_gb = args.cache_fraction * model.total_expert_bytes / 2**30
    common = [f"model={args.model}", f"hardware={args.hardware}", "progress=false",
              f"workload.num_requests={args.requests}", "workload.prompt_len=256",
              "workload.output_len=32", "workload.arrival_ms=0.0",
              f"calibration_requests={args.requests}", f"expert_cache_gb={cache_gb!r}"]
    slots = int(cache_gb * 2**30) // model.expert_bytes
    print(f"bench-behaviour: SIMULATED, synthetic routing; {model.name} on {args.hardware}, "
          f"{args.requests} requests, prompt 256, output 32; cache {cache_gb:.3f} GiB = {slots} "
          f"of {model.num_moe_layers * model.num_experts} experts "
          f"({args.cache_fraction:.0%})")
    rows = {}
    for system in SYSTEMS:
        for b in batches:
            r = _run(common + [f"system={system}", f"max_batch={b}"], f"{system}_b{b}",
                     args.results_dir or "results")
            if r["status"] != "valid":
                print(f"  {system} batch {b}: {r['status']} ({r['reason']})")
                continue
            m = r["metrics"]
            rows[system, b] = m
    print("\nMiss rate of moe_infinity (misses / accesses; +late = also copies still in flight)")
    print("| batch | miss rate | miss + late | hit rate |")
    print("| --- | --- | --- | --- |")
    for b in batches:
        m = rows.get(("moe_infinity", b))
        if m:
            n = m["accesses"]
            print(f"| {b} | {m['misses'] / n:.4f} | {(m['misses'] + m['late_prefetches']) / n:.4f}"
                  f" | {m['hit_rate']:.4f} |")
    print("\nThroughput, generated tokens/s (simulated); TPOT mean ms in brackets")
    print("| batch | " + " | ".join(SYSTEMS) + " |")
    print("| --- |" + " --- |" * len(SYSTEMS))
    for b in batches:
        cells = []
        for s in SYSTEMS:
            m = rows.get((s, b))
            cells.append(f"{m['tokens_per_s']:.1f} ({m['tpot_ms']['mean']:.1f})" if m else "-")
        print(f"| {b} | " + " | ".join(cells) + " |")
    summary = {f"{s}_b{b}": {"hit_rate": m["hit_rate"], "misses": m["misses"],
                             "accesses": m["accesses"], "tokens_per_s": m["tokens_per_s"],
                             "tpot_ms_mean": m["tpot_ms"]["mean"]}
               for (s, b), m in rows.items()}
    print("\n" + json.dumps({"simulated": True, "synthetic_routing": True, "runs": summary},
                            sort_keys=True))
    return 0
