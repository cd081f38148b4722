"""The host, NVMe and link profiles under conf/hardware/{host,nvme,link} against their schema,
their sources and Hydra.

Kept beside tests/core/test_specs.py (which checks the GPU yamls) rather than in it, which
would pass the 400-line limit. Each file must carry exactly the schema's keys, name itself
after its stem, tag every number [R]/[C]/[G] on its own line (the raw text is read, as a
reader of the yaml sees it), stay within sane ranges, and match the headline numbers below,
hand-copied from the sources its comments name, so that a changed value must change this
test too. Every host x NVMe x link combination parses through
core.specs.hardware_spec_from_dict beside a GPU profile, merged by hand and composed by Hydra.
"""

from __future__ import annotations

import re
from itertools import product
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from core.specs import hardware_spec_from_dict
from harness.runner.config import compose_config
from harness.runner.runconfig import check_before_naming

HARDWARE = ROOT / "conf" / "hardware"
GPU = "rtx_4090"  # the GPU profile the parts are combined with
GROUPS = ("host", "nvme", "link")

# The schema: every key required.
KEYS = {
    "host": {"name", "display_name", "dram_gb", "reserve_gb", "mem_gbps", "cpu_tflops",
             "cpu_expert_overhead_us"},
    "nvme": {"name", "display_name", "capacity_gb", "read_gbps", "latency_us", "queue_depth",
             "chunk_mb"},
    "link": {"link", "h2d_gbps", "h2d_latency_us"},
}
# The key that names the profile (it equals the file's stem).
NAME_KEY = {"host": "name", "nvme": "name", "link": "link"}

# Headline numbers, copied from the sources the yamls cite.
# host: (mem_gbps, cpu_tflops). 89.6 = 2 x DDR5-5600 x 8 B and 307.2 = 8 x DDR5-4800 x 8 B
# (channels and speeds: ocinside.de i9-14900K review; kTransformers' DeepseekR1_V3 tutorial);
# 21 TFLOPS: kTransformers doc/en/AMX.md; 1.4 is an estimate ([G] in its yaml).
EXPECTED_HOST = {"ddr5_dual_channel": (89.6, 1.4), "ddr5_eight_channel": (307.2, 21)}
# nvme: sequential read GB/s, Samsung 990 PRO "7,450 MB/s" (digitec.ch), PM1743 "13.000 MB/s"
# (computerbase.de 2021-12).
EXPECTED_NVME = {"consumer_pcie4_x4": 7.45, "datacenter_pcie5": 13.0}
# link: (measured pinned H2D GB/s, PCIe generation). 12: Gen3 12.4 / 12.15 GB/s
# (hardware_sources.md); 25: Gen4 25.8 / 24.1 GB/s (same); 56: nvbandwidth CE 56.30-56.41 GB/s
# (tinygrad/open-gpu-kernel-modules#29).
EXPECTED_LINK = {"pcie3_x16": (12, 3), "pcie4_x16": (25, 4), "pcie5_x16": (56, 5)}
EXPECTED = {"host": EXPECTED_HOST, "nvme": EXPECTED_NVME, "link": EXPECTED_LINK}
# Nominal x16 rate per direction (as tests/core/test_specs.py): a copy rate above it is
# impossible.
LINK_GBPS = {3: 15.75, 4: 32.0, 5: 64.0}

TAG = re.compile(r"#.*\[[RCG]\]")
NUMBER = re.compile(r"^(\w+):\s*(-?[\d.]+(?:e-?\d+)?)\s*(#.*)?$")


def _files(group: str) -> list[Path]:
    return sorted((HARDWARE / group).glob("*.yaml"))


def _cases() -> list:
    return [pytest.param(group, path, id=f"{group}/{path.stem}")
            for group in GROUPS for path in _files(group)]


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path} is not a mapping"
    return data


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.parametrize("group", GROUPS)
def test_profile_files_match_the_expected_set(group):
    assert {p.stem for p in _files(group)} == set(EXPECTED[group])


@pytest.mark.parametrize(("group", "path"), _cases())
def test_keys_equal_the_schema_and_name_is_the_stem(group, path):
    data = _load(path)
    assert set(data) == KEYS[group]
    assert data[NAME_KEY[group]] == path.stem
    for key, value in data.items():
        if key in ("name", "display_name", "link"):
            assert isinstance(value, str) and value
        else:
            assert _is_number(value), f"{path.name}: {key} is not a number"


@pytest.mark.parametrize(("group", "path"), _cases())
def test_every_number_carries_a_source_tag(group, path):
    numbers = [line for line in path.read_text().splitlines() if NUMBER.match(line)]
    assert len(numbers) == len(KEYS[group]) - (1 if group == "link" else 2)
    untagged = [line for line in numbers if not TAG.search(line)]
    assert not untagged, f"{path.name}: no [R]/[C]/[G] tag on {untagged}"


