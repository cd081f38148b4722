"""DeepSpeed ZeRO-Inference reference: a real, external baseline row (measured, not simulated).

The same Hugging Face model the recorder runs (harness.live.record.load_model: a checkpoint, a
spec-shaped random-weight model or tiny:<model_type>) is wrapped by `deepspeed.initialize`
with ZeRO stage 3 and `offload_param` to CPU memory, then decoded greedily on the workload
prompts; every decode step is timed (TPOT). Optional extra `[deepspeed]`, never installed by
`make test`. Meant for GPUs: on a CPU DeepSpeed runs, but the parameters it "offloads" already
sit in host memory, so the row measures DeepSpeed's overhead, not offloading (it says so).

  python -m harness.live.deepspeed_ref model=tiny:mixtral output_len=8 num_prompts=2
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from core.atomic import write_json
from harness.live.record import RecordConfig, load_model, load_texts, parse_args, token_ids

INSTALL_HINT = "pip install 'moe-offload-bench[deepspeed]' (meant for GPU machines)"
SYSTEM_NAME = "deepspeed_zero_inference"
CPU_NOTE = ("CPU run: ZeRO-3 parameter offload to CPU is a no-op here (the parameters are "
            "already in host memory); the figure is DeepSpeed's per-step overhead, not an "
            "offloading baseline. Run on a GPU for the reference row.")


class DeepSpeedUnavailable(ImportError):
    """The optional `deepspeed` package is not installed."""


def import_deepspeed():
    try:
        import deepspeed
    except ImportError as exc:
        raise DeepSpeedUnavailable(f"deepspeed is not installed ({exc}); {INSTALL_HINT}") from exc
    return deepspeed


def zero_inference_config(dtype: str, pin_memory: bool) -> dict:
    """ZeRO stage 3, parameters offloaded to CPU (DeepSpeed's ZeRO-Inference recipe)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "fp16": {"enabled": dtype == "float16"},
        "bf16": {"enabled": dtype == "bfloat16"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": pin_memory},
            "stage3_param_persistence_threshold": 0,  # every layer's weights go through offload
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _single_process_env() -> None:
    """torch.distributed rendezvous for one local process (deepspeed.initialize needs one)."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_reference(cfg: RecordConfig) -> dict:
    """Decode cfg's prompts under ZeRO-Inference; returns the result row (not written)."""
    deepspeed = import_deepspeed()
    import torch
    import transformers

    torch.set_num_threads(cfg.threads)
    _single_process_env()
    cuda = torch.cuda.is_available()
    model, label, source, tokenizer, _ = load_model(cfg)
    ds_cfg = zero_inference_config(cfg.dtype if cuda else "float32", pin_memory=cuda)
    engine, *_ = deepspeed.initialize(model=model, config=ds_cfg)
    module = engine.module.eval()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    prompts, provenance = load_texts(cfg)
    ids, tok_info = token_ids([p["text"] for p in prompts], tokenizer,
                              int(model.config.vocab_size), cfg.max_prompt_tokens)
    ttft_ms, tpot_ms = [], []
    with torch.no_grad():
        for seq in (s for s in ids if s):
            x = torch.tensor([seq], device=device)
            sync()
            t0 = time.perf_counter()
            out = module(input_ids=x, use_cache=True)
            sync()
            ttft_ms.append((time.perf_counter() - t0) * 1e3)
            for _ in range(cfg.output_len - 1):  # greedy, EOS ignored (as the recorder)
                tok = out["logits"][:, -1].argmax(-1, keepdim=True)
                cache = out["cache"] if "cache" in out else out["past_key_values"]
                t0 = time.perf_counter()
                out = module(input_ids=tok, cache=cache, use_cache=True)
                sync()
                tpot_ms.append((time.perf_counter() - t0) * 1e3)
    row = {
        "system": {"name": SYSTEM_NAME, "external_reference": True},
        "status": "valid" if tpot_ms else "failed",
        "measured": True, "simulated": False,
        "model": {"name": label, "weights": source},
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "offload": {"zero_stage": 3, "offload_param": "cpu", "pin_memory": cuda},
        "deepspeed_config": ds_cfg,
        "workload": {"workload": cfg.workload, **provenance, **tok_info,
                     "num_requests": len(ttft_ms), "output_len": cfg.output_len,
                     "prompt_len_mean": statistics.fmean(len(s) for s in ids if s)},
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "threads": cfg.threads,
        "metrics": {"ttft_ms": {"mean": statistics.fmean(ttft_ms)}} if ttft_ms else None,
        "note": None if cuda else CPU_NOTE,
    }
    if tpot_ms:
        row["metrics"]["tpot_ms"] = {"mean": statistics.fmean(tpot_ms),
                                     "p50": _pct(tpot_ms, 0.5), "p99": _pct(tpot_ms, 0.99),
                                     "count": len(tpot_ms)}
    else:
        row["reason"] = "output_len 1: no decode steps to time"
    return row


def write_row(row: dict, out_dir: str | os.PathLike | None = None) -> Path:
    """results/deepspeed_ref/<model>/result.json, written atomically."""
    slug = row["model"]["name"].replace("/", "_").replace(":", "-")
    folder = Path(out_dir) if out_dir else Path.cwd() / "results" / "deepspeed_ref" / slug
    return write_json(folder / "result.json", row)


def main(argv: list[str]) -> int:
    """key=value pairs as `moebench record` (out= is the result folder)."""
    cfg = parse_args(argv)
    try:
        row = run_reference(cfg)
    except DeepSpeedUnavailable as exc:
        print(f"deepspeed_ref: {exc}", file=sys.stderr)
        return 2
    path = write_row(row, cfg.out)
    tpot = (row["metrics"] or {}).get("tpot_ms")
    head = f"[MEASURED, external reference] {SYSTEM_NAME} | {row['model']['name']} | "
    print(head + (f"{row['device']}: TPOT mean {tpot['mean']:.2f} ms, p99 {tpot['p99']:.2f} ms "
                  f"over {tpot['count']} decode steps" if tpot else row["status"]))
    if row["note"]:
        print(f"note: {row['note']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
