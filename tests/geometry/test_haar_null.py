"""The shared Haar stream and the exact tests read off it (anistat.geometry.haar_null,
anistat.analyze.nulls): the same law as the per-unit sampler it replaces, closed-form moments,
exact counting (bounds, float32 with float64 near ties, sequential stopping)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from anistat.analyze.nulls import NullOptions, UnitSpectrum, exact_tests
from anistat.geometry import HaarDiagonalStream, SpectralFrame, isoscore_star_from_traces
from anistat.stats import control_energy_moments, monte_carlo_pvalue, sequential_monte_carlo_pvalue

C0, ZETA = "scaled_identity", 0.1


def _spectrum(d: int, seed: int = 0, power: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort((1.0 / np.arange(1, d + 1) ** power) * rng.uniform(0.5, 1.5, d))[::-1].copy()


def _matrix(eigenvalues: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 100)
    q = np.linalg.qr(rng.standard_normal((eigenvalues.size, eigenvalues.size)))[0]
    return (q * eigenvalues) @ q.T


def _stream_values(eigenvalues, rank, n, seed, *, dtype=torch.float64, ranks=None):
    """Energy fractions and (t1, t2, t3) of the stream's first n draws, computed directly."""
    d = eigenvalues.size
    stream = HaarDiagonalStream(d, ranks or [rank], seed, dtype=dtype)
    lam = torch.as_tensor(eigenvalues, dtype=dtype)
    weights = torch.as_tensor(eigenvalues / eigenvalues.sum(), dtype=dtype)  # as the engine normalises
    energy, t1, t2, t3 = [], [], [], []
    index = 0
    while sum(map(len, energy)) < n:
        chunk = stream.chunk(index)
        diag = chunk.diagonals[rank]
        energy.append((diag @ weights).double().numpy())
        t1.append((diag @ lam).double().numpy())
        t2.append((diag @ lam.square()).double().numpy())
        scaled = chunk.rows[:, :rank] * lam.sqrt()
        t3.append((scaled @ scaled.transpose(1, 2)).square().sum(dim=(1, 2)).double().numpy())
        index += 1
    return tuple(np.concatenate(part)[:n] for part in (energy, t1, t2, t3))


def _delta(eigenvalues, rank, t1, t2, t3):
    d, trace, frob = eigenvalues.size, eigenvalues.sum(), (eigenvalues**2).sum()
    full = isoscore_star_from_traces(trace, frob, d, C0, ZETA)
    return isoscore_star_from_traces(trace - t1, frob - 2 * t2 + t3, d - rank, C0, ZETA) - full


def test_rows_are_orthonormal_and_nested_and_rank_k_ignores_the_largest_rank():
    d = 96
    small = HaarDiagonalStream(d, [4], seed=7).chunk(0)
    large = HaarDiagonalStream(d, [4, 16, 40], seed=7).chunk(0)
    gram = large.rows @ large.rows.transpose(1, 2)
    assert float((gram - torch.eye(40)).abs().max()) < 1e-5  # float32 Cholesky–QR
    # rank 4's draws are the same whatever other ranks the stream serves (to rounding: the leading
    # block of a larger Cholesky factor is computed in another order)
    assert torch.allclose(small.diagonals[4], large.diagonals[4], rtol=1e-5, atol=1e-7)
    for k in (4, 16, 40):
        assert torch.allclose(large.diagonals[k].sum(dim=1), torch.full((128,), float(k)), rtol=1e-5)
        assert float(large.diagonals[k].min()) >= 0 and float(large.diagonals[k].max()) <= 1 + 1e-6
    # float64 rows of the same Gaussians agree with the float32 fast path to ~1e-6
    exact = HaarDiagonalStream(d, [4, 16, 40], seed=7).rows(large, [0, 5, 127])
    assert float((exact - large.rows[[0, 5, 127]].double()).abs().max()) < 1e-5
    # any chunk can be recomputed alone, and past K > d/2 the stream works in float64
    again = HaarDiagonalStream(d, [4, 16, 40], seed=7)
    assert torch.equal(again.chunk(3).diagonals[16], HaarDiagonalStream(d, [4, 16, 40], seed=7).chunk(3).diagonals[16])
    assert HaarDiagonalStream(10, [7], seed=1).chunk(0).rows.dtype == torch.float64


