"""The named variant of fmoe (systems/variants.py, the registry of every variant): the seed
class with a name of its own, so result.json, tables and goldens tell the variant from the
seed. The rule differences are only knob values, set in conf/system/fmoe_admission.yaml;
the class defaults are the seed class's (the seed's yaml sets the paper's values)."""

from __future__ import annotations

from systems.fmoe.system import FMoE


class FMoEAdmission(FMoE):
    name = "fmoe_admission"
    label = "fMoE + ours: prefetch admission margin, smoothed count maps, like-kind matching"
