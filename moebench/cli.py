"""`moebench`: Hydra runner for one configuration or a multirun sweep, plus subcommands.

  moebench [hydra overrides]        run (or, with -m, sweep) configurations
  moebench reproduce NAME|all       run reproduction experiments, then their reports
  moebench report NAME|all          an experiment's table and figure from its results
  moebench claims                   results/claims.{md,csv}: every published claim, a verdict
  moebench claims-diff OLD NEW      which verdicts moved between two claims.csv files
  moebench figures                  every report and the claims, from results only
  moebench table1 [results dir]     write results/table1/table1.{md,csv} from finished runs
  moebench zoo [results dir]        write results/zoo/zoo.{md,csv} (evictor x prefetcher)
  moebench list [KIND]              systems, models, hardware, prompts, arrivals, experiments
  moebench compare DIR --x K --y M  a sweep as a CSV, markdown table and plot (--by system)
  moebench cdf DIR --metric tpot    latency CDFs per system and percentile tables (ttft, e2e)
  moebench gap [hydra overrides]    a run's loads minus Belady's, by counterfactual replays
  moebench audit-prefetch           every system with and without prefetch (simulated)
  moebench tune-variants            choose the variants' knobs on the tuning split (simulated)
  moebench bench-sim                engine throughput and one Table 1 run's wall time
  moebench bench-policies           decision overhead of moe_infinity, fmoe and diff_moe
  moebench bench-behaviour          miss rate and throughput by batch size (simulated)
  moebench bench-backend            tokens/s: transformers vs TorchBackend (small model)
  moebench bench-memory             the runner's memory estimate vs measured peak RSS
  moebench validate                 simulated vs real per-token TPOT and stall error
  moebench characterize FILE        routing statistics (markdown + PNG), docs/routing.md
  moebench holdout-check --split S  synthetic vs held-out real routing, Table 1 systems
  moebench fit-routing MODEL        fit a model's generator preset to its routing targets
  moebench import-routing IN OUT    per-token routing (JSONL/CSV) -> trace v1
  moebench record model=... workload=...   record a routing trace from an HF model
  moebench calibrate [--quick]      measure this machine; write a hardware profile
"""

from __future__ import annotations

import sys

from core.specs import SpecError
from core.trace import TraceError


def _describe(result: dict, run_dir: str) -> str:
    from core.precision import results_label
    from workloads.labels import inputs_label  # prompts=... arrivals=... of the run

    m = result.get("metrics") or {}
    routing = "synthetic routing" if result["trace"]["synthetic"] else (
        f"routing {result['trace']['routing_source']}")
    inputs = inputs_label(result.get("config") or {})
    lossy = results_label([result])  # weights below 16 bits (core/precision.py)
    head = (f"[SIMULATED, {routing}]{f' [{lossy}]' if lossy else ''} "
            f"{result['system']['name']} | {result['model']['name']} | "
            f"{_gpus(result)} | {inputs}: {result['status']}")
    if result["status"] != "valid":
        return f"{head} ({result['reason']})"
    return (f"{head}, TPOT mean {_num(m['tpot_ms']['mean'], '.1f')} ms, hit rate "
            f"{_num(m['hit_rate'], '.3f')}, stall {_num(m['gpu_stall_ms_per_token'], '.1f')} "
            f"ms/token -> {run_dir}")


def _gpus(result: dict) -> str:
    """The hardware, with the GPU count and placement of a run that has one (docs/gpus.md)."""
    cfg = result.get("config") or {}
    placement = cfg.get("placement")
    if not placement:
        return result["hardware"]
    from systems.placements.base import placement_name

    return (f"{(cfg.get('hardware') or {}).get('num_gpus', 1)}x {result['hardware']} "
            f"({placement_name(placement)})")


def _num(value, spec: str) -> str:
    """A metric for the summary line; `n/a` where the run has none (TPOT of a trace with no
    decode steps)."""
    return "n/a" if value is None else format(value, spec)


