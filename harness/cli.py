"""`moebench`: Hydra runner for one configuration or a multirun sweep, plus subcommands.

  moebench [hydra overrides]        run (or, with -m, sweep) configurations
  moebench table1 [results dir]     write results/table1/table1.{md,csv} from finished runs
  moebench bench-sim                engine throughput and one Table 1 run's wall time
  moebench bench-policies           decision overhead of moe_infinity, fmoe and diff_moe
  moebench bench-behaviour          miss rate and throughput by batch size (simulated)
  moebench bench-backend            tokens/s: transformers vs TorchBackend (small model)
  moebench validate                 simulated vs real per-token TPOT and stall error
  moebench characterize FILE        routing statistics (markdown + PNG), docs/routing.md
  moebench import-routing IN OUT    per-token routing (JSONL/CSV) -> trace v1
  moebench record model=... workload=...   record a routing trace from an HF model
  moebench calibrate [--quick]      measure this machine; write a hardware profile
"""

from __future__ import annotations

import sys

from harness.specs import SpecError
from harness.trace import TraceError


def _describe(result: dict) -> str:
    m = result.get("metrics") or {}
    routing = "synthetic routing" if result["trace"]["synthetic"] else (
        f"routing {result['trace']['routing_source']}")
    head = (f"[SIMULATED, {routing}] {result['system']['name']} | {result['model']['name']} | "
            f"{result['hardware']}: {result['status']}")
    if result["status"] != "valid":
        return f"{head} ({result['reason']})"
    tpot = m["tpot_ms"]["mean"]
    return (f"{head}, TPOT mean {tpot:.1f} ms, hit rate {m['hit_rate']:.3f}, "
            f"stall {m['gpu_stall_ms_per_token']:.1f} ms/token -> {result['_run_dir']}")


# Overrides that do not change what a run computes are left out of its folder name.
_NAME_EXCLUDED = ("experiment", "experiment_name", "results_dir", "progress", "run_name")


def default_run_name(task_overrides, system: str) -> str:
    """`lru` for a plain run; `lru,hardware.h2d_gbps=16` when other settings are overridden,
    so the runs of a sweep never overwrite each other."""
    parts = [system]
    for item in sorted(task_overrides):
        key = item.split("=", 1)[0].lstrip("+~")
        if key != "system" and key not in _NAME_EXCLUDED:
            parts.append(item.lstrip("+~").replace("/", "_"))
    return ",".join(parts)


def _hydra_main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from harness.results import PROJECT_ROOT

    @hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="config", version_base="1.3")
    def task(cfg: DictConfig) -> None:
        from harness.run import run_config

        plain = OmegaConf.to_container(cfg, resolve=True)
        if plain.get("run_name") is None:
            plain["run_name"] = default_run_name(HydraConfig.get().overrides.task,
                                                 HydraConfig.get().runtime.choices["system"])
        try:
            result = run_config(plain)
        except (SpecError, TraceError) as exc:
            print(f"moebench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        print(_describe(result), flush=True)

    task()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "table1":
        from analysis.table1 import main as table1_main

        sys.exit(table1_main(argv[1:]))
    if argv and argv[0] == "characterize":
        from analysis.routing_report import main as characterize_main

        sys.exit(characterize_main(argv[1:]))
    if argv and argv[0] == "import-routing":
        from workloads.importers import main as import_main

        sys.exit(import_main(argv[1:]))
    if argv and argv[0] == "bench-sim":
        from harness.bench_sim import main as bench_main

        sys.exit(bench_main(argv[1:]))
    if argv and argv[0] == "bench-policies":
        from harness.bench_policies import main as bench_policies_main

        sys.exit(bench_policies_main(argv[1:]))
    if argv and argv[0] == "bench-behaviour":
        from harness.bench_behaviour import main as bench_behaviour_main

        sys.exit(bench_behaviour_main(argv[1:]))
    if argv and argv[0] == "bench-backend":
        from harness.bench_backend import main as bench_backend_main

        sys.exit(bench_backend_main(argv[1:]))
    if argv and argv[0] == "validate":
        from harness.validate import main as validate_main

        sys.exit(validate_main(argv[1:]))
    if argv and argv[0] == "record":
        from harness.record import main as record_main

        sys.exit(record_main(argv[1:]))
    if argv and argv[0] == "calibrate":
        from harness.calibrate import main as calibrate_main

        sys.exit(calibrate_main(argv[1:]))
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
