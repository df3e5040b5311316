"""IsoScore without eigen-decomposition: the participation-ratio identity against the IsoScore
package, closed-form shrinkage, and ΔIsoScore* from traces (d coordinates and eigenbasis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anistat.geometry import (
    GradientMoments,
    delta_isoscore_star,
    delta_isoscore_star_from_traces,
    draw_controls,
    isoscore_from_trace_frobenius,
    isoscore_star_from_cov,
    oracle_fraction,
    oracle_fractions,
    removal_traces,
    removal_traces_in_eigenbasis,
    shrunk_trace_frobenius,
)

iso_pkg = pytest.importorskip("IsoScore.IsoScore")


def _spectrum_cov(spectrum, seed):
    """A covariance with the given eigenvalues in a random orthonormal basis."""
    d = len(spectrum)
    rotation, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return (rotation * np.asarray(spectrum, dtype=np.float64)) @ rotation.T


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=2, max_size=24), st.integers(0, 2**16))
def test_isoscore_is_affine_in_participation_ratio_package(spectrum, seed):
    """The identity itself, with no anistat code on the reference side: the package's IsoScore
    of a covariance equals (tr(C)²/‖C‖_F² − 1)/(n − 1)."""
    if max(spectrum) <= 1e-6:
        spectrum = spectrum[:-1] + [1.0]
    cov = _spectrum_cov(spectrum, seed)
    n = cov.shape[0]
    participation = np.trace(cov) ** 2 / np.sum(cov * cov)
    reference = float(iso_pkg.IsoScore_cov(cov))
    assert (participation - 1) / (n - 1) == pytest.approx(reference, abs=1e-5)
    assert float(isoscore_from_trace_frobenius(np.trace(cov), np.sum(cov * cov), n)) == pytest.approx(
        reference, abs=1e-5
    )


@pytest.mark.parametrize("n_points,d", [(500, 12), (8, 30)])
def test_isoscore_of_points_equals_participation_form_package(n_points, d):
    x = np.random.default_rng(d).standard_normal((n_points, d)) * np.geomspace(20, 0.1, d) + 3.0
    cov = np.cov(x.T)
    participation = np.trace(cov) ** 2 / np.sum(cov * cov)
    assert (participation - 1) / (d - 1) == pytest.approx(float(iso_pkg.IsoScore(x)), abs=1e-6)


@pytest.mark.parametrize("c0", ["identity", "scaled_identity"])
@pytest.mark.parametrize("zeta", [0.0, 0.1, 0.7, 1.0])
def test_shrunk_trace_and_frobenius_closed_form(c0, zeta):
    cov = _spectrum_cov(np.geomspace(50, 0.01, 9), 1)
    target = np.eye(9) if c0 == "identity" else np.trace(cov) / 9 * np.eye(9)
    shrunk = (1 - zeta) * cov + zeta * target
    tr, fro2 = shrunk_trace_frobenius(np.trace(cov), np.sum(cov * cov), 9, c0, zeta)
    assert float(tr) == pytest.approx(np.trace(shrunk), rel=1e-12)
    assert float(fro2) == pytest.approx(np.sum(shrunk * shrunk), rel=1e-12)
    assert isoscore_star_from_cov(cov, c0, zeta) == pytest.approx(float(iso_pkg.IsoScore_cov(shrunk)), abs=1e-6)


def test_isoscore_star_matrix_target_takes_general_path_for_indefinite_c0():
    """An indefinite matrix C0 has no trace form (the package uses |eigenvalues|); the result
    must still equal the package."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 6)) * np.arange(1, 7)
    c0 = np.diag([3.0, -2.0, 1.0, -4.0, 0.5, 2.0])
    reference = float(iso_pkg.IsoScore_star(x, torch.from_numpy(c0), 0.6))
    assert isoscore_star_from_cov(np.cov(x.T), c0, 0.6) == pytest.approx(reference, abs=1e-6)


def _explicit_complement_delta(cov, basis, c0, zeta):
    """Reference: spectrum of the complement covariance WᵀCW in explicit (d − k) coordinates."""
    d, k = basis.shape
    full_q, _ = np.linalg.qr(np.concatenate([basis, np.random.default_rng(0).standard_normal((d, d - k))], 1))
    w = full_q[:, k:]

    def star(c, target):
        return float(iso_pkg.IsoScore_cov((1 - zeta) * c + zeta * target))

    comp = w.T @ cov @ w
    if isinstance(c0, str) and c0 == "identity":
        return star(comp, np.eye(d - k)) - star(cov, np.eye(d))
    if isinstance(c0, str):
        return star(comp, np.trace(comp) / (d - k) * np.eye(d - k)) - star(cov, np.trace(cov) / d * np.eye(d))
    return star(comp, w.T @ c0 @ w) - star(cov, c0)


