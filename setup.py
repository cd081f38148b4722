"""Builds the compiled engine core (harness/sim/fast_*.pyx, C++ via Cython) and
moe_infinity's and fMoE's kernels (systems/moe_infinity_fast.pyx, systems/moe_infinity_rows.pyx,
systems/fmoe_fast.pyx, C) and the oracle's plan (systems/belady_fast.pyx, C) in place.

Everything else is in pyproject.toml. The extensions are optional: without a C++ compiler
the install still succeeds and the engine runs its pure-Python reference core
(harness/sim/cores.py; `engine_core` in the config), moe_infinity its numpy code,
fMoE its python loops. MOEBENCH_NO_EXTENSIONS=1 builds none of them (and needs no Cython):
tests/test_wheel.py builds its wheel that way, to check what ships in seconds."""

import os

from setuptools import Extension, setup

FAST = ("fast_state", "fast_copies", "fast_step")
# fast_column.h: the recorder's columns (fast_state.pxd), included by all three
extensions = [Extension(f"harness.sim.{name}", [f"harness/sim/{name}.pyx"], language="c++",
                        depends=["harness/sim/fast_column.h", "harness/sim/fast_state.pxd"],
                        extra_compile_args=["-O2"], optional=True) for name in FAST]
# -ffp-contract=off: a * b + c stays two roundings, as in numpy (bit-identical decisions)
# moe_infinity_rows: the batch path's member rows in one call (the same helpers and contract)
for name in ("moe_infinity_fast", "moe_infinity_rows"):
    extensions.append(Extension(f"systems.{name}", [f"systems/{name}.pyx"],
                                depends=["systems/moe_infinity_fast.h",
                                         "systems/moe_infinity_fast_c.pxd"],
                                extra_compile_args=["-O2", "-ffp-contract=off"], optional=True))
# fMoE's eviction edits and trajectory step (systems/fmoe_kernels.py), the same contract
extensions.append(Extension("systems.fmoe_fast", ["systems/fmoe_fast.pyx"],
                            depends=["systems/fmoe_fast_step.h"],
                            extra_compile_args=["-O3", "-ffp-contract=off"], optional=True))

# The oracle's Belady plan (systems/oracle.py keeps the python reference)
extensions.append(Extension("systems.belady_fast", ["systems/belady_fast.pyx"],
                            extra_compile_args=["-O2"], optional=True))

if os.environ.get("MOEBENCH_NO_EXTENSIONS") == "1":
    setup(ext_modules=[])
else:
    from Cython.Build import cythonize  # a build requirement (pyproject.toml) of this path only

    setup(ext_modules=cythonize(extensions, language_level=3, quiet=True))
