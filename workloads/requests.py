"""Request-level inputs of the synthetic generator: arrivals, lengths and real dataset prompts.

The generator's default (no `arrivals`, no `prompts`, `lengths: fixed`) gives every request the
same lengths, arrival i * arrival_ms and the i-th task of the synthetic mix (round-robin), and
adds nothing to the trace meta. Otherwise (docs/serving.md):

- `lengths: fitted` draws each request's prompt and output length from real length data
  scaled to prompt_len and output_len (workloads/lengths.py); meta `lengths_from` names the
  source (`fitted:<length_source>`).
- `arrivals` (workloads/arrivals.py) sets the number of requests and their arrival times; an
  Azure replay with `lengths: true` also sets each prompt and output length.
- `prompts` takes each request's dataset, task and text from a real dataset
  (workloads/datasets). The tasks replace the synthetic task mix (one routing preference per
  task, as before); the texts are embedded (workloads/embed.py, all-MiniLM-L6-v2 by default)
  and, unless arrivals give lengths, counted by the model's tokenizer for the prompt length.
  The embeddings drive a semantic routing-preference term: for request r with unit embedding
  e_r [D], S[r] = e_r @ W, W [D, L*E] i.i.d. N(0, 1) from the seed (on a 2**-16 grid, so the
  product is exact: docs/trace-format.md, "Portable determinism"), so each entry of S[r] has
  variance 1 and corr(S[r], S[s]) = cos(e_r, e_s). The request-level preference becomes
  sqrt(1 - c**2) * B[r] + c * S[r] with c = `coupling` in [0, 1]: its variance is unchanged,
  and the correlation between two requests' preferences is c**2 * cos(e_r, e_s).
  c = 0 turns the coupling off (ablation); tasks still share a preference.

Prompts are split in two halves for the measure and calibration splits: within each task,
even positions of the loaded order go to "measure", odd ones to "calibration" (disjoint).

Task shifts (TaskShiftConfig, `workload._target_: workloads.requests.TaskShiftConfig`;
docs/routing.md, "Task shifts"): `task_order` (datasets, in order) and `task_block` (requests
per task) serve the measure split task by task: request i takes task T[(i // task_block) %
len(T)], T = the tasks of task_order's datasets, dataset by dataset (all datasets when null),
each dataset's tasks in mix (or loaded) order. `calibration_tasks` restricts the calibration
split to those datasets' tasks (synthetic tasks: round-robin, each dataset's last task first;
prompts: those datasets' calibration prompts). A task keeps its index into the whole task
list, so it has the same routing preference in every split. The spec-fit split never changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from core.checks import boolean, number
from core.numerics import on_grid, standard_normal
from core.rng import stream
from workloads.arrivals import ArrivalError, make_arrivals
from workloads.lengths import request_lengths
from workloads.synthetic_config import SyntheticConfig
from workloads.tasks import dataset_task_order, prompts_in_blocks, task_blocks

PROMPT_KEYS = {"dataset", "path", "tasks", "per_task", "num", "coupling", "lengths", "tokenizer",
               "embedder", "allow_download", "cache_dir"}
# Fitted on the real DeepSeek-V2-Lite sample (docs/routing.md): the slope of activation cosine
# on MiniLM prompt cosine is 0.35 there; 0.03, 0.10, 0.15, 0.18 at c = 0, 0.7, 0.9, 1.0. The
# best c in [0, 1] is the bound, and still gives half the real slope.
DEFAULT_COUPLING = 1.0
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


@dataclass
class TaskShiftConfig(SyntheticConfig):
    """SyntheticConfig with the task-shift options (recorded in trace meta['generator'] with
    the other knobs). At their defaults the requests are SyntheticConfig's."""

    task_order: list | None = None  # datasets whose tasks the measure split serves, in order
    task_block: int = 1  # consecutive measured requests per task
    calibration_tasks: list | str | None = None  # datasets of the calibration split's tasks


def _shift(cfg) -> tuple[list | None, int]:
    """(datasets, requests per task) of this split's task shift, (None, 1) for none: the
    measure split takes task_order and task_block, the calibration split calibration_tasks."""
    if cfg.split == "measure":
        return getattr(cfg, "task_order", None), int(getattr(cfg, "task_block", 1))
    if cfg.split == "calibration":
        given = getattr(cfg, "calibration_tasks", None)
        return ([given] if isinstance(given, str) else given), 1
    return None, 1


