"""Haar closed forms (mean k/d, Beta law, pooled variance), the null check, and calibration of
Monte-Carlo p-values for the deliberately uninformative `random` proxy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from anistat.geometry import (
    GradientMoments,
    complement_basis,
    draw_controls,
    energy_fraction,
    energy_fraction_from_moments,
    fit_proxy,
    haar_energy_moments,
    haar_null_check,
    haar_token_fraction_law,
    participation_ratio_from_cov,
)


def _aniso_second_moment(d, seed=0, n=400):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, d)) * np.geomspace(5, 0.2, d)
    return g, g.T @ g


def test_haar_energy_mean_is_k_over_d():
    d, k, n = 16, 3, 4000
    g, m = _aniso_second_moment(d)
    e = energy_fraction_from_moments(m, draw_controls("haar", np.eye(d)[:, :k], n, seed=1)).numpy()
    mu, sd = haar_energy_moments(m, k)
    assert mu == pytest.approx(k / d)
    assert abs(e.mean() - k / d) < 4 * sd / np.sqrt(n)


def test_haar_per_token_fraction_is_beta():
    d, k, n = 12, 4, 3000
    g = np.random.default_rng(2).standard_normal(d) * 3.0
    q = draw_controls("haar", np.eye(d)[:, :k], n, seed=3)
    frac = energy_fraction(g[None, :], q).numpy()
    law = haar_token_fraction_law(k, d)
    assert stats.kstest(frac, law.cdf).pvalue > 1e-3
    assert frac.mean() == pytest.approx(k / d, abs=4 * law.std() / np.sqrt(n))


@pytest.mark.parametrize("spectrum", ["geom", "spike", "flat_plus"])
def test_pooled_variance_formula_matches_simulation(spectrum):
    d, k, n = 20, 3, 20000
    lam = {
        "geom": np.geomspace(10, 0.1, d),
        "spike": np.r_[50.0, np.ones(d - 1)],
        "flat_plus": np.r_[np.full(5, 4.0), np.full(d - 5, 1.0)],
    }[spectrum]
    rot, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((d, d)))
    m = rot @ np.diag(lam) @ rot.T
    e = energy_fraction_from_moments(m, draw_controls("haar", np.eye(d)[:, :k], n, seed=5)).numpy()
    mu, sd = haar_energy_moments(m, k)
    pr = participation_ratio_from_cov(m)
    v = 2 * k * (d - k) / (d * d * (d + 2))
    assert sd**2 == pytest.approx(v * (d / pr - 1) / (d - 1), rel=1e-10)
    assert e.mean() == pytest.approx(mu, abs=4 * sd / np.sqrt(n))
    assert e.std(ddof=1) / sd == pytest.approx(1.0, abs=0.05)


def test_null_check_passes_for_haar_and_fails_for_biased_controls():
    d, k = 30, 4
    g, m = _aniso_second_moment(d, seed=6)
    q = draw_controls("haar", np.eye(d)[:, :k], 200, seed=7)
    res = haar_null_check(energy_fraction_from_moments(m, q), k, d, m)
    assert res.ok, res.message
    # controls drawn in the complement of the top eigenvectors are not Haar in R^d
    w, v = np.linalg.eigh(m)
    top = v[:, ::-1][:, :k]
    qn = draw_controls("normal", top, 200, seed=7)
    fr = energy_fraction_from_moments(m, qn)
    bad = haar_null_check(fr, k, d, m)
    assert not bad.ok and bad.z_mean < -4
    # ... but they ARE Haar inside the complement of the proxy
    good = haar_null_check(fr, k, d, GradientMoments.from_points(g), within=complement_basis(top))
    assert good.ok, good.message


def test_null_check_sd_band_detects_wrong_spread():
    d, k = 30, 4
    _, m = _aniso_second_moment(d, seed=8)
    mu, sd = haar_energy_moments(m, k)
    rng = np.random.default_rng(0)
    assert not haar_null_check(mu + 3 * sd * rng.standard_normal(500), k, d, m).ok
    assert haar_null_check(mu + sd * rng.standard_normal(500), k, d, m).ok
    iso = haar_null_check(np.full(5, k / d), k, d, np.eye(d))
    assert iso.ok and iso.expected_sd == 0


@pytest.mark.parametrize("kind,d,k", [("haar", 16, 3), ("normal", 64, 2)])
def test_random_proxy_monte_carlo_pvalues_are_uniform(kind, d, k):
    """(1 + #{ctrl ≥ obs})/(1 + n) for the uninformative `random` proxy: exact discrete-uniform
    for independent Haar controls, approximately so for normal controls when k ≪ d.  Tested
    with the randomised p-value p − U/(n+1), which is continuous U(0, 1) under the null."""
    n_ctrl, n_seeds = 39, 300
    g, m = _aniso_second_moment(d, seed=9)
    m = torch.from_numpy(m)
    zeros = np.zeros((3, d))
    jitter = np.random.default_rng(10).random(n_seeds)
    pvals = np.empty(n_seeds)
    for s in range(n_seeds):
        u = fit_proxy(zeros, "random", k, seed=s).basis
        ctrl = draw_controls(kind, u, n_ctrl, seed=10_000 + s)
        obs = energy_fraction_from_moments(m, u)
        null = energy_fraction_from_moments(m, ctrl).numpy()
        pvals[s] = (1 + np.sum(null >= obs)) / (1 + n_ctrl)
    randomised = pvals - jitter / (1 + n_ctrl)
    assert stats.kstest(randomised, "uniform").pvalue > 1e-3
    assert abs(np.mean(pvals <= 0.05) - 2 / 40) < 0.05
