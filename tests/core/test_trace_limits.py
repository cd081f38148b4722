"""Reading untrusted trace files: JSON types of the header, dtypes and values of the arrays,
unknown members never decompressed, every known member's size bounded before it is.

The traces are written by hand (two requests, each prompt 2 and output 2, 2 layers of top-1
over 4 experts: 2 + 2 + 1 + 1 = 6 rows each); every expected message is written out here.
"""

from __future__ import annotations

import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import rewrite_trace, set_array, set_header

from core.trace import TraceError, read_trace, trace_from_routing, write_trace
from core.trace_file import READ_EXPANSION, READ_FLOOR_BYTES

META = {"num_moe_layers": 2, "num_experts": 4, "top_k": 1,
        "moe_layer_stacks": ["decoder", "decoder"], "synthetic": True}


def _trace(embeddings: bool = False):
    req = {"id": "r0", "dataset": "d", "task": "t", "prompt_len": 2, "output_len": 2,
           "prompt": "hi", "routing": [[[[0], [1]], [[2], [3]]], [[[1]], [[0]]]]}
    tr = trace_from_routing(dict(META), [req, {**req, "id": "r1", "prompt": None}])
    if embeddings:
        tr.embeddings = np.ones((2, 3), np.float16)
        tr.has_embedding, tr.meta["embedder"] = np.array([True, True]), "test"
    return tr.validate()


