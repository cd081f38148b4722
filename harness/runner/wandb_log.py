"""Log one finished run folder to wandb (run by harness/runner/logger.py in a child process).

    python -m harness.runner.wandb_log RUN_DIR SPEC_JSON

One wandb run per moebench run: id = the run's run_id (config hash + code version), so an
online rerun resumes the same wandb run (resume="allow") and an offline run synced with
`wandb sync` lands on that id instead of a new one. It carries the config, the summary
metrics (nested keys joined with '/'), the per-token table (tokens.parquet, at most
max_table_rows rows) and any PNG figures in the run folder. Online, an endpoint that does
not answer within the init timeout exits with UNREACHABLE and the parent logs offline in a new
child (`wandb sync` later). The parent bounds the children by logger.timeout_s in all.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

UNREACHABLE = 3  # exit status: online init failed (harness/runner/logger.py retries offline)


def summary_of(node, prefix: str = "") -> dict:
    """Scalar leaves of nested metrics as {"tpot_ms/mean": ...}; None left out."""
    out = {}
    for key, value in (node or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(summary_of(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
    return out


def _init(wandb, spec: dict, result: dict, mode: str):
    init_timeout_s = max(5.0, min(30.0, float(spec["timeout_s"]) / 3))
    return wandb.init(
        project=spec.get("project"), entity=spec.get("entity"), group=spec.get("group"),
        name=result.get("run_name"), id=result["run_id"], resume="allow", mode=mode,
        dir=spec["dir"], tags=list(spec.get("tags") or []), job_type="simulated",
        config={**result["config"], "moebench": {
            "run_id": result["run_id"], "config_sha256": result.get("config_sha256"),
            "git": result.get("git"), "simulated": result.get("simulated"),
            "trace_sha256": (result.get("trace") or {}).get("sha256")}},
        settings=wandb.Settings(init_timeout=init_timeout_s, console="off",
                                x_disable_stats=True, silent=True))


def log_folder(run_dir: Path, spec: dict) -> str:
    import wandb

    result = json.loads((run_dir / "result.json").read_text())
    mode = spec["mode"]
    try:
        run = _init(wandb, spec, result, mode)
    except Exception as exc:  # noqa: BLE001 - wandb raises CommError, UsageError, ...
        if mode != "online":
            raise
        # wandb keeps the failed run's id registered in this process: the parent starts a
        # fresh child to log offline instead
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"moebench: warning: logger=wandb: online init failed ({type(exc).__name__}: "
              f"{first}); logging offline instead", file=sys.stderr, flush=True)
        raise SystemExit(UNREACHABLE) from None
    summary = summary_of(result.get("metrics"), "metrics/")
    summary.update({"status": result.get("status"), "reason": result.get("reason") or ""})
    run.summary.update(summary)
    logged = {}
    tokens = run_dir / "tokens.parquet"
    if tokens.is_file() and int(spec["max_table_rows"]) > 0:
        import pyarrow.parquet as pq

        frame = pq.read_table(tokens).to_pandas()
        cap = int(spec["max_table_rows"])
        if len(frame) > cap:
            run.summary["tokens_table_rows_dropped"] = len(frame) - cap
            frame = frame.head(cap)
        logged["tokens"] = wandb.Table(dataframe=frame)
    for png in sorted(run_dir.glob("*.png")):
        logged[f"figures/{png.stem}"] = wandb.Image(str(png))
    if logged:
        run.log(logged)
    sync_dir = Path(run.dir).parent  # wandb/offline-run-<time>-<id>, what `wandb sync` takes
    run.finish()
    where = "" if mode == "online" else f" offline (upload: wandb sync {sync_dir})"
    return f"moebench: logger=wandb: run {result['run_id']} logged{where}"


def main(argv: list[str]) -> int:
    run_dir, spec = Path(argv[0]), json.loads(argv[1])
    print(log_folder(run_dir, spec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
