"""gpus: TPOT on 1, 2, 4 and 6 GPUs under each placement of the experts; conf/experiment/
gpus.yaml, the engine's contract in harness/sim/gpus.py and harness/sim/step_gpus.py.

Not a paper's table: fMoE's testbed (six RTX 3090s, joined in pairs by NVLink bridges:
hardware/peer=nvlink_3090_bridge) used as the papers do not, every GPU holding experts.
Mixtral-8x7B and DeepSeek-V2-Lite on 1, 2, 4 and 6 GPUs, each GPU with the expert cache its
memory leaves (the memory plan, per GPU), under each placement (systems/placements/):
shard_expert (expert e of every layer on GPU e N / E), shard_layer (MoE layer l on GPU
l N / L) and replicate_hot (the keys with the most calibration tokens, a quarter of one
GPU's cache slots of them, may be cached on every GPU; the rest by expert). One GPU is the
single-GPU engine (every placement gives the same run there), the baseline of each line.
Systems: lru (Mixtral-Offloading), fmoe (the testbed's paper) with its named variant
fmoe_admission beside it, and the oracle (Belady's MIN loads with the earliest prefetch:
each GPU plans on the accesses it runs, so its loads are MIN's per GPU under static shards).
No claim is judged: nothing here has a published value. The table gives each cell's TPOT
mean and 95 % interval over seeds and the bytes per generated token on each kind of link.
"""

from __future__ import annotations

from analysis.repro.output import new_figure
from analysis.repro.spec import Experiment, Sweep
from analysis.sweepstats import mean_ci
from systems.placements.base import placement_name

TITLE = "Several GPUs: TPOT against the GPU count and the placement of the experts"
SEEDS = (0, 1, 2)
MODELS = ("mixtral_8x7b", "deepseek_v2_lite")
GPU_COUNTS = (1, 2, 4, 6)
PLACEMENTS = ("shard_expert", "shard_layer", "replicate_hot")
SYSTEMS = ("lru", "fmoe", "fmoe_admission", "oracle")
ONE_GPU = "one GPU"  # the placement column of the single-GPU runs: every placement is one
COLUMNS = ("model", "placement", "num_gpus", "system", "seeds", "tpot_mean_ms", "tpot_ci95_ms",
           "compute_floor_ms", "stall_ms_per_token", "hit_rate", "cache_gib_per_gpu",
           "peak_resident_experts", "host_link_gb_per_token", "peer_copy_gb_per_token",
           "a2a_gb_per_token", "peer_fetches_per_token", "peer_messages_per_token",
           "speedup_vs_1gpu")


def _sweeps() -> tuple[Sweep, ...]:
    models, systems = ",".join(MODELS), ",".join(SYSTEMS)
    return (
        Sweep((f"model={models}", "hardware.num_gpus=1", f"system={systems}")),
        Sweep((f"model={models}", "hardware.num_gpus=" + ",".join(map(str, GPU_COUNTS[1:])),
               f"placement={','.join(PLACEMENTS)}", f"system={systems}")),
    )


def placement_of(config: dict) -> str:
    """The placement's name from a run's config (its `_target_`'s module), ONE_GPU for a
    run on one GPU."""
    node = config.get("placement")
    if config["hardware"].get("num_gpus", 1) == 1 or not node:
        return ONE_GPU
    return placement_name(node)


def _cell(result: dict) -> tuple:
    cfg = result["config"]
    return (cfg["model"]["name"], placement_of(cfg), cfg["hardware"].get("num_gpus", 1),
            result["system"]["name"])


def _per_token(ms: list[dict], key: str, fallback: str | None = None) -> float | None:
    """Mean over seeds of metric `key` (bytes) / generated tokens, in GB."""
    vals = [m.get(key, m.get(fallback) if fallback else 0) / m["tokens"] / 1e9 for m in ms]
    return mean_ci(vals)[0]


def _count(ms: list[dict], key: str) -> float | None:
    """Mean over seeds of count `key` per generated token (0 on one GPU)."""
    return mean_ci([m.get(key, 0) / m["tokens"] for m in ms])[0]


