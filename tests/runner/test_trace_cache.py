"""The on-disk trace cache shared by a sweep's jobs (harness/runner/trace_cache.py): a hit
gives the trace the generator gives (same content sha, same result.json), keys separate what
must differ, two processes racing generate once, a damaged file is regenerated.

Expected shas come from calling the generator directly in the test, never from the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import ROOT

from core.specs import model_spec_from_dict
from core.targets import build_target
from harness.runner import trace_cache
from harness.runner.config import compose_config
from harness.runner.results import canonical_json
from workloads.synthetic import generate_trace

TINY = ["workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=3",
        "calibration_requests=2", "progress=false"]


def _generator(seed: int = 0, split: str = "measure", extra: list[str] = ()):
    """(memo key, model, generate) for the tiny workload, built the way load_routing does."""
    cfg = compose_config([*TINY, f"seed={seed}", *extra])
    model = model_spec_from_dict(cfg["model"], "model")
    workload = {**cfg["workload"], "split": split, "seed": seed}
    key = canonical_json({"model": model.name, "bits": model.expert_bits, **workload})
    return key, model, lambda: generate_trace(model, build_target(workload, "workload"))


def test_a_new_code_version_removes_the_old_versions_traces(tmp_path, monkeypatch):
    key, model, gen = _generator()
    old = trace_cache.cache_path(tmp_path, trace_cache.cache_key(key, model))
    trace_cache.cached_trace(tmp_path, key, model, gen)
    assert old.is_file()
    monkeypatch.setattr(trace_cache, "code_key", lambda: "git:other-commit:None")
    new = trace_cache.cache_path(tmp_path, trace_cache.cache_key(key, model))
    assert new.parent != old.parent
    trace_cache.cached_trace(tmp_path, key, model, gen)
    assert new.is_file() and not old.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.parent.name]


def test_hit_gives_the_generated_trace(tmp_path):
    key, model, gen = _generator()
    want = gen()
    first = trace_cache.cached_trace(tmp_path, key, model, gen)
    path = trace_cache.cache_path(tmp_path, trace_cache.cache_key(key, model))
    assert path.is_file() and path.parent.parent == tmp_path
    assert path.parent.name == trace_cache.version_dir() and len(path.parent.name) == 16
    inode = path.stat().st_ino

    def must_not_run():
        raise AssertionError("a hit must not generate")

    hit = trace_cache.cached_trace(tmp_path, key, model, must_not_run)
    assert first.content_sha256() == hit.content_sha256() == want.content_sha256()
    assert hit.meta == want.meta and hit.source == want.source == "<memory>"
    assert hit.request_ids == want.request_ids and hit.prompts == want.prompts
    assert path.stat().st_ino == inode  # read, not rewritten


def test_key_separates_seed_split_model_and_code(tmp_path, monkeypatch):
    base_key, model, _ = _generator()
    keys = {trace_cache.cache_key(base_key, model)}
    for seed, split, extra in ((1, "measure", []), (0, "calibration", []),
                               (0, "measure", ["workload.output_len=4"]),
                               (0, "measure", ["model.num_experts=32"])):
        key, m, _ = _generator(seed, split, extra)
        keys.add(trace_cache.cache_key(key, m))
    assert len(keys) == 5
    # the same generator key with another model spec under the same name (an override)
    _, m32, _ = _generator(extra=["model.num_experts=32"])
    assert m32.name == model.name
    assert trace_cache.cache_key(base_key, m32) != trace_cache.cache_key(base_key, model)
    monkeypatch.setattr(trace_cache, "code_key", lambda: "git:other-commit:None")
    assert trace_cache.cache_key(base_key, model) not in keys


def test_damaged_file_is_regenerated(tmp_path, capsys):
    key, model, gen = _generator()
    want = gen().content_sha256()
    path = trace_cache.cache_path(tmp_path, trace_cache.cache_key(key, model))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a zip file")
    assert trace_cache.cached_trace(tmp_path, key, model, gen).content_sha256() == want
    assert "generating it again" in capsys.readouterr().err
    assert trace_cache.cached_trace(tmp_path, key, model, gen).content_sha256() == want


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{tests!r}, os.path.dirname({tests!r})]
    from test_trace_cache import _generator
    from harness.runner.trace_cache import cached_trace
    key, model, gen = _generator()
    def slow_gen():
        with open(os.path.join({marks!r}, str(os.getpid())), "w"):
            pass
        time.sleep(1.5)  # the other process reaches the lock while this one generates
        return gen()
    open(os.path.join({ready!r}, str(os.getpid())), "w").close()
    while len(os.listdir({ready!r})) < 2:
        time.sleep(0.01)
    print(cached_trace({root!r}, key, model, slow_gen).content_sha256())
""")


def test_two_processes_racing_generate_once(tmp_path):
    marks, ready, root = tmp_path / "marks", tmp_path / "ready", tmp_path / "results"
    marks.mkdir()
    ready.mkdir()
    code = CHILD.format(tests=str(ROOT / "tests" / "runner"), marks=str(marks), ready=str(ready),
                        root=str(root))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    _, _, gen = _generator()
    want = gen().content_sha256()
    assert [o.strip() for o, _ in outs] == [want, want]
    assert len(os.listdir(marks)) == 1  # one generated, the other waited and read it
    files = sorted(p.name for p in (root / trace_cache.version_dir()).iterdir())
    assert len([f for f in files if f.endswith(".npz")]) == 1
    assert not [f for f in files if ".tmp-" in f]  # no temporary sibling left


def _cli(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def test_a_run_on_a_cache_hit_writes_the_same_result(tmp_path):
    """Two processes (the second finds the first's traces on disk): the same result.json
    apart from the wall-clock and machine blocks, the same tables."""
    args = [*TINY, "system=moe_infinity", "run_name=r", f"results_dir={tmp_path}",
            f"trace_cache_dir={tmp_path / 'cache'}"]
    texts = []
    for i in range(2):
        proc = _cli(args, ROOT)
        assert proc.returncode == 0, proc.stderr
        result = json.loads((tmp_path / "default" / "r" / "result.json").read_text())
        texts.append(json.dumps({k: v for k, v in result.items()
                                 if k not in ("timing", "environment")}, sort_keys=True))
        if i == 0:
            run = tmp_path / "default" / "r"
            tables = {p.name: p.read_bytes() for p in run.glob("*.parquet")}
            cached = {p: p.stat().st_ino for p in (tmp_path / "cache").rglob("*.npz")}
    assert texts[0] == texts[1]
    assert tables == {p.name: p.read_bytes()
                      for p in (tmp_path / "default" / "r").glob("*.parquet")}
    assert len(cached) == 2  # measure split and moe_infinity's calibration split
    assert {p: p.stat().st_ino for p in cached} == cached  # the second run only read them
