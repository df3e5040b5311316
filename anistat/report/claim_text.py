"""A claim in words: which of the two questions it answers, the evidence that decided it, and any
interval of another estimand labelled as context.

The two questions (named the same in the report, claims.json and the docs):

* :data:`SUBSPACES` — "is this proxy special among random subspaces on these data?", answered by
  the exact test against uniformly random (Haar) subspaces, conditional on the measured gradients;
* :data:`DOCUMENTS` — "would its ratio stay above the threshold over new documents?", answered by
  the bootstrap interval (or the data test) that resamples the documents.

:func:`claim_reading` derives the words from a claims.json record (``anistat.claims.evaluate_claim``
adds them to every record it writes; the report derives them the same way for a record written
without them). This module is pure: it reads the record and nothing else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

SUBSPACES = "subspaces"
DOCUMENTS = "documents"
#: The two questions a claim can answer, in the words the report and claims.json use.
QUESTIONS: dict[str, str] = {
    SUBSPACES: "is this proxy special among random subspaces on these data?",
    DOCUMENTS: "would its ratio stay above the threshold over new documents?",
}
#: How each question is answered.
QUESTION_METHODS: dict[str, str] = {
    SUBSPACES: "the exact test against random subspaces, conditional on the measured gradients",
    DOCUMENTS: "the interval or data test over documents",
}
#: The resampling unit's noun as a run's notes write it ("30 documents resampled").
_RESAMPLED = re.compile(r"\b\d+ (documents|sequences) resampled")


def resampled_noun(notes: Any) -> str:
    """What a run (or a claim's rows) resampled, read from the rows' notes: "documents",
    "sequences" (each sequence its own unit: ``stats.resampling_unit: sequence``, or one document
    per unit), "documents or sequences" (units differ), or "documents" when no note says."""
    found = {match for note in notes if isinstance(note, str) for match in _RESAMPLED.findall(note)}
    if len(found) == 2:
        return "documents or sequences"
    return found.pop() if found else "documents"


def questions_for(noun: str = "documents") -> dict[str, str]:
    """:data:`QUESTIONS` with the unit the run resampled (:func:`resampled_noun`) in the second."""
    return {**QUESTIONS, DOCUMENTS: QUESTIONS[DOCUMENTS].replace("documents", noun)}


def _question_methods(noun: str) -> dict[str, str]:
    return {**QUESTION_METHODS, DOCUMENTS: QUESTION_METHODS[DOCUMENTS].replace("documents", noun)}


#: Row tests (the results' ``p_test``) that resample the data: they answer :data:`DOCUMENTS`.
DATA_TESTS = frozenset({"bootstrap_t", "sign_flip"})
TEST_NAMES: dict[str, str] = {
    "haar_monte_carlo": "the exact test against random subspaces",
    "bootstrap_t": "the studentized bootstrap data test",
    "sign_flip": "the sign-flip data test",
}
#: The smallest p-value printed as a number; below it the report prints "p < 1e-16".
P_FLOOR = 1e-16

_RULE = re.compile(
    r"(?:has|pooled) (?P<metric>[A-Za-z0-9_]+?)(?:\.(?P<column>ci_low|ci_high))?(?: \([^)]*\))? "
    r"(?P<compare>>=|<=|>|<|between) (?P<threshold>\[[^\]]+\]|-?[0-9.]+(?:e-?\d+)?)"
)
_ALPHA = re.compile(r"(?:p_adjusted|p against the threshold) < ([0-9.]+(?:e-?\d+)?)")
_SIDES = {">": "above", ">=": "at or above", "<": "below", "<=": "at or below", "between": "inside"}


#: The scale an interval of each metric is on, named wherever the interval is shown.
SCALE_NAMES = {
    "energy_ratio": "ratio scale",
    "log2_energy_ratio": "log₂-ratio scale",
    "energy_fraction": "fraction scale",
}


def scale_name(metric: str) -> str:
    """ "ratio scale", "log₂-ratio scale", … (:data:`SCALE_NAMES`); else "<metric> scale"."""
    return SCALE_NAMES.get(metric, f"{metric.replace('_', ' ')} scale" if metric else "")


def beside_threshold(value: float, threshold: Any = None, digits: int = 2) -> str:
    """``value`` to ``digits`` significant digits, with more where fewer would land on or across
    ``threshold`` (0.0495 beside 0.05 is "0.0495", not "0.05"); up to 17 digits, then repr.

    >>> beside_threshold(0.0495, 0.05), beside_threshold(0.00027, 0.05), beside_threshold(1.00004, 1.0, 4)
    ('0.0495', '0.00027', '1.00004')
    """
    value = float(value)
    if not _finite(threshold) or not math.isfinite(value) or value == float(threshold):
        return f"{value:.{digits}g}"
    side = value > float(threshold)
    for shown_digits in range(digits, 18):
        text = f"{value:.{shown_digits}g}"
        if float(text) != float(threshold) and (float(text) > float(threshold)) == side:
            return text
    return repr(value)


def p_phrase(p: Any, name: str = "p", alpha: Any = None) -> str:
    """ "p = 0.00027", "p < 1e-16" (below :data:`P_FLOOR`), "" when not a number; beside a level
    ``alpha`` the value never rounds onto or across it (:func:`beside_threshold`)."""
    if not _finite(p):
        return ""
    value = float(p)
    return f"{name} < 1e-16" if value < P_FLOOR else f"{name} = {beside_threshold(value, alpha)}"


def interval_ends(item: Mapping[str, Any], low: str = "ci_low", high: str = "ci_high") -> tuple[float, float] | None:
    """An interval's ends from a claims.json row or interval (``low``/``high`` keys): an end stored
    as null with ``<key>_infinite: true`` (JSON has no infinity) is unbounded, ``∓inf``; None
    when an end is missing or the ends are not numbers."""
    ends = []
    for key, sign in ((low, -1.0), (high, 1.0)):
        value = item.get(key)
        if item.get(f"{key}_infinite"):
            ends.append(sign * math.inf)
        elif _finite(value):
            ends.append(float(value))
        else:
            return None
    return ends[0], ends[1]


def interval_brackets(ends: tuple[float, float], threshold: Any = None) -> str:
    """ "[1.099, 1.53]", "[0, ∞)" — four significant digits, more where an end would round onto or
    across a scalar ``threshold``."""
    low, high = ends
    left = "(−∞" if math.isinf(low) else "[" + beside_threshold(low, threshold, 4)
    right = "∞)" if math.isinf(high) else beside_threshold(high, threshold, 4) + "]"
    return f"{left}, {right}"


def interval_text(interval: Any, threshold: Any = None) -> str:
    """A record's interval as shown beside the verdict, its scale named: "95 % interval [2.109,
    2.329] on the log₂-ratio scale"; "" when it has no interval."""
    if not isinstance(interval, Mapping):
        return ""
    ends = interval_ends(interval, "low", "high")
    if ends is None:
        return ""
    level = interval.get("level")
    prefix = f"{float(level) * 100:g} % interval" if _finite(level) else "interval"
    scale = interval.get("scale")
    return f"{prefix} {interval_brackets(ends, threshold)}" + (f" on the {scale}" if scale else "")


