"""Builds the compiled engine core (harness/sim/fast_*.pyx, C++ via Cython) and
the policies' kernels in place: moe_infinity's and fMoE's (systems/moe_infinity/kernels/*.pyx,
systems/fmoe/kernels/fast.pyx, C) and the oracle's plan (systems/oracle/kernels/plan.pyx, C).

Everything else is in pyproject.toml. The extensions are optional: without a C++ compiler
the install still succeeds and the engine runs its pure-Python reference core
(harness/sim/cores.py; `engine_core` in the config), moe_infinity its numpy code,
fMoE its python loops, the oracle its python plan (what `policy_kernels: python` chooses).
MOEBENCH_NO_EXTENSIONS=1 builds none of them (and needs no Cython):
tests/test_wheel.py builds its wheel that way, to check what ships in seconds."""

import os

from setuptools import Extension, setup

FAST = ("fast_state", "fast_copies", "fast_step")
# fast_column.h: the recorder's columns (fast_state.pxd), included by all three
extensions = [Extension(f"harness.sim.{name}", [f"harness/sim/{name}.pyx"], language="c++",
                        depends=["harness/sim/fast_column.h", "harness/sim/fast_state.pxd"],
                        extra_compile_args=["-O2"], optional=True) for name in FAST]
# -ffp-contract=off: a * b + c stays two roundings, as in numpy (bit-identical decisions)
# moe_infinity's rows: the batch path's member rows in one call (the same helpers and contract)
MOE_INF = "systems/moe_infinity/kernels"
for name in ("fast", "rows"):
    extensions.append(Extension(f"systems.moe_infinity.kernels.{name}", [f"{MOE_INF}/{name}.pyx"],
                                depends=[f"{MOE_INF}/fast.h", f"{MOE_INF}/fast_c.pxd"],
                                extra_compile_args=["-O2", "-ffp-contract=off"], optional=True))
# fMoE's eviction edits and trajectory step (systems/fmoe/kernels), the same contract
extensions.append(Extension("systems.fmoe.kernels.fast", ["systems/fmoe/kernels/fast.pyx"],
                            depends=["systems/fmoe/kernels/fast_step.h"],
                            extra_compile_args=["-O3", "-ffp-contract=off"], optional=True))

# The oracle's Belady plan (systems/oracle/rule.py keeps the python reference)
extensions.append(Extension("systems.oracle.kernels.plan", ["systems/oracle/kernels/plan.pyx"],
                            extra_compile_args=["-O2"], optional=True))

if os.environ.get("MOEBENCH_NO_EXTENSIONS") == "1":
    setup(ext_modules=[])
else:
    from Cython.Build import cythonize  # a build requirement (pyproject.toml) of this path only

    setup(ext_modules=cythonize(extensions, language_level=3, quiet=True))
