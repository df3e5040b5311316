"""Monte-Carlo decisions with a bounded resampling risk (issue #30): Clopper–Pearson intervals as
statsmodels computes them, decisions that agree with the ideal (infinite-draw) p-value's, the
family form under Holm / BH, and the same result however the stream is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from anistat.stats.resampling_risk import (NOT_REJECTED, REJECTED, UNDECIDED, RiskBoundedMonteCarlo,
                                           clopper_pearson, family_rejections, look_schedule,
                                           risk_bounded_decisions)


@pytest.mark.parametrize("x,n,error", [(0, 16, 0.01), (3, 16, 0.001), (16, 16, 0.05), (250, 4096, 1e-5)])
def test_clopper_pearson_is_statsmodels_beta_interval(x, n, error):
    low, high = clopper_pearson(x, n, error)
    theirs = proportion_confint(x, n, alpha=error, method="beta")
    assert float(low) == pytest.approx(theirs[0], abs=1e-12)
    assert float(high) == pytest.approx(theirs[1], abs=1e-12)


def test_look_schedule_doubles_up_to_the_cap():
    assert look_schedule(100, 16).tolist() == [16, 32, 64, 100]
    assert look_schedule(64, 16).tolist() == [16, 32, 64]
    assert look_schedule(10, 16).tolist() == [10]


def shared_stream(seed: int, n: int) -> np.ndarray:
    """One stream of standard normal null values, read by every test (as the Haar stream of a width)."""
    return np.random.default_rng(seed).standard_normal(n)


def test_decisions_match_the_ideal_p_value_on_a_shared_stream():
    """Observed values whose ideal p-values Φ̄(t) are far from and near α: every decided test
    agrees with the ideal decision; a p-value at α itself is never decided (undecided at the cap)."""
    ideal = np.array([0.001, 0.01, 0.03, 0.08, 0.2, 0.5, 0.9, 0.05])
    observed = sps.norm.isf(ideal)
    draws = shared_stream(1, 2**15)
    engine = risk_bounded_decisions(observed, np.broadcast_to(draws, (ideal.size, draws.size)), 0.05, 0.001)
    status = engine.decisions()
    assert status.tolist()[:7] == [REJECTED] * 3 + [NOT_REJECTED] * 4
    assert status[7] == UNDECIDED and engine.draws_used[7] == 2**15
    assert (engine.p_low <= ideal).all() and (ideal <= engine.p_high).all()
    # far tests stop early; the interval reports where the ideal p lies
    assert engine.draws_used[5] <= 64 and engine.draws_used[0] < 2**15


def test_chunking_does_not_change_the_result():
    ideal = np.array([0.02, 0.04, 0.07, 0.3])
    observed = sps.norm.isf(ideal)
    draws = np.broadcast_to(shared_stream(2, 5000), (4, 5000))
    whole = risk_bounded_decisions(observed, draws, 0.05, 0.01)
    engine = RiskBoundedMonteCarlo(observed, 0.05, 0.01, 5000)
    start = 0
    for size in [7, 100, 333, 1] * 2000:
        if not engine.remaining:
            break
        engine.update(draws[:, start:start + size])
        start += size
    assert engine.decisions().tolist() == whole.decisions().tolist()
    assert engine.draws_used.tolist() == whole.draws_used.tolist()
    np.testing.assert_array_equal(engine.p_high, whole.p_high)


def test_wrong_decisions_stay_below_epsilon_where_a_fixed_draw_count_does_not():
    """A test with ideal p = 0.06 against α = 0.05, over 400 seeds: the risk-bounded decision is
    wrong in at most ε = 0.05 of them (with its binomial margin), while 200 fixed draws
    (p = (1 + X)/(201)) decide it wrongly in about a third."""
    p, alpha, epsilon, seeds = 0.06, 0.05, 0.05, 400
    rng = np.random.default_rng(3)
    wrong, wrong_fixed = 0, 0
    for _ in range(seeds):
        engine = RiskBoundedMonteCarlo([0.0], alpha, epsilon, 2**16)
        while engine.remaining:
            width = int(engine.looks[engine._next_look] - engine.draws_used[0])
            engine.add_counts(rng.binomial(width, [p]), width)
        wrong += engine.decisions()[0] == REJECTED
        wrong_fixed += (1 + rng.binomial(200, p)) / 201 < alpha
    assert wrong <= sps.binom.ppf(0.999, seeds, epsilon)
    assert wrong_fixed > 0.2 * seeds


@pytest.mark.parametrize("method", ["holm", "fdr_bh", "bonferroni"])
def test_family_decisions_match_the_ideal_family_decision(method):
    """Ten tests on one shared stream under a multiplicity procedure: every decided test agrees
    with the procedure applied to the ideal p-values, and the tests far from every step decide."""
    ideal = np.array([1e-4, 2e-4, 0.002, 0.02, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95])
    observed = sps.norm.isf(ideal)
    draws = np.broadcast_to(shared_stream(4, 2**17), (ideal.size, 2**17))
    engine = risk_bounded_decisions(observed, draws, 0.05, 0.01, method=method)
    status = engine.decisions()
    truth = family_rejections(ideal, 0.05, method)
    decided = status != UNDECIDED
    assert ((status[decided] == REJECTED) == truth[decided]).all()
    assert decided[[0, 1, 4, 5, 6, 7, 8, 9]].all()
    assert engine.epsilon_test == pytest.approx(0.001)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="one-sided"):
        RiskBoundedMonteCarlo([1.0], 0.05, 0.01, 100, alternative="two-sided")
    with pytest.raises(ValueError, match="resampling risk"):
        RiskBoundedMonteCarlo([1.0], 0.05, 0.0, 100)
    with pytest.raises(ValueError, match="method"):
        RiskBoundedMonteCarlo([1.0], 0.05, 0.01, 100, method="hommel")
    nan = RiskBoundedMonteCarlo([np.nan, 0.0], 0.05, 0.01, 100)
    assert nan.remaining == 100 and not nan.active[0]
