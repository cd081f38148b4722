"""The LOSSY label (core/precision.py): below 16 bits, experts or dense weights."""

from __future__ import annotations

import pytest

from core.precision import config_bits, is_lossy, lossy_label, results_label


@pytest.mark.parametrize(("bits", "lossy"), [((16, 16), False), ((32, 32), False),
                                             ((4, 16), True), ((16, 8), True), ((2, 4), True)])
def test_below_sixteen_bits_is_lossy(bits, lossy):
    assert is_lossy(*bits) is lossy


def test_labels_name_the_widths():
    assert lossy_label([(16, 16), (32, 32)]) is None
    assert lossy_label([(2, 4)]) == "LOSSY: 2-bit experts, 4-bit dense"
    # DeepSeek-V3 as shipped (fp8): lossy by the rule, the widths say what it is
    assert lossy_label([(8, 8)]) == "LOSSY: 8-bit experts, 8-bit dense"
    assert lossy_label([(2, 4), (3, 4), (2, 4)]) == "LOSSY: 2/3-bit experts, 4-bit dense"
    assert lossy_label([(16, 16), (4, 16)]) == ("LOSSY: 4-bit experts, 16-bit dense (rows at "
                                                "these widths)")


def test_results_label_reads_the_configs():
    results = [{"config": {"model": {"expert_bits": 4, "dense_bits": 16}}},
               {"config": {"model": {"expert_bits": 4.0, "dense_bits": 16}}},
               {"status": "failed"}]  # a failure record without a config: no widths
    assert config_bits(results[2].get("config")) is None
    assert results_label(results) == "LOSSY: 4-bit experts, 16-bit dense"
