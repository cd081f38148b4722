"""Reading a trace v1 file (docs/trace-format.md, "Reading") without trusting its sizes.

`np.load` decompresses whatever an archive member claims to hold, so a 21 MB file with a
zero-filled member inflates to 20 GiB. Here:

- only members named `<array>.npy` for the arrays of the format (and `header_json.npy`) are
  opened; any other member is never decompressed;
- each member's .npy header is read first: a plain bool/int/float dtype, and shape x itemsize
  plus the header exactly the member's declared uncompressed size (zipfile never reads past
  that size, and checks the CRC at its end);
- the members read may add up to at most READ_FLOOR_BYTES + READ_EXPANSION x the file's size,
  checked before each one is decompressed into an array allocated at its checked size;
- the header's JSON types are checked (meta and requests are objects, the request table's
  columns lists) before anything else reads it.

read_trace_file hands back the header and the arrays; core/trace.py's read_trace builds the
Trace from them, then `validate` and the checksum, as for any trace. Every error is a
TraceError naming the file and the field.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib

import numpy as np

from core.trace_format import ARRAY_FIELDS, FORMAT_NAME, FORMAT_VERSION, TraceError

# The synthetic Table 1 trace with every field inflates 1.3x; Switch's top-1 weights (all
# 1.0) 580x but are small. A whole file stays far below 32x; 64 MiB covers small files.
READ_FLOOR_BYTES = 64 * 2**20
READ_EXPANSION = 32
REQUIRED = ("prompt_len", "output_len", "arrival_ms", "step_offsets", "block_offsets", "topk")
_CHUNK_BYTES = 16 * 2**20  # copy size when filling an array from the archive
_UNREADABLE = (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError,
               ValueError)  # zipfile raises the middle ones on corrupt data


class _Members:
    """The known .npy members of an open archive, read within a byte budget."""

    def __init__(self, zf: zipfile.ZipFile, name: str, budget_bytes: int):
        self.zf, self.name, self.left = zf, name, budget_bytes
        self.info: dict[str, zipfile.ZipInfo] = {}
        known = {*ARRAY_FIELDS, "header_json"}
        for info in zf.infolist():
            field = info.filename[:-4] if info.filename.endswith(".npy") else None
            if field in known:
                if field in self.info:
                    raise self._error(field, "stored twice in the archive")
                self.info[field] = info

    def _error(self, field: str, msg: str) -> TraceError:
        return _bad(self.name, field, msg)

    def read(self, field: str) -> np.ndarray | None:
        info = self.info.get(field)
        if info is None:
            return None
        if info.file_size > self.left:
            raise self._error(field, f"{info.file_size} bytes uncompressed (from "
                                     f"{info.compress_size}) is more than the {self.left} bytes "
                                     "left of what this reader decompresses for a file of this "
                                     "size (docs/trace-format.md, Reading)")
        try:
            with self.zf.open(info) as fh:
                arr = self._array(field, info, fh)
        except TraceError:
            raise
        except _UNREADABLE as exc:
            raise self._error(field, f"not a readable .npy member ({exc})") from exc
        self.left -= info.file_size
        return arr

    def declared(self, field: str) -> tuple[tuple[int, ...], np.dtype] | None:
        """(shape, dtype) of a member from its .npy header alone, checked as `read` checks
        it; nothing past the header is decompressed, and the budget is not charged."""
        info = self.info.get(field)
        if info is None:
            return None
        try:
            with self.zf.open(info) as fh:
                shape, _, dtype = self._npy_header(field, info, fh)
        except TraceError:
            raise
        except _UNREADABLE as exc:
            raise self._error(field, f"not a readable .npy member ({exc})") from exc
        return shape, dtype

    def _npy_header(self, field: str, info: zipfile.ZipInfo, fh):
        """(shape, fortran order, dtype) of the member open in `fh`, which is left at the
        first data byte; a plain dtype, and shape x itemsize + header = the member's size."""
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise self._error(field, f".npy format version {version} is not read")
        if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
            raise self._error(field, f"dtype {dtype} is not a plain bool, integer or float")
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if fh.tell() + nbytes != info.file_size:
            raise self._error(field, f"shape {shape} of {dtype} does not match the member's "
                                     f"size ({info.file_size} bytes)")
        return shape, fortran, dtype

    def _array(self, field: str, info: zipfile.ZipInfo, fh) -> np.ndarray:
        shape, fortran, dtype = self._npy_header(field, info, fh)
        count = int(np.prod(shape, dtype=object))
        nbytes = count * dtype.itemsize
        arr = np.empty(count, dtype)
        buf, got = arr.view(np.uint8), 0
        while got < nbytes:
            n = fh.readinto(buf[got:got + _CHUNK_BYTES])
            if not n:
                raise self._error(field, f"truncated: {got} of {nbytes} bytes")
            got += n
        return arr.reshape(shape, order="F" if fortran else "C")


