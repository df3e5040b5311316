"""Meta-analysis of issue #15: REML (metafor's published BCG numbers), HKSJ (statsmodels),
cluster summaries (closed form) and robust variance estimation (statsmodels sandwiches)."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.meta_analysis import combine_effects

from anistat.stats.meta import aggregate_clusters, random_effects_meta, reml_tau2, robust_meta

# BCG vaccine trials (Colditz et al. 1994; metafor's dat.bcg): tpos, tneg, cpos, cneg
BCG = np.array(
    [
        [4, 119, 11, 128],
        [6, 300, 29, 274],
        [3, 228, 11, 209],
        [62, 13536, 248, 12619],
        [33, 5036, 47, 5761],
        [180, 1361, 372, 1079],
        [8, 2537, 10, 619],
        [505, 87886, 499, 87892],
        [29, 7470, 45, 7232],
        [17, 1699, 65, 1600],
        [186, 50448, 141, 27197],
        [5, 2493, 3, 2338],
        [27, 16886, 29, 17825],
    ],
    dtype=float,
)


def _bcg_log_risk_ratios():
    tpos, tneg, cpos, cneg = BCG.T
    y = np.log((tpos / (tpos + tneg)) / (cpos / (cpos + cneg)))
    v = 1 / tpos - 1 / (tpos + tneg) + 1 / cpos - 1 / (cpos + cneg)
    return y, v


def test_reml_matches_metafor_on_bcg():
    """metafor: rma(yi, vi, data=escalc('RR', ...dat.bcg)) → tau² 0.3132, estimate −0.7145, se 0.1798."""
    y, v = _bcg_log_risk_ratios()
    result = random_effects_meta(y, v, method="reml")
    assert result.tau2 == pytest.approx(0.3132, abs=5e-4)
    assert result.estimate == pytest.approx(-0.7145, abs=5e-4)
    assert result.se == pytest.approx(0.1798, abs=5e-4)
    # the REML estimating equation holds at the interior optimum (Viechtbauer 2005)
    w = 1 / (v + result.tau2)
    mu = (w * y).sum() / w.sum()
    assert result.tau2 == pytest.approx((w**2 * ((y - mu) ** 2 - v)).sum() / (w**2).sum() + 1 / w.sum(), rel=1e-6)
    # DL on the same data (metafor: tau² 0.3088, estimate −0.7141)
    dl = random_effects_meta(y, v, method="dl")
    assert dl.tau2 == pytest.approx(0.3088, abs=5e-4) and dl.estimate == pytest.approx(-0.7141, abs=5e-4)


def test_hksj_matches_metafors_published_bcg_output():
    """metafor's README: rma(yi, vi, data=escalc("RR", …dat.bcg), test="knha") → estimate −0.7145,
    se 0.1808, tval −3.9522, df 12, p 0.0019, 95 % CI (−1.1084, −0.3206). There s > 1, so the
    safeguarded interval (the default) and the untruncated one agree."""
    y, v = _bcg_log_risk_ratios()
    for safeguard in (True, False):
        result = random_effects_meta(y, v, method="reml", interval="hksj", hksj_safeguard=safeguard)
        assert result.estimate == pytest.approx(-0.7145, abs=5e-5)
        assert result.se == pytest.approx(0.1808, abs=5e-5)
        assert result.estimate / result.se == pytest.approx(-3.9522, abs=5e-4)
        assert result.df == 12 and result.p_value == pytest.approx(0.0019, abs=5e-5)
        assert (result.ci_low, result.ci_high) == pytest.approx((-1.1084, -0.3206), abs=5e-5)
        assert result.hksj_scale > 1 and not result.safeguard_applied


def test_hksj_safeguard_never_narrows_the_interval_below_wald():
    """Issue #20: with tau² = 0 and Q < k − 1 (k = 3) untruncated HKSJ gave (0.084, 0.133) against
    Wald's (−0.068, 0.285). The Knapp–Hartung safeguard (scale factor max(1, s); metafor's
    test="adhoc") uses the Wald SE there, with the t_{k−1} quantile."""
    y, v = np.array([0.100, 0.110, 0.115]), np.full(3, 0.0243)
    wald = random_effects_meta(y, v, method="reml", interval="wald")
    raw = random_effects_meta(y, v, method="reml", interval="hksj", hksj_safeguard=False)
    safe = random_effects_meta(y, v, method="reml", interval="hksj")
    assert wald.tau2 == 0 and raw.hksj_scale < 1
    assert raw.ci_high - raw.ci_low < 0.2 * (wald.ci_high - wald.ci_low)  # the untruncated interval
    assert safe.safeguard_applied and safe.se == pytest.approx(wald.se, rel=1e-12)
    half = sps.t.ppf(0.975, 2) * wald.se
    assert (safe.ci_low, safe.ci_high) == pytest.approx((safe.estimate - half, safe.estimate + half), rel=1e-12)
    assert safe.ci_low < wald.ci_low and safe.ci_high > wald.ci_high
    assert safe.p_value == pytest.approx(2 * sps.t.sf(abs(safe.estimate) / wald.se, 2), rel=1e-12)


def test_reml_is_zero_without_heterogeneity():
    assert reml_tau2(np.full(6, 0.3), np.full(6, 0.01)) == 0.0


@pytest.mark.filterwarnings("ignore:`use_t=True` requires")  # statsmodels' per-study intervals, unused here
@pytest.mark.parametrize("method, method_re", [("dl", "chi2"), ("pm", "iterated")])
def test_hksj_interval_matches_statsmodels(method, method_re):
    y, v = _bcg_log_risk_ratios()
    ours = random_effects_meta(y, v, method=method, interval="hksj", ci_level=0.9)
    theirs = combine_effects(y, v, method_re=method_re, use_t=True)
    frame = theirs.summary_frame(alpha=0.1, use_t=True)
    row = frame.loc["random effect wls"]
    assert ours.estimate == pytest.approx(row["eff"], rel=1e-6)
    assert ours.se == pytest.approx(row["sd_eff"], rel=1e-5)
    assert (ours.ci_low, ours.ci_high) == pytest.approx((row["ci_low"], row["ci_upp"]), rel=1e-5)
    assert ours.df == len(y) - 1 and ours.interval == "hksj"


def test_cluster_summaries_closed_form():
    y = np.array([1.0, 2.0, 3.0, 10.0])
    v = np.array([0.04, 0.09, 0.16, 0.25])
    means, variances, sizes, labels = aggregate_clusters(y, v, ["a", "a", "a", "b"])
    assert labels == ["a", "b"] and sizes.tolist() == [3, 1]
    np.testing.assert_allclose(means, [2.0, 10.0])
    # rho = 1: the variance of the mean is the squared mean SE; rho = 0: Σv / k²
    np.testing.assert_allclose(variances, [((0.2 + 0.3 + 0.4) / 3) ** 2, 0.25])
    _, independent, _, _ = aggregate_clusters(y, v, ["a", "a", "a", "b"], correlation=0.0)
    np.testing.assert_allclose(independent, [(0.04 + 0.09 + 0.16) / 9, 0.25])


def _clustered_rows(seed=0, m=7):
    generator = np.random.default_rng(seed)
    sizes = generator.integers(1, 6, size=m)
    labels = np.repeat(np.arange(m), sizes)
    v = generator.uniform(0.02, 0.1, size=labels.size)
    y = 0.5 + generator.normal(0, 0.3, size=m)[labels] + generator.normal(0, np.sqrt(v))
    return y, v, labels


def test_robust_cr0_matches_the_statsmodels_cluster_sandwich():
    y, v, labels = _clustered_rows()
    ours = robust_meta(y, v, labels, small_sample="CR0", tau2=0.05)
    k = np.bincount(labels)
    mean_v = np.bincount(labels, weights=v) / k
    weights = 1 / (k[labels] * (mean_v[labels] + 0.05))
    fit = sm.WLS(y, np.ones((y.size, 1)), weights=weights).fit(
        cov_type="cluster", cov_kwds={"groups": labels, "use_correction": False}
    )
    assert ours.estimate == pytest.approx(fit.params[0], rel=1e-10)
    assert ours.se == pytest.approx(fit.bse[0], rel=1e-10)
    assert ours.m == 7 and ours.df == 6


def test_robust_cr2_with_singleton_clusters_is_hc2():
    """With one row per cluster, CR2 is HC2 (leverage-corrected): statsmodels' WLS HC2."""
    generator = np.random.default_rng(1)
    v = generator.uniform(0.02, 0.1, size=9)
    y = 0.3 + generator.normal(0, np.sqrt(v + 0.04))
    ours = robust_meta(y, v, np.arange(9), small_sample="CR2", tau2=0.04)
    fit = sm.WLS(y, np.ones((9, 1)), weights=1 / (v + 0.04)).fit(cov_type="HC2")
    assert ours.se == pytest.approx(fit.bse[0], rel=1e-10)
    crit = sps.t.ppf(0.975, 8)
    assert ours.ci_high == pytest.approx(ours.estimate + crit * ours.se, rel=1e-12)


