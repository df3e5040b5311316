"""anistat.stats.power: the power and sample-size formulas against closed forms, statsmodels and
scipy, the simulated small-sample laws against the analysis' own procedures, and the
statsmodels-like ``solve_power`` of each quantity (solve for whichever of documents, effect and
power / half-width is missing)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.power import NormalIndPower, TTestPower

from anistat import plan
from anistat.stats import control_energy_moments, expanded_tail, min_controls_needed, power


# ------------------------------------------------------------------------- closed forms
def test_half_width_scales_as_one_over_root_n():
    """Half the width needs about four times the documents (exactly 4 in the normal limit)."""
    tau, ratio = 0.6, 1.25
    n1 = power.documents_for_half_width(tau, ratio, 0.04)
    n2 = power.documents_for_half_width(tau, ratio, 0.02)
    assert 3.9 < n2 / n1 < 4.1
    # the normal-limit closed form n = (z τ / asinh(w/R))²
    z = sps.norm.ppf(0.975)
    assert abs(n2 - (z * tau / math.asinh(0.02 / ratio)) ** 2) / n2 < 0.01
    # and it is the smallest n that meets the target
    assert power.ci_half_width(n2, tau, ratio) <= 0.02 < power.ci_half_width(n2 - 1, tau, ratio)


def test_data_test_power_is_statsmodels_one_sample_t_power():
    tau, ratio, threshold = 0.5, 1.2, 0.01
    effect = math.log(ratio) / tau
    for n in (12, 40, 150):
        expected = TTestPower().power(effect_size=effect, nobs=n, alpha=threshold, alternative="larger")
        assert power.data_test_power(n, tau, ratio, threshold) == pytest.approx(expected, abs=1e-9)
    n = power.documents_for_data_test(tau, ratio, 0.8, 0.05, small_sample=False)
    solved = TTestPower().solve_power(effect_size=effect, alpha=0.05, power=0.8, alternative="larger")
    assert n == math.ceil(solved)


def test_simulated_pvalues_are_the_analysis_data_test():
    """The plan's batched test is the analysis' own: on each simulated study its p-value equals
    anistat.stats.studentized_ratio_test's (same documents, resamples and expansion)."""
    from anistat.stats import bootstrap_weights, studentized_ratio_test

    n, threshold, k_over_d = 15, 0.005, 0.125
    proxy, total = power.law_documents(n, 0.45, 0.8, 1.25 * k_over_d)
    weights = bootstrap_weights(n, power.data_test_resamples(threshold, n), seed=n)
    batched = power.studentized_pvalues(proxy, k_over_d * total, weights)
    for i in range(40):
        test = studentized_ratio_test(proxy[i], k_over_d * total[i], weights, expand_units=n)
        assert batched[i] == pytest.approx(test.p_value, rel=1e-12)
    assert 0 < np.mean(batched <= threshold) < 1
    chunked = power.studentized_pvalues(proxy, k_over_d * total, weights, chunk_rows=97)
    assert chunked == pytest.approx(batched, rel=1e-12)


@pytest.mark.parametrize("tau, total_cv", [(0.45, 0.78), (0.28, 0.7), (0.85, 3.3), (0.5, None)])
def test_document_law_has_the_pilot_summaries(tau, total_cv):
    """Large samples of the law give back its τ (SD of p/μ_p − t/μ_t), cv_t (when cv_t ≥ τ; else
    a constant scale, cv_t = τ) and the energy fraction f (E p / E t)."""
    fraction = 0.2
    sd_scale, sd_share = power.document_law(tau, total_cv, fraction)
    rng = np.random.default_rng(5)
    scale = np.exp(sd_scale * rng.standard_normal(2_000_000) - sd_scale**2 / 2)
    share = np.exp(sd_share * rng.standard_normal(2_000_000) - sd_share**2 / 2)
    p, t = fraction * scale, scale * (fraction + (1 - fraction) * share)
    assert p.mean() / t.mean() == pytest.approx(fraction, rel=0.01)
    # closed forms: Var r = (1 + s²)(1 − f)² c_B², cv_t² = s² + τ² (heavy tails: moments, not samples)
    scale_sq, share_cv_sq = math.exp(sd_scale**2), math.expm1(sd_share**2)
    assert math.sqrt(scale_sq * (1 - fraction) ** 2 * share_cv_sq) == pytest.approx(tau, rel=1e-9)
    expected_cv = max(total_cv or 0.0, tau)
    assert math.sqrt(scale_sq - 1 + tau**2) == pytest.approx(expected_cv, rel=1e-9)
    if tau < 0.6:  # light enough tails for the sample to check the closed forms
        assert np.std(p / p.mean() - t / t.mean()) == pytest.approx(tau, rel=0.03)
        assert t.std() / t.mean() == pytest.approx(expected_cv, rel=0.03)


