"""`moebench holdout-check --split develop|final`: synthetic routing checked against real
DeepSeek-V2-Lite routing held out from the generator's fit (issue 28, item 4).

The shared 1,000-prompt sample is cut in three (prompts by the sample's 1-based prompt_id):

  fit      prompts   1-400   the routing targets (analysis/routing_targets/); never read here
  develop  prompts 401-700   warm-up 401-600, measured 601-700; run while tuning
  final    prompts 701-1000  warm-up 701-900, measured 901-1000; run once, at the end

Prompt numbers are the sample's `prompt_id`; the file has 999 records (prompt 317 absent),
so `prompt_slice` maps them to record slices (`characterize --prompts 1-400`, which made the
targets, selects by the same ids: no split shares a prompt).

Both sides run every Table 1 system at table1_real's shape (analysis/repro/real.py): the
Table 1 setting (one RTX A5000 at 24 GB/s, batch 1, bf16), the last DECODE_TOKENS tokens of
each prompt replayed as teacher-forced decode steps. The real side imports the split's
warm-up and measured prompts as trace v1. The synthetic side generates, per seed, a measured
and a warm-up (calibration) trace of the same sizes whose requests have the real split's
prompt and output lengths request by request: the lengths go to the generator as a
replayed length table (workload.arrivals, process azure, every arrival at t = 0, as the
offline Table 1 batch), and every other generator knob is the Table 1 workload as Hydra
composes it, so a model preset in the configuration or the generator applies here too.
Both sides then replay through the normal runner with `routing=` and `calibration_routing=`.
Outputs: results/routing_holdout/<split>/holdout.{md,csv,tex,json,png} (rules and columns:
analysis/holdout_report.py; docs/routing.md, "Held-out check on real routing").
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from analysis.routing_calibration import DEEPSEEK_SAMPLE, model
from analysis.routing_report import select_prompts
from core.shared_data import ENV_VAR, require_shared_file

MODEL = "deepseek_v2_lite"
FIT_PROMPTS = (1, 400)
SPLITS = {"develop": {"warmup": (401, 600), "measured": (601, 700)},
          "final": {"warmup": (701, 900), "measured": (901, 1000)}}
DECODE_TOKENS = 8  # table1_real's teacher-forced decode steps (analysis/repro/real.py)
SEEDS = (0, 1, 2, 3, 4)
# The Table 1 setting; runs are independent and small, so no sweep machinery: no trace
# cache (every trace is a file here) and no accesses.parquet (only tokens.parquet is read)
BASE = ("experiment=table1", "progress=false", "blas_threads=1", "save_rows=false",
        "trace_cache_dir=null", "experiment_name=runs")
FINAL_NOTE = ("the final split (prompts 701-1000) is the held-out check of issue 28: run it "
              "once, at the end, and report it as it comes out")
# one constant timestamp: the generator's azure replay then puts every request at t = 0
LENGTH_TABLE_TIME = "2024-01-01 00:00:00"


def prompt_slice(prompt_ids: list[int], prompts: tuple[int, int]) -> tuple[int, int]:
    """Prompt numbers (first, last), 1-based and inclusive as the sample's `prompt_id`, ->
    the 0-based slice [start, stop) of the file's records (sorted by prompt_id) that hold
    them. The sample lacks prompt 317, so from prompt 318 on the record index is id - 2."""
    first, last = prompts
    if not 1 <= first <= last:
        raise ValueError(f"prompt range {first}-{last}: prompts are numbered from 1")
    if list(prompt_ids) != sorted(prompt_ids):
        raise ValueError("the sample's prompt ids are not in increasing file order")
    kept = select_prompts(prompt_ids, first, last)  # consecutive records: the ids are sorted
    if not kept:
        raise ValueError(f"no prompt numbered {first}-{last} in the sample")
    return kept[0], kept[-1] + 1


def split_slices(prompt_ids: list[int], split: str) -> dict[str, tuple[int, int]]:
    """{"warmup": (start, stop), "measured": (start, stop)} of a split, 0-based records."""
    return {part: prompt_slice(prompt_ids, rng) for part, rng in SPLITS[split].items()}


def seed_systems() -> list[str]:
    """Table 1's named systems less the variants (systems/variants.py): the ranked rows."""
    from harness.runner.config import system_names
    from systems.variants import seed_of

    return [s for s in system_names() if seed_of(s) is None]


def variant_systems() -> list[str]:
    from systems.variants import VARIANTS

    return [v for vs in VARIANTS.values() for v in vs]


