"""fMoE's compiled loops: fast.pyx (with the trajectory step of fast_step.h), built in place
by `pip install -e .` (setup.py) when a C compiler is present: the eviction edits
(eviction.py, victim_order.py), the delta rule and the layer groups (predictions.py) and the
trajectory step (maps_trajectory.py). Both give the python code's decisions
(tests/systems/test_fmoe_fast.py). The system loads them in bind, as the config's
`policy_kernels` says (systems/base.py); the store, the scores and the groups take them as
an argument (None: python)."""

from __future__ import annotations

from systems.base import compiled_kernel


def load_kernels(choice: str = "auto"):
    """kernels/fast.pyx for `choice` auto when built; None (the python loops) otherwise."""
    return compiled_kernel("systems.fmoe.kernels.fast", choice)
