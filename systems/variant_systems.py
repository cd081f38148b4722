"""The classes of the named variants (systems/variants.py): each is its seed system's class
with a name of its own, so result.json, tables and goldens tell the variant from the seed. The
rule differences are only knob values, set in the variant's conf/system/<name>.yaml; the class
defaults are the seed class's (constructor defaults, not the paper rule: the seed's yaml sets
the paper's values explicitly)."""

from __future__ import annotations

from systems.diff_moe import DiffMoE
from systems.fmoe import FMoE
from systems.moe_infinity import MoEInfinity


class MoEInfinityHysteresis(MoEInfinity):
    name = "moe_infinity_hysteresis"
    label = ("MoE-Infinity + ours: own-EAM blend, admission hysteresis, top-4 matches, "
             "refetch guard")


class FMoEAdmission(FMoE):
    name = "fmoe_admission"
    label = "fMoE + ours: prefetch admission margin, smoothed count maps, like-kind matching"


class DiffMoEFloorRecency(DiffMoE):
    name = "diff_moe_floor_recency"
    label = "Diff-MoE + ours: priority floor, recency term in the next-layer predictor"
