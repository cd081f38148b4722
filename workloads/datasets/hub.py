"""Hugging Face hub source: used only when online, with the optional libraries installed.

Nothing here is imported at module load: `datasets` and `huggingface_hub` are imported inside
the functions. Before any hub call the endpoint is probed with a short TCP connect (in a
thread, so a stuck DNS lookup cannot hang either); offline (HF_HUB_OFFLINE set, or no route)
raises HubUnavailable at once instead of waiting on library retries.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

from workloads.datasets.prompt import Prompt

PROBE_TIMEOUT_S = 3.0
MMLU_REPO = ("cais/mmlu", "all", "test")
BIGBENCH_REPO = "tasksource/bigbench"  # one config per task; `inputs` are already formatted
FLAN_REPO_ENV = "MOEBENCH_FLAN_HUB"
FLAN_REPO = "Muennighoff/flan"
SHAREGPT_FILE = ("anon8231489123/ShareGPT_Vicuna_unfiltered",
                 "ShareGPT_V3_unfiltered_cleaned_split.json")
LMSYS_REPO = "lmsys/lmsys-chat-1m"
LMSYS_HOWTO = (
    "LMSYS-Chat-1M is gated and its license forbids redistribution, so no copy ships with "
    "this project or on PyPI. To use it: accept the terms at "
    "https://huggingface.co/datasets/lmsys/lmsys-chat-1m, then either run online with your "
    "token in HF_TOKEN (the loader reads it from the hub), or download the parquet files "
    "yourself (`huggingface-cli download lmsys/lmsys-chat-1m --repo-type dataset`) and pass "
    "path=<that folder>. Substitutes: dataset 'arena_hard' with path=shared/data/"
    "lmsys_chat_1m_SUBSTITUTE_arena_hard (real Chatbot Arena prompts selected to be hard), or "
    "'sharegpt' (real chat prompts). See docs/datasets.md."
)


class HubUnavailable(RuntimeError):
    """The hub cannot be used now (offline, library missing, no token); says why."""


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def offline_reason(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub is unreachable, or None if a TCP connect to the endpoint succeeds."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(_endpoint())
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    result: list[str | None] = ["probe timed out"]

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result[0] = None
        except OSError as exc:
            result[0] = f"cannot reach {host}:{port} ({exc.__class__.__name__}: {exc})"

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    return result[0]


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise HubUnavailable(f"the hub source needs the `{module}` package (pip install {module})")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")


def hub_prompts(dataset: str, tasks: list[str] | None, stats: dict,
                want: Callable[[str], bool]) -> tuple[Iterator[Prompt], dict]:
    """(prompt stream, provenance fields) from the hub; HubUnavailable when it cannot be used."""
    from workloads.datasets.readers import read_path, rows_to_prompts

    reason = offline_reason()
    if reason is not None:
        raise HubUnavailable(f"Hugging Face hub unavailable: {reason}")
    if dataset == "sharegpt":
        _require("huggingface_hub")
        from huggingface_hub import hf_hub_download

        repo, filename = SHAREGPT_FILE
        local = hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset")
        return read_path("sharegpt", local, stats, want), {"repo": repo, "file": filename,
                                                           "path": str(Path(local))}
    _require("datasets")
    import datasets as hf_datasets  # the Hugging Face library, not this package

    if dataset == "lmsys":
        if _token() is None:
            raise HubUnavailable("no Hugging Face token (HF_TOKEN) for the gated "
                                 f"{LMSYS_REPO}. {LMSYS_HOWTO}")
        ds = hf_datasets.load_dataset(LMSYS_REPO, split="train", token=_token())
        rows = enumerate(ds, 1)
        return rows_to_prompts("lmsys", rows, f"hub:{LMSYS_REPO}", stats), {"repo": LMSYS_REPO}
    if dataset == "mmlu":
        repo, config, split = MMLU_REPO
        ds = hf_datasets.load_dataset(repo, config, split=split)
        where = f"hub:{repo}/{config}/{split}"
        return rows_to_prompts("mmlu", enumerate(ds, 1), where, stats), {
            "repo": repo, "config": config, "split": split}
    if dataset == "flan":
        repo = os.environ.get(FLAN_REPO_ENV, FLAN_REPO)
        ds = hf_datasets.load_dataset(repo, split="train")
        return rows_to_prompts("flan", enumerate(ds, 1), f"hub:{repo}", stats), {"repo": repo}
    if dataset == "bigbench":
        names = tasks or hf_datasets.get_dataset_config_names(BIGBENCH_REPO)
        return _bigbench_rows(hf_datasets, names, want), {"repo": BIGBENCH_REPO}
    raise HubUnavailable(f"no hub source is known for {dataset}")


def _bigbench_rows(hf_datasets, names: list[str], want: Callable[[str], bool]
                   ) -> Iterator[Prompt]:
    for task in names:
        if not want(task):
            continue
        for split, ds in hf_datasets.load_dataset(BIGBENCH_REPO, task).items():
            for row in ds:
                if row.get("inputs"):
                    idx = row.get("idx", "")
                    yield Prompt("bigbench", task, f"bigbench/{task}/{split}/{idx}",
                                 row["inputs"])