def test_law_power_against_an_independent_simulation():
    """The plan's simulated power at 30 documents against studies drawn here afresh (another seed,
    per-study bootstrap streams) and tested one by one with studentized_ratio_test: equal within
    the two simulations' Monte-Carlo margin."""
    from anistat.stats import bootstrap_weights, studentized_ratio_test

    n, tau, total_cv, ratio, threshold, k_over_d = 30, 0.45, 0.78, 1.3, 0.005, 0.125
    planned = power.law_data_test_power(n, tau, ratio, threshold, total_cv, k_over_d)
    sd_scale, sd_share = power.document_law(tau, total_cv, ratio * k_over_d)
    rng = np.random.default_rng(np.random.SeedSequence([7, 30]))
    hits, studies = 0, 400
    for i in range(studies):
        scale = np.exp(sd_scale * rng.standard_normal(n) - sd_scale**2 / 2)
        share = np.exp(sd_share * rng.standard_normal(n) - sd_share**2 / 2)
        p, t = ratio * k_over_d * scale, scale * (ratio * k_over_d + (1 - ratio * k_over_d) * share)
        weights = bootstrap_weights(n, power.data_test_resamples(threshold, n), seed=1000 + i)
        hits += studentized_ratio_test(p, k_over_d * t, weights, expand_units=n).p_value <= threshold
    independent = hits / studies
    margin = 1.96 * math.sqrt(0.25 / studies + 0.25 / power.DATA_TEST_STUDIES)
    assert abs(planned - independent) < margin
    assert 0.2 < planned < 0.95  # a power the comparison can resolve


def test_data_test_plan_is_the_smallest_count_of_the_simulated_law():
    """At τ = 0.28, R = 1.5, α/m = 0.005 the t formula plans 10 documents; the plan's law (the
    real test on simulated studies) asks more, reaches 0.8 at its count and not one below; from
    DATA_TEST_SIMULATION_LIMIT on the noncentral-t power takes over, at the law's boundary relative SD. With the pilot's cv_t the law
    changes and so does the count, again the smallest that meets the target."""
    tau, ratio, threshold = 0.28, 1.5, 0.005
    t_plan = power.documents_for_data_test(tau, ratio, 0.8, threshold, small_sample=False)
    planned = power.documents_for_data_test(tau, ratio, 0.8, threshold)
    assert t_plan == 10 and planned is not None and planned > t_plan + 2
    assert power.law_data_test_power(t_plan, tau, ratio, threshold) < 0.5
    assert power.law_data_test_power(planned, tau, ratio, threshold) >= 0.8
    assert power.law_data_test_power(planned - 1, tau, ratio, threshold) < 0.8
    assert power.data_test_power(t_plan, tau, ratio, threshold) >= 0.8
    spread = power.documents_for_data_test(0.45, 1.25, 0.8, threshold, total_cv=2.0)
    assert spread is not None
    assert power.law_data_test_power(spread, 0.45, 1.25, threshold, 2.0) >= 0.8
    assert power.law_data_test_power(spread - 1, 0.45, 1.25, threshold, 2.0) < 0.8
    assert spread != power.documents_for_data_test(0.45, 1.25, 0.8, threshold)
    # from DATA_TEST_SIMULATION_LIMIT on: the t formula at the relative SD that matches the law at
    # the last simulated size, so the power does not jump up where the simulation stops
    limit = power.DATA_TEST_SIMULATION_LIMIT
    boundary = power.boundary_relative_sd(0.9, 1.1, threshold)
    assert boundary > 0.9
    last = power.law_data_test_power(limit - 1, 0.9, 1.1, threshold)
    assert power.data_test_power(limit - 1, boundary, 1.1, threshold) == pytest.approx(last, abs=1e-9)
    assert power.law_data_test_power(limit, 0.9, 1.1, threshold) == power.data_test_power(
        limit, boundary, 1.1, threshold
    )
    assert power.law_data_test_power(limit, 0.9, 1.1, threshold) < power.data_test_power(limit, 0.9, 1.1, threshold)


