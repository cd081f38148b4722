"""Compose the Hydra config without the CLI (benchmarks, tests, notebooks)."""

from __future__ import annotations

from pathlib import Path

from core.paths import CONF_DIR


def compose_config(overrides: list[str], run_name: str = "run",
                   results_dir: str | None = None) -> dict:
    """The resolved config dict `moebench <overrides>` would run (run_name/results_dir fixed).
    results_dir defaults to results/ under the working directory, where the command line
    writes too (conf/config.yaml), never beside an installed copy's packages."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    extra = [f"run_name={run_name}",
             f"results_dir={results_dir or Path.cwd() / 'results'}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, *extra])
    return OmegaConf.to_container(cfg, resolve=True)


# Named systems that run experts on the host CPU (docs/systems.md, "CPU-offload systems"):
# they need a host profile (hardware.host), which Table 1's GPU-only setting has not.
CPU_SYSTEMS = ("fiddler", "hybrimoe", "ktransformers")
# conf/system/*.yaml entries that are not named systems of Table 1: the composed system (a
# frame for the plug-in zoo), the Belady bounds besides `oracle` and the CPU-offload systems.
# The Makefile's reproduce-table1 glob excludes the same names.
NOT_IN_TABLE1 = ("composed", "belady", "belady_bypass", "belady_lookahead", *CPU_SYSTEMS)
# The Hydra sweep value that selects Table 1's systems (make reproduce-table1, bench-sim)
TABLE1_GLOB = f"glob(*,exclude=[{','.join(NOT_IN_TABLE1)}])"


def system_names() -> list[str]:
    """The named systems (Table 1's rows, `oracle` included): conf/system/*.yaml less
    NOT_IN_TABLE1."""
    return sorted(p.stem for p in (CONF_DIR / "system").glob("*.yaml")
                  if p.stem not in NOT_IN_TABLE1)


def cpu_system_names() -> list[str]:
    """The named CPU-offload systems (CPU_SYSTEMS): not Table 1 rows; they need a host."""
    return sorted(CPU_SYSTEMS)
