"""`make bench-sim`: accesses per second through the full engine path, per system, and the
wall time of one Table 1 run. Trace generation is excluded from accesses per second."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from core.specs import hardware_spec_from_dict, model_spec_from_dict
from core.targets import build_target
from harness.runner.config import compose_config, system_names
from harness.runner.run import load_routing
from harness.sim.backend_sim import SimBackend
from harness.sim.engine import Engine
from harness.sim.memory import plan_memory
from systems.base import System


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench bench-sim")
    ap.add_argument("--requests", type=int, default=290, help="measured requests (Table 1: 290)")
    args = ap.parse_args(argv)
    base = ["experiment=table1", f"workload.num_requests={args.requests}", "progress=false"]
    cfg = compose_config(base + ["system=lru"])
    model = model_spec_from_dict(cfg["model"])
    hw = hardware_spec_from_dict(cfg["hardware"])
    t0 = time.perf_counter()
    trace = load_routing(cfg, model, "measure")
    gen_s = time.perf_counter() - t0
    max_ctx = int((trace.prompt_len + trace.output_len).max())
    plan = plan_memory(model, hw, max_ctx, 1)
    print(f"bench-sim: SIMULATED, {trace.routing_source} routing, {model.name} on {hw.name}, "
          f"{trace.num_requests} requests; trace generation {gen_s:.2f} s (excluded)")
    # CPU seconds of this process (one core; robust to other load on the machine).
    print(f"{'system':<16}{'accesses':>12}{'cpu s':>9}{'accesses/cpu-s':>16}")
    for name in system_names():
        system = build_target(compose_config(base + [f"system={name}"])["system"], "system",
                              System)
        if system.needs_all_experts and (
                plan.expert_cache_bytes < model.total_expert_bytes):
            print(f"{name:<16}{'oom':>12}")
            continue
        # Bind first (the engine does), then warm up, as the runner does.
        engine = Engine(model, SimBackend(model, hw), trace, system, plan.expert_cache_bytes)
        if type(system).warmup is not System.warmup:
            system.warmup(load_routing(cfg, model, "calibration", cfg["calibration_requests"]))
        t0 = time.process_time()
        rec = engine.run()
        dt = time.process_time() - t0
        print(f"{name:<16}{rec.num_accesses:>12}{dt:>9.2f}{rec.num_accesses / dt:>16,.0f}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "moebench.cli", *base, "system=lru", f"results_dir={tmp}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - t0
    print(f"one Table 1 run, `moebench experiment=table1 system=lru` in a fresh process "
          f"(trace generation and result files included): {wall:.2f} s wall")
    return 0
