"""Claims: statements in the protocol, checked against a results table.

A claim selects rows of `results.csv` (`metric` plus a `where` filter on any result column;
a list means "any of these values"), compares their estimates with a threshold, optionally
requires the adjusted p-value to be below `alpha` (adjusted over the run or model, or — with
`stats.family: claim` — over the tests the claim itself selects), and aggregates:

* `all`  — every selected row must satisfy the comparison (and significance);
* `any`  — at least one must;
* `meta` — a random-effects meta-analysis of the selected estimates (`anistat.stats.meta`;
  settings in the claim's `meta`): REML between-unit variance and the Hartung–Knapp–Sidik–
  Jonkman interval by default. Each row's SE is its `se` column where the results carry one,
  else recovered from its CI at the run's own `stats.ci_level`
  (se = (ci_high − ci_low) / (2 z_{(1+level)/2})). Rows that share data are not independent
  studies: by default one summary per cluster (`meta.cluster`, default the model) is pooled
  (`dependence: aggregate`), or all rows with a cluster-robust CR2 variance (`robust`); only
  `independent` pools rows as if they were separate studies. The pooled estimate must satisfy
  the comparison and, if `alpha` is set, its (1 − alpha) interval must lie entirely on the
  claimed side of the threshold. The evidence says what was pooled and how dependence was
  handled.

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
from .stats import adjust_pvalues
from .stats.meta import aggregate_clusters, random_effects_meta, robust_meta

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


def evaluate_claim(results: pd.DataFrame, claim: ClaimSpec, ci_level: float = 0.95) -> dict[str, Any]:
    """One claim's record; `ci_level` is the run's `stats.ci_level` (for SEs recovered from CIs)."""
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
        try:
            pooled = pool_rows(ok, claim, ci_level)
        except ValueError as error:
            return {**record, "status": "error", "passed": False,
                    "evidence": {"reason": str(error), **_finite(summary)}, "selected_rows": _finite(rows)}
        passed = _compare(pooled["meta_estimate"], claim)
        if passed and claim.alpha is not None:
            strict = pool_rows(ok, claim, 1 - claim.alpha)
            passed = _compare(strict["meta_ci_low"], claim) and _compare(strict["meta_ci_high"], claim)
        evidence = _finite({**pooled, **summary})
    return {**record, "status": "pass" if passed else "fail", "passed": bool(passed), "evidence": evidence,
            "selected_rows": _finite(rows)}


def row_standard_errors(rows: pd.DataFrame, ci_level: float) -> tuple[np.ndarray, str]:
    """Each row's SE: the `se` column where present and finite, else its CI width over
    2 z_{(1+ci_level)/2} (the run's own CI level). Returns (se, where it came from)."""
    z = sps.norm.ppf(0.5 + ci_level / 2)
    from_ci = (rows["ci_high"].astype(float) - rows["ci_low"].astype(float)).to_numpy() / (2 * z)
    if "se" not in rows:
        return from_ci, f"CI width at level {ci_level:g}"
    se = rows["se"].astype(float).to_numpy()
    if np.isfinite(se).all():
        return se, "se column"
    return np.where(np.isfinite(se), se, from_ci), f"se column, else CI width at level {ci_level:g}"


def pool_rows(rows: pd.DataFrame, claim: ClaimSpec, ci_level: float) -> dict[str, Any]:
    """The `aggregate: meta` pooling of a claim's rows (their estimates, whatever `column` says),
    as evidence fields; ValueError when the rows cannot be pooled as asked."""
    spec = claim.meta
    se, se_source = row_standard_errors(rows, ci_level)
    y = rows["estimate"].astype(float).to_numpy()
    missing = [c for c in spec.cluster if c not in rows.columns]
    if missing:
        raise ValueError(f"meta.cluster names column(s) {missing} that the results do not have")
    clusters = rows[list(spec.cluster)].astype(str).agg("/".join, axis=1).to_numpy()
    usable = np.isfinite(y) & np.isfinite(se) & (se > 0)
    y, se, clusters = y[usable], se[usable], clusters[usable]
    if y.size == 0:
        raise ValueError("no selected row has a finite estimate and standard error to pool")
    by = "+".join(spec.cluster)
    n_clusters = len(set(clusters.tolist()))
    fields: dict[str, Any] = {"n_rows": int(y.size), "n_clusters": n_clusters, "cluster_by": by,
                              "se_source": se_source, "dependence": spec.dependence}
    if spec.dependence == "robust":
        if n_clusters < 2:
            raise ValueError(f"meta.dependence robust needs rows from at least 2 clusters ({by}); the claim selects "
                             f"{n_clusters} — use dependence: aggregate")
        result = robust_meta(y, se**2, clusters, ci_level=ci_level)
        fields.update(meta_estimate=result.estimate, meta_se=result.se, meta_ci_low=result.ci_low,
                      meta_ci_high=result.ci_high, meta_p_value=result.p_value, tau2=result.tau2, k=result.m,
                      df=result.df, method=f"robust variance estimation ({result.small_sample})",
                      pooled=(f"{y.size} rows in {n_clusters} clusters ({by}), correlated-effects working weights "
                              f"(REML tau2 of the cluster means), CR2 cluster-robust variance, t with "
                              f"{n_clusters - 1} df"))
        return fields
    if spec.dependence == "aggregate":
        y, variances, sizes, _ = aggregate_clusters(y, se**2, clusters, spec.within_correlation)
        pooled = (f"{len(y)} cluster summaries ({by}; mean of {int(sizes.min())}–{int(sizes.max())} rows each, "
                  f"within-cluster correlation {spec.within_correlation:g})")
    else:
        variances = se**2
        pooled = f"{y.size} rows treated as independent studies"
    result = random_effects_meta(y, variances, method=spec.method, ci_level=ci_level, interval=spec.interval)
    interval = result.interval if result.k > 1 else "wald (a single unit: its own interval)"
    if result.k == 1 and spec.dependence == "aggregate":
        # one independent unit: the mean of its rows is a fixed-rows estimand whose interval
        # covers this unit's data sampling only (no between-unit variance can be estimated)
        pooled += "; a single independent unit: the interval covers its data sampling, not variation across units"
    fields.update(meta_estimate=result.estimate, meta_se=result.se, meta_ci_low=result.ci_low,
                  meta_ci_high=result.ci_high, meta_p_value=result.p_value, tau2=result.tau2, i2=result.i2,
                  k=result.k, df=result.df if np.isfinite(result.df) else None, method=spec.method,
                  interval=interval, pooled=f"{pooled}; {spec.method.upper()} random effects, {interval} interval")
    return fields


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
    `stats.multiplicity`) over the tests that claim selects, not over the run. SEs recovered
    from CIs (`aggregate: meta`) use `stats.ci_level` (0.95 without `stats`)."""
    table = claim_table(results, frequency) if claims else results
    ci_level = 0.95 if stats is None else stats.ci_level
    if stats is None or stats.family != "claim":
        return [evaluate_claim(table, claim, ci_level) for claim in claims]
    records = []
    for claim in claims:
        selected = select_rows(table, claim)
        family_table = table.copy()
        family_table.loc[selected.index, "p_adjusted"] = claim_family_adjusted(selected, stats.multiplicity)
        record = evaluate_claim(family_table, claim, ci_level)
        record["family"] = f"claim ({stats.multiplicity} over the {len(selected)} selected rows' tests)"
        records.append(record)
    return records
