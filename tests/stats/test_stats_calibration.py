"""A quick calibration run under the nulls users meet (the full study lives in benchmarks/)."""

import json
import os

import numpy as np
import pytest

from anistat.calibration_report import write_calibration_report
from anistat.stats import run_calibration


@pytest.fixture(scope="module")
def quick():
    return run_calibration(
        n_simulations=150,
        seed=1,
        scenarios=("clustered",),
        planted_ratios=(1.0,),
        n_documents=40,
        n_bootstrap=300,
        n_test_resamples=299,
        n_null=299,
    )


@pytest.mark.slow
def test_quick_calibration_under_clustered_anisotropic_null(quick):
    # loose bands (150 studies): a broken engine (token- or sequence-level resampling of
    # clustered data, p without +1, a reversed alternative, a biased CI) lands outside them
    random = quick.condition("clustered", "random")
    planted = quick.condition("clustered", 1.0)
    assert 0.005 <= random["rejection_exact"] <= 0.11
    assert 0.005 <= random["rejection_exact_sequential"] <= 0.11
    assert 0.005 <= planted["rejection_data_document"] <= 0.11
    # the sequential p-value never undercuts the fixed-n one's evidence by more than its floor
    assert abs(random["rejection_exact_sequential"] - random["rejection_exact"]) <= 0.03
    for row in (random, planted):
        for name in ("coverage_fraction_document", "coverage_ratio_haar_document", "coverage_ratio_normal_document"):
            assert 0.88 <= row[name] <= 1.0, (name, row[name])
    # ignoring the documents undercovers: the reason the default unit is the document
    seq = np.mean([random["coverage_ratio_normal_sequence"], planted["coverage_ratio_normal_sequence"]])
    doc = np.mean([random["coverage_ratio_normal_document"], planted["coverage_ratio_normal_document"]])
    assert seq < doc - 0.03


def test_calibration_is_deterministic():
    kwargs = dict(
        n_simulations=4,
        seed=3,
        scenarios=("anisotropic",),
        planted_ratios=(1.0,),
        n_documents=12,
        n_bootstrap=60,
        n_test_resamples=59,
        n_null=59,
    )
    assert run_calibration(**kwargs).conditions == run_calibration(**kwargs).conditions


@pytest.mark.slow
def test_calibration_report(quick, tmp_path):
    paths = write_calibration_report(quick, tmp_path)
    for kind in ("csv", "json", "png", "pdf", "html"):
        assert os.path.getsize(paths[kind]) > 0
    doc = open(paths["html"], encoding="utf-8").read()
    assert "data:image/png;base64," in doc and "<script" not in doc and "http" not in doc
    assert "not exact" in doc
    data = json.load(open(paths["json"]))
    assert data["checks"]["clustered: type-I error of the exact test (all draws)"]["value"] == pytest.approx(
        quick.condition("clustered", "random")["rejection_exact"]
    )
    assert len(data["conditions"]) == 2


def test_calibration_validates():
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, planted_ratios=(9.0,))
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, scenarios=("pareto",))
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, ci_method="basic")


def test_coverage_is_reported_at_other_study_sizes():
    result = run_calibration(
        n_simulations=6,
        seed=2,
        scenarios=("isotropic",),
        planted_ratios=(1.0,),
        n_documents=20,
        coverage_documents=(8, 40),
        n_bootstrap=60,
        n_test_resamples=59,
        n_null=59,
    )
    assert sorted({row["documents"] for row in result.conditions}) == [8, 20, 40]
    # goals are judged at the main size only
    assert all("documents" not in name for name in result.checks)
    assert len(result.checks) == 3 + 3  # exact (2 ways) + data test; 3 coverages