def test_the_simulated_law_extends_past_the_interval_limit():
    """The data test's law is simulated to DATA_TEST_SIMULATION_LIMIT (above the half-width's
    SMALL_SAMPLE_LIMIT): its first SMALL_SAMPLE_LIMIT documents are the ones every smaller size
    has always used, and a heavy-tailed law's power there falls below the t formula matched at
    SMALL_SAMPLE_LIMIT − 1 (the reason the simulation goes further: the calibration's hot law)."""
    assert power.DATA_TEST_SIMULATION_LIMIT > power.SMALL_SAMPLE_LIMIT
    normals = power._law_normals()
    assert normals.shape == (power.DATA_TEST_STUDIES, power.DATA_TEST_SIMULATION_LIMIT, 2)
    first = np.random.default_rng(np.random.SeedSequence([29, 2, power.SMALL_SAMPLE_LIMIT]))
    assert np.array_equal(normals[:, : power.SMALL_SAMPLE_LIMIT], first.standard_normal(normals[:, :300].shape))
    # the hot law's τ, cv_t and ratio (benchmarks/README.md): the simulated power at 600 documents
    # against the t formula at the relative SD matched to the law at 299
    tau, total_cv, ratio, threshold, n_b = 2.18, 1.41, 1.40, 0.005, power.SMALL_SAMPLE_LIMIT - 1
    law_at_boundary = power.law_data_test_power(n_b, tau, ratio, threshold, total_cv)
    low, high = math.log(tau), math.log(100 * tau)
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (
            (middle, high)
            if power.data_test_power(n_b, math.exp(middle), ratio, threshold) > law_at_boundary
            else (low, middle)
        )
    matched = math.exp(high)
    assert (
        power.law_data_test_power(600, tau, ratio, threshold, total_cv)
        < power.data_test_power(600, matched, ratio, threshold) - 0.03
    )


def test_small_sample_half_width_of_the_protocol_interval():
    """The protocol's default interval (F-calibrated adjusted EL) is wider than the t interval
    at few documents, so more are planned; near SMALL_SAMPLE_LIMIT the two agree within 2 %."""
    from anistat.protocol import StatsSpec

    assert plan.DEFAULT_CI_METHOD == StatsSpec.model_fields["ci_method"].default
    tau, ratio = 0.28, 1.25
    t_plan = power.documents_for_half_width(tau, ratio, 0.1)
    small = power.documents_for_half_width(tau, ratio, 0.1, ci_method=plan.DEFAULT_CI_METHOD)
    assert small > t_plan
    assert power.small_sample_half_width(t_plan, tau, ratio, 0.95, plan.DEFAULT_CI_METHOD) > 0.1
    near = power.SMALL_SAMPLE_LIMIT - 1
    assert power.small_sample_half_width(near, tau, ratio, 0.95, plan.DEFAULT_CI_METHOD) == pytest.approx(
        power.ci_half_width(near, tau, ratio), rel=0.02
    )
    # each simulated interval is the analysis' own: the default interval of the study's documents
    from anistat.stats import ratio_interval

    proxy, total = (rows[0] for rows in power._simulated_documents(20))
    assert np.array_equal(total, np.ones(20))
    interval = ratio_interval(proxy, total, plan.DEFAULT_CI_METHOD, None, 0.95, expand_units=20)
    low, high = power.interval_log_factors(20, 0.95, plan.DEFAULT_CI_METHOD)[0]
    scale = power.SIMULATED_RELATIVE_SD / math.sqrt(20)
    assert interval.ci_high == pytest.approx(proxy.mean() * math.exp(high * scale))
    assert interval.ci_low == pytest.approx(proxy.mean() * math.exp(-low * scale))


