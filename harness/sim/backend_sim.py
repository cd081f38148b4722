"""SimBackend: the hardware cost model behind the engine's virtual clock.

Durations in ms, from the specs only (never measured wall time):
  dense layer  = max(bytes / HBM, FLOPs / peak) + layer overhead, where bytes are the
                 layer's resident weights plus the KV entries its attention reads, and FLOPs
                 are 2 * params * tokens + 4 * (query, key) pairs * hidden for attention;
  expert call  = max(expert bytes / HBM, 2 * tokens * expert params / peak) + call overhead
                 + dequantisation (experts below 16 bits: expert params / the profile's
                 dequant_gparams_per_s at that width; docs/quantization.md);
  copy         = per-copy latency + bytes / host-to-device bandwidth;
  iteration    = LM head (bytes / HBM vs FLOPs / peak) + per-iteration framework overhead;
  CPU expert   = max(expert bytes / host DRAM, 2 * tokens * expert params / CPU peak) + CPU
                 call overhead + the tokens' hidden states over the link and back (two copies),
                 only with a host profile (docs/hardware.md); no dequantisation: CPU kernels
                 compute on the packed weights.
"""

from __future__ import annotations

from core.specs import HardwareSpec, LayerSpec, ModelSpec, SpecError


def dequant_ms(model: ModelSpec, hw: HardwareSpec) -> float:
    """What one expert call adds to dequantise its weights (ms): expert params / the rate of
    `hardware.dequant_gparams_per_s` at `model.expert_bits`; 0 at 16 bits and above. A width
    below 16 the profile has no rate for (a fractional one included) is a SpecError."""
    bits = model.expert_bits
    if bits >= 16:
        return 0.0
    rate = hw.dequant_rate(bits)
    if rate is None:
        listed = ", ".join(str(b) for b, _ in hw.dequant_gparams_per_s) or "none"
        why = ("is not a whole number of bits" if bits != int(bits)
               else f"has no rate on {hw.name} (widths listed: {listed})")
        raise SpecError(f"hardware.dequant_gparams_per_s: model.expert_bits={bits:g} {why}; "
                        "a quantized expert pays its dequantisation at the profile's rate "
                        "for its width (docs/quantization.md)")
    return model.expert_params / (rate * 1e6)  # rate: 1e9 params/s = 1e6 params/ms


class SimBackend:
    name = "sim"

    def __init__(self, model: ModelSpec, hw: HardwareSpec):
        self.model, self.hw = model, hw
        self._hbm_bytes_per_ms = hw.hbm_gbps * 1e6
        self._flops_per_ms = hw.peak_tflops * 1e9
        self._link_bytes_per_ms = hw.h2d_gbps * 1e6
        self._dense_bytes_per_param = model.dense_bits / 8
        self._kv_bytes_per_token_layer = model.kv_elems_per_token_per_layer * model.dense_bits / 8
        self._expert_mem_ms = model.expert_bytes / self._hbm_bytes_per_ms
        self._expert_flops_per_token = 2.0 * model.expert_params
        # per call, whatever the tokens: the framework's overhead plus the dequantisation
        self._expert_fixed_ms = hw.expert_overhead_us / 1e3 + dequant_ms(model, hw)
        self._layer_overhead_ms = hw.layer_overhead_us / 1e3
        self.copy_latency_ms = hw.h2d_latency_us / 1e3
        self.expert_copy_ms = self.transfer_ms(model.expert_bytes)

    def transfer_ms(self, nbytes: int) -> float:
        return self.copy_latency_ms + nbytes / self._link_bytes_per_ms

    def dense_ms(self, layer: LayerSpec, n_tokens: int, kv_tokens: int, attn_pairs: int) -> float:
        """One layer's resident part for n_tokens new tokens reading kv_tokens cached entries."""
        nbytes = (layer.dense_params * self._dense_bytes_per_param
                  + kv_tokens * self._kv_bytes_per_token_layer)
        flops = 2.0 * layer.dense_params * n_tokens + 4.0 * attn_pairs * self.model.hidden_size
        return max(nbytes / self._hbm_bytes_per_ms, flops / self._flops_per_ms) + (
            self._layer_overhead_ms)

    def expert_ms(self, n_tokens: int) -> float:
        flops_ms = self._expert_flops_per_token * n_tokens / self._flops_per_ms
        return max(self._expert_mem_ms, flops_ms) + self._expert_fixed_ms

    def cpu_expert_ms(self, n_tokens: int) -> float:
        """One expert run on the host CPU for n_tokens (needs hardware.host)."""
        host, m = self.hw.host, self.model
        mem_ms = m.expert_bytes / (host.mem_gbps * 1e6)
        flops_ms = self._expert_flops_per_token * n_tokens / (host.cpu_tflops * 1e9)
        hidden_bytes = n_tokens * m.hidden_size * m.dense_bits / 8
        return (max(mem_ms, flops_ms) + host.cpu_expert_overhead_us / 1e3
                + 2 * self.transfer_ms(hidden_bytes))

    def iteration_ms(self, n_sequences: int) -> float:
        """LM head over the last token of each sequence plus per-step framework overhead."""
        m = self.model
        head_ms = max(m.lm_head_bytes / self._hbm_bytes_per_ms,
                      2.0 * m.vocab_size * m.hidden_size * n_sequences / self._flops_per_ms)
        return head_ms + self.hw.iteration_overhead_us / 1e3
