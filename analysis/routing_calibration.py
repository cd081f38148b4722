"""Synthetic routing vs the shared real samples: the table in docs/routing.md.

`moebench characterize --calibration [--embed] [--shared-data DIR]` reads the shared routing
samples (DIR, else $MOEBENCH_SHARED_DATA, else ../shared/data beside the checkout; see
core/shared_data.py; absent: error) and writes results/characterize/calibration.md.
Both sides go through the same statistics (analysis/characterize.py) at matched shapes:
Mixtral-8x7B-shaped synthetic prompts of the real sample's 135 tokens; DeepSeek-V2-Lite-shaped
synthetic prompts whose lengths follow the real sample's (ten length deciles, each generated at
its median length). Prefill only on both sides (output_len 1), as the real samples are
prefill recordings.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import yaml

from analysis.characterize import characterize, cosine_matrix, request_sequences, semantic_coupling
from core.atomic import write_text
from core.paths import CONF_DIR
from core.shared_data import require_shared_file
from core.specs import model_spec_from_dict
from workloads.importers import read_routing
from workloads.synthetic import SyntheticConfig, generate_trace

# paths inside the shared data folder
MIXTRAL_SAMPLE = ("routing_mixtral_sample", "routing_raw.jsonl")
DEEPSEEK_SAMPLE = ("routing_deepseek_v2_lite_sample", "prefill_routing_prompts_0001_1000.jsonl.gz")
# 25 tasks: every length decile (~100 requests) holds every task about four times
CAL_TASKS = [["bigbench", 9], ["flan", 8], ["mmlu", 8]]
MIXTRAL_PROMPT_TOKENS = 135
# (key, label, papers' figure or "")
TABLE = [
    ("reuse_lag1", "consecutive-token reuse", ""),
    ("random_reuse", "  random routing (k/E)", ""),
    ("reuse_lag8", "reuse at lag 8", ""),
    ("entropy_bits", "per-layer entropy within a request (bits)", ""),
    ("top_share", "top expert share within a request", ""),
    ("used", "share of experts used in a request", ""),
    ("once", "share used exactly once", ""),
    ("repeated", "share used twice or more", ""),
    ("heavy", "share reused heavily (>= 1/3 of tokens)",
     "<0.05 for ~100-expert models; Mixtral ~0.25 [MoE-Infinity App. B]"),
    ("agg_entropy_bits", "aggregate load entropy (bits)", "near uniform [MoE-Infinity]"),
    ("agg_busiest_over_mean", "aggregate busiest / mean", ""),
    ("cos_related", "activation cosine, related requests", ""),
    ("cos_random", "activation cosine, all pairs", ""),
    ("groups", "K-means groups (best silhouette, k 2..50)",
     "10-30 [MoE-Infinity Table 2]"),
    ("transition_max", "largest group transition probability",
     "~0.3, most < 0.12 [MoE-Infinity App. B]"),
    ("freq_guess_hit", "frequency-guess accuracy", ""),
    ("xl_precision", "cross-layer precision (transition guess)", ""),
    ("xl_popularity", "  popularity guess", ""),
    ("xl_mi_bits", "cross-layer mutual information (bits)", ""),
    ("xl_mi_shuffled_bits", "  tokens shuffled within a request", ""),
]
CHECKED = ("reuse_lag1", "entropy_bits", "top_share", "used")  # the 20% targets


def model(name: str):
    return model_spec_from_dict(yaml.safe_load((CONF_DIR / "model" /
                                                f"{name}.yaml").read_text()), where=name)


def synthetic_mixtral(num_requests: int = 64, seed: int = 0) -> list[np.ndarray]:
    cfg = SyntheticConfig(seed=seed, num_requests=num_requests,
                          prompt_len=MIXTRAL_PROMPT_TOKENS, output_len=1)
    return request_sequences(generate_trace(model("mixtral_8x7b"), cfg))


def length_matched_deepseek(lengths: list[int], seed: int = 0, bins: int = 10):
    """Synthetic DeepSeek-V2-Lite prefill routing whose prompt lengths follow `lengths`:
    (sequences, task labels, embeddings float [R, 384])."""
    order = np.sort(np.asarray(lengths))
    seqs, tasks, emb = [], [], []
    for i, part in enumerate(np.array_split(order, bins)):
        # one split per decile: same tasks, independent requests
        cfg = SyntheticConfig(seed=seed, num_requests=len(part), prompt_len=int(np.median(part)),
                              output_len=1, tasks=CAL_TASKS, split=f"decile{i}")
        tr = generate_trace(model("deepseek_v2_lite"), cfg)
        seqs += request_sequences(tr)
        tasks += tr.tasks
        emb.append(tr.embeddings.astype(np.float64))
    return seqs, tasks, np.concatenate(emb)


def related_cosine(profiles: np.ndarray, labels: list[str]) -> float:
    """Mean activation cosine over pairs of requests with the same label."""
    cos = cosine_matrix(profiles)
    lab = np.array(labels)
    same = (lab[:, None] == lab[None]) & ~np.eye(len(lab), dtype=bool)
    return float(cos[same].mean())


def measure(seed: int = 0, embed: bool = False, shared_data: str | None = None) -> dict:
    """All four columns of the calibration table (needs the shared samples)."""
    if shared_data:
        mixtral, deepseek = (Path(shared_data).joinpath(*p) for p in (MIXTRAL_SAMPLE,
                                                                       DEEPSEEK_SAMPLE))
        for path in (mixtral, deepseek):
            if not path.exists():
                raise FileNotFoundError(f"{path}: shared routing sample not present "
                                        "(--shared-data)")
    else:
        mixtral, deepseek = require_shared_file(*MIXTRAL_SAMPLE), require_shared_file(
            *DEEPSEEK_SAMPLE)
    out = {}
    reqs, _ = read_routing(mixtral, duplicates="first")
    out["real_mixtral"] = characterize([r.ids for r in reqs], 8, 2, seed=seed, groups=False)
    out["synth_mixtral"] = characterize(synthetic_mixtral(seed=seed), 8, 2, seed=seed)
    reqs, _ = read_routing(deepseek)
    real = characterize([r.ids for r in reqs], 64, 6, seed=seed)
    real["cos_related"] = real["cos_adjacent"]  # adjacent prompt ids: often one conversation
    seqs, tasks, emb = length_matched_deepseek([r.ids.shape[1] for r in reqs], seed)
    synth = characterize(seqs, 64, 6, seed=seed)
    kept = synth["profile_requests"]
    synth["cos_related"] = related_cosine(synth["profiles"], [tasks[i] for i in kept])
    synth["coupling"] = semantic_coupling(synth["profiles"], emb[kept])
    if embed:
        from workloads.embed import load_embedder

        prompts = [reqs[i].prompt or "" for i in real["profile_requests"]]
        real["coupling"] = semantic_coupling(real["profiles"],
                                             load_embedder().embed(prompts))
    out["real_deepseek"], out["synth_deepseek"] = real, synth
    return out


def _cell(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _ratio(a, b) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return ""
    r = a / b
    return f"{r:.2f}" + ("" if abs(r - 1) <= 0.2 else " (!)")


def render(m: dict) -> str:
    cols = ("synth_mixtral", "real_mixtral", "synth_deepseek", "real_deepseek")
    lines = ["| statistic | synthetic Mixtral-shaped | real Mixtral sample | ratio | "
             "synthetic DeepSeek-V2-Lite-shaped | real DeepSeek-V2-Lite sample | ratio | "
             "papers |", "|---|---|---|---|---|---|---|---|"]
    for key, label, paper in TABLE:
        v = [m[c].get(key) for c in cols]
        lines.append(f"| {label} | {_cell(v[0])} | {_cell(v[1])} | {_ratio(v[0], v[1])} | "
                     f"{_cell(v[2])} | {_cell(v[3])} | {_ratio(v[2], v[3])} | {paper} |")
    for side in ("synth_deepseek", "real_deepseek"):
        c = m[side].get("coupling")
        if c:
            lines.append(f"\n{side}: prompt-embedding vs activation cosine over request pairs: "
                         f"Pearson r {c['pearson_r']:.3f}, slope {c['slope']:.3f}; 5% most "
                         f"similar prompt pairs {c['act_cos_top5pct_prompt_pairs']:.3f} vs all "
                         f"{c['act_cos_all']:.3f}.")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    t0 = time.perf_counter()
    try:
        m = measure(args.seed, args.embed, args.shared_data)
    except FileNotFoundError as exc:
        print(f"moebench characterize --calibration: error: {exc}", file=sys.stderr)
        return 2
    md = ("Synthetic routing (labelled synthetic) vs real routing samples; ratio = synthetic / "
          "real, (!) = outside 20%. Within-request statistics over prompts of >= 16 tokens.\n\n"
          + render(m))
    out = Path(args.out or Path("results") / "characterize")
    write_text(out / "calibration.md", md)
    print(md)
    print(f"wrote {out / 'calibration.md'} in {time.perf_counter() - t0:.0f} s")
    return 0