def sample_path() -> Path:
    """The shared DeepSeek-V2-Lite sample; FileNotFoundError naming the path and ENV_VAR."""
    return require_shared_file(*DEEPSEEK_SAMPLE)


def real_traces(sample: Path, slices: dict, out: Path) -> dict[str, Path]:
    """The split's warm-up ("cal") and measured ("meas") records as trace v1 files."""
    from workloads.importers import main as import_routing

    paths = {}
    for part, name in (("warmup", "cal"), ("measured", "meas")):
        start, stop = slices[part]
        path = paths[name] = out / f"real_{name}.npz"
        args = [str(sample), str(path), "--model", MODEL, "--requests", f"{start}:{stop}",
                "--decode-tokens", str(DECODE_TOKENS)]
        if import_routing(args) != 0:
            raise RuntimeError(f"{sample}: import-routing failed (message above)")
    return paths


def write_length_table(tr, path: Path) -> None:
    """The trace's per-request prompt and output lengths as the generator's replayed length
    table (Azure trace columns, workloads/arrivals.py), one row per request, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for p, o in zip(tr.prompt_len.tolist(), tr.output_len.tolist()):
            w.writerow([LENGTH_TABLE_TIME, p, o])


def synthetic_config(seed: int, split: str, num_requests: int, lengths: Path):
    """SyntheticConfig of the Table 1 workload as Hydra composes it, with the real split's
    lengths request by request."""
    from core.targets import build_target
    from harness.runner.config import compose_config

    node = dict(compose_config(["experiment=table1"])["workload"])
    node.update(seed=seed, split=split, num_requests=num_requests,
                arrivals={"process": "azure", "kind": "conv", "path": str(lengths),
                          "download": False, "lengths": True})
    return build_target(node, "workload")


def synthetic_traces(seed: int, real: dict, out: Path) -> dict[str, Path]:
    """Per seed a synthetic measured trace and calibration trace with the real ones' sizes and
    lengths (split "measure" / "calibration": disjoint requests, shared task preferences)."""
    from core.trace import write_trace
    from workloads.synthetic import generate_trace

    paths = {}
    for name, split in (("meas", "measure"), ("cal", "calibration")):
        table = out / f"lengths_{name}.csv"
        write_length_table(real[name], table)
        cfg = synthetic_config(seed, split, real[name].num_requests, table)
        path = paths[name] = out / f"synthetic_seed{seed}_{name}.npz"
        write_trace(generate_trace(model(MODEL), cfg), path)
    return paths


def run_system(system: str, seed: int, traces: dict[str, Path], out: Path, label: str) -> dict:
    """One Table 1 run on the given measured and calibration traces: its result dict."""
    from harness.runner.config import compose_config
    from harness.runner.run import run_config

    overrides = [*BASE, f"system={system}", f"seed={seed}", f"routing={traces['meas']}",
                 f"calibration_routing={traces['cal']}"]
    name = f"{label}-{system}"
    return {**run_config(compose_config(overrides, run_name=name, results_dir=str(out))),
            "_run_name": name}


def outcome(result: dict) -> dict:
    """What the report reads of a run: status, per-request TPOT (ms), decode hit rate."""
    from analysis.repro.values import request_tpot_ms, run_dir

    if result["status"] != "valid":
        return {"status": result["status"], "reason": result.get("reason")}
    path = run_dir({"_result": result, "run": result["_run_name"]})
    return {"status": "valid", "tpot_ms": request_tpot_ms(path),
            "hit_rate_decode": result["metrics"].get("hit_rate_decode")}


def _progress(msg: str) -> None:
    print(f"holdout-check: {msg}", file=sys.stderr, flush=True)


def run_check(split: str, seeds: list[int], systems: list[str], out: Path, sample: Path) -> dict:
    """Import, generate, run every system on both sides, measure routing statistics."""
    from analysis.holdout_report import STAT_DECODE_TOKENS, routing_statistics
    from core.trace import read_trace
    from workloads.importers import read_routing

    traces_dir = out / "traces"
    traces_dir.mkdir(parents=True, exist_ok=True)
    _progress(f"reading {sample}")
    reqs, _ = read_routing(sample)
    slices = split_slices([int(r.id) for r in reqs], split)
    _progress(f"importing prompts {SPLITS[split]['warmup']} (warm-up) and "
              f"{SPLITS[split]['measured']} (measured): records {slices}")
    real_paths = real_traces(sample, slices, traces_dir)
    real = {k: read_trace(p) for k, p in real_paths.items()}
    runs: dict = {"real": {}, "synthetic": {s: {} for s in systems}}
    synth_paths, gen_cfg = {}, None
    for seed in seeds:
        _progress(f"generating synthetic seed {seed} (measured {real['meas'].num_requests}, "
                  f"calibration {real['cal'].num_requests} requests, lengths matched)")
        synth_paths[seed] = synthetic_traces(seed, real, traces_dir)
        gen_cfg = gen_cfg or read_trace(synth_paths[seed]["meas"]).meta["generator"]
    total, done, t0 = len(systems) * (1 + len(seeds)), 0, time.perf_counter()
    for system in systems:
        runs["real"][system] = outcome(run_system(system, 0, real_paths, out, "real"))
        for seed in seeds:
            runs["synthetic"][system][seed] = outcome(run_system(
                system, seed, synth_paths[seed], out, f"synthetic-seed{seed}"))
        done += 1 + len(seeds)
        _progress(f"{done}/{total} runs ({system} done, {time.perf_counter() - t0:.0f} s)")
    _progress(f"routing statistics ({STAT_DECODE_TOKENS} teacher-forced decode tokens, "
              "K-means groups) on the measured split, real and each synthetic seed")
    start, stop = slices["measured"]
    stats = routing_statistics([r.ids for r in reqs[start:stop]],
                               {s: read_trace(p["meas"]) for s, p in synth_paths.items()})
    return {"runs": runs, "stats": stats, "generator": gen_cfg, "records": slices,
            "trace_sha256": {"real": {k: t.content_sha256() for k, t in real.items()},
                             "synthetic": {s: {k: read_trace(p).content_sha256()
                                               for k, p in ps.items()}
                                           for s, ps in synth_paths.items()}}}


def _seeds(text: str) -> list[int]:
    """'0-4' or '0,2,3' -> seeds."""
    if "-" in text:
        a, b = (int(x) for x in text.split("-"))
        return list(range(a, b + 1))
    return [int(x) for x in text.split(",")]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench holdout-check", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--split", required=True, choices=sorted(SPLITS),
                    help="develop (prompts 401-700) or final (701-1000; run once, at the end)")
    ap.add_argument("--seeds", default=f"{SEEDS[0]}-{SEEDS[-1]}",
                    help="synthetic seeds, '0-4' or '0,1,2' (default 0-4)")
    ap.add_argument("--no-variants", action="store_true",
                    help="seed systems only (default: the named variants as extra rows)")
    ap.add_argument("--out", default="results/routing_holdout",
                    help="results folder; the split's report goes to OUT/<split>/")
    ap.add_argument("--force", action="store_true",
                    help="final split: overwrite an existing final report")
    args = ap.parse_args(argv)
    out = Path(args.out) / args.split
    if args.split == "final":
        print(f"holdout-check: note: {FINAL_NOTE}", file=sys.stderr)
        if (out / "holdout.md").exists() and not args.force:
            print(f"moebench holdout-check: error: {out / 'holdout.md'} exists: the final "
                  "split is run once; --force overwrites it", file=sys.stderr)
            return 1
    try:
        sample = sample_path()
    except FileNotFoundError as exc:
        print(f"moebench holdout-check: error: {exc} (the shared data folder: ${ENV_VAR}, "
              "else ../shared/data beside the checkout)", file=sys.stderr)
        return 2
    try:
        seeds = _seeds(args.seeds)
    except ValueError:
        ap.error(f"--seeds: expected '0-4' or '0,1,2', got {args.seeds!r}")
    systems = seed_systems() + ([] if args.no_variants else variant_systems())
    t0 = time.perf_counter()
    got = run_check(args.split, seeds, systems, out, sample)
    from analysis.holdout_report import write_report
    from harness.runner.provenance import code_version

    gen = {k: v for k, v in (got["generator"] or {}).items()
           if k not in ("seed", "split", "num_requests", "arrivals")}
    config = {"split": args.split, "prompts": SPLITS[args.split], "fit_prompts": FIT_PROMPTS,
              "records": got["records"],
              "decode_tokens": DECODE_TOKENS, "seeds": seeds, "systems": systems,
              "overrides": list(BASE), "generator": gen, "trace_sha256": got["trace_sha256"],
              "code": code_version(), "wall_s": round(time.perf_counter() - t0, 1)}
    paths = write_report(out, args.split, got["runs"], got["stats"], seed_systems(), config)
    print((out / "holdout.md").read_text())
    print(f"wrote {', '.join(str(p) for p in paths)} in {config['wall_s']:.0f} s")
    if args.split == "final":
        print(f"note: {FINAL_NOTE}")
    return 0
