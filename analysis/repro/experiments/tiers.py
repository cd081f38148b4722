"""tiers: what host memory, an NVMe tier, CPU-run misses and quantized experts do to TPOT;
conf/experiment/tiers.yaml, docs/hardware.md.

Not a paper's table: the settings the papers leave out (MoE-Infinity gives each model's host
memory; Mixtral-Offloading quantizes; kTransformers, Fiddler and HybriMoE run misses on the
CPU). Three studies, each a sweep over seeds:
  host memory  TPOT against hardware.host.dram_gb with the experts that do not fit read from
               NVMe: DeepSeek-V2-Lite (bf16 and 4-bit experts, GPU cache 6 GiB) and
               Mixtral-8x7B (bf16, the GPU cache the RTX 4090 leaves), lru and the oracle (a bound);
  misses       composed lru + no prefetch with each miss handler (fetch, cpu, cost_based),
               and the named CPU-offload systems (ktransformers, fiddler, hybrimoe), across
               PCIe 3, 4 and 5 links, on a desktop host (2-channel DDR5) and a server socket
               (8-channel DDR5, AMX);
  paper hosts  MoE-Infinity's host memory per model (Switch-large-128 64 GB, NLLB-MoE 256,
               DeepSeek-V2-Lite 32, Mixtral 128; read as GiB) at its README setting (one RTX
               A5000, prompt 512, decode 32), against a host that holds every expert
               (4096 GiB), moe_infinity and its variant; the paper's SSD is not stated: the
               consumer NVMe profile stands in for it.
No claim is judged: nothing here has a published value. The table gives each cell's TPOT
mean and 95 % interval over seeds, the NVMe bytes and the CPU's share of expert runs.
"""

from __future__ import annotations

from analysis.repro.experiments._moe_infinity_paper import HOST_MEMORY_GB
from analysis.repro.output import new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.sweepstats import mean_ci
from harness.runner.config import CPU_SYSTEMS

TITLE = "Memory tiers: host DRAM, NVMe, CPU-run misses, quantized experts"
SEEDS = (0, 1, 2)
DEEPSEEK_DRAM_GB = (12, 16, 24, 32, 40)  # host reserve 8 GiB: 4..32 GiB for 26.8 GiB of experts
MIXTRAL_DRAM_GB = (24, 48, 72, 100)  # 16..92 GiB for 84 GiB of bf16 experts
HANDLERS = ("fetch", "cpu", "cost_based")
LINKS = ("pcie3_x16", "pcie4_x16", "pcie5_x16")
HOSTS = ("ddr5_dual_channel", "ddr5_eight_channel")
PAPER_HOST_MODELS = ("switch_large_128", "nllb_moe_54b", "deepseek_v2_lite", "mixtral_8x7b")
UNBOUNDED_GB = 4096  # more than any of these models' experts: DRAM holds them all
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
        *(Sweep((f"model={m}", *(("expert_cache_gb=6",) if m == "deepseek_v2_lite" else ()),
                 f"system={','.join(sorted(CPU_SYSTEMS))}", f"hardware/link={','.join(LINKS)}",
                 f"hardware/host={','.join(HOSTS)}"))
          for m in ("deepseek_v2_lite", "mixtral_8x7b")),
        *(Sweep(("hardware=rtx_a5000", f"model={m}", "workload.prompt_len=512",
                 "workload.output_len=32", f"hardware.host.dram_gb={HOST_MEMORY_GB[m]},"
                 f"{UNBOUNDED_GB}", "system=moe_infinity,moe_infinity_hysteresis"))
          for m in PAPER_HOST_MODELS),
    )


