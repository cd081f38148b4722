"""Put an HF MoE model's routed experts behind the engine, through transformers' own
extension points (docs/real-backend.md):

- stacked experts: an experts implementation registered with `ExpertsInterface` under
  "moebench_offload" and selected with `model.set_experts_implementation`;
- per-module experts (SwitchTransformers): each `experts["expert_i"]` replaced, on this model
  instance only, by a wrapper that returns the output the engine step computed for it;
- routing: forward hooks on each router (they may also force replayed routing).

No transformers class is patched. Shared experts, dense layers, attention and embeddings stay
where they are. `offload(model)` moves every routed expert's tensors out of the model into a
host dict {key: [tensors]} (key = moe_index * E + expert) and leaves empty tensors behind.
Cheapest while the model is on the host (the rows are views, no copy); a model already on a
device has its experts copied to the host. Move the expert-free model to the device after.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.live.hf_arch import MoEBlock, UnsupportedArchitecture, arch_of, moe_blocks

IMPL = "moebench_offload"
OFFLOAD_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "phimoe", "olmoe", "deepseek_v2",
                 "deepseek_v3", "switch_transformers")


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Registered experts implementation: hidden_states [T,H], top_k_index / weights [T,k]."""
    layer = self._moebench_layer
    if layer is None:
        raise RuntimeError("moebench_offload experts called on a model that is not offloaded")
    return layer.run_stacked(self, hidden_states, top_k_index, top_k_weights)


def _register() -> None:
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(IMPL, _experts_forward)


class _ExpertWrapper(nn.Module):
    """Stands in for one per-module expert; returns what the engine step computed for it."""

    def __init__(self, inner: nn.Module, layer, expert: int):
        super().__init__()
        self.inner, self.expert = inner, expert
        self._layer = [layer]  # a list: not a registered submodule

    def forward(self, x):
        return self._layer[0].take(self.expert, x)


def offload(model) -> tuple[list[MoEBlock], dict[int, list[torch.Tensor]], list[list[str]]]:
    """Strip routed experts from `model` (in place). Returns the blocks, the host weights per
    key, and per block the tensor names in each key's list."""
    arch = arch_of(model)
    if arch.model_type not in OFFLOAD_TYPES:
        why = ""
        if arch.model_type == "nllb-moe":
            why = (" (transformers 5.x NllbMoeExperts.forward one-hot encodes an already "
                   "one-hot mask and so calls only expert_0 and expert_1 whatever the router "
                   "chose; offloading cannot reproduce that reference)")
        raise UnsupportedArchitecture(f"offloading {arch.model_type!r} is not supported{why}; "
                                      f"supported: {', '.join(OFFLOAD_TYPES)}")
    blocks = moe_blocks(model)
    host: dict[int, list[torch.Tensor]] = {}
    names: list[list[str]] = []
    for b in blocks:
        E, base = b.num_experts, b.moe_index * b.num_experts
        if arch.style == "stacked":
            params = [(n, p) for n, p in b.experts.named_parameters(recurse=False)
                      if p.dim() >= 1 and p.shape[0] == E]
            names.append([n for n, _ in params])
            for e in range(E):
                # Views of the stacked tensor (contiguous rows): no second copy in host memory.
                host[base + e] = [p.data[e].detach().to("cpu").contiguous() for _, p in params]
            for n, p in params:
                setattr(b.experts, n, nn.Parameter(p.data.new_empty(0), requires_grad=False))
        else:
            first = b.experts["expert_0"]
            names.append([n for n, _ in first.named_parameters()])
            for e in range(E):
                mod = b.experts[f"expert_{e}"]
                host[base + e] = [p.detach().to("cpu").contiguous()
                                  for _, p in mod.named_parameters()]
                for n, p in list(mod.named_parameters()):
                    owner, leaf = _owner(mod, n)
                    setattr(owner, leaf, nn.Parameter(p.data.new_empty(0), requires_grad=False))
    if arch.style == "stacked":
        _register()
        model.set_experts_implementation(IMPL)
    return blocks, host, names