def _row(cell: tuple, results: list[dict], base: dict[int, float] | None) -> dict:
    """One table row; `base`: the same model and system on one GPU, TPOT by seed."""
    ms = [r["metrics"] for r in results]
    mean, half, n = mean_ci([m["tpot_ms"]["mean"] for m in ms])
    speed = [base[r["seed"]] / r["metrics"]["tpot_ms"]["mean"] for r in results
             if base and r["seed"] in base]
    cache = results[0]["memory"]["expert_cache_bytes"] / 2**30
    return {**dict(zip(COLUMNS, cell)), "seeds": n, "tpot_mean_ms": mean, "tpot_ci95_ms": half,
            "compute_floor_ms": mean_ci([m["compute_floor_ms"] for m in ms])[0],
            "stall_ms_per_token": mean_ci([m["decode_stall_ms_per_token"] for m in ms])[0],
            "hit_rate": mean_ci([m["hit_rate"] for m in ms])[0], "cache_gib_per_gpu": cache,
            "peak_resident_experts": mean_ci([m["peak_expert_cache_bytes"] / m["expert_bytes"]
                                              for m in ms])[0],
            "host_link_gb_per_token": _per_token(ms, "host_link_bytes", "h2d_bytes"),
            "peer_copy_gb_per_token": _per_token(ms, "peer_copy_bytes"),
            "a2a_gb_per_token": _per_token(ms, "a2a_bytes"),
            "peer_fetches_per_token": _count(ms, "peer_fetches"),
            "peer_messages_per_token": _count(ms, "peer_messages"),
            "speedup_vs_1gpu": mean_ci(speed)[0]}


def _order(cell: tuple) -> tuple:
    model, placement, n, system = cell
    rank = {p: i for i, p in enumerate((ONE_GPU, *PLACEMENTS))}
    return (MODELS.index(model) if model in MODELS else 9, model, rank.get(placement, 9),
            placement, n, SYSTEMS.index(system) if system in SYSTEMS else 9, system)


def table(runs):
    """One row per (model, placement, GPU count, system), averaged over its valid seeds;
    speedup_vs_1gpu: the same model and system's TPOT on one GPU / this TPOT, per seed
    (the same seed replays the same requests), averaged over seeds."""
    import pandas as pd

    cells: dict[tuple, list[dict]] = {}
    for r in runs.to_dict("records"):
        if r["status"] == "valid":
            cells.setdefault(_cell(r["_result"]), []).append(r["_result"])
    one = {(c[0], c[3]): {r["seed"]: r["metrics"]["tpot_ms"]["mean"] for r in rs}
           for c, rs in cells.items() if c[2] == 1}
    rows = [_row(c, cells[c], one.get((c[0], c[3]))) for c in sorted(cells, key=_order)]
    first = runs.iloc[0]
    header = [f"# {TITLE}, SIMULATED", "",
              f"RTX 3090s joined in pairs by NVLink bridges (hardware/peer=nvlink_3090_bridge), "
              f"{first['routing']} routing, batch 1, {first['requests']} requests per cell; "
              + HEADER]
    return pd.DataFrame(rows, columns=list(COLUMNS)), header, list(NOTES)


HEADER = (
    "tpot_mean_ms is the mean over the `seeds` column's seeds, tpot_ci95_ms its 95 % "
    "t-interval half-width; compute_floor_ms: the TPOT with every expert resident on the "
    "same GPUs and placement (no_offload, the all-to-all paid); "
    "stall_ms_per_token: the decode steps' wait for experts per token, summed over the GPUs "
    "(their waits overlap, so it may exceed TPOT). cache_gib_per_gpu: "
    "each GPU's expert cache (what its memory leaves); peak_resident_experts: the most "
    "experts resident at once, summed over the GPUs (a replica counts on each GPU that holds "
    "it). Per generated token: host_link_gb_per_token, GB copied from host memory over every "
    "GPU's host link; peer_copy_gb_per_token, experts copied between GPUs; a2a_gb_per_token, "
    "tokens' hidden states sent to the GPU that runs their expert and back; "
    "peer_fetches_per_token, the copies from a peer; peer_messages_per_token, the messages "
    "between GPUs (expert copies and all-to-all). speedup_vs_1gpu: the same model and "
    "system's TPOT on one GPU / this TPOT, per seed (a seed replays the same requests), "
    "averaged. Each row's values are means over its seeds.")

