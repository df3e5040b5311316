"""Intervals for a ratio of means (anistat.stats.ratio_intervals) against direct computations,
closed forms and a small coverage check on a well-behaved law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import ndtri
from scipy.stats import chi2, f

from anistat import stats
from anistat.stats import ratio_intervals
from anistat.stats.ratio_intervals import (
    EL_ADJUSTMENTS,
    _augmented,
    _el_multiplier,
    _RatioElCurve,
    _schedule,
    _stabilising_map,
)


def _el_by_optimisation(z: np.ndarray) -> float:
    """−2 ln R for E z = 0 by maximising Σ ln(n w_i) over the simplex under Σ w_i z_i = 0 directly."""
    n = z.size
    result = minimize(
        lambda w: -np.sum(np.log(n * w)),
        np.full(n, 1.0 / n),
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}, {"type": "eq", "fun": lambda w: w @ z}],
        bounds=[(1e-9, 1.0)] * n,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert result.success
    return float(-2.0 * -result.fun)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_empirical_likelihood_of_a_mean_equals_the_constrained_maximum(seed):
    z = np.random.default_rng(seed).normal(0.3, 1.0, 9)
    assert stats.empirical_likelihood_statistic(z) == pytest.approx(_el_by_optimisation(z), rel=1e-5)


def test_empirical_likelihood_is_infinite_outside_the_hull_and_zero_at_the_mean():
    assert stats.empirical_likelihood_statistic([1.0, 2.0, 3.0]) == np.inf
    assert stats.empirical_likelihood_statistic([-1.0, 1.0]) == 0.0


def test_the_ratio_statistic_is_the_mean_statistic_of_the_estimating_function_and_scale_free():
    rng = np.random.default_rng(3)
    e = rng.uniform(1, 3, 15)
    p = 0.7 * e + rng.normal(0, 0.2, 15)
    theta = 0.75
    direct = stats.empirical_likelihood_statistic(p - theta * e)
    assert stats.ratio_el_statistic(p, e, theta, "none") == pytest.approx(direct, rel=1e-10)
    # θ is a ratio, so scaling p and e by the same factor leaves R(θ) unchanged
    assert stats.ratio_el_statistic(1e6 * p, 1e6 * e, theta, "adjusted") == pytest.approx(
        stats.ratio_el_statistic(p, e, theta, "adjusted"), rel=1e-9
    )


def test_the_adjustments_add_their_published_pseudo_units():
    z = np.array([-0.5, 0.2, 1.4, 0.9, 0.1, -0.3, 0.6])
    n, mean = z.size, z.mean()
    adjusted = _augmented(z, "adjusted")
    assert adjusted[-1] == pytest.approx(-max(1.0, np.log(n) / 2) * mean)
    balanced = _augmented(z, "balanced")
    # two points, the mean kept (Emerson & Owen's balance), the first at −1.9·sd on the side opposite z̄
    assert balanced.size == n + 2 and balanced.mean() == pytest.approx(mean)
    assert balanced[-2] == pytest.approx(-1.9 * z.std(ddof=1))


def test_adjusted_statistics_are_finite_where_plain_el_is_not():
    p, e = np.array([1.0, 2.0, 4.0, 3.0]), np.array([1.0, 1.0, 2.0, 2.0])  # unit ratios 1, 2, 2, 1.5
    assert stats.ratio_el_statistic(p, e, 2.5, "none") == np.inf
    for adjustment in ("adjusted", "balanced"):
        assert np.isfinite(stats.ratio_el_statistic(p, e, 2.5, adjustment))


@pytest.mark.parametrize("method", ["el", "adjusted_el", "balanced_el"])
def test_el_ends_are_where_the_statistic_meets_the_chi2_quantile(method):
    rng = np.random.default_rng(5)
    e = rng.lognormal(0, 0.5, 30)
    p = 0.4 * e * rng.uniform(0.5, 1.5, 30)
    interval = stats.ratio_interval(p, e, method, ci_level=0.9)
    adjustment = {"el": "none", "adjusted_el": "adjusted", "balanced_el": "balanced"}[method]
    for end in (interval.ci_low, interval.ci_high):
        assert stats.ratio_el_statistic(p, e, end, adjustment) == pytest.approx(chi2.ppf(0.9, 1), rel=1e-6)
    assert interval.ci_low < interval.estimate < interval.ci_high and interval.note == ""


def test_the_f_calibrated_ends_meet_the_f_quantile_on_the_effective_size():
    """`adjusted_el_f`: the adjusted statistic at each end equals F_{0.9}(1, m − 1), m the smaller of
    the denominators' Kish size and the estimating function's tail-weight size, and the interval
    contains the χ²-calibrated adjusted one (F(1, m − 1) > χ²₁ for finite m)."""
    rng = np.random.default_rng(5)
    e = rng.lognormal(0, 1.2, 30)
    p = 0.4 * e * rng.uniform(0.5, 1.5, 30)
    interval = stats.ratio_interval(p, e, "adjusted_el_f", ci_level=0.9)
    theta = p.sum() / e.sum()
    z = p - theta * e
    m = min((e.sum()) ** 2 / (e * e).sum(), 30.0, 3 * (z * z).sum() ** 2 / (z**4).sum())
    assert stats.el_effective_size(p, e) == pytest.approx(m, rel=1e-12) and m < 15
    for end in (interval.ci_low, interval.ci_high):
        assert stats.ratio_el_statistic(p, e, end, "adjusted") == pytest.approx(f.ppf(0.9, 1, m - 1), rel=1e-6)
    chi2_interval = stats.ratio_interval(p, e, "adjusted_el", ci_level=0.9)
    assert interval.ci_low < chi2_interval.ci_low < chi2_interval.ci_high < interval.ci_high
    assert interval.method == "adjusted_el_f" and interval.note == ""


def test_the_effective_size_and_the_critical_value_closed_forms():
    ones = np.ones(10)
    assert stats.el_effective_size(3.0 * ones, ones) == 10.0  # every unit at the ratio
    # normal-like z: n_z caps at n, so m is Kish's size of the denominators, (Σe)²/Σe² = 64/28 here
    e = np.array([5.0, 1.0, 1.0, 1.0])
    assert stats.el_effective_size(0.5 * e, e) == pytest.approx(64.0 / 28.0)
    # equal denominators, one unit off the ratio: z = (7, −1 × 7), n_z = 3·56²/2408
    assert stats.el_effective_size([9.0, 1, 1, 1, 1, 1, 1, 1], np.ones(8)) == pytest.approx(3 * 56**2 / 2408)
    assert np.isnan(stats.el_effective_size([1.0, 1.0], [0.0, 0.0]))
    assert stats.el_critical_value(0.95) == pytest.approx(chi2.ppf(0.95, 1))
    assert stats.el_critical_value(0.95, "f_effective", 7.5) == pytest.approx(f.ppf(0.95, 1, 6.5))
    assert stats.el_critical_value(0.95, "f_effective", 1e9) == pytest.approx(chi2.ppf(0.95, 1), rel=1e-6)
    assert stats.el_critical_value(0.95, "f_effective", 1.0) == np.inf
    with pytest.raises(ValueError, match="calibration"):
        stats.el_critical_value(0.95, "bartlett", 5.0)


def test_the_f_calibrated_interval_is_the_range_at_one_effective_unit():
    """One document holds nearly all the energy: m ≈ 1, F(1, m − 1) is huge, and the bounded
    adjusted statistic never reaches it — the interval is (0, ∞) with a note, not a false precision."""
    e = np.array([1e6, 1.0, 1.0, 1.0, 1.0, 1.0])
    p = np.array([2e5, 0.1, 0.5, 0.2, 0.4, 0.3])
    interval = stats.ratio_interval(p, e, "adjusted_el_f")
    assert (interval.ci_low, interval.ci_high) == (0.0, np.inf)
    assert "F(1," in interval.note and interval.fallback


def test_el_agrees_with_the_delta_method_interval_in_a_large_sample():
    """Wilks: at n = 3000 on a light-tailed law the EL interval is the Wald interval of the ratio
    with its delta-method SE, to first order."""
    rng = np.random.default_rng(7)
    e = rng.uniform(1, 2, 3000)
    p = 0.5 * e + rng.normal(0, 0.1, 3000)
    theta = p.sum() / e.sum()
    se = float(stats.ratio_se(np.ones((1, 3000)), p, e)[0])
    interval = stats.ratio_interval(p, e, "el")
    z = ndtri(0.975)
    assert interval.ci_low == pytest.approx(theta - z * se, rel=2e-3)
    assert interval.ci_high == pytest.approx(theta + z * se, rel=2e-3)


def test_the_stabilising_map_recovers_a_power_law_and_has_unit_slope_per_se():
    theta = np.linspace(0.5, 2.0, 50)
    se = 0.3 * theta**0.4
    g, g_inverse, beta = _stabilising_map(theta, se)
    assert beta == pytest.approx(0.4)
    x, h = 1.3, 1e-6
    assert (g(x + h) - g(x - h)) / (2 * h) == pytest.approx(1.0 / (0.3 * x**0.4), rel=1e-6)
    assert float(g_inverse(g(x))) == pytest.approx(x)


def test_the_log_scale_bootstrap_t_is_the_analysis_interval():
    rng = np.random.default_rng(11)
    e = rng.lognormal(0, 1, 25)
    p = 0.3 * e * rng.uniform(0.2, 1.8, 25)
    w = stats.bootstrap_weights(25, 300, seed=2)
    mine = stats.ratio_interval(p, e, "studentized_log", w, expand_units=25)
    analysis = stats.ci_from_replicates(
        p.sum() / e.sum(),
        (w @ p) / (w @ e),
        method="studentized",
        se=float(stats.ratio_se(np.ones((1, 25)), p, e)[0]),
        replicate_se=stats.ratio_se(w, p, e),
        log_scale=True,
        expand_units=25,
    )
    assert (mine.ci_low, mine.ci_high) == (analysis.ci_low, analysis.ci_high)


def test_every_method_covers_about_its_level_on_a_light_tailed_law():
    """60 units, ratio 0.5 with uniform energies: each method's 90 % interval covers in
    [0.80, 0.98] of 100 samples (a binomial 99.9 % band around 0.9); a wrong quantile or scale
    lands near 0.6 or at 1.0."""
    rng = np.random.default_rng(2024)
    hits = {m: 0 for m in stats.RATIO_INTERVAL_METHODS}
    weights = stats.bootstrap_weights(60, 200, seed=1)
    for _ in range(100):
        e = rng.uniform(1, 2, 60)
        p = 0.5 * e + rng.normal(0, 0.15, 60) * e
        for method in hits:
            r = stats.ratio_interval(p, e, method, weights, ci_level=0.9)
            hits[method] += r.ci_low <= 0.5 <= r.ci_high
    coverage = {m: h / 100 for m, h in hits.items()}
    assert all(0.80 <= c <= 0.98 for c in coverage.values()), coverage


def test_bootstrap_methods_need_weights():
    with pytest.raises(ValueError, match="needs bootstrap weights"):
        stats.ratio_interval([1.0, 2.0], [1.0, 1.0], "bca_log")


def test_kish_effective_size_closed_forms():
    assert stats.kish_effective_size(np.full(7, 3.0)) == pytest.approx(7.0)
    assert stats.kish_effective_size([1.0, 0.0, 0.0]) == 1.0
    w = np.array([5.0, 1.0, 1.0, 1.0])
    assert stats.kish_effective_size(w) == pytest.approx(64.0 / 28.0)
    assert np.isnan(stats.kish_effective_size([0.0, 0.0]))


@pytest.mark.parametrize(
    "method", ["bca_log", "variance_stabilised", "el", "adjusted_el", "balanced_el", "adjusted_el_f"]
)
def test_the_analysis_offers_each_ratio_method_on_its_resampling_units(method):
    """`analyze_energy(ci_method=...)`: the energy ratio's interval is the method's interval of the
    per-document sums (the analysis' resamples, tails expanded for the documents), its `se` the
    interval's implied SE on the log scale."""
    rng = np.random.default_rng(4)
    documents = np.repeat(np.arange(20), 3)
    total = rng.lognormal(0, 0.8, 60)
    proxy = total * rng.uniform(0.1, 0.3, 60)
    reference = 2 / 16 * total
    analysis = stats.analyze_energy(
        proxy,
        total,
        reference,
        rank=2,
        dim=16,
        null_fractions=rng.uniform(0.05, 0.2, 99),
        group_ids=documents,
        n_bootstrap=300,
        ci_method=method,
        seed=3,
    )
    ratio = analysis["energy_ratio"]
    sums, n = stats.cluster_sums(np.stack([proxy, reference], axis=1), documents)
    weights = stats.bootstrap_weights(n, 300, seed=3)
    expected = stats.ratio_interval(sums[:, 0], sums[:, 1], method, weights, expand_units=n)
    assert ratio.ci_method == method
    assert (ratio.ci_low, ratio.ci_high) == pytest.approx((expected.ci_low, min(expected.ci_high, 8.0)))
    z = ndtri(0.975)
    assert ratio.se == pytest.approx(ratio.estimate * np.log(ratio.ci_high / ratio.ci_low) / (2 * z))


def _reference_el_end(p, e, adjustment, critical, upward, first_step):
    """The EL interval's end by brute force: step through the bracketing schedule ``θ̂·s^(2^k)``
    (``_el_end``'s definition of where an end is looked for) to the first point whose statistic
    reaches ``critical``; in that bracket, the first crossing on a 400-point θ grid, then bisection
    to a relative 1e-15 — every evaluation a fresh `ratio_el_statistic` (λ solved from scratch)."""
    estimate = p.sum() / e.sum()

    def above(offset):
        theta = estimate * np.exp(offset if upward else -offset)
        return stats.ratio_el_statistic(p, e, theta, adjustment) >= critical

    previous = 0.0
    for offset in _schedule(first_step):
        if above(offset):
            grid = np.linspace(previous, offset, 401)
            hits = np.flatnonzero([above(x) for x in grid[1:]])
            low, high = grid[hits[0]], grid[hits[0] + 1]
            while high - low > 1e-15 * max(1.0, high):
                middle = 0.5 * (low + high)
                low, high = (low, middle) if above(middle) else (middle, high)
            return float(estimate * np.exp(0.5 * (low + high) if upward else -0.5 * (low + high)))
        previous = offset
    return np.inf if upward else 0.0


def _skewed_samples():
    """Skewed per-document sums: lognormal energies (σ 1.5 and 2.5, the calibration's `skewed` and
    `heavy` laws), one hot document, few and many units."""
    rng = np.random.default_rng(30)
    for n, sigma, hot in ((5, 1.5, False), (12, 2.5, False), (30, 1.5, True), (96, 2.5, True), (60, 1.5, False)):
        e = rng.lognormal(0.0, sigma, n)
        p = e * rng.uniform(0.0, 1.0, n) ** 2
        if hot:
            p[0], e[0] = 20.0 * p[0] + e[0], 5.0 * e[0]
        yield p, e


@pytest.mark.parametrize("method", ["el", "adjusted_el", "balanced_el"])
def test_el_ends_equal_a_brute_force_bisection_on_skewed_data(method):
    """The Newton root search (`_el_end`) against the brute-force reference at 1e-12 relative (the
    bundle keeps ten significant digits), both ends, two levels; an unbounded end is the same
    bound."""
    adjustment = {"el": "none", "adjusted_el": "adjusted", "balanced_el": "balanced"}[method]
    for p, e in _skewed_samples():
        estimate = p.sum() / e.sum()
        se = float(stats.ratio_se(np.ones((1, p.size)), p, e)[0])
        for level in (0.95, 0.8):
            critical = chi2.ppf(level, 1)
            first = float(np.exp(np.sqrt(critical) * se / estimate))
            interval = stats.ratio_interval(p, e, method, ci_level=level)
            for end, upward in ((interval.ci_low, False), (interval.ci_high, True)):
                reference = _reference_el_end(p, e, adjustment, critical, upward, first)
                if np.isfinite(reference) and reference > 0:
                    assert end == pytest.approx(reference, rel=1e-12, abs=0.0), (p.size, level, upward)
                else:
                    assert end == reference


def test_the_search_curve_is_the_statistic_and_its_slope_the_envelope_derivative():
    """`_RatioElCurve` (λ warm-started) returns `ratio_el_statistic` and, as its slope in ln θ, a
    central difference of it (the envelope theorem: λ's own change does not enter)."""
    p, e = next(_skewed_samples())
    p, e = np.r_[p, 0.9 * e[:3]], np.r_[e, e[:3]]
    for adjustment in EL_ADJUSTMENTS:
        curve = _RatioElCurve(p, e, adjustment)
        estimate = p.sum() / e.sum()
        for factor in (1.05, 1.2, 1.1, 0.95, 0.8, 0.9):  # warm starts from the previous θ
            x = np.log(estimate * factor)
            value, slope = curve(x)
            assert value == pytest.approx(stats.ratio_el_statistic(p, e, np.exp(x), adjustment), rel=1e-12)
            h = 1e-6
            difference = (
                stats.ratio_el_statistic(p, e, np.exp(x + h), adjustment)
                - stats.ratio_el_statistic(p, e, np.exp(x - h), adjustment)
            ) / (2 * h)
            assert slope == pytest.approx(difference, rel=1e-5)


def test_an_el_interval_takes_a_few_statistic_evaluations():
    """The cost the analysis pays per interval: on 96 lognormal units each end takes at most 4
    evaluations of the statistic (the former bracketing and Brent search took 8–10)."""
    rng = np.random.default_rng(8)
    e = rng.lognormal(0.0, 1.0, 96)
    p = 0.3 * e * rng.uniform(0.5, 1.5, 96)
    counted = []
    original = ratio_intervals._RatioElCurve.__call__

    def counting(self, log_theta):
        counted.append(log_theta)
        return original(self, log_theta)

    ratio_intervals._RatioElCurve.__call__ = counting
    try:
        for method in ("el", "adjusted_el", "balanced_el"):
            counted.clear()
            stats.ratio_interval(p, e, method)
            assert len(counted) <= 8, (method, len(counted))
    finally:
        ratio_intervals._RatioElCurve.__call__ = original


def test_the_multiplier_converges_from_a_start_beside_a_pole():
    """A warm start next to a pole ``−1/z_i`` (where Newton's step is tiny but wrong) still finds λ."""
    z = np.array([-1.0, 0.2, 0.5, 2.0, 0.1])  # poles at λ = −1/2 and 1
    cold = _el_multiplier(z)
    for start in (-0.5 * (1.0 - 1e-11), 1.0 - 1e-11, 50.0, -50.0):
        assert _el_multiplier(z, start) == pytest.approx(cold, rel=1e-12)
    assert cold[1] == pytest.approx(_el_by_optimisation(z), rel=1e-5)


def test_bca_log_jackknife_from_leave_one_out_sums_equals_the_matrix_form():
    """The jackknife replicates from leave-one-out sums equal the n × n matrix form to rounding,
    and the bca_log interval built on them equals BCa of ln θ with the matrix jackknife."""
    rng = np.random.default_rng(7)
    e = rng.lognormal(0.0, 1.0, 40)
    p = e * rng.uniform(0.2, 0.6, 40)
    drop_one = 1.0 - np.eye(p.size)
    matrix = (drop_one @ p) / (drop_one @ e)
    sums = ratio_intervals.leave_one_out_ratios(p, e)
    np.testing.assert_allclose(sums, matrix, rtol=1e-14, atol=0)
    w = stats.bootstrap_weights(p.size, 500, seed=2)
    got = stats.ratio_interval(p, e, "bca_log", w, expand_units=p.size)
    estimate = p.sum() / e.sum()
    ref = stats.ci_from_replicates(
        np.log(estimate), np.log((w @ p) / (w @ e)), np.log(matrix), 0.95, "bca", expand_units=p.size
    )
    assert (got.ci_low, got.ci_high) == pytest.approx((np.exp(ref.ci_low), np.exp(ref.ci_high)), rel=1e-12)


def test_bca_log_runs_at_30000_units_without_an_n_by_n_matrix():
    """30,000 units: an n × n float64 jackknife matrix would be 7.2 GB; the interval's peak
    allocation stays within a few copies of the (B, n) weights."""
    import tracemalloc

    n, resamples = 30_000, 20
    rng = np.random.default_rng(1)
    e = rng.lognormal(0.0, 1.0, n)
    p = e * rng.uniform(0.2, 0.6, n)
    w = stats.bootstrap_weights(n, resamples, seed=3)
    tracemalloc.start()
    try:
        r = stats.ratio_interval(p, e, "bca_log", w, expand_units=n)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ci_low < r.estimate < r.ci_high
    assert peak < 4 * w.nbytes < n * n * 8 / 100, f"peak {peak / 1e6:.1f} MB"