@dataclass
class RequestPlan:
    prompt_len: np.ndarray  # int64 [R]
    output_len: np.ndarray  # int64 [R]
    arrival_ms: np.ndarray  # float64 [R]
    datasets: list[str]  # [R]
    tasks: list[str]  # [R]
    request_ids: list[str]  # [R], without the split prefix
    task_index: np.ndarray  # int64 [R] into the task list (one routing preference each)
    num_tasks: int
    texts: list[str] | None = None  # [R] prompt texts (dataset prompts only)
    embeddings: np.ndarray | None = None  # float32 [R, D], unit rows (dataset prompts only)
    coupling: float = 0.0
    meta: dict = field(default_factory=dict)  # provenance, merged into trace meta
    # [num_tasks] each task's dataset slug, in task-index order (workloads/structure.py)
    task_datasets: list[str] = field(default_factory=list)
    _projection: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_requests(self) -> int:
        return len(self.arrival_ms)

    def request_term(self, b: np.ndarray, rows: np.ndarray, seed: int) -> np.ndarray:
        """Request-level preference [c, L, E] of requests `rows` from their own draws b."""
        if self.embeddings is None or self.coupling == 0.0:
            return b
        c, L, E = b.shape
        if self._projection is None:  # W [D, L*E], from the seed only, multiples of 2**-16
            self._projection = on_grid(standard_normal(
                stream(seed, "synthetic/semantic-projection"), (self.embeddings.shape[1], L * E)),
                16)
        # Embeddings as the trace stores them (float16: multiples of 2**-24 in [-1, 1]): each
        # product with W is a multiple of 2**-40 and every partial sum is below
        # sqrt(D) * 8.3 << 2**13, so the BLAS product is exact in any order (kernel-free).
        e16 = self.embeddings[rows].astype(np.float16).astype(np.float64)
        sem = (e16 @ self._projection).reshape(c, L, E)
        g = self.coupling  # g * g, not g**2: pow is glibc's, which has FMA variants
        return math.sqrt(1 - g * g) * b + g * sem


def _lengths(cfg, n: int, arrivals) -> tuple[np.ndarray, np.ndarray, str]:
    if arrivals is not None and arrivals.prompt_len is not None:
        return arrivals.prompt_len, arrivals.output_len, "arrivals"
    return request_lengths(cfg, n)


def _load(spec: dict, seed: int):
    """All prompts of the configured dataset(s), in the loaders' deterministic order."""
    from workloads.datasets import load_prompts

    names = spec.get("dataset")
    names = [names] if isinstance(names, str) else names
    if not names or not all(isinstance(d, str) for d in names):
        raise ArrivalError(f"workload.prompts.dataset: a dataset name or list, got {names!r}")
    paths = spec.get("path")
    paths = [paths] * len(names) if paths is None or isinstance(paths, str) else list(paths)
    if len(paths) != len(names):
        raise ArrivalError("workload.prompts.path: one path per dataset")
    prompts, prov = [], []
    for name, path in zip(names, paths):
        ps = load_prompts(name, path=path, tasks=spec.get("tasks"), per_task=spec.get("per_task"),
                          num=spec.get("num"), seed=seed, cache_dir=spec.get("cache_dir"),
                          allow_download=spec.get("allow_download", True))
        prompts += ps.prompts
        prov.append(ps.provenance)
    return prompts, prov


def _split(prompts: list, split: str) -> list:
    pos: dict[str, int] = {}
    out = []
    for p in prompts:
        i = pos.get(p.task, 0)
        pos[p.task] = i + 1
        if (i % 2 == 0) == (split == "measure"):
            out.append(p)
    return out


def _of_datasets(pool: list, datasets: list, every: list, split: str) -> list:
    """The prompts of `pool` from `datasets`; a dataset that was not loaded is an error."""
    key = "task_order" if split == "measure" else "calibration_tasks"
    loaded = list(dict.fromkeys(p.dataset for p in every))
    for d in datasets:
        if d not in loaded:
            raise ArrivalError(f"workload.{key}: {d!r} is not a loaded dataset "
                               f"({', '.join(loaded)}; workload.prompts.dataset)")
    return [p for p in pool if p.dataset in datasets]


def plan_requests(cfg, model) -> RequestPlan:
    """Per-request inputs for SyntheticConfig `cfg`; meta is empty on the default path."""
    arr_spec, pr_spec = cfg.arrivals, cfg.prompts
    n = int(cfg.num_requests)
    arrivals, meta = None, {}
    if arr_spec is not None:
        if not isinstance(arr_spec, dict):
            raise ArrivalError(f"workload.arrivals: a mapping, got {arr_spec!r}")
        arrivals = make_arrivals(arr_spec, n, int(cfg.seed), cfg.split)
        n = len(arrivals.arrival_ms)
        meta["arrivals"] = arrivals.provenance
        arrival_ms = arrivals.arrival_ms.astype(np.float64)
    else:
        arrival_ms = np.arange(n, dtype=np.float64) * float(cfg.arrival_ms)
        if pr_spec is not None:
            meta["arrivals"] = {"process": "fixed", "arrival_ms": float(cfg.arrival_ms)}
    prompt_len, output_len, lengths_from = _lengths(cfg, n, arrivals)
    if pr_spec is None:
        from workloads.tasks import task_mix  # the synthetic mix, as the default path

        mix = task_mix([tuple(t) for t in cfg.tasks])
        datasets, block = _shift(cfg)
        if datasets is None and block == 1:  # the default: round-robin over the whole mix
            task_index = np.arange(n) % len(mix)
        else:
            # the calibration takes each dataset's tasks last first: a history of C requests
            # and a measured stream of m tasks of one dataset share none while C + m <= its tasks
            order = dataset_task_order(datasets or [str(t[0]) for t in cfg.tasks],
                                       [d for d, _ in mix], cfg.split == "calibration")
            task_index = np.array(task_blocks(order, n, block), np.int64)
        seen: dict[int, int] = {}
        ids = []
        for j in task_index.tolist():
            ids.append(f"{mix[j][1]}/{seen.get(j, 0)}")
            seen[j] = seen.get(j, 0) + 1
        if meta or lengths_from != "config":
            meta["lengths_from"] = lengths_from
        return RequestPlan(prompt_len, output_len, arrival_ms, [mix[j][0] for j in task_index],
                           [mix[j][1] for j in task_index], ids, task_index, len(mix), meta=meta,
                           task_datasets=[d for d, _ in mix])
    return _with_prompts(cfg, model, pr_spec, n, arrival_ms, prompt_len, output_len,
                         lengths_from, meta)


