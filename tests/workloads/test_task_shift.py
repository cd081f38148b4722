"""Task shifts (workloads/requests.py TaskShiftConfig, workloads/tasks.py; docs/routing.md,
"Task shifts"): measured requests in task blocks by dataset, a calibration split of chosen
datasets' tasks, strict key checks, and the default requests untouched. Expected task
sequences worked out by hand from the mix's merge rule (workloads/tasks.py task_mix)."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import replace

import numpy as np
import pytest
import yaml

from core.paths import PROJECT_ROOT
from core.specs import SpecError, model_spec_from_dict
from core.targets import build_target
from harness.runner.config import compose_config
from workloads.arrivals import ArrivalError
from workloads.requests import TaskShiftConfig, _of_datasets, plan_requests
from workloads.synthetic import SyntheticConfig, generate_trace
from workloads.tasks import dataset_task_order, prompts_in_blocks, task_blocks
from workloads.workload_checks import WorkloadError

# Mix of [[mmlu, 2], [bigbench, 3]]: positions (j + 0.5) / n are mmlu 0.25, 0.75 and
# bigbench 0.167, 0.5, 0.833, so the mix is bb0, mmlu0, bb1, mmlu1, bb2 (indices 0..4).
TINY_MIX = [["mmlu", 2], ["bigbench", 3]]
MMLU0, MMLU1, BB0, BB1, BB2 = 1, 3, 0, 2, 4
Prompt = namedtuple("Prompt", "dataset task id")


@pytest.fixture(scope="module")
def mixtral():
    text = (PROJECT_ROOT / "conf/model/mixtral_8x7b.yaml").read_text()
    return model_spec_from_dict(yaml.safe_load(text), where="mixtral_8x7b")


def _cfg(**kw) -> TaskShiftConfig:
    base = {"num_requests": 7, "prompt_len": 8, "output_len": 3, "tasks": TINY_MIX}
    cfg = TaskShiftConfig(**{**base, **kw})
    cfg.check()
    return cfg


def test_order_and_blocks_by_hand():
    of = ["bigbench", "mmlu", "bigbench", "mmlu", "bigbench"]  # the tiny mix's datasets
    assert dataset_task_order(["mmlu", "bigbench"], of) == [MMLU0, MMLU1, BB0, BB1, BB2]
    assert dataset_task_order(["mmlu", "bigbench"], of, last_first=True) == [3, 1, 4, 2, 0]
    assert task_blocks([1, 3, 0], 7, 2) == [1, 1, 3, 3, 0, 0, 1]  # repeats after 3 blocks
    assert task_blocks([5, 6], 3, 1) == [5, 6, 5]
    with pytest.raises(ValueError):
        task_blocks([], 3, 1)


def test_measure_split_in_task_blocks(mixtral):
    plan = plan_requests(_cfg(task_order=["mmlu", "bigbench"], task_block=2), mixtral)
    assert plan.task_index.tolist() == [MMLU0, MMLU0, MMLU1, MMLU1, BB0, BB0, BB1]
    assert plan.request_ids[:3] == ["mmlu/synthetic_task_000/0", "mmlu/synthetic_task_000/1",
                                    "mmlu/synthetic_task_001/0"]
    assert plan.datasets == ["mmlu"] * 4 + ["bigbench"] * 3 and plan.num_tasks == 5
    # one dataset, one block of every request: a stream of one task
    one = plan_requests(_cfg(task_order=["bigbench"], task_block=7), mixtral)
    assert one.task_index.tolist() == [BB0] * 7
    # task_block alone: the whole mix in dataset blocks in workload.tasks order
    alone = plan_requests(_cfg(task_block=1, task_order=None, num_requests=5), mixtral)
    assert alone.task_index.tolist() == [0, 1, 2, 3, 4]  # defaults: round-robin, unchanged
    blocked = plan_requests(_cfg(task_block=3, num_requests=4), mixtral)
    assert blocked.task_index.tolist() == [MMLU0, MMLU0, MMLU0, MMLU1]


def test_calibration_tasks_last_first(mixtral):
    cfg = _cfg(calibration_tasks="mmlu", task_order=["mmlu"], task_block=7, num_requests=3)
    cal = plan_requests(replace(cfg, split="calibration"), mixtral)
    assert cal.task_index.tolist() == [MMLU1, MMLU0, MMLU1]
    assert cal.tasks[0] == "mmlu/synthetic_task_001"
    # the measured stream starts at the dataset's first task: one history request of the
    # last task leaves it unseen (C + m = 1 + 1 <= 2 tasks)
    assert plan_requests(cfg, mixtral).task_index.tolist() == [MMLU0] * 3
    both = plan_requests(replace(cfg, split="calibration", calibration_tasks=["bigbench", "mmlu"],
                                 num_requests=6), mixtral)
    assert both.task_index.tolist() == [BB2, BB1, BB0, MMLU1, MMLU0, BB2]
    # the spec-fit split never changes
    fit = plan_requests(replace(cfg, split="spec-fit"), mixtral)
    assert fit.task_index.tolist() == [0, 1, 2]


def test_defaults_are_the_synthetic_requests(mixtral):
    for split in ("measure", "calibration"):
        plain = SyntheticConfig(num_requests=12, prompt_len=8, output_len=3, tasks=TINY_MIX,
                                split=split)
        shifted = plan_requests(_cfg(num_requests=12, split=split), mixtral)
        ref = plan_requests(plain, mixtral)
        assert shifted.task_index.tolist() == ref.task_index.tolist() == [
            i % 5 for i in range(12)]
        assert shifted.request_ids == ref.request_ids and shifted.meta == ref.meta == {}


def test_trace_routing_and_determinism(mixtral):
    kw = {"num_requests": 4, "prompt_len": 8, "output_len": 3, "tasks": TINY_MIX}
    plain = generate_trace(mixtral, SyntheticConfig(**kw))
    same = generate_trace(mixtral, TaskShiftConfig(**kw))
    # same requests and routing; the generator meta also records the three options
    assert np.array_equal(plain.topk, same.topk) and plain.tasks == same.tasks
    assert same.meta["generator"]["task_block"] == 1
    a = generate_trace(mixtral, _cfg(task_order=["bigbench"], task_block=2, num_requests=4))
    b = generate_trace(mixtral, _cfg(task_order=["bigbench"], task_block=2, num_requests=4))
    assert a.content_sha256() == b.content_sha256()
    assert a.tasks == ["bigbench/synthetic_task_000"] * 2 + ["bigbench/synthetic_task_001"] * 2
    assert a.meta["generator"]["task_order"] == ["bigbench"]
    # a request's routing depends on its task: request 0 (bb0) is request 0 of the plain trace
    first = slice(int(a.block_offsets[0]), int(a.block_offsets[1]))
    assert np.array_equal(a.topk[first], plain.topk[first])


@pytest.mark.parametrize("bad, key", [
    ({"task_order": ["flan"]}, "workload.task_order: 'flan' is not a dataset of workload.tasks"),
    ({"task_order": []}, "workload.task_order: must be a dataset name or a non-empty list"),
    ({"task_order": ["mmlu", "mmlu"]}, "workload.task_order: a dataset is listed twice"),
    ({"task_order": [3]}, "workload.task_order: must be"),
    ({"task_block": 0}, "workload.task_block: must be an integer >= 1"),
    ({"task_block": 2.0}, "workload.task_block: must be an integer >= 1"),
    ({"task_block": True}, "workload.task_block: must be an integer >= 1"),
    ({"calibration_tasks": "mmlu/x"}, "workload.calibration_tasks: must be"),
    ({"calibration_tasks": 5}, "workload.calibration_tasks: must be"),
    ({"calibration_tasks": ["flan"]}, "workload.calibration_tasks: 'flan' is not a dataset"),
])
def test_bad_options_name_their_key(bad, key):
    with pytest.raises(WorkloadError, match="^" + key.replace("(", r"\(").replace(")", r"\)")):
        _cfg(**bad)


def test_prompts_in_task_blocks_by_hand():
    loaded = [Prompt("mmlu", "a", "m1"), Prompt("mmlu", "a", "m2"), Prompt("mmlu", "b", "m3"),
              Prompt("bigbench", "c", "b1"), Prompt("bigbench", "c", "b2")]
    shuffled = [loaded[i] for i in (4, 2, 1, 3, 0)]  # the seeded order of one split
    got = prompts_in_blocks(shuffled, loaded, ["bigbench", "mmlu"], 2, 7)
    # tasks c, a, b (datasets in the given order, tasks as loaded); each task's prompts in
    # the shuffled order, cycled: c -> b2, b1; a -> m2, m1; b -> m3, m3; c again -> b2
    assert [p.id for p in got] == ["b2", "b1", "m2", "m1", "m3", "m3", "b2"]
    every = prompts_in_blocks(shuffled, loaded, None, 1, 4)
    assert [p.id for p in every] == ["m2", "m3", "b2", "m1"]  # tasks a, b, c, then a
    assert _of_datasets(shuffled, ["mmlu"], loaded, "calibration") == shuffled[1:3] + [loaded[0]]
    with pytest.raises(ArrivalError, match="^workload.calibration_tasks: 'flan' is not a loaded"):
        _of_datasets(shuffled, ["flan"], loaded, "calibration")


def test_config_keys_from_the_command_line():
    cfg = compose_config(["workload._target_=workloads.requests.TaskShiftConfig",
                          "+workload.task_order=[mmlu,bigbench]", "+workload.task_block=5",
                          "+workload.calibration_tasks=flan"])
    built = build_target(cfg["workload"], "workload")
    assert (built.task_order, built.task_block, built.calibration_tasks) == (
        ["mmlu", "bigbench"], 5, "flan")
    # the keys need the TaskShiftConfig target: the plain generator names the bad key
    plain = compose_config(["+workload.task_block=5"])
    with pytest.raises(SpecError, match="task_block"):
        build_target(plain["workload"], "workload")
    exp = compose_config(["experiment=workload_shift"])["workload"]
    assert exp["_target_"] == "workloads.requests.TaskShiftConfig"
    assert exp["task_block"] == exp["num_requests"]