def test_pooling_dependent_rows_as_independent_is_too_narrow():
    """24 near-copies of one estimate per model: the naive meta-analysis shrinks the SE about
    √24-fold; cluster summaries and robust variance do not."""
    generator = np.random.default_rng(2)
    model_effects = 1.0 + generator.normal(0, 0.2, size=4)
    labels = np.repeat(np.arange(4), 24)
    y = model_effects[labels] + generator.normal(0, 0.01, size=labels.size)
    v = np.full(labels.size, 0.2**2)
    naive = random_effects_meta(y, v, method="reml")
    means, variances, _, _ = aggregate_clusters(y, v, labels)
    summary = random_effects_meta(means, variances, method="reml", interval="hksj")
    robust = robust_meta(y, v, labels)
    assert summary.se > 3 * naive.se and robust.se > 3 * naive.se
    assert summary.k == 4 and robust.m == 4


def test_robust_needs_two_clusters():
    with pytest.raises(ValueError, match="2 clusters"):
        robust_meta([1.0, 2.0], [0.1, 0.1], ["a", "a"])


# ----------------------------------------------------------------------------------------------
# claims with aggregate: meta
# ----------------------------------------------------------------------------------------------
def _claim_rows(ci_level=0.95, with_se=False):
    """Two models × 12 rows each (layers × ranks × checkpoints), every row with SE 0.1."""
    import pandas as pd

    z = sps.norm.ppf(0.5 + ci_level / 2)
    rows = []
    for model, effect in (("a", 2.0), ("b", 2.6)):
        for i in range(12):
            estimate = effect + 0.01 * (i % 3)
            row = {
                "model": model,
                "metric": "log2_energy_ratio",
                "control": "normal",
                "estimate": estimate,
                "ci_low": estimate - z * 0.1,
                "ci_high": estimate + z * 0.1,
                "p_adjusted": 0.01,
                "status": "ok",
                "layer": i % 4,
            }
            if with_se:
                row["se"] = 0.1
            rows.append(row)
    return pd.DataFrame(rows)