def _owner(mod: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    for p in path:
        mod = getattr(mod, p)
    return mod, leaf


def routed_param_count(blocks: list[MoEBlock]) -> int:
    """Elements of routed-expert weights still held by the model's modules."""
    n = 0
    for b in blocks:
        if b.arch.style == "stacked":
            n += sum(p.numel() for p in b.experts.parameters(recurse=False))
        else:
            n += sum(p.numel() for p in b.experts.parameters())
    return n


class LiveLayer:
    """Per MoE block: connects the model's forward to the engine's shared layer step."""

    def __init__(self, block: MoEBlock, names: list[str], engine, backend, replay: bool):
        self.block, self.names, self.engine, self.backend = block, names, engine, backend
        self.replay = replay
        self.E, self.base = block.num_experts, block.moe_index * block.num_experts
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.router_out = None
        self.hooks = [block.router.register_forward_hook(self._router_hook)]
        if block.arch.style == "stacked":
            block.experts._moebench_layer = self
        else:
            for e in range(self.E):
                key = f"expert_{e}"
                block.experts[key] = _ExpertWrapper(block.experts[key], self, e)

    def _router_hook(self, module, inputs, output):
        if self.replay:
            output = self._forced(output)
        self.router_out = output
        if self.block.arch.style == "modules":
            self._run_modules(inputs[0], output)
        return output

    def _check(self, ids: torch.Tensor) -> None:
        """Live routing must be the trace's (replay forces it, so nothing to check)."""
        if self.replay:
            return
        rows = self.engine.trace_rows(self.block.moe_index)
        live = torch.sort(ids.reshape(len(rows), -1).cpu(), dim=1).values
        want = torch.sort(torch.as_tensor(rows.astype("int64")), dim=1).values
        if not torch.equal(live, want):
            raise RuntimeError(f"MoE layer {self.block.moe_index}: live routing differs from "
                               "the trace (was it recorded from this greedy generation?)")

    def _forced(self, output):
        """Replay: routing from the trace; weights from the trace or uniform 1/k."""
        rows = self.engine.trace_rows(self.block.moe_index)
        k = rows.shape[1]
        dev = output[-1].device
        ids = torch.as_tensor(rows.astype("int64"), device=dev)
        w = torch.full(ids.shape, 1.0 / k, device=dev)
        if self.block.arch.model_type == "switch_transformers":
            dispatch, prob, logits = output
            d = torch.nn.functional.one_hot(ids[:, 0], self.E).reshape(dispatch.shape)
            return d.to(dispatch.dtype), w.reshape(prob.shape).to(prob.dtype), logits
        logits, weights, _ = output
        return logits, w.to(weights.dtype), ids

    def run_stacked(self, experts, h, ids, w):
        """h [T,H], ids / w [T,k]: run the layer's experts in the engine's order."""
        self._check(ids)
        out = torch.zeros_like(h)
        named = self.names
        be = self.backend

        def run(e: int, ready_ms: float):
            tensors, wait_ms = be.weights(self.base + e)
            p = dict(zip(named, tensors))
            tok, pos = torch.where(ids == e)
            x = h[tok]
            gu = _linear(x, p.get("gate_up_proj", p.get("up_proj")), experts.is_transposed)
            if experts.has_bias:
                gu = gu + p.get("gate_up_proj_bias", p.get("up_proj_bias"))[None]
            y = experts._apply_gate(gu) if experts.has_gate else experts.act_fn(gu)
            y = _linear(y, p["down_proj"], experts.is_transposed)
            if experts.has_bias:
                y = y + p["down_proj_bias"][None]
            y = y * w[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
            return wait_ms, be.now_ms()

        self.engine.live_layer(self.block.moe_index, run)
        return out

    def _run_modules(self, hidden, output):
        dispatch = output[0]
        flat_h = hidden.reshape(-1, hidden.shape[-1])
        mask = dispatch.reshape(flat_h.shape[0], self.E)
        # Top-1 by logits: a capacity-dropped token still names its expert (hf_arch.route).
        self._check(output[2].reshape(-1, self.E).argmax(-1, keepdim=True))
        self.pending.clear()
        be = self.backend

        def run(e: int, ready_ms: float):
            tensors, wait_ms = be.weights(self.base + e)
            params = dict(zip(self.names, tensors))
            tok = torch.where(mask[:, e] > 0)[0]
            x = flat_h[tok]
            inner = self.block.experts[f"expert_{e}"].inner
            self.pending[e] = (x, torch.func.functional_call(inner, params, (x,)))
            return wait_ms, be.now_ms()

        self.engine.live_layer(self.block.moe_index, run)

    def take(self, e: int, x):
        got = self.pending.pop(e, None)
        if got is None or not torch.equal(got[0], x):
            raise RuntimeError(f"MoE layer {self.block.moe_index}: expert {e} called with "
                               "inputs the engine step did not run it on")
        return got[1]

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def _linear(x, w, transposed: bool):
    return x @ w if transposed else torch.nn.functional.linear(x, w)