def test_small_sample_half_width_sees_the_total_energy_cv():
    """With the law's total-energy CV the simulated documents' totals are lognormal with that CV
    (Kish n_eff ≈ n/(1 + cv_t²)), the F-calibrated interval widens with it, and so does the plan;
    each simulated interval is still the real ``ratio_interval`` of its study."""
    from anistat.stats import bootstrap_weights, kish_effective_size, ratio_interval

    proxy, total = power._simulated_documents(power.SMALL_SAMPLE_LIMIT, 0.8)
    assert total.mean() == pytest.approx(1.0, abs=0.02)
    assert total.std() / total.mean() == pytest.approx(0.8, rel=0.1)
    assert np.std(proxy - total) == pytest.approx(power.SIMULATED_RELATIVE_SD, rel=0.02)
    n = 40
    proxy, total = (rows[1] for rows in power._simulated_documents(n, 0.8))
    assert kish_effective_size(total) < 0.8 * n
    weights = bootstrap_weights(n, power.SIMULATED_RESAMPLES, seed=n)
    interval = ratio_interval(proxy, total, plan.DEFAULT_CI_METHOD, weights, 0.95, expand_units=n)
    low, high = power.interval_log_factors(n, 0.95, plan.DEFAULT_CI_METHOD, 0.8)[1]
    estimate, scale = proxy.sum() / total.sum(), power.SIMULATED_RELATIVE_SD / math.sqrt(n)
    assert interval.ci_high == pytest.approx(estimate * math.exp(high * scale))
    assert interval.ci_low == pytest.approx(estimate * math.exp(-low * scale))
    tau, ratio, method = 0.28, 1.1, plan.DEFAULT_CI_METHOD
    widths = [power.small_sample_half_width(n, tau, ratio, 0.95, method, cv) for cv in (None, 0.4, 0.8, 1.2)]
    assert widths[0] < widths[2] < widths[3]
    assert widths[1] < widths[2]
    sizes = [power.documents_for_half_width(tau, ratio, 0.1, 0.95, method, cv) for cv in (None, 0.4, 0.8, 1.2)]
    assert sizes[0] <= sizes[1] <= sizes[2] < sizes[3]
    assert sizes[0] < sizes[2]
    # the cache key is cv_t rounded: a cv_t within the rounding plans the same
    assert power.small_sample_half_width(n, tau, ratio, 0.95, method, 0.8004) == widths[2]
    # where the simulation stops the width carries on (concentrated totals: wider than t's)
    limit = power.SMALL_SAMPLE_LIMIT
    below, at = (power.small_sample_half_width(k, 0.5, 1.25, 0.95, method, 3.3) for k in (limit - 1, limit))
    assert at == pytest.approx(below, rel=0.005)
    assert at > 1.1 * power.ci_half_width(limit, 0.5, 1.25)
    assert power.small_sample_half_width(limit, 0.5, 1.25, 0.95, method) == power.ci_half_width(limit, 0.5, 1.25)


def test_a_heavy_tailed_law_plans_a_half_width_past_the_unbounded_intervals():
    """Totals of CV 12.7 (the calibration's heavy law): at 292 documents some simulated F-calibrated
    intervals are unbounded (m ≈ 2), so the width cannot be extrapolated from there; the
    simulation goes on to the first extended size where every interval is bounded and the plan is
    finite from it (inf below it). A law whose intervals are bounded at 292 keeps that boundary."""
    method = plan.DEFAULT_CI_METHOD
    first = power.simulated_size(power.SMALL_SAMPLE_LIMIT - 1)
    assert not np.isfinite(power.interval_log_factors(first, 0.95, method, 12.7)).all()
    size, factor = power.width_boundary(0.95, method, 12.7)
    assert size in power.EXTENDED_SIZES and np.isfinite(power.interval_log_factors(size, 0.95, method, 12.7)).all()
    assert factor >= 1.0 and factor < 3.0  # a finite multiplier of the t width
    assert power.small_sample_half_width(size - 1, 4.3, 1.1, 0.95, method, 12.7) == math.inf
    assert power.small_sample_half_width(size, 4.3, 1.1, 0.95, method, 12.7) == power.ci_half_width(
        size, factor * 4.3, 1.1
    )
    planned = power.documents_for_half_width(4.3, 1.1, 0.1, 0.95, method, 12.7)
    assert planned is not None and planned >= size
    assert power.small_sample_half_width(planned, 4.3, 1.1, 0.95, method, 12.7) <= 0.1
    assert power.small_sample_half_width(planned - 1, 4.3, 1.1, 0.95, method, 12.7) > 0.1
    assert power.width_boundary(0.95, method, 0.8)[0] == first
    # the bootstrap methods are not simulated past SMALL_SAMPLE_LIMIT (their weights would not fit)
    assert power.width_boundary(0.95, "studentized_log", 0.8)[0] == first


