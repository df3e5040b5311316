"""Monte-Carlo p-values and the sign-flip permutation test."""

import numpy as np
import pytest
from scipy import stats

from anistat.stats import min_attainable_pvalue, monte_carlo_pvalue, sign_flip_pvalues, sign_flip_test


def test_mc_pvalue_closed_cases():
    null = np.arange(1.0, 20.0)  # 19 controls: 1..19
    assert monte_carlo_pvalue(100.0, null) == pytest.approx(1 / 20)
    assert monte_carlo_pvalue(-1.0, null) == pytest.approx(1.0)
    assert monte_carlo_pvalue(10.0, null) == pytest.approx((1 + 10) / 20)  # ties count
    assert monte_carlo_pvalue(10.0, null, "less") == pytest.approx((1 + 10) / 20)
    assert monte_carlo_pvalue(100.0, null, "two-sided") == pytest.approx(2 / 20)
    assert monte_carlo_pvalue(10.0, null, "two-sided") == pytest.approx(1.0)
    assert min_attainable_pvalue(20) == pytest.approx(1 / 21)


def test_mc_pvalue_vectorised_and_nan():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=5)
    null = rng.normal(size=(5, 50))
    vec = monte_carlo_pvalue(obs, null)
    assert vec.shape == (5,)
    for i in range(5):
        assert vec[i] == monte_carlo_pvalue(obs[i], null[i])
    null[0, :10] = np.nan  # NaN controls are dropped
    assert monte_carlo_pvalue(obs[0], null[0]) == monte_carlo_pvalue(obs[0], null[0, 10:])
    assert np.isnan(monte_carlo_pvalue(np.nan, null[1]))
    with pytest.raises(ValueError):
        monte_carlo_pvalue(1.0, null[0], "bigger")


def test_mc_pvalue_is_valid_under_exchangeability():
    rng = np.random.default_rng(1)
    draws = rng.normal(size=(20000, 20))
    p = monte_carlo_pvalue(draws[:, 0], draws[:, 1:])
    for a in (0.05, 0.1, 0.5):
        assert abs((p <= a).mean() - np.floor(a * 20) / 20) < 0.01


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sign_flip_exact_equals_scipy(alternative, seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.3, 1.0, size=10)
    ours = sign_flip_test(d, n_permutations=5000, seed=0, alternative=alternative)
    ref = stats.permutation_test(
        (d,),
        lambda x, axis: np.mean(x, axis=axis),
        permutation_type="samples",
        n_resamples=np.inf,
        alternative=alternative,
        vectorized=True,
    )
    assert ours.exact and ours.n_permutations == 2**10
    assert ours.statistic == pytest.approx(ref.statistic)
    assert ours.p_value == ref.pvalue  # exact enumeration: identical


def test_sign_flip_exact_with_ties_equals_scipy():
    d = np.array([1.0, -1.0, 2.0, -2.0, 0.5, 0.5, -0.5, 3.0])
    ours = sign_flip_test(d, n_permutations=1000)
    ref = stats.permutation_test(
        (d,),
        lambda x, axis: np.mean(x, axis=axis),
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="greater",
        vectorized=True,
    )
    assert ours.p_value == ref.pvalue


def test_sign_flip_randomised_agrees_with_scipy_within_mc_error():
    rng = np.random.default_rng(3)
    d = rng.normal(0.15, 1.0, size=80)
    ours = sign_flip_test(d, n_permutations=20000, seed=4)
    ref = stats.permutation_test(
        (d,),
        lambda x, axis: np.mean(x, axis=axis),
        permutation_type="samples",
        n_resamples=20000,
        vectorized=True,
        alternative="greater",
        rng=5,
    )
    assert not ours.exact
    se = np.sqrt(ref.pvalue * (1 - ref.pvalue) / 20000)
    assert abs(ours.p_value - ref.pvalue) < 5 * se + 1e-4


def test_sign_flip_deterministic_and_vectorised():
    rng = np.random.default_rng(5)
    d = rng.normal(size=(3, 40))
    a = sign_flip_test(d[0], 999, seed=7)
    b = sign_flip_test(d[0], 999, seed=7)
    assert a == b
    stat, p, n_used, exact = sign_flip_pvalues(d, 999, seed=7)
    assert p[0] == a.p_value and n_used == 999 and not exact
    assert np.allclose(stat, d.mean(axis=1))
    # randomised p-values are never 0 and have resolution 1/(B+1)
    big = sign_flip_test(np.full(40, 1.0), 999, seed=1)
    assert big.p_value == pytest.approx(1 / 1000)


def test_sign_flip_level():
    """Rejection rate at 0.05 for symmetric null data is ~0.05."""
    rng = np.random.default_rng(6)
    d = rng.standard_t(4, size=(2000, 30))
    _, p, _, _ = sign_flip_pvalues(d, 999, seed=2)
    assert 0.035 < (p <= 0.05).mean() < 0.065


def test_sign_flip_rejects_nonfinite():
    with pytest.raises(ValueError):
        sign_flip_test([1.0, np.nan, 2.0])