NOTES = (
    "Modelled (harness/sim/gpus.py, step_gpus.py, copies_gpu.py; docs/gpus.md): each GPU has "
    "its own expert cache, its own copy engine on its own host link and its own instance of "
    "the system, which knows the share of each layer its GPU may hold (lru's per-layer quota "
    "and layer_offload's layers use it) and, for the oracle, the accesses its GPU runs; "
    "request r's tokens live on GPU r % N; a token routed to an expert another GPU runs is "
    "sent there and its output back (all-to-all) over the NVLink bridge of a pair, or through "
    "host memory between GPUs of different pairs; a miss that the GPU's bridged partner holds "
    "is copied from it before the host; the GPUs of a layer run at the same time.",
    "Not modelled: the dense part is replicated on every GPU (each GPU's memory plan holds "
    "all dense weights), not split by tensor or pipeline parallelism; each GPU has a host "
    "link of its own at the profile's full rate (no shared root complex or host-memory "
    "bandwidth); within a layer the GPUs are stepped one after another, in id order, so a "
    "port two of them share is taken in that order; a peer copy's source is not pinned "
    "while the peer reads it.",
    "Batch 1: one request runs at a time, so one GPU (its home, r % N) runs the dense part "
    "while the others hold and run experts; more GPUs add cache and expert concurrency, not "
    "parallel requests.",
    "The floor is each placement's own: under shard_expert a token's experts sit on "
    "different GPUs and run at the same time, so the floor falls with the GPU count "
    "(Mixtral-8x7B 36.4, 28.9, 25.8, 25.0 ms at 1, 2, 4, 6 GPUs); under shard_layer a "
    "layer's experts run one after another on one GPU and every layer off the home GPU adds "
    "a round trip, so it rises (36.7, 37.2, 37.4 ms at 2, 4, 6).",
    "More GPUs, slower: DeepSeek-V2-Lite under shard_layer. From 2 GPUs every expert is "
    "resident (host_link_gb_per_token 0.20: each expert copied once) and every system runs "
    "at the floor, which grows with the all-to-all: 26, 39, 43 messages per token at 2, 4, "
    "6 GPUs (peer_messages_per_token), and beyond its pair a GPU is reached through host "
    "memory, two copies' latency; the oracle at 6 GPUs is 0.96x its one-GPU speed (19.97 "
    "against 19.16 ms).",
    "Mixtral-8x7B at 6 GPUs, lru and fmoe faster under shard_layer than shard_expert (37.4 "
    "against 54.7 and 48.5 ms): 8 experts in contiguous blocks over 6 GPUs give GPUs 0 and "
    "3 two experts of every layer, 64 keys for 59 slots, the others 32, so at most 246 "
    "experts are resident and lru stalls 30.8 ms per token; shard_layer gives each GPU 5 or "
    "6 layers, 40 to 48 keys, so every expert fits (256 resident, host_link_gb_per_token "
    "0.63 = each expert once) and it runs at its floor. The oracle, with few misses, gains "
    "more from shard_expert's concurrency (25.6 against 37.4 ms).",
    "replicate_hot against shard_expert on Mixtral-8x7B: level at 2 GPUs (lru 412 against "
    "406 ms), slower at 4 and 6 (99 against 73, 59.5 against 54.7 ms). Its 15 hot keys (a "
    "quarter of one GPU's 59 slots) run on the request's home GPU, which changes with each "
    "request at batch 1, so each home copies the hot experts it runs (0.40 peer fetches per "
    "token at 6 GPUs) and the replicas take the shard's slots (298 experts resident against "
    "246; host_link_gb_per_token 1.84 against 1.69); the all-to-all it saves is small "
    "(0.0051 against 0.0055 GB per token).",
    "replicate_hot on DeepSeek-V2-Lite adds host-link bytes with the GPU count (0.20, 0.24, "
    "0.28 GB per token at 2, 4, 6): a GPU copies a hot expert from its bridged partner only; "
    "one that a GPU of another pair holds comes from the host (through host memory it would "
    "cost more). On a peer link that joins every pair of GPUs more GPUs never add host-link "
    "bytes under replicate_hot (tests/runner/test_gpus_runs.py, pcie4_p2p, seeds 0-2).",
    "No claim is judged: these settings have no published value. Scaled down: 6 requests "
    "of prompt 128 and 24 output tokens per cell, 30 calibration requests, 3 seeds.",
)