def test_exact_test_power_is_a_one_sided_normal_power():
    """Φ(√n log(F/q)/τ): statsmodels' one-sample normal power with effect log(F/q)/τ (at alpha 0.5,
    where the critical value is 0: the null quantile q already holds the threshold)."""
    tau, ratio, rank, dim, q = 0.4, 1.5, 4, 32, 0.16
    effect = math.log(ratio * rank / dim / q) / tau
    for n in (5, 30):
        expected = NormalIndPower().power(effect, nobs1=n, alpha=0.5, ratio=0, alternative="larger")
        assert power.exact_test_power(n, tau, ratio, rank, dim, q) == pytest.approx(expected, abs=1e-9)
    # below the reachable ratio no study size reaches any power
    assert power.documents_for_exact_test(tau, 1.2, 0.8, rank, dim, q) is None
    assert power.documents_for_exact_test(tau, ratio, 0.8, rank, dim, q) is not None


def test_haar_null_quantile_is_the_beta_law_for_a_rank_one_moment_and_kd_for_isotropic():
    for rank, dim in ((1, 8), (3, 24)):
        sd = control_energy_moments("haar", rank, dim, 1.0, 1.0).sd
        exact = sps.beta.isf(0.001, rank / 2, (dim - rank) / 2)
        assert power.haar_null_quantile(rank, dim, sd, 0.001) == pytest.approx(exact, rel=1e-9)
    isotropic = control_energy_moments("haar", 4, 32, 1.0, 1.0 / 32).sd
    assert power.haar_null_quantile(4, 32, isotropic, 0.001) == pytest.approx(4 / 32)


def test_haar_null_quantile_against_haar_draws():
    """The Beta moment match against the tail of real Haar draws in an anisotropic spectrum."""
    rng = np.random.default_rng(0)
    dim, rank = 16, 2
    lam = 1.0 / np.arange(1, dim + 1)
    w = lam / lam.sum()
    z = rng.standard_normal((40_000, dim, rank))
    q, _ = np.linalg.qr(z)
    fractions = (q**2).sum(axis=2) @ w
    sd = control_energy_moments("haar", rank, dim, 1.0, float((w * w).sum())).sd
    assert fractions.std() == pytest.approx(sd, rel=0.02)
    for tail in (0.05, 0.01):
        assert power.haar_null_quantile(rank, dim, sd, tail) == pytest.approx(
            np.quantile(fractions, 1 - tail), rel=0.06
        )


def test_null_draws_resolve_half_the_threshold():
    for threshold in (0.05, 0.005, 0.05 / 48):
        n = power.null_draws_needed(threshold)
        assert n >= min_controls_needed(threshold, 1, "none")
        allowed = math.floor(threshold * (n + 1) + 1e-12) - 1
        assert sps.binom.cdf(allowed, n, threshold / 2) >= power.DRAWS_RESOLUTION
        before = n - 1
        allowed = math.floor(threshold * (before + 1) + 1e-12) - 1
        assert allowed < 0 or sps.binom.cdf(allowed, before, threshold / 2) < power.DRAWS_RESOLUTION
    # the data test's resamples resolve its expanded tail, smaller than the threshold at few documents
    assert power.data_test_resamples(0.005, 20) == power.null_draws_needed(expanded_tail(0.005, 20))


def test_upper_limit_of_the_pilot_variance_is_chi_square():
    tau, n, c = 0.5, 16, 0.8
    upper = power.upper_relative_sd(tau, n, c)
    assert upper**2 == pytest.approx((n - 1) * tau**2 / sps.chi2.ppf(1 - c, n - 1))
    assert upper > tau and power.upper_relative_sd(tau, 200, c) < upper
    assert power.upper_relative_sd(tau, None, c) is None


def test_relative_sd_is_the_ratio_of_means_delta_method():
    rng = np.random.default_rng(1)
    t = rng.gamma(4.0, 1.0, 200_000)
    p = 0.1 * t * rng.lognormal(0.0, 0.3, t.size)
    cv_p, cv_t = p.std() / p.mean(), t.std() / t.mean()
    rho = np.corrcoef(p, t)[0, 1]
    direct = np.std(p / p.mean() - t / t.mean())
    assert power.relative_sd(cv_p, cv_t, rho) == pytest.approx(direct, rel=1e-6)


# ------------------------------------------------------------------------- solve_power
def test_solve_power_needs_exactly_one_missing_argument():
    with pytest.raises(ValueError, match="all but one"):
        power.HalfWidth(0.5).solve_power(nobs=100)
    with pytest.raises(ValueError, match="all but one"):
        power.DataTestPower(0.5, 0.05).solve_power(nobs=100, ratio=1.2, power=0.8)


