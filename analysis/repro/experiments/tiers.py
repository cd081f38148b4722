"""tiers: what host memory, an NVMe tier, CPU-run misses and quantized experts do to TPOT;
conf/experiment/tiers.yaml, docs/hardware.md.

Not a paper's table: the settings the papers leave out (MoE-Infinity gives each model's host
memory; Mixtral-Offloading quantizes; kTransformers, Fiddler and HybriMoE run misses on the
CPU). Two studies, each a sweep over seeds:
  host memory  TPOT against hardware.host.dram_gb with the experts that do not fit read from
               NVMe: DeepSeek-V2-Lite (bf16 and 4-bit experts, GPU cache 6 GiB) and
               Mixtral-8x7B (bf16, the GPU cache the RTX 4090 leaves), lru and the oracle (a bound);
  misses       composed lru + no prefetch with each miss handler (fetch, cpu, cost_based)
               across PCIe 3, 4 and 5 links, on a desktop host (2-channel DDR5) and a server
               socket (8-channel DDR5, AMX).
No claim is judged: nothing here has a published value. The table gives each cell's TPOT
mean and 95 % interval over seeds, the NVMe bytes and the CPU's share of expert runs.
"""

from __future__ import annotations

from analysis.repro.output import new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.sweepstats import mean_ci

TITLE = "Memory tiers: host DRAM, NVMe, CPU-run misses, quantized experts"
SEEDS = (0, 1, 2)
DEEPSEEK_DRAM_GB = (12, 16, 24, 32, 40)  # host reserve 8 GiB: 4..32 GiB for 26.8 GiB of experts
MIXTRAL_DRAM_GB = (24, 48, 72, 100)  # 16..92 GiB for 84 GiB of bf16 experts
HANDLERS = ("fetch", "cpu", "cost_based")
LINKS = ("pcie3_x16", "pcie4_x16", "pcie5_x16")
HOSTS = ("ddr5_dual_channel", "ddr5_eight_channel")
COLUMNS = ("study", "model", "expert_bits", "system", "miss_handler", "host", "dram_gb", "link",
           "seeds", "tpot_mean_ms", "tpot_ci95_ms", "hit_rate", "nvme_gb_per_token",
           "cpu_share", "lossy")


def _sweeps() -> tuple[Sweep, ...]:
    dram = ",".join(map(str, DEEPSEEK_DRAM_GB))
    return (
        Sweep(("model=deepseek_v2_lite", "model.expert_bits=16,4", "expert_cache_gb=6",
               f"hardware.host.dram_gb={dram}", "system=lru,oracle")),
        Sweep(("model=mixtral_8x7b", f"hardware.host.dram_gb={','.join(map(str, MIXTRAL_DRAM_GB))}",
               "system=lru,oracle")),
        Sweep(("model=deepseek_v2_lite", "expert_cache_gb=6", "system=composed",
               f"system/miss_handler={','.join(HANDLERS)}", f"hardware/link={','.join(LINKS)}",
               f"hardware/host={','.join(HOSTS)}")),
        Sweep(("model=mixtral_8x7b", "system=composed",
               f"system/miss_handler={','.join(HANDLERS)}", f"hardware/link={','.join(LINKS)}",
               f"hardware/host={','.join(HOSTS)}")),
    )


def _cell(result: dict) -> tuple:
    """The setting a run stands for (everything but its seed)."""
    cfg, system = result["config"], result["system"]
    hw = cfg["hardware"]
    handler = (system.get("miss_handler") or {}).get("name", "fetch")
    composed = system["name"] == "composed"
    return ("misses" if composed else "host memory", cfg["model"]["name"],
            cfg["model"]["expert_bits"], "composed lru" if composed else system["name"],
            handler, hw["host"]["name"], hw["host"]["dram_gb"], hw.get("link") or "gpu's own")


