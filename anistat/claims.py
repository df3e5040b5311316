"""Claims: statements in the protocol, checked against a results table.

A claim selects rows of `results.csv` (`metric` plus a `where` filter on any result column;
a list means "any of these values"), compares their estimates with a threshold, optionally
requires the adjusted p-value to be below `alpha` (adjusted over the run or model, or — with
`stats.family: claim` — over the tests the claim itself selects), and aggregates:

* `all`  — every selected row must satisfy the comparison (and significance);
* `any`  — at least one must;
* `meta` — a random-effects meta-analysis of the selected estimates (`anistat.stats.meta`;
  settings in the claim's `meta`): REML between-unit variance and the Hartung–Knapp–Sidik–
  Jonkman interval with the Knapp–Hartung safeguard (scale factor max(1, s)) by default. Each
  row's SE is its `se` column where the results carry one (the interval-implied SE,
  `anistat.stats.interval_se`, so the same weights either way), else recovered from its CI at the
  run's own `stats.ci_level` (se = (ci_high − ci_low) / (2 z_{(1+level)/2})). Ratio metrics
  (`energy_ratio`) are pooled on the log scale (ln R; the threshold becomes ln threshold) and
  reported back as ratios. Rows that share data are not independent studies: by default one
  summary per cluster (`meta.cluster`, default the model) is pooled (`dependence: aggregate`),
  or all rows with a cluster-robust CR2 variance (`robust`); only `independent` pools rows as if
  they were separate studies. With `alpha` the pooled (1 − alpha) interval decides: it must lie
  entirely on the claimed side of the threshold, which is exactly "the p-value against the
  threshold is below alpha" (`p_value` in the record; two-sided, TOST for `between`). Without
  `alpha` only the pooled point estimate is compared — the record says so (`decided_by`).

What decides (`decided_by`): the `interval` (a `ci_low`/`ci_high` column, or a meta claim's
pooled interval), the `test` (each row's `p_adjusted` < alpha, its estimate on the claimed side),
or the `point estimate` alone. Shipped protocols state every "more than" / "less than" claim on
an interval or a test (tests/claims/test_claims_decision.py checks them). Each record carries the `rule` in
words, the `interval` shown beside the verdict, the `p_value` with what it tests, and on a FAIL
the criteria that failed (`failed`).

A claim that selects no row is never a pass: it is reported with status `error`. Failed units
(status `failed`) among the selected rows make an `all` claim fail.

Which question a claim answers
------------------------------
Two questions are asked of a proxy, and each record names the one(s) its verdict answers
(``answers``, ``question``; `anistat.report.claim_text.QUESTIONS`):

* "is this proxy special among random subspaces on these data?" — the exact test against
  uniformly random (Haar) subspaces, conditional on the measured gradients (`alpha` on a row
  estimate: ``decided_by: test``);
* "would its ratio stay above the threshold over new documents?" — the interval over documents
  (`column: ci_low` / `ci_high`, or a meta claim with `alpha`:
  ``decided_by: interval``). A claim with both `column: ci_low` and `alpha` answers both.

The default for a threshold claim (`compare`, `threshold`, `alpha`, and the default
`column: estimate`) is the first question, for four reasons. (1) It is the paper's question:
does the activation-derived subspace capture more gradient energy than a random subspace of the
same rank? (2) The exact test is exact at every sample size — P(p ≤ a) ≤ a for an uninformative
proxy whatever the gradients' anisotropy (measured: 0.0524 ± 0.0018 at α = 0.05 over 16,000
tests) — while the bootstrap interval's coverage is asymptotic in the number of documents and
needs at least 10 of them. (3) Its p-values are what the run adjusts for multiplicity, so a
claim over many rows keeps the run's error rate. (4) The two agree in direction: the ratio
against normal controls exceeds 1 exactly when E(U) > k/d, as against Haar; they differ in
their source of randomness (random subspaces vs. new documents), not in what "more" means. A
researcher who needs the ratio to hold over new documents states `column: ci_low`. The record
says which question was answered (``decision``), labels an interval of the other estimand as
``context`` (``interval_role``), and a PASS by the exact test whose rows' intervals include the
threshold says so (``caveat``).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from ._columns import RESULT_KEYS
from .protocol import ClaimSpec, StatsSpec
from .report.claim_text import claim_reading, resampled_noun, scale_name, shown_row_words
from .stats import adjust_pvalues
from .stats.meta import MetaResult, RobustMetaResult, aggregate_clusters, random_effects_meta, robust_meta

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


def _evidence_row(row: pd.Series) -> dict[str, Any]:
    keys = (
        *(key for key in RESULT_KEYS if key not in ("objective", "step", "dim", "metric")),
        "estimate",
        "ci_low",
        "ci_high",
        "effect_size",
        "control_mean",
        "p_value",
        "p_adjusted",
        "p_test",
        "status",
    )
    out = {}
    for key in keys:
        value = row.get(key)
        if isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (np.floating, float)):
            value = None if not np.isfinite(value) else float(value)
        elif value is pd.NA:
            value = None
        if key == "p_test" and value is not None and not isinstance(value, str):
            value = None  # a table without the column, or NaN read back from a CSV
        if key in ("layer", "rank") and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[key] = value
    return _mark_infinite(out, row, ("ci_low", "ci_high"))


def _mark_infinite(out: dict[str, Any], source, keys: tuple[str, ...]) -> dict[str, Any]:
    """``out`` with ``<key>_infinite: true`` beside each end of ``source`` that is infinite (JSON
    writes it as null; the flag keeps "unbounded" apart from "missing",
    `anistat.report.claim_text.interval_ends`)."""
    for key in keys:
        try:
            value = float(source.get(key))
        except (TypeError, ValueError):
            continue
        if math.isinf(value):
            out[f"{key}_infinite"] = True
    return out


#: Metrics that are ratios: `aggregate: meta` pools them on the log scale (ln R, SE = se/R by the
#: delta method, or the CI's width on the log scale) and compares ln(threshold); the pooled
#: estimate and interval are reported back on the ratio scale.
RATIO_METRICS = frozenset({"energy_ratio"})
#: What each value of `p_test` tests (the row's p-value that `alpha` thresholds in all/any claims).
P_TEST_NULLS = {
    "haar_monte_carlo": "exact Haar Monte-Carlo test of 'the proxy is no better than a uniformly random subspace'",
    "bootstrap_t": "studentized bootstrap test of 'the proxy's population energy ratio is 1'",
    "sign_flip": "sign-flip test of 'the per-unit contributions are symmetric about 0'",
}


def _threshold_text(claim: ClaimSpec) -> str:
    return f"[{claim.threshold[0]:g}, {claim.threshold[1]:g}]" if claim.compare == "between" else f"{claim.threshold:g}"


def _side_text(claim: ClaimSpec) -> str:
    """How an interval must sit for the claim: "above 1", "inside [0, 1]" …"""
    return {">": "above", ">=": "at or above", "<": "below", "<=": "at or below", "between": "inside"}[
        claim.compare
    ] + f" {_threshold_text(claim)}"


def decided_by(claim: ClaimSpec) -> str:
    """What decides the claim: ``interval`` (a CI bound, or the pooled interval), ``test`` (each
    row's adjusted p-value, with its estimate on the claimed side) or ``point estimate`` (nothing
    that carries the data's uncertainty — a claim that says more than its data)."""
    if claim.aggregate == "meta":
        return "interval" if claim.alpha is not None else "point estimate"
    if claim.column in ("ci_low", "ci_high"):
        return "interval" if claim.alpha is None else "interval and test"
    return "test" if claim.alpha is not None else "point estimate"


def _describe(claim: ClaimSpec, ci_level: float = 0.95) -> str:
    """The claim's rule in words: what is compared and what decides."""
    where = ", ".join(f"{k}={v}" for k, v in claim.where.items()) or "any row"
    value = claim.metric if claim.column == "estimate" else f"{claim.metric}.{claim.column}"
    rule = f"{claim.compare} {_threshold_text(claim)}"
    if claim.aggregate == "meta":
        scale = " (pooled on the log scale)" if claim.metric in RATIO_METRICS else ""
        head = f"meta: pooled {claim.metric}{scale} {rule}"
        if claim.alpha is None:
            return f"{head}, decided by the pooled point estimate alone (no alpha: no interval decides) where {where}"
        return (
            f"{head}: the pooled {(1 - claim.alpha) * 100:g} % interval lies entirely {_side_text(claim)} "
            f"(equivalently: p against the threshold < {claim.alpha:g}) where {where}"
        )
    quantifier = "every selected row" if claim.aggregate == "all" else "at least one selected row"
    parts = [f"{value} {rule}"]
    if claim.alpha is not None:
        parts.append(f"p_adjusted < {claim.alpha:g} (the row's own test)")
    if claim.column in ("ci_low", "ci_high"):
        bound = "lower" if claim.column == "ci_low" else "upper"
        deciding = f"decided by the {bound} bound of each row's {ci_level * 100:g} % interval"
    elif claim.alpha is not None:
        deciding = "decided by each row's test (and the estimate's side of the threshold)"
    else:
        deciding = "decided by point estimates alone (no alpha, no interval)"
    return f"{claim.aggregate}: {quantifier} has {' and '.join(parts)}, {deciding}; where {where}"


def _row_value(row: pd.Series, column: str) -> float:
    value = row.get(column)
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _failing_criteria(row: pd.Series, claim: ClaimSpec) -> list[str]:
    """Which of a row's criteria fail (empty: the row passes)."""
    if row.get("status", "ok") != "ok":
        return ["unit failed"]
    out = []
    if not _compare(_row_value(row, claim.column), claim):
        out.append(f"{claim.column} not {claim.compare} {_threshold_text(claim)}")
    if claim.alpha is not None:
        p_adjusted = _row_value(row, "p_adjusted")
        if not (np.isfinite(p_adjusted) and p_adjusted < claim.alpha):
            out.append(f"p_adjusted not < {claim.alpha:g}")
    return out


def evaluate_claim(results: pd.DataFrame, claim: ClaimSpec, ci_level: float = 0.95) -> dict[str, Any]:
    """One claim's record; `ci_level` is the run's `stats.ci_level` (the level of the rows' CIs).

    Besides ``status``/``passed`` the record says what decided it (``decided_by``, ``rule``), the
    interval shown beside the verdict (``interval``: the pooled interval of a meta claim; of an
    all/any claim the CI of the selected row with the lowest interval end — nearest the threshold
    on its claimed side — with its ``scale``), the p-value and what it tests (``p_value``:
    against the claim's own threshold for meta claims) and, on a FAIL, which criteria failed
    (``failed``). The same record is written to claims.json and printed by `verify --json`."""
    selected = select_rows(results, claim)
    record: dict[str, Any] = {
        "id": claim.id,
        "statement": claim.statement or _describe(claim, ci_level),
        "rule": _describe(claim, ci_level),
        "decided_by": decided_by(claim),
        "n_selected": int(len(selected)),
        "resampled": resampled_noun(selected["note"] if "note" in selected else ()),
    }
    if selected.empty:
        reason = "the claim selects no result rows (check metric and where)"
        return _with_reading(
            {
                **record,
                "status": "error",
                "passed": False,
                "interval": None,
                "p_value": None,
                "failed": [reason],
                "evidence": {"reason": reason},
            },
            claim,
        )
    rows = [_evidence_row(row) for _, row in selected.iterrows()]
    estimates = selected[claim.column].astype(float)
    adjusted = selected["p_adjusted"].astype(float) if "p_adjusted" in selected else pd.Series(dtype=float)
    summary = {
        f"{claim.column}_min": estimates.min(),
        f"{claim.column}_max": estimates.max(),
        "p_adjusted_max": adjusted.max() if adjusted.notna().any() else None,
    }
    if claim.aggregate in ("all", "any"):
        outcome = _rows_outcome(selected, rows, claim, ci_level)
        evidence = _finite({**outcome.pop("evidence"), **summary})
    else:
        ok = selected[selected["status"] == "ok"]
        level = 1 - claim.alpha if claim.alpha is not None else ci_level
        try:
            pooled = pool_rows(ok, claim, ci_level, level=level)
        except ValueError as error:
            return _with_reading(
                {
                    **record,
                    "status": "error",
                    "passed": False,
                    "interval": None,
                    "p_value": None,
                    "failed": [str(error)],
                    "evidence": {"reason": str(error), **_finite(summary)},
                    "selected_rows": _finite(rows),
                },
                claim,
            )
        outcome = _meta_outcome(pooled, claim)
        evidence = _finite({**pooled, **summary})
    passed = not outcome["failed"]
    return _with_reading(
        {
            **record,
            "status": "pass" if passed else "fail",
            "passed": passed,
            **_finite(outcome),
            "evidence": evidence,
            "selected_rows": _finite(rows),
        },
        claim,
    )


def _with_reading(record: dict[str, Any], claim: ClaimSpec) -> dict[str, Any]:
    """The record with its words added (`anistat.report.claim_text.claim_reading`): ``answers``,
    ``question``, ``decision``, ``interval_role``, ``context`` and ``caveat``."""
    terms = {
        "metric": claim.metric,
        "column": claim.column,
        "compare": claim.compare,
        "threshold": claim.threshold,
        "aggregate": claim.aggregate,
        "alpha": claim.alpha,
    }
    return {**record, **claim_reading(record, terms)}


def _rows_outcome(selected: pd.DataFrame, rows: list[dict], claim: ClaimSpec, ci_level: float) -> dict[str, Any]:
    """all/any: per-row criteria, the weakest (all) or best (any) row's interval, the p-value."""
    criteria = [_failing_criteria(row, claim) for _, row in selected.iterrows()]
    passes = [not c for c in criteria]
    failing = [(label, c) for label, c in zip((_row_label(r, claim.column) for r in rows), criteria) if c]
    failed: list[str] = []
    if claim.aggregate == "all" and failing:
        counts: dict[str, int] = {}
        for _label, reasons in failing:
            for reason in reasons:
                counts[reason] = counts.get(reason, 0) + 1
        failed = [f"{n} of {len(rows)} rows: {reason}" for reason, n in counts.items()]
    elif claim.aggregate == "any" and not any(passes):
        failed = [f"none of the {len(rows)} rows passes"]
    ok_mask = (selected["status"] == "ok") if "status" in selected else pd.Series(True, index=selected.index)
    ok = selected[ok_mask]
    strongest = claim.aggregate == "any"
    candidates = selected[ok_mask & pd.Series(passes, index=selected.index)] if strongest and any(passes) else ok
    shown = _shown_row(candidates, claim, strongest=strongest)
    interval = None
    if shown is not None:
        which = shown_row_words(claim.compare, strongest, "passing" if strongest and any(passes) else "selected")
        interval = _mark_infinite(
            {
                "low": _row_value(shown, "ci_low"),
                "high": _row_value(shown, "ci_high"),
                "level": ci_level,
                "estimate": _row_value(shown, "estimate"),
                "scale": scale_name(claim.metric),
                "of": f"{claim.metric} of {which}: {_row_label(_evidence_row(shown), 'estimate')}",
            },
            {"low": _row_value(shown, "ci_low"), "high": _row_value(shown, "ci_high")},
            ("low", "high"),
        )
    p_value = None
    p_rows = ok["p_adjusted"].astype(float) if "p_adjusted" in ok else pd.Series(dtype=float)
    if p_rows.notna().any():
        tests = sorted({str(t) for t in ok.get("p_test", pd.Series(dtype=str)) if str(t) not in ("", "nan")})
        what = "; ".join(P_TEST_NULLS.get(t, t) for t in tests) or "the rows' own test"
        value = p_rows.max() if claim.aggregate == "all" else p_rows.min()
        p_value = {
            "value": float(value),
            "of": f"{'largest' if claim.aggregate == 'all' else 'smallest'} p_adjusted "
            f"of the selected rows ({what}; not a test of the threshold "
            f"{_threshold_text(claim)})",
        }
    evidence = {
        "n_pass": int(sum(passes)),
        "n_rows": len(passes),
        "failing_rows": [f"{label} ({'; '.join(reasons)})" for label, reasons in failing[:5]],
    }
    return {"interval": interval, "p_value": p_value, "failed": failed, "evidence": evidence}


def _shown_row(rows: pd.DataFrame, claim: ClaimSpec, strongest: bool = False) -> pd.Series | None:
    """The row whose interval is shown beside the verdict: the one whose interval is least on the
    claimed side (lowest lower bound for > / >=, highest upper bound for < / <=, the bound
    nearest an edge for between) — or, with ``strongest`` (an `any` claim), most on it. An
    unbounded interval (an infinite end) is an interval; rows without a CI (a NaN end) are
    skipped; None when no row has one."""
    if rows.empty or not {"ci_low", "ci_high"} <= set(rows.columns):
        return None
    low, high = rows["ci_low"].astype(float), rows["ci_high"].astype(float)
    present = low.notna() & high.notna()
    if not present.any():
        return None
    low, high = low[present], high[present]
    if claim.compare in (">", ">="):
        margin = low - claim.threshold
    elif claim.compare in ("<", "<="):
        margin = claim.threshold - high
    else:
        margin = pd.concat([low - claim.threshold[0], claim.threshold[1] - high], axis=1).min(axis=1)
    return rows.loc[margin.idxmax() if strongest else margin.idxmin()]


def _meta_outcome(pooled: dict[str, Any], claim: ClaimSpec) -> dict[str, Any]:
    """meta: the pooled interval decides when alpha is set, the pooled estimate alone otherwise."""
    estimate, low, high = pooled["meta_estimate"], pooled["meta_ci_low"], pooled["meta_ci_high"]
    interval = {
        "low": low,
        "high": high,
        "level": pooled["meta_ci_level"],
        "estimate": estimate,
        "scale": scale_name(claim.metric),
        "of": f"pooled {claim.metric} ({pooled['interval']}, {pooled['method']})",
    }
    p_value = {"value": pooled["p_vs_threshold"], "of": pooled["p_null"]}
    failed = []
    if not _compare(estimate, claim):
        failed.append(f"the pooled estimate {estimate:.4g} is not {claim.compare} {_threshold_text(claim)}")
    if claim.alpha is not None and not (_compare(low, claim) and _compare(high, claim)):
        failed.append(
            f"the pooled {pooled['meta_ci_level'] * 100:g} % interval [{low:.4g}, {high:.4g}] does not lie "
            f"entirely {_side_text(claim)}"
        )
    return {"interval": interval, "p_value": p_value, "failed": failed}


def row_standard_errors(rows: pd.DataFrame, ci_level: float, log_scale: bool = False) -> tuple[np.ndarray, str]:
    """Each row's SE: the `se` column where present and not NaN, else its CI width over
    2 z_{(1+ci_level)/2} (the run's own CI level). Returns (se, where it came from).

    ``log_scale``: the SE of ln(estimate) — the `se` column over the estimate (delta method), else
    the CI's width on the log scale, (ln ci_high − ln ci_low) / (2 z). An unbounded interval
    gives ``inf`` either way (`se = inf` in the column, an infinite end, or a lower end at 0 on the
    log scale): such a row has no finite weight and :func:`pool_rows` leaves it out, counted."""
    z = sps.norm.ppf(0.5 + ci_level / 2)
    low, high = rows["ci_low"].astype(float).to_numpy(), rows["ci_high"].astype(float).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        from_ci = (np.log(high) - np.log(np.maximum(low, 0.0))) / (2 * z) if log_scale else (high - low) / (2 * z)
    ci_text = f"CI width{' on the log scale' if log_scale else ''} at level {ci_level:g}"
    if "se" not in rows:
        return from_ci, ci_text
    se = rows["se"].astype(float).to_numpy()
    if log_scale:
        with np.errstate(divide="ignore", invalid="ignore"):
            se = se / rows["estimate"].astype(float).to_numpy()
    column = "se column" + (" / estimate (delta method)" if log_scale else "")
    if not np.isnan(se).any():
        return se, column
    return np.where(np.isnan(se), from_ci, se), f"{column}, else {ci_text}"


def p_against_threshold(estimate: float, se: float, df: float, claim: ClaimSpec, transform=lambda v: v) -> float:
    """The p-value of the claim's own threshold, on the pooling scale (``transform`` maps the
    threshold there, e.g. ``math.log`` for ratio metrics): two-sided for > / >= / < / <=, so
    that ``p < alpha`` exactly when the pooled (1 − alpha) interval excludes the threshold;
    for ``between`` twice the larger of the two one-sided p-values (TOST at alpha/2 per side),
    so that ``p < alpha`` exactly when the interval lies inside. t with ``df`` degrees of
    freedom (normal when infinite)."""
    law = sps.norm if not np.isfinite(df) else sps.t(df)
    if not (np.isfinite(estimate) and np.isfinite(se) and se > 0):
        return float("nan")
    if claim.compare == "between":
        low, high = (transform(v) for v in claim.threshold)
        return float(min(1.0, 2 * max(law.sf((estimate - low) / se), law.sf((high - estimate) / se))))
    return float(min(1.0, 2 * law.sf(abs(estimate - transform(claim.threshold)) / se)))


def pool_rows(rows: pd.DataFrame, claim: ClaimSpec, ci_level: float, level: float | None = None) -> dict[str, Any]:
    """The `aggregate: meta` pooling of a claim's rows (their estimates, whatever `column` says),
    as evidence fields; ValueError when the rows cannot be pooled as asked.

    ``ci_level`` is the level of the rows' own CIs (SEs recovered from them); ``level`` that of the
    pooled interval (default ``ci_level``; a claim with ``alpha`` uses 1 − alpha, the interval
    that decides). Ratio metrics (:data:`RATIO_METRICS`) pool ln R and are reported back on the
    ratio scale (``scale``); ``p_vs_threshold`` tests the claim's own threshold on the pooling
    scale (:func:`p_against_threshold`)."""
    spec = claim.meta
    level = ci_level if level is None else level
    log_scale = claim.metric in RATIO_METRICS
    y, se, clusters, se_source, excluded = _pooling_units(rows, claim, ci_level, log_scale)
    by = "+".join(spec.cluster)
    n_clusters = len(set(clusters.tolist()))
    back = np.exp if log_scale else (lambda v: v)
    transform = math.log if log_scale else (lambda v: v)
    fields: dict[str, Any] = {
        "n_rows": int(y.size),
        "n_clusters": n_clusters,
        "cluster_by": by,
        "se_source": se_source,
        "n_selected_rows": int(len(rows)),
        "excluded": excluded.removeprefix("; "),
        "dependence": spec.dependence,
        "scale": f"log (ln {claim.metric}; estimate and interval shown as ratios)" if log_scale else "the metric's own",
    }
    if spec.dependence == "robust":
        fields.update(_robust_fields(y, se, clusters, by, n_clusters, claim, level, log_scale, back, transform))
        return fields
    if spec.dependence == "aggregate":
        y, variances, sizes, _ = aggregate_clusters(y, se**2, clusters, spec.within_correlation)
        pooled = (
            f"{len(y)} cluster summaries ({by}; mean of {int(sizes.min())}–{int(sizes.max())} rows each, "
            f"within-cluster correlation {spec.within_correlation:g})"
        )
    else:
        variances = se**2
        pooled = f"{y.size} rows treated as independent studies"
    result = random_effects_meta(y, variances, method=spec.method, ci_level=level, interval=spec.interval)
    safeguard = {}
    if result.k == 1:
        interval = "wald (a single unit: its own interval)"
    elif result.interval == "hksj":
        interval = "hksj (Knapp–Hartung safeguard)"
        safeguard = {
            "hksj_scale": result.hksj_scale,
            "hksj_safeguard": (
                "scale factor max(1, s) = 1: raised, so the SE is the Wald SE (with the t quantile)"
                if result.safeguard_applied
                else "scale factor max(1, s) = s: not needed"
            ),
        }
    else:
        interval = result.interval
    if result.k == 1 and spec.dependence == "aggregate":
        # one independent unit: the mean of its rows is a fixed-rows estimand whose interval
        # covers this unit's data sampling only (no between-unit variance can be estimated)
        pooled += "; a single independent unit: the interval covers its data sampling, not variation across units"
    fields.update(
        **_pooled_fields(result, claim, level, log_scale, back, transform),
        i2=result.i2,
        k=result.k,
        df=result.df if np.isfinite(result.df) else None,
        method=spec.method,
        interval=interval,
        **safeguard,
        pooled=f"{pooled}; {spec.method.upper()} random effects, {interval} interval",
    )
    return fields


def _pooling_units(
    rows: pd.DataFrame, claim: ClaimSpec, ci_level: float, log_scale: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, str]:
    """The rows to pool: estimates (ln R for a ratio metric), their SEs recovered from the rows'
    CIs, and cluster labels, keeping the rows with a finite estimate and a positive finite SE;
    also the SEs' source and the counted note of the rows left out (:func:`excluded_rows_note`).
    ValueError when the clusters or the threshold do not fit, or no row is left."""
    spec = claim.meta
    se, se_source = row_standard_errors(rows, ci_level, log_scale)
    y = rows["estimate"].astype(float).to_numpy()
    missing = [c for c in spec.cluster if c not in rows.columns]
    if missing:
        raise ValueError(f"meta.cluster names column(s) {missing} that the results do not have")
    if log_scale:
        thresholds = claim.threshold if isinstance(claim.threshold, list) else [claim.threshold]
        if min(thresholds) <= 0:
            raise ValueError(
                f"{claim.metric} is a ratio, pooled on the log scale: its threshold must be positive, "
                f"got {_threshold_text(claim)}"
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(y > 0, np.log(np.where(y > 0, y, 1.0)), np.nan)
    clusters = rows[list(spec.cluster)].astype(str).agg("/".join, axis=1).to_numpy()
    usable = np.isfinite(y) & np.isfinite(se) & (se > 0)
    excluded = excluded_rows_note(int(np.sum(np.isfinite(y) & np.isinf(se))), int(np.sum(~usable)), len(usable))
    y, se, clusters = y[usable], se[usable], clusters[usable]
    if y.size == 0:
        raise ValueError("no selected row has a finite estimate and standard error to pool" + excluded)
    return y, se, clusters, se_source, excluded


def excluded_rows_note(unbounded: int, excluded: int, selected: int) -> str:
    """ "" when every row is pooled; else "; k of n rows left out: u with an unbounded interval
    (se = inf), the others without a finite estimate or SE" — the counted note on the claim."""
    if not excluded:
        return ""
    parts = [f"{unbounded} with an unbounded interval (se = inf)"] if unbounded else []
    if excluded > unbounded:
        parts.append(f"{excluded - unbounded} without a finite estimate or SE")
    return f"; {excluded} of {selected} rows left out: {', '.join(parts)}"


def _robust_fields(
    y, se, clusters, by: str, n_clusters: int, claim: ClaimSpec, level: float, log_scale: bool, back, transform
) -> dict[str, Any]:
    """The evidence fields of ``dependence: robust``: robust variance estimation over the clusters
    (:func:`robust_meta`), its estimate and interval mapped back by ``back``; ValueError with
    fewer than 2 clusters."""
    if n_clusters < 2:
        raise ValueError(
            f"meta.dependence robust needs rows from at least 2 clusters ({by}); the claim selects "
            f"{n_clusters} — use dependence: aggregate"
        )
    result = robust_meta(y, se**2, clusters, ci_level=level)
    return dict(
        **_pooled_fields(result, claim, level, log_scale, back, transform),
        k=result.m,
        df=result.df,
        method=f"robust variance estimation ({result.small_sample})",
        interval=f"t with {n_clusters - 1} df, CR2",
        pooled=(
            f"{y.size} rows in {n_clusters} clusters ({by}), correlated-effects working weights "
            f"(REML tau2 of the cluster means), CR2 cluster-robust variance, t with "
            f"{n_clusters - 1} df"
        ),
    )


def _pooled_fields(
    result: MetaResult | RobustMetaResult, claim: ClaimSpec, level: float, log_scale: bool, back, transform
) -> dict[str, Any]:
    """The evidence fields every pooling gives: the pooled estimate and its ``level`` interval
    mapped back by ``back`` (``exp`` for a ratio pooled as ``ln R``), its SE on the pooled scale,
    ``tau2``, and the p-value of the threshold test (:func:`p_against_threshold`) with its
    wording. ``result`` is a :class:`MetaResult` or a :class:`RobustMetaResult`."""
    return dict(
        meta_estimate=float(back(result.estimate)),
        meta_se=result.se,
        meta_ci_low=float(back(result.ci_low)),
        meta_ci_high=float(back(result.ci_high)),
        meta_ci_level=level,
        p_vs_threshold=p_against_threshold(result.estimate, result.se, result.df, claim, transform),
        p_null=_null_text(claim, log_scale, result.df),
        tau2=result.tau2,
    )


def _null_text(claim: ClaimSpec, log_scale: bool, df: float) -> str:
    """What ``p_vs_threshold`` tests, in words."""
    quantity = f"ln pooled {claim.metric}" if log_scale else f"pooled {claim.metric}"
    law = f"t with {df:g} df" if np.isfinite(df) else "normal"
    if claim.compare == "between":
        low, high = claim.threshold
        edges = f"ln {low:g} or ln {high:g}" if log_scale else f"{low:g} or {high:g}"
        return (
            f"H0: {quantity} at or outside {edges} (twice the larger one-sided p, TOST; {law}); "
            f"< alpha exactly when the pooled interval lies inside"
        )
    threshold = f"ln {claim.threshold:g}" if log_scale else f"{claim.threshold:g}"
    return (
        f"H0: {quantity} = {threshold} (two-sided, {law}); < alpha exactly when the pooled "
        f"(1 − alpha) interval excludes the threshold"
    )


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


def evaluate_claims(
    results: pd.DataFrame,
    claims: list[ClaimSpec] | tuple,
    frequency: pd.DataFrame | None = None,
    *,
    stats: StatsSpec | None = None,
) -> list[dict[str, Any]]:
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


def compare_claims(original: list[dict], other: list[dict]) -> list[dict[str, Any]]:
    """Claim records matched by id (the original's order, then claims only the other has):
    ``id``, ``statement``, ``original`` and ``replication`` status ("missing" where a bundle has
    no such claim) and ``agree`` (the same status)."""
    by_id = [{str(c.get("id")): c for c in records} for records in (original, other)]
    rows = []
    for claim_id in [*by_id[0], *(i for i in by_id[1] if i not in by_id[0])]:
        first, second = by_id[0].get(claim_id, {}), by_id[1].get(claim_id, {})
        statuses = (first.get("status", "missing"), second.get("status", "missing"))
        statement = first.get("statement") or second.get("statement") or ""
        rows.append(
            {
                "id": claim_id,
                "statement": statement,
                "original": statuses[0],
                "replication": statuses[1],
                "agree": statuses[0] == statuses[1],
            }
        )
    return rows
