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

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
             num_local_experts=8, num_experts_per_tok=2, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1024)


def _arguments(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="moebench bench-backend")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--systems", default="", help="comma list (default: every conf/system)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N wall times per row")
    return ap.parse_args(argv)


class _Bench:
    """The random-weight model, its prompts and recorded routing, and the two timed runs."""

    def __init__(self, args: argparse.Namespace):
        import torch
        from transformers import AutoModelForCausalLM

        from harness.live.driver import record
        from harness.live.hf_arch import tiny_config

        self.args = args
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_config(tiny_config("mixtral", **SHAPE)).eval()
        g = torch.Generator().manual_seed(1)
        self.prompts = [torch.randint(0, 1024, (args.prompt_len,), generator=g).tolist()
                        for _ in range(args.requests)]
        print(f"bench-backend: CPU, torch.set_num_threads({torch.get_num_threads()}); "
              f"random-weight Mixtral "
              f"shape {SHAPE} fp32; {args.requests} requests x prompt {args.prompt_len} + "
              f"{args.output_len} new tokens, greedy, batch 1; REAL routing of random weights")
        record(self.model, self.prompts[:1], 2)  # warm up kernels and allocators
        _, _, self.trace = record(self.model, self.prompts, args.output_len)  # engine routing
        self.gen = copy.deepcopy(self.model.generation_config)
        self.gen.update(eos_token_id=None, do_sample=False, max_new_tokens=args.output_len)

    def plain(self) -> float:
        """transformers' generate: no hooks, nothing offloaded."""
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            for p in self.prompts:
                out = self.model.generate(torch.tensor([p]), generation_config=self.gen)
                assert out.shape[1] == len(p) + self.args.output_len
        return time.perf_counter() - t0

    def engine(self, name: str, slots: int) -> tuple[float, int]:
        from core.targets import build_target
        from harness.live.driver import run_live
        from harness.runner.config import compose_config
        from systems.base import System

        system = build_target(compose_config([f"system={name}"])["system"], "system", System)
        res = run_live(copy.deepcopy(self.model), self.trace, system, slots, self.prompts,
                       calibration=self.trace)
        return res.wall_s, res.backend.h2d_bytes


def main(argv: list[str]) -> int:
    import torch

    from harness.runner.config import system_names

    args = _arguments(argv)
    torch.set_num_threads(args.threads)
    bench = _Bench(args)
    n_tok = args.requests * args.output_len
    E = bench.trace.num_layers * bench.trace.num_experts
    # Plain and all-resident alternate, best of N each: the machine may be shared.
    plain_s, resident_s = float("inf"), float("inf")
    for _ in range(args.repeat):
        plain_s = min(plain_s, bench.plain())
        resident_s = min(resident_s, bench.engine("no_offload", E)[0])
    print(f"{'run':<36}{'tokens/s':>10}{'slowdown':>10}{'h2d MB':>9}")
    print(f"{'transformers generate (resident)':<36}{n_tok / plain_s:>10.1f}{1.0:>10.2f}"
          f"{0.0:>9.2f}")
    print(f"{'TorchBackend, all resident':<36}{n_tok / resident_s:>10.1f}"
          f"{resident_s / plain_s:>10.2f}{0.0:>9.2f}", flush=True)
    names = [s for s in args.systems.split(",") if s] or system_names()
    for name in names:
        if name == "no_offload":
            continue
        runs = [bench.engine(name, E // 4) for _ in range(args.repeat)]
        dt, h2d = min(r[0] for r in runs), runs[0][1]
        print(f"{'TorchBackend 25% cache, ' + name:<36}{n_tok / dt:>10.1f}{dt / plain_s:>10.2f}"
              f"{h2d / 1e6:>9.2f}", flush=True)
    print(f"(slowdown: best-of-{args.repeat} wall time / plain generate's best; engine rows "
          "time engine.run only, after offloading. 25% rows warm history systems on the same "
          "routing.)")
    return 0
