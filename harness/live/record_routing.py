"""Routing capture for `moebench record` (harness/live/record.py): router hooks, greedy
decoding of one prompt, and the trace v1 assembled from the captured rows.

Per request, step (0 = prefill, then one greedy decode token per step) and MoE layer:
each token's top-k ids and weights, the step-mean router probabilities and the speculative
guess for the next MoE layer (the next layer's router applied to this layer's router input;
docs/recording.md).
"""

from __future__ import annotations

import numpy as np

from core.trace import Trace, id_dtype


class RoutingTap:
    """Forward hooks on every router; `take()` turns one forward pass into per-layer rows."""

    def __init__(self, blocks):
        self.blocks, self.seen, self.on = blocks, {}, True
        self.handles = [b.router.register_forward_hook(self._hook(b.moe_index), with_kwargs=True)
                        for b in blocks]

    def _hook(self, index: int):
        def hook(module, args, kwargs, output):
            if self.on:
                self.seen[index] = (args, kwargs, output)
        return hook

    def take(self) -> list:
        """Per MoE layer: None (no tokens) or (ids [n,k], weights [n,k], probs mean [E],
        guess [n,k] with E = no guess), numpy."""
        self.on = False
        rows = []
        for i, b in enumerate(self.blocks):
            if b.moe_index not in self.seen:
                rows.append(None)
                continue
            args, kwargs, output = self.seen[b.moe_index]
            ids, w, probs = b.route(output)
            nxt = self.blocks[i + 1] if i + 1 < len(self.blocks) else None
            if nxt is not None and nxt.stack == b.stack:
                guess = nxt.route(nxt.router(*args, **kwargs))[0]  # next router, this input
            else:
                guess = ids.new_full(ids.shape, b.num_experts)
            rows.append((ids.numpy(), w.float().numpy(), probs.float().mean(0).numpy(),
                         guess.numpy()))
        self.seen.clear()
        self.on = True
        return rows

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def run_request(model, tap: RoutingTap, ids: list[int], output_len: int) -> list:
    """Greedy decoding of one prompt; routing per step (list over steps of tap.take())."""
    import torch

    x = torch.tensor([ids])
    enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
    steps = []
    with torch.no_grad():
        if enc_dec:
            # The encoder runs on its own: some models pass use_cache on to their encoder.
            enc = model.get_encoder()(input_ids=x)
            start = torch.tensor([[model.config.decoder_start_token_id]])
            out = model(encoder_outputs=enc, decoder_input_ids=start, use_cache=True)
        else:
            out = model(input_ids=x, use_cache=True)
        steps.append(tap.take())
        for _ in range(output_len - 1):  # EOS is ignored: every request has output_len steps
            tok = out["logits"][:, -1].argmax(-1, keepdim=True)  # [1, 1]
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            if enc_dec:
                out = model(encoder_outputs=enc, decoder_input_ids=tok, cache=cache,
                            use_cache=True)
            else:
                out = model(input_ids=tok, cache=cache, use_cache=True)
            steps.append(tap.take())
    return steps


def assemble(meta: dict, prompts: list[dict], lengths: list[int], routing: list[list],
             num_experts: int, top_k: int) -> Trace:
    """Trace v1 from per-request routing ([step][layer] rows of RoutingTap.take)."""
    E, k = num_experts, top_k
    L = int(meta["num_moe_layers"])
    ids, w, guess, probs, offsets = [], [], [], [], [0]
    for steps in routing:
        for step in steps:
            for layer in step:
                if layer is None:  # encoder layer during decode: an empty block
                    probs.append(np.zeros(E, np.float32))
                    offsets.append(offsets[-1])
                    continue
                ids.append(layer[0])
                w.append(layer[1])
                probs.append(layer[2])
                guess.append(layer[3])
                offsets.append(offsets[-1] + len(layer[0]))
    out_len = np.array([len(steps) for steps in routing], dtype=np.int32)
    dt = id_dtype(E)
    tr = Trace(
        meta=meta, request_ids=[p["id"] for p in prompts],
        datasets=[p["dataset"] for p in prompts], tasks=[p["task"] for p in prompts],
        prompt_len=np.array(lengths, dtype=np.int32), output_len=out_len,
        arrival_ms=np.zeros(len(prompts)),
        step_offsets=np.concatenate([[0], np.cumsum(out_len, dtype=np.int64)]),
        block_offsets=np.array(offsets, dtype=np.int64),
        topk=np.concatenate(ids).reshape(-1, k).astype(dt),
        weights=np.concatenate(w).reshape(-1, k).astype(np.float16),
        probs=np.stack(probs).reshape(-1, E).astype(np.float16),
        spec_topk=np.concatenate(guess).reshape(-1, k).astype(dt),
        prompts=[p["text"] for p in prompts])
    assert tr.probs.shape[0] == int(tr.step_offsets[-1]) * L
    return tr.validate()


def reuse_lag1(tr: Trace, phase: str = "prefill") -> float:
    """Share of a token's top-k experts that the previous token used at the same layer.

    prefill: consecutive prompt tokens (blocks of >= 2 tokens); decode: each decode token
    against the token before it (the last prompt token for step 1). Uniform routing: k / E.
    """
    E, k, L = tr.num_experts, tr.top_k, tr.num_layers
    shared = pairs = 0
    for r in range(tr.num_requests):
        for layer in range(L):
            if phase == "prefill":
                rows = tr.block_rows(r, 0, layer)
            else:
                rows = np.concatenate([tr.block_rows(r, s, layer)[-1:]
                                       for s in range(int(tr.output_len[r]))])
            if len(rows) < 2:
                continue
            used = np.zeros((len(rows), E), dtype=bool)
            np.put_along_axis(used, rows.astype(np.int64), True, axis=1)
            shared += int((used[1:] & used[:-1]).sum())
            pairs += len(rows) - 1
    return shared / (k * pairs) if pairs else float("nan")
