"""MoE-Infinity (arXiv 2401.14361, v3+) numbers beside which four experiments print theirs.

Source of every value: ../shared/reference/paper_numbers.md, section A1 (the paper's text
and the repository's README, EfficientMoE/MoE-Infinity at commit d617801). Nothing here is
ours; the experiments say SIMULATED beside every number of theirs.
"""

from __future__ import annotations

PAPER = "MoE-Infinity (arXiv 2401.14361)"

# README "per-token latency in seconds (open-source version, A5000)": one RTX A5000, batch 1.
# Kept in milliseconds; None where the README marks the system "X" (unsupported).
# Keys: our model name -> paper system -> TPOT ms.
README_TPOT_MS = {
    "switch_large_128": {"MoE-Infinity": 130, "Accelerate": 1043, "DeepSpeed": 4578,
                         "Mixtral-Offloading": None, "Ollama": None, "vLLM": None},
    "nllb_moe_54b": {"MoE-Infinity": 119, "Accelerate": 3071, "DeepSpeed": 8381,
                     "Mixtral-Offloading": None, "Ollama": None, "vLLM": None},
    "mixtral_8x7b": {"MoE-Infinity": 735, "Accelerate": 6633, "DeepSpeed": 2486,
                     "Mixtral-Offloading": 1752, "Ollama": 903, "vLLM": 2137},
    "deepseek_v2_lite": {"MoE-Infinity": 155, "Accelerate": 1743, "DeepSpeed": 737,
                         "Mixtral-Offloading": None, "Ollama": 1250, "vLLM": 493},
    "arctic": {},  # served in the paper (1 TB host memory) but no latency published
}
# The paper's systems in the README's row order, and the system of ours that stands for each
# (as in Table 1, analysis/paper_numbers.py); None: no counterpart in the simulator.
PAPER_SYSTEMS = {"MoE-Infinity": "moe_infinity", "DeepSpeed": "layer_offload",
                 "Mixtral-Offloading": "lru", "Accelerate": None, "Ollama": None, "vLLM": None}
NO_COUNTERPART = {
    "Accelerate": "Hugging Face Accelerate's device_map offload runs each offloaded module's "
                  "weights through its own hooks; its per-module overheads are framework code",
    "Ollama": "llama.cpp kernels, quantized weights and its own CPU/GPU layer split",
    "vLLM": "vLLM's CPU offload and kernels (PagedAttention, CUDA graphs)",
}
# Fig. 7 (an image; the text): Mixtral-8x7B's latency with MoE-Infinity, and its factor over
# BrainStorm and Mixtral-Offloading (the paper's own, not the README's 1752 / 735).
FIG7_MIXTRAL_MS = 836
FIG7_MIXTRAL_SPEEDUP = 1.4
# Host memory the paper gives each model (text, "Setup"). moe_infinity_models keeps every
# expert in pinned host memory; the tiers experiment runs these sizes with an NVMe tier below.
HOST_MEMORY_GB = {"switch_large_128": 64, "nllb_moe_54b": 256, "deepseek_v2_lite": 32,
                  "mixtral_8x7b": 128, "arctic": 1024}

# Fig. 9 (image; the text): raising the EAMC capacity from 1 to 120 reaches the lowest latency
# for all models, which is about 3% of requests.
EAMC_BEST_CAPACITY = 120
EAMC_BEST_SHARE = 0.03

# Table 3: min-mean-max requests to recover after a task shift.
TABLE3 = {
    "MMLU tasks": {"nllb_moe_54b": (0, 14, 43), "mixtral_8x7b": (0, 9, 49),
                   "arctic": (28, 43, 45)},
    "BIG-bench tasks": {"nllb_moe_54b": (1, 15, 49), "mixtral_8x7b": (0, 11, 49),
                        "arctic": (0, 29, 42)},
    "MMLU -> BIG-bench": {"nllb_moe_54b": (0, 6, 17), "mixtral_8x7b": (0, 27, 42),
                          "arctic": (2, 28, 41)},
    "BIG-bench -> MMLU": {"nllb_moe_54b": (3, 11, 24), "mixtral_8x7b": (0, 35, 46),
                          "arctic": (5, 27, 45)},
}
TABLE3_MODELS = ("nllb_moe_54b", "mixtral_8x7b", "arctic")

# Long-context study (text): DeepSeek-V2-Lite, contexts 2^12 .. 2^17 tokens; compute per
# token grows from 50 to 160 ms; the expert buffer is 2 GB at 2^16 and 1 GB at 2^17;
# on-demand fetching adds 137 ms (at 2^17, where the buffer is smallest).
LONG_COMPUTE_MS = {2**12: 50, 2**17: 160}
LONG_EXPERT_BUFFER_GB = {2**16: 2.0, 2**17: 1.0}
LONG_ON_DEMAND_MS = 137