def _meta_claim(**meta):
    from anistat.protocol import ClaimSpec

    return ClaimSpec(id="c", metric="log2_energy_ratio", threshold=1.0, aggregate="meta", meta=meta)


def test_meta_claim_recovers_se_at_the_runs_ci_level():
    from anistat.claims import evaluate_claim

    at_80 = evaluate_claim(_claim_rows(0.8), _meta_claim(dependence="independent"), ci_level=0.8)["evidence"]
    with_se = evaluate_claim(_claim_rows(0.95, with_se=True), _meta_claim(dependence="independent"))["evidence"]
    assert at_80["se_source"] == "CI width at level 0.8" and with_se["se_source"] == "se column"
    # both see SE 0.1 per row, so they pool identically
    assert at_80["meta_se"] == pytest.approx(with_se["meta_se"], rel=1e-4)


def test_meta_claim_pools_one_summary_per_model_by_default():
    from anistat.claims import evaluate_claim

    rows = _claim_rows()
    default = evaluate_claim(rows, _meta_claim())
    naive = evaluate_claim(rows, _meta_claim(dependence="independent"))["evidence"]
    evidence = default["evidence"]
    assert evidence["k"] == 2 and evidence["n_rows"] == 24 and evidence["cluster_by"] == "model"
    assert evidence["method"] == "reml" and evidence["interval"] == "hksj (Knapp–Hartung safeguard)"
    assert "hksj_scale" in evidence and evidence["hksj_safeguard"].startswith("scale factor max(1, s)")
    assert "2 cluster summaries (model" in evidence["pooled"]
    # two models' summaries: the HKSJ interval uses t with 1 df, far wider than the naive pool
    assert evidence["meta_ci_high"] - evidence["meta_ci_low"] > 10 * (naive["meta_ci_high"] - naive["meta_ci_low"])
    y = np.array([2.01, 2.61])
    assert evidence["meta_estimate"] == pytest.approx(y.mean(), rel=1e-4)


def test_meta_claim_robust_and_its_limits():
    from anistat.claims import evaluate_claim

    rows = _claim_rows()
    robust = evaluate_claim(rows, _meta_claim(dependence="robust"))["evidence"]
    assert robust["k"] == 2 and robust["df"] == 1 and "CR2" in robust["method"]
    one_model = evaluate_claim(rows[rows.model == "a"], _meta_claim(dependence="robust"))
    assert one_model["status"] == "error" and "at least 2 clusters" in one_model["evidence"]["reason"]
    # a single cluster under aggregate: its own summary and interval
    single = evaluate_claim(rows[rows.model == "a"], _meta_claim())["evidence"]
    assert single["k"] == 1 and single["meta_se"] == pytest.approx(0.1, rel=1e-3)
    assert single["interval"].startswith("wald") and "a single independent unit" in single["pooled"]
