"""The per-row concentration diagnostic: Kish's effective number of documents and the ratio's
effective size m_eff on every energy row (each equal to a direct computation from the
per-document energies), and the run warning that quotes the calibrated coverage and data-test
level at the row's m_eff, in the manifest and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_analyze_degenerate import _protocol, measured_unit
from test_bad_input_helpers import no_figures

from anistat.analyze import analyze_units
from anistat.bundle import concentration_warnings
from anistat.collect import BasisColumn
from anistat.stats import el_effective_size
from anistat.stats.ratio_intervals import (
    CONCENTRATION_COVERAGE,
    CONCENTRATION_LAWS,
    CONCENTRATION_LEVELS,
    CONCENTRATION_STUDIES,
    SPREAD_DATA_TEST,
    SPREAD_DATA_TEST_STUDIES,
    SPREAD_LEVELS,
    calibrated_concentration,
    data_test_spread_threshold,
)

ENERGY = ["energy_fraction", "energy_ratio", "log2_energy_ratio", "z", "hedges_g", "anisotropy_capture"]


def _unit(hot_scale: float, seed: int = 0, s: int = 48, t: int = 6, d: int = 8, n_documents: int = 16):
    """A unit as the collector measures it, with the gradients of document 0 scaled by `hot_scale`
    (its energy by hot_scale²): one hot document among `n_documents`."""
    rng = np.random.default_rng(seed)
    documents = np.arange(s) % n_documents
    grads = rng.standard_normal((s, t, d)) / np.arange(1, d + 1)
    grads *= np.where(documents == 0, hot_scale, 1.0)[:, None, None]
    u = np.linalg.qr(rng.standard_normal((d, 2)))[0]
    acts = rng.standard_normal((s * t, d))
    unit = measured_unit(grads, acts, seed, documents, [BasisColumn("pca", 2, "proxy", -1)], [u], {("pca", 2): u})
    per_document = np.bincount(documents, weights=unit.total_energy[:, 0])
    return unit, per_document.sum() ** 2 / (per_document**2).sum()


def _m_eff(unit, rank: int = 2) -> float:
    """el_effective_size of the unit's per-document proxy energies against the Haar expectation
    k/d of their totals: the data test's and the haar ratio interval's estimating function."""
    documents = unit.sequence_documents
    proxy = np.bincount(documents, weights=unit.energy[:, 0, 0])
    total = np.bincount(documents, weights=unit.total_energy[:, 0])
    return el_effective_size(proxy, rank / unit.dim * total)


def test_every_energy_row_carries_the_kish_effective_number_of_documents():
    unit, expected = _unit(hot_scale=6.0)
    results = analyze_units([unit], _protocol([2]))
    energy = results[results["metric"].isin(ENERGY)]
    assert len(energy) == 12 and energy["n_eff"].to_numpy() == pytest.approx(np.full(12, expected))
    # closed form for one document of 36× the energy of 15 equal ones: (15 + 36)² / (15 + 36²) ≈ 1.98
    # effective documents; the drawn energies scatter around their expectation
    assert expected == pytest.approx(51**2 / (15 + 36**2), rel=0.2)
    others = results[~results["metric"].isin(ENERGY)]
    assert others["n_eff"].isna().all() and others["m_eff"].isna().all()
    # m_eff = min(n_eff, n_z): the hot document also carries the proxy's departures from the ratio
    haar = energy[energy["control"] == "haar"]
    assert haar["m_eff"].to_numpy() == pytest.approx(np.full(len(haar), _m_eff(unit)))
    assert (energy["m_eff"] <= energy["n_eff"] + 1e-9).all() and (energy["m_eff"] >= 1.0).all()


def test_a_concentrated_unit_is_warned_about_with_the_calibrated_level():
    """One document with 36× the energy of the 15 others: its energy spread n/n_eff (≈ 8) is far
    above the level from which the data test was measured liberal; the flat unit's (≈ 1.1) is not,
    and its m_eff (≈ 12) lies where the default interval's calibrated coverage is inside its band."""
    hot, n_eff = _unit(hot_scale=6.0, seed=0)
    flat, flat_n_eff = _unit(hot_scale=1.0, seed=3)
    spread, flat_spread = 16 / n_eff, 16 / flat_n_eff
    level = calibrated_concentration(_m_eff(hot), "adjusted_el_f", spread)
    # with so few effective documents the default interval over-covers (often the whole range);
    # the data test is liberal from spread 3
    assert flat_spread < level["data_test_from"] <= spread and level["data_test_off"] and level["coverage_off"]
    assert _m_eff(hot) < 5 and level["coverage"] > 0.97
    results = analyze_units([hot, flat], _protocol([2]))
    assert set(results.loc[results["metric"] == "energy_ratio", "ci_method"]) == {"adjusted_el_f"}  # the default
    warnings = concentration_warnings(results)
    assert len(warnings) == 1  # one warning for the units flagged on the same aspects
    (warning,) = warnings
    assert warning.startswith("1 unit(s) have their energy concentrated")
    m_eff = results.loc[
        (results["metric"] == "energy_ratio") & (results["site"] == "residual.0"), "m_eff"
    ].min()  # the unit's smallest m_eff over its rows (haar and normal)
    own = f"m_eff {m_eff:.1f}, n/n_eff {spread:.1f}: coverage {level['coverage']:.3f}, level {level['data_test']:.3f}"
    assert f"m step0 residual.0 ({own})" in warning and "residual.1" not in warning, warning
    assert "energy spread n/n_eff of 3 or more" in warning and "level outside [0.04, 0.06]" in warning
    assert "m_eff 1–7, 15–60" in warning and "coverage outside [0.93, 0.97]" in warning
    assert "read their intervals and data tests" in warning
    assert concentration_warnings(analyze_units([flat], _protocol([2]))) == []


