"""Small builders shared by the tests: tiny model specs, fixed-cost backends, random traces,
and a folder's snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.shared_data import ENV_VAR, looked_for, shared_file
from core.specs import model_spec_from_dict
from core.trace import trace_from_routing

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Small committed inputs (tests/data/) and the golden files (tests/golden/)
DATA = TESTS / "data"
GOLDEN = TESTS / "golden"
# The synthetic score knobs before the dataset and group terms (generator version 3), every
# preset knob explicit, so no model's preset supplies one and none is recorded in the meta
# (with the terms off group_decay and group_stay are not used): the traces of the generator
# before workloads/structure.py, and a fixed score model for tests of other mechanisms
BEFORE_STRUCTURE = {"layer_pref_std": 0.13, "task_pref_std": 0.25, "request_pref_std": 0.36,
                    "sticky_std": 0.62, "stickiness": 0.8, "token_noise_std": 1.0,
                    "dataset_pref_std": 0.0, "group_pref_std": 0.0, "groups_per_dataset": 0,
                    "group_decay": 0.9, "group_stay": 0.75, "token_latent_std": 0.0,
                    "embed_noise": 1.0}


def conf_model(name: str):
    """The ModelSpec of conf/model/<name>.yaml (skipped when the file is not there)."""
    import yaml

    path = ROOT / "conf" / "model" / f"{name}.yaml"
    if not path.exists():
        pytest.skip(f"{path.name} not present")
    return model_spec_from_dict(yaml.safe_load(path.read_text()), where=name)


def tiny_model(layers: int = 3, experts: int = 4, top_k: int = 2, name: str = "tiny"):
    """A decoder-only model with every layer MoE; sizes are small round numbers."""
    return model_spec_from_dict({
        "name": name, "display_name": name, "hf_id": "none/tiny", "architecture": "decoder",
        "num_layers": layers, "moe_first_layer": 0, "moe_every": 1, "num_experts": experts,
        "num_shared_experts": 0, "top_k": top_k, "hidden_size": 64, "expert_ffn_size": 128,
        "ffn_matrices": 2, "attention_params_per_layer": 4096, "vocab_size": 100,
        "tie_embeddings": True, "kv_elems_per_token_per_layer": 128, "expert_bits": 16,
        "dense_bits": 16})


class FixedBackend:
    """Constant durations so timelines can be worked out by hand."""

    name = "fixed"

    def __init__(self, dense_ms=1.0, expert_ms=1.0, copy_ms=2.0, iteration_ms=0.0):
        self._dense, self._expert, self._iter = dense_ms, expert_ms, iteration_ms
        self.expert_copy_ms = copy_ms

    def dense_ms(self, layer, n_tokens, kv_tokens, attn_pairs):
        return self._dense

    def expert_ms(self, n_tokens):
        return self._expert

    def iteration_ms(self, n_sequences):
        return self._iter


class EvictableSet:
    """Stand-in for the engine's Candidates in choose_victim unit tests: the evictable keys and
    whether the cache is full."""

    def __init__(self, keys, full: bool = True):
        self.keys, self.full = set(keys), full

    def __contains__(self, key: int) -> bool:
        return key in self.keys


def meta_for(model) -> dict:
    return {"num_moe_layers": model.num_moe_layers, "num_experts": model.num_experts,
            "top_k": model.top_k, "moe_layer_stacks": list(model.moe_layer_stacks),
            "routing_source": "test", "synthetic": True}


def random_trace(model, n_requests: int, prompt_len: int, output_len: int, seed: int,
                 with_spec: bool = False):
    """Uniform random top-k routing (test input only)."""
    rng = np.random.default_rng(seed)
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    reqs = []
    for r in range(n_requests):
        routing = [[[rng.choice(E, k, replace=False) for _ in range(prompt_len if s == 0 else 1)]
                    for _ in range(L)] for s in range(output_len)]
        reqs.append({"id": f"r{r}", "dataset": "test", "task": f"t{r % 2}",
                     "prompt_len": prompt_len, "output_len": output_len, "arrival_ms": 0.0,
                     "routing": routing})
    tr = trace_from_routing(meta_for(model), reqs)
    if with_spec:
        # Next-layer guess = the true routing of the same token at layer + 1 (perfect guesses);
        # block g * L + layer is followed by the same step's next layer at block + 1.
        spec = np.full_like(tr.topk, E)
        off = tr.block_offsets
        for g in range(int(tr.step_offsets[-1])):
            for layer in range(L - 1):
                b = g * L + layer
                spec[off[b]:off[b + 1]] = tr.topk[off[b + 1]:off[b + 2]]
        tr.spec_topk = spec
        tr._sha = None
        tr.validate()
    return tr


def shared(*parts: str):
    """Path of a file under the shared data folder ($MOEBENCH_SHARED_DATA or ../shared/data
    beside the checkout); the calling test skips with the looked-up path when it is absent."""
    path = shared_file(*parts)
    if path is None:
        pytest.skip(f"shared data {looked_for(*parts)} is absent (set {ENV_VAR})")
    return path


# ---- hand-edited trace files (tests of the reader) -------------------------------------------
def rewrite_trace(src, dst, edit, compressed: bool = False):
    """Copy a trace file with numpy, letting `edit(arrays, header)` change it: edit may return
    a new header (any JSON value) or replace arrays["header_json"] itself. src may be dst."""
    with np.load(src, allow_pickle=True) as z:
        arrays = {k: z[k] for k in z.files}
    stored = arrays["header_json"]
    head = json.loads(stored.tobytes().decode())
    head = edit(arrays, head) or head
    if arrays["header_json"] is stored:  # the edit did not replace the member itself
        arrays["header_json"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    with open(dst, "wb") as fh:  # a file object: numpy adds no .npz suffix
        (np.savez_compressed if compressed else np.savez)(fh, **arrays)
    return dst


def set_header(dotted: str, value):
    """An edit for rewrite_trace: header["a"]["b"] = value for dotted "a.b"."""
    def edit(arrays, head):
        *parents, last = dotted.split(".")
        node = head
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


def set_array(name: str, value):
    """An edit for rewrite_trace: store `value` as the member `name`."""
    return lambda arrays, head: arrays.__setitem__(name, value)


def optimal_loads(seq: list[int], slots: int) -> int:
    """Brute force: the fewest loads over every eviction choice, from an empty cache of
    `slots` (exponential: for short hand sequences only; shares nothing with the engine)."""
    states = {frozenset(): 0}
    for key in seq:
        nxt: dict[frozenset, int] = {}
        for cache, cost in states.items():
            if key in cache:
                options = [(cache, cost)]
            elif len(cache) < slots:
                options = [(cache | {key}, cost + 1)]
            else:
                options = [((cache - {v}) | {key}, cost + 1) for v in cache]
            for state, c in options:
                nxt[state] = min(c, nxt.get(state, 1 << 30))
        states = nxt
    return min(states.values())


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under root: equal before and after means
    nothing was written, replaced or removed there."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(Path(root).rglob("*"))}


def with_variants(seed_knobs: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per-system overrides of the seed systems, each named variant (systems/variants.py)
    getting its seed's: a variant runs with its seed's small store too."""
    from systems.variants import VARIANTS

    return {**seed_knobs, **{v: seed_knobs[s] for s, vs in VARIANTS.items() if s in seed_knobs
                             for v in vs}}
