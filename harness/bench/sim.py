"""`moebench bench-sim [--json PATH]`: SIMULATED engine timing on synthetic routing.

Per system of the Table 1 setting (and at 1,000 requests, and at batch 32 with every request
arriving at once), in a fresh child process each (so peak RSS is that run's own):
- CPU seconds (time.process_time, BLAS pinned to one thread so idle OpenBLAS workers do not
  count) from the in-memory trace to the finished result tables: Engine construction with
  its indexes, warm-up of history-based systems, engine.run(), rec.tables(), summarize();
  median of the runs (--repeats at least, more while they add up to under --min-cpu-s).
  Trace generation (measure + calibration split), compute_floor_ms and
  result writing (write_run, parquet included) are timed and reported separately;
- RSS of the child (ru_maxrss, VmRSS): the peak through trace generation, the RSS the traces
  keep, the peak from there through the engine's tables and metrics (the peak is reset after
  generation where Linux allows), and the whole run's peak (result writing included);
- in the same process, the reference loop (harness/bench/reference_lru.py) over the same
  trace's access stream at batch 1, run after each engine run, and the ratio engine /
  reference accesses per CPU-s: the median over the runs (`pair_ratios`), each run measured
  against the mean of the reference runs on either side of it, so each ratio compares runs
  made in the same state of a noisy machine.
The lru child at the first setting also runs `system=lru system.prefetch=false` once and
checks that the reference's hit / miss counts equal it, per phase.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.bench.process import cpu_s_of, current_rss_mb, peak_rss_mb, reset_peak, trim_heap
from harness.bench.sim_targets import TABLE1_SYSTEMS, checks, time_table1

LABEL = "SIMULATED engine timing on synthetic routing"
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# (JSON key suffix, requests (None: --requests), max_batch)
SETTINGS = (("", None, 1), ("_1000_requests", 1000, 1), ("_batch32", None, 32))
# A setting's engine runs continue past --repeats until they add up to --min-cpu-s (at most
# MAX_RUNS runs): the reference loop beside them varies by up to 65 % run to run on a shared
# 2-core VM, and more pairs steady the median where runs are cheap.
MAX_RUNS = 7


def child(system_name: str, requests: int, max_batch: int, repeats: int, min_cpu_s: float,
          check: bool) -> dict:
    """One system at one setting, in this (fresh) process; returns its figures."""
    import numpy as np

    from core.blocks import BlockIndex
    from core.specs import hardware_spec_from_dict, model_spec_from_dict
    from core.targets import build_target
    from harness.bench import reference_lru
    from harness.runner.config import compose_config
    from harness.runner.floor import compute_floor_ms
    from harness.runner.results import write_run
    from harness.runner.run import load_routing
    from harness.sim.backend_sim import SimBackend
    from harness.sim.engine import Engine
    from harness.sim.memory import plan_memory
    from harness.sim.metrics import summarize
    from harness.sim.tables import full_tables
    from systems.base import System

    # No on-disk trace cache: every child generates its trace, so generation is timed alike.
    base = ["experiment=table1", f"workload.num_requests={requests}", f"max_batch={max_batch}",
            "progress=false", "trace_cache_dir=null"]
    cfg = compose_config(base + [f"system={system_name}"])
    model = model_spec_from_dict(cfg["model"], "model")
    hw = hardware_spec_from_dict(cfg["hardware"], "hardware")
    out = {"system": system_name, "requests": requests, "max_batch": max_batch,
           "rss_start_mb": peak_rss_mb()}
    probe = build_target(cfg["system"], "system", System)
    # as harness/runner/run.py: the traces hold the per-token fields the system reads
    trace, gen_s = cpu_s_of(lambda: load_routing(cfg, model, "measure", fields=probe.uses_fields))
    max_ctx = int(np.max(trace.prompt_len.astype(np.int64) + trace.output_len))
    plan = plan_memory(model, hw, max_ctx, max_batch, cfg.get("expert_cache_gb"))
    calib = None
    if probe.needs_calibration():
        calib, calib_s = cpu_s_of(lambda: load_routing(cfg, model, "calibration",
                                                       cfg["calibration_requests"],
                                                       fields=probe.uses_fields))
        gen_s += calib_s
    out["trace_gen_cpu_s"] = gen_s
    out["peak_rss_trace_mb"] = peak_rss_mb()  # imports + trace generation
    # What the traces keep: generation's freed temporaries go back first (otherwise the
    # engine reuses their pages unseen and its own memory reads up to 45 B/access low)
    gc.collect()
    trim_heap()
    out["rss_after_trace_mb"] = current_rss_mb()
    out["peak_reset"] = reset_peak()
    if probe.needs_all_experts and plan.expert_cache_bytes < model.total_expert_bytes:
        out["status"] = "oom"
        return out
    slo = (float(cfg["slo_ttft_ms"]), float(cfg["slo_tpot_ms"]))

    def one_run(system, memory: dict | None = None) -> tuple[dict, dict, int]:
        parts = {}
        for t in (trace, calib):  # every run builds its indexes, as a fresh process does
            if t is not None:
                BlockIndex.forget(t)
        gc.collect()  # the run before's tables and engine, before the heap is trimmed
        out["heap_trimmed"] = trim_heap()  # every run starts as a fresh process's would
        t0, ru0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        engine = Engine(model, SimBackend(model, hw), trace, system, plan.expert_cache_bytes,
                        max_batch)
        parts["engine_init_s"] = time.process_time() - t0
        out["engine_core"] = engine.core
        if memory is not None:  # the Engine with its index, recorder and system bound
            memory["built"] = current_rss_mb()
        if calib is not None:
            _, parts["warmup_s"] = cpu_s_of(lambda: system.warmup(calib))
            if memory is not None:  # + the policy's history (and the warm-up's peak)
                memory["warmed"], memory["warmup_peak"] = current_rss_mb(), peak_rss_mb()
        rec, parts["run_s"] = cpu_s_of(engine.run)
        if memory is not None:  # traces + the engine (index, cache) and the recorder's columns
            memory["engine"] = peak_rss_mb()
        tables, parts["tables_s"] = cpu_s_of(rec.stored_tables)  # as harness/runner/run.py
        if memory is not None:  # + the stored tables (per-access iteration and layer)
            memory["tables"] = peak_rss_mb()
        metrics, parts["summarize_s"] = cpu_s_of(lambda: summarize(
            full_tables(tables), trace.arrival_ms, model.expert_bytes, *slo))
        if memory is not None:  # + the summary's transient columns
            memory["metrics"] = peak_rss_mb()
        parts["total_s"] = time.process_time() - t0
        # The kernel's share (page faults of fresh arrays, above all): user and system CPU
        ru = resource.getrusage(resource.RUSAGE_SELF)
        parts["user_s"], parts["sys_s"] = ru.ru_utime - ru0.ru_utime, ru.ru_stime - ru0.ru_stime
        return parts, {"tables": tables, "metrics": metrics}, rec.num_accesses

    # Run 0 gives the memory figures and the written result; the reference's stream is built
    # after them, so it is not in those peaks. Every engine run is then followed by one run
    # of the reference loop (same process, same trace, batch 1): each run's ratio sees the
    # machine in the same state, and the median of the runs' ratios is the binding figure.
    memory: dict = {}
    parts, last, n_acc = one_run(build_target(cfg["system"], "system", System), memory)
    runs = [parts]
    out.update(peak_rss_engine_mb=memory["engine"], peak_rss_tables_mb=memory["tables"],
               peak_rss_metrics_mb=memory["metrics"], rss_engine_built_mb=memory["built"],
               rss_warmed_mb=memory.get("warmed"), peak_rss_warmup_mb=memory.get("warmup_peak"))
    _, out["compute_floor_cpu_s"] = cpu_s_of(lambda: compute_floor_ms(model, hw, trace, max_batch))
    with tempfile.TemporaryDirectory() as tmp:
        result = {"run_id": "bench-sim", "config": cfg, "metrics": last["metrics"]}
        _, out["write_cpu_s"] = cpu_s_of(lambda: write_run(Path(tmp) / "run", result,
                                                           last["tables"], trace.request_ids))
    # The whole run: trace generation, engine, tables, metrics, result writing.
    out["peak_rss_mb"] = max(peak_rss_mb(), out["peak_rss_trace_mb"])
    if out["rss_after_trace_mb"] is not None and out["peak_reset"]:
        for name, key in (("", "peak_rss_engine_mb"), ("_with_tables", "peak_rss_tables_mb"),
                          ("_with_metrics", "peak_rss_metrics_mb"),
                          ("_built", "rss_engine_built_mb"), ("_warmed", "rss_warmed_mb"),
                          ("_warmup_peak", "peak_rss_warmup_mb")):
            if out[key] is not None:  # no warm-up: no warmed figures
                out["bytes_per_access_beyond_trace" + name] = (
                    (out[key] - out["rss_after_trace_mb"]) * 2**20 / max(n_acc, 1))
    last = None  # free the tables before the reference loop
    gc.collect()
    slots = plan_memory(model, hw, max_ctx, 1, cfg.get("expert_cache_gb")).expert_cache_bytes \
        // model.expert_bytes
    spl = min(slots // model.num_moe_layers, model.num_experts)
    stream = reference_lru.access_stream(trace)  # built untimed
    ref_n = reference_lru.stream_accesses(stream)

    def reference() -> tuple[dict, float]:
        return cpu_s_of(lambda: reference_lru.replay(stream, model.num_moe_layers, slots, spl))

    refs = [reference()]
    # At least `repeats` runs, more while the engine's runs together stay short: a run of a
    # second or two is as noisy as the reference beside it.
    while len(runs) < repeats or (sum(p["total_s"] for p in runs) < min_cpu_s
                                  and len(runs) < MAX_RUNS):
        parts, _, _ = one_run(build_target(cfg["system"], "system", System))
        runs.append(parts)
        refs.append(reference())
    run_times, ref_times = [p["total_s"] for p in runs], [s for _, s in refs]
    med, ref_s = statistics.median(run_times), statistics.median(ref_times)
    pair_ratios = paired_ratios(n_acc, run_times, ref_n, ref_times)
    mid = min(runs, key=lambda p: abs(p["total_s"] - med))
    out.update(status="ok", accesses=n_acc, cpu_s=med, accesses_per_cpu_s=n_acc / med,
               cpu_s_parts=mid, sys_share=mid["sys_s"] / max(mid["user_s"] + mid["sys_s"], 1e-9),
               reference_accesses=ref_n, reference_cpu_s=ref_s,
               reference_accesses_per_cpu_s=ref_n / ref_s, reference_cpu_s_runs=ref_times,
               engine_cpu_s_runs=run_times, pair_ratios=pair_ratios,
               ratio=statistics.median(pair_ratios))
    if check:
        out["reference_check"] = _check(cfg, build_target, System, one_run, refs[0][0])
    return out


def _check(cfg, build_target, System, one_run, ref_counts: dict) -> dict:
    """Hit / miss counts of `system=lru system.prefetch=false` per phase vs the reference."""
    from harness.sim.tables import full_tables

    node = dict(cfg["system"], prefetch=False)
    _, last, _ = one_run(build_target(node, "system", System))
    acc = full_tables(last["tables"])["accesses"]
    cls, prefill = acc["class"], acc["prefill"].astype(bool)
    engine = {}
    for phase, mask in (("decode", ~prefill), ("prefill", prefill)):
        engine[f"hits_{phase}"] = int((cls[mask] != 2).sum())  # hit or late (none at batch 1)
        engine[f"misses_{phase}"] = int((cls[mask] == 2).sum())
    return {"engine": engine, "reference": ref_counts, "match": engine == ref_counts,
            "system": "lru system.prefetch=false"}


def paired_ratios(n_acc: int, run_cpu_s: list[float], ref_n: int,
                  ref_cpu_s: list[float]) -> list[float]:
    """Engine / reference accesses per CPU-s of each run. Reference run i follows engine run
    i, so run i > 0 lies between reference runs i - 1 and i and is measured against their
    mean; run 0 (its memory figures and result writing come first) against the one after."""
    beside = [ref_cpu_s[0]] + [(a + b) / 2 for a, b in zip(ref_cpu_s, ref_cpu_s[1:])]
    return [(n_acc / run) / (ref_n / ref) for run, ref in zip(run_cpu_s, beside)]


def _spawn(system: str, requests: int, batch: int, repeats: int, min_cpu_s: float,
           check: bool) -> dict:
    from core.paths import PROJECT_ROOT

    cmd = [sys.executable, "-m", "harness.bench.sim", "--child", system,
           "--requests", str(requests), "--batch", str(batch), "--repeats", str(repeats),
           "--min-cpu-s", str(min_cpu_s)]
    if check:
        cmd.append("--check")
    env = {**os.environ, **BLAS_ENV}
    p = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"system": system, "status": "failed", "error": p.stderr.strip()[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cost(requests: int, repeats: int) -> dict:
    """The engine cost model (harness/bench/engine_cost.py) in a fresh child; printed."""
    from core.paths import PROJECT_ROOT

    print(f"\nengine cost model (on_demand, {requests} requests, batch 1/4/16, three budgets; "
          "least squares; microseconds of CPU):")
    cmd = [sys.executable, "-m", "harness.bench.sim", "--cost-child", "--requests",
           str(requests), "--repeats", str(repeats)]
    p = subprocess.run(cmd, cwd=PROJECT_ROOT, env={**os.environ, **BLAS_ENV},
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"  FAILED\n{p.stderr.strip()[-2000:]}", file=sys.stderr)
        return {"status": "failed", "error": p.stderr.strip()[-2000:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for core, f in out["cores"].items():
        print(f"  {core:<9} per run {f['fixed_ms']:.0f} ms, per block {f['block_us']:.2f} us, "
              f"per access {f['access_us']:.3f} us, per load {f['load_us']:.2f} us "
              f"(largest residual {100 * f['max_relative_residual']:.1f} %)"
              + ("" if f["separable"] else "; NOT SEPARATED: a negative term, read the "
                 "settings' CPU s in the JSON instead"))
    return {"status": "ok", **out}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str]) -> int:
    from harness.runner.config import system_names

    ap = argparse.ArgumentParser(prog="moebench bench-sim", description=LABEL)
    ap.add_argument("--json", help="write the figures here (make bench-sim: results/)")
    ap.add_argument("--systems", help="comma-separated (default: every Table 1 system)")
    ap.add_argument("--requests", type=int, default=290, help="measured requests (Table 1: 290)")
    ap.add_argument("--repeats", type=int, default=3, help="at least this many runs (median)")
    ap.add_argument("--min-cpu-s", type=float, default=8.0,
                    help=f"more runs (at most {MAX_RUNS}) until a setting's engine runs add up "
                         "to this many CPU-s (default 8)")
    ap.add_argument("--skip-1000", action="store_true", help="no 1,000-request setting")
    ap.add_argument("--skip-batch32", action="store_true", help="no batch-32 setting")
    ap.add_argument("--skip-table1", action="store_true",
                    help="do not time the whole Table 1 sweep (make reproduce-table1's runs)")
    ap.add_argument("--skip-cost", action="store_true",
                    help="do not fit the engine's per block / access / load costs")
    ap.add_argument("--cost-requests", type=int, default=60,
                    help="requests of the cost-model fit's trace (default 60)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cost-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.requests < 1 or args.repeats < 1 or args.min_cpu_s < 0:
        ap.error("--requests and --repeats must be >= 1, --min-cpu-s >= 0")
    if args.cost_child:
        from harness.bench.engine_cost import measure
        from harness.runner.guard import blas_threads

        with blas_threads(1):
            print(json.dumps(measure(args.requests, args.repeats)))
        return 0
    if args.child:
        from harness.runner.guard import blas_threads

        with blas_threads(1):
            out = child(args.child, args.requests, args.batch, args.repeats, args.min_cpu_s,
                        args.check)
        print(json.dumps(out))
        return 0
    known = system_names()
    systems = args.systems.split(",") if args.systems else known
    bad = [s for s in systems if s not in known]
    if bad:
        ap.error(f"--systems: unknown {bad}; known: {known}")
    settings = [s for s in SETTINGS if not (s[0] == "_1000_requests" and args.skip_1000)
                and not (s[0] == "_batch32" and args.skip_batch32)]
    print(f"bench-sim: {LABEL}; experiment=table1, {args.requests} requests, median of "
          f">= {args.repeats} runs (more up to {MAX_RUNS} while under {args.min_cpu_s:g} CPU-s), "
          "CPU s (process_time) of a fresh process per system, BLAS 1 thread")
    details, figures, check = {}, {s: {} for s in systems}, None
    for suffix, n_req, batch in settings:
        n_req = n_req or args.requests
        tag = f"{n_req} requests, batch {batch}"
        details[tag] = {}
        print(f"\n{tag}\n{'system':<14}{'accesses':>10}{'acc/cpu-s':>11}{'ref acc/cpu-s':>14}"
              f"{'ratio':>8}{'rss trace':>10}{'engine pk':>10}{'peak rss':>9}{'MB':>3}"
              f"{'gen s':>7}{'write s':>8}{'sys %':>6}")
        for name in systems:
            r = _spawn(name, n_req, batch, args.repeats, args.min_cpu_s,
                       check is None and name == "lru" and batch == 1 and suffix == "")
            details[tag][name] = r
            if "reference_check" in r:
                check = r["reference_check"]
            f = figures[name]
            f["status" + suffix] = r["status"]
            for key in ("accesses", "accesses_per_cpu_s", "peak_rss_mb", "peak_rss_engine_mb",
                        "peak_rss_metrics_mb", "rss_after_trace_mb", "ratio",
                        "reference_accesses_per_cpu_s", "bytes_per_access_beyond_trace",
                        "bytes_per_access_beyond_trace_with_tables",
                        "bytes_per_access_beyond_trace_with_metrics", "engine_core",
                        "sys_share", "bytes_per_access_beyond_trace_built",
                        "bytes_per_access_beyond_trace_warmed",
                        "bytes_per_access_beyond_trace_warmup_peak"):
                f[key + suffix] = r.get(key)
            print(f"{name:<14}{_fmt(r.get('accesses'), 'd'):>10}"
                  f"{_fmt(r.get('accesses_per_cpu_s'), ',.0f'):>11}"
                  f"{_fmt(r.get('reference_accesses_per_cpu_s'), ',.0f'):>14}"
                  f"{_fmt(r.get('ratio'), '.4f'):>8}{_fmt(r.get('rss_after_trace_mb'), '.0f'):>10}"
                  f"{_fmt(r.get('peak_rss_engine_mb'), '.0f'):>10}"
                  f"{_fmt(r.get('peak_rss_mb'), '.0f'):>9}{'':>3}"
                  f"{_fmt(r.get('trace_gen_cpu_s'), '.2f'):>7}"
                  f"{_fmt(r.get('write_cpu_s'), '.2f'):>8}"
                  f"{_fmt(None if r.get('sys_share') is None else 100 * r['sys_share'], '.0f'):>6}"
                  + ("" if r["status"] == "ok" else f"  {r['status']}"))
            if r["status"] == "failed":
                print(r["error"], file=sys.stderr)
    for suffix, _, _ in settings:
        line = ", ".join(f"{s} {figures[s]['ratio' + suffix]:.4f}" for s in systems
                         if figures[s].get("ratio" + suffix) is not None)
        print(f"ratio engine/reference{suffix or ''} (accesses per CPU-s, same process): {line}")
    if check is not None:
        print(f"reference check vs {check['system']} at batch 1: "
              f"{'match' if check['match'] else 'MISMATCH'} (engine {check['engine']}, "
              f"reference {check['reference']})")
    cost = None if args.skip_cost else _cost(args.cost_requests, args.repeats)
    table1 = None
    if not args.skip_table1:
        print(f"\nTable 1 sweep ({TABLE1_SYSTEMS}, {args.requests} requests, fresh results and "
              "trace cache, one process): ", end="", flush=True)
        table1 = time_table1(args.requests)
        print(f"{table1['cpu_s']:.1f} CPU s, {table1['wall_s']:.1f} s wall, largest run folder "
              f"{table1['largest_run_mb']:.1f} MB" if table1["status"] == "ok"
              else f"FAILED\n{table1['error']}")
    targets = checks(figures, table1)
    print("\ntargets (issue 'Engine speed and memory'):")
    for name, value, want, ok in targets:
        mark = "info" if ok is None else "ok  " if ok else "MISS"
        print(f"  {mark} {name}: {_fmt(value, '.4g')} (target {want})")
    doc = {"label": LABEL, "simulated": True, "synthetic_routing": True,
           "setting": {"experiment": "table1", "requests": args.requests,
                       "repeats": args.repeats, "min_cpu_s": args.min_cpu_s,
                       "max_runs": MAX_RUNS, "timer": "time.process_time, fresh process",
                       "blas_threads": 1, "cpus": os.cpu_count()},
           "systems": figures, "reference_check": check, "details": details,
           "engine_cost": cost,
           "table1_sweep": table1,
           "targets": [{"name": n, "value": v, "target": w, "met": ok}
                       for n, v, w, ok in targets]}
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
    return 0 if all(r["status"] != "failed" for d in details.values() for r in d.values()) \
        else 1


if __name__ == "__main__":
    for _k, _v in BLAS_ENV.items():  # before numpy loads: a child's BLAS starts with one thread
        os.environ.setdefault(_k, _v)
    sys.exit(main(sys.argv[1:]))