@pytest.mark.slow
def test_family_calibration_with_shared_draws():
    from anistat.stats.family_calibration import run_family_calibration

    result = run_family_calibration(40, seed=1, n_units=12, n_null=399)
    rows = {(row["condition"], row["stop_after"]): row for row in result.rows}
    assert set(rows) == {
        (f"{draws} draws, {design}", stop)
        for draws in ("shared", "per unit")
        for design in ("all null", "with effects")
        for stop in (10, 0)
    }
    for row in rows.values():
        # loose bands at 40 studies; a broken engine (p without +1, all units rejected) lands outside
        assert row["fwer_holm"] <= 0.2 and row["fdr_bh"] <= 0.2
    # planted units are found (3 of 12) and the shared draws change nothing systematic
    assert rows[("shared draws, with effects", 10)]["mean_discoveries_bh"] >= 2
    assert (
        run_family_calibration(5, seed=1, n_units=12, n_null=399).rows
        == run_family_calibration(5, seed=1, n_units=12, n_null=399).rows
    )  # deterministic


def test_skewed_scenario_is_clustered_with_heavy_document_scales():
    """`skewed` is `clustered` with lognormal document scales of log-SD `skewed_document_sd`: at 0
    (and `scale_sd` 0) the two scenarios simulate the same studies; at 1.5 they differ."""
    kwargs = dict(
        n_simulations=4,
        seed=5,
        planted_ratios=(1.0,),
        n_documents=12,
        n_bootstrap=60,
        n_test_resamples=59,
        n_null=59,
        scale_sd=0.0,
    )
    clustered = run_calibration(scenarios=("clustered",), **kwargs).conditions
    flat = run_calibration(scenarios=("skewed",), skewed_document_sd=0.0, **kwargs).conditions
    heavy = run_calibration(scenarios=("skewed",), **kwargs).conditions
    strip = lambda rows: [{k: v for k, v in row.items() if k != "scenario"} for row in rows]  # noqa: E731
    assert strip(flat) == strip(clustered)
    assert strip(heavy) != strip(clustered)
    assert {row["scenario"] for row in heavy} == {"skewed"}


def test_hot_documents_mixture_keeps_the_population_ratio_at_one():
    """`hot`: hot documents put 0.30 of their energy in the proxy's span, the others 0.028, and
    with 10 % hot documents of 5× energy the mixture's share is exactly k/d (ratio 1)."""
    from anistat.stats import calibrate

    rng = np.random.default_rng(0)
    d, k = 24, 3
    sigma, u = calibrate._population(rng, "clustered", "1.0", d, k)
    share = {}
    for name, factor in (("hot", calibrate.HOT_TILT), ("cold", calibrate.COLD_TILT)):
        root, matrix = calibrate._tilted(sigma, u, factor)
        np.testing.assert_allclose(root @ root, matrix, atol=1e-10)
        share[name] = np.trace(u.T @ matrix @ u) / np.trace(matrix)
    assert share["hot"] == pytest.approx(0.30) and share["cold"] == pytest.approx(0.0278, abs=1e-4)
    w_hot = calibrate.HOT_SHARE * calibrate.HOT_ENERGY
    mixture = (w_hot * share["hot"] + (1 - calibrate.HOT_SHARE) * share["cold"]) / (w_hot + 1 - calibrate.HOT_SHARE)
    assert mixture == pytest.approx(k / d, rel=1e-12)
    rows = run_calibration(
        n_simulations=3,
        seed=1,
        scenarios=("hot",),
        planted_ratios=(1.0,),
        n_documents=20,
        n_bootstrap=60,
        n_test_resamples=59,
        n_null=59,
    ).conditions
    assert [row["condition"] for row in rows] == ["random", "1.0"]


