"""BIG-bench task.json files -> zero-shot prompts.

A prompt is built the way BIG-bench's json_task default format builds a zero-shot query (and
the way shared/data/bigbench was extracted): task_prefix + example_input_prefix (default
"\\nQ: ") + input, then, for multiple-choice examples unless append_choices_to_input is false,
each choice after choice_prefix (default "\\n  choice: "), then example_output_prefix (default
"\\nA: "). Choices are in sorted order (BIG-bench permutes them with its own RNG).
Task names are the path under benchmark_tasks/: "task" or "task/subtask".
Examples with an empty input are skipped (counted); programmatic tasks (task.py) have no JSON
examples and are not available.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from workloads.datasets.prompt import DataError, Prompt

TASKS_DIR = "benchmark_tasks"


def task_prompts(task: str, doc: object, where: str, stats: dict) -> Iterator[Prompt]:
    """Prompts of one parsed task.json; ids are bigbench/<task>/<example index in the file>."""
    if not isinstance(doc, dict):
        raise DataError(f"{where}: expected a JSON object")
    examples = doc.get("examples", [])
    if not isinstance(examples, list):
        raise DataError(f"{where}: field 'examples' must be a list")
    if not examples:
        stats["task_files_without_examples"] = stats.get("task_files_without_examples", 0) + 1
    prefix = doc.get("task_prefix", "")
    in_prefix = doc.get("example_input_prefix", "\nQ: ")
    out_prefix = doc.get("example_output_prefix", "\nA: ")
    choice_prefix = doc.get("choice_prefix", "\n  choice: ")
    append_choices = doc.get("append_choices_to_input", True) is not False
    for index, ex in enumerate(examples):
        at = f"{where}: examples[{index}]"
        if not isinstance(ex, dict) or not isinstance(ex.get("input"), str):
            raise DataError(f"{at}: field 'input' is missing or not a string")
        if not ex["input"]:
            stats["skipped_empty_input"] = stats.get("skipped_empty_input", 0) + 1
            continue
        text = prefix + in_prefix + ex["input"]
        scores = ex.get("target_scores")
        if scores is not None and not isinstance(scores, dict):
            raise DataError(f"{at}: field 'target_scores' must be an object")
        if scores and append_choices:
            text += "".join(choice_prefix + choice for choice in sorted(scores))
        yield Prompt("bigbench", task, f"bigbench/{task}/{index}", text + out_prefix)


def _task_name(rel_parts: tuple[str, ...]) -> str:
    """Task name from the path parts below benchmark_tasks (last part is task.json)."""
    return "/".join(rel_parts[:-1])


def bigbench_tar(path: Path, stats: dict, want: Callable[[str], bool]) -> Iterator[Prompt]:
    """Stream the sdist: only task.json members of wanted tasks are decompressed into JSON."""
    marker = f"/{TASKS_DIR}/"
    with tarfile.open(path, "r|gz") as tar:  # "r|": sequential, the 358 MB file is never seeked
        for member in tar:
            name = member.name
            if not (member.isfile() and marker in name and name.endswith("/task.json")):
                continue
            task = _task_name(tuple(name.split(marker, 1)[1].split("/")))
            if not want(task):
                continue
            where = f"{path}!{name}"
            try:
                doc = json.load(tar.extractfile(member))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{where}: not valid JSON ({exc})") from None
            stats["task_files_read"] = stats.get("task_files_read", 0) + 1
            yield from task_prompts(task, doc, where, stats)


def bigbench_file(path: Path, stats: dict, want: Callable[[str], bool],
                  base: Path | None = None) -> Iterator[Prompt]:
    """One task.json; the task is its folder path below benchmark_tasks, else below `base`."""
    parts = path.resolve().parts
    if TASKS_DIR in parts:
        rel = parts[len(parts) - parts[::-1].index(TASKS_DIR):]
    elif base is not None:
        rel = path.resolve().relative_to(base).parts
    else:
        rel = parts[-2:]
    task = _task_name(rel)
    if not want(task):
        return
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    stats["task_files_read"] = stats.get("task_files_read", 0) + 1
    yield from task_prompts(task, doc, str(path), stats)


def bigbench_dir(root: Path, stats: dict, want: Callable[[str], bool]) -> Iterator[Prompt]:
    """Every task.json below root: a folder of task folders, or one task's own folder."""
    root = root.resolve()
    base = root.parent if (root / "task.json").is_file() else root
    for path in sorted(root.rglob("task.json")):
        stats.setdefault("files", []).append(str(path))
        yield from bigbench_file(path, stats, want, base=base)
