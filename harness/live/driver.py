"""Live runs: a real HF model driven by the engine, batch 1, greedy (docs/real-backend.md).

`record(model, prompts, output_len)` runs plain `model.generate` (nothing offloaded) with
router hooks and returns the greedy tokens, logits and a trace of that generation's routing.
`run_live(...)` offloads the model's routed experts to a TorchBackend and replays the same
requests through the engine: the engine's scheduler decides the iterations, `Driver` runs
one forward per iteration, and the model's MoE blocks call the engine's shared layer step,
which runs each expert through the driver's LiveExecutor (the simulator's SimExecutor
interface, harness/sim/executor.py).
Systems therefore see exactly the LayerRouting of a replay of that trace; the live router
output is checked against it at every layer. With `replay=True` the routers' choices are
replaced by the trace's (realistic routing on random weights: outputs are meaningless).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from core.trace import Trace, trace_from_routing
from harness.live.backend_torch import TorchBackend
from harness.live.hf_arch import arch_of, moe_blocks
from harness.live.hf_offload import LiveLayer, offload
from harness.sim.engine import Engine
from harness.sim.executor import Executor


@dataclass(frozen=True)
class LiveModel:
    """The few ModelSpec fields the engine reads in a live run."""

    name: str
    architecture: str
    num_moe_layers: int
    num_experts: int
    expert_bytes: int
    layers: tuple = ()


def record(model, prompts: list[list[int]], output_len: int):
    """Greedy generation of each prompt with nothing offloaded.

    Returns (tokens [R][O], logits [R] of [O, V] float tensors, routing trace).
    """
    arch = arch_of(model)
    blocks = moe_blocks(model)
    events: list[tuple[int, np.ndarray]] = []
    hooks = [b.router.register_forward_hook(
        lambda m, i, o, b=b: events.append((b.moe_index, b.route(o)[0].cpu().numpy())))
        for b in blocks]
    tokens, logits, requests = [], [], []
    k = blocks[0].top_k
    # Plain greedy, exactly output_len tokens: no EOS stop, so no logits processor either.
    gen = copy.deepcopy(model.generation_config)
    gen.update(eos_token_id=None, do_sample=False, output_logits=True,
               return_dict_in_generate=True, min_new_tokens=None,
               max_new_tokens=output_len)
    try:
        for r, prompt in enumerate(prompts):
            events.clear()
            ids = torch.tensor([prompt], device=model.device)
            with torch.no_grad():
                out = model.generate(ids, generation_config=gen)
            tokens.append(out.sequences[0, -output_len:].tolist())
            logits.append(torch.stack([x[0].float().cpu() for x in out.logits]))
            requests.append({"id": f"r{r}", "prompt_len": len(prompt), "output_len": output_len,
                             "routing": _steps(events, len(blocks), k, output_len)})
    finally:
        for h in hooks:
            h.remove()
    meta = {"num_moe_layers": len(blocks), "num_experts": blocks[0].num_experts, "top_k": k,
            "moe_layer_stacks": [b.stack for b in blocks], "model": arch.model_type,
            "routing_source": "recorded", "synthetic": False}
    return tokens, logits, trace_from_routing(meta, requests, source="<recorded>")


def _steps(events, L: int, k: int, output_len: int) -> list[list[np.ndarray]]:
    """Group router calls into steps: a new step starts when a layer repeats."""
    steps: list[dict[int, np.ndarray]] = [{}]
    for layer, ids in events:
        if layer in steps[-1]:
            steps.append({})
        steps[-1][layer] = ids
    if len(steps) != output_len:
        raise RuntimeError(f"recorded {len(steps)} steps, expected {output_len}")
    empty = np.zeros((0, k), dtype=np.int64)
    return [[s.get(layer, empty) for layer in range(L)] for s in steps]


class LiveExecutor(Executor):
    """Runs each expert for real: the MoE block now running hands over its callback
    `run(expert, ready_estimate_ms) -> (wait_ms, end_ms)` (harness/live/hf_offload.py) via
    `bind_layer`; the backend waits for the expert's copy (wait_ms, the access's stall), runs
    it and reads its clock (end_ms)."""

    def __init__(self):
        self._layer_run = None

    def bind_layer(self, run) -> None:
        """The running MoE block's expert callback; None once the layer is done."""
        self._layer_run = run

    def run(self, expert: int, count: int, ready_ms: float, now_ms: float):
        if self._layer_run is None:
            raise RuntimeError(f"expert {expert} run outside a live MoE layer")
        wait_ms, end_ms = self._layer_run(expert, ready_ms if ready_ms > now_ms else now_ms)
        return now_ms + wait_ms, end_ms


