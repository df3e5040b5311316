"""One SE per row, consistent with its interval (issue #30): every row's `se` is its interval's
implied SE on the row's own scale, skewed rows included, and a meta claim's weights follow from it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.meta_analysis import combine_effects

from anistat.claims import pool_rows
from anistat.protocol import ClaimSpec
from anistat.stats import analyze_energy, expected_control_energy
from anistat.stats.interval_se import interval_implied_se, interval_log_scale

Z95 = float(sps.norm.ppf(0.975))


def test_interval_implied_se_closed_forms():
    assert interval_implied_se(2.0, 1.0, 4.0, 0.95, log_scale=True) == pytest.approx(2.0 * math.log(4.0) / (2 * Z95))
    assert interval_implied_se(0.0, -1.0, 3.0, 0.9, log_scale=False) == pytest.approx(4.0 / (2 * sps.norm.ppf(0.95)))
    # a Wald interval on the log scale gives back the delta-method SE exactly
    theta, s = 3.0, 0.2
    assert interval_implied_se(
        theta, theta * math.exp(-Z95 * s), theta * math.exp(Z95 * s), 0.95, log_scale=True
    ) == pytest.approx(theta * s, rel=1e-12)
    # no interval: NaN; an unbounded one (an infinite end, a lower end at 0 on the log scale, or
    # the method's unbounded code behind a clipped end): inf — never the replicates' SD
    assert math.isnan(interval_implied_se(1.0, float("nan"), 2.0, 0.95, log_scale=False))
    assert interval_implied_se(1.0, 0.0, 2.0, 0.95, log_scale=True) == math.inf
    assert interval_implied_se(9.8, 0.0, math.inf, 0.95, log_scale=True) == math.inf
    assert interval_implied_se(0.5, -math.inf, 2.0, 0.95, log_scale=False) == math.inf
    assert interval_implied_se(0.4, 0.1, 1.0, 0.95, log_scale=True, unbounded=True) == math.inf
    assert math.isnan(interval_implied_se(1.0, 2.0, 1.0, 0.95, log_scale=False))


def skewed_energies(seed: int, n_documents: int = 30, dim: int = 64, rank: int = 8):
    """Per-sequence energies of a few documents with lognormal (σ = 1.5) scales and a proxy that
    captures a skewed share: the rows where the replicates' SD and the bootstrap-t disagree."""
    rng = np.random.default_rng(seed)
    docs = np.repeat(np.arange(n_documents), 3)
    scale = rng.lognormal(0.0, 1.5, n_documents)[docs]
    total = scale * rng.gamma(4.0, 1.0, docs.size)
    share = np.clip(rank / dim * rng.lognormal(0.5, 1.0, docs.size), 0, 1)
    proxy = share * total
    return proxy, total, docs, rank, dim


@pytest.mark.parametrize("seed", range(6))
def test_every_energy_row_carries_its_intervals_implied_se(seed):
    proxy, total, docs, rank, dim = skewed_energies(seed)
    reference = expected_control_energy("haar", proxy, total, rank, dim)
    analysis = analyze_energy(
        proxy,
        total,
        reference,
        rank=rank,
        dim=dim,
        null_fractions=rank / dim + 0.01 * np.random.default_rng(seed).standard_normal(99),
        group_ids=docs,
        oracle_fraction=0.9,
        n_bootstrap=800,
        seed=seed,
        ci_method="studentized",
    )
    ratio, fraction, log2 = analysis["energy_ratio"], analysis["energy_fraction"], analysis["log2_energy_ratio"]
    assert ratio.ci_method == "studentized"
    # ratio and fraction: the log-scale interval's width, mapped by d θ = θ d ln θ
    for row in (ratio, fraction):
        log_width = (math.log(row.ci_high) - math.log(row.ci_low)) / (2 * Z95)
        assert row.se == pytest.approx(row.estimate * log_width, rel=1e-12)
    # log2 of the ratio: its own interval's (linear) width
    assert log2.se == pytest.approx((log2.ci_high - log2.ci_low) / (2 * Z95), rel=1e-9)
    # z and capture: affine maps of the fraction, so the fraction's SE times the map's slope
    z = analysis["z"]
    assert z.se == pytest.approx(fraction.se * (z.ci_high - z.ci_low) / (fraction.ci_high - fraction.ci_low), rel=1e-9)
    g = analysis["hedges_g"]
    assert g.se == pytest.approx((g.ci_high - g.ci_low) / (2 * Z95), rel=1e-12)


