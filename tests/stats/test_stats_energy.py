"""The high-level entry point analyze_energy (exact test, named estimands, document resampling)
and analyze_metric_vs_controls."""

import numpy as np
import pytest

from anistat.stats import (
    DATA_TEST,
    EXACT_TEST,
    METRICS,
    ControlMoments,
    ExactTestResult,
    analyze_energy,
    analyze_metric_vs_controls,
    bootstrap_weights,
    ci_from_replicates,
    cluster_sums,
    control_energy_moments,
    expected_control_energy,
    hedges_correction,
    monte_carlo_pvalue,
    ratio_se,
    studentized_ratio_test,
)


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
    with pytest.raises(ValueError, match="kind must be one of .normal., .haar."):
        expected_control_energy("pca_span", p, t, 4, 64)


@pytest.mark.slow
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
    a = analyze_energy(
        p,
        t,
        e,
        rank=4,
        dim=64,
        null_fractions=null,
        oracle_fraction=0.4,
        n_bootstrap=500,
        n_test_resamples=999,
        n_paper_controls=20,
        seed=1,
    )
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
    # the data test is the studentized bootstrap test of ratio 1 on the CIs' own resamples; g uses the
    # headline's own contributions p - e, not ratios
    d = p - e
    w = bootstrap_weights(p.size, 999, seed=1)
    assert a.data_test == studentized_ratio_test(p, 4 / 64 * t, w, expand_units=80)
    g = a["hedges_g"]
    assert g.p_test == DATA_TEST and g.p_value == a.data_test.p_value and g.effect_size_kind == "hedges_g"
    assert g.estimate == pytest.approx(hedges_correction(79) * d.mean() / d.std(ddof=1))
    # every interval says what it is an interval of, and over what
    assert "for this proxy" in a["energy_fraction"].note and "80 sequences resampled" in a["energy_fraction"].note
    assert "not a test against random subspaces" in a["energy_ratio"].note
    assert [r["n_controls"] for r in a.to_records()] == [999, 999, 999, 999, 999, 999]


def test_ratio_interval_is_a_studentized_ratio_of_sums():
    p, t, null = _data(1)
    e = expected_control_energy("normal", p, t, 4, 64)
    a = analyze_energy(
        p,
        t,
        e,
        rank=4,
        dim=64,
        null_fractions=null,
        n_bootstrap=800,
        seed=4,
        control_kind="normal",
        n_test_resamples=99,
        ci_method="studentized",
    )
    w = bootstrap_weights(p.size, 800, seed=4)
    one = np.ones((1, p.size))
    for metric, den in (("energy_fraction", t), ("energy_ratio", e)):
        ratio = p.sum() / den.sum()
        ref = ci_from_replicates(
            ratio,
            (w @ p) / (w @ den),
            method="studentized",
            se=ratio_se(one, p, den)[0],
            replicate_se=ratio_se(w, p, den),
            log_scale=True,
            expand_units=80,
        )
        assert (a[metric].ci_low, a[metric].ci_high) == pytest.approx((ref.ci_low, ref.ci_high), rel=1e-9)
        # by hand: the log-scale pivot, quantiles at Hesterberg's expanded tails
        reps, reps_se = (w @ p) / (w @ den), ratio_se(w, p, den)
        pivot = (np.log(reps) - np.log(ratio)) / (reps_se / reps)
        from scipy import stats

        tail = stats.norm.sf(np.sqrt(80 / 79) * stats.t.isf(0.025, 79))
        q_low, q_high = np.quantile(pivot, [tail, 1 - tail])
        se_log = ratio_se(one, p, den)[0] / ratio
        assert a[metric].ci_low == pytest.approx(ratio * np.exp(-q_high * se_log), rel=1e-12)
        assert a[metric].ci_high == pytest.approx(ratio * np.exp(-q_low * se_log), rel=1e-12)
    assert a["log2_energy_ratio"].ci_low == pytest.approx(np.log2(a["energy_ratio"].ci_low))
    for m in a.metrics:
        if np.isfinite(m.ci_low):
            assert m.ci_low <= m.estimate <= m.ci_high, m


def test_documents_are_the_resampling_unit():
    p, t, null = _data(2, s=90)
    e = expected_control_energy("haar", p, t, 4, 64)
    documents = np.repeat(np.arange(30), 3)
    a = analyze_energy(
        p, t, e, rank=4, dim=64, null_fractions=null, group_ids=documents, n_bootstrap=400, n_test_resamples=999, seed=7
    )
    sums, n_units = cluster_sums(np.stack([p, t, e], axis=1), documents)
    assert n_units == 30 and a.n_clusters == 30 and a.n_sequences == 90
    # identical to an analysis of the per-document sums
    b = analyze_energy(*sums.T, rank=4, dim=64, null_fractions=null, n_bootstrap=400, n_test_resamples=999, seed=7)
    for m, ref in zip(a.metrics, b.metrics):
        assert (m.estimate, m.ci_low, m.ci_high) == pytest.approx((ref.estimate, ref.ci_low, ref.ci_high), nan_ok=True)
    assert a.data_test.p_value == b.data_test.p_value
    assert "30 documents resampled" in a["energy_ratio"].note


