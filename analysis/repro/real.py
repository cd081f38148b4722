"""Real routing for the reproduction suite: the shared samples imported once as trace v1.

  deepseek_v2_lite  prefill routing of 1,000 prompts: prompts 0-499 warm the history-based
                    systems up (calibration_routing), 500-599 are measured (100: the suite's
                    time budget); the last 8 tokens of each prompt are replayed as
                    teacher-forced decode steps
  mixtral_8x7b      one prompt (HumanEval problem 0): its positions recorded at every layer
                    (gaps dropped: 59 tokens) measured with the last 32 as decode steps; no
                    real calibration split exists (the other file holds the same problem), so
                    history-based systems warm up on the synthetic calibration split, as the
                    result records

Traces go to results/real_traces/<model>/ (no result.json: not a run folder). Without the
shared data (core/shared_data.py) a real sweep is skipped and the claims say so.
"""

from __future__ import annotations

from pathlib import Path

from analysis.runs import ReportError
from core.shared_data import shared_file

SAMPLES = {
    "deepseek_v2_lite": {
        "file": ("routing_deepseek_v2_lite_sample", "prefill_routing_prompts_0001_1000.jsonl.gz"),
        "splits": {"cal.npz": ["--requests", "0:500", "--decode-tokens", "8"],
                   "meas.npz": ["--requests", "500:600", "--decode-tokens", "8"]},
        "size": "100 prompts (shared DeepSeek-V2-Lite sample), 8 teacher-forced decode steps",
    },
    "mixtral_8x7b": {
        "file": ("routing_mixtral_sample", "routing_raw.jsonl"),
        "splits": {"meas.npz": ["--decode-tokens", "32", "--duplicates", "first",
                                "--gaps", "drop"]},
        "size": "1 prompt (shared Mixtral sample: 27 prompt tokens + 32 teacher-forced decode "
                "steps)",
    },
}


def real_traces(model: str, results: Path) -> dict[str, Path] | None:
    """{split file: path} of the model's imported sample, importing it on first use; None
    when the shared sample is absent."""
    from workloads.importers import main as import_routing

    spec = SAMPLES[model]
    sample = shared_file(*spec["file"])
    if sample is None:
        return None
    out = Path(results) / "real_traces" / model
    paths = {}
    for name, args in spec["splits"].items():
        path = paths[name] = out / name
        if not path.is_file():
            out.mkdir(parents=True, exist_ok=True)
            if import_routing([str(sample), str(path), "--model", model, *args]) != 0:
                raise ReportError(f"{sample}: import-routing failed (message above)")
    return paths


def real_overrides(exp, results: Path) -> list[str] | None:
    """The overrides that point an experiment's real sweep at the sample (the suite sends
    its runs to results/<name>_real/); None without the sample."""
    traces = real_traces(exp.real_model, results)
    if traces is None:
        return None
    extra = [f"routing={_portable(traces['meas.npz'])}"]
    if "cal.npz" in traces:
        extra.append(f"calibration_routing={_portable(traces['cal.npz'])}")
    return extra


def _portable(path: Path) -> str:
    """The path relative to the working directory when it lies inside it: the runs' names
    and config hashes then hold no machine path (the runs read it from the same place)."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def real_size(model: str | None) -> str | None:
    return SAMPLES[model]["size"] if model in SAMPLES else None
