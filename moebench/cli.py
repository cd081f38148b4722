"""`moebench`: Hydra runner for one configuration or a multirun sweep, plus subcommands.

  moebench [hydra overrides]        run (or, with -m, sweep) configurations
  moebench table1 [results dir]     write results/table1/table1.{md,csv} from finished runs
  moebench zoo [results dir]        write results/zoo/zoo.{md,csv} (evictor x prefetcher)
  moebench gap [hydra overrides]    a run's loads minus Belady's, by counterfactual replays
  moebench audit-prefetch           every system with and without prefetch (simulated)
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

from core.specs import SpecError
from core.trace import TraceError


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

    from core.paths import PROJECT_ROOT

    OmegaConf.register_new_resolver("moebench_sweep_dir", _sweep_dir, replace=True)

    @hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="config", version_base="1.3")
    def task(cfg: DictConfig) -> None:
        from harness.runner.results import config_hash
        from harness.runner.run import run_config
        from harness.runner.runconfig import check_before_naming
        from harness.runner.store import default_run_name

        plain = OmegaConf.to_container(cfg, resolve=True)
        try:
            check_before_naming(plain)  # an unknown key or a NaN must not enter the name
            if plain.get("run_name") is None:
                plain["run_name"] = default_run_name(
                    HydraConfig.get().overrides.task, HydraConfig.get().runtime.choices["system"],
                    config_hash(plain))
            result = run_config(plain)
        except (SpecError, TraceError) as exc:
            print(f"moebench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        print(_describe(result), flush=True)

    task()


# Subcommand -> module whose main(argv) -> exit code runs it (imported only when used).
SUBCOMMANDS = {
    "table1": "analysis.table1",
    "gap": "analysis.gap",
    "zoo": "analysis.zoo",
    "audit-prefetch": "analysis.prefetch_audit",
    "characterize": "analysis.routing_report",
    "import-routing": "workloads.importers",
    "bench-sim": "harness.bench.sim",
    "bench-policies": "harness.bench.policies",
    "bench-behaviour": "harness.bench.behaviour",
    "bench-backend": "harness.bench.backend",
    "validate": "harness.live.validate",
    "record": "harness.live.record",
    "calibrate": "harness.live.calibrate",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]))
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
