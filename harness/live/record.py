"""`moebench record`: run an HF MoE model on workload prompts and write a routing trace v1.

Per request, step (0 = prefill, then one greedy decode token per step) and MoE layer it
records each token's top-k ids and weights, the step-mean router probabilities, the
speculative guess for the next MoE layer (the next layer's router applied to this layer's
router input) and the prompt embedding (docs/recording.md).

Models: `checkpoint=<dir or hub id>` loads with `from_pretrained`, safetensors only,
`trust_remote_code` off unless asked. Without a checkpoint the model is a random-weight one,
built by harness.live.hf_arch.scaled_config from a conf/model spec (per-layer shapes of the real
model; only depth and vocabulary shrink), or `model=tiny:<model_type>` (hf_arch.tiny_config).
Random-weight routing is DEGENERATE (no learned expert choice) and is labelled
`routing_source = "recorded:random-weights"`: mechanics only, never a default.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import yaml

from core.paths import CONF_DIR
from core.trace import Trace, write_trace
from harness.live.record_routing import RoutingTap, assemble, reuse_lag1, run_request

RANDOM_SOURCE = "recorded:random-weights"
DEGENERATE_NOTE = ("DEGENERATE routing, recorded from a random-weight model: no learned expert "
                   "choice, so hit rates and stalls measured on it say nothing about real "
                   "models; for testing the mechanics only")
# Share of a token's top-k experts also used by the previous prompt token, same layer
# (prefill). DeepSeek-V2-Lite: ../shared/data/SOURCES.md; Mixtral-8x7B: measured on
# routing_mixtral_sample/routing_raw.jsonl (4,053 consecutive pairs; 0.36 on the other file).
REAL_REUSE_LAG1 = {"deepseek_v2": 0.26, "mixtral": 0.39}
# Written for this project as a labelled stand-in when no dataset is given (not a benchmark).
BUILTIN_PROMPTS = (
    ("qa", "What is the capital of France, and which river runs through it?"),
    ("math", "A train travels 180 km in 2 hours. What is its average speed in km per hour?"),
    ("code", "Write a Python function that returns the n-th Fibonacci number iteratively."),
    ("summary", "Summarise in one sentence: caches keep recently used items close at hand so "
                "that repeated requests are served quickly."),
    ("translation", "Translate into German: The weather is nice today."),
    ("reasoning", "If all roses are flowers and some flowers fade quickly, do some roses fade "
                  "quickly? Explain."),
    ("chat", "Suggest three names for a small bakery near the sea."),
    ("science", "Why is the sky blue during the day and red at sunset?"),
)


@dataclass
class RecordConfig:
    model: str = "deepseek_v2_lite"  # conf/model spec name, or tiny:<HF model_type>
    checkpoint: str | None = None  # local dir or hub id; None = random weights
    trust_remote_code: bool = False
    workload: str = "builtin"  # dataset name for workloads.datasets.load_prompts, or builtin
    data_path: str | None = None  # dataset file or folder (load_prompts path=)
    num_prompts: int = 8
    max_prompt_tokens: int = 64  # longer prompts are truncated (recorded in meta)
    output_len: int = 8  # steps per request: the prefill plus output_len - 1 decode tokens
    moe_layers: int | None = 2  # random-weight spec models: MoE layers kept (None = all)
    dtype: str = "float32"
    seed: int = 0
    threads: int = 1  # torch.set_num_threads: same threads -> same floating-point results
    embed: bool = True
    out: str | None = None


def load_model(cfg: RecordConfig):
    """(model in eval mode, model label, routing source, own tokenizer or None, notes)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from harness.live import hf_arch

    dtype = getattr(torch, cfg.dtype)
    if cfg.checkpoint:
        return _load_checkpoint(cfg, dtype)
    torch.manual_seed(cfg.seed)
    if cfg.model.startswith("tiny:"):
        hf_cfg, label = hf_arch.tiny_config(cfg.model[5:]), cfg.model
        notes = {"scaling": "hf_arch.tiny_config (a few small layers)"}
    else:
        from core.specs import model_spec_from_dict

        path = CONF_DIR / "model" / f"{cfg.model}.yaml"
        if not path.exists():
            raise SystemExit(f"moebench record: no model spec {path}")
        spec = model_spec_from_dict(yaml.safe_load(path.read_text()), where=path.name)
        hf_cfg = hf_arch.scaled_config(spec, num_moe_layers=cfg.moe_layers, vocab_size=32768)
        label = cfg.model
        notes = {"scaling": "hf_arch.scaled_config: per-layer shapes of the real model; "
                            f"first {cfg.moe_layers or 'all'} MoE layers; vocabulary 32768"}
    enc_dec = bool(getattr(hf_cfg, "is_encoder_decoder", False))
    auto = AutoModelForSeq2SeqLM if enc_dec else AutoModelForCausalLM
    model = auto.from_config(hf_cfg, dtype=dtype)
    return model.eval(), label, RANDOM_SOURCE, None, notes