def test_anisotropy_capture_interval_stays_in_range():
    p, t, null = _data(4, s=12, boost=3.0)
    e = expected_control_energy("haar", p, t, 4, 64)
    oracle = p.sum() / t.sum() * 1.001  # the proxy is (nearly) the oracle
    a = analyze_energy(
        p, t, e, rank=4, dim=64, null_fractions=null, oracle_fraction=oracle, n_bootstrap=500, n_test_resamples=99
    )
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


def test_every_se_is_on_its_rows_scale_and_matches_its_interval():
    """se of a transform is the delta-method map of its source's se, and it agrees with the
    width of the row's own interval (issue #20: log2 ratio, z and anisotropy capture used to carry
    the se of the ratio / fraction)."""
    p, t, null = _data(5, s=200)
    e = expected_control_energy("haar", p, t, 4, 64)
    moments = control_energy_moments("haar", 4, 64, 1.0, 0.05)
    a = analyze_energy(
        p,
        t,
        e,
        rank=4,
        dim=64,
        exact=ExactTestResult(p_value=0.01, n_draws=999),
        control_moments=moments,
        paper_fractions=null,
        oracle_fraction=0.4,
        n_bootstrap=2000,
        seed=3,
    )
    fraction, ratio = a["energy_fraction"], a["energy_ratio"]
    assert a["log2_energy_ratio"].se == pytest.approx(ratio.se / (ratio.estimate * np.log(2)))
    assert a["z"].se == pytest.approx(fraction.se / moments.sd)
    assert a["anisotropy_capture"].se == pytest.approx(fraction.se / (0.4 - 4 / 64))
    # a 95 % interval is about 2 × 1.96 se wide on the row's own scale
    for m in a.metrics:
        if m.metric == "hedges_g":
            continue
        width = (m.ci_high - m.ci_low) / (2 * 1.96 * m.se)
        assert 0.85 < width < 1.2, (m.metric, width)


def test_closed_form_control_moments_match_drawn_controls():
    from anistat.geometry import draw_controls

    rng = np.random.default_rng(11)
    d, k = 20, 3
    g = rng.standard_normal((400, d)) * np.linspace(2.5, 0.3, d)
    m = g.T @ g
    u = np.linalg.qr(rng.standard_normal((d, k)))[0]
    mu = m @ u
    for kind in ("haar", "normal"):
        q = draw_controls(kind, u, 20000, seed=5).numpy()
        fractions = np.einsum("ndk,de,nek->n", q, m, q) / np.trace(m)
        exact = control_energy_moments(
            kind,
            k,
            d,
            np.trace(m),
            (m * m).sum(),
            float(np.trace(u.T @ mu)),
            float((mu * mu).sum()),
            float(((u.T @ mu) ** 2).sum()),
        )
        assert exact.mean == pytest.approx(fractions.mean(), rel=0.01), kind
        assert exact.sd == pytest.approx(fractions.std(ddof=1), rel=0.03), kind
        drawn = ControlMoments.of_draws(fractions)
        assert drawn.source == "20000 draws" and exact.source == "closed form"


def test_jackknife_replicates_need_no_n_by_n_matrix():
    """The BCa jackknife of the energy ratios and of hedges_g from leave-one-out sums equals the
    explicit n × n jackknife (which at 24,000 documents would take 4.6 GB), and a study of 30,000
    documents is analysed."""
    from anistat.stats.energy import _hedges_g, _leave_one_out_hedges_g

    rng = np.random.default_rng(3)
    d = rng.lognormal(0.0, 1.0, 60) - 1.5
    np.testing.assert_allclose(_leave_one_out_hedges_g(d), _hedges_g(1.0 - np.eye(60), d), rtol=1e-12, atol=1e-14)
    n = 30_000
    total = rng.lognormal(0.0, 1.0, n)
    proxy = total * rng.uniform(0.1, 0.2, n)
    result = analyze_energy(
        proxy, total, total * 2 / 16, rank=2, dim=16, null_fractions=rng.uniform(0.05, 0.2, 99), n_bootstrap=50
    )
    ratio = result["energy_ratio"]
    assert ratio.ci_low < ratio.estimate < ratio.ci_high
