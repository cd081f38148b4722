"""Which loops fMoE runs compiled: systems/fmoe_fast.pyx (built by `pip install -e .` when a
C++ compiler is present) or the pure-Python reference in fmoe_eviction.py, victim_order.py
and expert_maps_trajectory.py. Both give the same decisions (tests/systems/test_fmoe_fast.py);
`FAST` is read when a store or an eviction state is built, so a test can switch it off."""

from __future__ import annotations

try:  # optional: absent without a compiler, then every loop runs in python
    from systems import fmoe_fast as FAST
except ImportError:
    FAST = None