def _arrays(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _rewrite(tmp_path: Path, edit, embeddings: bool = False, name: str = "x.npz") -> Path:
    """The good trace, written and then edited (helpers.rewrite_trace)."""
    src = tmp_path / "ok.npz"
    write_trace(_trace(embeddings), src)
    return rewrite_trace(src, tmp_path / name, edit)


def _set_header(value):
    return lambda arrays, head: value



# (case, edit, message after "x.npz: ", written by hand)
BAD_FILES = [
    ("header-list", _set_header([1, 2]), "field 'header_json': expected a JSON object, got list"),
    ("header-string", _set_header("trace"),
     "field 'header_json': expected a JSON object, got str"),
    ("meta-int", set_header("meta", 5), "field 'meta': expected a JSON object, got int"),
    ("requests-list", set_header("requests", [["r0"]]),
     "field 'requests': expected a JSON object, got list"),
    ("requests-id-string", set_header("requests.id", "r0"),
     "field 'requests.id': expected a list, got str"),
    ("requests-task-dict", set_header("requests.task", {"0": "t"}),
     "field 'requests.task': expected a list, got dict"),
    ("requests-prompt-int", set_header("requests.prompt", 7),
     "field 'requests.prompt': expected a list, got int"),
    ("requests-id-ints", set_header("requests.id", [1, 2]),
     "field 'request_ids': entry 0 is 1, expected a string"),
    ("requests-dataset-null", set_header("requests.dataset", ["d", None]),
     "field 'datasets': entry 1 is None, expected a string"),
    ("requests-prompt-int-entry", set_header("requests.prompt", ["hi", 5]),
     "field 'prompts': entry 1 is 5, expected a string or null"),
    ("meta-version-int", set_header("meta.version", 1), "field 'meta.version': expected a string, "
                                                  "got 1"),
    ("meta-format-list", set_header("meta.format", ["moe-offload-bench-trace"]),
     "field 'meta.format': expected a string, got ['moe-offload-bench-trace']"),
    ("meta-sha-missing", lambda a, h: h["meta"].pop("content_sha256") and None,
     "field 'meta.content_sha256': expected a string, got None"),
    ("meta-stacks-dicts", set_header("meta.moe_layer_stacks", [{"a": 1}, "decoder"]),
     "field 'meta.moe_layer_stacks': expected a list of 'encoder'/'decoder'"),
    ("meta-synthetic-string", set_header("meta.synthetic", "no"),
     "field 'meta.synthetic': expected a bool, got 'no'"),
    ("meta-source-int", set_header("meta.routing_source", 3),
     "field 'meta.routing_source': expected a str, got 3"),
    ("meta-experts-string", set_header("meta.num_experts", "4"),
     "field 'meta.num_experts': expected a positive integer, got '4'"),
    ("header-floats", set_array("header_json", np.zeros(3)),
     "field 'header_json': expected uint8 [n] (UTF-8 JSON), got float64 (3,)"),
    ("prompt-len-float", set_array("prompt_len", np.array([2.0, 2.0])),
     "field 'prompt_len': dtype float64, expected integers"),
    ("block-offsets-float", set_array("block_offsets", np.arange(9, dtype=np.float64)),
     "field 'block_offsets': dtype float64, expected integers"),
    ("topk-object", set_array("topk", np.array([[0]] * 12, dtype=object)),
     "field 'topk': dtype object is not a plain bool, integer or float"),
    ("topk-strings", set_array("topk", np.array([["0"]] * 12)),
     "field 'topk': dtype <U1 is not a plain bool, integer or float"),
]


@pytest.mark.parametrize("edit, message", [c[1:] for c in BAD_FILES],
                         ids=[c[0] for c in BAD_FILES])
def test_bad_header_or_array_types_name_the_field(tmp_path, edit, message):
    with pytest.raises(TraceError) as err:
        read_trace(_rewrite(tmp_path, edit))
    assert str(err.value) == f"x.npz: {message}"


@pytest.mark.parametrize("edit, message", [
    (set_array("embeddings", np.array([[1, 1, 1], [1, np.nan, 1]], np.float16)),
     "x.npz: request 'r1' (index 1): field 'embeddings': values must be finite"),
    (set_array("embeddings", np.array([[np.inf, 1, 1], [1, 1, 1]], np.float16)),
     "x.npz: request 'r0' (index 0): field 'embeddings': values must be finite"),
    (set_array("has_embedding", np.array([1, 1], np.uint8)),
     "x.npz: field 'has_embedding': dtype uint8, expected bools"),
    (set_array("embeddings", np.ones((2, 3), np.int16)),
     "x.npz: field 'embeddings': dtype int16, expected floats"),
])
def test_embeddings_must_be_finite_floats(tmp_path, edit, message):
    with pytest.raises(TraceError) as err:
        read_trace(_rewrite(tmp_path, edit, embeddings=True))
    assert str(err.value) == message


def test_unknown_members_are_never_decompressed(tmp_path):
    good = tmp_path / "ok.npz"
    sha = write_trace(_trace(), good)
    path = tmp_path / "extra.npz"
    path.write_bytes(good.read_bytes())
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("junk.npy", b"\0" * 100_000)
        zf.writestr("notes.txt", b"hello")
    raw = bytearray(path.read_bytes())
    start = raw.index(b"junk.npy") + len(b"junk.npy")  # its local header, then its data
    raw[start + 10:start + 60] = b"\xff" * 50  # corrupt the deflate stream of junk.npy
    path.write_bytes(bytes(raw))
    with pytest.raises((zipfile.BadZipFile, zlib.error)):  # it cannot be decompressed ...
        with zipfile.ZipFile(path) as zf:
            zf.read("junk.npy")
    assert read_trace(path).content_sha256() == sha  # ... and the reader never tries


def test_known_member_over_the_budget_is_refused_before_decompressing(tmp_path):
    # 100 MB of zeros deflate to ~0.1 MB: beyond 64 MiB + 32 x the file's size
    good = tmp_path / "ok.npz"
    write_trace(_trace(), good)
    arrays = _arrays(good)
    arrays["probs"] = np.zeros(50_000_000, np.float16)
    np.savez_compressed(tmp_path / "bomb.npz", **arrays)
    del arrays
    size = (tmp_path / "bomb.npz").stat().st_size
    with zipfile.ZipFile(tmp_path / "bomb.npz") as zf:
        declared = zf.getinfo("probs.npy").file_size
        compressed = zf.getinfo("probs.npy").compress_size
        used = sum(zf.getinfo(f"{n}.npy").file_size for n in ("header_json", "prompt_len",
                   "output_len", "arrival_ms", "step_offsets", "block_offsets", "topk"))
    left = READ_FLOOR_BYTES + READ_EXPANSION * size - used
    assert declared > left
    with pytest.raises(TraceError) as err:
        read_trace(tmp_path / "bomb.npz")
    assert str(err.value) == (
        f"bomb.npz: field 'probs': {declared} bytes uncompressed (from {compressed}) is more "
        f"than the {left} bytes left of what this reader decompresses for a file of this size "
        "(docs/trace-format.md, Reading)")


def test_npy_header_must_match_the_member_size(tmp_path):
    # a header claiming 10**9 float64 values over 16 bytes of data: refused, nothing allocated
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**9,)}
    buf = bytearray(b"\x93NUMPY\x01\x00")
    text = repr(header).encode()
    text += b" " * (-(len(buf) + 2 + len(text) + 1) % 64) + b"\n"
    buf += len(text).to_bytes(2, "little") + text + b"\0" * 16
    good = tmp_path / "ok.npz"
    write_trace(_trace(), good)
    lying, dup = tmp_path / "lying.npz", tmp_path / "dup.npz"
    for path, member in ((lying, "weights.npy"), (dup, "topk.npy")):
        path.write_bytes(good.read_bytes())
        with zipfile.ZipFile(path, "a") as zf, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about a duplicate name
            zf.writestr(member, bytes(buf))
    with pytest.raises(TraceError) as err:
        read_trace(lying)
    assert str(err.value) == (f"lying.npz: field 'weights': shape (1000000000,) of float64 "
                              f"does not match the member's size ({len(buf)} bytes)")
    with pytest.raises(TraceError) as err:
        read_trace(dup)
    assert str(err.value) == "dup.npz: field 'topk': stored twice in the archive"


def test_fortran_order_and_big_endian_arrays_read_as_numpy_does(tmp_path):
    tr = _trace(embeddings=True)
    tr.embeddings = np.asfortranarray(np.arange(6, dtype=np.float16).reshape(2, 3))
    tr.arrival_ms = np.array([0.0, 1.5], ">f8")
    path = tmp_path / "orders.npz"
    sha = write_trace(tr, path)
    back = read_trace(path)
    assert back.content_sha256() == sha
    assert back.embeddings.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back.arrival_ms.dtype == np.dtype(">f8") and back.arrival_ms.tolist() == [0.0, 1.5]