@pytest.mark.slow
@pytest.mark.parametrize("d,k", [(64, 4), (200, 32), (256, 128)])
def test_the_energy_null_has_the_old_samplers_law_and_the_closed_form_moments(d, k):
    eigenvalues = _spectrum(d, seed=d)
    n = 5000
    energy, *_ = _stream_values(eigenvalues, k, n, seed=3, dtype=torch.float32)
    frame = SpectralFrame(_matrix(eigenvalues, seed=d))
    old = frame.energy_fractions(frame.random_traces([k], n, seed=11)[k])
    assert scipy_stats.ks_2samp(energy, old).pvalue > 0.001
    moments = control_energy_moments("haar", k, d, eigenvalues.sum(), (eigenvalues**2).sum())
    assert moments.mean == pytest.approx(k / d)
    se_mean = moments.sd / np.sqrt(n)
    assert abs(energy.mean() - k / d) < 5 * se_mean
    # Var E(Q) = 2k(d−k)/((d−1)d(d+2)) (tr M² − (tr M)²/d)/(tr M)²; the sample sd within 5 %
    assert energy.std(ddof=1) == pytest.approx(moments.sd, rel=0.05)
    assert old.std(ddof=1) == pytest.approx(moments.sd, rel=0.05)


@pytest.mark.parametrize("d,k", [(64, 4), (200, 32)])
def test_the_delta_isoscore_null_has_the_old_samplers_law(d, k):
    eigenvalues = _spectrum(d, seed=d + 1, power=1.5)
    n = 5000
    _, t1, t2, t3 = _stream_values(eigenvalues, k, n, seed=5)
    assert (t3 >= t1**2 / k * (1 - 1e-9)).all() and (t3 <= np.minimum(t2, t1**2) * (1 + 1e-9)).all()
    new = _delta(eigenvalues, k, t1, t2, t3)
    frame = SpectralFrame(_matrix(eigenvalues, seed=d + 1))
    old = frame.delta_isoscore_star(frame.random_traces([k], n, seed=13)[k], k, C0, ZETA)
    assert scipy_stats.ks_2samp(new, old).pvalue > 0.001


def _units(d, ranks, n_units, seed, shift):
    """Units whose observed values sit at chosen places of their own null (incl. near ties)."""
    rng = np.random.default_rng(seed)
    units = []
    for u in range(n_units):
        m, c = _spectrum(d, seed=seed + u), _spectrum(d, seed=seed + 50 + u, power=1.3)
        energy_obs, delta_obs = {}, {}
        for k in ranks:
            e, t1, t2, t3 = _stream_values(m, k, 40, seed=999)  # an unrelated stream: plausible values
            delta = _delta(c, k, *_stream_values(c, k, 40, seed=998)[1:])
            energy_obs[("pca", k)] = float(np.quantile(e, rng.uniform(0, 1))) * (1 + shift[u % len(shift)])
            delta_obs[("pca", k)] = float(np.quantile(delta, rng.uniform(0, 1))) + shift[u % len(shift)]
        units.append(
            UnitSpectrum(
                unit_id=f"u{u}",
                dim=d,
                energy_eigenvalues=m,
                energy_observed=energy_obs,
                covariance_eigenvalues=c,
                delta_observed=delta_obs,
            )
        )
    return units


def _brute_force(units, rank_list, n, stop, seed, alternative="greater"):
    """p-values by computing every draw's value exactly (float64 stream, exact t3) and counting."""
    out_e, out_d = {}, {}
    for unit in units:
        for k in rank_list:
            e, *_ = _stream_values(unit.energy_eigenvalues, k, n, seed, ranks=rank_list)
            _, t1, t2, t3 = _stream_values(unit.covariance_eigenvalues, k, n, seed, ranks=rank_list)
            delta = _delta(unit.covariance_eigenvalues, k, t1, t2, t3)
            out_e[(unit.unit_id, "pca", k)] = sequential_monte_carlo_pvalue(
                unit.energy_observed[("pca", k)], e, stop, alternative
            )
            out_d[(unit.unit_id, "pca", k)] = sequential_monte_carlo_pvalue(
                unit.delta_observed[("pca", k)], delta, stop, alternative
            )
    return out_e, out_d


@pytest.mark.parametrize("stop,alternative", [(0, "greater"), (5, "greater"), (0, "two-sided"), (3, "less")])
def test_the_engine_counts_exactly_what_brute_force_counts(stop, alternative):
    d, ranks, n = 48, [3, 12], 300
    units = _units(d, ranks, 4, seed=1, shift=[0.0, 0.02, -0.02])
    # observed values closer to a draw than float32 can tell apart: the float64 recomputation decides
    e, *_ = _stream_values(units[0].energy_eigenvalues, 3, 10, seed=42, ranks=ranks)
    units[0].energy_observed[("pca", 3)] = float(e[7]) * (1 + 3e-8)
    units[1].energy_observed[("pca", 3)] = float(
        _stream_values(units[1].energy_eigenvalues, 3, 10, seed=42, ranks=ranks)[0][2]
    ) * (1 - 3e-8)
    options = NullOptions(n_max=n, stop_after=stop, alternative=alternative, c0=C0, zeta=ZETA)
    result = exact_tests(units, options, lambda dim: 42)
    expected_e, expected_d = _brute_force(units, ranks, n, stop, seed=42, alternative=alternative)
    for key, (p, used) in expected_e.items():
        assert (result.energy[key].p_value, result.energy[key].n_draws) == (p, used), key
    for key, (p, used) in expected_d.items():
        assert (result.delta[key].p_value, result.delta[key].n_draws) == (p, used), key


