"""Claims, verification and replication: semantics, tamper detection, verify --against."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from anistat.claims import evaluate_claim, evaluate_claims
from anistat.comparison import compare_results
from anistat.protocol import ClaimSpec


def _results() -> pd.DataFrame:
    rows = []
    for model, objective, base in (("dec", "clm", 4.0), ("enc", "mlm", 1.2)):
        for layer in (0, 1):
            for phase, factor in (("early", 1.0), ("late", 0.5)):
                estimate = base * factor + 0.1 * layer
                rows.append(
                    {
                        "model": model,
                        "objective": objective,
                        "checkpoint": f"{phase}-ck",
                        "phase": phase,
                        "layer": layer,
                        "site": f"residual.{layer}",
                        "rank": 4,
                        "proxy": "pca",
                        "control": "normal",
                        "metric": "energy_ratio",
                        "estimate": estimate,
                        "ci_low": estimate * 0.9,
                        "ci_high": estimate * 1.1,
                        "p_value": 0.01,
                        "p_adjusted": 0.02 if model == "dec" else 0.2,
                        "effect_size": 3.0,
                        "control_mean": 1.0,
                        "status": "ok",
                    }
                )
    return pd.DataFrame(rows)


def claim(**fields) -> ClaimSpec:
    return ClaimSpec(**{"id": "c", "metric": "energy_ratio", **fields})


def test_all_any_and_significance():
    results = _results()
    assert evaluate_claim(results, claim(where={"objective": "clm"}, threshold=1.5))["passed"]
    # the encoder's late ratios (0.6, 0.7) are below 1: `all` must fail, `any` passes
    failing = evaluate_claim(results, claim(where={"objective": "mlm"}, threshold=1.0))
    assert failing["status"] == "fail" and failing["evidence"]["n_pass"] == 2
    assert evaluate_claim(results, claim(where={"objective": "mlm"}, threshold=1.0, aggregate="any"))["passed"]
    # significance: encoder p_adjusted = 0.2 never passes alpha 0.05, even where the estimate does
    assert not evaluate_claim(results, claim(where={"objective": "mlm", "phase": "early"}, threshold=1.0, alpha=0.05))[
        "passed"
    ]
    assert evaluate_claim(results, claim(where={"objective": "clm"}, threshold=1.0, alpha=0.05))["passed"]


def test_lists_between_and_columns():
    results = _results()
    assert evaluate_claim(
        results,
        claim(where={"layer": [0, 1], "model": "dec", "phase": "early"}, compare="between", threshold=[3.9, 4.2]),
    )["passed"]
    # ci_low of the decoder's late layer 0 is 1.8: a "CI entirely above 2" claim fails
    assert not evaluate_claim(results, claim(where={"model": "dec"}, column="ci_low", threshold=2.0))["passed"]
    assert evaluate_claim(results, claim(column="effect_size", threshold=2.0))["passed"]


def test_a_claim_selecting_nothing_is_an_error_not_a_pass():
    result = evaluate_claim(_results(), claim(where={"model": "no-such-model"}))
    assert result["status"] == "error" and not result["passed"]
    result = evaluate_claim(_results(), claim(where={"no_such_column": 1}))
    assert result["status"] == "error"


def test_meta_aggregate_pools_with_random_effects():
    results = _results()
    decoder = evaluate_claim(results, claim(where={"model": "dec"}, threshold=2.0, aggregate="meta", alpha=0.05))
    assert decoder["passed"]
    meta = decoder["evidence"]
    # the 4 rows of one model share its data: one summary is pooled (issue #15)
    assert meta["k"] == 1 and meta["n_rows"] == 4
    assert meta["meta_ci_low"] < meta["meta_estimate"] < meta["meta_ci_high"]
    assert not evaluate_claim(results, claim(where={"model": "enc"}, threshold=1.0, aggregate="meta", alpha=0.05))[
        "passed"
    ]


def test_failed_units_fail_all_claims():
    results = _results()
    results.loc[0, ["estimate", "status"]] = [np.nan, "failed"]
    assert not evaluate_claim(results, claim(where={"objective": "clm"}, threshold=1.5))["passed"]


def test_frequency_rows_are_claimable():
    frequency = pd.DataFrame(
        [
            {
                "model": "dec",
                "objective": "clm",
                "metric": "spearman_logfreq_distance",
                "bucket": "all",
                "estimate": -0.4,
                "p_value": 0.001,
            }
        ]
    )
    spec = ClaimSpec(id="f", metric="spearman_logfreq_distance", where={"objective": "clm"}, compare="<", threshold=0.0)
    assert evaluate_claims(_results(), [spec], frequency)[0]["passed"]


def test_compare_results_agreement():
    original = _results()
    replication = original.copy()
    replication["estimate"] *= 1.05
    replication.loc[0, "estimate"] = 0.5  # one sign flip (below the null ratio 1)
    comparison = compare_results(original, replication, tolerance=0.1)
    assert len(comparison) == len(original)
    assert comparison["sign_agrees"].sum() == len(original) - 1
    assert comparison["within_tolerance"].sum() == len(original) - 1
    assert np.allclose(comparison["difference"].iloc[1:], 0.05 * original["estimate"].iloc[1:])


# --------------------------------------------------------------------------------------------
# end to end
# --------------------------------------------------------------------------------------------
CLAIMS = """
claims:
  - id: decoder-energy
    statement: the decoder's proxies capture more than its controls
    metric: energy_ratio
    where: {objective: clm}
    compare: ">"
    threshold: 0.0
  - id: impossible
    statement: a claim that must fail
    metric: energy_fraction
    where: {objective: clm}
    compare: ">"
    threshold: 1.0
