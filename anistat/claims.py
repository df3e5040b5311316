"""Claims: statements in the protocol, checked against a results table.

A claim selects rows of `results.csv` (`metric` plus a `where` filter on any result column;
a list means "any of these values"), compares their estimates with a threshold, optionally
requires the adjusted p-value to be below `alpha` (adjusted over the run or model, or — with
`stats.family: claim` — over the tests the claim itself selects), and aggregates:

* `all`  — every selected row must satisfy the comparison (and significance);
* `any`  — at least one must;
* `meta` — a random-effects meta-analysis (DerSimonian–Laird, statsmodels) of the selected
  estimates, with variances from their CIs (se = (ci_high − ci_low) / (2 z_{1−α/2})); the
  pooled estimate must satisfy the comparison and, if `alpha` is set, its CI must lie entirely
  on the claimed side of the threshold.

A claim that selects no row is never a pass: it is reported with status `error`. Failed units
(status `failed`) among the selected rows make an `all` claim fail.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from .protocol import ClaimSpec, StatsSpec
from .stats import adjust_pvalues, random_effects_meta

COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def select_rows(results: pd.DataFrame, claim: ClaimSpec) -> pd.DataFrame:
    mask = results["metric"] == claim.metric
    if "bucket" in results.columns and "bucket" not in claim.where:
        # per-frequency-bucket rows (frequency.csv) share metric names with the overall rows;
        # they are selected only when the claim names a bucket
        bucket = results["bucket"].astype(str)
        mask &= bucket.isin(["", "nan", "None", "all"])
    for column, wanted in claim.where.items():
        if column not in results.columns:
            return results.iloc[0:0]
        values = wanted if isinstance(wanted, list) else [wanted]
        mask &= _matches(results[column], values)
    return results[mask]


def _matches(column: pd.Series, values: list) -> pd.Series:
    """Rows whose value equals any of `values`: numbers compare numerically (a rank read back as
    4.0 matches 4), everything else as text."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    texts = {str(v) for v in values if v not in numbers}
    hit = column.astype(str).isin(texts | {str(v) for v in numbers})
    if numbers:
        hit |= pd.to_numeric(column, errors="coerce").isin(numbers)
    return hit


def _compare(value: float, claim: ClaimSpec) -> bool:
    if not math.isfinite(value):
        return False
    if claim.compare == "between":
        low, high = claim.threshold
        return low <= value <= high
    return bool(COMPARISONS[claim.compare](value, claim.threshold))


def _row_passes(row: pd.Series, claim: ClaimSpec) -> bool:
    if row.get("status", "ok") != "ok":
        return False
    if not _compare(float(row[claim.column]), claim):
        return False
    if claim.alpha is not None:
        p_adjusted = row.get("p_adjusted")
        if p_adjusted is None or not np.isfinite(p_adjusted) or not p_adjusted < claim.alpha:
            return False
    return True


def _evidence_row(row: pd.Series) -> dict[str, Any]:
    keys = ("model", "checkpoint", "phase", "layer", "site", "rank", "proxy", "control", "estimate", "ci_low",
            "ci_high", "effect_size", "control_mean", "p_value", "p_adjusted", "status")
    out = {}
    for key in keys:
        value = row.get(key)
        if isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (np.floating, float)):
            value = None if not np.isfinite(value) else float(value)
        elif value is pd.NA:
            value = None
        if key in ("layer", "rank") and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[key] = value
    return out


def _describe(claim: ClaimSpec) -> str:
    threshold = f"[{claim.threshold[0]}, {claim.threshold[1]}]" if claim.compare == "between" else f"{claim.threshold}"
    where = ", ".join(f"{k}={v}" for k, v in claim.where.items())
    significance = f" and p_adjusted < {claim.alpha}" if claim.alpha is not None else ""
    value = claim.metric if claim.column == "estimate" else f"{claim.metric}.{claim.column}"
    return f"{claim.aggregate}({value} {claim.compare} {threshold}{significance}) where {where or 'any row'}"