def _sweep_dir(results_dir: str, experiment_name: str) -> str:
    """hydra.sweep.dir: checked before Hydra creates it, so a sweep cannot write outside."""
    from harness.runner.store import check_component

    try:
        check_component("experiment_name", experiment_name)
    except SpecError as exc:
        print(f"moebench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    return f"{results_dir}/{experiment_name}"


def _hydra_main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from core.paths import CONF_DIR
    from harness.runner.run_types import RunMemo
    from harness.runner.sweep import counted_sweep

    memo = RunMemo()  # traces and compute floors that this process's jobs share
    OmegaConf.register_new_resolver("moebench_sweep_dir", _sweep_dir, replace=True)

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def task(cfg: DictConfig) -> None:
        from hydra.types import RunMode

        from harness.runner.results import config_hash
        from harness.runner.runconfig import check_before_naming
        from harness.runner.store import default_run_name
        from harness.runner.sweep import run_job, unnamed_failure

        hc = HydraConfig.get()
        multirun, job_num = hc.mode == RunMode.MULTIRUN, int(hc.job.get("num") or 0)
        system_name = hc.runtime.choices.get("system")
        plain = OmegaConf.to_container(cfg, resolve=True)
        try:
            check_before_naming(plain)  # an unknown key or a NaN must not enter the name
            if plain.get("run_name") is None:
                plain["run_name"] = default_run_name(hc.overrides.task, system_name,
                                                     config_hash(plain))
            outcome = run_job(plain, multirun=multirun, system_name=system_name,
                              job_num=job_num, memo=memo)
        except (SpecError, TraceError) as exc:
            print(f"moebench: error: {exc}", file=sys.stderr)
            if not multirun:  # a single run's bad input: exit 2, nothing written
                sys.exit(2)
            outcome = unnamed_failure(job_num, exc)  # a sweep goes on (harness/runner/sweep.py)
        _print_outcome(outcome)
        if outcome["status"] == "failed" and not multirun:
            sys.exit(1)

    with counted_sweep() as counts:  # filled by the sweep's summary (SweepCallback)
        task()
    if counts.get("failed"):
        sys.exit(1)


def _print_outcome(outcome: dict) -> None:
    """One line per finished job on stdout."""
    if outcome["status"] == "done":
        print(_describe(outcome["result"], outcome["run_dir"]), flush=True)
    elif outcome["status"] == "skipped":
        print(f"skipped (complete, resume=true): {outcome['run_dir']}", flush=True)
    else:
        where = f" -> {outcome['run_dir']}" if outcome["run_dir"] else ""
        print(f"FAILED: {outcome['reason']}{where}", flush=True)


# Subcommand -> module whose main(argv) -> exit code runs it (imported only when used).
SUBCOMMANDS = {
    "reproduce": "analysis.repro.suite:reproduce_main",
    "report": "analysis.repro.suite:report_main",
    "claims": "analysis.repro.suite:claims_main",
    "claims-diff": "analysis.repro.claims_diff",
    "figures": "analysis.repro.suite:figures_main",
    "table1": "analysis.table1",
    "gap": "analysis.gap",
    "zoo": "analysis.zoo",
    "list": "analysis.listing",
    "compare": "analysis.compare",
    "cdf": "analysis.cdf",
    "audit-prefetch": "analysis.prefetch_audit",
    "tune-variants": "analysis.tune_variants",
    "characterize": "analysis.routing_report",
    "holdout-check": "analysis.routing_holdout",
    "fit-routing": "analysis.fit_routing",
    "import-routing": "workloads.importers",
    "bench-sim": "harness.bench.sim",
    "bench-policies": "harness.bench.policies",
    "bench-behaviour": "harness.bench.behaviour",
    "bench-backend": "harness.bench.backend",
    "bench-memory": "harness.bench.memory",
    "validate": "harness.live.validate",
    "record": "harness.live.record",
    "calibrate": "harness.live.calibrate",
}


# Hydra's flags that take the next argument as their value (`--config-name NAME`)
_VALUE_FLAGS = ("-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn",
                "--config-name", "-cd", "--config-dir", "--experimental-rerun")


def _overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _VALUE_FLAGS
        else:
            out.append(arg)
    return out


def _before_hydra(argv: list[str]) -> list[str]:
    """The checks that need the command line as written (harness/runner/overrides.py), and
    the experiment folder of a run that is not the pinned setting."""
    from harness.runner.overrides import assign, check_sweep, experiment_folder

    overrides = _overrides(argv)
    try:
        check_sweep(overrides, multirun=bool({"-m", "--multirun"} & set(argv)))
        folder = experiment_folder(overrides)
    except SpecError as exc:
        print(f"moebench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if folder is None:
        return argv
    print(f"moebench: this setting differs from the pinned experiment; its runs go to the "
          f"experiment folder {folder} (experiment_name=... chooses another)", file=sys.stderr)
    return [*argv, assign("experiment_name", folder)]


def main(argv: list[str] | None = None) -> None:
    from harness.runner.parent import watch_parent

    watch_parent()  # a sweep started by `moebench reproduce` stops when that process dies
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        module, _, func = SUBCOMMANDS[argv[0]].partition(":")
        sys.exit(getattr(importlib.import_module(module), func or "main")(argv[1:]))
    sys.argv = [sys.argv[0], *_before_hydra(argv)]
    _hydra_main()


if __name__ == "__main__":
    main()
