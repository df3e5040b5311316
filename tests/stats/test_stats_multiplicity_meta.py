"""Multiplicity, resolution guard, random-effects meta-analysis, trend tests."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from statsmodels.stats.multitest import multipletests

from anistat.stats import (
    adjust_in_families,
    adjust_pvalues,
    min_controls_needed,
    random_effects_meta,
    resolution_warning,
    trend_test,
)


@pytest.mark.parametrize("method", ["holm", "fdr_bh", "bonferroni"])
def test_adjust_pvalues_matches_statsmodels_and_ignores_nan(method):
    p = np.array([0.01, np.nan, 0.04, 0.03, np.nan, 0.2, 0.001])
    out = adjust_pvalues(p, method)
    ok = ~np.isnan(p)
    assert np.all(np.isnan(out[~ok]))
    assert np.allclose(out[ok], multipletests(p[ok], method=method)[1])
    assert np.all(np.isnan(adjust_pvalues([np.nan, np.nan])))


@pytest.mark.slow
def test_holm_written_out_equals_statsmodels_on_ties_and_many_tests():
    rng = np.random.default_rng(0)
    for m in (1, 2, 7, 500):
        p = np.round(rng.uniform(0, 0.2, m), 3)  # ties included
        np.testing.assert_allclose(adjust_pvalues(p, "holm"), multipletests(p, method="holm")[1], rtol=0, atol=1e-15)


def test_adjust_in_families():
    df = pd.DataFrame({"model": ["a", "a", "a", "b", "b"], "p_value": [0.01, 0.02, np.nan, 0.03, 0.04]})
    run = adjust_in_families(df, [], "holm")
    assert np.allclose(
        run["p_adjusted"].to_numpy()[[0, 1, 3, 4]], multipletests([0.01, 0.02, 0.03, 0.04], method="holm")[1]
    )
    per = adjust_in_families(df, ["model"], "bonferroni")
    assert per["p_adjusted"].tolist()[:2] == pytest.approx([0.02, 0.04])
    assert np.isnan(per["p_adjusted"].iloc[2])
    assert per["p_adjusted"].tolist()[3:] == pytest.approx([0.06, 0.08])
    assert "p_adjusted" not in df


def test_resolution_guard():
    assert min_controls_needed(0.05, 12, "holm") == 239
    assert min_controls_needed(0.05, 12, "fdr_bh") == 239
    assert min_controls_needed(0.05, 1, "holm") == 19
    msg = resolution_warning(20, 0.05, 12, "holm")
    assert msg.startswith("20 controls give a p-value floor of 1/21 ≈ 0.0476")
    assert "Holm-corrected family of 12 tests" in msg and "use ≥ 239" in msg
    assert resolution_warning(239, 0.05, 12, "holm") is None
    assert resolution_warning(19, 0.05, 1, "holm") is None


def _dl_by_hand(y, v):
    w = 1 / v
    mu_fe = (w * y).sum() / w.sum()
    q = (w * (y - mu_fe) ** 2).sum()
    k = y.size
    tau2 = max(0.0, (q - (k - 1)) / (w.sum() - (w**2).sum() / w.sum()))
    ws = 1 / (v + tau2)
    mu = (ws * y).sum() / ws.sum()
    se = 1 / np.sqrt(ws.sum())
    i2 = max(0.0, (q - (k - 1)) / q)
    return mu, se, tau2, q, i2


def test_random_effects_meta_matches_hand_dersimonian_laird():
    rng = np.random.default_rng(0)
    v = rng.uniform(0.01, 0.05, 8)
    y = 1.0 + rng.normal(0, 0.3, 8) + rng.normal(0, np.sqrt(v))
    r = random_effects_meta(y, v)
    mu, se, tau2, q, i2 = _dl_by_hand(y, v)
    assert r.estimate == pytest.approx(mu) and r.se == pytest.approx(se)
    assert r.tau2 == pytest.approx(tau2) and r.q == pytest.approx(q)
    assert r.i2 == pytest.approx(i2) and r.k == 8
    assert r.ci_low == pytest.approx(mu - 1.959964 * se, rel=1e-5)
    assert 0 <= r.p_value < 1e-3
    pm = random_effects_meta(y, v, method="pm")
    assert pm.method == "pm" and pm.tau2 > 0
    homo = random_effects_meta(np.full(5, 0.2), np.full(5, 0.01))
    assert homo.tau2 == 0 and homo.estimate == pytest.approx(0.2)


def test_trend_test_matches_wls_and_early_late():
    steps = np.array([0, 100, 200, 400, 800, 1600], dtype=float)
    y = np.array([3.0, 2.8, 2.5, 2.2, 1.9, 1.4])
    v = np.array([0.02, 0.02, 0.03, 0.03, 0.04, 0.05])
    r = trend_test(steps, y, v)
    ref = sm.WLS(y, sm.add_constant(steps), weights=1 / v).fit(cov_type="fixed scale")
    assert r.slope == pytest.approx(ref.params[1]) and r.slope_se == pytest.approx(ref.bse[1])
    assert r.slope < 0 and r.p_value < 0.01 and r.ci_high < 0
    assert r.difference < 0 and r.difference_p_value < 0.01
    ols = trend_test(steps, y)
    assert not ols.weighted and ols.slope == pytest.approx(np.polyfit(steps, y, 1)[0])
    with pytest.raises(ValueError):
        trend_test([1, 2], [1, 2])
