"""`make bench-backend`: tokens/s of plain transformers vs the engine with TorchBackend on one
small random-weight Mixtral-shaped model (no download), CPU by default.

Rows: plain `model.generate` (nothing offloaded, transformers' default experts
implementation); TorchBackend with every expert resident (system no_offload: the engine's
overhead); TorchBackend with a cache of 25% of the experts under each system. Greedy,
batch 1, real routing of the random model. The thread count is pinned (--threads).
"""

from __future__ import annotations

import argparse
import copy
import time


def main(argv: list[str]) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from core.targets import build_target
    from harness.live.driver import record, run_live
    from harness.live.hf_arch import tiny_config
    from harness.runner.config import compose_config, system_names
    from systems.base import System

    ap = argparse.ArgumentParser(prog="moebench bench-backend")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--systems", default="", help="comma list (default: every conf/system)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N wall times per row")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_local_experts=8, num_experts_per_tok=2, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=1024)
    model = AutoModelForCausalLM.from_config(tiny_config("mixtral", **shape)).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1024, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.requests)]
    n_tok = args.requests * args.output_len
    print(f"bench-backend: CPU, torch.set_num_threads({torch.get_num_threads()}); "
          f"random-weight Mixtral "
          f"shape {shape} fp32; {args.requests} requests x prompt {args.prompt_len} + "
          f"{args.output_len} new tokens, greedy, batch 1; REAL routing of random weights")
    record(model, prompts[:1], 2)  # warm up kernels and allocators
    _, _, trace = record(model, prompts, args.output_len)  # routing for the engine rows
    gen = copy.deepcopy(model.generation_config)
    gen.update(eos_token_id=None, do_sample=False, max_new_tokens=args.output_len)

    def plain() -> float:  # no hooks, nothing offloaded
        t0 = time.perf_counter()
        with torch.no_grad():
            for p in prompts:
                out = model.generate(torch.tensor([p]), generation_config=gen)
                assert out.shape[1] == len(p) + args.output_len
        return time.perf_counter() - t0

    def engine(name: str, slots: int) -> tuple[float, int]:
        system = build_target(compose_config([f"system={name}"])["system"], "system", System)
        res = run_live(copy.deepcopy(model), trace, system, slots, prompts, calibration=trace)
        return res.wall_s, res.backend.h2d_bytes

    E = trace.num_layers * trace.num_experts
    # Plain and all-resident alternate, best of N each: the machine may be shared.
    plain_s, resident_s = float("inf"), float("inf")
    for _ in range(args.repeat):
        plain_s = min(plain_s, plain())
        resident_s = min(resident_s, engine("no_offload", E)[0])
    print(f"{'run':<36}{'tokens/s':>10}{'slowdown':>10}{'h2d MB':>9}")
    print(f"{'transformers generate (resident)':<36}{n_tok / plain_s:>10.1f}{1.0:>10.2f}"
          f"{0.0:>9.2f}")
    print(f"{'TorchBackend, all resident':<36}{n_tok / resident_s:>10.1f}"
          f"{resident_s / plain_s:>10.2f}{0.0:>9.2f}", flush=True)
    names = [s for s in args.systems.split(",") if s] or system_names()
    for name in names:
        if name == "no_offload":
            continue
        runs = [engine(name, E // 4) for _ in range(args.repeat)]
        dt, h2d = min(r[0] for r in runs), runs[0][1]
        print(f"{'TorchBackend 25% cache, ' + name:<36}{n_tok / dt:>10.1f}{dt / plain_s:>10.2f}"
              f"{h2d / 1e6:>9.2f}", flush=True)
    print(f"(slowdown: best-of-{args.repeat} wall time / plain generate's best; engine rows "
          "time engine.run only, after offloading. 25% rows warm history systems on the same "
          "routing.)")
    return 0