@pytest.mark.parametrize("path", _files("link"), ids=lambda p: p.stem)
def test_link_profiles_override_the_hardware_node(path):
    # conf/hardware/link lands on `hardware`, where it replaces the GPU profile's link values
    assert path.read_text().splitlines()[0] == "# @package hardware"


@pytest.mark.parametrize("path", _files("host"), ids=lambda p: p.stem)
def test_host_values_in_range_and_as_sourced(path):
    h = _load(path)
    assert 20 <= h["mem_gbps"] <= 1000
    assert 0.1 <= h["cpu_tflops"] <= 100
    assert 0 <= h["reserve_gb"] < h["dram_gb"]
    assert 0 <= h["cpu_expert_overhead_us"] < 1000
    assert (h["mem_gbps"], h["cpu_tflops"]) == EXPECTED_HOST[path.stem]


@pytest.mark.parametrize("path", _files("nvme"), ids=lambda p: p.stem)
def test_nvme_values_in_range_and_as_sourced(path):
    n = _load(path)
    assert 0.5 <= n["read_gbps"] <= 30
    assert n["capacity_gb"] > 0 and n["chunk_mb"] > 0
    assert 1 <= n["latency_us"] <= 10_000
    assert isinstance(n["queue_depth"], int) and n["queue_depth"] >= 1
    assert n["read_gbps"] == EXPECTED_NVME[path.stem]


@pytest.mark.parametrize("path", _files("link"), ids=lambda p: p.stem)
def test_link_values_in_range_and_as_sourced(path):
    link = _load(path)
    h2d, gen = EXPECTED_LINK[path.stem]
    assert 5 <= link["h2d_gbps"] <= 80
    assert link["h2d_gbps"] == h2d
    assert link["h2d_gbps"] < LINK_GBPS[gen]
    assert link["h2d_latency_us"] >= 0


def test_gpu_globs_see_only_the_gpu_profiles():
    # tests/core/test_specs.py, tests/runner/test_config_groups.py and test_results.py glob
    # conf/hardware/*.yaml as the GPU profiles: the subfolders must stay out of it.
    gpu = {p.stem for p in HARDWARE.glob("*.yaml")}
    profiles = {p.stem for group in GROUPS for p in _files(group)}
    assert gpu and not gpu & profiles
    assert all("gpu_mem_gb" in _load(p) for p in HARDWARE.glob("*.yaml"))


def _override(group: str, option: str) -> str:
    """`group=option` once conf/config.yaml lists the group in its defaults, `+group=option`
    (append) before."""
    defaults = _load(ROOT / "conf" / "config.yaml")["defaults"]
    listed = any(isinstance(d, dict) and group in d for d in defaults)
    return f"{'' if listed else '+'}{group}={option}"


@pytest.mark.parametrize(("group", "path"), _cases())
def test_profile_composes_where_the_schema_says(group, path):
    cfg = compose_config([f"hardware={GPU}", _override(f"hardware/{group}", path.stem)])
    hw, data = cfg["hardware"], _load(path)
    assert hw["name"] == GPU  # the GPU profile stays
    if group == "link":  # merged into the GPU node: its h2d values replace the GPU's
        assert {k: hw[k] for k in data} == data
    else:
        assert hw[group] == data


@pytest.mark.parametrize(("host", "nvme", "link"), list(product(
    *[[p.stem for p in _files(group)] for group in GROUPS])))
def test_every_combination_parses_into_a_hardware_spec(host, nvme, link):
    gpu = _load(HARDWARE / f"{GPU}.yaml")
    parts = {g: _load(HARDWARE / g / f"{stem}.yaml")
             for g, stem in (("host", host), ("nvme", nvme), ("link", link))}
    hw = hardware_spec_from_dict({**gpu, "host": parts["host"], "nvme": parts["nvme"],
                                  **parts["link"]}, "combined")
    assert hw.name == GPU and hw.gpu_mem_gb == gpu["gpu_mem_gb"]
    assert {k: getattr(hw.host, k) for k in parts["host"]} == parts["host"]
    assert {k: getattr(hw.nvme, k) for k in parts["nvme"]} == parts["nvme"]
    assert {k: getattr(hw, k) for k in parts["link"]} == parts["link"]
    # The same through Hydra, as `moebench hardware=... hardware/host=...` composes it
    cfg = compose_config([f"hardware={GPU}", _override("hardware/host", host),
                          _override("hardware/nvme", nvme), _override("hardware/link", link)])
    check_before_naming(cfg)
    assert hardware_spec_from_dict(cfg["hardware"]) == hw


@pytest.mark.parametrize("path", _files("host"), ids=lambda p: p.stem)
def test_dram_override_reaches_the_spec(path):
    # docs/hardware.md: a profile gives a typical size, hardware.host.dram_gb= sets yours
    cfg = compose_config([f"hardware={GPU}", _override("hardware/host", path.stem),
                          "hardware.host.dram_gb=32"])
    host = hardware_spec_from_dict(cfg["hardware"]).host
    assert host.dram_gb == 32
    assert host.expert_capacity_bytes == int((32 - _load(path)["reserve_gb"]) * 2**30)