def shown_row_words(compare: Any, strongest: bool, rows: str = "selected") -> str:
    """Which row's interval a claim shows, in words that say how it was chosen: "the selected row
    with the lowest interval end" (the end nearest the threshold on its claimed side), or with
    ``strongest`` (an `any` claim) the one most on the claimed side."""
    if compare in (">", ">="):
        end = "highest lower end" if strongest else "lowest interval end"
    elif compare in ("<", "<="):
        end = "lowest upper end" if strongest else "highest interval end"
    else:
        end = "interval farthest inside the range" if strongest else "interval end nearest the range's edge"
    return f"the {rows} row with the {end}"


@dataclass(frozen=True)
class RowsSummary:
    """What a claim's selected rows say, computed once (:func:`rows_summary`): every count, extreme
    and label the claim's sentences, cards and claims.json show.

    ``n_rows`` selected rows; ``n_interval`` of them with an interval (an unbounded end counts);
    ``n_unbounded`` of those with an infinite end; ``n_inside`` intervals not wholly on the
    claimed side (they include the threshold); ``n_unbounded_inside`` of those unbounded;
    ``estimate_min`` / ``estimate_max`` the smallest / largest estimate and ``label_min`` /
    ``label_max`` their rows."""

    n_rows: int
    n_interval: int
    n_unbounded: int
    n_inside: int
    n_unbounded_inside: int
    estimate_min: float
    estimate_max: float
    label_min: str
    label_max: str