def test_significant_units_are_decided_by_bounds_and_stop_is_cheap_for_large_p():
    d = 64
    m, c = _spectrum(d, 1, power=2.0), _spectrum(d, 2, power=2.0)
    top = {("pca", 4): float(m[:4].sum() / m.sum())}  # the oracle: beyond every draw
    delta_top = {("pca", 4): float(_delta(c, 4, c[:4].sum(), (c[:4] ** 2).sum(), (c[:4] ** 2).sum()))}
    far = UnitSpectrum(
        unit_id="far",
        dim=d,
        energy_eigenvalues=m,
        energy_observed=top,
        covariance_eigenvalues=c,
        delta_observed=delta_top,
    )
    bulk = UnitSpectrum(
        unit_id="bulk",
        dim=d,
        energy_eigenvalues=m,
        energy_observed={("pca", 4): 4 / d * 0.98},
        covariance_eigenvalues=c,
        delta_observed={("pca", 4): -1.0},
    )
    result = exact_tests(
        [far, bulk], NullOptions(n_max=999, stop_after=10, alternative="greater", c0=C0, zeta=ZETA), lambda dim: 3
    )
    assert result.energy[("far", "pca", 4)].p_value == pytest.approx(1 / 1000)
    assert result.delta[("far", "pca", 4)].p_value == pytest.approx(1 / 1000)
    assert result.energy[("bulk", "pca", 4)].stopped and result.energy[("bulk", "pca", 4)].n_draws < 40
    assert result.delta[("bulk", "pca", 4)].n_draws == 10  # every draw exceeds -1: h/L = 10/10
    assert result.draws_made == {64: 999}


def test_recorded_draws_are_the_streams_first_draws_in_float64():
    d, ranks = 40, [2, 5]
    units = _units(d, ranks, 2, seed=3, shift=[0.0])
    result = exact_tests(
        units, NullOptions(n_max=50, stop_after=0, alternative="greater", c0=C0, zeta=ZETA, n_record=20), lambda dim: 8
    )
    e, t1, t2, t3 = _stream_values(units[1].covariance_eigenvalues, 5, 20, seed=8, ranks=ranks)
    np.testing.assert_allclose(
        result.recorded_delta[("u1", 5)], _delta(units[1].covariance_eigenvalues, 5, t1, t2, t3), rtol=1e-10, atol=1e-13
    )
    energy, *_ = _stream_values(units[1].energy_eigenvalues, 2, 20, seed=8, ranks=ranks)
    np.testing.assert_allclose(result.recorded_energy[("u1", 2)], energy, rtol=1e-12)
    assert monte_carlo_pvalue(0.5, result.recorded_energy[("u1", 2)]) > 0


def test_the_same_pvalues_with_one_or_two_threads():
    d, ranks = 64, [4, 16]
    units = _units(d, ranks, 3, seed=9, shift=[0.0, 0.01])
    options = NullOptions(n_max=400, stop_after=10, alternative="greater", c0=C0, zeta=ZETA)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = exact_tests(units, options, lambda dim: 5)
        torch.set_num_threads(2)
        two = exact_tests(units, options, lambda dim: 5)
    finally:
        torch.set_num_threads(threads)
    assert one.energy == two.energy and one.delta == two.delta


def test_a_stream_per_unit_when_asked():
    d, ranks = 40, [3]
    units = _units(d, ranks, 3, seed=4, shift=[0.0])
    options = NullOptions(n_max=200, stop_after=0, alternative="greater", c0=C0, zeta=ZETA)
    per_unit = exact_tests(units, options, None, lambda unit: (unit.unit_id, hash(unit.unit_id) % 1000))
    assert set(per_unit.draws_made) == {"u0", "u1", "u2"}
    # each unit's p-value is its own stream's: brute force with that stream's seed
    for unit in units:
        e, *_ = _stream_values(unit.energy_eigenvalues, 3, 200, seed=hash(unit.unit_id) % 1000)
        p, _ = sequential_monte_carlo_pvalue(unit.energy_observed[("pca", 3)], e, 0)
        assert per_unit.energy[(unit.unit_id, "pca", 3)].p_value == p
