"""`moebench calibrate`: measure this machine and write a hardware profile for the simulator.

Measured (docs/calibration.md):
  link     host-to-device copy time by transfer size (64 KiB .. 256 MiB); least-squares fit
           t = latency + bytes / bandwidth, unweighted, so the large copies set the bandwidth.
           On CUDA: pinned host tensor -> device tensor on a side stream, timed with CUDA events.
           On CPU there is no device: a host copy into a separate preallocated tensor.
  memory   device memory read bandwidth (a sum over a large buffer)       -> hbm_gbps
  dense    one MoE layer's resident part of a ModelSpec-shaped layer (norms, qkv/o projections,
           attention over a KV cache, router, shared experts), decode and prefill
  expert   one routed expert (SwiGLU or 2-matrix FFN) at 1..512 tokens     -> peak_tflops
  overhead measured time minus what SimBackend predicts from the measured bandwidth and
           FLOP rate (the framework cost the simulator adds per layer / expert / step)
  host CPU one expert on the CPU at 1..128 tokens and the DRAM read rate, fitted to
           SimBackend.cpu_expert_ms (calibrate_cpu.py)                  -> a host profile
The thread count is pinned (torch.set_num_threads) and recorded so figures are comparable;
the host CPU part runs with the threads torch would serve with (--cpu-threads), recorded too.
Output: <out>/hardware/<name>.yaml (hardware_spec_from_dict accepts it), <name>.sweep.json
beside it and host/<name>.yaml (host_spec_from_dict accepts it), all written atomically.
"""

from __future__ import annotations

import argparse
import platform
import re
import shlex
import socket
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from core.atomic import write_json, write_text
from core.paths import CONF_DIR
from core.specs import HardwareSpec, ModelSpec, hardware_spec_from_dict, model_spec_from_dict
from harness.live.calibrate_cpu import (
    Timer,
    cpu_report,
    ffn_weights,
    host_ram_gb,
    measure_host,
    run_ffn,
    write_host_profile,
)
from harness.sim.backend_sim import SimBackend

KIB, MIB = 2**10, 2**20
FULL = {"sizes": [64 * KIB * 4**i for i in range(7)], "tokens": [2**i for i in range(10)],
        "prefill": 256, "context": 512, "scale": 1.0, "budget_s": 0.4, "mem_bytes": 256 * MIB}
# --quick (tests): a quarter-width layer, copies up to 4 MiB, experts up to 64 tokens.
QUICK = {"sizes": [64 * KIB * 4**i for i in range(4)], "tokens": [1, 4, 16, 64],
         "prefill": 32, "context": 128, "scale": 0.25, "budget_s": 0.05, "mem_bytes": 16 * MIB}


def fit_link(sizes_bytes, times_ms) -> dict:
    """Least squares t = a + b * bytes: latency_us = a, gbps = 1 / b.

    Ordinary (unweighted) least squares, so the large copies, where expert-sized transfers
    live, set the bandwidth. A negative intercept (noise) is reported as `intercept_us` and
    the fit redone through the origin, so the profile's latency is never negative.
    """
    x = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(times_ms, dtype=np.float64)
    (a_ms, b_ms_per_byte), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), t,
                                                rcond=None)
    intercept_us = float(a_ms * 1e3)
    if a_ms < 0:
        a_ms, b_ms_per_byte = 0.0, float(x @ t / (x @ x))
    return {"latency_us": float(a_ms * 1e3), "h2d_gbps": float(1.0 / b_ms_per_byte / 1e6),
            "intercept_us": intercept_us}


def transfer_sweep(torch, device: str, sizes, timer: Timer) -> list[dict]:
    cuda = device.startswith("cuda")
    stream = torch.cuda.Stream() if cuda else None
    rows = []
    for nbytes in sizes:
        src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
        dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        if cuda:
            def copy(src=src, dst=dst):
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
        else:
            def copy(src=src, dst=dst):
                dst.copy_(src)
        ms = timer(copy, stream=stream)
        rows.append({"bytes": nbytes, "ms": ms, "gbps": nbytes / ms / 1e6})
        del src, dst
    return rows