def _bad(name: str, field: str, msg: str) -> TraceError:
    return TraceError(f"{name}: field '{field}': {msg}")


def _header(raw: np.ndarray, name: str) -> tuple[dict, dict]:
    """(meta, requests) of header_json, their JSON types checked."""
    head = _header_json(raw, name)
    for key in ("meta", "requests"):
        if not isinstance(head.get(key), dict):
            raise _bad(name, key, f"expected a JSON object, got {type(head.get(key)).__name__}")
    reqs = head["requests"]
    for key in ("id", "dataset", "task"):
        if key not in reqs:
            raise TraceError(f"{name}: field 'requests.{key}' missing")
    for key in ("id", "dataset", "task", "prompt"):
        col = reqs.get(key)
        if not isinstance(col, list) and not (key == "prompt" and col is None):
            raise _bad(name, f"requests.{key}", f"expected a list, got {type(col).__name__}")
    meta = head["meta"]
    for key in ("format", "version", "content_sha256"):
        if not isinstance(meta.get(key), str):
            raise _bad(name, f"meta.{key}", f"expected a string, got {meta.get(key)!r}")
    return meta, reqs


def _header_json(raw: np.ndarray, name: str) -> dict:
    """header_json parsed: a JSON object from UTF-8 bytes."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise _bad(name, "header_json", f"expected uint8 [n] (UTF-8 JSON), got {raw.dtype} "
                                        f"{raw.shape}")
    try:
        head = json.loads(raw.tobytes().decode())
    except ValueError as exc:  # also UnicodeDecodeError
        raise TraceError(f"{name}: field 'header_json' is not valid ({exc})") from exc
    except RecursionError:  # nested past the parser's stack: no header of the format is
        raise TraceError(f"{name}: field 'header_json' nests deeper than this reader "
                         "follows (not a trace v1 header)") from None
    if not isinstance(head, dict):
        raise _bad(name, "header_json", f"expected a JSON object, got {type(head).__name__}")
    return head


def declared_arrays(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{member: (shape, dtype)} of the format's arrays and header_json in a trace file, from
    their .npy headers alone: what read_trace_file would allocate, known before it does
    (harness/runner/footprint.py). The same checks and messages as read_trace_file's."""
    path = os.fspath(path)
    name = os.path.basename(path)
    try:
        with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
            members = _Members(zf, name, _budget_bytes(fh))
            return {f: members.declared(f) for f in (*ARRAY_FIELDS, "header_json")
                    if f in members.info}
    except TraceError:
        raise
    except _UNREADABLE as exc:
        raise TraceError(f"{name}: not a readable trace file ({exc})") from exc


def _budget_bytes(fh) -> int:
    """What the reader decompresses at most for the open file `fh` (module docstring)."""
    return READ_FLOOR_BYTES + READ_EXPANSION * os.fstat(fh.fileno()).st_size


def read_trace_file(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """(meta, requests, {array: values}) of a trace file, its format and version checked;
    core/trace.py's read_trace validates them and the checksum. Errors name the file."""
    path = os.fspath(path)
    name = os.path.basename(path)
    try:
        with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
            members = _Members(zf, name, _budget_bytes(fh))
            if "header_json" not in members.info:
                raise TraceError(f"{name}: field 'header_json' missing; not a trace v1 file")
            meta, reqs = _header(members.read("header_json"), name)
            if meta["format"] != FORMAT_NAME:
                raise TraceError(f"{name}: field 'meta.format' is {meta['format']!r}, "
                                 f"expected {FORMAT_NAME!r}")
            if meta["version"].split(".")[0] != FORMAT_VERSION.split(".")[0]:
                raise TraceError(f"{name}: field 'meta.version' {meta['version']!r} has an "
                                 f"unknown major version (this reader supports "
                                 f"{FORMAT_VERSION})")
            for key in REQUIRED:
                if key not in members.info:
                    raise TraceError(f"{name}: field '{key}' missing")
            arrays = {key: members.read(key) for key in ARRAY_FIELDS}
    except TraceError:
        raise
    except _UNREADABLE as exc:
        raise TraceError(f"{name}: not a readable trace file ({exc})") from exc
    return meta, reqs, arrays
