"""A run's peak resident memory, estimated from its config before any trace is generated or
read; `check_fits` refuses a run that would not fit (harness/runner/run.py calls it first).

The run's peak is the largest of three phases, each on top of the interpreter and its
libraries (GENERATOR_BASE_BYTES while generating, BASE_BYTES while replaying):

  generate   the measured split with every per-token field, plus the generator's transients
  calibrate  the measured split as the run keeps it, plus the calibration split generated
             (systems with a warm-up only)
  replay     both splits as kept, the engine's block index, the recorder's columns with the
             tables and summary derived from them, and the parquet writer's row group

Trace sizes: harness/runner/footprint_sizes.py (a trace file: its declared array sizes,
core.trace_file.declared_arrays, nothing decompressed). The constants, and the measured peaks
they were fitted to: docs/engine.md, "Memory footprint"; `moebench bench-memory`
(harness/bench/memory.py) measures three settings again against their estimates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.specs import SpecError
from harness.runner.footprint_sizes import TraceSize, file_size, synthetic_size
from harness.runner.parquet_io import ROW_GROUP as WRITER_ROW_GROUP

# Peak RSS of a 1-request run (python, numpy, pyarrow, Hydra, the systems, the next-layer
# guesses' fitting split): 135-165 MiB over the Table 1 systems (fmoe's map store the most).
BASE_BYTES = 150 * 2**20
# The same while its trace is generated, before pyarrow, the engine and the writer: 84-85 MiB.
GENERATOR_BASE_BYTES = 85 * 2**20
INDEX_BYTES_PER_ACCESS = 6  # core/blocks.py: one union entry per access, uint16 id + int32 count
# Recorder columns (29 bytes an access, 49 a transfer), the stored and derived tables, the
# summary's temporaries and a system's own state, per access: fitted with the writer's cost
# below to the measured peaks of 24 runs (docs/engine.md, "Memory footprint").
PER_ACCESS_BYTES = 54
WRITER_BYTES_PER_ROW = 110  # one row group's coded columns and arrow copies (parquet_io.py)
# Refuse when the estimate exceeds this share of MemAvailable. 1.0: the estimate is within
# +-30 % of the peak, so a run refused here would need at least 77 % of all the memory the
# machine has free; a smaller share would refuse runs that fit.
REFUSE_ABOVE_AVAILABLE = 1.0
# Keys tried as the one that drives an estimate, with the Table 1 value each is reset to
# (conf/experiment/table1.yaml), and what its value counts.
DRIVERS = (("workload.num_requests", 290, "requests"), ("workload.prompt_len", 512,
           "prompt tokens"), ("workload.output_len", 32, "output tokens"),
           ("workload.embed_dim", 384, "embedding dimensions"),
           ("calibration_requests", 290, "calibration requests"))


@dataclass(frozen=True)
class Footprint:
    """The estimated peak: its phase and its parts in bytes (summing to total_bytes)."""

    total_bytes: int
    phase: str
    parts: dict


def _synthetic(cfg: dict, model, split: str, requests: int | None, fields, batch: int):
    """TraceSize of a synthetic split, its workload checked as the generator checks it (the
    same WorkloadError naming the key)."""
    from core.targets import build_target
    from workloads.synthetic import SyntheticConfig

    workload = {**cfg["workload"], "split": split, "seed": cfg["seed"]}
    if requests is not None:
        workload["num_requests"] = requests
    w = build_target(workload, "workload")
    if not isinstance(w, SyntheticConfig):
        return None
    w.check()
    return synthetic_size(w, model, fields, batch)


def split_size(cfg: dict, model, system, split: str) -> TraceSize | None:
    """TraceSize of the measured or calibration split (None: no estimate; the reader or the
    generator reports what is wrong)."""
    from core.trace_file import declared_arrays

    path = cfg.get("routing") if split == "measure" else cfg.get("calibration_routing")
    fields = tuple(system.uses_fields)
    if path:
        return file_size(declared_arrays(path), model, fields)
    requests = None if split == "measure" else cfg["calibration_requests"]
    return _synthetic(cfg, model, split, requests, fields, int(cfg["max_batch"]))


def estimate(cfg: dict, model, system) -> Footprint | None:
    """The run's estimated peak RSS, or None where the measured split has no estimate."""
    trace = split_size(cfg, model, system, "measure")
    calib = split_size(cfg, model, system, "calibration") if system.needs_calibration() \
        else None
    if trace is None:
        return None
    kept_calib = calib.kept_bytes if calib is not None else 0
    engine = (trace.accesses * (INDEX_BYTES_PER_ACCESS + PER_ACCESS_BYTES)
              + min(trace.accesses, WRITER_ROW_GROUP) * WRITER_BYTES_PER_ROW)
    base = "interpreter and libraries"
    phases = [("generating the trace", {"trace": trace.full_bytes + trace.build_bytes,
                                        base: GENERATOR_BASE_BYTES}),
              ("replaying the trace", {"trace": trace.kept_bytes, "calibration": kept_calib,
                                       "engine and recorder": engine, base: BASE_BYTES})]
    if calib is not None:
        phases.append(("generating the calibration split", {
            "trace": trace.kept_bytes, "calibration": calib.full_bytes + calib.build_bytes,
            base: GENERATOR_BASE_BYTES}))
    phase, parts = max(phases, key=lambda p: sum(p[1].values()))
    parts = {k: int(v) for k, v in parts.items() if v}
    return Footprint(sum(parts.values()), phase, parts)


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux): memory a new process can use without swapping;
    None where it cannot be read (the check is then skipped)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _get(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set(cfg: dict, key: str, value) -> dict:
    """A copy of cfg with the dotted key set (the dicts on its path copied)."""
    head, _, rest = key.partition(".")
    return {**cfg, head: _set(cfg[head], rest, value) if rest else value}


def driver(cfg: dict, model, system, total_bytes: int) -> tuple[str, object, str]:
    """(key, value, what it counts) of the key whose Table 1 value would lower the estimate
    most; a trace file when one drives it."""
    best = None
    for key, reference, noun in DRIVERS:
        value = _get(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= reference:
            continue
        lower = estimate(_set(cfg, key, reference), model, system)
        saved = total_bytes - (lower.total_bytes if lower is not None else total_bytes)
        if best is None or saved > best[0]:
            best = (saved, key, value, noun)
    if best is not None:
        return best[1:]
    for key in ("routing", "calibration_routing"):
        if cfg.get(key):
            return key, Path(cfg[key]).name, ""
    return "workload.num_requests", _get(cfg, "workload.num_requests"), "requests"


def size_text(n: float) -> str:
    """Bytes in binary units: 3.2 TiB, 21.3 GiB, 150 MiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def check_fits(cfg: dict, model, system, available: int | None = None) -> Footprint | None:
    """Raise SpecError naming the key that drives the estimate when the run's estimated peak
    is above REFUSE_ABOVE_AVAILABLE x the machine's available memory; else the estimate."""
    fp = estimate(cfg, model, system)
    available = available_bytes() if available is None else available
    if fp is None or available is None or fp.total_bytes <= REFUSE_ABOVE_AVAILABLE * available:
        return fp
    key, value, noun = driver(cfg, model, system, fp.total_bytes)
    parts = ", ".join(f"{name} {size_text(b)}" for name, b in fp.parts.items())
    raise SpecError(f"{key}: {value}{' ' + noun + ' need' if noun else ' needs'} about "
                    f"{size_text(fp.total_bytes)} of memory at the peak ({fp.phase}: {parts}); "
                    f"this machine has {size_text(available)} available (MemAvailable); "
                    f"lower {key} (nothing was generated or written)")

