"""A quick calibration run under the nulls users meet (the full study lives in benchmarks/)."""

import json
import os

import numpy as np
import pytest

from anistat.stats import run_calibration, write_calibration_report


@pytest.fixture(scope="module")
def quick():
    return run_calibration(n_simulations=150, seed=1, scenarios=("clustered",), planted_ratios=(1.0,),
                           n_documents=40, n_bootstrap=300, n_test_resamples=299, n_null=299)


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
    kwargs = dict(n_simulations=4, seed=3, scenarios=("anisotropic",), planted_ratios=(1.0,), n_documents=12,
                  n_bootstrap=60, n_test_resamples=59, n_null=59)
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
        quick.condition("clustered", "random")["rejection_exact"])
    assert len(data["conditions"]) == 2


def test_calibration_validates():
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, planted_ratios=(9.0,))
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, scenarios=("heavy",))
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, ci_method="basic")


def test_coverage_is_reported_at_other_study_sizes():
    result = run_calibration(n_simulations=6, seed=2, scenarios=("isotropic",), planted_ratios=(1.0,),
                             n_documents=20, coverage_documents=(8, 40), n_bootstrap=60, n_test_resamples=59,
                             n_null=59)
    assert sorted({row["documents"] for row in result.conditions}) == [8, 20, 40]
    # goals are judged at the main size only
    assert all("documents" not in name for name in result.checks)
    assert len(result.checks) == 3 + 3  # exact (2 ways) + data test; 3 coverages


@pytest.mark.slow
def test_family_calibration_with_shared_draws():
    from anistat.stats.family_calibration import run_family_calibration

    result = run_family_calibration(40, seed=1, n_units=12, n_null=399)
    rows = {(row["condition"], row["stop_after"]): row for row in result.rows}
    assert set(rows) == {(f"{draws} draws, {design}", stop) for draws in ("shared", "per unit")
                         for design in ("all null", "with effects") for stop in (10, 0)}
    for row in rows.values():
        # loose bands at 40 studies; a broken engine (p without +1, all units rejected) lands outside
        assert row["fwer_holm"] <= 0.2 and row["fdr_bh"] <= 0.2
    # planted units are found (3 of 12) and the shared draws change nothing systematic
    assert rows[("shared draws, with effects", 10)]["mean_discoveries_bh"] >= 2
    assert run_family_calibration(5, seed=1, n_units=12, n_null=399).rows == \
        run_family_calibration(5, seed=1, n_units=12, n_null=399).rows  # deterministic
