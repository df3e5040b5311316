"""The high-level entry point analyze_energy (exact test, named estimands, document resampling)
and analyze_metric_vs_controls."""

import numpy as np
import pytest

from anistat.stats import (EXACT_TEST, METRICS, SIGN_FLIP_TEST, analyze_energy, analyze_metric_vs_controls,
                           bootstrap_weights, ci_from_replicates, cluster_sums, expected_control_energy,
                           hedges_correction, monte_carlo_pvalue, ratio_se, sign_flip_test)


def _data(seed=0, s=80, boost=1.3, k=4, d=64):
    rng = np.random.default_rng(seed)
    t = rng.gamma(4, 1, s) * 10
    p = t * np.clip(boost * rng.beta(2, 30, s), 0, 1)
    null = rng.beta(2, 30, 999)
    return p, t, null


def test_closed_form_expected_control_energy():
    p = np.array([1.0, 2.0, 0.5])
    t = np.array([10.0, 8.0, 4.0])
    assert expected_control_energy("haar", p, t, 4, 64) == pytest.approx(4 / 64 * t)
    assert expected_control_energy("normal", p, t, 4, 64) == pytest.approx(4 / 60 * (t - p))
    with pytest.raises(ValueError, match="closed-form"):
        expected_control_energy("pca_span", p, t, 4, 64)


def test_expected_control_energy_matches_the_average_of_drawn_controls():
    # the closed forms are the mean over the control law: check against many real draws
    from anistat.geometry import draw_controls

    rng = np.random.default_rng(3)
    d, k = 16, 3
    g = rng.standard_normal((200, d)) * np.linspace(3, 0.2, d)
    u = draw_controls("haar", np.eye(d, k), 1, seed=1)[0].numpy()
    p, t = np.sum((g @ u) ** 2), np.sum(g * g)
    for kind in ("haar", "normal"):
        q = draw_controls(kind, u, 20000, seed=2).numpy()
        drawn = np.einsum("nd,jdk->jnk", g, q) ** 2
        mean = drawn.sum(axis=(1, 2)).mean()
        assert mean == pytest.approx(expected_control_energy(kind, p, t, k, d), rel=0.01), kind


def test_estimates_tests_and_notes():
    p, t, null = _data()
    e = expected_control_energy("haar", p, t, 4, 64)
    a = analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, oracle_fraction=0.4, n_bootstrap=500,
                       n_permutations=999, n_paper_controls=20, seed=1)
    assert [m.metric for m in a.metrics] == list(METRICS)
    e_u = p.sum() / t.sum()
    assert a["energy_fraction"].estimate == pytest.approx(e_u)
    assert a["energy_ratio"].estimate == pytest.approx(e_u / (4 / 64))
    assert a["log2_energy_ratio"].estimate == pytest.approx(np.log2(e_u * 16))
    assert a["energy_fraction"].control_mean == pytest.approx(null.mean())
    assert a["z"].estimate == pytest.approx((e_u - null.mean()) / null.std(ddof=1))
    assert a["anisotropy_capture"].estimate == pytest.approx((e_u - 4 / 64) / (0.4 - 4 / 64))
    exact = monte_carlo_pvalue(e_u, null)
    assert a.p_value == exact and a.p_value_paper == monte_carlo_pvalue(e_u, null[:20])
    for name in ("energy_fraction", "energy_ratio", "log2_energy_ratio", "z", "anisotropy_capture"):
        assert a[name].p_value == exact and a[name].p_test == EXACT_TEST
        assert a[name].effect_size_kind == "z"
    # the sign-flip test and g use the headline's own contributions p - e, not ratios
    d = p - e
    assert a.sign_flip == sign_flip_test(d, 999, seed=1)
    g = a["hedges_g"]
    assert g.p_test == SIGN_FLIP_TEST and g.effect_size_kind == "hedges_g"
    assert g.estimate == pytest.approx(hedges_correction(79) * d.mean() / d.std(ddof=1))
    # every interval says what it is an interval of, and over what
    assert "for this proxy" in a["energy_fraction"].note and "80 sequences resampled" in a["energy_fraction"].note
    assert "not a test against random subspaces" in a["energy_ratio"].note
    assert [r["n_controls"] for r in a.to_records()] == [999, 999, 999, 999, 999, 999]