def _load_checkpoint(cfg: RecordConfig, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    local = Path(cfg.checkpoint).is_dir()
    # Fail fast instead of waiting on retries: with the hub unreachable, only its local
    # cache is searched.
    offline = not local and not _hub_reachable()
    kw = {"trust_remote_code": cfg.trust_remote_code, "local_files_only": local or offline}
    try:
        hf_cfg = AutoConfig.from_pretrained(cfg.checkpoint, **kw)
        enc_dec = bool(getattr(hf_cfg, "is_encoder_decoder", False))
        auto = AutoModelForSeq2SeqLM if enc_dec else AutoModelForCausalLM
        model = auto.from_pretrained(cfg.checkpoint, use_safetensors=True, dtype=dtype, **kw)
    except (OSError, ValueError) as exc:  # ValueError: not a valid hub repository id
        where = "local folder" if local else (
            "Hugging Face hub id; the hub is unreachable, so only the local cache was searched"
            if offline else "Hugging Face hub id")
        raise SystemExit(f"moebench record: cannot load checkpoint {cfg.checkpoint!r} "
                         f"({where}): {exc}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.checkpoint, **kw)
    except (OSError, ValueError):
        tokenizer = None
    return (model.eval(), cfg.checkpoint, f"recorded:{cfg.checkpoint}", tokenizer,
            {"scaling": "none (checkpoint weights)"})


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def load_texts(cfg: RecordConfig) -> tuple[list[dict], dict]:
    """Prompts as dicts (id, dataset, task, text) and their provenance."""
    if cfg.workload == "builtin":
        picked = [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(cfg.num_prompts)]
        rows = [{"id": f"builtin/{i}", "dataset": "builtin-demo", "task": task, "text": text}
                for i, (task, text) in enumerate(picked)]
        return rows, {"source": "harness/live/record.py BUILTIN_PROMPTS (demo prompts written for "
                                "this project; not a dataset)"}
    from workloads.datasets import load_prompts

    try:
        pset = load_prompts(cfg.workload, path=cfg.data_path, num=cfg.num_prompts, seed=cfg.seed)
    except (ValueError, RuntimeError) as exc:  # DataError, SourceUnavailable, bad arguments
        raise SystemExit(f"moebench record: workload={cfg.workload}: {exc}") from exc
    rows = [{"id": p.id, "dataset": p.dataset, "task": p.task, "text": p.text}
            for p in pset.prompts]
    return rows, dict(pset.provenance) if isinstance(pset.provenance, dict) else {
        "source": str(pset.provenance)}


def token_ids(texts: list[str], tokenizer, vocab_size: int, limit: int) -> tuple[list, dict]:
    """Per text: token ids (at most `limit`), and which tokenizer made them."""
    if tokenizer is not None:
        ids = [tokenizer(t)["input_ids"][:limit] for t in texts]
        return ids, {"tokenizer": getattr(tokenizer, "name_or_path", "checkpoint"),
                     "tokenizer_kind": "checkpoint"}
    from workloads.tokenize import get_tokenizer

    tok = get_tokenizer()  # the offline MiniLM WordPiece fallback, padding/truncation off
    ids = [[i % vocab_size for i in seq[:limit]] for seq in tok.ids(texts)]
    return ids, {"tokenizer": tok.name, "tokenizer_kind":
                 f"fallback (model has no tokenizer): ids modulo vocab {vocab_size}"}


def record(cfg: RecordConfig) -> dict:
    """Run the model over the prompts, write the trace; returns a summary dict."""
    import torch
    import transformers

    from harness.live.hf_arch import UnsupportedArchitecture, arch_of, moe_blocks

    torch.set_num_threads(cfg.threads)
    if cfg.output_len < 1 or cfg.max_prompt_tokens < 1 or cfg.num_prompts < 1:
        raise SystemExit("moebench record: output_len, max_prompt_tokens and num_prompts "
                         "must be >= 1")
    if cfg.dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"moebench record: dtype must be float32, bfloat16 or float16, "
                         f"got {cfg.dtype!r}")
    t0 = time.perf_counter()
    try:
        model, label, source, tokenizer, notes = load_model(cfg)
        blocks = moe_blocks(model)
    except UnsupportedArchitecture as exc:
        raise SystemExit(f"moebench record: {exc}") from exc
    prompts, provenance = load_texts(cfg)
    ids, tok_info = token_ids([p["text"] for p in prompts], tokenizer,
                              int(model.config.vocab_size), cfg.max_prompt_tokens)
    keep = [i for i, seq in enumerate(ids) if seq]  # a prompt with no tokens cannot be run
    prompts, ids = [prompts[i] for i in keep], [ids[i] for i in keep]
    if not ids:
        raise SystemExit(f"moebench record: workload={cfg.workload}: no prompt has any token")
    tap = RoutingTap(blocks)
    try:
        routing = [run_request(model, tap, seq, cfg.output_len) for seq in ids]
    finally:
        tap.close()
    random_weights = source == RANDOM_SOURCE
    meta = {
        "num_moe_layers": len(blocks), "num_experts": blocks[0].num_experts,
        "top_k": blocks[0].top_k, "moe_layer_stacks": [b.stack for b in blocks],
        "model": label, "hf_model_type": arch_of(model).model_type, "synthetic": False,
        "routing_source": source, "routing_degenerate": random_weights,
        "recorder": {**notes, **tok_info, "dtype": cfg.dtype, "seed": cfg.seed,
                     "threads": cfg.threads, "max_prompt_tokens": cfg.max_prompt_tokens,
                     "output_len": cfg.output_len, "decoding": "greedy, EOS ignored",
                     "trust_remote_code": cfg.trust_remote_code, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "prompt_source": {"workload": cfg.workload, **provenance},
    }
    if random_weights:
        meta["routing_note"] = DEGENERATE_NOTE
    tr = assemble(meta, prompts, [len(s) for s in ids], routing, blocks[0].num_experts,
                  blocks[0].top_k)
    tr.meta["reuse_lag1"] = round(reuse_lag1(tr), 4)
    tr.meta["reuse_lag1_decode"] = round(reuse_lag1(tr, "decode"), 4)
    embed_note = _add_embeddings(tr, prompts) if cfg.embed else "not asked (embed=false)"
    out = Path(cfg.out or Path.cwd() / "results" / "traces" / _default_name(cfg, source))
    out.parent.mkdir(parents=True, exist_ok=True)
    sha = write_trace(tr, out)
    return {"path": out, "sha256": sha, "bytes": out.stat().st_size, "trace": tr,
            "embeddings": embed_note, "wall_s": time.perf_counter() - t0}


def _add_embeddings(tr: Trace, prompts: list[dict]) -> str:
    from workloads.embed import EmbedderUnavailable, load_embedder

    try:
        embedder = load_embedder()
    except EmbedderUnavailable as exc:
        return f"absent ({exc})"
    tr.embeddings = embedder.embed([p["text"] for p in prompts]).astype(np.float16)
    tr.has_embedding = np.ones(tr.num_requests, dtype=bool)
    tr.meta["embedder"] = embedder.name
    return embedder.name


def _default_name(cfg: RecordConfig, source: str) -> str:
    who = cfg.model.replace(":", "-") if source == RANDOM_SOURCE else Path(
        cfg.checkpoint.rstrip("/")).name
    tag = "random-weights" if source == RANDOM_SOURCE else "recorded"
    return f"{who}.{cfg.workload}.{tag}.trace.npz"


def parse_args(argv: list[str]) -> RecordConfig:
    """key=value pairs naming RecordConfig fields (`model=deepseek_v2_lite workload=mmlu`)."""
    types = {f.name: f.type for f in fields(RecordConfig)}
    values: dict = {}
    for item in argv:
        key, sep, raw = item.partition("=")
        if not sep or key not in types:
            raise SystemExit(f"moebench record: expected key=value with key in "
                             f"{sorted(types)}, got {item!r}")
        kind = types[key]
        if raw.lower() in ("null", "none") and "None" in kind:
            values[key] = None
        elif kind == "bool":
            if raw.lower() not in ("true", "false"):
                raise SystemExit(f"moebench record: {key} must be true or false, got {raw!r}")
            values[key] = raw.lower() == "true"
        elif kind.startswith("int"):
            try:
                values[key] = int(raw)
            except ValueError:
                raise SystemExit(f"moebench record: {key} must be an integer, "
                                 f"got {raw!r}") from None
        else:
            values[key] = raw
    return RecordConfig(**values)


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    cfg = parse_args(argv)
    res = record(cfg)
    tr = res["trace"]
    real = REAL_REUSE_LAG1.get(tr.meta["hf_model_type"])
    n = int(tr.block_offsets[-1])
    print(f"moebench record: {tr.meta['model']} ({tr.routing_source}), {tr.num_requests} "
          f"requests, {tr.num_layers} MoE layers, E={tr.num_experts}, k={tr.top_k}, "
          f"{n} token-layer decisions")
    if tr.meta["routing_degenerate"]:
        print(f"WARNING: {DEGENERATE_NOTE}", file=sys.stderr)
    ref = f"; real {tr.meta['hf_model_type']} prefill sample {real}" if real is not None else ""
    print(f"lag-1 expert reuse: prefill {tr.meta['reuse_lag1']:.3f}, decode "
          f"{tr.meta['reuse_lag1_decode']:.3f} (uniform random {tr.top_k / tr.num_experts:.3f}"
          f"{ref})")
    print(f"tokenizer: {tr.meta['recorder']['tokenizer']} "
          f"({tr.meta['recorder']['tokenizer_kind']}); embeddings: {res['embeddings']}")
    print(f"wrote {res['path']} ({res['bytes']:,} bytes, {res['bytes'] / max(n, 1):.1f} B per "
          f"decision, sha256 {res['sha256'][:16]}) in {res['wall_s']:.1f} s")
    return 0
