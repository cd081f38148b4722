"""moebench fit-routing's score and DeepSeek-V2-Lite fit, and the token latent
(workloads/token_latent.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from helpers import conf_model

from analysis.fit_routing import score
from workloads.presets import DEFAULTS, load_preset
from workloads.synthetic import SyntheticConfig, generate_trace
from workloads.token_latent import LATENT_RANK, add_latent, latent_loadings


def _row(value, target, tol, bound=""):
    ok = {"upper": value <= target + tol, "lower": value >= target - tol}.get(
        bound, abs(value - target) <= tol)
    return {"synthetic": value, "target_value": target, "tolerance": tol, "bound": bound,
            "within_tolerance": "yes" if ok else "no"}


def test_defaults_are_the_deepseek_fit():
    """DEFAULTS is what `moebench fit-routing deepseek_v2_lite --write` wrote."""
    assert load_preset("deepseek_v2_lite") == DEFAULTS


def test_score_by_hand():
    # missed: 0.7 vs 0.5 +- 0.1 is 1 tolerance outside; centre terms 2.0 and 0.5
    assert np.allclose(score([_row(0.7, 0.5, 0.1), _row(0.25, 0.2, 0.1)]), (1, 1.0, 2.5))
    # both within: the nearer point wins on the third term; bounded targets add nothing
    near = score([_row(0.52, 0.5, 0.1), _row(0.9, 0.05, 0.0, "lower")])
    far = score([_row(0.58, 0.5, 0.1), _row(0.06, 0.05, 0.0, "lower")])
    assert near[:2] == far[:2] == (0, 0.0) and near < far
    assert abs(near[2] - 0.2) < 1e-12 and abs(far[2] - 0.8) < 1e-12


def test_latent_loadings_have_unit_columns_and_add_by_hand():
    cfg = SyntheticConfig(seed=3, token_latent_std=1.5)
    w, group, n_stacks = latent_loadings(cfg, ("encoder",) * 2 + ("decoder",) * 3, 4)
    assert w.shape == (LATENT_RANK, 5, 4) and n_stacks == 2
    assert group.tolist() == [0, 0, 1, 1, 1]
    assert np.allclose(np.sqrt((w.astype(np.float64) ** 2).sum(0)), 1.5, atol=1e-6)
    assert latent_loadings(replace(cfg, token_latent_std=0.0), ("decoder",), 4) is None
    z = np.zeros((1, 1, 2, LATENT_RANK), np.float32)
    z[0, 0, 1, 0] = 2.0  # decoder factor 0 only: encoder layers get nothing
    y = np.zeros((1, 5, 1, 4), np.float32)
    add_latent(y, z, (w, group, 2), np.empty_like(y))
    assert np.array_equal(y[0, :2], np.zeros((2, 1, 4), np.float32))
    assert np.array_equal(y[0, 2:, 0], 2.0 * w[0, 2:])


def test_latent_reads_no_later_token():
    """A request's first steps route the same however many steps follow."""
    model = conf_model("deepseek_v2_lite")
    cfg = SyntheticConfig(num_requests=2, prompt_len=8, token_latent_std=1.5)
    a = generate_trace(model, replace(cfg, output_len=3))
    b = generate_trace(model, replace(cfg, output_len=6))
    assert a.meta["generator"]["version"] == 5
    n = int(a.block_offsets[3 * a.num_layers])  # request 0's 3 steps
    assert np.array_equal(a.topk[:n], b.topk[:n])


def test_latent_trace_sha():
    """A latent-on trace (two chunks, the second short) keeps its bits: the sha was computed
    when the knob was added and matched under OPENBLAS_CORETYPE = Haswell and Prescott with
    NPY_DISABLE_CPU_FEATURES = AVX512F,AVX512_SKX,AVX2,FMA3 (no BLAS in the term)."""
    tr = generate_trace(conf_model("deepseek_v2_lite"), SyntheticConfig(
        num_requests=33, prompt_len=21, output_len=3, token_latent_std=0.8, token_noise_std=0.6,
        embed_noise=1.0))  # the embedding noise of when the sha was taken (routing unaffected)
    assert tr.content_sha256() == (
        "bee2df4a4e7fa62df64be471915d8628224119c9e47454ec4b469f05c9b8ef5c")