def test_ratio_interval_is_a_studentized_ratio_of_sums():
    p, t, null = _data(1)
    e = expected_control_energy("normal", p, t, 4, 64)
    a = analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, n_bootstrap=800, seed=4,
                       control_kind="normal", n_permutations=99)
    w = bootstrap_weights(p.size, 800, seed=4)
    one = np.ones((1, p.size))
    for metric, den in (("energy_fraction", t), ("energy_ratio", e)):
        ref = ci_from_replicates(p.sum() / den.sum(), (w @ p) / (w @ den), method="studentized",
                                 se=ratio_se(one, p, den)[0], replicate_se=ratio_se(w, p, den))
        assert (a[metric].ci_low, a[metric].ci_high) == pytest.approx((ref.ci_low, ref.ci_high), rel=1e-9)
    assert a["log2_energy_ratio"].ci_low == pytest.approx(np.log2(a["energy_ratio"].ci_low))
    for m in a.metrics:
        if np.isfinite(m.ci_low):
            assert m.ci_low <= m.estimate <= m.ci_high, m


def test_documents_are_the_resampling_unit():
    p, t, null = _data(2, s=90)
    e = expected_control_energy("haar", p, t, 4, 64)
    documents = np.repeat(np.arange(30), 3)
    a = analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, group_ids=documents, n_bootstrap=400,
                       n_permutations=999, seed=7)
    sums, n_units = cluster_sums(np.stack([p, t, e], axis=1), documents)
    assert n_units == 30 and a.n_clusters == 30 and a.n_sequences == 90
    # identical to an analysis of the per-document sums
    b = analyze_energy(*sums.T, rank=4, dim=64, null_fractions=null, n_bootstrap=400, n_permutations=999, seed=7)
    for m, ref in zip(a.metrics, b.metrics):
        assert (m.estimate, m.ci_low, m.ci_high) == pytest.approx((ref.estimate, ref.ci_low, ref.ci_high), nan_ok=True)
    assert a.sign_flip.p_value == b.sign_flip.p_value
    assert "30 documents resampled" in a["energy_ratio"].note


def test_anisotropy_capture_interval_stays_in_range():
    p, t, null = _data(4, s=12, boost=3.0)
    e = expected_control_energy("haar", p, t, 4, 64)
    oracle = p.sum() / t.sum() * 1.001  # the proxy is (nearly) the oracle
    a = analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, oracle_fraction=oracle, n_bootstrap=500,
                       n_permutations=99)
    capture = a["anisotropy_capture"]
    assert capture.ci_high <= 1.0 and capture.ci_low >= (0 - 4 / 64) / (oracle - 4 / 64)


def test_input_validation():
    p, t, null = _data()
    e = expected_control_energy("haar", p, t, 4, 64)
    with pytest.raises(ValueError):
        analyze_energy(p[:-1], t, e, rank=4, dim=64, null_fractions=null)
    with pytest.raises(ValueError):
        analyze_energy(-p, t, e, rank=4, dim=64, null_fractions=null)
    with pytest.raises(ValueError):
        analyze_energy(p, t, e, rank=4, dim=64, null_fractions=[])
    with pytest.raises(ValueError):
        analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, ci_method="basic")
    with pytest.raises(ValueError):
        analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, alternative="up")
    with pytest.raises(ValueError, match="resampling units"):
        analyze_energy(p, t, e, rank=4, dim=64, null_fractions=null, group_ids=np.zeros(p.size))


def test_analyze_metric_vs_controls():
    ctrl = np.array([0.1, 0.2, 0.3, 0.4])
    r = analyze_metric_vs_controls(0.5, ctrl)
    assert r.p_value == pytest.approx(1 / 5) and r.control_mean == pytest.approx(0.25)
    assert analyze_metric_vs_controls(0.0, ctrl, "less").p_value == pytest.approx(1 / 5)
    # with a separate exact null, p comes from it and the controls give the paper's p
    null = np.linspace(0, 1, 99)
    r = analyze_metric_vs_controls(0.35, ctrl, null_values=null, n_paper_controls=4)
    assert r.p_value == pytest.approx(monte_carlo_pvalue(0.35, null))
    assert r.p_value_paper == pytest.approx(monte_carlo_pvalue(0.35, ctrl))
