"""A run's own null check (issue #22): the verdict comes from tests that suit the p-values —
discrete Monte-Carlo p-values included — and can never call a rejected uniformity "consistent
with a calibrated test"; the report finds the `random@refit` rows of the null-check protocol."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_report_inputs import FAST, plan_results, quickstart_manifest  # noqa: E402

from anistat.bundle import null_check_summaries, report_inputs  # noqa: E402
from anistat.protocol import load_protocol  # noqa: E402
from anistat.report._content import ReportContext, null_check_sentences  # noqa: E402
from anistat.stats import p_value_grid, p_value_uniformity  # noqa: E402
from anistat.stats.uniformity import (  # noqa: E402
    _Law,
    holm_rejections,
    ks_distance,
    law_ks_distance,
    sample_sequential_pvalues,
)

ROOT = Path(__file__).resolve().parents[2]
CONSISTENT = "consistent with a calibrated test"


def discrete_uniform(n: int, draws: int, seed: int) -> np.ndarray:
    """p-values of a valid Monte-Carlo test with `draws` controls: uniform on j/(draws + 1)."""
    return np.random.default_rng(seed).integers(1, draws + 2, size=n) / (draws + 1)


def test_valid_discrete_p_values_are_calibrated_where_a_continuous_ks_test_rejects_them():
    """The paper's 20 controls: p in multiples of 1/21. A KS test against U(0, 1) rejects a valid
    test's p-values outright; the check on their own grid does not."""
    p = discrete_uniform(2000, 20, seed=1)
    assert sps.kstest(p, "uniform").pvalue < 1e-6  # the old verdict's test: wrong for a discrete law
    check = p_value_uniformity(p, 0.05, n_draws=20)
    assert check.grid == 21 and check.expected_rate == pytest.approx(1 / 21)
    assert check.verdict == "calibrated" and check.uniformity_p > 0.05 and check.binomial_p > 0.05


def test_the_rejection_share_is_tested_against_the_grids_own_level():
    """On a 1/21 grid a valid test rejects 1/21 = 4.76 % at alpha 0.05: the binomial test uses
    that share (scipy's exact binomial test), and its interval is Clopper–Pearson."""
    p = np.r_[np.full(10, 1 / 21), np.full(190, 11 / 21)]
    check = p_value_uniformity(p, 0.05, n_draws=20)
    assert check.rejections == 10 and check.rejection_rate == 0.05
    assert check.binomial_p == pytest.approx(sps.binomtest(10, 200, 1 / 21).pvalue)
    reference = sps.binomtest(10, 200).proportion_ci(method="exact")
    assert check.rate_ci == pytest.approx((reference.low, reference.high))
    assert check.verdict == "not uniform"  # right share, but every other p sits at 11/21


@pytest.mark.slow
def test_anti_conservative_and_conservative_tests_are_named():
    rng = np.random.default_rng(2)
    assert p_value_uniformity(rng.uniform(size=1000) ** 2).verdict == "anti-conservative"
    assert p_value_uniformity(0.1 + 0.9 * rng.uniform(size=1000)).verdict == "conservative"
    assert p_value_uniformity(rng.uniform(size=1000)).verdict == "calibrated"


@pytest.mark.parametrize("seed", range(12))
def test_a_rejected_uniformity_is_never_called_consistent(seed):
    """The verdict rule: whatever the p-values, 'consistent with a calibrated test' is said only
    when Holm's procedure over the binomial and uniformity tests rejects neither (statsmodels)."""
    rng = np.random.default_rng(seed)
    shape = rng.choice(["power", "mixture", "grid"])
    n = int(rng.integers(40, 400))
    if shape == "power":
        p = rng.uniform(size=n) ** rng.uniform(0.5, 2.0)
        draws = None
    elif shape == "mixture":
        p = np.where(rng.uniform(size=n) < 0.3, rng.uniform(0.4, 0.6, size=n), rng.uniform(size=n))
        draws = None
    else:
        draws = int(rng.integers(5, 40))
        p = discrete_uniform(n, draws, seed)
    check = p_value_uniformity(p, 0.05, n_draws=draws, n_simulations=999)
    holm = multipletests([check.binomial_p, check.uniformity_p], alpha=check.level, method="holm")[0]
    rejected = bool(holm.any())
    assert check.calibrated == (not rejected)
    from anistat.report._null_check import verdict_sentence
    from anistat.report.inputs import NullCheckSummary

    summary = NullCheckSummary.from_check("paper", p, check)
    assert (CONSISTENT in verdict_sentence(summary)) == (not rejected)


