"""A quick calibration run through the same entry point as real data."""

import json
import os

import numpy as np
import pytest

from anistat.stats import run_calibration, write_calibration_report


@pytest.fixture(scope="module")
def quick():
    return run_calibration(n_simulations=250, seed=1, planted_ratios=(1.0, 1.5),
                           n_bootstrap=400, n_permutations=399)


def test_quick_calibration_bands(quick):
    # loose bands (250 simulations): a broken engine (token-level resampling, p without +1,
    # a reversed alternative, a biased CI) lands outside them
    assert 0.01 <= quick.type1_mc <= 0.10
    assert 0.01 <= quick.type1_sign_flip <= 0.10
    assert 0.88 <= quick.coverage_fraction <= 0.99
    assert 0.88 <= quick.coverage_ratio <= 0.99
    assert quick.power_mc[1.5] > 0.8 and quick.power_sign_flip[1.5] > 0.8
    null = quick.conditions[0]
    assert abs(null["mean_ratio_estimate"] - 1.0) < 0.02


def test_calibration_is_deterministic():
    a = run_calibration(n_simulations=20, seed=3, planted_ratios=(1.0,), n_bootstrap=100,
                        n_permutations=99)
    b = run_calibration(n_simulations=20, seed=3, planted_ratios=(1.0,), n_bootstrap=100,
                        n_permutations=99)
    assert a.conditions == b.conditions


def test_calibration_report(quick, tmp_path):
    paths = write_calibration_report(quick, tmp_path)
    for kind in ("csv", "json", "png", "pdf", "html"):
        assert os.path.getsize(paths[kind]) > 0
    doc = open(paths["html"], encoding="utf-8").read()
    assert "data:image/png;base64," in doc and "<script" not in doc and "http" not in doc
    data = json.load(open(paths["json"]))
    assert data["checks"]["type1_mc"]["value"] == pytest.approx(quick.type1_mc)
    assert len(data["conditions"]) == 2


def test_calibration_validates():
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, planted_ratios=(9.0,))
    with pytest.raises(ValueError):
        run_calibration(n_simulations=5, control_kind="pca_span")
    assert np.isnan(run_calibration(n_simulations=5, planted_ratios=(2.0,), n_bootstrap=50,
                                    n_permutations=49).type1_mc)
