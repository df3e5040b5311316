"""Monte-Carlo decisions with a bounded resampling risk (issue #30): Clopper–Pearson intervals as
statsmodels computes them, decisions that agree with the ideal (infinite-draw) p-value's, the
family form under Holm / BH, and the same result however the stream is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from anistat.stats.resampling_risk import (
    NOT_REJECTED,
    REJECTED,
    UNDECIDED,
    RiskBoundedMonteCarlo,
    clopper_pearson,
    family_rejections,
    look_schedule,
    risk_bounded_decisions,
)


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
        engine.update(draws[:, start : start + size])
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


# ----------------------------------------------------------------------------------------------
# in a run: `stats.resampling_risk`
# ----------------------------------------------------------------------------------------------
def run_mini(tmp_path, extra_stats: str):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from conftest import MINI_PROTOCOL

    import anistat
    import anistat.report.render

    protocol = tmp_path / f"mini{len(extra_stats)}.yaml"
    protocol.write_text(MINI_PROTOCOL.replace("multiplicity: fdr_bh}", f"multiplicity: fdr_bh{extra_stats}}}"))
    with pytest.MonkeyPatch.context() as patch:  # figures are not what this is about
        patch.setattr(anistat.report.render, "render_figures", lambda *args, **kwargs: ([], {}))
        out = tmp_path / f"bundle{len(extra_stats)}"
        return anistat.run(protocol, out).results, out


@pytest.mark.slow
def test_a_run_with_resampling_risk_reports_decisions_and_keeps_its_p_values(tmp_path):
    """The same protocol with and without `resampling_risk`: identical p-values (the decisions
    read the same stream further), and with it every exact energy test carries a decision that is
    BH's decision at both ends of its interval where it is decided; ε is in the manifest."""
    import json

    plain, _ = run_mini(tmp_path, "")
    risky, bundle = run_mini(tmp_path, ", resampling_risk: 0.001")
    assert "mc_decision" not in plain.columns
    key = ["model", "checkpoint", "site", "rank", "proxy", "control", "metric"]
    merged = plain.merge(risky, on=key, suffixes=("", "_risk"))
    assert len(merged) == len(plain)
    np.testing.assert_array_equal(merged["p_value"].to_numpy(float), merged["p_value_risk"].to_numpy(float))
    energy = risky[(risky["p_test"] == "haar_monte_carlo") & (risky["metric"] != "delta_isoscore_star")]
    assert set(energy["mc_decision"]) <= {REJECTED, NOT_REJECTED, UNDECIDED} and len(energy) > 0
    assert (energy["mc_p_low"] <= energy["mc_p_high"]).all()
    others = risky[~risky.index.isin(energy.index)]
    assert (others["mc_decision"].fillna("") == "").all()
    # each decision, checked with statsmodels' BH over the run's distinct tests (family: run): the
    # test's interval end put in, the other tests at their interval's other end or reported p
    from statsmodels.stats.multitest import multipletests

    distinct = risky.dropna(subset=["p_value"])
    kind = np.where(distinct["metric"] == "delta_isoscore_star", "delta", distinct["p_test"])
    tests = distinct.assign(kind=kind).drop_duplicates(["model", "checkpoint", "site", "rank", "proxy", "kind"])
    low = tests["mc_p_low"].fillna(tests["p_value"]).to_numpy(float)
    high = tests["mc_p_high"].fillna(tests["p_value"]).to_numpy(float)
    sure = multipletests(high, 0.05, "fdr_bh")[1] < 0.05
    possible = multipletests(low, 0.05, "fdr_bh")[1] < 0.05
    status = tests["mc_decision"].fillna("").to_numpy()
    assert len(tests) == 48  # 16 (unit, proxy, rank) × (energy, ΔIsoScore*, data test): the planned family
    assert ((status == REJECTED) == (sure & (status != ""))).all()
    assert ((status == NOT_REJECTED) == (~possible & ~sure & (status != ""))).all()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["null_settings"]["resampling_risk"] == 0.001
    assert "resampling risk of at most ε = 0.001" in (bundle / "report.html").read_text(encoding="utf-8")


def test_resampling_risk_with_a_two_sided_alternative_is_refused(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from conftest import MINI_PROTOCOL

    protocol = tmp_path / "two.yaml"
    protocol.write_text(
        MINI_PROTOCOL.replace(
            "multiplicity: fdr_bh}", "multiplicity: fdr_bh, resampling_risk: 0.001, alternative: two-sided}"
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "validate", str(protocol)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "resampling_risk" in done.stderr and "Traceback" not in done.stderr
