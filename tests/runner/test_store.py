"""The result store: safe names, folders inside results_dir, one folder per config, one writer
per folder, atomic writes whose leftovers nobody counts, and provenance that names the code.

Expected values are literals written by hand; kill tests use real processes and SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from core.atomic import atomic_path, replace_dir, restore_set_aside, write_text
from core.specs import SpecError
from harness.runner.config import compose_config
from harness.runner.provenance import code_version, run_id
from harness.runner.results import PAUSE_ENV
from harness.runner.run import run_config
from harness.runner.store import RunLock, check_component, default_run_name, run_dir_of

TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2", "progress=false"]
# A run replaying a trace file: the file fixes the requests (workload.num_requests is refused)
FILE_RUN = [o for o in TINY if not o.startswith("workload.num_requests=")]


def cli(args: list[str], cwd: Path | None = None, env: dict | None = None, **kw):
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})}, **kw)


# ---- names and folders ----------------------------------------------------------------------

@pytest.mark.parametrize("value,why", [
    ("", "empty"), (".", "starts with '.'"), ("..", "starts with '.'"), (".hidden", "'.'"),
    ("a/b", "path separator"), ("../up", "path separator"), ("..\\x", "separator"),
    ("tab\there", "control character"), ("nl\n", "control character"), ("x" * 201, "longer"),
    (5, "must be a string"), (None, "must be a string")])
def test_unsafe_names_are_refused(value, why):
    for key in ("run_name", "experiment_name"):
        with pytest.raises(SpecError, match=rf"^{key}: .*{why}"):
            check_component(key, value)


@pytest.mark.parametrize("name", ["lru", "lru,hardware.h2d_gbps=16-1a2b3c4d", "a..b", "x=y,z"])
def test_safe_names_pass(name):
    assert check_component("run_name", name) == name


def test_a_symlinked_experiment_folder_cannot_lead_outside(tmp_path):
    root, outside = tmp_path / "results", tmp_path / "elsewhere"
    outside.mkdir()
    root.mkdir()
    (root / "exp").symlink_to(outside)
    cfg = {"results_dir": str(root), "experiment_name": "exp", "run_name": "lru"}
    with pytest.raises(SpecError, match="outside results_dir"):
        run_dir_of(cfg)
    assert run_dir_of({**cfg, "experiment_name": "plain"}) == root / "plain" / "lru"


@pytest.mark.parametrize("override", ["run_name=<tmp>/elsewhere", "run_name=.", "run_name=",
                                      "run_name=../../x", "experiment_name=../x",
                                      "experiment_name=."])
def test_cli_refuses_escaping_names_before_any_work(tmp_path, override):
    results = tmp_path / "results"
    (results / "default" / "keep").mkdir(parents=True)
    (results / "default" / "keep" / "result.json").write_text("{}")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    override = override.replace("<tmp>", str(tmp_path))  # an absolute path of this machine
    proc = cli(["system=lru", *TINY, f"results_dir={results}", override], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert re_key(override) in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def re_key(override: str) -> str:
    return override.split("=", 1)[0] + ":"


def test_default_names_are_readable_and_end_in_the_config_hash():
    sha = "1a2b3c4d" + "0" * 56
    assert default_run_name([], "lru", sha) == "lru-1a2b3c4d"
    assert default_run_name(["experiment=table1", "system=lru"], "lru", sha) == "lru-1a2b3c4d"
    assert default_run_name(["system=lru", "hardware.h2d_gbps=16"], "lru", sha) == (
        "lru,hardware.h2d_gbps=16-1a2b3c4d")
    long = default_run_name([f"+workload.tag={'x' * 300}"], "lru", sha)
    assert len(long) == 200 and long.endswith("~-1a2b3c4d")


def test_composed_names_carry_the_part_groups_without_a_slash():
    """`system/evictor=lfu` is a config-group override with a slash: the name shows it as
    `evictor=lfu` right after the system, and stays one safe folder name."""
    sha = "1a2b3c4d" + "0" * 56
    name = default_run_name(["system=composed", "system/prefetcher=spec_next_layer",
                             "system/evictor=lfu", "max_batch=4"], "composed", sha)
    assert name == "composed,evictor=lfu,prefetcher=spec_next_layer,max_batch=4-1a2b3c4d"
    assert check_component("run_name", name) == name
    assert default_run_name(["system=composed"], "composed", sha) == "composed-1a2b3c4d"


def test_routing_paths_that_used_to_collide_get_two_folders(tmp_path):
    """`routing=<dir>/a/b_c.npz` and `routing=<dir>/a_b/c.npz` once both became
    `lru,routing=_<dir>_a_b_c.npz`, and the second run overwrote the first."""
    from core.specs import model_spec_from_dict
    from core.trace import write_trace
    from harness.runner.run import load_routing

    cfg = compose_config(["system=lru", *TINY])
    trace = load_routing(cfg, model_spec_from_dict(cfg["model"]), "measure")
    paths = [tmp_path / "a" / "b_c.npz", tmp_path / "a_b" / "c.npz"]
    for p in paths:
        p.parent.mkdir()
        write_trace(trace, p)
    results = tmp_path / "results"
    for p in paths:
        proc = cli(["system=lru", *FILE_RUN, f"routing={p}", f"results_dir={results}"],
                   cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    folders = sorted(p.name for p in (results / "default").iterdir())
    assert len(folders) == 2 and folders[0] != folders[1], folders
    assert all("routing=" in f for f in folders)
    routed = {json.loads((results / "default" / f / "result.json").read_text())["config"][
        "routing"] for f in folders}
    assert routed == {str(p) for p in paths}


# ---- one writer per folder ------------------------------------------------------------------

def test_a_held_lock_gives_one_clear_error_and_leaves_the_folder(tmp_path):
    cfg = compose_config(["system=lru", *TINY], run_name="r", results_dir=str(tmp_path))
    run_dir = tmp_path / "default" / "r"
    with RunLock(run_dir):
        with pytest.raises(SpecError, match="another process .* is writing this run folder"):
            run_config(cfg)
        assert not run_dir.exists()
    assert run_config(cfg)["status"] == "valid"  # released: the next writer proceeds
    assert not (tmp_path / "default" / ".r.lock").exists()


def test_a_killed_lock_holder_never_blocks_a_later_run(tmp_path):
    run_dir = tmp_path / "default" / "r"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from harness.runner.store import RunLock; "
        f"RunLock({str(run_dir)!r}).__enter__(); print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    cfg = compose_config(["system=lru", *TINY], run_name="r", results_dir=str(tmp_path))
    with pytest.raises(SpecError, match="another process"):
        run_config(cfg)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert run_config(cfg)["status"] == "valid"


def test_concurrent_writers_of_one_folder_succeed_or_get_the_lock_error(tmp_path):
    args = ["system=on_demand", *TINY, f"results_dir={tmp_path}", "run_name=same"]
    procs = [subprocess.Popen([sys.executable, "-m", "moebench.cli", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=180) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes
    for code, (_, err) in zip(codes, outs):
        assert code == 0 or (code == 2 and "is writing this run folder" in err), err
    names = sorted(p.name for p in (tmp_path / "default").iterdir())
    assert names == ["same"]  # no leftovers, no set-aside folders
    json.loads((tmp_path / "default" / "same" / "result.json").read_text())


# ---- atomic writes and leftovers -------------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_and_no_leftover(tmp_path):
    path = write_text(tmp_path / "table1.md", "old complete table\n")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half a ta")
            raise RuntimeError("disk full")
    assert path.read_text() == "old complete table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table1.md"]


def test_leftovers_of_dead_writers_are_cleaned_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    from core.atomic import tmp_sibling

    mine = tmp_sibling(tmp_path / "t.csv")
    stale = mine.with_name(mine.name.rsplit("-", 1)[0] + f"-{dead}")
    stale.write_text("partial")
    write_text(tmp_path / "t.csv", "a,b\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_folder_set_aside_by_a_killed_replace_comes_back(tmp_path):
    """Without renameat2 the old run is renamed aside first; a kill right then leaves only
    `.r.old-*`: the next writer puts it back before anything else."""
    final = tmp_path / "r"
    aside = tmp_path / ".r.old-otherhost-1"
    aside.mkdir()
    (aside / "result.json").write_text('{"complete": true}')
    restore_set_aside(final)
    assert json.loads((final / "result.json").read_text()) == {"complete": True}
    new = tmp_path / ".r.tmp-x-1"
    new.mkdir()
    (new / "result.json").write_text('{"complete": 2}')
    replace_dir(new, final)
    assert json.loads((final / "result.json").read_text()) == {"complete": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_sigkill_inside_a_write_keeps_the_previous_run_and_table1_ignores_the_leftover(
        tmp_path):
    args = ["experiment=table1", "experiment_name=table1", "system=on_demand", *TINY,
            f"results_dir={tmp_path}", "run_name=od"]
    assert cli(args).returncode == 0
    exp = tmp_path / "table1"
    first = (exp / "od" / "result.json").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "moebench.cli", *args],
                            env={**os.environ, PAUSE_ENV: "60"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(exp.glob(".od.tmp-*/accesses.parquet")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    (tmp,) = exp.glob(".od.tmp-*")
    assert (tmp / "tokens.parquet").is_file() and not (tmp / "result.json").exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert tmp.exists()  # the killed write's leftover is there ...
    assert (exp / "od" / "result.json").read_bytes() == first  # ... and the old run is whole
    from analysis.table1 import main as table1

    assert table1([str(exp), "--allow-partial"]) == 0
    rows = (exp / "table1.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("on_demand,false,")  # one row, not two
    assert cli(args).returncode == 0  # the next write cleans the leftover
    assert sorted(p.name for p in exp.iterdir() if p.name.startswith(".od")) == []


# ---- provenance -----------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_dirty_counts_untracked_source_files_and_run_id_names_the_code(tmp_path):
    repo = tmp_path / "repo"
    (repo / "conf" / "system").mkdir(parents=True)
    (repo / "conf" / "system" / "lru.yaml").write_text("a: 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    clean = code_version(repo)
    assert clean["dirty"] is False and clean["dirty_sha256"] is None
    (repo / "results").mkdir()
    (repo / "results" / "run.json").write_text("{}")  # not source: stays clean
    assert code_version(repo)["dirty"] is False
    (repo / "conf" / "system" / "mine.yaml").write_text("b: 1\n")  # untracked config
    one = code_version(repo)
    assert one["dirty"] is True and one["dirty_files"] == ["conf/system/mine.yaml"]
    (repo / "conf" / "system" / "mine.yaml").write_text("b: 2\n")
    two = code_version(repo)
    assert two["dirty_sha256"] != one["dirty_sha256"]
    cfg_sha = "ab" * 32
    ids = {run_id(cfg_sha, v) for v in (clean, one, two)}
    assert len(ids) == 3
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "two")
    later = code_version(repo)
    assert later["sha"] != clean["sha"] and run_id(cfg_sha, later) != run_id(cfg_sha, clean)


def test_result_json_has_an_environment_block(tmp_path):
    r = run_config(compose_config(["system=on_demand", *TINY], run_name="e",
                                  results_dir=str(tmp_path)))
    env = r["environment"]
    assert set(env) >= {"host", "packages", "blas", "numpy_simd", "python"}
    assert env["packages"]["numpy"] and env["blas"]
    assert r["run_id"] == run_id(r["config_sha256"], r["git"])