def test_data_test_t_formula_solves_as_statsmodels_ttestpower():
    """Without the small-sample law the data test is statsmodels' one-sample t-test with effect
    size log R / τ: its power, its documents (the integer above statsmodels' real solution, at
    least MIN_RESAMPLING_UNITS) and its effect (log R = τ × statsmodels' effect size)."""
    tau, threshold = 0.5, 0.01
    test = power.DataTestPower(tau, threshold, small_sample=False)
    reference = TTestPower()
    for n, ratio in ((12, 1.3), (40, 1.2), (150, 1.1)):
        expected = reference.power(effect_size=math.log(ratio) / tau, nobs=n, alpha=threshold, alternative="larger")
        assert test.solve_power(nobs=n, ratio=ratio) == pytest.approx(expected, abs=1e-9)
    n = test.solve_power(ratio=1.2, power=0.8)
    solved = reference.solve_power(effect_size=math.log(1.2) / tau, alpha=threshold, power=0.8, alternative="larger")
    assert n == max(math.ceil(solved), power.MIN_RESAMPLING_UNITS)
    ratio = test.solve_power(nobs=80, power=0.8)
    effect = reference.solve_power(nobs=80, alpha=threshold, power=0.8, alternative="larger")
    assert math.log(ratio) == pytest.approx(tau * effect, rel=1e-4)


def test_data_test_small_sample_solves_on_the_simulated_law():
    """With the small-sample law: documents as documents_for_data_test plans them, power as the
    law's rejection rate, and the effect the smallest ratio whose simulated power reaches it."""
    tau, threshold = 0.28, 0.005
    test = power.DataTestPower(tau, threshold)
    n = test.solve_power(ratio=1.5, power=0.8)
    assert n == power.documents_for_data_test(tau, 1.5, 0.8, threshold)
    assert test.solve_power(nobs=n, ratio=1.5) == power.law_data_test_power(n, tau, 1.5, threshold) >= 0.8
    ratio = test.solve_power(nobs=n, power=0.8)
    assert ratio <= 1.5 and test.power(n, ratio) >= 0.8 > test.power(n, ratio * (1 - 1e-4))


def test_exact_test_solves_in_closed_form():
    """Φ(√n log(R k/(d q))/τ): statsmodels' one-sample normal power, inverted for R in closed form
    and for n as the smallest count that reaches the power."""
    tau, rank, dim, q = 0.4, 4, 32, 0.16
    exact = power.ExactTestPower(tau, rank, dim, q)
    for n in (5, 30):
        effect = math.log(1.5 * rank / dim / q) / tau
        expected = NormalIndPower().power(effect, nobs1=n, alpha=0.5, ratio=0, alternative="larger")
        assert exact.solve_power(nobs=n, ratio=1.5) == pytest.approx(expected, abs=1e-9)
        ratio = exact.solve_power(nobs=n, power=0.8)
        assert exact.power(n, ratio) == pytest.approx(0.8, abs=1e-12)
    n = exact.solve_power(ratio=1.5, power=0.8)
    assert exact.power(n, 1.5) >= 0.8 > exact.power(n - 1, 1.5)
    assert exact.solve_power(ratio=1.2, power=0.8) is None  # R k/d below q


def test_half_width_solves_for_documents_and_effect():
    """The half-width is R times its value at R = 1, so the largest effect a width allows is
    closed-form; documents are documents_for_half_width's, for the t and the analysis' interval."""
    for method, cv in ((None, None), (plan.DEFAULT_CI_METHOD, 0.8)):
        width = power.HalfWidth(0.28, 0.95, method, cv)
        n = width.solve_power(ratio=1.25, half_width=0.1)
        assert n == power.documents_for_half_width(0.28, 1.25, 0.1, 0.95, method, cv)
        assert width.solve_power(nobs=n, ratio=1.25) <= 0.1 < width.half_width(n - 1, 1.25)
        ratio = width.solve_power(nobs=n, half_width=0.1)
        assert ratio >= 1.25 and width.half_width(n, ratio) == pytest.approx(0.1, rel=1e-12)
    z = sps.norm.ppf(0.975)
    assert power.HalfWidth(0.5).half_width(10**6, 1.0) == pytest.approx(math.sinh(z * 0.5 / 1000), rel=1e-4)
