"""The prompts and arrivals config groups: they compose with every
model, system and hardware, replace workload=poisson|azure_* (the old names are errors naming
the new ones), are refused beside routing=FILE, name themselves on the run's line, and
`moebench list` shows every option with its yaml's first comment line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from analysis import listing
from core.specs import SpecError
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.run import execute, run_config
from harness.runner.runconfig import check_before_naming

CONF = ROOT / "conf"
PROMPTS = ["bigbench", "flan", "lmsys", "mmlu", "sharegpt", "synthetic"]
ARRIVALS = ["azure_code", "azure_conv", "gamma", "offline", "poisson"]
# (process, kind) each arrivals option must compose to; None: no arrival process
PROCESS = {"offline": None, "poisson": ("poisson", None), "gamma": ("gamma", None),
           "azure_conv": ("azure", "conv"), "azure_code": ("azure", "code")}
# The default workload node before the groups existed (the Table 1 trace is made from it:
# sha 8159a29481879ad2 then, 2e04c1cb192a4e76 with generator version 4, the DeepSeek-V2-Lite
# preset file and embed_noise 3.0, docs/trace-format.md): the groups must compose exactly this.
DEFAULT_WORKLOAD = {
    "_target_": "workloads.synthetic.SyntheticConfig", "num_requests": 290, "prompt_len": 512,
    "output_len": 32, "arrival_ms": 0.0, "lengths": "fixed", "length_source": "azure_conv",
    "arrivals": None, "prompts": None, "cross_layer_corr": 0.95, "spec_noise_nats": 0.0}
TINY = ["workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=3",
        "calibration_requests=3", "progress=false"]


def _stems(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_group_options_are_the_issue_lists():
    assert _stems("prompts") == PROMPTS and _stems("arrivals") == ARRIVALS


def test_default_and_table1_workload_unchanged():
    for overrides in ([], ["experiment=table1"], ["prompts=synthetic", "arrivals=offline"]):
        assert compose_config(overrides)["workload"] == DEFAULT_WORKLOAD


@pytest.mark.parametrize("prompts", PROMPTS)
@pytest.mark.parametrize("arrivals", ARRIVALS)
def test_every_pair_composes(prompts, arrivals):
    cfg = compose_config([f"prompts={prompts}", f"arrivals={arrivals}"])
    w = cfg["workload"]
    if prompts == "synthetic":
        assert w["prompts"] is None
    else:
        assert w["prompts"]["dataset"] == prompts and w["prompts"]["coupling"] == 1.0
    a = w["arrivals"]
    assert (None if a is None else (a["process"], a.get("kind"))) == PROCESS[arrivals]
    check_before_naming(cfg)  # no unknown key, not refused


@pytest.mark.parametrize("group,option", [("model", m) for m in _stems("model")]
                         + [("hardware", h) for h in _stems("hardware")]
                         + [("system", s) for s in _stems("system")])
def test_groups_combine_with_every_model_system_hardware(group, option):
    cfg = compose_config([f"{group}={option}", "prompts=mmlu", "arrivals=gamma"])
    assert cfg["workload"]["prompts"]["dataset"] == "mmlu"
    assert cfg["workload"]["arrivals"]["process"] == "gamma"
    check_before_naming(cfg)


def test_fmoe_online_migrated_to_the_arrivals_group():
    cfg = compose_config(["experiment=fmoe_online"])
    a = cfg["workload"]["arrivals"]
    assert (a["process"], a["kind"], a["rate_rps"], a["path"]) == ("azure", "conv", 2.91, None)
    text = (CONF / "experiment" / "fmoe_online.yaml").read_text()
    assert "override /arrivals: azure_conv" in text and "/workload: azure" not in text


@pytest.mark.parametrize("old", ["poisson", "azure_conv", "azure_code"])
def test_old_workload_names_name_the_new_group(old):
    with pytest.raises(SpecError, match=rf"workload=.*{old}.*use arrivals={old}"):
        check_before_naming(compose_config([f"workload={old}"]))


def test_old_name_on_the_command_line_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "moebench.cli", "workload=poisson",
                        f"results_dir={tmp_path}", *TINY], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "use arrivals=poisson" in p.stderr
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_prompts_with_a_routing_file_refused(tmp_path):
    trace = tmp_path / "t.npz"
    trace.write_bytes(b"x")  # the refusal comes before the file is read
    cfg = compose_config(["prompts=mmlu", f"routing={trace}", *TINY],
                         results_dir=str(tmp_path / "res"))
    with pytest.raises(SpecError, match=r"^prompts: routing=.* already fixes the prompts"):
        run_config(cfg)
    assert not (tmp_path / "res").exists()


def test_run_line_names_prompts_and_arrivals(tmp_path):
    from moebench.cli import _describe

    cfg = compose_config(["arrivals=poisson", "workload.arrivals.rate_rps=50", "max_batch=2",
                          "system=on_demand", *TINY], run_name="p", results_dir=str(tmp_path))
    result = execute(assemble(cfg))
    assert result.status == "valid"
    arrival = np.asarray(result.trace["arrivals"]["rate_rps"])
    assert arrival == 50.0
    line = _describe(result.record(), str(result.run_dir))
    assert "| prompts=synthetic arrivals=poisson: valid" in line
    assert line.startswith("[SIMULATED, synthetic routing] on_demand |")


# the yamls that set weights below 16 bits, and their label in `moebench list`
LOSSY_YAMLS = {("experiment", "mixtral_offloading_ablation"): "LOSSY: 2-bit experts, 4-bit dense",
               ("experiment", "table1_q4"): "LOSSY: 4-bit experts, 16-bit dense"}


def _first_comment(path: Path) -> str:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    return next(ln[1:].strip() for ln in lines if "@package" not in ln)


@pytest.mark.parametrize("kind,group", [("prompts", "prompts"), ("arrivals", "arrivals"),
                                        ("models", "model"), ("experiments", "experiment")])
def test_list_prints_one_line_each(capsys, kind, group):
    assert listing.main([kind]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{kind}:"
    rows = out[1:]
    assert len(rows) == len(_stems(group))
    for row, stem in zip(rows, _stems(group)):
        name, text = row.split(None, 1)
        assert name == f"{group}={stem}"
        # a model or experiment below 16 bits is marked after its comment (core/precision.py)
        lossy = LOSSY_YAMLS.get((group, stem))
        if lossy:
            assert text.endswith(f" [{lossy}]")
            text = text.removesuffix(f" [{lossy}]")
        assert text == _first_comment(CONF / group / f"{stem}.yaml") and text
        assert "LOSSY" not in text


def test_list_everything_and_bad_kind(capsys):
    assert listing.main([]) == 0
    out = capsys.readouterr().out
    for kind in ("systems:", "models:", "hardware:", "prompts:", "arrivals:", "experiments:"):
        assert f"\n{kind}\n" in f"\n{out}"
    assert "system/evictor=lfu " in out and "system/prefetcher=none " in out
    assert "workload=" not in out  # the old names are not offered
    with pytest.raises(SystemExit) as exc:
        listing.main(["workloads"])
    assert exc.value.code == 2
