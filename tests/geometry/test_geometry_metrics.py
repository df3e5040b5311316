"""Metrics: closed forms, the IsoScore package as a peer, energy/oracle identities."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anistat.geometry import (
    DegenerateMetricWarning,
    GradientMoments,
    anisotropy_capture,
    delta_isoscore_star,
    draw_controls,
    effective_rank,
    effective_rank_from_cov,
    energy_fraction,
    energy_fraction_from_moments,
    isoscore,
    isoscore_from_cov,
    isoscore_star,
    isoscore_star_from_cov,
    mean_cosine,
    oracle_fraction,
    participation_ratio,
    participation_ratio_from_cov,
)

iso_pkg = pytest.importorskip("IsoScore.IsoScore")


def _cloud(n, d, kind, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    if kind == "aniso":
        x = x * np.geomspace(30.0, 0.01, d) + 5.0
    elif kind == "rank2":
        x = rng.standard_normal((n, 2)) @ rng.standard_normal((2, d)) + 1e-3 * x
    return x


def _random_spd(d, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((d, d))
    return a @ a.T / d + 0.1 * np.eye(d)


# ----------------------------------------------------------------- closed forms
def test_isoscore_isotropic_cloud_is_one():
    x = np.random.default_rng(0).standard_normal((20000, 10))
    assert isoscore(x) == pytest.approx(1.0, abs=0.01)


def test_isoscore_rank_one_cloud_is_zero():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((500, 1)) @ rng.standard_normal((1, 12))
    assert isoscore(x) == pytest.approx(0.0, abs=1e-9)


def test_isoscore_star_scaled_identity_is_scale_free():
    x = _cloud(50, 30, "aniso", 2)
    a = isoscore_star(x, "scaled_identity", 0.3)
    assert isoscore_star(1e4 * x, "scaled_identity", 0.3) == pytest.approx(a, rel=1e-10)
    assert isoscore_star(x, "scaled_identity", 1.0) == pytest.approx(1.0)
    assert isoscore_star(x, "identity", 0.0) == pytest.approx(isoscore(x))
    assert isoscore_star_from_cov(np.cov(x.T), "scaled_identity", 0.3) == pytest.approx(a, rel=1e-12)


# ----------------------------------------------------------------- peer: IsoScore package
@pytest.mark.parametrize("kind", ["iso", "aniso", "rank2"])
@pytest.mark.parametrize("n,d", [(300, 16), (10, 40)])  # includes fewer samples than dimensions
def test_isoscore_matches_package(kind, n, d):
    x = _cloud(n, d, kind, seed=n + d)
    ref = float(iso_pkg.IsoScore(x))
    assert isoscore(x) == pytest.approx(ref, abs=1e-6)
    cov = np.cov(x.T)
    assert isoscore_from_cov(cov) == pytest.approx(float(iso_pkg.IsoScore_cov(cov)), abs=1e-6)


@pytest.mark.parametrize("kind", ["iso", "aniso", "rank2"])
@pytest.mark.parametrize("n,d", [(300, 16), (10, 40)])
@pytest.mark.parametrize("zeta", [0.0, 0.05, 0.3, 0.9])
@pytest.mark.parametrize("c0kind", ["identity", "spd"])
def test_isoscore_star_matches_package(kind, n, d, zeta, c0kind):
    x = _cloud(n, d, kind, seed=3 * n + d)
    c0 = np.eye(d) if c0kind == "identity" else _random_spd(d, seed=d)
    ref = float(iso_pkg.IsoScore_star(x, torch.from_numpy(c0), zeta))
    assert isoscore_star(x, c0, zeta) == pytest.approx(ref, abs=1e-6)
    if c0kind == "identity":
        assert isoscore_star(x, "identity", zeta) == pytest.approx(ref, abs=1e-6)


def test_isoscore_star_scaled_identity_matches_package_with_explicit_matrix():
    x = _cloud(40, 25, "aniso", 7)
    c0 = np.trace(np.cov(x.T)) / 25 * np.eye(25)
    ref = float(iso_pkg.IsoScore_star(x, torch.from_numpy(c0), 0.2))
    assert isoscore_star(x, "scaled_identity", 0.2) == pytest.approx(ref, abs=1e-6)


# ----------------------------------------------------------------- energy / oracle
def test_energy_fraction_shapes_and_identity():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((400, 12)) * np.linspace(3, 0.1, 12)
    q = draw_controls("haar", torch.eye(12)[:, :3].double(), 7, seed=1)
    batch = energy_fraction(g, q)
    assert batch.shape == (7,)
    loop = torch.tensor([energy_fraction(g, q[i]) for i in range(7)], dtype=torch.float64)
    torch.testing.assert_close(batch, loop, rtol=1e-12, atol=0)
    m = GradientMoments.from_points(g)
    torch.testing.assert_close(energy_fraction_from_moments(m, q), batch, rtol=1e-12, atol=0)
    torch.testing.assert_close(energy_fraction_from_moments(m.second_moment, q), batch, rtol=1e-12, atol=0)
    # few rows (direct path) agrees too
    torch.testing.assert_close(
        energy_fraction(g[:5], q), energy_fraction_from_moments(g[:5].T @ g[:5], q), rtol=1e-10, atol=0
    )
    # full basis captures everything
    assert energy_fraction(g, np.eye(12)) == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 30), d=st.integers(3, 12), seed=st.integers(0, 10_000))
def test_energy_fraction_bounded_and_below_oracle(n, d, seed):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, d)) * rng.uniform(0.01, 5, d)
    k = 1 + seed % (d - 1)
    q = draw_controls("haar", np.eye(d)[:, :k], 5, seed=seed)
    e = energy_fraction(g, q)
    orc = oracle_fraction(g.T @ g, k)
    assert torch.all(e >= -1e-12) and torch.all(e <= 1 + 1e-12)
    assert torch.all(e <= orc + 1e-10)
    assert float(energy_fraction_from_moments(g.T @ g, q[0])) == pytest.approx(float(e[0]), rel=1e-9, abs=1e-12)


def test_oracle_attained_by_top_eigenvectors():
    rng = np.random.default_rng(4)
    g = rng.standard_normal((300, 10)) * np.geomspace(10, 0.1, 10)
    m = g.T @ g
    w, v = np.linalg.eigh(m)
    top = v[:, ::-1][:, :3]
    assert oracle_fraction(m, 3) == pytest.approx(energy_fraction(g, top), rel=1e-10)
    assert oracle_fraction(m, 10) == pytest.approx(1.0)


def test_anisotropy_capture_values_and_degenerate():
    assert anisotropy_capture(0.8, 2, 10, 0.8) == pytest.approx(1.0)
    assert anisotropy_capture(0.2, 2, 10, 0.8) == pytest.approx(0.0)
    arr = anisotropy_capture(np.array([0.2, 0.5]), 2, 10, 0.8)
    np.testing.assert_allclose(arr, [0.0, 0.5])
    t = anisotropy_capture(torch.tensor([0.5]), 2, 10, 0.8)
    assert isinstance(t, torch.Tensor)
    with pytest.warns(DegenerateMetricWarning):
        assert math.isnan(anisotropy_capture(0.3, 2, 10, 0.2))


# ----------------------------------------------------------------- delta IsoScore*
def _explicit_delta(g, basis, c0, zeta):
    """Via the IsoScore package on explicit complement coordinates."""
    d, k = basis.shape
    qfull, _ = np.linalg.qr(np.concatenate([basis, np.random.default_rng(0).standard_normal((d, d - k))], 1))
    w = qfull[:, k:]
    gc = g @ w
    if isinstance(c0, str):
        c0_full = np.trace(np.cov(g.T)) / d * np.eye(d)
        c0_comp = np.trace(np.cov(gc.T)) / (d - k) * np.eye(d - k)
    else:
        c0_full, c0_comp = c0, w.T @ c0 @ w
    full = float(iso_pkg.IsoScore_star(g, torch.from_numpy(c0_full), zeta))
    comp = float(iso_pkg.IsoScore_star(gc, torch.from_numpy(np.ascontiguousarray(c0_comp)), zeta))
    return comp - full


@pytest.mark.parametrize("c0", ["scaled_identity", "spd"])
def test_delta_isoscore_star_matches_explicit_complement_and_batch(c0):
    rng = np.random.default_rng(5)
    d, k = 14, 3
    g = rng.standard_normal((200, d)) * np.geomspace(8, 0.2, d)
    c0m = "scaled_identity" if c0 == "scaled_identity" else _random_spd(d, 9)
    mom = GradientMoments.from_points(g)
    bases = draw_controls("haar", np.eye(d)[:, :k], 6, seed=2)
    batch = delta_isoscore_star(mom, bases, c0m, 0.2)
    loop = [delta_isoscore_star(mom, bases[i], c0m, 0.2) for i in range(6)]
    np.testing.assert_allclose(batch.numpy(), loop, atol=1e-12)
    small_chunks = delta_isoscore_star(mom, bases, c0m, 0.2, chunk_size=2)
    np.testing.assert_allclose(small_chunks.numpy(), loop, atol=1e-12)
    for i in range(3):
        ref = _explicit_delta(g, bases[i].numpy().astype(np.float64), c0m, 0.2)
        assert loop[i] == pytest.approx(ref, abs=1e-6)


def test_delta_isoscore_star_removing_dominant_directions_increases_isotropy():
    rng = np.random.default_rng(6)
    d, k = 20, 2
    g = rng.standard_normal((2000, d))
    g[:, :k] *= 10.0
    mom = GradientMoments.from_points(g)
    top = np.eye(d)[:, :k]
    assert delta_isoscore_star(mom, top) > 0.5
    ctrl = draw_controls("normal", top, 10, seed=1)
    assert torch.all(delta_isoscore_star(mom, ctrl) < 0.05)


# ----------------------------------------------------------------- descriptive
def test_mean_cosine_matches_bruteforce_and_skips_zero_rows():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((60, 8)) + 0.7
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = u @ u.T
    brute = (c.sum() - np.trace(c)) / (60 * 59)
    assert mean_cosine(x) == pytest.approx(brute, rel=1e-10)
    assert mean_cosine(np.vstack([x, np.zeros((3, 8))])) == pytest.approx(brute, rel=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateMetricWarning)
        assert math.isnan(mean_cosine(np.zeros((4, 3))))


def test_participation_ratio_and_effective_rank():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((400, 10)) * np.linspace(4, 0.5, 10)
    lam = np.linalg.eigvalsh(np.cov(x.T))
    assert participation_ratio(x) == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-10)
    lam2 = np.linalg.eigvalsh(x.T @ x)
    assert participation_ratio(x, center=False) == pytest.approx(lam2.sum() ** 2 / (lam2**2).sum(), rel=1e-10)
    assert participation_ratio_from_cov(np.eye(7)) == pytest.approx(7.0)
    sv = np.linalg.svd(x - x.mean(0), compute_uv=False)
    p = sv / sv.sum()
    er = math.exp(-(p * np.log(p)).sum())
    assert effective_rank(x) == pytest.approx(er, rel=1e-10)
    assert effective_rank_from_cov(np.cov(x.T)) == pytest.approx(er, rel=1e-8)
    assert effective_rank_from_cov(x.T @ x) == pytest.approx(effective_rank(x, center=False), rel=1e-8)
    assert effective_rank_from_cov(np.diag([1.0, 0, 0])) == pytest.approx(1.0)
    # IsoScore identity: (PR − 1)/(d − 1)
    assert isoscore(x) == pytest.approx((participation_ratio(x) - 1) / 9, rel=1e-10)