def _with_prompts(cfg, model, spec, n, arrival_ms, prompt_len, output_len, lengths_from, meta):
    if not isinstance(spec, dict):
        raise ArrivalError(f"workload.prompts: a mapping, got {spec!r}")
    unknown = sorted(set(spec) - PROMPT_KEYS)
    if unknown:
        raise ArrivalError(f"workload.prompts: unknown key(s) {unknown}; known: "
                           f"{sorted(PROMPT_KEYS)}")
    coupling = number(spec.get("coupling", DEFAULT_COUPLING), "workload.prompts.coupling",
                      lo=0.0, hi=1.0, error=ArrivalError)
    for key in ("lengths", "allow_download"):  # a string such as "no" would read as true
        boolean(spec.get(key, True), f"workload.prompts.{key}", error=ArrivalError)
    try:  # loader, embedder and tokenizer failures name the config key
        return _prompt_plan(cfg, model, spec, coupling, n, arrival_ms, prompt_len, output_len,
                            lengths_from, meta)
    except ArrivalError:
        raise
    except (ValueError, RuntimeError, ImportError, OSError) as exc:
        raise ArrivalError(f"workload.prompts: {type(exc).__name__}: {exc}") from exc


def _prompt_plan(cfg, model, spec, coupling, n, arrival_ms, prompt_len, output_len,
                 lengths_from, meta):
    every, prov = _load(spec, int(cfg.seed))
    task_names = list(dict.fromkeys(p.task for p in every))  # both splits share task prefs
    pool = _split(every, cfg.split)
    datasets, block = _shift(cfg)
    if datasets is not None:
        pool = _of_datasets(pool, datasets, every, cfg.split)
    if not pool:
        raise ArrivalError(f"workload.prompts: no prompts left for split {cfg.split!r} "
                           f"(each task's odd positions calibrate; raise per_task)")
    order = stream(int(cfg.seed), f"prompts/{cfg.split}/order").permutation(len(pool))
    if cfg.split == "measure" and (datasets is not None or block > 1):
        chosen = prompts_in_blocks([pool[int(i)] for i in order], every, datasets, block,
                                   n)
    else:
        chosen = [pool[int(order[i % len(pool)])] for i in range(n)]  # cycles when n > pool
    from workloads.embed import load_embedder

    embedder = load_embedder(spec.get("embedder") or DEFAULT_EMBEDDER)
    uniq = list(dict.fromkeys(p.id for p in chosen))
    by_id = {p.id: p for p in chosen}
    vecs = np.asarray(embedder.embed([by_id[i].text for i in uniq]), np.float32)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    vecs = vecs / np.where(norms > 0, norms, 1)
    row = {pid: i for i, pid in enumerate(uniq)}
    emb = vecs[[row[p.id] for p in chosen]]
    tokenizer_name = None
    if lengths_from != "arrivals" and spec.get("lengths", True):  # output lengths: config
        from workloads.tokenize import get_tokenizer

        tok = get_tokenizer(spec.get("tokenizer") or model.hf_id)
        counts = tok.count([by_id[i].text for i in uniq])
        prompt_len = np.maximum(1, np.array([counts[row[p.id]] for p in chosen], np.int64))
        tokenizer_name, lengths_from = tok.name, f"prompts+{lengths_from}"
        meta["tokenizer_info"] = tok.describe() if hasattr(tok, "describe") else {"name": tok.name}
    repeat: dict[str, int] = {}
    ids = []
    for p in chosen:
        k = repeat.get(p.id, 0)
        repeat[p.id] = k + 1
        ids.append(p.id if k == 0 else f"{p.id}#{k}")
    t_index = {t: i for i, t in enumerate(task_names)}
    dataset_of = {p.task: p.dataset for p in every}
    meta.update({"lengths_from": lengths_from, "embedder": embedder.name,
                 "tokenizer": tokenizer_name,
                 "prompts": {"sources": prov, "coupling": coupling, "pool": len(pool),
                             "distinct": len(uniq), "tasks": len(task_names)}})
    return RequestPlan(prompt_len, output_len, arrival_ms, [p.dataset for p in chosen],
                       [p.task for p in chosen], ids,
                       np.array([t_index[p.task] for p in chosen], np.int64), len(task_names),
                       [p.text for p in chosen], emb, coupling, meta,
                       [dataset_of[t] for t in task_names])