def test_ks_distance_is_the_kolmogorov_smirnov_statistic_of_the_law_on_the_grid():
    rng = np.random.default_rng(3)
    continuous = rng.uniform(size=300)
    assert ks_distance(continuous, None) == pytest.approx(sps.kstest(continuous, "uniform").statistic)
    # discrete: brute force sup |F_n − F_0| over points just below and at every grid value
    grid = 21
    p = discrete_uniform(150, grid - 1, seed=4)
    xs = np.r_[np.arange(1, grid + 1) / grid, np.arange(1, grid + 1) / grid - 1e-9]
    empirical = np.array([(p <= x).mean() for x in xs])
    law = np.floor(xs * grid + 1e-12) / grid
    assert ks_distance(p, grid) == pytest.approx(np.abs(empirical - law).max())


def test_grid_detection():
    assert p_value_grid(np.array([1, 5, 21]) / 21, 20) == 21
    assert p_value_grid(np.array([0.013, 0.5]), 20) is None  # off the grid: continuous
    assert p_value_grid(np.array([0.5]), None) is None


# ----------------------------------------------------------------------------------------------
# the report of the null-check protocol
# ----------------------------------------------------------------------------------------------
def null_check_results(seed: int = 0) -> pd.DataFrame:
    """Rows shaped like protocols/null-check.yaml's results: oracle rows first (their proxy is
    'oracle'), then every proxy metric of the random proxies refitted per checkpoint
    ('random@refit'); valid exact p-values on the grid of 11,519 draws, the paper's on 1/21."""
    protocol = load_protocol(ROOT / "protocols" / "null-check.yaml")
    rows = plan_results(protocol, proxies=("random@refit",))
    rng = np.random.default_rng(seed)
    units = rows.groupby(["model", "checkpoint", "site", "rank"]).ngroup()
    exact = rng.integers(1, 11521, size=units.max() + 1) / 11520
    paper = rng.integers(1, 22, size=units.max() + 1) / 21
    proxy_rows = rows["proxy"] == "random@refit"
    rows.loc[proxy_rows, "p_value"] = exact[units[proxy_rows]]
    rows.loc[proxy_rows, "p_value_paper"] = paper[units[proxy_rows]]
    fractions = rows[proxy_rows & (rows["metric"] == "energy_ratio")].assign(metric="energy_fraction")
    return pd.concat([rows, fractions], ignore_index=True)


def test_null_check_summaries_use_each_tests_own_grid():
    results = null_check_results()
    exact, paper = null_check_summaries(results, 0.05, n_paper_controls=20)
    assert exact.grid == 11520 and paper.grid == 21
    assert paper.expected_rate == pytest.approx(1 / 21) and exact.expected_rate == pytest.approx(576 / 11520)
    assert len(exact.p_values) == len(paper.p_values) == 192


