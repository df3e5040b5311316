"""The high-level entry point analyze_energy and analyze_metric_vs_controls."""

import numpy as np
import pytest
from scipy import stats

from anistat.stats import (METRICS, analyze_energy, analyze_metric_vs_controls,
                           hedges_correction, hedges_g_paired, monte_carlo_pvalue,
                           sign_flip_test)


def _data(seed=0, s=80, n=60, boost=1.3):
    rng = np.random.default_rng(seed)
    t = rng.gamma(4, 1, s) * 10
    c = t[:, None] * rng.beta(2, 30, (s, n))
    p = t * np.clip(boost * rng.beta(2, 30, s), 0, 1)
    return p, c, t


def test_estimates_match_hand_formulas():
    p, c, t = _data()
    a = analyze_energy(p, c, t, rank=4, dim=64, oracle_fraction=0.4, n_bootstrap=500,
                       n_permutations=999, seed=1)
    assert [m.metric for m in a.metrics] == list(METRICS)
    e_u = p.sum() / t.sum()
    e_q = c.sum(axis=0) / t.sum()
    ef = a["energy_fraction"]
    assert ef.estimate == pytest.approx(e_u)
    assert ef.control_mean == pytest.approx(e_q.mean())
    assert ef.control_sd == pytest.approx(e_q.std(ddof=1))
    assert a["energy_ratio"].estimate == pytest.approx(e_u / e_q.mean())
    assert a["energy_ratio"].control_mean == pytest.approx(1.0)
    assert a["log2_energy_ratio"].estimate == pytest.approx(np.log2(e_u / e_q.mean()))
    z = (e_u - e_q.mean()) / e_q.std(ddof=1)
    assert a["z"].estimate == pytest.approx(z)
    assert a["z"].control_mean == pytest.approx(0, abs=1e-12)
    assert a["z"].control_sd == pytest.approx(1.0)
    assert a["anisotropy_capture"].estimate == pytest.approx((e_u - 4 / 64) / (0.4 - 4 / 64))
    # p-values: Monte-Carlo for the control-draw metrics, sign flip for hedges_g
    mc = monte_carlo_pvalue(e_u, e_q)
    assert a.mc_p_value == mc
    for name in ("energy_fraction", "energy_ratio", "log2_energy_ratio", "z",
                 "anisotropy_capture"):
        assert a[name].p_value == mc and a[name].p_value_kind == "monte_carlo"
        assert a[name].effect_size == pytest.approx(z)
    d = (p - c.mean(axis=1)) / t
    sf = sign_flip_test(d, 999, seed=1)
    assert a.sign_flip == sf
    g = a["hedges_g"]
    assert g.p_value == sf.p_value and g.p_value_kind == "sign_flip"
    assert g.estimate == pytest.approx(hedges_g_paired(d))
    assert g.estimate == pytest.approx(hedges_correction(79) * d.mean() / d.std(ddof=1))


def test_cis_bracket_estimates_and_transform():
    p, c, t = _data(1)
    a = analyze_energy(p, c, t, rank=4, dim=64, oracle_fraction=0.4, n_bootstrap=1000)
    for m in a.metrics:
        assert m.ci_low <= m.estimate <= m.ci_high, m
        assert m.ci_method in ("bca", "percentile")
    r, l2 = a["energy_ratio"], a["log2_energy_ratio"]
    assert l2.ci_low == pytest.approx(np.log2(r.ci_low))
    assert l2.ci_high == pytest.approx(np.log2(r.ci_high))
    f, ac = a["energy_fraction"], a["anisotropy_capture"]
    assert ac.ci_low == pytest.approx((f.ci_low - 4 / 64) / (0.4 - 4 / 64))