class Driver:
    """Runs one forward per engine iteration, keeping each request's KV cache; its executor
    runs the experts of each MoE layer."""

    def __init__(self, model, prompts: list[list[int]]):
        self.model, self.prompts = model, prompts
        self.executor = LiveExecutor()
        self.enc_dec = arch_of(model).encoder_decoder
        self.state: dict[int, dict] = {}
        self.tokens: dict[int, list[int]] = {}
        self.logits: dict[int, list[torch.Tensor]] = {}

    def iteration(self, info, members) -> None:
        (r, s), = members
        m, dev = self.model, self.model.device
        with torch.no_grad():
            if s == 0:
                ids = torch.tensor([self.prompts[r]], device=dev)
                if self.enc_dec:
                    enc = m.get_encoder()(input_ids=ids)
                    start = m.generation_config.decoder_start_token_id
                    out = m(encoder_outputs=enc, decoder_input_ids=torch.tensor([[start]],
                            device=dev), use_cache=True)
                    self.state[r] = {"enc": enc}
                else:
                    out = m(input_ids=ids, use_cache=True)
                    self.state[r] = {}
                self.tokens[r], self.logits[r] = [], []
            else:
                st, tok = self.state[r], torch.tensor([[self.tokens[r][-1]]], device=dev)
                if self.enc_dec:
                    out = m(encoder_outputs=st["enc"], decoder_input_ids=tok,
                            cache=st["pkv"], use_cache=True)
                else:
                    out = m(input_ids=tok, cache=st["pkv"], use_cache=True)
        self.state[r]["pkv"] = out.cache
        last = out.logits[0, -1].float()
        self.logits[r].append(last.cpu())
        self.tokens[r].append(int(last.argmax()))
        if s + 1 == int(self._out_len[r]):
            self.state.pop(r)  # free the KV cache of a finished request

    def bind(self, trace: Trace) -> None:
        self._out_len = trace.output_len


@dataclass
class LiveResult:
    rec: object  # harness.sim.recorder.Recorder
    backend: TorchBackend
    tokens: list[list[int]]
    logits: list[torch.Tensor]  # per request [O, V]
    engine: Engine
    layers: list[LiveLayer]
    wall_s: float  # engine.run wall time (the generation itself)


def run_live(model, trace: Trace, system, capacity_slots: int, prompts: list[list[int]],
             device: str = "cpu", replay: bool = False, copy_ms: float | None = None,
             calibration: Trace | None = None) -> LiveResult:
    """Offload `model` (in place) and run `trace`'s requests through the engine for real.
    `calibration`: the trace a history-based system warms up on (after bind)."""
    blocks, host, names = offload(model)
    model.to(device)  # the dense part; routed experts stay in `host`
    backend = TorchBackend(host, capacity_slots, device, copy_ms=copy_ms)
    del host  # on CUDA the backend holds pinned copies; the originals can go
    spec = LiveModel(arch_of(model).model_type, "decoder", len(blocks), blocks[0].num_experts,
                     backend.expert_bytes)
    engine = Engine(spec, backend, trace, system, capacity_slots * backend.expert_bytes)
    if calibration is not None:
        system.warmup(calibration)
    layers = [LiveLayer(b, n, engine, backend, replay) for b, n in zip(blocks, names)]
    driver = Driver(model, prompts)
    driver.bind(trace)
    backend.reset_clock()
    t0 = time.perf_counter()
    try:
        rec = engine.run(driver=driver)
    finally:
        for layer in layers:
            layer.remove()
    wall_s = time.perf_counter() - t0
    R = trace.num_requests
    return LiveResult(rec, backend, [driver.tokens[r] for r in range(R)],
                      [torch.stack(driver.logits[r]) for r in range(R)], engine, layers, wall_s)
