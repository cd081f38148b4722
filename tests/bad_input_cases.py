"""The bad-input cases that tests/runner/test_bad_inputs.py runs through the real CLI.

CASES is a flat list; append a Case to add one (config cases included). `{dir}` in argv is
the case's own folder, `{results}` the shared results folder; import-routing writes its
output under `{results}`, so a file written by mistake shows up in the snapshot.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from helpers import rewrite_trace, set_array, set_header

from core.trace import trace_from_routing, write_trace

RUN = ("results_dir={results}", "progress=false", "system=on_demand")  # a plain run's tail
L, E, K = 26, 64, 6  # deepseek_v2_lite, the model of every case


@dataclass(frozen=True)
class Case:
    id: str
    files: dict  # name -> text, bytes, or a function(path) that writes the file
    argv: tuple[str, ...]
    error: str  # regex searched in stderr


# ---- import-routing inputs ------------------------------------------------------------------
def _rec(pos=0, layer=0, **kw) -> dict:
    return {"request_id": "q", "layer": layer, "token_pos": pos, "experts": [0, 1, 2, 3, 4, 5],
            "weights": [0.5, 0.1, 0.1, 0.1, 0.1, 0.1], **kw}


def _jsonl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _imp(name: str, content, error: str, case_id: str) -> Case:
    return Case(case_id, {name: content}, ("import-routing", "{dir}/" + name,
                                           "{results}/out.npz", "--model", "deepseek_v2_lite"),
                error)


def _nested(experts) -> str:
    good = [[[0, 1, 2, 3, 4, 5]]] * L
    return _jsonl({"prompt_id": 1, "experts": good}, {"prompt_id": 2, "experts": experts})


def _complete_but(missing_layer: int) -> str:
    """Position 0 at every layer, position 1 at every layer but one."""
    return _jsonl(*[_rec(0, lay) for lay in range(L)],
                  *[_rec(1, lay) for lay in range(L) if lay != missing_layer])


def _reproduce(options: tuple[str, ...], error: str, case_id: str) -> Case:
    return Case(case_id, {}, ("reproduce", "eamc_capacity", "--results", "{results}", *options),
                error)


NAN = float("nan")
IMPORTS = [
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, weights=[NAN, .1, .1, .1, .1, .1])),
         r"in\.jsonl:2: field 'weights': nan is not a finite number", "import-weight-nan"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, weights=[float("inf")] * 6)),
         r"in\.jsonl:2: field 'weights': inf is not a finite number", "import-weight-inf"),
    _imp("in.jsonl", _jsonl(_rec(0, weights=[-7, .1, .1, .1, .1, .1])),
         r"in\.jsonl:1: field 'weights': -7 is not a finite number in \[0, 65504\]",
         "import-weight-negative"),
    _imp("in.jsonl", _jsonl(_rec(0, weights=[True] * 6)),
         r"in\.jsonl:1: field 'weights': expected a list of numbers", "import-weight-bool"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, weights=None)),
         r"in\.jsonl:2: field 'weights' missing, but line 1 has them", "import-weight-missing"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, experts=[3.7, 1, 2, 3, 4, 5])),
         r"in\.jsonl:2: field 'experts': 3\.7 is not an integer expert id", "import-id-float"),
    _imp("in.jsonl", _jsonl(_rec(0, experts=[True, 1, 2, 3, 4, 5])),
         r"in\.jsonl:1: field 'experts': True is not an integer expert id", "import-id-bool"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, experts=[-1, 1, 2, 3, 4, 5])),
         r"in\.jsonl:2: field 'experts': expert id -1 out of range \[0, 64\)",
         "import-id-negative"),
    _imp("in.jsonl", _jsonl(_rec(0, experts=[64, 1, 2, 3, 4, 5])),
         r"in\.jsonl:1: field 'experts': expert id 64 out of range \[0, 64\)",
         "import-id-too-big"),
    _imp("in.jsonl", _jsonl(_rec(0, experts="0 1 2 x 4 5")),
         r"in\.jsonl:1: field 'experts': 'x' is not an integer", "import-id-text"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(1, experts=[0, 1, 2, 3, 4])),
         r"in\.jsonl:2: field 'experts': 5 ids, expected 6", "import-id-count"),
    _imp("in.jsonl", _jsonl(_rec(0, layer=1.5)), r"in\.jsonl:1: field 'layer': 1\.5 is not an "
                                                 r"integer", "import-layer-float"),
    _imp("in.jsonl", _jsonl(_rec(-2)), r"in\.jsonl:1: field 'position': -2 < 0",
         "import-position-negative"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(True)), r"in\.jsonl:2: field 'position': True is not "
                                                  r"an integer", "import-position-bool"),
    _imp("in.jsonl", _jsonl({"token_pos": 0, "experts": [0, 1, 2, 3, 4, 5]}),
         r"in\.jsonl:1: field 'layer' missing", "import-layer-missing"),
    _imp("in.jsonl", _jsonl(_rec(0), "[1, 2, 3]"),
         r"in\.jsonl:2: expected a JSON object \(one record\), got list", "import-not-object"),
    _imp("in.jsonl", _jsonl(_rec(0), "{not json"), r"in\.jsonl:2: not valid JSON",
         "import-bad-json"),
    _imp("in.jsonl", _jsonl(_rec(0, prompt=7)),
         r"in\.jsonl:1: field 'prompt': expected a string or null, got int", "import-prompt-int"),
    _imp("in.jsonl", _jsonl(_rec(0), _rec(0)), r"in\.jsonl:2: request 'q' layer 0 position 0 "
                                               r"appears twice", "import-duplicate"),
    _imp("in.jsonl", "\n\n", r"in\.jsonl: no records", "import-empty"),
    _imp("in.jsonl.gz", b"\x1f\x8b" + b"\0" * 20, r"in\.jsonl\.gz: cannot read",
         "import-gzip-corrupt"),
    _imp("in.jsonl", _nested([[[0, 1, 2, 3, 4, 5.5]]] * L),
         r"in\.jsonl:2: field 'experts': expected \[layer\]\[token\]\[k\] integers",
         "import-nested-float"),
    _imp("in.jsonl", _nested([[[0, 1, 2, 3, 4, -1]]] * L),
         r"in\.jsonl:2: field 'experts': expert id -1 out of range \[0, 64\)",
         "import-nested-negative"),
    _imp("in.jsonl", _nested([[[0, 1, 2, 3, 4, 99]]] * L),
         r"in\.jsonl:2: field 'experts': expert id 99 out of range \[0, 64\)",
         "import-nested-too-big"),
    _imp("in.csv", "layer,token_pos,experts\n0,0,0 1 2 3 4 5\n0,1,0 1 2 3.7 4 5\n",
         r"in\.csv:3: field 'experts': '3\.7' is not an integer", "import-csv-id-float"),
    _imp("in.csv", "layer,token_pos,experts,weights\n0,0,0 1 2 3 4 5,nan 1 1 1 1 1\n",
         r"in\.csv:2: field 'weights': 'nan' is not a finite number", "import-csv-weight-nan"),
    _imp("in.jsonl", _complete_but(missing_layer=25),
         r"in\.jsonl: request 'q': no record for layer 25 position 1", "import-gap"),
    _imp("in.jsonl", _jsonl(_rec(0, 0), _rec(0, 1)),
         r"in\.jsonl: request 'q': 2 layers of top-6; the model needs 26 MoE layers",
         "import-layer-count"),
    Case("import-gzip-bomb", {"bomb.jsonl.gz": lambda path: path.write_bytes(
        gzip.compress(b" " * 100 * 2**20, compresslevel=9))},
         ("import-routing", "{dir}/bomb.jsonl.gz", "{results}/out.npz", "--model",
          "deepseek_v2_lite"), r"bomb\.jsonl\.gz: inflates to more than \d+ bytes"),
]


# ---- trace files ----------------------------------------------------------------------------
def _good_trace(embeddings: bool = False):
    req = {"id": "r0", "dataset": "d", "task": "t", "prompt_len": 1, "output_len": 1,
           "routing": [[[list(range(K))]] * L]}
    meta = {"num_moe_layers": L, "num_experts": E, "top_k": K,
            "moe_layer_stacks": ["decoder"] * L, "synthetic": True}
    tr = trace_from_routing(meta, [req, {**req, "id": "r1"}])
    if embeddings:
        tr.embeddings = np.ones((2, 4), np.float16)
        tr.has_embedding, tr.meta["embedder"] = np.array([True, True]), "test"
    return tr.validate()


def _npz(edit=None, embeddings: bool = False, compressed: bool = False):
    """A writer of the good trace edited by `edit` (helpers.rewrite_trace)."""
    def write(path: Path) -> None:
        write_trace(_good_trace(embeddings), path)
        rewrite_trace(path, path, edit or (lambda arrays, head: None), compressed)
    return write


def _other_model(path: Path) -> None:
    """A valid trace of a 2-layer, 4-expert top-1 model."""
    meta = {"num_moe_layers": 2, "num_experts": 4, "top_k": 1,
            "moe_layer_stacks": ["decoder"] * 2}
    write_trace(trace_from_routing(meta, [{"id": "r", "prompt_len": 1, "output_len": 1,
                                           "routing": [[[[0]], [[1]]]]}]), path)


def _trace(writer, error: str, case_id: str, command: str = "run") -> Case:
    argv = (("characterize", "{dir}/bad.npz") if command == "characterize"
            else ("routing={dir}/bad.npz", *RUN))
    return Case(case_id, {"bad.npz": writer}, argv, error)


TRACES = [
    _trace(_npz(lambda a, h: [1, 2]),
           r"bad\.npz: field 'header_json': expected a JSON object, got list",
           "trace-header-list"),
    _trace(_npz(set_header("meta", 5)), r"bad\.npz: field 'meta': expected a JSON object, got int",
           "trace-meta-int"),
    _trace(_npz(set_header("requests", [])),
           r"bad\.npz: field 'requests': expected a JSON object, got list",
           "trace-requests-list"),
    _trace(_npz(set_header("requests.id", [1, 2])),
           r"bad\.npz: field 'request_ids': entry 0 is 1, expected a string", "trace-ids-ints"),
    _trace(_npz(set_header("meta.version", 1.0)),
           r"bad\.npz: field 'meta\.version': expected a string", "trace-version-number"),
    _trace(_npz(set_array("embeddings", np.full((2, 4), np.nan, np.float16)), embeddings=True),
           r"bad\.npz: request 'r0' \(index 0\): field 'embeddings': values must be finite",
           "trace-embeddings-nan"),
    _trace(_npz(set_array("has_embedding", np.ones(2, np.int8)), embeddings=True),
           r"bad\.npz: field 'has_embedding': dtype int8, expected bools",
           "trace-has-embedding-int"),
    _trace(_npz(set_array("prompt_len", np.ones(2))),
           r"bad\.npz: field 'prompt_len': dtype float64, expected integers",
           "trace-lengths-float"),
    _trace(_npz(set_array("probs", np.zeros(50_000_000, np.float16)), compressed=True),
           r"bad\.npz: field 'probs': 100000128 bytes uncompressed .* more than the \d+ bytes "
           r"left", "trace-zip-bomb"),
    _trace(_npz(lambda a, h: a.pop("topk") is None), r"bad\.npz: field 'topk' missing",
           "trace-topk-missing"),
    _trace(_npz(set_array("arrival_ms", np.array([0.0, 1.0]))),
           r"bad\.npz: field 'meta\.content_sha256' does not match", "trace-edited"),
    _trace(b"PK\x03\x04 not really a zip", r"bad\.npz: not a readable trace file",
           "trace-not-zip"),
    _trace(_npz(set_array("header_json", np.frombuffer(b"[" * 200_000 + b"]" * 200_000,
                                                       np.uint8))),
           r"bad\.npz: field 'header_json' nests deeper than this reader follows",
           "trace-header-nested-200000"),
    _trace(lambda path: write_trace(trace_from_routing(
        {"num_moe_layers": L, "num_experts": E, "top_k": K,
         "moe_layer_stacks": ["decoder"] * L}, []), path),
        r"bad\.npz: field 'prompt_len': the trace holds no request", "trace-zero-requests"),
    _trace(_npz(set_header("meta.num_moe_layers", 2)),
           r"bad\.npz: field 'meta\.moe_layer_stacks': expected 2 entries", "trace-shape"),
    _trace(_other_model, r"bad\.npz: field 'meta\.num_moe_layers' is 2; model "
                         r"deepseek_v2_lite needs 26", "trace-other-model"),
    _trace(_npz(lambda a, h: [1, 2]),
           r"bad\.npz: field 'header_json': expected a JSON object, got list",
           "characterize-header-list", command="characterize"),
    _trace(_npz(set_array("embeddings", np.full((2, 4), np.inf, np.float16)), embeddings=True),
           r"bad\.npz: request 'r0' \(index 0\): field 'embeddings': values must be finite",
           "characterize-embeddings-inf", command="characterize"),
]


# ---- arrival files (arrivals=azure_conv replays a local CSV, never downloads) ---------------
def _azure(rows: list[str], error: str, case_id: str, header: str = "TIMESTAMP,ContextTokens,"
           "GeneratedTokens", requests: int = 2) -> Case:
    text = header + "\n" + "".join(r + "\n" for r in rows)
    return Case(case_id, {"a.csv": text},
                ("arrivals=azure_conv", "workload.arrivals.path={dir}/a.csv",
                 "workload.arrivals.download=false", f"workload.num_requests={requests}", *RUN),
                error)


T0, T1 = "2023-11-16 18:00:00.0000000", "2023-11-16 18:00:01.0000000"
ARRIVALS = [
    _azure([f"{T0},10,2", f"{T1},1000000000,2"],
           r"a\.csv:3: column ContextTokens: '1000000000' is not an integer in \[1, 1048576\]",
           "azure-context-too-big"),
    _azure([f"{T0},10,1048577", f"{T1},10,2"],
           r"a\.csv:2: column GeneratedTokens: '1048577' is not an integer", "azure-output-big"),
    _azure([f"{T0},1e9,2", f"{T1},10,2"], r"a\.csv:2: column ContextTokens: '1e9'",
           "azure-context-exponent"),
    _azure([f"{T0},10,2.5", f"{T1},10,2"], r"a\.csv:2: column GeneratedTokens: '2\.5'",
           "azure-output-float"),
    _azure([f"{T0},-3,2", f"{T1},10,2"], r"a\.csv:2: column ContextTokens: '-3'",
           "azure-context-negative"),
    _azure([f"{T0},nan,2", f"{T1},10,2"], r"a\.csv:2: column ContextTokens: 'nan'",
           "azure-context-nan"),
    _azure([f"{T0},10,2", "2023-13-16 18:00:01,10,2"], r"a\.csv:3: column TIMESTAMP",
           "azure-timestamp"),
    _azure([f"{T0},10"], r"a\.csv:2: 2 columns; expected 3", "azure-columns"),
    _azure([f"{T0},10,2"], r"a\.csv:1: header is", "azure-header", header="time,in,out"),
    _azure([f"{T0},10,2", f"{T1},10,2"], r"workload\.arrivals: 5 requests from row 0 need 5 "
                                         r"rows; .*a\.csv has 2", "azure-too-few-rows",
           requests=5),
]


# ---- config: system knobs and workload keys (the runner maps KnobError to system.<knob>) ----
def _config(overrides: tuple[str, ...], error: str, case_id: str) -> Case:
    return Case(case_id, {}, (*overrides, "results_dir={results}", "progress=false"), error)


CONFIG = [
    _config(("system=lru", "system.slots_per_layer=0"),
            r"system\.slots_per_layer: must be an integer >= 1 or null \(auto\), got 0",
            "knob-lru-slots-zero"),
    _config(("system=lru", "system.slots_per_layer=-4"),
            r"system\.slots_per_layer: must be an integer >= 1 or null \(auto\), got -4",
            "knob-lru-slots-negative"),
    _config(("system=lru", "system.slots_per_layer=100000", "workload.num_requests=2",
             "workload.prompt_len=8"),  # checked at bind, after the (small) trace
            r"system\.slots_per_layer: must be an integer in \[1, 64\] or null \(auto\), got "
            r"100000", "knob-lru-slots-beyond-experts"),
    _config(("system=lru", "system.prefetch=yes"),
            r"system\.prefetch: must be true or false, got 'yes'", "knob-prefetch-text"),
    _config(("system=fmoe", "system.prefetch_distance=0"),
            r"system\.prefetch_distance: must be an integer >= 1, got 0", "knob-fmoe-distance"),
    _config(("system=moe_infinity", "system.own_weight=1.5"),
            r"system\.own_weight: must be a finite number in \[0\.0, 1\.0\], got 1\.5",
            "knob-moe-infinity-own-weight"),
    _config(("system=diff_moe", "system.holdout_fraction=1.0"),
            r"system\.holdout_fraction: must be a finite number in \(0\.0, 1\.0\), got 1\.0",
            "knob-diff-moe-holdout"),
    _config(("system=layer_offload", "system.stream_buffer_layers=0"),
            r"system\.stream_buffer_layers: must be an integer >= 1, got 0",
            "knob-layer-offload-buffer"),
    _config(("system=oracle", "system.lookahead=0"),
            r"system\.lookahead: must be an integer >= 1, got 0", "knob-oracle-lookahead"),
    _config(("system=on_demand", "workload.num_requests=2.7"),
            r"workload\.num_requests: must be an integer >= 1, got 2\.7",
            "workload-num-requests-float"),
    _config(("system=on_demand", "workload.prompt_len=2000000"),
            r"workload\.prompt_len: must be an integer in \[1, 1048576\], got 2000000",
            "workload-prompt-len-bound"),
]

TOP = [  # top-level keys and the result store (harness/runner/runconfig.py, store.py)
    _config(("run_name=../../escaped",), r"run_name: '\.\./\.\./escaped' contains a path "
            r"separator", "store-run-name-up"),
    _config(("run_name={dir}/elsewhere",), r"run_name: .* contains a path separator",
            "store-run-name-absolute"),
    _config(("run_name=.",), r"run_name: '\.' starts with '\.'", "store-run-name-dot"),
    _config(("run_name=",), r"run_name: '' is empty", "store-run-name-empty"),
    _config(("experiment_name=../x",), r"experiment_name: '\.\./x' contains a path separator",
            "store-experiment-name-up"),
    _config(("-m", "system=lru", "experiment_name=../x"),
            r"experiment_name: '\.\./x' contains a path separator", "store-sweep-experiment-up"),
    _config(("+foo=1",), r"foo: unknown top-level key", "config-unknown-key"),
    _config(("seed=1.9",), r"seed: must be an integer >= 0, got 1\.9", "config-seed-float"),
    _config(("seed=abc",), r"seed: must be an integer >= 0, got 'abc'", "config-seed-text"),
    _config(("seed=true",), r"seed: must be an integer >= 0, got True", "config-seed-bool"),
    _config(("max_batch=1.5",), r"max_batch: must be an integer >= 1, got 1\.5",
            "config-max-batch-float"),
    _config(("calibration_requests=0",), r"calibration_requests: must be an integer >= 1, "
            r"got 0", "config-calibration-requests-zero"),
    Case("config-progress-text", {}, ("progress=maybe", "results_dir={results}"),
         r"progress: must be true or false, got 'maybe'"),
    _config(("expert_cache_gb=-1",), r"expert_cache_gb: must be a finite number > 0",
            "config-expert-cache-negative"),
    _config(("workload.arrival_ms=nan",), r"workload\.arrival_ms: must be a finite number",
            "config-arrival-nan"),
    _config(("hardware.h2d_gbps=inf",), r"hardware\.h2d_gbps: must be a finite number",
            "config-h2d-inf"),
    _config(("routing={dir}/absent.npz",), r"routing: .*absent\.npz: no such file",
            "config-routing-missing"),
    # keys applied around a run (timers, BLAS threads) are checked before anything is applied
    _config(("timeout_s=-1",), r"timeout_s: must be a finite number > 0", "config-timeout-neg"),
    _config(("timeout_s=abc",), r"timeout_s: must be a finite number", "config-timeout-text"),
    _config(("timeout_s=[1,2]",), r"timeout_s: must be a finite number", "config-timeout-list"),
    _config(("blas_threads=abc",), r"blas_threads: must be an integer >= 1",
            "config-blas-threads-text"),
    _config(("run_name='" + "é" * 150 + "'",), r"run_name: .* 300 bytes in UTF-8, more than 200",
            "store-run-name-bytes"),
    _config(("-m", "system=lru,on_demand", "run_name=same"),
            r"run_name: 'same' names 1 folder\(s\) for a sweep of 2 jobs",
            "sweep-shared-run-name"),
    _config(("routing={dir}/t.npz", "workload.num_requests=40"),
            r"workload\.num_requests: routing=FILE replays every request", "routing-num-requests"),
    Case("import-output-folder", {"in.jsonl": _jsonl(_rec())},
         ("import-routing", "{dir}/in.jsonl", "{results}", "--model", "deepseek_v2_lite"),
         r"is a folder; give the trace file to write"),
    Case("import-output-is-input", {"in.jsonl": _jsonl(_rec())},
         ("import-routing", "{dir}/in.jsonl", "{dir}/in.jsonl", "--model", "deepseek_v2_lite"),
         r"in\.jsonl: is the input file"),
    Case("table1-partial", {}, ("table1", "{results}/default"),
         r"partial: no run for .*oracle.*--allow-partial"),
    Case("table1-malformed", {"runs/bad/result.json": "{not json"}, ("table1", "{dir}/runs"),
         r"runs/bad/result\.json: not a readable result\.json"),
    Case("table1-no-runs", {"runs/.x.tmp-h-1/result.json": "{}"}, ("table1", "{dir}/runs"),
         r"no \*/result\.json"),
    # `moebench reproduce`: its launcher and seed options are checked before any run
    _reproduce(("--launcher", "slurm"), r"argument --launcher: invalid choice: 'slurm'",
               "reproduce-unknown-launcher"),
    _reproduce(("--seeds", "0"), r"--seeds: 0; between 1 and 5", "reproduce-seeds-zero"),
    _reproduce(("--seeds", "6"), r"--seeds: 6; between 1 and 5", "reproduce-seeds-too-many"),
    _reproduce(("--seeds", "two"), r"argument --seeds: invalid int", "reproduce-seeds-text"),
    _reproduce(("--launcher-arg", "n_jobs"), r"--launcher-arg: 'n_jobs' is not KEY=VALUE",
               "reproduce-launcher-arg-no-value"),
    _reproduce(("--launcher-arg", "n_jobs=1,2"),
               r"--launcher-arg: 'n_jobs=1,2': one value, not a sweep",
               "reproduce-launcher-arg-sweep"),
    _reproduce(("--jobs", "0"), r"--jobs: 0; at least 1", "reproduce-jobs-zero"),
]

CASES = IMPORTS + TRACES + ARRIVALS + CONFIG + TOP
