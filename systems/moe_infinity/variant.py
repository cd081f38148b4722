"""The named variant of moe_infinity (systems/variants.py, the registry of every variant): the seed
class with a name of its own, so result.json, tables and goldens tell the variant from the
seed. The rule differences are only knob values, set in conf/system/moe_infinity_hysteresis.yaml;
the class defaults are the seed class's (the seed's yaml sets the paper's values)."""

from __future__ import annotations

from systems.moe_infinity.system import MoEInfinity


class MoEInfinityHysteresis(MoEInfinity):
    name = "moe_infinity_hysteresis"
    label = ("MoE-Infinity + ours: own-EAM blend, admission hysteresis, top-4 matches, "
             "refetch guard")