@pytest.mark.parametrize("c0", ["identity", "scaled_identity", "spd"])
def test_delta_isoscore_star_closed_form_matches_explicit_complement(c0):
    d, k = 16, 3
    cov = _spectrum_cov(np.geomspace(100, 0.05, d), 4)
    target = c0
    if c0 == "spd":
        a = np.random.default_rng(9).standard_normal((d, d))
        target = a @ a.T / d + 0.1 * np.eye(d)
    bases = draw_controls("haar", np.eye(d)[:, :k], 5, seed=2).numpy()
    measured = delta_isoscore_star(cov, bases, target, 0.25).numpy()
    reference = [_explicit_complement_delta(cov, bases[i], target, 0.25) for i in range(5)]
    np.testing.assert_allclose(measured, reference, atol=1e-6)


def test_delta_isoscore_star_exact_when_removal_leaves_little_frobenius_mass():
    """Removing the directions that hold almost all of ‖C‖_F² makes the trace identity cancel
    digits; those bases are recomputed from PSP directly and stay exact.  Reference: the
    complement covariance is exactly diag(remaining spectrum) in the rotated coordinates, and
    IsoScore is (PR − 1)/(m − 1) (the identity proven against the package above)."""
    d, k = 12, 2
    spectrum = np.concatenate([[1e6, 5e5], np.linspace(1.0, 2.0, d - k)])
    rotation, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((d, d)))
    cov = (rotation * spectrum) @ rotation.T
    top = rotation[:, :k]
    rest = spectrum[k:]
    for c0 in ("identity", "scaled_identity"):
        c = 1.0 if c0 == "identity" else rest.mean()
        shrunk = 0.9 * rest + 0.1 * c  # float64 reference (the package rounds √n in float32)
        removed = (shrunk.sum() ** 2 / (shrunk**2).sum() - 1) / (d - k - 1)
        full = isoscore_star_from_cov(cov, c0, 0.1)
        assert delta_isoscore_star(cov, top, c0, 0.1) == pytest.approx(removed - full, abs=1e-9)


def test_removal_traces_in_eigenbasis_equal_d_coordinates_and_give_delta():
    d, k, n = 20, 4, 7
    cov = _spectrum_cov(np.geomspace(30, 0.2, d), 6)
    bases = draw_controls("haar", np.eye(d)[:, :k], n, seed=8).double()
    c = torch.from_numpy(cov)
    eigenvalues, vectors = torch.linalg.eigh(c)
    in_eigenbasis = vectors.T @ bases  # (n, d, k)
    for direct, fast in zip(removal_traces(c, bases), removal_traces_in_eigenbasis(eigenvalues, in_eigenbasis)):
        np.testing.assert_allclose(fast.numpy(), direct.numpy(), rtol=1e-10)
    tr_qcq, cq2, qcq2 = removal_traces_in_eigenbasis(eigenvalues, in_eigenbasis)
    for c0 in ("identity", "scaled_identity"):
        from_traces = delta_isoscore_star_from_traces(
            eigenvalues.sum(), eigenvalues.square().sum(), tr_qcq, cq2, qcq2, dim=d, rank=k, C0=c0, zeta=0.3
        )
        np.testing.assert_allclose(from_traces.numpy(), delta_isoscore_star(c, bases, c0, 0.3).numpy(), atol=1e-12)
    one = removal_traces_in_eigenbasis(eigenvalues, in_eigenbasis[0])
    assert float(one[0]) == pytest.approx(float(tr_qcq[0]), rel=1e-12)
    single = removal_traces(c, bases[0])
    assert [float(x) for x in single] == pytest.approx([float(tr_qcq[0]), float(cq2[0]), float(qcq2[0])], rel=1e-10)


def test_delta_from_traces_with_pre_shrunk_matrix_target():
    d, k = 10, 2
    cov = _spectrum_cov(np.geomspace(10, 0.1, d), 2)
    a = np.random.default_rng(1).standard_normal((d, d))
    c0 = a @ a.T / d
    shrunk = torch.from_numpy(0.8 * cov + 0.2 * c0)
    basis = draw_controls("haar", np.eye(d)[:, :k], 3, seed=1).double()
    tr, fro2 = torch.trace(shrunk), shrunk.square().sum()
    delta = delta_isoscore_star_from_traces(tr, fro2, *removal_traces(shrunk, basis), dim=d, rank=k, C0=None, zeta=0.2)
    np.testing.assert_allclose(delta.numpy(), delta_isoscore_star(cov, basis, c0, 0.2).numpy(), atol=1e-12)


def test_delta_isoscore_star_from_moments_matches_covariance_input():
    g = np.random.default_rng(2).standard_normal((300, 9)) * np.geomspace(5, 0.5, 9)
    moments = GradientMoments.from_points(g)
    basis = np.eye(9)[:, :2]
    assert delta_isoscore_star(moments, basis) == pytest.approx(delta_isoscore_star(np.cov(g.T), basis), abs=1e-12)


def test_oracle_fractions_share_one_decomposition():
    g = np.random.default_rng(4).standard_normal((100, 12)) * np.geomspace(9, 1, 12)
    m = g.T @ g
    together = oracle_fractions(m, [1, 4, 8])
    assert together == {k: pytest.approx(oracle_fraction(m, k), rel=1e-12) for k in (1, 4, 8)}
    assert oracle_fractions(m, []) == {}
    with pytest.raises(ValueError):
        oracle_fractions(m, [13])