def test_skewed_rows_are_where_the_replicates_sd_disagrees():
    """The property the definition fixes must be reachable: on these skewed laws the replicates'
    SD is off the interval's implied SE by more than 1.5× for some seed (so the test above would
    fail with the replicates' SD as `se`)."""
    from anistat.stats import bootstrap_weights, ci_from_replicates, ratio_se

    worst = 1.0
    for seed in range(6):
        proxy, total, docs, rank, dim = skewed_energies(seed)
        num = np.bincount(docs, proxy)
        den = np.bincount(docs, total) * rank / dim
        weights = bootstrap_weights(num.size, 800, seed=seed)
        result = ci_from_replicates(
            num.sum() / den.sum(),
            (weights @ num) / (weights @ den),
            None,
            0.95,
            "studentized",
            se=float(ratio_se(np.ones((1, num.size)), num, den)[0]),
            replicate_se=ratio_se(weights, num, den),
            log_scale=True,
            expand_units=num.size,
        )
        implied = interval_implied_se(result.estimate, result.ci_low, result.ci_high, 0.95, log_scale=True)
        worst = max(worst, implied / result.se, result.se / implied)
    assert worst > 1.5


def ratio_rows(estimates, intervals) -> pd.DataFrame:
    out = []
    for i, (estimate, (low, high)) in enumerate(zip(estimates, intervals)):
        out.append(
            {
                "model": f"m{i}",
                "checkpoint": "step0",
                "metric": "energy_ratio",
                "estimate": estimate,
                "ci_low": low,
                "ci_high": high,
                "se": interval_implied_se(estimate, low, high, 0.95, log_scale=True),
                "p_adjusted": 0.01,
                "status": "ok",
            }
        )
    return pd.DataFrame(out)


@pytest.mark.parametrize("method,method_re", [("dl", "chi2"), ("pm", "iterated")])
def test_meta_claim_weights_follow_from_the_interval_implied_se(method, method_re):
    """Known skewed ratio rows (asymmetric intervals, one tight and one wide): the claim pools
    ln R with SE (ln hi − ln lo)/(2z) — statsmodels' combine_effects on those numbers gives the
    same estimate and SE — while the rows' `se` column is on the ratio scale."""
    estimates = [9.83, 2.0, 1.4, 3.1, 5.5]
    intervals = [(8.63, 15.25), (1.7, 2.5), (1.1, 1.6), (2.2, 5.0), (3.0, 7.0)]
    data = ratio_rows(estimates, intervals)
    claim = ClaimSpec(
        id="c",
        metric="energy_ratio",
        compare=">",
        threshold=1.0,
        alpha=0.05,
        aggregate="meta",
        meta={"method": method, "interval": "wald", "dependence": "independent"},
    )
    pooled = pool_rows(data, claim, 0.95)
    y = np.log(estimates)
    v = np.array([((math.log(hi) - math.log(lo)) / (2 * Z95)) ** 2 for lo, hi in intervals])
    theirs = combine_effects(y, v, method_re=method_re, use_t=False)
    assert pooled["se_source"].startswith("se column")
    assert math.log(pooled["meta_estimate"]) == pytest.approx(theirs.mean_effect_re, rel=1e-6)
    assert theirs.tau2 > 0  # statsmodels does not truncate at 0; these rows are heterogeneous
    assert pooled["meta_se"] == pytest.approx(theirs.sd_eff_w_re, rel=1e-6)
    assert pooled["tau2"] == pytest.approx(theirs.tau2, rel=1e-6)
    # the rows' relative weights are statsmodels' 1/(v + tau²), v from the intervals: the first
    # row (0.145 on the log scale, where the replicates' SD said 0.031) is not the heaviest
    w = 1.0 / (v + pooled["tau2"])
    assert w / w.sum() == pytest.approx(theirs.weights_rel_re, rel=1e-6)
    assert w[0] < w.max()


@pytest.mark.slow
def test_real_run_rows_se_within_2x_of_their_interval(tmp_path):
    """A real miniature run: no row's `se` is off its interval's implied SE by more than 2× on
    both sides (z·se against each half-width on the interval's scale)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from conftest import MINI_PROTOCOL

    import anistat
    import anistat.report.render

    protocol = tmp_path / "mini.yaml"
    protocol.write_text(MINI_PROTOCOL)
    with pytest.MonkeyPatch.context() as patch:  # figures are not what this is about
        patch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))
        results = anistat.run(protocol, tmp_path / "bundle").results
    rows = results[
        np.isfinite(results["se"].astype(float))
        & np.isfinite(results["ci_low"].astype(float))
        & (results["metric"] != "anisotropy_capture")
    ]  # capture's interval is clipped
    assert len(rows) > 0
    log = rows["metric"].isin(["energy_ratio", "energy_fraction"]) & rows["ci_method"].map(interval_log_scale)
    est, low, high = (rows[c].astype(float).to_numpy() for c in ("estimate", "ci_low", "ci_high"))
    se = rows["se"].astype(float).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        below = np.where(log, np.log(est) - np.log(low), est - low) / Z95
        above = np.where(log, np.log(high) - np.log(est), high - est) / Z95
        scale_se = np.where(log, se / est, se)
    off = (scale_se > 2 * np.maximum(below, above)) | (scale_se < 0.5 * np.minimum(below, above))
    assert not off.any(), rows[off][["metric", "estimate", "ci_low", "ci_high", "se"]]
