"""`moebench validate`: the same trace through SimBackend (with a hardware profile, e.g. one
written by `moebench calibrate`) and through TorchBackend on a random-weight model of the
spec's shape with the trace's routing replayed; prints per-token TPOT and per-token stall
errors (mean absolute percentage, real as reference). Docs: docs/real-backend.md.

Routing is synthetic (workloads/synthetic.py) and replayed into the routers, so the model's
outputs are meaningless; only timing is compared. On CPU this checks the mechanics only (a
host copy stands in for the link).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from core.atomic import write_json
from core.paths import CONF_DIR
from core.specs import hardware_spec_from_dict, model_spec_from_dict
from harness.runner.assembly import assemble, build_engine, build_system, load_routing
from harness.runner.config import compose_config
from harness.runner.run_types import Run
from harness.sim.backend_sim import SimBackend


def reduced_spec(data: dict, num_moe_layers: int | None, bits: float, scale: float,
                 vocab_size: int | None = None):
    """The model spec the real model is built from: the first num_moe_layers MoE layers
    (hf_arch.scaled_config's rule), widths times `scale`, weights of `bits` bits."""
    d = dict(data)
    if num_moe_layers is not None:
        d["num_layers"] = d["moe_first_layer"] + (num_moe_layers - 1) * d["moe_every"] + 1
    d["expert_bits"] = d["dense_bits"] = bits
    if vocab_size:
        d["vocab_size"] = vocab_size
    if scale != 1.0:
        for k in ("hidden_size", "expert_ffn_size", "shared_expert_ffn_size", "dense_ffn_size"):
            if d.get(k):
                d[k] = max(8, int(round(d[k] * scale / 8)) * 8)
    return model_spec_from_dict(d, where=f"{d['name']} (validate)")


def build_model(spec, device: str, dtype, scale: float):
    """Random-weight HF model of the spec; routed experts filled with a constant on the host
    (their values do not matter under replayed routing), the rest initialised normally."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.live.hf_arch import scaled_config

    cfg = scaled_config(spec)
    if scale != 1.0:  # shrink the attention with the widths (CPU mechanics runs)
        _shrink_attention(cfg, scale)
    cfg._attn_implementation = "sdpa" if device.startswith("cuda") else "eager"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model = model.to_empty(device="cpu").eval()
    _fill_weights(model, dtype)
    _rebuild_rotary(model)
    return model


def _shrink_attention(cfg, scale: float) -> None:
    for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "head_dim"):
        if getattr(cfg, k, None):
            setattr(cfg, k, max(8, int(getattr(cfg, k) * scale) // 8 * 8))


def _fill_weights(model, dtype) -> None:
    """Cheap fill: one random block of 1M values (std 0.02) tiled over each matrix; routed
    experts a constant, vectors ones, the router's correction bias zero."""
    import torch

    g = torch.Generator().manual_seed(0)
    block = (torch.randn(1 << 20, generator=g) * 0.02).to(dtype)
    for name, p in model.named_parameters():
        if ".experts." in name:
            p.data.fill_(1e-3)
        elif p.dim() >= 2:
            flat = p.data.view(-1)
            for i in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - i)
                flat[i:i + n].copy_(block[:n])
        else:
            p.data.fill_(1.0)
    for name, b in model.named_buffers():
        if "correction_bias" in name:
            b.data.zero_()


def _rebuild_rotary(model) -> None:
    """Rotary inverse frequencies are buffers computed at init: rebuild them off meta."""
    import torch

    for m in model.modules():
        if isinstance(getattr(m, "inv_freq", None), torch.Tensor) and hasattr(m, "config"):
            fresh = type(m)(m.config)
            for name in ("inv_freq", "original_inv_freq"):
                if hasattr(m, name):
                    setattr(m, name, getattr(fresh, name).clone())


def per_token(tables: dict) -> tuple[np.ndarray, np.ndarray]:
    """Decode TPOT per token (ms) and stall per token (ms), in (request, token) order."""
    tok, acc = tables["tokens"], tables["accesses"]
    order = np.lexsort((tok["token_index"], tok["request"]))
    req, idx = tok["request"][order], tok["token_index"][order]
    t_end, t_start = tok["time_ms"][order], tok["iteration_start_ms"][order]
    decode = idx > 0
    tpot = (t_end - t_start)[decode]
    stall = np.zeros(len(order))
    pos = {(int(r), int(i)): n for n, (r, i) in enumerate(zip(req, idx))}
    for r, s, st in zip(acc["request"], acc["step"], acc["stall_ms"]):
        stall[pos[(int(r), int(s))]] += st
    return tpot, stall[decode]


def mape(sim: np.ndarray, real: np.ndarray, floor: float) -> float | None:
    keep = real > floor
    if not keep.any():
        return None
    return float(np.mean(np.abs(sim[keep] - real[keep]) / real[keep]) * 100)


def _arguments(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="moebench validate")
    ap.add_argument("--model", default="deepseek_v2_lite", help="conf/model name")
    ap.add_argument("--hardware", required=True, help="hardware profile yaml (calibrate)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--num-moe-layers", type=int, default=None)
    ap.add_argument("--scale", type=float, default=1.0, help="width scale (CPU mechanics)")
    ap.add_argument("--vocab-size", type=int, default=None, help="smaller vocabulary")
    ap.add_argument("--budget-gb", type=float, default=None, help="overrides gpu_mem_gb")
    ap.add_argument("--cache-fraction", type=float, default=None,
                    help="cache this fraction of the experts instead of the budget's plan")
    ap.add_argument("--system", default="lru")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="write validate.json here")
    return ap.parse_args(argv)


