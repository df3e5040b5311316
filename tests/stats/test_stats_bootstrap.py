"""Sequence bootstrap: weights, percentile/BCa CIs against scipy, degenerate fallbacks."""

import numpy as np
import pytest
from scipy import stats

from anistat.stats import (
    bootstrap_weights,
    ci_from_replicates,
    iter_bootstrap_weights,
    jackknife_weights,
    sequence_bootstrap,
)


def test_weights_are_multinomial_counts_and_deterministic():
    w = bootstrap_weights(50, 300, seed=3)
    assert w.shape == (300, 50)
    assert np.all(w.sum(axis=1) == 50) and np.all(w >= 0) and np.all(w == np.round(w))
    assert np.array_equal(w, bootstrap_weights(50, 300, seed=3))
    assert not np.array_equal(w, bootstrap_weights(50, 300, seed=4))
    # each sequence has expected multiplicity 1, variance 1 - 1/S
    assert abs(w.mean() - 1) < 1e-12
    assert abs(w.var() - (1 - 1 / 50)) < 0.05
    # streaming does not depend on the chunk size
    chunks = np.concatenate(list(iter_bootstrap_weights(50, 300, seed=3, chunk_size=77)))
    assert np.array_equal(chunks, w)


def test_hierarchical_weights():
    groups = np.repeat(np.arange(10), np.arange(1, 11))  # 55 sequences in 10 documents
    w = bootstrap_weights(groups.size, 2000, seed=0, group_ids=groups)
    assert w.shape == (2000, 55)
    # every sequence keeps expected multiplicity 1
    assert np.allclose(w.mean(axis=0), 1.0, atol=0.12)
    # within a document the total weight is a multiple of its size
    for g in range(10):
        tot = w[:, groups == g].sum(axis=1)
        assert np.all(tot % (g + 1) == 0)
    jw = jackknife_weights(groups.size, groups)
    assert jw.shape == (10, 55) and np.all(jw.sum(axis=1) == 55 - np.arange(1, 11))


def _ratio_data(seed=0, s=60):
    rng = np.random.default_rng(seed)
    t = rng.lognormal(0, 0.7, s) * rng.chisquare(8, s)
    p = t * rng.beta(2, 12, s)
    return p, t


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_ratio_ci_agrees_with_scipy(method):
    p, t = _ratio_data()
    s = p.size
    ours = sequence_bootstrap(lambda w: (w @ p) / (w @ t), s, n_resamples=20000, seed=1, method=method)
    ref = stats.bootstrap(
        (p, t),
        lambda a, b, axis: a.sum(axis) / b.sum(axis),
        paired=True,
        vectorized=True,
        n_resamples=20000,
        method="BCa" if method == "bca" else "percentile",
        rng=2,
    )
    assert ours.method == method and ours.note == ""
    assert ours.estimate == pytest.approx(p.sum() / t.sum())
    se = ref.standard_error
    # endpoints of two independent 20000-resample runs agree within Monte-Carlo error
    # (the sd of one run's tail endpoint is ~0.03-0.04 se here)
    assert abs(ours.ci_low - ref.confidence_interval.low) < 0.15 * se
    assert abs(ours.ci_high - ref.confidence_interval.high) < 0.15 * se
    assert ours.se == pytest.approx(se, rel=0.05)


def test_mean_ci_agrees_with_scipy_bca():
    rng = np.random.default_rng(9)
    x = rng.exponential(size=40)
    ours = sequence_bootstrap(lambda w: (w @ x) / w.sum(axis=1), 40, 20000, seed=0)
    ref = stats.bootstrap((x,), np.mean, n_resamples=20000, method="BCa", rng=1)
    se = ref.standard_error
    assert abs(ours.ci_low - ref.confidence_interval.low) < 0.15 * se
    assert abs(ours.ci_high - ref.confidence_interval.high) < 0.15 * se


def test_bca_fallbacks_are_recorded():
    const = np.ones(30)
    r = sequence_bootstrap(lambda w: (w @ const) / w.sum(axis=1), 30, 500, seed=0)
    assert r.method == "percentile" and "all bootstrap resamples equal" in r.note
    assert r.ci_low == r.ci_high == 1.0
    # too few sequences for the jackknife
    r = sequence_bootstrap(lambda w: w @ np.array([1.0, 2.0]), 2, 500, seed=0)
    assert r.method == "percentile" and "too few sequences" in r.note
    # estimate outside the bootstrap distribution -> infinite bias correction
    r = ci_from_replicates(10.0, np.linspace(0, 1, 200), np.linspace(0, 1, 20))
    assert r.method == "percentile" and "bias correction infinite" in r.note
    # jackknife values all equal -> acceleration undefined
    r = ci_from_replicates(0.5, np.linspace(0, 1, 200), np.full(20, 0.3))
    assert r.method == "percentile" and "acceleration" in r.note
    # non-finite resamples are dropped and counted
    reps = np.r_[np.linspace(0, 1, 198), np.nan, np.inf]
    r = ci_from_replicates(0.5, reps, np.linspace(0, 1, 20), method="percentile")
    assert "2 of 200" in r.note and np.isfinite(r.ci_low)


def test_statistic_shape_is_checked():
    with pytest.raises(ValueError):
        sequence_bootstrap(lambda w: w, 10, 100)
    with pytest.raises(ValueError):
        sequence_bootstrap(lambda w: w.sum(axis=1), 10, 100, method="bogus")


def test_bca_falls_back_when_an_endpoint_would_be_the_extreme_resample():
    """An estimate deep in the tail of its own bootstrap distribution pushes a BCa level past
    the last replicate (R's boot warns "extreme order statistics used as endpoints"): the
    interval falls back to percentile and says why; the bias is reported either way."""
    rng = np.random.default_rng(0)
    replicates = rng.normal(size=1000)
    jackknife = rng.normal(size=50)
    deep = ci_from_replicates(2.5, replicates, jackknife, 0.95, "bca")
    assert deep.method == "percentile" and "most extreme resample" in deep.note
    assert (deep.ci_low, deep.ci_high) == pytest.approx(tuple(np.quantile(replicates, [0.025, 0.975])))
    assert deep.bias == pytest.approx(replicates.mean() - 2.5)
    assert deep.bias_in_se == pytest.approx(deep.bias / replicates.std(ddof=1))
    central = ci_from_replicates(0.05, replicates, jackknife, 0.95, "bca")
    assert central.method == "bca" and central.note == ""


def test_bca_can_fall_back_to_the_basic_interval():
    rng = np.random.default_rng(1)
    replicates = rng.normal(size=1000)
    deep = ci_from_replicates(2.5, replicates, rng.normal(size=50), 0.95, "bca", bca_fallback="basic")
    low, high = np.quantile(replicates, [0.025, 0.975])
    assert deep.method == "basic" and "BCa fell back to basic" in deep.note
    assert (deep.ci_low, deep.ci_high) == pytest.approx((5.0 - high, 5.0 - low))
    with pytest.raises(ValueError):
        ci_from_replicates(0.0, replicates, None, 0.95, "bca", bca_fallback="studentized")
