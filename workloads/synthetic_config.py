"""The knobs of the synthetic routing source (workloads/synthetic.py, which describes the
score model they set), checked as the user writes them (workloads/workload_checks.py).
Request-level inputs (arrivals, prompts) are planned by workloads/requests.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workloads.presets import resolve
from workloads.synthetic_route import SCORE_OFFSET
from workloads.tasks import PAPER_TASK_COUNTS
from workloads.token_latent import latent_bound
from workloads.workload_checks import WorkloadError, check_fields


@dataclass
class SyntheticConfig:
    """All knobs of the synthetic routing source (recorded in trace meta['generator'])."""

    seed: int = 0
    num_requests: int = 290  # one request per task of the default mix
    prompt_len: int = 512  # tokens per prompt (all requests)
    output_len: int = 32  # generated tokens per request = steps (step 0 is the prefill)
    # (dataset slug, number of tasks); default: MoE-Infinity's BIG-bench/FLAN/MMLU mix
    tasks: list = field(default_factory=lambda: [list(t) for t in PAPER_TASK_COUNTS])
    split: str = "measure"  # "measure" / "calibration": same tasks, different requests
    arrival_ms: float = 0.0  # request i arrives at i * arrival_ms; 0 = static batch
    # "fixed": every request prompt_len / output_len; "fitted": drawn per request from
    # length_source's real length distribution scaled to those means (workloads/lengths.py)
    lengths: str = "fixed"
    length_source: str = "azure_conv"  # azure_conv | azure_code | sharegpt
    # Score knobs (units of token_noise_std). None: the model's preset
    # (workloads/presets/<model>.yaml), else the DeepSeek-V2-Lite-fitted default
    # (workloads/presets.py DEFAULTS); an explicit value wins. Fitted to real DeepSeek-V2-Lite
    # prefill routing at matched prompt length (96-160 tokens;
    # tests/workloads/test_synthetic.py prints the comparison). Real values: reuse 0.27, 0.21,
    # 0.18, 0.16 at lags 1, 2, 4, 8; within a prompt: entropy 5.57 of 6 bits, top expert 0.066
    # of a layer's routings, 97% of experts used (36-token prompts: 5.21 bits, 0.084, 75%); all
    # prompts: busiest expert 1.77x mean; activation-matrix cosine 0.68 for adjacent prompts
    # (same conversation) vs 0.61 random.
    # Per-model presets (moebench fit-routing, analysis/fit_routing.py) fit the task, group
    # and dataset structure and the decode statistics to each model's targets
    # (analysis/routing_targets/<model>.yaml).
    layer_pref_std: float | None = None  # model-wide popularity: aggregate busiest/mean 1.7
    task_pref_std: float | None = None  # same-task activation cosine above other pairs
    request_pref_std: float | None = None  # within-prompt entropy, top share, share used
    sticky_std: float | None = None  # slow reuse excess over the preference baseline
    stickiness: float | None = None  # AR(1) coefficient per token: decay of reuse with lag
    token_noise_std: float | None = None  # fresh per-token noise, the score unit
    # Task structure (workloads/structure.py): a dataset term, and G activation groups per
    # dataset with shares r**g (r = group_decay) whose tasks follow a seeded Markov chain
    # (P(keep the previous task's group) = group_stay).
    dataset_pref_std: float | None = None
    group_pref_std: float | None = None
    groups_per_dataset: int | None = None
    group_decay: float | None = None
    group_stay: float | None = None
    # Token latent (workloads/token_latent.py): std of a per-token low-rank term shared by
    # the token's layers; 0 = off (nothing drawn).
    token_latent_std: float | None = None
    # Noise (std, nats) on the next-layer guess scores (workloads/spec_guess.py). 0: the best
    # this past-only guess does, recall 0.545 at Table 1's setting; cross-layer gate-based
    # guesses on DeepSeek-V2-Lite reach ~0.78 (arXiv 2511.10676; docs/routing.md), out of
    # its reach.
    spec_noise_nats: float = 0.0
    # Per-token coupling of adjacent layers: share of n copied from the previous layer (in
    # steps of 1/256). Set by cross-layer precision (docs/routing.md): guessing layer l+1's
    # experts from layer l's through transitions fitted on other prompts, DeepSeek-V2-Lite-
    # shaped at matched lengths: 0.460 vs 0.469 real (popularity 0.135, random 0.094; 0 here
    # gives 0.136). The statistics above do not move (n stays i.i.d. uniform per layer). The
    # one real Mixtral prompt shows a weaker link (docs/routing.md); no per-shape value.
    cross_layer_corr: float = 0.95
    embed_dim: int = 384  # as all-MiniLM-L6-v2
    # Request noise norm vs the unit task centroid (mixed with dataset and group centroids,
    # workloads/structure.py). Set by prompt/routing coupling on the real DeepSeek-V2-Lite
    # sample's fit split (prompt ids 1-400, MiniLM embeddings: Pearson r 0.346 between
    # prompt-embedding and activation cosine, 5 % most similar prompt pairs 0.107 above all
    # pairs; docs/routing.md): at 1 / 2 / 3 / 4 the synthetic set gives r 0.71 / 0.56 / 0.36 /
    # 0.23 and excess 0.16 / 0.14 / 0.098 / 0.056, so 3.0
    embed_noise: float = 3.0
    # Request-level inputs (workloads/requests.py, docs/serving.md); None keeps the fields above.
    arrivals: dict | None = None  # arrival process or Azure trace replay (workloads/arrivals.py)
    prompts: dict | None = None  # tasks, texts and embeddings from a real dataset

    def pref_clip(self) -> float:
        """Bound of a request's summed preference: 6 sigma of each term (resolved cfg)."""
        return 6 * (self.layer_pref_std + self.task_pref_std + self.request_pref_std
                    + self.dataset_pref_std + self.group_pref_std)

    def score_bound(self) -> float:
        """Largest |score| the bounded noise allows: preferences clipped at 6 sigma, X clipped
        at 6 sigma every 32 tokens, uniform noise within +-sqrt(3) (resolved cfg)."""
        rho, a, u = self.stickiness, self.sticky_std, math.sqrt(3)
        innov = a * math.sqrt(1 - rho * rho) * u
        x_max = max(6 * a, 6 * a * rho**31 + innov * (1 - rho**31) / (1 - rho))
        return (self.pref_clip() + x_max + u * self.token_noise_std
                + latent_bound(self.token_latent_std))

    def check(self) -> None:
        """Every field strictly (workloads/workload_checks.py), then the score bound; the
        messages start with the key as the user writes it, `workload.<field>`. Unset score
        knobs are checked at their defaults; generate_trace checks the model's values."""
        cfg = resolve(self, None)[0]
        check_fields(cfg)
        if cfg.score_bound() > SCORE_OFFSET - 1:  # keeps offset scores positive
            raise WorkloadError(f"workload.*_std: |score| can reach {cfg.score_bound():.1f}; "
                                f"the *_std knobs must keep it below {SCORE_OFFSET - 1}")