def test_ratio_ci_matches_scipy_joint_resampling():
    """The ratio CI resamples sequences jointly for the proxy and all controls."""
    p, c, t = _data(2, s=60, n=30)
    a = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=20000, ci_method="percentile")
    cbar = c.mean(axis=1)
    ref = stats.bootstrap((p, cbar), lambda x, y, axis: x.sum(axis) / y.sum(axis),
                          paired=True, vectorized=True, n_resamples=20000,
                          method="percentile", rng=0)
    se = ref.standard_error
    r = a["energy_ratio"]
    assert abs(r.ci_low - ref.confidence_interval.low) < 0.15 * se
    assert abs(r.ci_high - ref.confidence_interval.high) < 0.15 * se


def test_deterministic_and_seed_dependent():
    p, c, t = _data(3)
    a = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=300, n_permutations=99, seed=5)
    b = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=300, n_permutations=99, seed=5)
    assert a.metrics == b.metrics
    c2 = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=300, n_permutations=99, seed=6)
    assert c2["energy_fraction"].ci_low != a["energy_fraction"].ci_low


def test_resampled_sd_float32_matches_float64():
    p, c, t = _data(4, s=200, n=300)
    kw = dict(rank=4, dim=64, n_bootstrap=500, z_interval="resampled_sd")
    a32 = analyze_energy(p, c, t, precision="float32", **kw)
    a64 = analyze_energy(p, c, t, precision="float64", **kw)
    assert a32["z"].ci_low == pytest.approx(a64["z"].ci_low, rel=1e-5)
    assert a32["z"].ci_high == pytest.approx(a64["z"].ci_high, rel=1e-5)


def test_hierarchical_groups_and_zero_energy_sequences():
    p, c, t = _data(5, s=60)
    groups = np.repeat(np.arange(20), 3)
    a = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=400, group_ids=groups)
    b = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=400)
    assert a["energy_fraction"].estimate == b["energy_fraction"].estimate
    assert np.isfinite(a["energy_fraction"].ci_low)
    t0, p0, c0 = t.copy(), p.copy(), c.copy()
    t0[:2] = p0[:2] = 0
    c0[:2] = 0
    z = analyze_energy(p0, c0, t0, rank=4, dim=64, n_bootstrap=300)
    assert "2 sequences with zero gradient energy" in z.note
    assert np.isfinite(z["hedges_g"].estimate)


def test_missing_or_bad_oracle_and_records():
    p, c, t = _data(6)
    a = analyze_energy(p, c, t, rank=4, dim=64, n_bootstrap=200)
    assert np.isnan(a["anisotropy_capture"].estimate)
    assert "no oracle" in a["anisotropy_capture"].note
    b = analyze_energy(p, c, t, rank=4, dim=64, oracle_fraction=0.01, n_bootstrap=200)
    assert "capture undefined" in b["anisotropy_capture"].note
    recs = a.to_records()
    assert len(recs) == len(METRICS) and recs[0]["n_controls"] == 60


def test_input_validation():
    p, c, t = _data(7)
    with pytest.raises(ValueError):
        analyze_energy(p[:-1], c, t, rank=4, dim=64)
    with pytest.raises(ValueError):
        analyze_energy(-p, c, t, rank=4, dim=64)
    with pytest.raises(ValueError):
        analyze_energy(p, c[:, :1], t, rank=4, dim=64)
    with pytest.raises(ValueError):
        analyze_energy(p, c, t, rank=4, dim=64, ci_method="basic")
    with pytest.raises(ValueError):
        analyze_energy(p, c, t, rank=4, dim=64, alternative="up")


def test_analyze_metric_vs_controls():
    ctrl = np.array([0.1, 0.2, 0.3, np.nan, 0.4])
    r = analyze_metric_vs_controls(0.5, ctrl)
    assert r.p_value == pytest.approx(1 / 5) and r.n_controls == 4
    assert r.control_mean == pytest.approx(0.25)
    assert r.z == pytest.approx((0.5 - 0.25) / np.std([0.1, 0.2, 0.3, 0.4], ddof=1))
    assert analyze_metric_vs_controls(0.0, ctrl, "less").p_value == pytest.approx(1 / 5)