"""


def anistat(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "anistat", *map(str, args)], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def claimed_bundle(tmp_path_factory):
    from conftest import MINI_PROTOCOL

    root = tmp_path_factory.mktemp("claims")
    protocol = root / "claims.yaml"
    protocol.write_text(MINI_PROTOCOL + CLAIMS)
    result = anistat("run", protocol, "--out", root / "bundle", "--quiet")
    assert result.returncode == 1, result.stderr  # one claim fails by design
    return protocol, root / "bundle"


@pytest.mark.slow
def test_claims_json_and_verify(claimed_bundle):
    _, bundle = claimed_bundle
    claims = json.loads((bundle / "claims.json").read_text())
    assert [c["status"] for c in claims] == ["pass", "fail"]
    result = anistat("verify", bundle)
    assert result.returncode == 1
    assert "integrity: all" in result.stdout and "claim impossible: FAIL" in result.stdout


@pytest.mark.slow
def test_tampered_results_are_detected(claimed_bundle, tmp_path):
    import shutil

    _, bundle = claimed_bundle
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    text = (copy / "results.csv").read_text()
    (copy / "results.csv").write_text(text.replace(",energy_ratio,", ",energy_ratio,", 1) + "\n")
    result = anistat("verify", copy)
    assert result.returncode == 3
    assert "results.csv: modified" in result.stdout


@pytest.mark.slow
def test_verify_against_reruns_and_agrees(claimed_bundle, tmp_path):
    protocol, bundle = claimed_bundle
    result = anistat("verify", protocol, "--against", bundle, "--out", tmp_path / "rerun", "--quiet")
    # the failing claim fails again, so the replication "fails" the claim but agrees with the original
    assert "claim decoder-energy: original PASS, replication PASS — agree" in result.stdout
    assert "claim impossible: original FAIL, replication FAIL — agree" in result.stdout
    comparison = pd.read_csv(tmp_path / "rerun-comparison" / "comparison.csv")
    # same protocol, same seed, same machine: identical numbers
    assert comparison["difference"].abs().max() == 0
    assert comparison["sign_agrees"].all()
    html = (tmp_path / "rerun-comparison" / "comparison.html").read_text()
    assert "Replication report" in html and "<script" not in html


def test_bucket_rows_are_selected_only_when_named():
    frequency = pd.DataFrame(
        [
            {
                "model": "dec",
                "objective": "clm",
                "metric": "energy_ratio",
                "bucket": "0",
                "estimate": 0.5,
                "p_value": 0.5,
                "rank": 4,
                "control": "normal",
            }
        ]
    )
    overall = ClaimSpec(id="o", metric="energy_ratio", where={"objective": "clm"}, threshold=1.0)
    rare = ClaimSpec(id="r", metric="energy_ratio", where={"objective": "clm", "bucket": "0"}, threshold=1.0)
    first, second = evaluate_claims(_results(), [overall, rare], frequency)
    assert first["passed"] and first["n_selected"] == 4
    assert not second["passed"] and second["n_selected"] == 1


def test_claim_family_adjusts_over_the_claims_own_tests():
    from anistat.protocol import StatsSpec

    results = _results().assign(p_test="haar_monte_carlo")
    # raw p 0.01 for the 4 decoder rows: Holm over the claim's own 4 tests gives 0.04 (< 0.05),
    # while the run-wide p_adjusted of the encoder rows (0.2) would fail the encoder claim
    results.loc[results["model"] == "enc", "p_value"] = 0.012
    spec = claim(where={"objective": "mlm"}, threshold=1.0, alpha=0.05, aggregate="any")
    run_family = evaluate_claims(results, [spec], stats=StatsSpec(family="run", multiplicity="holm"))[0]
    claim_family = evaluate_claims(results, [spec], stats=StatsSpec(family="claim", multiplicity="holm"))[0]
    assert not run_family["passed"] and "family" not in run_family
    assert claim_family["passed"] and claim_family["family"].startswith("claim (holm")
    assert claim_family["evidence"]["p_adjusted_max"] == pytest.approx(4 * 0.012)
    # rows sharing one exact test (every energy metric of a unit x proxy x rank) count once
    doubled = pd.concat([results, results.assign(metric="energy_fraction")], ignore_index=True)
    again = evaluate_claims(doubled, [spec], stats=StatsSpec(family="claim", multiplicity="holm"))[0]
    assert again["evidence"]["p_adjusted_max"] == pytest.approx(4 * 0.012)