def row_label(row: Mapping[str, Any]) -> str:
    """ "tiny-decoder step25 residual.0 k=4 normal" — a selected row's name."""
    parts = [str(row[k]) for k in ("model", "checkpoint", "site") if row.get(k) not in (None, "")]
    if row.get("rank") is not None:
        parts.append(f"k={row['rank']}")
    if row.get("control") not in (None, "", "none"):
        parts.append(str(row["control"]))
    return " ".join(parts)


def rows_summary(rows: Sequence[Mapping[str, Any]], compare: Any, threshold: Any) -> RowsSummary:
    """The :class:`RowsSummary` of a claim's selected rows (claims.json ``selected_rows``)."""
    ends = [interval_ends(r) for r in rows]
    with_ci = [e for e in ends if e is not None]
    on_side = compare in _SIDES and threshold is not None
    inside = [e for e in with_ci if on_side and not _on_side(e[0], e[1], str(compare), threshold)]
    estimates = [(float(r["estimate"]), row_label(r)) for r in rows if _finite(r.get("estimate"))]
    low = min(estimates, key=lambda pair: pair[0], default=(math.nan, ""))
    high = max(estimates, key=lambda pair: pair[0], default=(math.nan, ""))
    return RowsSummary(
        n_rows=len(rows),
        n_interval=len(with_ci),
        n_unbounded=sum(math.isinf(e[0]) or math.isinf(e[1]) for e in with_ci),
        n_inside=len(inside),
        n_unbounded_inside=sum(math.isinf(e[0]) or math.isinf(e[1]) for e in inside),
        estimate_min=low[0],
        estimate_max=high[0],
        label_min=low[1],
        label_max=high[1],
    )


def _finite(value: object) -> TypeGuard[float]:
    """A finite real number (a JSON number: not a bool, not NaN or infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num(value: float) -> str:
    return f"{value:.4g}"


def _threshold_text(threshold: Any) -> str:
    if isinstance(threshold, (list, tuple)):
        return f"[{threshold[0]:g}, {threshold[1]:g}]"
    return f"{threshold:g}"


def rule_terms(rule: str) -> dict[str, Any]:
    """metric, column, compare and threshold read back from a record's rule text (a record written
    without them); {} when the rule does not say."""
    match = _RULE.search(rule or "")
    if not match:
        return {}
    raw = match.group("threshold")
    try:
        threshold: Any = [float(v) for v in raw.strip("[]").split(",")] if raw.startswith("[") else float(raw)
    except ValueError:
        return {}
    alpha = _ALPHA.search(rule or "")
    return {
        "alpha": float(alpha.group(1)) if alpha else None,
        "metric": match.group("metric"),
        "column": match.group("column") or "estimate",
        "compare": match.group("compare"),
        "threshold": threshold,
        "aggregate": (rule.split(":", 1)[0].strip() if ":" in rule else "all"),
    }


def _on_side(low: float, high: float, compare: str, threshold: Any) -> bool:
    """The whole interval [low, high] lies on the claimed side of the threshold."""
    if compare in (">", ">="):
        return low > threshold if compare == ">" else low >= threshold
    if compare in ("<", "<="):
        return high < threshold if compare == "<" else high <= threshold
    return threshold[0] <= low and high <= threshold[1]


def _controls(rows: Sequence[Mapping[str, Any]]) -> str:
    kinds = sorted({str(r.get("control")) for r in rows if r.get("control") not in (None, "", "none")})
    return " and ".join(kinds)


def _tests(record: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The row tests behind the record's p-values: the rows' ``p_test``, else read from the
    p-value's description."""
    tests = sorted({str(r["p_test"]) for r in rows if r.get("p_test") not in (None, "", "nan")})
    if tests:
        return tests
    p_value = record.get("p_value")
    described = str(p_value.get("of", "")) if isinstance(p_value, Mapping) else ""
    found = [
        key
        for key, word in (
            ("haar_monte_carlo", "exact Haar"),
            ("bootstrap_t", "studentized bootstrap"),
            ("sign_flip", "sign-flip"),
        )
        if word in described
    ]
    return found