def test_heavy_scenario_is_skewed_with_a_heavier_tail_and_the_methods_sit_side_by_side():
    """`heavy` is `skewed` with its own document log-SD (equal settings: the same studies); every
    study carries each ratio-interval method's coverage, the analysis' interval among them
    (`adjusted_el_f`, the default, is the haar document interval, study for study), and its Kish n_eff."""
    from anistat.stats import calibrate
    from anistat.stats.calibrate import concentration_rows
    from anistat.stats.ratio_intervals import RATIO_INTERVAL_METHODS

    kwargs = dict(
        n_simulations=6, seed=3, planted_ratios=(1.0,), n_documents=12, n_bootstrap=60, n_test_resamples=59, n_null=59
    )
    skewed = run_calibration(scenarios=("skewed",), skewed_document_sd=1.25, keep_simulations=True, **kwargs)
    heavy = run_calibration(scenarios=("heavy",), keep_simulations=True, **kwargs)
    strip = lambda rows: [{k: v for k, v in row.items() if k != "scenario"} for row in rows]  # noqa: E731
    assert strip(heavy.conditions) == strip(skewed.conditions)
    for condition in ("random", "1.0"):
        sims = heavy.simulations[f"heavy/{condition}"]
        np.testing.assert_array_equal(sims["cover_method_adjusted_el_f"], sims["cover_ratio_haar_document"])
        assert ((sims["n_eff"] >= 1) & (sims["n_eff"] <= 12)).all()
        # m_eff = min(n_eff, n_z) (el_effective_size): never above Kish's n_eff
        assert ((sims["m_eff"] >= 1) & (sims["m_eff"] <= sims["n_eff"] + 1e-9)).all()
    row = heavy.conditions[0]
    assert all(0.0 <= row[f"coverage_method_{m}"] <= 1.0 for m in RATIO_INTERVAL_METHODS)
    # every study falls in one m_eff level; the data test is counted at ratio 1 only
    assert sum(r["studies"] for r in heavy.concentration) == 12
    assert sum(r["data_test_studies"] for r in heavy.concentration) == 6
    table = np.zeros((1, 2, 3, len(calibrate._COLS)))
    table[..., calibrate._COLS.index("n_eff")] = 500.0  # the levels are by m_eff, not n_eff
    table[..., calibrate._COLS.index("m_eff")] = [[1.5, 4.0, 4.5], [4.2, 200.0, 2.5]]
    table[..., calibrate._COLS.index("p_data_document")] = [[1.0, 1.0, 1.0], [0.01, 0.5, 0.5]]
    rows = {r["m_eff_low"]: r for r in concentration_rows([table], ("random", 1.0), 0.05)}
    assert {low: r["studies"] for low, r in rows.items()} == {1.0: 1, 2.0: 1, 3.0: 3, 120.0: 1}
    assert rows[3.0]["data_test_studies"] == 1 and rows[3.0]["rejection_data"] == 1.0


@pytest.mark.slow
def test_calibrate_reports_every_interval_method_and_the_m_eff_levels_end_to_end(tmp_path):
    """`anistat calibrate --scenario heavy`: the terminal names each method's coverage per study
    size and scenario, calibration.json carries the m_eff levels (every study in one), and the page
    shows both tables."""
    import subprocess
    import sys

    from anistat.stats.ratio_intervals import RATIO_INTERVAL_METHODS

    done = subprocess.run(
        [sys.executable, "-m", "anistat", "calibrate", "--out", str(tmp_path / "c"), "--n-simulations", "10",
         "--scenario", "heavy", "--n-documents", "12", "--coverage-documents", "12", "--family-simulations", "0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(row for row in done.stdout.splitlines() if row.startswith("heavy, 12 documents:"))
    assert all(f"{method} " in line for method in RATIO_INTERVAL_METHODS), line
    payload = json.loads((tmp_path / "c" / "calibration.json").read_text())
    assert sum(row["studies"] for row in payload["concentration"]) == 10 * 4  # random + three planted ratios
    assert payload["settings"]["ci_method"] == "adjusted_el_f" and payload["settings"]["heavy_document_sd"] == 1.25
    page = (tmp_path / "c" / "calibration.html").read_text(encoding="utf-8")
    assert "coverage_method_balanced_el" in page and "by effective number of documents" in page
