"""fMoE / FineMoE (conf/system/fmoe.yaml), everything of it in one folder: system.py the hooks
(FMoE); rule.py the paper's rules in plain python, the reference the fast paths are tested
against; maps.py, maps_rdy.py, maps_trajectory.py the expert-map store (replacement,
trajectory matching); predictions.py, eviction.py, victim_order.py the incremental per-hook
state; variant.py the named variant fmoe_admission; kernels/ the optional compiled loops."""
