"""Studentized (bootstrap-t) intervals for ratio-of-sums statistics, and the calibration's
independence of simulated studies."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtri

import anistat.stats.calibrate as calibrate
from anistat.stats import (analyze_energy, bootstrap_weights, ci_from_replicates, ratio_se,
                           run_calibration, sequence_bootstrap)


def _heavy_ratio_data(rng, s):
    # heterogeneous sequences: lognormal lengths/scales and a skewed per-sequence fraction
    t = rng.lognormal(0.0, 1.0, s) * rng.integers(4, 17, s)
    p = t * rng.beta(0.6, 4.0, s)
    return p, t


def test_ratio_se_is_the_delta_method_se_of_the_resampled_data():
    rng = np.random.default_rng(0)
    p, t = _heavy_ratio_data(rng, 25)
    w = bootstrap_weights(25, 40, seed=3)
    se = ratio_se(w, p, t)
    for b in (0, 7, 39):
        idx = np.repeat(np.arange(25), w[b].astype(int))       # the resampled data set
        pb, tb = p[idx], t[idx]
        th = pb.sum() / tb.sum()
        ref = np.sqrt(((pb - th * tb) ** 2).sum() * 25 / 24) / tb.sum()
        assert se[b] == pytest.approx(ref, rel=1e-10)
    # full data: close to the jackknife SE of the ratio
    jack = (p.sum() - p) / (t.sum() - t)
    se_j = np.sqrt(24 / 25 * ((jack - jack.mean()) ** 2).sum())
    assert ratio_se(np.ones((1, 25)), p, t)[0] == pytest.approx(se_j, rel=0.2)


def test_studentized_ci_matches_a_direct_bootstrap_t():
    rng = np.random.default_rng(1)
    p, t = _heavy_ratio_data(rng, 50)
    r = sequence_bootstrap(lambda w: (w @ p) / (w @ t), 50, 999, seed=2, method="studentized",
                           standard_error=lambda w: ratio_se(w, p, t), chunk_size=100)
    w = bootstrap_weights(50, 999, seed=2)
    th = p.sum() / t.sum()
    reps = (w @ p) / (w @ t)
    se_b = np.array([np.sqrt(((p - x * t) ** 2 * wi).sum() * 50 / 49) / (wi @ t)
                     for wi, x in zip(w, reps)])
    se0 = np.sqrt(((p - th * t) ** 2).sum() * 50 / 49) / t.sum()
    tq = np.quantile((reps - th) / se_b, [0.975, 0.025])
    assert r.method == "studentized" and r.note == ""
    assert (r.ci_low, r.ci_high) == pytest.approx((th - tq[0] * se0, th - tq[1] * se0),
                                                  rel=1e-10)
    with pytest.raises(ValueError, match="standard_error"):
        sequence_bootstrap(lambda w: (w @ p) / (w @ t), 50, 99, method="studentized")
    # degenerate SE -> percentile with the reason; zero-SE replicates are dropped and counted
    f = ci_from_replicates(th, reps, method="studentized", se=0.0, replicate_se=se_b)
    assert f.method == "percentile" and "studentized fell back" in f.note
    se_b[:3] = 0.0
    g = ci_from_replicates(th, reps, method="studentized", se=se0, replicate_se=se_b)
    assert g.method == "studentized" and "3 resamples" in g.note
    with pytest.raises(ValueError, match="replicate_se"):
        ci_from_replicates(th, reps, method="studentized")


def test_studentized_covers_where_bca_undercovers():
    # heavy-tailed heterogeneous sequences: the estimate and its SE are strongly correlated, so
    # BCa -- the engine's and scipy's alike -- undercovers at small S (a property of the
    # method, not of the engine); the bootstrap-t comes much closer to the nominal level.
    # A fresh weights matrix per data set (a shared one would correlate the replications).
    rng = np.random.default_rng(123)
    s, n_rep, b = 50, 1000, 400
    truth = 0.6 / 4.6  # E p / E t = E beta(0.6, 4)
    hit = {"bca": 0, "studentized": 0, "scipy_bca": 0}
    n_scipy = 150
    for i in range(n_rep):
        p, t = _heavy_ratio_data(rng, s)
        w = bootstrap_weights(s, b, seed=i)
        th = p.sum() / t.sum()
        reps = (w @ p) / (w @ t)
        jack = (p.sum() - p) / (t.sum() - t)
        bca = ci_from_replicates(th, reps, jack)
        stu = ci_from_replicates(th, reps, method="studentized",
                                 se=ratio_se(np.ones((1, s)), p, t)[0],
                                 replicate_se=ratio_se(w, p, t))
        hit["bca"] += bca.ci_low <= truth <= bca.ci_high
        hit["studentized"] += stu.ci_low <= truth <= stu.ci_high
        if i < n_scipy:
            ref = stats.bootstrap((p, t), lambda x, y, axis: x.sum(axis) / y.sum(axis),
                                  paired=True, vectorized=True, n_resamples=b, method="BCa",
                                  rng=i).confidence_interval
            hit["scipy_bca"] += ref.low <= truth <= ref.high
    cov = {k: v / (n_scipy if k == "scipy_bca" else n_rep) for k, v in hit.items()}
    # measured: BCa 0.876, studentized 0.928, scipy BCa on the first 150 data sets 0.86
    assert cov["bca"] < 0.90 and cov["scipy_bca"] < 0.92
    assert cov["studentized"] >= 0.91
    assert cov["studentized"] - cov["bca"] >= 0.03


def _energy_data(seed=0, s=120, n=40):
    rng = np.random.default_rng(seed)
    t = rng.lognormal(0, 0.8, s) * rng.integers(4, 17, s)
    c = t[:, None] * rng.beta(1, 8, (s, n))
    p = t * rng.beta(1.3, 8, s)
    return p, c, t


def test_analyze_energy_studentized_matches_generic_path():
    p, c, t = _energy_data()
    s = p.size
    a = analyze_energy(p, c, t, rank=3, dim=24, oracle_fraction=0.5, n_bootstrap=800, seed=4,
                       ci_method="studentized", n_permutations=99)
    cbar = c.mean(axis=1)
    w = bootstrap_weights(s, 800, seed=4)
    one = np.ones((1, s))
    for metric, num, den in (("energy_fraction", p, t), ("energy_ratio", p, cbar)):
        ref = ci_from_replicates(num.sum() / den.sum(), (w @ num) / (w @ den),
                                 method="studentized", se=ratio_se(one, num, den)[0],
                                 replicate_se=ratio_se(w, num, den))
        m = a[metric]
        assert m.ci_method == "studentized"
        assert (m.ci_low, m.ci_high) == pytest.approx((ref.ci_low, ref.ci_high), rel=1e-9)
    # z = kappa * sum(p - cbar) / sum(t) with the control sd held fixed
    e_q = c.sum(axis=0) / t.sum()
    kappa = 1.0 / e_q.std(ddof=1)
    ref = ci_from_replicates(kappa * (p - cbar).sum() / t.sum(),
                             kappa * (w @ (p - cbar)) / (w @ t), method="studentized",
                             se=kappa * ratio_se(one, p - cbar, t)[0],
                             replicate_se=kappa * ratio_se(w, p - cbar, t))
    assert (a["z"].ci_low, a["z"].ci_high) == pytest.approx((ref.ci_low, ref.ci_high), rel=1e-9)
    assert a["log2_energy_ratio"].ci_low == pytest.approx(np.log2(a["energy_ratio"].ci_low))
    assert a["anisotropy_capture"].ci_method == "studentized"
    g = a["hedges_g"]
    assert g.ci_method == "bca" and "not available for hedges_g" in g.note
    bca = analyze_energy(p, c, t, rank=3, dim=24, n_bootstrap=800, seed=4, n_permutations=99)
    assert g.ci_low == pytest.approx(bca["hedges_g"].ci_low)
    # unsupported combinations fall back to BCa and say so
    r = analyze_energy(p, c, t, rank=3, dim=24, n_bootstrap=300, ci_method="studentized",
                       z_interval="resampled_sd", n_permutations=99)
    assert "studentized CI not available with z_interval='resampled_sd'; BCa" in r["z"].note
    # here BCa itself degenerates (its upper level lands beyond the largest resample) and
    # falls back to percentile, saying so
    assert r["z"].ci_method == "percentile" and "most extreme resample" in r["z"].note
    assert r["energy_ratio"].ci_method == "studentized"
    groups = np.repeat(np.arange(s // 4), 4)
    r = analyze_energy(p, c, t, rank=3, dim=24, n_bootstrap=300, ci_method="studentized",
                       group_ids=groups, n_permutations=99)
    assert all(m.ci_method == "bca" for m in r.metrics[:5])
    assert "group_ids" in r["energy_fraction"].note
    with pytest.raises(ValueError, match="studentized"):
        analyze_energy(p, c, t, rank=3, dim=24, ci_method="basic")


def test_simulated_studies_use_independent_resampling_streams(monkeypatch):
    # one shared seed would give every simulated study the same weights matrix, correlating
    # the coverage indicators of all studies (the run-to-run spread then exceeds binomial)
    seeds = []
    real = calibrate.analyze_energy

    def spy(*args, **kwargs):
        seeds.append(kwargs["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(calibrate, "analyze_energy", spy)
    run_calibration(n_simulations=6, seed=0, planted_ratios=(1.0, 1.5), n_sequences=20,
                    n_bootstrap=50, n_permutations=49)
    assert len(seeds) == 12 and len(set(seeds)) == 12


def test_calibration_accepts_studentized():
    r = run_calibration(n_simulations=40, seed=5, planted_ratios=(1.0,), n_bootstrap=200,
                        n_permutations=99, ci_method="studentized")
    assert r.conditions[0]["bca_fallbacks"] == 0
    assert 0.8 <= r.coverage_fraction <= 1.0 and 0.8 <= r.coverage_ratio <= 1.0
    assert np.isfinite(ndtri(0.975))