def _row(cell: tuple, results: list[dict]) -> dict:
    ms = [r["metrics"] for r in results]
    mean, half, n = mean_ci([m["tpot_ms"]["mean"] for m in ms])
    tokens = [m["tokens"] for m in ms]
    nvme = [m.get("nvme_read_bytes", 0) / t / 1e9 for m, t in zip(ms, tokens)]
    cpu = [m.get("cpu_runs", 0) / m["accesses"] for m in ms]
    return {**dict(zip(COLUMNS, cell)), "seeds": n, "tpot_mean_ms": mean, "tpot_ci95_ms": half,
            "hit_rate": mean_ci([m["hit_rate"] for m in ms])[0],
            "nvme_gb_per_token": mean_ci(nvme)[0], "cpu_share": mean_ci(cpu)[0],
            "lossy": "yes" if cell[2] < 16 else "no"}


def table(runs):
    """One row per setting (study, model, bits, system, handler, host, DRAM, link), averaged
    over its valid seeds."""
    import pandas as pd

    cells: dict[tuple, list[dict]] = {}
    for r in runs.to_dict("records"):
        if r["status"] == "valid":
            cells.setdefault(_cell(r["_result"]), []).append(r["_result"])
    rows = [_row(c, cells[c]) for c in sorted(cells, key=lambda c: tuple(map(str, c)))]
    first = runs.iloc[0]
    header = [f"# {TITLE}, SIMULATED", "",
              f"{first['routing']} routing, batch 1, {first['requests']} requests per cell; "
              "tpot_mean_ms is the mean over the `seeds` column's seeds, tpot_ci95_ms its 95 % "
              "t-interval half-width. nvme_gb_per_token: GB read from NVMe per generated token; "
              "cpu_share: the share of expert runs on the host CPU. lossy = yes: 4-bit experts "
              "(with their dequantisation cost, docs/quantization.md)."]
    return pd.DataFrame(rows, columns=list(COLUMNS)), header, [
        "Host DRAM holds dram_gb less the host profile's reserve_gb of experts; the rest are "
        "read from the NVMe profile, staged through DRAM into the GPU copy (docs/hardware.md).",
        "No claim is judged: these settings have no published value."]


def figure(tab, runs):
    """Left: TPOT against host DRAM (host-memory study). Right: TPOT per miss handler and link
    (misses study), desktop host solid, server socket dashed."""
    fig, ax = new_figure(TITLE, runs.iloc[0]["routing"], width=13.0, height=4.6)
    fig.delaxes(ax)
    left, right = fig.subplots(1, 2)
    mem = tab[tab["study"] == "host memory"]
    for (model, bits, system), g in mem.groupby(["model", "expert_bits", "system"]):
        g = g.sort_values("dram_gb")
        left.errorbar(g["dram_gb"], g["tpot_mean_ms"], yerr=g["tpot_ci95_ms"].fillna(0),
                      marker="o", capsize=2, label=f"{model} {bits}-bit, {system}")
    left.set_xlabel("host DRAM (GiB, incl. the host's reserve)")
    left.set_ylabel("TPOT mean (ms, simulated)")
    left.set_yscale("log")
    left.legend(fontsize=6)
    miss = tab[tab["study"] == "misses"]
    x = {link: i for i, link in enumerate(LINKS)}
    for (model, handler, host), g in miss.groupby(["model", "miss_handler", "host"]):
        g = g.sort_values("link")
        right.plot([x[v] for v in g["link"]], g["tpot_mean_ms"], marker="o",
                   ls="-" if host == HOSTS[0] else "--", label=f"{model}, {handler}, {host}")
    right.set_xticks(list(x.values()), list(x))
    right.set_ylabel("TPOT mean (ms, simulated)")
    right.set_yscale("log")
    right.legend(fontsize=5, ncol=2)
    return fig


def claims(tab, runs, real):
    """No published claim: the tiers are this suite's own study."""
    return []


EXPERIMENT = Experiment(
    name="tiers", title=TITLE,
    mirrors="no paper's table: the memory tiers the papers leave out (docs/hardware.md)",
    sweeps=_sweeps(), table=table, figure=figure, claims=claims, seeds=SEEDS,
    cannot_express=("the OS page cache, NUMA placement and pinned-buffer limits of a real "
                    "host; CPU kernels' own batching effects beyond the FLOP/s and bandwidth "
                    "roofline (docs/hardware.md)",),
    notes=("Scaled down: 6 requests of prompt 128 and 24 output tokens per cell, 3 seeds.",))