def test_the_thresholds_are_read_off_the_measured_table():
    """Levels tile [1, ∞); a row's coverage is flagged when its own m_eff level's calibrated coverage
    (the law farthest from 0.95 measured there) lies outside [0.93, 0.97] by more than its
    Monte-Carlo margin 1.96·√(0.95·0.05/n). The data test's threshold is the lowest energy spread
    from which every level rejects more than 0.06 and all of them pooled beyond their margin: 3."""
    for levels in (CONCENTRATION_LEVELS, SPREAD_LEVELS):
        assert levels[0][0] == 1.0 and levels[-1][1] == np.inf
        assert all(a[1] == b[0] for a, b in zip(levels, levels[1:]))
    for method, coverage in CONCENTRATION_COVERAGE.items():
        studies = np.array(CONCENTRATION_STUDIES[method])
        assert len(coverage) == len(CONCENTRATION_LEVELS) == len(studies) == len(CONCENTRATION_LAWS[method])
        margins = 1.96 * np.sqrt(0.95 * 0.05 / studies)
        off = (np.array(coverage) < 0.93 - margins) | (np.array(coverage) > 0.97 + margins)
        for (low, high), flagged in zip(CONCENTRATION_LEVELS, off):
            inside = low + 0.5 if np.isfinite(high) else low * 2
            assert calibrated_concentration(inside, method)["coverage_off"] == flagged, (method, low)
        assert bool(calibrated_concentration(50.0, method)["coverage_off_levels"]) == off.any()
    default = calibrated_concentration(9.9, spread=2.99)
    assert default["data_test_from"] == 3.0
    assert not default["data_test_off"] and calibrated_concentration(9.9, spread=3.0)["data_test_off"]
    # the default interval: over-covers (often the parameter's whole range) where m_eff is tiny
    assert calibrated_concentration(1.5)["coverage_off"] and calibrated_concentration(1.5)["coverage"] == 1.0
    assert not calibrated_concentration(70.0)["coverage_off"] and not calibrated_concentration(9.0)["coverage_off"]
    # the tail from 3 up: every level above 0.06, pooled beyond its margin; below 3 none above 0.06
    rates, studies = np.array(SPREAD_DATA_TEST), np.array(SPREAD_DATA_TEST_STUDIES)
    tail = np.array([low >= 3.0 for low, _ in SPREAD_LEVELS])
    pooled = (rates[tail] * studies[tail]).sum() / studies[tail].sum()
    assert (rates[tail] > 0.06).all() and pooled > 0.06 + 1.96 * np.sqrt(0.05 * 0.95 / studies[tail].sum())
    assert (rates[~tail] <= 0.06).all()
    assert data_test_spread_threshold(SPREAD_LEVELS, SPREAD_DATA_TEST, SPREAD_DATA_TEST_STUDIES) == 3.0
    # without a spread the data test is not judged; no calibration without a finite m_eff or for BCa
    assert not calibrated_concentration(2.0)["data_test_off"] and np.isnan(calibrated_concentration(2.0)["data_test"])
    assert calibrated_concentration(float("nan")) is None and calibrated_concentration(5.0, "bca") is None


def test_the_warning_reaches_the_manifest_and_the_report(tmp_path, monkeypatch):
    from anistat.finalize import finalize_bundle

    no_figures(monkeypatch)
    hot, _ = _unit(hot_scale=6.0)
    result = finalize_bundle([hot], _protocol([2]), tmp_path / "bundle")
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    warned = [w for w in manifest["warnings"] if "energy concentrated in few or heavy-tailed" in w]
    assert warned and result.manifest["warnings"] == manifest["warnings"]
    assert "energy concentrated in few or heavy-tailed" in (tmp_path / "bundle" / "report.html").read_text()
    # at about 2 effective documents the adjusted EL statistic (bounded in θ) never reaches its
    # F(1, m − 1) quantile above the estimate: the ratio to the normal control (range [0, ∞)) is
    # unbounded above, and the bundle keeps it
    ratio = result.results[(result.results["metric"] == "energy_ratio") & (result.results["control"] == "normal")]
    assert np.isinf(ratio["ci_high"].astype(float)).all() and np.isfinite(ratio["ci_low"].astype(float)).all()
