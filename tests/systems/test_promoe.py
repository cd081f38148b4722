"""The promoe prefetcher (systems/prefetchers/promoe.py): its proposals on a tiny trace worked
out by hand, that it reads nothing past the running layer, and that it runs with every
evictor of the zoo."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FixedBackend, meta_for, tiny_model
from test_evictor_zoo import hit_miss, synthetic, system_for
from zoo_reference import blocks_of

from core.blocks import BlockIndex
from core.knobs import KnobError
from core.paths import PROJECT_ROOT
from core.trace import trace_from_routing
from core.view import IterationInfo, RoutingView, SystemContext
from harness.sim.engine import Engine
from systems.prefetchers.promoe import ProMoEPrefetch

L, E = 4, 4  # layers, experts; top-1 so one token picks one expert per layer


def _trace(routing, spec=None):
    """One request, one prompt token (a prefill step only): `routing` [layer] -> expert;
    `spec` [layer] -> the guess for layer + 1 (E at the last layer: none)."""
    model = tiny_model(layers=L, experts=E, top_k=1)
    req = {"id": "r", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
           "routing": [[[[e]] for e in routing]]}
    tr = trace_from_routing(meta_for(model), [req])
    if spec is not None:
        tr.spec_topk = np.array(spec, dtype=tr.topk.dtype).reshape(-1, 1)
        tr._sha = None
        tr.validate()
    return model, tr


def _calibration():
    """Four prompt tokens, token t on expert (t + l) % 4 at layer l: every expert once per
    layer, each followed by the next id. With smoothing 1 and a uniform popularity prior of
    1/4, T[l][i, i+1] = (1 + 1/4) / (1 + 1) = 0.625 and every other entry 0.125 / 1 / 2 =
    0.125 (a row sums to 1)."""
    model = tiny_model(layers=L, experts=E, top_k=1)
    req = {"id": "c", "prompt_len": 4, "output_len": 1, "arrival_ms": 0.0,
           "routing": [[[[(t + layer) % E] for t in range(4)] for layer in range(L)]]}
    return trace_from_routing(meta_for(model), [req])


def _prefetcher(fields=(), slots=16, **knobs):
    pf = ProMoEPrefetch(train_prefill_stride=1, **knobs)
    pf.bind(SystemContext(L, E, 1, 1, slots, slots, 1, ("decoder",) * L, tuple(fields)))
    pf.warmup(_calibration())
    return pf


def _proposals(pf, trace):
    """The proposal after each layer of the trace's one step, read through the engine's view."""
    view, it, out = RoutingView(BlockIndex(trace)), IterationInfo(0, "prefill", ((0, 0),), 0.0), []
    for layer in range(L):
        expert = int(trace.topk[layer, 0])
        pf.on_layer_routed(view.reveal(it, layer, [expert], [1], {0: layer}), 0.0)
        out.append(pf.propose(0.0))
    return out


def test_fitted_transition_is_the_hand_value():
    T = _prefetcher().pred.T
    assert T[0][0].tolist() == [0.125, 0.625, 0.125, 0.125]
    assert T[2][3].tolist() == [0.625, 0.125, 0.125, 0.125]


def test_transition_only_proposes_the_chain_three_layers_ahead():
    # Expert 0 at layer 0: layer 1 belief T[0][0] = [.125, .625, .125, .125] -> 1; pushed
    # through T: b[j] = .125 + .5 b[j - 1] -> [.1875, .1875, .4375, .1875] -> 2 at layer 2,
    # [.21875, .21875, .21875, .34375] -> 3 at layer 3. Keys layer * 4 + id: 5, 10, 15.
    _, tr = _trace([0, 1, 2, 3])
    assert _proposals(_prefetcher(), tr) == [[5, 10, 15], [10, 15], [15], []]


def test_the_guess_outweighs_the_transition_at_half_weight():
    # The guess at layer 0 names expert 2 for layer 1: b = .5 T[0][0] + .5 [0, 0, 1, 0] =
    # [.0625, .3125, .5625, .0625] -> 2; then [.15625, .15625, .28125, .40625] -> 3 and
    # [.328125, .203125, .203125, .265625] -> 0: keys 6, 11, 12.
    _, tr = _trace([0, 1, 2, 3], spec=[2, 2, 3, E])
    pf = _prefetcher(fields=("spec_topk",))
    first = _proposals(pf, tr)[0]
    assert first == [6, 11, 12]
    # spec_weight 0 ignores the guess: the transition chain again
    pf0 = _prefetcher(fields=("spec_topk",), spec_weight=0.0)
    assert _proposals(pf0, tr)[0] == [5, 10, 15]


def test_stride_cap_and_resident_copies():
    _, tr = _trace([0, 1, 2, 3])
    assert _proposals(_prefetcher(stride=1), tr)[0] == [5]
    assert _proposals(_prefetcher(slots=3), tr)[0] == [5, 10]  # 3 slots less the step's 1
    assert _proposals(_prefetcher(max_proposal=1), tr)[0] == [5]
    pf = _prefetcher()
    pf.on_insert(10, False, 0.0)  # resident: left out of the proposal
    assert _proposals(pf, tr)[0] == [5, 15]
    pf.on_evict(10, 0.0)
    assert _proposals(pf, tr)[0] == [5, 10, 15]


def test_knobs_are_checked():
    for knobs, key in (({"stride": 0}, "stride"), ({"spec_weight": 1.5}, "spec_weight"),
                       ({"max_proposal": 0}, "max_proposal"), ({"smoothing": 0}, "smoothing")):
        with pytest.raises(KnobError, match=f"^{key}"):
            ProMoEPrefetch(**knobs)


class Logged(ProMoEPrefetch):
    """Records (iteration, layer, proposal) after every layer."""

    def bind(self, ctx):
        super().bind(ctx)
        self.log = []

    def on_layer_routed(self, routing, now_ms):
        super().on_layer_routed(routing, now_ms)
        self.log.append((routing.iteration.index, routing.layer, self.proposal))


def _engine_log(trace):
    from systems.composed import Composed
    from systems.evictors.lru import LRUEvictor

    model = tiny_model(layers=L, experts=E, top_k=1)
    pf = Logged(train_prefill_stride=1)
    system = Composed(evictor=LRUEvictor(), prefetcher=pf)
    engine = Engine(model, FixedBackend(), trace, system, capacity_bytes=8 * model.expert_bytes)
    system.warmup(_calibration())
    engine.run()  # the engine's RoutingView raises if anything reads past the running layer
    return pf.log


def test_proposals_do_not_depend_on_later_layers():
    # One request (2 prompt tokens, 3 steps); the second trace moves the prefill step's
    # experts at layers 2 and 3 by one. What was proposed at layers 0 and 1 is the same.
    def trace(shift):
        req = {"id": "r", "prompt_len": 2, "output_len": 3, "arrival_ms": 0.0,
               "routing": [[[[(s + layer + (shift if s == 0 and layer >= 2 else 0)) % E]]
                            * (2 if s == 0 else 1) for layer in range(L)] for s in range(3)]}
        return trace_from_routing(meta_for(tiny_model(layers=L, experts=E, top_k=1)), [req])

    a, b = _engine_log(trace(0)), _engine_log(trace(1))
    assert [x[:2] for x in a] == [(i, layer) for i in range(3) for layer in range(L)]
    assert a[:2] == b[:2] and a[0][2] == [5, 10, 15]
    assert a != b  # the change does matter from layer 2 on


@pytest.mark.parametrize("evictor", sorted(
    p.stem for p in (PROJECT_ROOT / "conf" / "system" / "evictor").glob("*.yaml")))
def test_runs_with_every_evictor(evictor):
    from workloads.synthetic import SyntheticConfig, generate_trace

    model, trace = synthetic(1)
    calib = generate_trace(model, SyntheticConfig(num_requests=3, prompt_len=5, output_len=6,
                                                  seed=1, split="calibration"))
    system = system_for(evictor, "promoe")
    assert system.prefetcher.name == "promoe" and system.needs_calibration()
    steps = [keys for _, _, keys in blocks_of(trace)]
    engine = Engine(model, FixedBackend(), trace, system,
                    capacity_bytes=(max(map(len, steps)) + 2) * model.expert_bytes)
    system.warmup(calib)
    hits, misses = hit_miss(engine.run().tables())
    assert hits + misses == sum(map(len, steps)) and hits > 0