@pytest.mark.slow
def test_null_check_report_finds_the_refit_rows_and_states_a_verdict_that_agrees_with_its_tests(tmp_path):
    from anistat.report.figures import render_figures

    protocol = load_protocol(ROOT / "protocols" / "null-check.yaml")
    results = null_check_results()
    inputs = report_inputs(protocol, results, quickstart_manifest(protocol))
    ctx = ReportContext(inputs=inputs, options=FAST)
    assert ctx.proxy == "random@refit"  # not 'oracle', the label of the first rows
    sentences = null_check_sentences(ctx)
    for check, sentence in zip(inputs.null_checks, sentences):
        assert (CONSISTENT in sentence) == check.calibrated
        assert f"p = {check.uniformity_p:.2g}" in sentence and "Kolmogorov" in sentence
    assert "multiples of 1/21" in sentences[1]
    fig_ctx = {
        "proxy": ctx.proxy,
        "control": ctx.control,
        "max_panels": 4,
        "ci_text": ctx.ci_text,
        "null_checks": inputs.null_checks,
    }
    figures, skipped = render_figures(ctx.main, ctx.full, fig_ctx, tmp_path, 40)
    names = {f.name for f in figures}
    assert {
        "energy_ratio_trajectory",
        "forest_effects",
        "proxy_oracle_controls",
        "delta_isoscore",
        "null_check",
    } <= names, skipped
    caption = next(f.caption for f in figures if f.name == "null_check")
    from anistat.report._null_check import VERDICT_TEXT

    for check in inputs.null_checks:
        assert math.isfinite(check.uniformity_p)
        assert f"uniformity p = {check.uniformity_p:.2g} \u2014 {VERDICT_TEXT[check.verdict]}" in caption


@pytest.mark.slow
def test_sequential_pvalues_are_judged_against_their_own_law():
    from anistat.stats import sequential_monte_carlo_pvalue
    from anistat.stats.uniformity import sample_sequential_pvalues

    rng = np.random.default_rng(5)
    n, h = 499, 10
    law = sample_sequential_pvalues(n, h, 100_000, rng)
    observed, null = rng.random(4000), rng.random((4000, n))
    real, _ = sequential_monte_carlo_pvalue(observed, null, h)  # a valid sequential test under its null
    for a in (0.01, 0.05, 0.2, 0.5):
        assert (law <= a).mean() == pytest.approx((real <= a).mean(), abs=0.012)
    check = p_value_uniformity(real[:300], 0.05, n_draws=n, stop_after=h)
    assert check.grid is None and check.expected_rate == pytest.approx(0.05, abs=0.004)
    assert check.verdict == "calibrated"
    # the same p-values judged as if they were a fixed-n grid are off the grid: continuous, and an
    # anti-conservative test (p-values halved) is caught against the sequential law
    assert p_value_uniformity(real[:300] / 2, 0.05, n_draws=n, stop_after=h).verdict == "anti-conservative"


@pytest.mark.parametrize("seed", range(6))
def test_holm_rejections_are_statsmodels_holm(seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 0.08, size=int(rng.integers(2, 5)))
    expected = multipletests(p, alpha=0.05, method="holm")[0]
    assert holm_rejections(p, 0.05) == tuple(bool(r) for r in expected)


def test_each_test_at_the_level_would_reject_where_holm_does_not():
    """p = 0.03 and 0.04: each below 0.05 on its own, but neither below Holm's first step 0.025,
    so a verdict from two tests at 0.05 each would cry wolf where the family's level holds."""
    assert holm_rejections((0.03, 0.04), 0.05) == (False, False)
    assert holm_rejections((0.02, 0.04), 0.05) == (True, True)
    assert holm_rejections((0.02, 0.3), 0.05) == (True, False)


@pytest.mark.slow
def test_the_verdict_holds_its_level_on_simulated_null_families():
    """Families of independent p-values drawn from the sequential exact test's law (h = 10, n =
    11,519: the null-check protocol's settings): the KS test against the simulated law is valid
    (its Monte-Carlo p-value of a discrete statistic is at most uniform: P(p ≤ a) ≤ a up to the
    margin), and 'NOT calibrated' is said in at most a level's share of them."""
    rng = np.random.default_rng(11)
    checks = [
        p_value_uniformity(
            sample_sequential_pvalues(11519, 10, 96, rng), n_draws=11519, stop_after=10, n_simulations=199, seed=i
        )
        for i in range(80)
    ]
    uniformity = np.array([c.uniformity_p for c in checks])
    for a in (0.1, 0.25, 0.5):
        assert (uniformity <= a).sum() <= sps.binom.ppf(0.999, uniformity.size, a)
    alarms = sum(not c.calibrated for c in checks)
    assert alarms <= sps.binom.ppf(0.999, len(checks), 0.05)


