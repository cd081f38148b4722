"""MoE-Infinity (conf/system/moe_infinity.yaml), everything of it in one folder:
system.py the hooks (MoEInfinity); rule.py the paper's rule in plain numpy, the reference the
fast paths are tested against; eamc.py the EAM collection; requests.py, batch.py, ranks.py,
propose.py the incremental paths (one request, a batch, eviction ranks, the proposal);
variant.py the named variant moe_infinity_hysteresis; kernels/ the optional compiled kernels."""
