"""The oracle's compiled Belady plan: plan.pyx, built in place by `pip install -e .`
(setup.py) when a C compiler is present; the same plan as rule.py's python `belady_plan`
(tests/systems/test_belady_fast.py). The oracle loads it in bind, as the config's
`policy_kernels` says (systems/base.py)."""

from __future__ import annotations

from systems.base import compiled_kernel


def load_kernels(choice: str = "auto"):
    """kernels/plan.pyx for `choice` auto when built; None (the python rule) otherwise."""
    return compiled_kernel("systems.oracle.kernels.plan", choice)