def evaluate_claim(results: pd.DataFrame, claim: ClaimSpec) -> dict[str, Any]:
    selected = select_rows(results, claim)
    record: dict[str, Any] = {"id": claim.id, "statement": claim.statement or _describe(claim),
                              "rule": _describe(claim), "n_selected": int(len(selected))}
    if selected.empty:
        return {**record, "status": "error", "passed": False,
                "evidence": {"reason": "the claim selects no result rows (check metric and where)"}}
    rows = [_evidence_row(row) for _, row in selected.iterrows()]
    estimates = selected[claim.column].astype(float)
    adjusted = selected["p_adjusted"].astype(float) if "p_adjusted" in selected else pd.Series(dtype=float)
    summary = {f"{claim.column}_min": estimates.min(), f"{claim.column}_max": estimates.max(),
               "p_adjusted_max": adjusted.max() if adjusted.notna().any() else None}
    if claim.aggregate in ("all", "any"):
        passes = [_row_passes(row, claim) for _, row in selected.iterrows()]
        passed = all(passes) if claim.aggregate == "all" else any(passes)
        failing = [_row_label(row, claim.column) for row, ok in zip(rows, passes) if not ok]
        evidence = _finite({"n_pass": int(sum(passes)), "n_rows": len(passes), **summary,
                            "failing_rows": failing[:5]})
    else:
        ok = selected[selected["status"] == "ok"]
        level = 0.95
        z = sps.norm.ppf(0.5 + level / 2)
        se = (ok["ci_high"].astype(float) - ok["ci_low"].astype(float)) / (2 * z)
        # the meta-analysis pools estimates (its variances come from their CIs), whatever `column` says
        meta = random_effects_meta(ok["estimate"].astype(float).to_numpy(), (se**2).to_numpy())
        passed = _compare(meta.estimate, claim)
        if passed and claim.alpha is not None:
            z_alpha = sps.norm.ppf(0.5 + (1 - claim.alpha) / 2)
            low, high = meta.estimate - z_alpha * meta.se, meta.estimate + z_alpha * meta.se
            passed = (_compare(low, claim) and _compare(high, claim))
        evidence = _finite({"meta_estimate": meta.estimate, "meta_ci_low": meta.ci_low, "meta_ci_high": meta.ci_high,
                            "tau2": meta.tau2, "i2": meta.i2, "k": meta.k, **summary})
    return {**record, "status": "pass" if passed else "fail", "passed": bool(passed), "evidence": evidence,
            "selected_rows": _finite(rows)}


def _row_label(row: dict[str, Any], column: str) -> str:
    """A short human-readable name for a result row, e.g. `dec step0 residual.1 k=4 normal: 0.93`."""
    parts = [str(row.get(key)) for key in ("model", "checkpoint", "site") if row.get(key) not in (None, "")]
    if row.get("rank") is not None:
        parts.append(f"k={row['rank']}")
    if row.get("control") not in (None, "", "none"):
        parts.append(str(row["control"]))
    value = row.get(column) if column in row else None
    shown = "n/a" if value is None else f"{value:.4g}"
    status = "" if row.get("status") in (None, "ok") else f" ({row['status']})"
    return " ".join(parts) + f": {shown}{status}"


def _finite(value):
    """JSON-ready evidence: plain Python numbers (6 significant digits), NaN/Inf as None."""
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def claim_table(results: pd.DataFrame, frequency: pd.DataFrame | None = None) -> pd.DataFrame:
    """What claims select from: the results plus the frequency analysis (`frequency.csv`:
    per-bucket energy ratios, `bucket` = quantile index, and the log-frequency correlations,
    `bucket` = 'all'), so a claim can state e.g. `spearman_logfreq_distance < 0`."""
    if frequency is None or frequency.empty:
        return results
    extra = frequency.copy()
    if "status" not in extra:
        extra["status"] = "ok"
    return pd.concat([results.assign(bucket="") if "bucket" not in results else results, extra], ignore_index=True)


def claim_family_adjusted(selected: pd.DataFrame, method: str) -> pd.Series:
    """`stats.family: claim`: p-values adjusted over the distinct tests one claim selects.

    Rows sharing a test share its p-value: the exact energy test of a (unit, proxy, rank) is
    behind every energy metric and control kind, ΔIsoScore* has its own, and a sign-flip test
    belongs to one control kind (counted per kind here, which can only make the correction
    stricter)."""
    def test_key(row) -> tuple:
        unit = tuple(str(row.get(column)) for column in ("model", "checkpoint", "site", "proxy", "rank", "bucket"))
        test = str(row.get("p_test", ""))
        if test == "haar_monte_carlo":
            return unit + (test, row.get("metric") == "delta_isoscore_star")
        return unit + (test, str(row.get("control")), str(row.get("metric")))

    p_values = selected["p_value"].astype(float)
    keys = [test_key(row) for _, row in selected.iterrows()]
    distinct: dict[tuple, float] = {}
    for key, value in zip(keys, p_values):
        if np.isfinite(value):
            distinct.setdefault(key, value)
    if method == "none" or not distinct:
        return p_values
    adjusted = dict(zip(distinct, adjust_pvalues(np.array(list(distinct.values())), method)))
    return pd.Series([adjusted.get(key, np.nan) for key in keys], index=selected.index)


def evaluate_claims(results: pd.DataFrame, claims: list[ClaimSpec] | tuple,
                    frequency: pd.DataFrame | None = None, *, stats: StatsSpec | None = None) -> list[dict[str, Any]]:
    """Every claim of the protocol, in order, as JSON-able records (see module docstring).

    With `stats.family == "claim"`, each claim's significance uses p-values adjusted (with
    `stats.multiplicity`) over the tests that claim selects, not over the run."""
    table = claim_table(results, frequency) if claims else results
    if stats is None or stats.family != "claim":
        return [evaluate_claim(table, claim) for claim in claims]
    records = []
    for claim in claims:
        selected = select_rows(table, claim)
        family_table = table.copy()
        family_table.loc[selected.index, "p_adjusted"] = claim_family_adjusted(selected, stats.multiplicity)
        record = evaluate_claim(family_table, claim)
        record["family"] = f"claim ({stats.multiplicity} over the {len(selected)} selected rows' tests)"
        records.append(record)
    return records