def figure(tab, runs):
    """Top: TPOT against the GPU count, one panel per model; bottom: host-link GB per token.
    Colour: the system; line style: the placement (every line starts at its one-GPU run)."""
    from matplotlib.lines import Line2D

    fig, ax = new_figure(TITLE, runs.iloc[0]["routing"], width=12.0, height=8.0)
    fig.delaxes(ax)
    fig.suptitle(TITLE, fontsize=10)
    models = [m for m in MODELS if m in set(tab["model"])]
    axes = fig.subplots(2, max(len(models), 1), squeeze=False)
    colour = dict(zip(SYSTEMS, ("tab:blue", "tab:orange", "tab:green", "tab:gray")))
    style = dict(zip(PLACEMENTS, ("-", "--", ":")))
    for j, model in enumerate(models):
        sub = tab[tab["model"] == model]
        for (top, col, label) in ((True, "tpot_mean_ms", "TPOT mean (ms, simulated, log)"),
                                  (False, "host_link_gb_per_token", "host-link GB per token")):
            a = axes[0 if top else 1][j]
            _lines(a, sub, col, colour, style, errors=top)
            a.set_ylabel(label)
            a.set_xticks(GPU_COUNTS)
            a.set_xlabel("GPUs (RTX 3090, NVLink-bridged pairs)")
            if top:
                a.set_yscale("log")
                a.set_title(model, fontsize=9)
    handles = ([Line2D([], [], color=c, label=s) for s, c in colour.items()]
               + [Line2D([], [], color="0.3", ls=ls, label=p) for p, ls in style.items()])
    axes[0][0].legend(handles=handles, fontsize=7)
    return fig


def _lines(ax, sub, col: str, colour: dict, style: dict, errors: bool) -> None:
    """A line per (placement, system) over the GPU counts, from the system's one-GPU run."""
    one = sub[sub["placement"] == ONE_GPU].set_index("system")
    for (placement, system), g in sub[sub["placement"] != ONE_GPU].groupby(
            ["placement", "system"]):
        g = g.sort_values("num_gpus")
        xs, ys = list(g["num_gpus"]), list(g[col])
        es = list(g["tpot_ci95_ms"].fillna(0)) if errors else None
        if system in one.index:
            xs, ys = [1, *xs], [one.loc[system, col], *ys]
            es = [one["tpot_ci95_ms"].fillna(0).get(system), *es] if errors else None
        ax.errorbar(xs, ys, yerr=es, color=colour.get(system, "k"), ls=style.get(placement, "-"),
                    marker="o", ms=3, capsize=2)


def claims(tab, runs, real):
    """No published claim: the GPU counts are this suite's own study."""
    return []


EXPERIMENT = Experiment(
    name="gpus", title=TITLE,
    mirrors="no paper's table: fMoE's six-RTX-3090 testbed with every GPU holding experts "
            "(harness/sim/gpus.py)",
    sweeps=_sweeps(), table=table, figure=figure, claims=claims, seeds=SEEDS,
    cannot_express=("tensor- or pipeline-parallel dense layers (the dense part is replicated "
                    "on every GPU); a host link or host memory shared by several GPUs; GPUs "
                    "contending for a shared port in time order (they are stepped in id order "
                    "within a layer); pinning a peer copy's source; batches that keep every "
                    "GPU's dense part busy",),
    notes=())