def _cell(result: dict) -> tuple:
    """The setting a run stands for (everything but its seed)."""
    cfg, system = result["config"], result["system"]
    hw = cfg["hardware"]
    handler = (system.get("miss_handler") or {}).get("name", "fetch")
    composed = system["name"] == "composed"
    study = ("misses" if composed or system["name"] in CPU_SYSTEMS else
             "paper hosts" if hw["name"] == "rtx_a5000" else "host memory")
    return (study, cfg["model"]["name"],
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
    rows = [_row(c, cells[c]) for c in sorted(cells)]
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
    """Top left: TPOT against host DRAM. Top right: TPOT per miss handler and link. Bottom
    left: the named CPU-offload systems per link. Bottom right: MoE-Infinity's hosts against
    an unbounded one. Desktop host solid, server socket dashed."""
    fig, ax = new_figure(TITLE, runs.iloc[0]["routing"], width=13.0, height=9.0)
    fig.delaxes(ax)
    (memory, handlers), (named, hosts) = fig.subplots(2, 2)
    _memory_panel(memory, tab[tab["study"] == "host memory"])
    miss = tab[tab["study"] == "misses"]
    _misses_panel(handlers, miss[miss["system"] == "composed lru"], "miss_handler", HANDLERS,
                  "misses: fetch vs CPU vs cost-based (composed lru)")
    _misses_panel(named, miss[miss["system"] != "composed lru"], "system",
                  tuple(sorted(CPU_SYSTEMS)), "the named CPU-offload systems")
    _paper_hosts_panel(hosts, tab[tab["study"] == "paper hosts"])
    return fig


def _memory_panel(ax, mem) -> None:
    for (model, bits, system), g in mem.groupby(["model", "expert_bits", "system"]):
        g = g.sort_values("dram_gb")
        ax.errorbar(g["dram_gb"], g["tpot_mean_ms"], yerr=g["tpot_ci95_ms"].fillna(0),
                    marker="o", capsize=2, label=f"{model} {bits}-bit, {system}")
    ax.set_title("host memory, NVMe below it", fontsize=9)
    ax.set_xlabel("host DRAM (GiB, incl. the host's reserve)")
    ax.set_ylabel("TPOT mean (ms, simulated)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)


def _misses_panel(ax, miss, by: str, names: tuple, title: str) -> None:
    """TPOT per link; colour: `by` (a miss handler or a system); marker: the model; line:
    the host."""
    from matplotlib.lines import Line2D

    colour = dict(zip(names, ("tab:blue", "tab:orange", "tab:green")))
    marker = {"deepseek_v2_lite": "o", "mixtral_8x7b": "s"}
    x = {link: i for i, link in enumerate(LINKS)}
    for (model, name, host), g in miss.groupby(["model", by, "host"]):
        g = g.sort_values("link")
        ax.plot([x[v] for v in g["link"]], g["tpot_mean_ms"], color=colour[name],
                marker=marker.get(model, "^"), ls="-" if host == HOSTS[0] else "--")
    handles = ([Line2D([], [], color=c, label=n) for n, c in colour.items()]
               + [Line2D([], [], color="0.3", marker=m, ls="", label=n)
                  for n, m in marker.items()]
               + [Line2D([], [], color="0.3", ls=ls, label=h)
                  for h, ls in zip(HOSTS, ("-", "--"))])
    ax.set_xticks(list(x.values()), list(x))
    ax.set_ylabel("TPOT mean (ms, simulated)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=handles, fontsize=6)


def _paper_hosts_panel(ax, hosts) -> None:
    mine = hosts[hosts["system"] == "moe_infinity"]
    models = [m for m in PAPER_HOST_MODELS if m in set(mine["model"])]
    for j, bounded in enumerate((True, False)):
        sel = mine[(mine["dram_gb"] < UNBOUNDED_GB) == bounded].set_index("model")
        vals = [sel["tpot_mean_ms"].get(m) for m in models]
        errs = [sel["tpot_ci95_ms"].get(m) or 0 for m in models]
        ax.bar([i + 0.4 * j for i in range(len(models))], vals, 0.4, yerr=errs, capsize=2,
               label="the paper's host DRAM" if bounded else "every expert in DRAM")
    ax.set_xticks([i + 0.2 for i in range(len(models))], models, rotation=20, fontsize=7)
    ax.set_title("MoE-Infinity's hosts (RTX A5000)", fontsize=9)
    ax.set_ylabel("moe_infinity TPOT mean (ms, simulated)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)


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
