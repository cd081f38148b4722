"""`moebench reproduce` as one sweep: the jobs each experiment's sweeps expand to (Hydra's
basic-sweeper order), the seed axis, the folders' plans, the job file, the launcher's
settings and the per-folder counts. Expected values are written out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from analysis.repro.launch import launcher_arg, launcher_overrides
from analysis.repro.layout import seeded, sweep_plan
from analysis.repro.plan import expand_calls, real_calls, records, synthetic_calls
from analysis.repro.registry import EXPERIMENTS
from analysis.repro.spec import SEEDS, Sweep
from core.specs import SpecError
from harness.runner.sweep import folder_counts
from harness.runner.sweep_jobs import expand, read_job_file, write_job_file
from harness.runner.sweep_size import sweep_total

TABLE1_SYSTEMS = ["diff_moe", "diff_moe_floor_recency", "fmoe", "fmoe_admission",
                  "layer_offload", "lru", "moe_infinity", "moe_infinity_hysteresis", "no_offload",
                  "on_demand", "oracle"]


CACHE_LIMIT_AXES = ["expert_cache_gb", "hardware.gpu_mem_gb", "hardware.num_gpus",
                    "hardware.peer", "placement", "seed", "system.evictor", "system.prefetcher"]


def test_expand_crosses_the_sweeps_in_the_basic_sweepers_order():
    assert expand(["experiment=x", "system=lru,on_demand", "seed=0,1", "max_batch=2"]) == [
        ["experiment=x", "system=lru", "seed=0", "max_batch=2"],
        ["experiment=x", "system=lru", "seed=1", "max_batch=2"],
        ["experiment=x", "system=on_demand", "seed=0", "max_batch=2"],
        ["experiment=x", "system=on_demand", "seed=1", "max_batch=2"],
    ]


def test_expand_a_repeated_key_keeps_its_place_and_last_value():
    assert expand(["seed=0,1", "max_batch=2", "seed=7"]) == [["seed=7", "max_batch=2"]]
    assert expand(["workload.task_order=[mmlu],[bigbench]", "progress=false"]) == [
        ["workload.task_order=[mmlu]", "progress=False"],
        ["workload.task_order=[bigbench]", "progress=False"],
    ]


def test_expand_refuses_what_is_no_list_of_jobs():
    with pytest.raises(SpecError, match="interval sweep"):
        expand(["x=interval(0,1)"])
    with pytest.raises(SpecError, match="overrides"):
        expand(["seed=[unclosed"])


def test_seeds_are_added_unless_the_sweep_or_the_command_sets_them():
    assert SEEDS == (0, 1, 2, 3, 4)
    plain = Sweep(("system=lru,on_demand",))
    assert seeded(plain, SEEDS) == ("system=lru,on_demand", "seed=0,1,2,3,4")
    assert seeded(plain, (0,)) == ("system=lru,on_demand", "seed=0")
    assert seeded(plain, (0,), ["seed=9"]) == ("system=lru,on_demand",)
    own = Sweep(("model=arctic", "seed=0,1,2"))
    assert seeded(own, SEEDS) == ("model=arctic", "seed=0,1,2")
    # a real sample fixes its requests: one seed, its replicates are the requests
    assert seeded(Sweep(("system=lru",), real=True), SEEDS) == ("system=lru", "seed=0")


def test_table1_jobs_one_seed(tmp_path):
    calls = synthetic_calls("table1", Path("r"), [], 1)
    assert [c.folder for c in calls] == ["table1"]
    jobs = expand_calls(calls)
    assert jobs == [["experiment=table1", f"system={s}", "seed=0", "results_dir=r",
                     "experiment_name='table1'", "progress=False"] for s in TABLE1_SYSTEMS]


def test_jobs_of_an_overridden_setting_go_to_its_own_folder():
    calls = synthetic_calls("eamc_capacity", Path("r"), ["workload.num_requests=3"], 2)
    jobs = expand_calls(calls)
    assert len(jobs) == 28  # 2 systems (the seed and its variant) x 7 capacities x 2 seeds
    tail = ["results_dir=r", "workload.num_requests=3",
            "experiment_name='eamc_capacity-workload.num_requests=3'", "progress=False"]
    assert jobs[:3] == [
        ["experiment=eamc_capacity", "system=moe_infinity", "system.eamc_capacity=1", "seed=0",
         *tail],
        ["experiment=eamc_capacity", "system=moe_infinity", "system.eamc_capacity=1", "seed=1",
         *tail],
        ["experiment=eamc_capacity", "system=moe_infinity", "system.eamc_capacity=3", "seed=0",
         *tail],
    ]
    assert jobs[14][1:3] == ["system=moe_infinity_hysteresis", "system.eamc_capacity=1"]


def test_a_launcher_setting_in_override_is_no_job_override():
    calls = synthetic_calls("fmoe_store_capacity", Path("r"),
                            ["hydra.launcher.n_jobs=4", "workload.num_requests=3"], 1)
    assert all(not o.startswith("hydra") for c in calls for o in c.overrides)
    assert calls[0].folder == "fmoe_store_capacity-workload.num_requests=3"


def test_jobs_are_listed_once_and_in_order():
    calls = synthetic_calls("fmoe_store_capacity", Path("r"), [], 1) * 2
    jobs = expand_calls(calls, before=[["a=1"]])
    assert [j[1:3] for j in jobs[1:]] == [[f"system={s}", f"system.store_capacity={n}"]
                                          for s in ("fmoe", "fmoe_admission")
                                          for n in (16, 64, 256, 1000, 4000)]
    assert jobs[0] == ["a=1"] and len(jobs) == 11


def test_every_experiment_at_one_seed_and_at_five():
    one = expand_calls([c for n in EXPERIMENTS for c in synthetic_calls(n, Path("r"), [], 1)])
    five = expand_calls([c for n in EXPERIMENTS for c in synthetic_calls(n, Path("r"), [], None)])
    # no sweep pins its seeds any more: every synthetic run takes 1 or 5 (routing_fidelity:
    # six models' traces, 6 of the 414). 322 before the named variants joined every sweep
    # of their seed: + eamc_capacity 7, workload_shift 12, long_context 7, fmoe_online 2,
    # fmoe_cache_limit 2 x 5, fmoe_prefetch_distance 3 x 8, fmoe_store_capacity 5,
    # fmoe_batch 2 x 4, fmoe_ablation 1, diffmoe_batch 2 models x 8 batches = 92;
    # + table1_q4: Table 1's 11 systems in its three arms = 33 (447 in all).
    # tiers runs its own 3 seeds: DeepSeek-V2-Lite 2 widths x 5 DRAM sizes x 2 systems,
    # Mixtral 4 x 2, 2 models x (3 handlers + 3 CPU-offload systems) x 3 links x 2 hosts,
    # and MoE-Infinity's 4 hosts x 2 (the paper's DRAM, unbounded) x 2 systems = 116 per seed.
    # fmoe_cache_limit's 48 and 96 GB on six RTX 3090s: 5 systems x 2 sizes, lru at 96,
    # ProMoE and the LRU stand-in x 2 = 15 more (462 in all).
    # gpus runs its own 3 seeds: 2 models x 4 systems x (one GPU + 3 placements x 3 counts)
    # = 80 per seed
    assert (len(one), len(five)) == (462 + 116 + 80, 5 * 462 + 3 * 116 + 3 * 80)


def test_a_sweep_moebench_m_refuses_is_refused_before_anything():
    with pytest.raises(SpecError, match="run_name"):
        synthetic_calls("table1", Path("r"), ["run_name=same"], 1)


def test_real_sweeps_are_skipped_without_the_sample(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEBENCH_SHARED_DATA", str(tmp_path / "absent"))
    assert real_calls("table1", tmp_path, [], 1) == ([], 0)
    assert "the shared sample for deepseek_v2_lite is absent" in capsys.readouterr().out
    assert real_calls("table1", tmp_path, ["routing=x.npz"], 1) == ([], 0)
    assert "routing= is given" in capsys.readouterr().out
    assert real_calls("eamc_capacity", tmp_path, [], 1) == ([], 0)  # it has none
    assert not list(tmp_path.iterdir())


def test_records_name_the_last_sweep_of_each_folder():
    calls = synthetic_calls("fmoe_batch", Path("r"), [], 1)
    assert records(calls, Path("r")) == {"r/fmoe_batch": list(calls[-1].overrides)}
    assert calls[-1].overrides[1:5] == ("system=composed", "system/evictor=lfu_perfect",
                                        "system/prefetcher=promoe", "max_batch=1,2,3,4")


@pytest.mark.parametrize("name, real, seeds, expected", [
    # 11 named systems (8 seeds of the papers' rules and bounds + 3 named variants)
    ("table1", False, None, (["seed"], 55)),
    ("table1", False, 1, (["seed"], 11)),
    ("table1", True, 2, (["seed"], 11)),  # a real sample runs one seed
    # with the seed system's named variant beside it: 2 x 7 capacities x 3 seeds
    ("eamc_capacity", False, 3, (["seed", "system.eamc_capacity"], 42)),
    # 3 models x (fmoe, fmoe_admission) x d = 1..8
    ("fmoe_prefetch_distance", False, 1, (["model", "seed", "system.prefetch_distance"], 48)),
    # several sweeps: every key they set is an axis. Per seed: 5 systems (3 + 2 variants) x
    # 5 sizes, lru at 4, ProMoE at 5, the stand-in at 2 = 36 on the lifted card; on six
    # RTX 3090s 5 systems x 2 sizes, lru at 1, ProMoE and the stand-in at 2 = 15
    ("fmoe_cache_limit", False, 1, (CACHE_LIMIT_AXES, 51)),
    ("fmoe_cache_limit", False, None, (CACHE_LIMIT_AXES, 255)),
    # its own 3 seeds: 2 models x 4 systems x (one GPU + 3 placements x 2, 4, 6 GPUs)
    ("gpus", False, None, (["hardware.num_gpus", "model", "placement", "seed"], 240)),
    # per seed: Arctic 2 x 2 workloads, NLLB and Mixtral 2 x 2 x 2, 3 reference runs, and
    # the variant's 3 models x 2 x 2 = 27
    ("workload_shift", False, 1, (["calibration_requests", "model", "seed",
                                   "system.learn_online", "workload.calibration_tasks",
                                   "workload.task_order"], 27)),
])
def test_sweep_plan_counts_the_seeds(name, real, seeds, expected):
    assert sweep_plan(name, [], real, seeds) == expected


def test_job_file_round_trip_and_refusals(tmp_path):
    path = tmp_path / "jobs.json"
    write_job_file(path, [["a=1", "b=2"], ["a=2", "b=2"]], {"r/x": ["a=1,2", "b=2"]})
    assert read_job_file(path) == {"jobs": [["a=1", "b=2"], ["a=2", "b=2"]],
                                   "records": {"r/x": ["a=1,2", "b=2"]}}
    cfg = OmegaConf.create({"hydra": {"sweeper": {"job_file": str(path)},
                                      "overrides": {"task": []}}})
    assert sweep_total(cfg) == 2
    plain = OmegaConf.create({"hydra": {"overrides": {"task": ["seed=0,1,2", "x=1,2"]}}})
    assert sweep_total(plain) == 6
    for bad, why in (({"version": 2, "jobs": [["a=1"]]}, "version 1"),
                     ({"version": 1, "jobs": []}, "non-empty"),
                     ({"version": 1, "jobs": [["a=1", 3]]}, "non-empty list of override"),
                     ({"version": 1, "jobs": [["a=1"]], "records": {"x": "a=1"}}, "records")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=why):
            read_job_file(path)


def test_launcher_settings():
    assert launcher_overrides("joblib", 3, []) == ["hydra/launcher=joblib",
                                                   "hydra.launcher.n_jobs=3"]
    assert launcher_overrides("joblib", 1, []) == []  # Hydra's basic launcher
    assert launcher_arg("ray.init.address=auto") == "++hydra.launcher.ray.init.address=auto"
    assert launcher_arg("hydra.launcher.partition=cpu") == "++hydra.launcher.partition=cpu"
    with pytest.raises(SpecError, match="--launcher-arg: one job at a time"):
        launcher_overrides("joblib", 1, ["n_jobs=2"])
    with pytest.raises(SpecError, match="--launcher: unknown launcher 'slurm'"):
        launcher_overrides("slurm", 2, [])
    for bad in ("address", "=1", "+x=1", "hydra/launcher=ray", "x=1,2", "x=[unclosed"):
        with pytest.raises(SpecError, match="--launcher-arg"):
            launcher_arg(bad)


def test_folder_counts(tmp_path):
    outcomes = [("done", "r/table1/lru-1"), ("skipped", "r/table1/fmoe-2"),
                ("failed", "r/table1_real/lru-3"), ("failed", None), ("done", "r/x/a")]
    for i, (status, run_dir) in enumerate(outcomes):
        (tmp_path / f"job-{i:06d}.json").write_text(json.dumps(
            {"status": status, "run_dir": run_dir, "reason": None}))
    assert folder_counts(tmp_path) == {
        "table1": {"done": 1, "failed": 0, "skipped": 1},
        "table1_real": {"done": 0, "failed": 1, "skipped": 0},
        "x": {"done": 1, "failed": 0, "skipped": 0}}


# ---- one small experiment end to end (a child `moebench -m`, Hydra's basic launcher) -------
def test_reproduce_runs_resumes_and_reports_at_the_seeds_asked(tmp_path, monkeypatch, capsys):
    from analysis.repro import suite

    monkeypatch.chdir(tmp_path)
    tiny = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
            "calibration_requests=2"]
    folder = Path("r") / ("fmoe_store_capacity-calibration_requests=2,workload.num_requests=2,"
                          "workload.output_len=2,workload.prompt_len=8")
    assert suite.reproduce(["fmoe_store_capacity"], Path("r"), tiny, jobs=1, n_seeds=1) == 0
    out = capsys.readouterr().out
    # fmoe and its named variant at 5 capacities
    assert "reproduce: 10 jobs in one sweep" in out
    assert "reproduce fmoe_store_capacity: 10 done, 0 failed, 0 skipped" in out
    runs = sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir() if p.is_dir())
    assert runs == sorted(f"{s},calibration_requests=2,seed=0,system.store_capacity={c},"
                          "workload.num_requests=2,workload.output_len=2,workload.prompt_len=8"
                          for s in ("fmoe", "fmoe_admission") for c in (16, 64, 256, 1000, 4000))
    declared = OmegaConf.load(folder / "multirun.yaml").hydra.overrides.task
    assert list(declared)[:4] == ["experiment=fmoe_store_capacity", "system=fmoe,fmoe_admission",
                                  "system.store_capacity=16,64,256,1000,4000", "seed=0"]
    assert not list(Path("r").glob(".sweep-*"))  # the sweep's state folder is gone
    assert "PARTIAL" not in (folder / "fmoe_store_capacity.md").read_text()
    # the folder is complete at one seed, partial at all five
    assert suite.report("fmoe_store_capacity", Path("r"), tiny, n_seeds=1) == 0
    assert suite.report("fmoe_store_capacity", Path("r"), tiny) == 2
    assert "partial: no run for 40 of the 50 runs" in capsys.readouterr().err
    assert suite.reproduce(["fmoe_store_capacity"], Path("r"), tiny, jobs=1, n_seeds=1) == 0
    assert "reproduce fmoe_store_capacity: 0 done, 0 failed, 10 skipped" in \
        capsys.readouterr().out


def test_a_job_works_in_the_directory_its_sweep_started_in(tmp_path, monkeypatch):
    """A Ray or SLURM worker starts elsewhere; the job-file sweeper tells each job where the
    sweep runs (CWD_ENV), where its relative results_dir points."""
    from harness.runner.config import compose_config
    from harness.runner.sweep import CWD_ENV, run_job

    sweep_dir, worker = tmp_path / "sweep", tmp_path / "worker"
    sweep_dir.mkdir()
    worker.mkdir()
    cfg = compose_config(["system=on_demand", "workload.num_requests=2", "workload.prompt_len=8",
                          "workload.output_len=2", "progress=false", "trace_cache_dir=null"],
                         run_name="a", results_dir="r")
    monkeypatch.chdir(worker)
    monkeypatch.setenv(CWD_ENV, str(sweep_dir))
    assert run_job(cfg, multirun=True, system_name="on_demand")["status"] == "done"
    assert (sweep_dir / "r" / "default" / "a" / "result.json").is_file()
    assert not (worker / "r").exists() and Path.cwd() == worker  # its own directory is back
    monkeypatch.setenv(CWD_ENV, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):  # the sweeper then counts it failed
        run_job(cfg, multirun=True, system_name="on_demand")


def test_every_seed_system_runs_with_its_variants_at_every_point():
    """A named variant is shown wherever its seed runs: for every job of a seed
    system, the same job with each of its variants in its place is in the experiment's plan.
    The one exception: workload_shift's reference runs (the seed without online learning)."""
    from systems.variants import variants_of

    for name in EXPERIMENTS:
        planned = {(tuple(o for o in j if not o.startswith("system=")),
                    next((o[len("system="):] for o in j if o.startswith("system=")), None))
                   for j in expand_calls(synthetic_calls(name, Path("r"), [], 1))}
        for rest, system in sorted(planned, key=str):
            if "system.learn_online=false" in rest:
                continue
            for v in variants_of(system):
                assert (rest, v) in planned, (name, system, v, rest)
