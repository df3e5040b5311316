"""The analysis-time null: random subspaces evaluated from a second moment, the exact Haar test
under anisotropic gradients and an uninformative proxy, and the resolution guard."""

import numpy as np
import pytest
import torch
from scipy import stats

from anistat.geometry import SpectralFrame, delta_isoscore_star, draw_controls, energy_fraction_from_moments
from anistat.stats import monte_carlo_pvalue, resolution_warning
from anistat.stats.multiplicity import min_controls_needed


def _anisotropic_gradients(seed=0, n=400, d=20):
    # a trained decoder's kind of spectrum: a few directions hold most of the energy
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    g = rng.standard_normal((n, d)) * (1.0 / np.arange(1, d + 1)) @ rotation.T + 0.2
    return g


def test_traces_match_direct_computation():
    g = _anisotropic_gradients()
    second, covariance = g.T @ g, np.cov(g.T)
    u = draw_controls("haar", np.eye(20, 3), 1, seed=1)[0]
    bases = draw_controls("normal", u, 7, seed=2)
    frame = SpectralFrame(second)
    assert frame.energy_fractions(frame.traces_of(bases)) == pytest.approx(
        energy_fraction_from_moments(torch.as_tensor(second), bases).numpy(), rel=1e-10
    )
    frame_c = SpectralFrame(covariance)
    for c0, zeta in (("scaled_identity", 0.1), ("identity", 0.4), ("scaled_identity", 0.0)):
        assert frame_c.delta_isoscore_star(frame_c.traces_of(bases), 3, c0, zeta) == pytest.approx(
            delta_isoscore_star(torch.as_tensor(covariance), bases, C0=c0, zeta=zeta).numpy(), rel=1e-9, abs=1e-12
        )


def test_random_draws_have_the_closed_form_means():
    g = _anisotropic_gradients(1)
    second = g.T @ g
    frame = SpectralFrame(second)
    u = draw_controls("haar", np.eye(20, 2), 1, seed=3)[0]
    d, n = 20, 40000
    haar = frame.random_traces([2, 5], n, seed=4)
    for k in (2, 5):
        fractions = frame.energy_fractions(haar[k])
        se = fractions.std() / np.sqrt(n)
        assert abs(fractions.mean() - k / d) < 4 * se
    normal = frame.energy_fractions(frame.random_traces([3], n, seed=5, exclude=u)[3])
    e_u = frame.energy_fractions(frame.traces_of(u))[0]
    assert abs(normal.mean() - 3 / (d - 2) * (1 - e_u)) < 4 * normal.std() / np.sqrt(n)


def test_draws_for_several_ranks_are_leading_columns_of_one_gaussian():
    g = _anisotropic_gradients(2)
    frame = SpectralFrame(np.cov(g.T))
    traces = frame.random_traces([2, 4], 5, seed=11)
    z = np.random.default_rng(11).standard_normal((5, 20, 4))  # the same stream, in eigen-coordinates
    for k in (2, 4):
        q = np.linalg.qr(z[:, :, :k])[0]
        lam = frame.eigenvalues.numpy()
        qsq = np.einsum("nik,i,nil->nkl", q, lam, q)
        assert traces[k].trace == pytest.approx(np.trace(qsq, axis1=1, axis2=2), rel=1e-10)
        assert traces[k].frobenius == pytest.approx((qsq**2).sum(axis=(1, 2)), rel=1e-10)
        assert traces[k].trace_squared == pytest.approx(np.einsum("nik,i,nik->n", q, lam**2, q), rel=1e-10)


def test_haar_test_is_exact_for_a_random_proxy_and_the_normal_convention_is_not():
    # 1500 uninformative proxies on one anisotropic gradient cloud: the Haar Monte-Carlo
    # p-value is uniform; the paper's normal-control p-value (20 controls in U's complement) is
    # anti-conservative, because U is never exchangeable with subspaces of its own complement
    g = _anisotropic_gradients(3, n=300, d=16)
    frame = SpectralFrame(g.T @ g)
    rng = np.random.default_rng(0)
    exact, paper = [], []
    for i in range(1500):
        u = np.linalg.qr(rng.standard_normal((16, 2)))[0]
        observed = frame.energy_fractions(frame.traces_of(u))[0]
        exact.append(monte_carlo_pvalue(observed, frame.energy_fractions(frame.random_traces([2], 99, seed=i)[2])))
        paper.append(
            monte_carlo_pvalue(
                observed, frame.energy_fractions(frame.random_traces([2], 20, seed=10_000 + i, exclude=u)[2])
            )
        )
    exact, paper = np.array(exact), np.array(paper)
    assert 0.035 <= np.mean(exact <= 0.05) <= 0.065
    assert 0.07 <= np.mean(exact <= 0.10) <= 0.13
    assert np.mean(paper <= 0.05) > 0.075  # inflated (≈ 0.10 here; SE ≈ 0.006 under a valid test)


def test_resolution_guard_wording_per_correction():
    assert min_controls_needed(0.05, 100, "holm") == 1999
    assert resolution_warning(1999, 0.05, 100, "holm") is None
    holm = resolution_warning(99, 0.05, 100, "holm")
    assert "no test of a Holm-corrected family of 100 tests" in holm and "≥ 1999" in holm
    bh = resolution_warning(99, 0.05, 100, "fdr_bh")
    # BH can pass a family of floor p-values: say exactly what it cannot do
    assert "lone effect can never pass" in bh and "at least 20 tests at the floor" in bh
    assert "no test" not in bh
    assert "above alpha=0.05" in resolution_warning(9, 0.05, 1, "none")
    assert resolution_warning(19, 0.05, 1, "none") is None


def test_bh_passes_a_family_at_the_floor_exactly_as_the_guard_says():
    from anistat.stats import adjust_pvalues

    floor = 1 / 100
    # 20 tests at the floor among 100: ceil(floor * 100 / 0.05) = 20 -> BH rejects them
    p = np.r_[np.full(20, floor), np.full(80, 0.9)]
    assert (adjust_pvalues(p, "fdr_bh") <= 0.05).sum() == 20
    p = np.r_[np.full(19, floor), np.full(81, 0.9)]
    assert (adjust_pvalues(p, "fdr_bh") <= 0.05).sum() == 0
    assert stats.kstest(np.linspace(0.001, 0.999, 50), "uniform").pvalue > 0.5
