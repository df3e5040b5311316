"""Claim words at the edges (issue #38): numbers beside a threshold never round onto or across it,
unbounded intervals are counted and shown as such, a meta claim leaves rows without a finite SE
out and says how many, and the resampling unit is named."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from anistat.claims import evaluate_claim, pool_rows
from anistat.protocol import ClaimSpec
from anistat.report.claim_text import (
    beside_threshold,
    interval_text,
    p_phrase,
    questions_for,
    resampled_noun,
    rows_summary,
)
from anistat.stats import random_effects_meta


def test_a_number_beside_its_threshold_keeps_its_side():
    # protocols/offline-replication.yaml's isotropy-after-removal: largest adjusted p 0.0495 < 0.05
    assert p_phrase(0.0495, "largest adjusted p", 0.05) == "largest adjusted p = 0.0495"
    assert p_phrase(0.0495, "largest adjusted p") == "largest adjusted p = 0.05"  # without alpha: what it was
    assert p_phrase(0.00027, "p", 0.05) == "p = 0.00027"
    assert beside_threshold(0.99996, 1.0, 4) == "0.99996" and beside_threshold(1.00004, 1.0, 4) == "1.00004"
    assert beside_threshold(0.05, 0.05) == "0.05"


def test_an_unbounded_interval_is_counted_and_shown_unbounded():
    rows = [
        {"estimate": 9.8, "ci_low": 0.0, "ci_high": None, "ci_high_infinite": True},
        {"estimate": 19.6, "ci_low": 0.0, "ci_high": 21.1},
        {"estimate": 1.77, "ci_low": 1.70, "ci_high": 1.83},
        {"estimate": 2.0, "ci_low": None, "ci_high": None},  # no interval
    ]
    summary = rows_summary(rows, ">", 1.0)
    assert (summary.n_rows, summary.n_interval, summary.n_inside, summary.n_unbounded_inside) == (4, 3, 2, 1)
    assert summary.estimate_min == 1.77
    shown = {"low": 0.0, "high": None, "high_infinite": True, "level": 0.95, "scale": "ratio scale"}
    assert interval_text(shown) == "95 % interval [0, ∞) on the ratio scale"


def test_a_claim_counts_a_row_whose_interval_is_unbounded():
    results = pd.DataFrame(
        {
            "metric": "energy_ratio",
            "model": "m",
            "checkpoint": ["a", "b", "c"],
            "estimate": [9.8, 19.6, 1.77],
            "ci_low": [0.0, 0.0, 1.70],
            "ci_high": [math.inf, 21.1, 1.83],
            "p_adjusted": 0.001,
            "p_test": "haar_monte_carlo",
            "status": "ok",
            "note": "30 documents resampled",
        }
    )
    record = evaluate_claim(results, ClaimSpec(id="c", metric="energy_ratio", threshold=1.0, alpha=0.05))
    assert "intervals of 2 of 3 rows include 1, 1 of them unbounded" in record["caveat"]
    assert record["interval"]["high"] is None and record["interval"]["high_infinite"]
    assert "the selected row with the lowest interval end" in record["interval"]["of"]
    assert "[0, ∞) on the ratio scale" in record["context"] and "smallest estimate 1.77" in record["context"]
    sequences = evaluate_claim(
        results.assign(note="96 sequences resampled"),
        ClaimSpec(id="s", metric="energy_ratio", threshold=1.0, alpha=0.05),
    )
    assert "over new sequences" in sequences["caveat"] and sequences["resampled"] == "sequences"


def test_meta_leaves_rows_without_a_finite_se_out_and_counts_them():
    rows = pd.DataFrame(
        {
            "metric": "log2_energy_ratio",
            "model": ["a", "b", "c", "d"],
            "estimate": [2.0, 2.2, 1.9, 3.3],
            "ci_low": [1.8, 2.0, 1.7, np.nan],
            "ci_high": [2.2, 2.4, 2.1, np.inf],
            "se": [0.1, 0.1, 0.1, np.inf],
            "status": "ok",
        }
    )
    claim = ClaimSpec(id="m", metric="log2_energy_ratio", threshold=1.0, alpha=0.05, aggregate="meta")
    pooled = pool_rows(rows, claim, 0.95)
    assert (
        pooled["n_rows"] == 3 and pooled["excluded"] == "1 of 4 rows left out: 1 with an unbounded interval (se = inf)"
    )
    alone = pool_rows(rows.iloc[:3], claim, 0.95)
    assert pooled["meta_estimate"] == alone["meta_estimate"] and alone["excluded"] == ""
    result = random_effects_meta([2.0, 2.2, 1.9, 3.3], [0.01, 0.01, 0.01, np.inf])
    assert result.k == 3 and result.excluded == 1


def test_the_questions_name_what_was_resampled():
    assert resampled_noun(["30 documents resampled; x", "31 documents resampled"]) == "documents"
    assert resampled_noun(["96 sequences resampled"]) == "sequences"
    assert resampled_noun(["30 documents resampled", "96 sequences resampled"]) == "documents or sequences"
    assert questions_for("sequences")["documents"].endswith("over new sequences?")
