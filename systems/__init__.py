"""Offloading policies; each answers the engine's questions over expert ids. One file per
single-file system (lru.py, on_demand.py, diff_moe.py, ...), one package per multi-file system
with everything of it inside: moe_infinity/, fmoe/ and oracle/ (the Belady bounds), each with
system.py (the hooks), rule.py (the paper's rule, plain: the fast paths' reference) and
kernels/ (optional compiled kernels, chosen by the config's policy_kernels). The zoo's parts
live in evictors/ and prefetchers/; variants.py is the registry of named variants.

Systems never import torch: they see expert keys (ints), routing ids and times in ms.
"""
