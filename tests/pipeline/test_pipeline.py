"""End to end through the CLI, as a user runs it: bundle contract, reproducibility, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anistat.analyze import RESULT_COLUMNS


def anistat(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "anistat", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600
    )


# `mini_bundle`: the session's one MINI_PROTOCOL bundle (conftest.py), written by `python -m anistat run`.


@pytest.mark.slow
def test_bundle_contract(mini_bundle):
    for name in ("manifest.json", "results.csv", "report.html", "tables.tex", "concept_cards.json"):
        assert (mini_bundle / name).is_file(), name
    assert not list(mini_bundle.parent.glob(".bundle.*")), "staging directories left behind"
    results = pd.read_csv(mini_bundle / "results.csv")
    assert list(results.columns) == RESULT_COLUMNS
    ratios = results[results.metric == "energy_ratio"]
    # every model × checkpoint × layer × rank × control kind has an energy_ratio row
    expected = (3 * 2 + 2 * 1) * 2 * 2
    assert len(ratios) == expected
    assert set(ratios.model) == {"dec", "enc"} and set(ratios.objective) == {"clm", "mlm"}
    for column in ("p_value", "p_adjusted", "ci_low", "ci_high"):
        assert ratios[column].notna().all(), column
    assert (ratios.ci_low <= ratios.estimate).all() and (ratios.estimate <= ratios.ci_high).all()
    assert set(ratios.phase) == {"early", "late"}
    assert (results.metric == "oracle_fraction").any() and (results.metric == "delta_isoscore_star").any()
    manifest = json.loads((mini_bundle / "manifest.json").read_text())
    assert len(manifest["protocol_sha256"]) == 64
    for package in ("torch", "transformers", "numpy", "scipy", "python"):
        assert manifest["versions"][package]
    assert set(manifest["files"]) >= {"results.csv", "report.html", "tables.tex"}


@pytest.mark.slow
def test_frequency_correlations_carry_sequence_bootstrap_cis(mini_bundle):
    frequency = pd.read_csv(mini_bundle / "frequency.csv")
    correlations = frequency[frequency.metric.isin(["spearman_logfreq_distance", "pearson_logfreq_distance"])]
    assert len(correlations) == 2 * (3 * 2 + 2 * 1)  # two metrics per unit
    assert (correlations.ci_method == "normal").all() and correlations.ci_low.notna().all()
    assert (
        (-1 <= correlations.ci_low) & (correlations.ci_low < correlations.ci_high) & (correlations.ci_high <= 1)
    ).all()
    assert correlations.note.str.contains("token types").all()
    assert 'id="frequency"' in (mini_bundle / "report.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_haar_controls_capture_k_over_d(mini_bundle):
    """Closed form: a Haar k-subspace captures k/d of any gradient cloud's energy on average."""
    results = pd.read_csv(mini_bundle / "results.csv")
    haar = results[(results.metric == "energy_fraction") & (results.control == "haar")]
    assert len(haar) > 0
    expected = haar["rank"] / haar["dim"]
    standard_error = haar.control_sd / np.sqrt(haar.n_controls)
    z = (haar.control_mean - expected) / standard_error
    assert (z.abs() < 5).all(), z.abs().max()
    # pooled over every unit the deviation is tiny relative to k/d
    assert abs((haar.control_mean / expected).mean() - 1) < 0.05


@pytest.mark.slow
def test_same_protocol_same_bytes(mini_bundle, tmp_path):
    from conftest import MINI_PROTOCOL

    protocol = tmp_path / "mini.yaml"
    protocol.write_text(MINI_PROTOCOL)
    again = anistat("run", protocol, "--out", tmp_path / "again", "--quiet")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "results.csv").read_bytes() == (mini_bundle / "results.csv").read_bytes()


def test_validate_malformed_protocol_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nmodels:\n  - name: m\n    architecture: gpt2\n    hidden_size: -3\n")
    result = anistat("validate", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "models[0].hidden_size" in lines[0] and "-3" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_run_with_invalid_input_leaves_nothing(tmp_path):
    path = tmp_path / "missing-data.yaml"
    path.write_text(
        "name: x\ndata: {source: text, paths: [no-such-file.txt]}\n"
        "models: [{name: m, architecture: gpt2, hidden_size: 8, num_layers: 1, num_heads: 2}]\n"
    )
    result = anistat("run", path, "--out", tmp_path / "out")
    assert result.returncode == 2
    # relative data paths resolve against the protocol file's folder (and the message says so)
    assert result.stderr.strip().splitlines() == [
        f"anistat: error: data.paths: file not found: no-such-file.txt (relative to the protocol's folder "
        f"{tmp_path.resolve()})"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["missing-data.yaml"]


def test_init_schema_validate_round_trip(tmp_path):
    assert anistat("init", tmp_path / "p.yaml").returncode == 0
    assert anistat("init", tmp_path / "p.yaml").returncode == 2  # never overwrites silently
    result = anistat("validate", tmp_path / "p.yaml")
    assert result.returncode == 0 and "valid protocol" in result.stdout
    schema = anistat("schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"] == "anistat protocol"