def scaled_spec(spec: ModelSpec, scale: float, bits: float) -> ModelSpec:
    """Widths times `scale` (attention params times scale**2); bits of the measured dtype."""
    if scale == 1.0:
        return replace(spec, expert_bits=bits, dense_bits=bits)
    data = {f: getattr(spec, f) for f in (
        "name", "display_name", "hf_id", "architecture", "num_layers", "encoder_layers",
        "moe_first_layer", "moe_every", "num_experts", "num_shared_experts", "top_k",
        "ffn_matrices", "vocab_size", "tie_embeddings")}
    width = {f: max(1, round(getattr(spec, f) * scale)) if getattr(spec, f) else 0 for f in (
        "hidden_size", "expert_ffn_size", "shared_expert_ffn_size", "dense_ffn_size",
        "dense_residual_ffn_size", "kv_elems_per_token_per_layer")}
    width["hidden_size"] = max(128, width["hidden_size"] // 128 * 128)  # whole 128-wide heads
    data.update(width, expert_bits=bits, dense_bits=bits,
                attention_params_per_layer=round(spec.attention_params_per_layer * scale**2),
                cross_attention_params_per_layer=round(
                    spec.cross_attention_params_per_layer * scale**2))
    return model_spec_from_dict(data, where=f"{spec.name} scaled x{scale}")


def dense_layer(torch, spec: ModelSpec, device, dtype):
    """fn(x [T, H], k, v [heads, C, 128], causal) for one MoE layer's resident part.

    The qkv projection is [H, A/H - H] and the output projection [H, H], so together they hold
    attention_params_per_layer (A) weights; attention is multi-head over 128-wide heads, which is
    what SimBackend's 4 * pairs * hidden attention FLOPs assume.
    """
    h = spec.hidden_size
    qkv_w = torch.randn(h, max(h, spec.attention_params_per_layer // h - h), device=device,
                        dtype=dtype) * 0.02
    out_w = torch.randn(h, h, device=device, dtype=dtype) * 0.02
    router_w = torch.randn(h, spec.num_experts, device=device, dtype=dtype) * 0.02
    ffn_width = spec.num_shared_experts * spec.shared_expert_ffn_size + (
        spec.dense_residual_ffn_size)
    shared = (ffn_weights(torch, h, ffn_width, spec.ffn_matrices, device, dtype) if ffn_width
              else None)
    norm_w = torch.ones(h, device=device, dtype=dtype)
    heads = h // 128
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run(x, k, v, causal: bool):
        y = torch.nn.functional.rms_norm(x, (h,), norm_w)
        q = (y @ qkv_w)[:, :h].reshape(-1, heads, 128).transpose(0, 1)  # [heads, T, 128]
        att = sdpa(q, k, v, is_causal=causal).transpose(0, 1).reshape(-1, h)
        x = x + att @ out_w
        y = torch.nn.functional.rms_norm(x, (h,), norm_w)
        probs = torch.softmax(y @ router_w, dim=-1)  # [T, E]
        return x + run_ffn(torch, y, shared) if shared else x + probs[:, :1]
    return run


def measure(cfg: dict, spec: ModelSpec, device: str, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32  # bf16 matmuls are slow on most CPUs
    bits = 16 if cuda else 32
    timer = Timer(torch, device, cfg["budget_s"])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict = {"transfer": transfer_sweep(torch, device, cfg["sizes"], timer)}
    out.update(fit_link([r["bytes"] for r in out["transfer"]], [r["ms"] for r in out["transfer"]]))
    for r in out["transfer"]:
        r["fit_ms"] = out["latency_us"] / 1e3 + r["bytes"] / out["h2d_gbps"] / 1e6
    buf = torch.ones(cfg["mem_bytes"] // 4, dtype=torch.float32, device=device)
    out["hbm_gbps"] = cfg["mem_bytes"] / timer(buf.sum) / 1e6
    sim = scaled_spec(spec, cfg["scale"], bits)
    out["scaled_model"] = sim.summary() | {"hidden_size": sim.hidden_size,
                                          "expert_ffn_size": sim.expert_ffn_size}
    h, heads, ctx, pre = sim.hidden_size, sim.hidden_size // 128, cfg["context"], cfg["prefill"]
    layer = dense_layer(torch, sim, device, dtype)
    kv = [torch.randn(heads, ctx, 128, device=device, dtype=dtype) for _ in range(2)]
    kv_pre = [torch.randn(heads, pre, 128, device=device, dtype=dtype) for _ in range(2)]
    x1, xp = (torch.randn(n, h, device=device, dtype=dtype) for n in (1, pre))
    out["dense"] = [
        {"phase": "decode", "tokens": 1, "kv_tokens": ctx, "pairs": ctx,
         "ms": timer(lambda: layer(x1, *kv, False))},
        {"phase": "prefill", "tokens": pre, "kv_tokens": pre, "pairs": pre * (pre + 1) // 2,
         "ms": timer(lambda: layer(xp, *kv_pre, True))}]
    ws = ffn_weights(torch, h, sim.expert_ffn_size, sim.ffn_matrices, device, dtype)
    out["expert"] = []
    for n in cfg["tokens"]:
        x = torch.randn(n, h, device=device, dtype=dtype)
        ms = timer(lambda x=x: run_ffn(torch, x, ws))
        out["expert"].append({"tokens": n, "ms": ms,
                              "tflops": 2 * n * sim.expert_params / ms / 1e9})
    logits = torch.randn(1, spec.vocab_size, device=device, dtype=dtype)
    out["step_ms"] = timer(lambda: int(torch.argmax(logits, dim=-1)[0]))  # greedy pick + sync
    sync()
    out["peak_tflops"] = max(r["tflops"] for r in out["expert"])
    out["_sim_spec"] = sim
    return out


def _fit_overheads(m: dict, hw: HardwareSpec) -> dict:
    """Per-layer and per-expert overheads: measured minus SimBackend's roofline, clipped at 0."""
    sim: ModelSpec = m["_sim_spec"]
    bare = replace(hw, layer_overhead_us=0.0, expert_overhead_us=0.0, iteration_overhead_us=0.0)
    backend = SimBackend(sim, bare)
    moe_layer = next(layer for layer in sim.layers if layer.moe_index >= 0)
    for row in m["dense"]:
        row["roofline_ms"] = backend.dense_ms(moe_layer, row["tokens"], row["kv_tokens"],
                                              row["pairs"])
    for row in m["expert"]:
        row["roofline_ms"] = backend.expert_ms(row["tokens"])
    # Decode (one token per layer, one per expert at batch 1) is what TPOT is made of.
    decode, one = m["dense"][0], m["expert"][0]
    return {"layer_overhead_us": max(0.0, (decode["ms"] - decode["roofline_ms"]) * 1e3),
            "expert_overhead_us": max(0.0, (one["ms"] - one["roofline_ms"]) * 1e3),
            "iteration_overhead_us": m["step_ms"] * 1e3}


def _memory_gb(torch, device: str) -> tuple[float, float]:
    """(total GiB, GiB already taken by the runtime) of the device."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the sweep's buffers are not the runtime's reserve
        free, total = torch.cuda.mem_get_info(device)
        return total / 2**30, (total - free) / 2**30
    return host_ram_gb(), 0.0


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "host"


def _device_profile(torch, m: dict, name: str, device: str, threads: int, quick: bool) -> dict:
    """The hardware profile from the device sweep: measured rates, overheads against the
    roofline; checked by hardware_spec_from_dict."""
    total_gb, reserve_gb = _memory_gb(torch, device)
    label = torch.cuda.get_device_name(device) if device.startswith("cuda") else (
        f"CPU {platform.processor() or platform.machine()}, {threads} thread(s)")
    profile = {"name": name, "display_name": f"{label} (calibrated{', quick' if quick else ''})",
               "gpu_mem_gb": round(total_gb, 3), "hbm_gbps": round(m["hbm_gbps"], 3),
               "peak_tflops": round(m["peak_tflops"], 6), "h2d_gbps": round(m["h2d_gbps"], 3),
               "h2d_latency_us": round(max(0.0, m["latency_us"]), 3),
               "runtime_reserve_gb": round(reserve_gb, 3)}
    draft = hardware_spec_from_dict({**profile, "layer_overhead_us": 0.0,
                                     "expert_overhead_us": 0.0, "iteration_overhead_us": 0.0})
    profile.update({k: round(v, 3) for k, v in _fit_overheads(m, draft).items()})
    hardware_spec_from_dict(profile, where=f"calibrated profile {name}")  # what the sim accepts
    return profile


def _write(folder: Path, name: str, sweep: dict, command: str) -> dict:
    """<folder>/<name>.yaml, <name>.sweep.json and host/<name>.yaml, each written atomically."""
    device = sweep["device"]
    yaml_path, json_path = folder / f"{name}.yaml", folder / f"{name}.sweep.json"
    head = (f"# Calibrated by `{command}` on {socket.gethostname()} ({device}, "
            f"torch.set_num_threads({sweep['threads']}), {sweep['dtype']}).\n"
            f"# Measured sweep: {json_path.name}. Overheads = measured - SimBackend roofline.\n"
            f"# The host CPU's profile: host/{name}.yaml (hardware/host={name}).\n")
    if not device.startswith("cuda"):
        head += "# CPU: h2d_* is a host memory copy (no device), gpu_mem_gb is host RAM.\n"
    host_profile, host_path = write_host_profile(folder, name, sweep["cpu"], command)
    sweep["host_profile"] = host_profile
    write_json(json_path, sweep)
    write_text(yaml_path, head + yaml.safe_dump(sweep["profile"], sort_keys=False))
    return {"profile": sweep["profile"], "host_profile": host_profile, "sweep": sweep,
            "yaml_path": yaml_path, "json_path": json_path, "host_path": host_path}


def calibrate(model: str = "deepseek_v2_lite", device: str = "cpu", threads: int = 1,
              quick: bool = False, out_dir: str | None = None, name: str | None = None,
              cpu_threads: int | None = None, cpu_dtype: str = "auto",
              command: str | None = None) -> dict:
    """Measure, print nothing; returns {"profile", "host_profile", "sweep", "yaml_path",
    "json_path", "host_path"}. The host CPU runs with `cpu_threads` (default: torch's thread
    count before this call pins `threads`, the count serving would use)."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("moebench calibrate: --device cuda but torch sees no CUDA device")
    spec_path = CONF_DIR / "model" / f"{model}.yaml"
    if not spec_path.exists():
        raise SystemExit(f"moebench calibrate: no model spec {spec_path}")
    spec = model_spec_from_dict(yaml.safe_load(spec_path.read_text()), where=spec_path.name)
    cfg = QUICK if quick else FULL
    cpu_threads = cpu_threads or torch.get_num_threads()
    t0 = time.perf_counter()
    m = measure(cfg, spec, device, threads)
    sim: ModelSpec = m["_sim_spec"]
    cpu = measure_host(torch, (sim.hidden_size, sim.expert_ffn_size, sim.ffn_matrices), quick,
                       cpu_threads, cpu_dtype, cfg["budget_s"])
    host = _slug(socket.gethostname())
    name = name or f"calibrated_{host}_{_slug(device)}"
    sweep = {k: v for k, v in m.items() if not k.startswith("_")}
    sweep.update({"device": device, "threads": threads, "quick": quick, "model": model,
                  "scale": cfg["scale"], "dtype": "bfloat16" if device.startswith("cuda")
                  else "float32", "host": socket.gethostname(), "torch": torch.__version__,
                  "h2d_is_host_copy": not device.startswith("cuda"), "cpu": cpu,
                  "wall_s": time.perf_counter() - t0,
                  "profile": _device_profile(torch, m, name, device, threads, quick)})
    base = Path(out_dir) if out_dir else Path.cwd() / "results" / "calibration" / host
    return _write(base / "hardware", name, sweep, command or "calibrate() from Python")


def report(res: dict) -> str:
    s, p = res["sweep"], res["profile"]
    what = ("pinned host -> device, side stream, CUDA events" if not s["h2d_is_host_copy"] else
            "CPU: no device; host memory copy into a separate preallocated tensor")
    lines = [f"moebench calibrate: {s['device']}, {s['threads']} thread(s), {s['dtype']}, "
             f"model {s['model']} scaled x{s['scale']:g}",
             f"transfer ({what}):", f"{'bytes':>12}{'ms':>11}{'GB/s':>9}{'fit ms':>11}"]
    lines += [f"{r['bytes']:>12}{r['ms']:>11.4f}{r['gbps']:>9.2f}{r['fit_ms']:>11.4f}"
              for r in s["transfer"]]
    lines.append(f"least-squares fit t = latency + bytes/bandwidth: latency {s['latency_us']:.2f} "
                 f"us (intercept {s['intercept_us']:.2f} us), bandwidth {s['h2d_gbps']:.2f} GB/s; "
                 f"smallest copy {s['transfer'][0]['ms'] * 1e3:.2f} us (a bound on the latency)")
    lines.append(f"memory read bandwidth: {s['hbm_gbps']:.2f} GB/s")
    lines.append(f"{'dense layer':<12}{'tokens':>8}{'kv':>6}{'ms':>10}{'roofline ms':>13}")
    lines += [f"{r['phase']:<12}{r['tokens']:>8}{r['kv_tokens']:>6}{r['ms']:>10.3f}"
              f"{r['roofline_ms']:>13.3f}" for r in s["dense"]]
    lines.append(f"{'expert':<12}{'tokens':>8}{'ms':>10}{'TFLOP/s':>10}{'roofline ms':>13}")
    lines += [f"{'':<12}{r['tokens']:>8}{r['ms']:>10.3f}{r['tflops']:>10.4f}"
              f"{r['roofline_ms']:>13.3f}" for r in s["expert"]]
    lines.append("profile: " + ", ".join(f"{k}={v}" for k, v in p.items()))
    lines += cpu_report(s["cpu"])
    lines.append("host profile: " + ", ".join(f"{k}={v}" for k, v in res["host_profile"].items()))
    lines.append(f"wrote {res['yaml_path']}, {res['json_path'].name} and "
                 f"{res['host_path'].relative_to(res['yaml_path'].parent)} ({s['wall_s']:.1f} s)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="deepseek_v2_lite", help="conf/model spec to shape layers")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (recorded)")
    ap.add_argument("--quick", action="store_true", help="small sweep (tests, < 5 s)")
    ap.add_argument("--out", default=None, help="folder (default results/calibration/<host>)")
    ap.add_argument("--name", default=None, help="profile name (default calibrated_<host>_<dev>)")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="threads for the host CPU's expert sweep (default: torch's, recorded)")
    ap.add_argument("--cpu-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="host CPU expert dtype (auto: the faster one; recorded)")
    args = ap.parse_args(argv)
    if args.threads < 1 or (args.cpu_threads is not None and args.cpu_threads < 1):
        ap.error("--threads and --cpu-threads must be >= 1")
    print(report(calibrate(args.model, args.device, args.threads, args.quick, args.out,
                           args.name, args.cpu_threads, args.cpu_dtype,
                           shlex.join(["moebench", "calibrate", *argv]))))
    return 0