def _estimand(metric: str, rows: Sequence[Mapping[str, Any]]) -> str:
    controls = _controls(rows)
    against = f" against {controls} controls" if controls else ""
    if metric in ("energy_ratio", "log2_energy_ratio", "hedges_g", "z", ""):
        return f"effect size{against}"
    return f"{metric.replace('_', ' ')}{against}"


def claim_reading(record: Mapping[str, Any], terms: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The words of one claim record: ``answers`` (question keys, :data:`QUESTIONS`), ``question``
    (the question(s) in words), ``decision`` (the evidence that decided it, one sentence),
    ``interval_role`` (``decided``: the interval shown is the one that decided; ``context``: it is
    an interval of the effect size over documents, which did not decide; ``none``), ``context``
    (the labelled context sentence, or "") and ``caveat`` (a PASS decided by the exact test whose
    rows' intervals include the threshold, in words; or "").

    ``terms`` (metric, column, compare, threshold, aggregate) come from the claim itself when the
    caller has it (``anistat.claims``); else they are read back from the record's rule."""
    terms = dict(terms) if terms else rule_terms(str(record.get("rule", "")))
    decided_by = str(record.get("decided_by", ""))
    status = str(record.get("status", "pass" if record.get("passed") else "fail"))
    passed = bool(record.get("passed"))
    raw_rows = record.get("selected_rows")
    rows: list[Mapping[str, Any]] = (
        [r for r in raw_rows if isinstance(r, Mapping)] if isinstance(raw_rows, list) else []
    )
    found_evidence, found_interval = record.get("evidence"), record.get("interval")
    evidence: Mapping[str, Any] = found_evidence if isinstance(found_evidence, Mapping) else {}
    interval: Mapping[str, Any] = found_interval if isinstance(found_interval, Mapping) else {}
    has_interval = interval_ends(interval, "low", "high") is not None
    level = interval.get("level")
    level_text = f"{float(level) * 100:g} %" if _finite(level) else "the"
    metric = str(terms.get("metric", ""))
    compare, threshold = terms.get("compare"), terms.get("threshold")
    side = f"{_SIDES[compare]} {_threshold_text(threshold)}" if compare in _SIDES and threshold is not None else ""
    tests = _tests(record, rows)
    test_name = " and ".join(TEST_NAMES.get(t, t) for t in tests) or "the rows' own test"

    answers = _answers(decided_by, tests)
    noun = str(terms.get("resampled") or record.get("resampled") or "documents")
    questions, methods = questions_for(noun), _question_methods(noun)
    question = " and ".join(f"“{questions[a]}” ({methods[a]})" for a in answers) or (
        "neither question: no test or interval decides, so the claim describes these data only"
        if decided_by == "point estimate"
        else ""
    )

    if "interval" in decided_by:
        role = "decided" if has_interval else "none"
    else:
        role = "context" if has_interval else "none"

    summary = rows_summary(rows, compare, threshold)
    decision = _decision(record, status, passed, decided_by, evidence, interval, level_text, side, test_name, terms)
    context = _context_sentence(metric, rows, interval, level_text, side, summary, noun) if role == "context" else ""
    caveat = ""
    if passed and "test" in decided_by and "interval" not in decided_by and side and summary.n_inside:
        unbounded = f", {summary.n_unbounded_inside} of them unbounded" if summary.n_unbounded_inside else ""
        caveat = (
            f"Two answers, not one: {test_name} says the proxy is special among random subspaces on these "
            f"data; whether its ratio would stay {side} over new {noun} is not settled — the "
            f"{level_text} intervals of {summary.n_inside} of {summary.n_interval} rows include "
            f"{_threshold_text(threshold)}{unbounded} (context below)."
        )
    return {
        "answers": answers,
        "question": question,
        "decision": decision,
        "interval_role": role,
        "context": context,
        "caveat": caveat,
    }


def _answers(decided_by: str, tests: list[str]) -> list[str]:
    """The questions (keys of :data:`QUESTIONS`) a claim answers: over documents when an interval
    decided it or the deciding test is a data test, among random subspaces when the exact test did."""
    answers: list[str] = []
    if "interval" in decided_by:
        answers.append(DOCUMENTS)
    if "test" in decided_by:
        data_only = bool(tests) and all(t in DATA_TESTS for t in tests)
        if data_only and DOCUMENTS not in answers:
            answers.append(DOCUMENTS)
        elif not data_only:
            answers.insert(0, SUBSPACES)
    return answers


def _context_sentence(
    metric: str,
    rows: Sequence[Mapping[str, Any]],
    interval: Mapping[str, Any],
    level_text: str,
    side: str,
    summary: RowsSummary,
    noun: str = "documents",
) -> str:
    """The labelled context sentence: the effect size's interval over documents, which did not
    decide the claim (its scale and how its row was chosen named), the selected rows' smallest
    estimate, and whether every selected row's interval lies on the claimed side."""
    of = str(interval.get("of") or "")
    agreement = ""
    if side and summary.n_interval and not summary.n_inside:
        agreement = (
            f"; every selected row's {level_text} interval lies {side} ({summary.n_interval} of "
            f"{summary.n_interval}), so the answer over new {noun} agrees"
        )
    smallest = ""
    if _finite(summary.estimate_min) and summary.n_rows > 1:
        smallest = f"; smallest estimate {_num(summary.estimate_min)} ({summary.label_min})"
    return (
        f"Context — {_estimand(metric, rows)}: {interval_text(interval)}"
        + (f" ({of})" if of else "")
        + smallest
        + agreement
        + f"; it bears on “{questions_for(noun)[DOCUMENTS]}”, not what decided this claim."
    )


def _meta_decision(
    passed: bool,
    decided_by: str,
    evidence: Mapping[str, Any],
    bounds: str,
    level_text: str,
    side: str,
    p: Any,
    terms: Mapping[str, Any],
) -> str:
    """A meta claim's decision: the pooled interval (its scale named) and the rows it left out,
    counted; or the pooled point estimate alone without ``alpha``."""
    alpha, threshold = terms.get("alpha"), terms.get("threshold")
    if "interval" not in decided_by:
        estimate = evidence.get("meta_estimate")
        shown = f" {beside_threshold(float(estimate), threshold, 4)}" if _finite(estimate) else ""
        return (
            f"the pooled point estimate{shown} alone ({'on' if passed else 'not on'} the claimed side"
            f"{' ' + side if side else ''}); no interval decides, so the claim describes these data only"
        )
    where = "lies" if passed else "does not lie"
    p_text = p_phrase(p, "p against the threshold", alpha)
    excluded = str(evidence.get("excluded") or "")
    pooled = bounds.replace(f"{level_text} interval", f"{level_text} pooled interval", 1)
    return (
        f"the {pooled} {where} entirely {side or 'on the claimed side'}"
        + (f" ({p_text})" if p_text else "")
        + (f"; {excluded}" if excluded else "")
    )


def _decision(
    record: Mapping[str, Any],
    status: str,
    passed: bool,
    decided_by: str,
    evidence: Mapping[str, Any],
    interval: Mapping[str, Any],
    level_text: str,
    side: str,
    test_name: str,
    terms: Mapping[str, Any],
) -> str:
    """The evidence that decided the claim, one sentence; a p-value beside ``alpha`` and an
    interval end beside the threshold are never rounded onto or across it."""
    failed = [str(f) for f in record.get("failed") or []] if isinstance(record.get("failed"), list) else []
    if status == "error":
        return "not evaluated: " + ("; ".join(failed) or "the claim could not be evaluated")
    n_rows, n_pass = evidence.get("n_rows"), evidence.get("n_pass")
    aggregate = str(terms.get("aggregate", "all"))
    p_value = record.get("p_value") if isinstance(record.get("p_value"), Mapping) else {}
    p = p_value.get("value") if p_value else None
    alpha, threshold = terms.get("alpha"), terms.get("threshold")
    ends = interval_ends(interval, "low", "high")
    bounds = interval_text(interval, threshold) if ends else ""
    if aggregate == "meta" or "pooled" in str(interval.get("of", "")):
        return _meta_decision(passed, decided_by, evidence, bounds, level_text, side, p, terms)
    counted = f"{n_pass} of {n_rows} rows" if _finite(n_pass) and _finite(n_rows) else "the selected rows"
    parts: list[str] = []
    if "test" in decided_by:
        which = "largest" if aggregate == "all" else "smallest"
        p_text = p_phrase(p, f"{which} adjusted p", alpha)
        if passed and aggregate == "all":
            parts.append(
                f"all {n_rows if _finite(n_rows) else ''} rows significant by {test_name}".replace("  ", " ")
                + (f", {p_text}" if p_text else "")
                + (f"; every estimate {side}" if side else "")
            )
        elif passed:
            parts.append(
                f"{counted} significant by {test_name} with the estimate {side or 'on the claimed side'}"
                + (f", {p_text}" if p_text else "")
            )
        else:
            parts.append(f"{counted} pass by {test_name}" + (f" ({p_text})" if p_text else ""))
    if "interval" in decided_by:
        whose = shown_row_words(terms.get("compare"), aggregate != "all")
        if passed:
            parts.append(
                f"{'every' if aggregate == 'all' else 'at least one'} selected row's {level_text} interval "
                f"lies {side or 'on the claimed side'} (decisive: the {bounds} of {whose})"
                if bounds
                else f"every selected row's interval lies {side or 'on the claimed side'}"
            )
        else:
            parts.append(
                f"{counted} have a {level_text} interval {side or 'on the claimed side'}"
                + (f" (decisive: the {bounds} of {whose})" if bounds else "")
            )
    if decided_by == "point estimate":
        low = next((v for k, v in evidence.items() if k.endswith("_min")), None)
        high = next((v for k, v in evidence.items() if k.endswith("_max") and k != "p_adjusted_max"), None)
        spread = (
            f" (from {beside_threshold(float(low), threshold, 4)} to {beside_threshold(float(high), threshold, 4)})"
            if _finite(low) and _finite(high)
            else ""
        )
        parts.append(
            f"point estimates alone{spread}; no test or interval decides, so the claim describes these data only"
        )
    if not parts:
        return ""  # a record that does not say what decided it: the card shows its verdict only
    text = "; ".join(parts)
    if failed and not passed:
        text += " — failed: " + "; ".join(failed)
    return text