def _assemble(args: argparse.Namespace, bits: int) -> tuple[Run, int]:
    """The run both backends replay (the reduced spec on the profile's hardware, batch 1, every
    trace field: the live model replays the routing) and its expert-cache slots."""
    hw_data = yaml.safe_load(Path(args.hardware).read_text())
    if args.budget_gb is not None:
        hw_data["gpu_mem_gb"] = args.budget_gb
    hw = hardware_spec_from_dict(hw_data, where=args.hardware)
    spec_data = yaml.safe_load((CONF_DIR / "model" / f"{args.model}.yaml").read_text())
    spec = reduced_spec(spec_data, args.num_moe_layers, bits, args.scale, args.vocab_size)
    cfg = compose_config([f"model={args.model}", f"workload.num_requests={args.requests}",
                          f"workload.prompt_len={args.prompt_len}",
                          f"workload.output_len={args.output_len}", f"system={args.system}",
                          "progress=false", "max_batch=1"])
    run = assemble(cfg, model=spec, hw=hw, all_fields=True)
    slots = min(run.plan.expert_cache_bytes // spec.expert_bytes,
                spec.num_moe_layers * spec.num_experts)
    if args.cache_fraction is not None:
        slots = int(args.cache_fraction * spec.num_moe_layers * spec.num_experts)
    if slots < 1:
        raise SystemExit(f"moebench validate: budget leaves no room for an expert ({run.plan})")
    # the slots, not the plan, size the cache (--cache-fraction may set them)
    plan = replace(run.plan, expert_cache_bytes=int(slots) * spec.expert_bytes)
    return replace(run, plan=plan, calibration=_calibration(run)), int(slots)


def _calibration(run: Run):
    """The run's calibration trace; loaded here too when the plan found no room (assemble
    loads none then), since --cache-fraction sets the cache instead."""
    if run.calibration is not None or not run.system.needs_calibration():
        return run.calibration
    return load_routing(run.cfg, run.model, "calibration", run.cfg["calibration_requests"],
                        memo=run.memo)


def _simulated(run: Run) -> dict:
    system = build_system(run.cfg)
    engine = build_engine(run, system)
    if run.calibration is not None:
        system.warmup(run.calibration)
    return engine.run().tables()


def _live(run: Run, args: argparse.Namespace, dtype, slots: int):
    """(the live run's tables, its backend, the model's build seconds)."""
    from harness.live.driver import run_live

    t0 = time.perf_counter()
    model = build_model(run.model, args.device, dtype, args.scale)
    build_s = time.perf_counter() - t0
    vocab = run.model.vocab_size - 3
    prompts = [[(7 * r + i) % vocab + 3 for i in range(int(n))]
               for r, n in enumerate(run.trace.prompt_len)]
    res = run_live(model, run.trace, build_system(run.cfg), slots, prompts, device=args.device,
                   replay=True, copy_ms=SimBackend(run.model, run.hw).expert_copy_ms,
                   calibration=run.calibration)
    return res.rec.tables(), res.backend, build_s


def _summary(run: Run, args: argparse.Namespace, slots: int, sim: dict, real: dict, backend,
             build_s: float) -> dict:
    spec, hw = run.model, run.hw
    tp_s, st_s = per_token(sim)
    tp_r, st_r = per_token(real)
    return {
        "label": "SIMULATED vs REAL timing; SYNTHETIC routing replayed into a random-weight "
                 "model (outputs meaningless)",
        "model": spec.name, "moe_layers": spec.num_moe_layers, "dtype": args.dtype,
        "device": args.device, "hardware": hw.name, "budget_gb": hw.gpu_mem_gb,
        "system": args.system, "cache_slots": int(slots),
        "total_experts": spec.num_moe_layers * spec.num_experts,
        "requests": args.requests, "prompt_len": args.prompt_len,
        "output_len": args.output_len, "build_s": round(build_s, 2),
        "tpot_ms_sim_mean": float(tp_s.mean()), "tpot_ms_real_mean": float(tp_r.mean()),
        "tpot_mape_pct": mape(tp_s, tp_r, 0.0),
        "stall_ms_per_token_sim": float(st_s.mean()),
        "stall_ms_per_token_real": float(st_r.mean()),
        "stall_mape_pct": mape(st_s, st_r, 0.01),
        "h2d_bytes_real": backend.h2d_bytes,
    }


def _print(out: dict, run: Run, args: argparse.Namespace) -> None:
    spec, hw = run.model, run.hw
    print(f"validate: {out['label']}")
    print(f"  {spec.name} ({spec.num_moe_layers} MoE layers, {args.dtype}) on {args.device}, "
          f"profile {hw.name}, budget {hw.gpu_mem_gb} GB -> {out['cache_slots']} of "
          f"{out['total_experts']} experts cached, system {args.system}")
    print(f"  TPOT ms/token   sim {out['tpot_ms_sim_mean']:.3f}  real "
          f"{out['tpot_ms_real_mean']:.3f}  MAPE {out['tpot_mape_pct']:.1f}%")
    sm = out["stall_mape_pct"]
    print(f"  stall ms/token  sim {out['stall_ms_per_token_sim']:.3f}  real "
          f"{out['stall_ms_per_token_real']:.3f}  MAPE "
          f"{'n/a (no real stall)' if sm is None else f'{sm:.1f}%'}")


def main(argv: list[str]) -> int:
    import torch

    args = _arguments(argv)
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("moebench validate: --device cuda but torch sees no CUDA device")
    dtype = getattr(torch, args.dtype)
    run, slots = _assemble(args, 16 if dtype == torch.bfloat16 else 32)
    sim = _simulated(run)
    real, backend, build_s = _live(run, args, dtype, slots)
    out = _summary(run, args, slots, sim, real, backend, build_s)
    _print(out, run, args)
    if args.out:
        path = write_json(Path(args.out) / "validate.json", out)
        print(f"  wrote {path}")
    return 0
