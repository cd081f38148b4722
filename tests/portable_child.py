"""One combination of tests/test_portable.py, run in a subprocess whose environment sets the
BLAS kernel and numpy's SIMD features: a small table1-like trace and its calibration split,
every system of conf/system/ on it, and core.numerics on fixed inputs.

    python tests/portable_child.py OUT.json    (cwd: an empty folder; results go to ./res)

OUT.json: {"trace": sha256, "calibration": sha256, "numerics": sha256 of exp/log/draws,
"matching": sha256 of the float scores behind the history systems' choices (decisions flip
only on near-ties, the scores' bits move with any kernel-dependent rounding),
"results": {system: result.json without `timing` and `environment`}}.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from helpers import with_variants

from core import numerics
from core.rng import stream
from core.specs import model_spec_from_dict
from harness.runner.assembly import assemble, load_routing
from harness.runner.config import compose_config, system_names
from harness.runner.run import execute
from systems.fmoe.maps import ExpertMapStore
from systems.moe_infinity.eamc import EAMC, request_eams
from systems.predictor import NextLayerPredictor
from workloads.length_tables import LENGTH_TABLES
from workloads.lengths import draw

# Small enough for a few seconds per combination, large enough that every system decides:
# a cache of ~230 of the 1664 experts forces evictions; small history stores force
# replacements (moe_infinity's cosine, fmoe's RDY).
WORKLOAD = ["experiment=table1", "workload.num_requests=6", "workload.prompt_len=48",
            "workload.output_len=6", "calibration_requests=8", "expert_cache_gb=4",
            "progress=false"]
SEED_KNOBS = {"moe_infinity": ["system.eamc_capacity=5"], "fmoe": ["system.store_capacity=12"]}
PER_SYSTEM = with_variants(SEED_KNOBS)
DROPPED = ("timing", "environment")  # wall-clock times; the machine and its libraries


def numerics_sha() -> str:
    """sha256 of core.numerics' outputs in float32 and float64 on fixed inputs, and of
    fitted request lengths (workloads/lengths.py)."""
    x = np.linspace(-100.0, 100.0, 20001)
    h = hashlib.sha256()
    for out in (numerics.exp(x.astype(np.float32)), numerics.exp(x),
                numerics.log(np.abs(x) + 1e-3), numerics.gumbel(stream(0, "p"), (4096,)),
                numerics.standard_normal(stream(1, "p"), (4096,)),
                draw(LENGTH_TABLES["azure_conv"]["prompt"]["quantiles"], 512, 4096,
                     stream(2, "p"))):
        h.update(out.tobytes())
    return h.hexdigest()


def matching_sha(trace, calib) -> str:
    """sha256 of fmoe's map-store match scores, moe_infinity's EAM cosines and diff_moe's
    next-layer scores, fitted on `calib` and queried with `trace`."""
    L, E, k = trace.num_layers, trace.num_experts, trace.top_k
    h = hashlib.sha256()
    store = ExpertMapStore(12, L, E, 3)
    steps = int(calib.step_offsets[-1])
    req_of = np.repeat(np.arange(calib.num_requests), calib.output_len)
    store.add(calib.probs.reshape(steps, L, E), calib.embeddings[req_of],
              calib.has_embedding[req_of], np.zeros(steps, np.int8))
    emb = trace.embeddings.astype(np.float64)
    for s in range(int(trace.step_offsets[-1])):
        r = int(np.searchsorted(trace.step_offsets, s, side="right")) - 1
        unit_emb = emb[r] / np.sqrt(np.square(emb[r]).sum())
        h.update(np.array([x for m in store.match(trace.probs[s * L:(s + 1) * L], unit_emb)
                           for x in m]).tobytes())
    eamc = EAMC(5, L, E)
    for eam in request_eams(calib):
        eamc.insert(eam)
    for eam in request_eams(trace):
        h.update(eamc.cosine(eam.ravel()).tobytes())
    pred = NextLayerPredictor(L, E, k, tuple(trace.meta["moe_layer_stacks"]))
    h.update(json.dumps(pred.fit(calib), sort_keys=True).encode())
    for row in range(0, len(trace.topk), 7):
        layer = int(np.searchsorted(trace.block_offsets, row, side="right") - 1) % L
        if pred.linked[layer]:
            ids, counts = np.unique(trace.topk[row:row + 3], return_counts=True)
            h.update(pred.scores(layer, ids, counts.tolist(), None).tobytes())
    return h.hexdigest()


def main(out_path: str) -> None:
    base = compose_config(WORKLOAD, results_dir="res")
    model = model_spec_from_dict(base["model"], "model")
    trace = load_routing(base, model, "measure")
    calib = load_routing(base, model, "calibration", base["calibration_requests"])
    out = {"trace": trace.content_sha256(), "calibration": calib.content_sha256(),
           "numerics": numerics_sha(), "matching": matching_sha(trace, calib), "results": {}}
    for name in system_names():
        cfg = compose_config([*WORKLOAD, f"system={name}", *PER_SYSTEM.get(name, [])],
                             run_name=name, results_dir="res")
        run_dir = execute(assemble(cfg)).run_dir
        result = json.loads((run_dir / "result.json").read_text())
        out["results"][name] = {k: v for k, v in result.items() if k not in DROPPED}
    Path(out_path).write_text(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
