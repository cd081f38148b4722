"""The GPU-to-GPU peer-link profiles under conf/hardware/peer against their schema and sources.

Each file lands at `hardware` (`# @package hardware`): `num_gpus: 2` and the link under
`peer` (docs/gpus.md). Each must carry exactly the schema's keys, parse as a PeerSpec, name
itself after its stem, tag every number [R]/[C]/[G] on its own line (the raw text is read,
as a reader of the yaml sees it), name a known topology, stay within a sane range, and match
the headline numbers below, hand-copied from the sources its comments name, so that a
changed value must change this test too. Record:
docs/decisions/2026-12-06-peer-link-profiles.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from core.gpu_specs import peer_spec_from_dict

PEER = ROOT / "conf" / "hardware" / "peer"
KEYS = {"name", "display_name", "peer_gbps", "peer_latency_us", "topology"}
TOPOLOGIES = {"pairs", "all", "pcie"}
# Headline numbers: (peer_gbps, topology).
# 47: [G] 56.25 GB/s per direction nominal (GA102 whitepaper; tinygrad/open-gpu-kernel-modules#3)
#     x 0.836, the measured/nominal ratio of H100 NVLink 4 (376 / 450, NVIDIA/nccl#1264).
# 26.3: six RTX A6000 P2P without NVLink (NVIDIA/nvbandwidth#50).
# 376: HGX H100 SXM unidirectional P2P writes 371.02-376.82 GB/s (NVIDIA/nccl#1264).
# 259: HGX A100 SXM bidirectional P2P 517-520 GB/s, halved (NVIDIA/nccl-tests#100).
EXPECTED = {"nvlink_3090_bridge": (47, "pairs"), "pcie4_p2p": (26.3, "pcie"),
            "nvswitch_h100": (376, "all"), "nvlink_a100": (259, "all")}
# Nominal rate per direction, GB/s: a measured copy rate above it is impossible.
NOMINAL = {"nvlink_3090_bridge": 56.25, "pcie4_p2p": 32.0, "nvswitch_h100": 450.0,
           "nvlink_a100": 300.0}

TAG = re.compile(r"#.*\[[RCG]\]")
NUMBER = re.compile(r"^  (\w+):\s*(-?[\d.]+(?:e-?\d+)?)\s*(#.*)?$")


def _files() -> list[Path]:
    return sorted(PEER.glob("*.yaml"))


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path} is not a mapping"
    assert path.read_text().startswith("# @package hardware\n")
    assert set(data) == {"num_gpus", "peer"} and data["num_gpus"] == 2
    return data["peer"]


def test_profile_files_match_the_expected_set():
    assert {p.stem for p in _files()} == set(EXPECTED)


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_keys_equal_the_schema_and_name_is_the_stem(path):
    data = _load(path)
    assert set(data) == KEYS
    assert data["name"] == path.stem
    for key in ("name", "display_name", "topology"):
        assert isinstance(data[key], str) and data[key]
    for key in ("peer_gbps", "peer_latency_us"):
        value = data[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), key
    assert peer_spec_from_dict(data, "hardware.peer").name == path.stem


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_every_number_carries_a_source_tag(path):
    numbers = [line for line in path.read_text().splitlines() if NUMBER.match(line)]
    assert len(numbers) == 2  # peer_gbps, peer_latency_us
    untagged = [line for line in numbers if not TAG.search(line)]
    assert not untagged, f"{path.name}: no [R]/[C]/[G] tag on {untagged}"


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_values_in_range_and_as_sourced(path):
    data = _load(path)
    assert data["topology"] in TOPOLOGIES
    assert 5 <= data["peer_gbps"] <= 500
    assert data["peer_gbps"] < NOMINAL[path.stem]
    assert 0 <= data["peer_latency_us"] <= 100
    assert (data["peer_gbps"], data["topology"]) == EXPECTED[path.stem]


def test_gpu_globs_do_not_see_the_peer_profiles():
    # tests that glob conf/hardware/*.yaml take every match for a GPU profile
    gpu = {p.stem for p in (ROOT / "conf" / "hardware").glob("*.yaml")}
    assert gpu and not gpu & set(EXPECTED)
