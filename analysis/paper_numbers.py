"""Published numbers that tables print beside ours (sources: ../shared/reference/)."""

# MoE-Infinity (arXiv 2401.14361 v3+), Table 1: DeepSeek-V2-Lite, 1x RTX A5000 24 GB,
# PCIe 4.0 (24 GB/s), batch 1; milliseconds. Keyed by the system that stands for each row.
MOE_INFINITY_TABLE1 = {
    "moe_infinity": {"paper_system": "MoE-Infinity", "tpot_mean_ms": 155,
                     "tpot_tail_ms": 169, "gpu_idle_ms": 51},
    "layer_offload": {"paper_system": "DeepSpeed", "tpot_mean_ms": 737,
                      "tpot_tail_ms": 803, "gpu_idle_ms": 513},
    "lru": {"paper_system": "Mixtral-Offloading", "tpot_mean_ms": 1250,
            "tpot_tail_ms": 1530, "gpu_idle_ms": 754},
}
TABLE1_FOOTNOTES = [
    "Paper values: MoE-Infinity (arXiv 2401.14361) Table 1, measured on a real RTX A5000; "
    "ours are simulated, so compare orderings and ratios, not absolute milliseconds.",
    "MoE-Infinity's README lists Mixtral-Offloading as unsupported (X) on DeepSeek-V2-Lite "
    "and gives Ollama 1.250 s there, so the 1250 ms row may be swapped with Ollama's.",
    "The paper's tail is its reported tail latency; ours is the p99 over requests.",
]