@pytest.mark.parametrize("seed", range(4))
def test_the_distance_from_a_discrete_law_is_the_supremum_with_ties(seed):
    """Brute force: |F_N − F| at every atom and just below it. The sequential law's atoms (p = 1
    has mass 1/(h + 1)) put ties in every sample; a tied block's own mass is no distance."""
    rng = np.random.default_rng(seed)
    law = _Law(sample_sequential_pvalues(40, 3, 2000, rng))
    sample = sample_sequential_pvalues(40, 3, int(rng.integers(5, 60)), rng)
    assert np.mean(sample == 1.0) > 0 or seed  # ties at p = 1 in most samples
    atoms = np.unique(np.r_[law.sorted, sample])
    xs = np.r_[atoms, atoms * (1 - 1e-6), 0.0, 2.0]  # at and just below every atom
    empirical = np.array([(sample <= x).mean() for x in xs])
    assert law_ks_distance(sample, law) == pytest.approx(np.abs(empirical - law.cdf(xs)).max(), abs=1e-12)
    # a sample that is the law itself is at distance 0, however many ties it holds
    assert law_ks_distance(law.sorted, law) == pytest.approx(0.0, abs=1e-12)


def test_a_planted_liberal_test_is_caught_against_the_sequential_law():
    """A test whose exceedance probability is u^1.4 (small p-values too often: liberal): 960
    p-values, as five seeds of the null-check protocol give, are called NOT calibrated."""
    rng = np.random.default_rng(12)
    u = rng.uniform(size=960) ** 1.4
    stop_at = 10 + rng.negative_binomial(10, u)
    p = np.where(stop_at <= 11519, 10 / np.minimum(stop_at, 11520), (1 + rng.binomial(11519, u)) / 11520)
    check = p_value_uniformity(p, n_draws=11519, stop_after=10, n_simulations=999)
    assert check.verdict in ("anti-conservative", "not uniform")


def test_the_sequential_law_has_the_runs_cap_not_the_most_draws_a_test_used():
    """Every test stopped by 20 draws (n_controls = draws used): the law behind the verdict is
    still the one with the run's cap n = 11,519 (P(p ≤ 0.05) ≈ 0.0496), not a 20-draw test's
    (1/21): the run's cap comes from its null settings; the sentence names the run's seed."""
    from anistat.report._null_check import verdict_sentence

    results = null_check_results()
    exact = (results["proxy"] == "random@refit") & (results["p_test"] == "haar_monte_carlo")
    results.loc[exact, "n_controls"] = 20
    checks = null_check_summaries(results, 0.05, 20, stop_after=10, n_null_draws=11519, seed=3)
    assert checks[0].sequential and checks[0].expected_rate == pytest.approx(0.0496, abs=0.001)
    assert "192 tests of one run, seed 3" in verdict_sentence(checks[0])
    without_cap = null_check_summaries(results, 0.05, 20, stop_after=10)[0]
    assert without_cap.expected_rate == pytest.approx(1 / 21, abs=0.0005)


def test_p_values_read_back_from_results_csv_sit_on_the_laws_atoms():
    """results.csv keeps 10 significant digits (10/11 is written 0.9090909091): read back, the
    p-values are judged exactly as the run's own (a value just above its atom would move the
    atom's whole mass, 0.076 for 10/11, into the distance)."""
    rng = np.random.default_rng(13)
    p = sample_sequential_pvalues(11519, 10, 192, rng)
    written = np.array([float(f"{v:.10g}") for v in p])
    assert np.any(written != p)
    exact = p_value_uniformity(p, n_draws=11519, stop_after=10, n_simulations=199, seed=1)
    read_back = p_value_uniformity(written, n_draws=11519, stop_after=10, n_simulations=199, seed=1)
    assert read_back.ks_distance == pytest.approx(exact.ks_distance, abs=1e-12)
    assert read_back.uniformity_p == exact.uniformity_p
