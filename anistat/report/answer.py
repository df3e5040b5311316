"""The report's answer: one sentence under the Question, generated from the run's own rows.

For an enrichment run the answer reads the energy ratios of the primary proxy against the primary
control at the smallest rank, per model and training phase, and sorts every comparison (model ×
checkpoint × layer) into one of three kinds:

* **more** — the row's (adjusted) p-value is below α with its estimate above 1: the proxy is
  special among random subspaces on these data (the exact test against Haar subspaces, where the
  rows carry it); without p-values, the interval lies wholly above 1;
* **less** — the row's interval lies wholly below 1 (the exact test is one-sided: a shortfall is
  seen by the interval over documents);
* **neither** — anything else.

A model is "Yes" when every comparison is "more", "No" when none is, "In part" otherwise, and
the sentence says at which checkpoints each kind occurs, with the largest adjusted p of the
"more" comparisons and the count of intervals below 1. The other ranks are summed up in one
clause. A null-check run (only an uninformative ``random`` proxy) gets an answer about the tests'
calibration instead: its question is whether the tests reject an uninformative proxy at their
nominal rate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .. import vocabulary as vocab
from ._data import checkpoint_order, fmt_num, ordered_by_first
from ._null_check import NULL_CHECK_LABELS, VERDICT_TEXT
from .claim_text import P_FLOOR
from .inputs import NullCheckSummary

#: Multiplicity corrections as they prefix "adjusted p" in the answer.
ADJUSTED_NAMES = {name: f"{vocab.MULTIPLICITY[name].short}-adjusted" for name in vocab.CORRECTIONS}
PHASE_ORDER = {"early": 0, "late": 1}


def _p_bound(p: float) -> str:
    return "< 1e-16" if p < P_FLOOR else f"≤ {p:.2g}"


def _range(values: pd.Series) -> str:
    """ "1.8–19.6×", "0.87×" (two significant digits, three above 10)."""
    low, high = float(values.min()), float(values.max())
    shown = [fmt_num(v, 3 if v >= 10 else 2) for v in (low, high)]
    return f"{shown[0]}×" if shown[0] == shown[1] else f"{shown[0]}–{shown[1]}×"


def _checkpoints(labels: Sequence[str]) -> str:
    """ "step0, step25" or, for more than three, "step50–step400 (4 checkpoints)"."""
    labels = list(labels)
    if len(labels) > 3:
        return f"{labels[0]}–{labels[-1]}"
    return ", ".join(labels)


def _phase_words(phase: str, unit_noun: str) -> str:
    if phase == "early":
        return "early in training" if unit_noun == "checkpoint" else "early in the measured training"
    if phase == "late":
        return "late"
    return f"over the {unit_noun}s" if not phase else phase


def classify(rows: pd.DataFrame, p_col: str, alpha: float) -> pd.Series:
    """ "more" / "less" / "neither" per row (see the module docstring)."""
    p = pd.to_numeric(rows[p_col], errors="coerce") if p_col in rows else pd.Series(np.nan, index=rows.index)
    estimate = rows["estimate"].astype(float)
    low, high = rows["ci_low"].astype(float), rows["ci_high"].astype(float)
    tested = p.notna()
    more = np.where(tested, (p < alpha) & (estimate > 1), low > 1)
    less = (high < 1) & ~more
    return pd.Series(np.where(more, "more", np.where(less, "less", "neither")), index=rows.index)


def _test_name(rows: pd.DataFrame) -> str:
    tests = {str(t) for t in rows.get("p_test", pd.Series(dtype=str)) if str(t) not in ("", "nan", "none")}
    if tests == {"haar_monte_carlo"}:
        return "exact test against random subspaces"
    return "Monte-Carlo test against the control draws" if not tests else "the rows' own test"


def _model_sentence(
    name: str,
    rows: pd.DataFrame,
    kinds: pd.Series,
    *,
    rank: int,
    proxy: str,
    control: str,
    p_word: str,
    ci_text: str,
    unit_noun: str,
    first: bool,
) -> str:
    tested = rows["_p"].notna().any()
    test = _test_name(rows)
    noun = "layers" if rows["site"].nunique() == rows["layer"].nunique() else "sites"
    n_more, n_all = int((kinds == "more").sum()), len(kinds)
    verdict = "Yes" if n_more == n_all else "No" if n_more == 0 else "In part"
    lead = f"{verdict if first else verdict.lower()} for {name}: its rank-{rank} {proxy} proxy captures "
    phases = sorted(ordered_by_first(rows["phase"]), key=lambda p: PHASE_ORDER.get(p, 2))
    pieces = []
    for i, phase in enumerate(phases):
        at = rows["phase"] == phase
        labels = checkpoint_order(rows[at])
        what = _range(rows.loc[at, "estimate"]) + (f" the gradient energy of {control} controls" if i == 0 else "")
        pieces.append((f"{what} {_phase_words(phase, unit_noun)} ({_checkpoints(labels)})", at, labels))
    if verdict == "Yes":
        ci_low = rows["ci_low"].astype(float)
        with_ci, above = int(ci_low.notna().sum()), int((ci_low > 1).sum())
        ci_part = (
            f"every {ci_text} CI above 1"
            if with_ci and above == n_all
            else f"{ci_text} CIs above 1 in {above} of {n_all}"
            if with_ci
            else ""
        )
        evidence = (
            f"{test}, {p_word} p {_p_bound(float(rows.loc[kinds == 'more', '_p'].max()))}"
            if tested
            else "no test in the rows: decided by the intervals"
        )
        body = " and ".join(text for text, _a, _l in pieces)
        return (
            f"{lead}{body}, more than random subspaces at all {n_all} comparisons ({evidence}"
            f"{'; ' + ci_part if ci_part else ''})"
        )
    clauses = []
    named = False
    for text, at, labels in pieces:
        parts = []
        for kind in ("more", "less", "neither"):
            hit = at & (kinds == kind)
            if not hit.any():
                continue
            where = [c for c in labels if (hit & (rows["checkpoint"] == c)).any()]
            unit = noun if len(where) == 1 else "comparisons"
            count = f"{int(hit.sum())} of {int((at & rows['checkpoint'].isin(where)).sum())} {unit}"
            if kind == "more":
                by = "" if named or not tested else f" by the {test.replace(' against random subspaces', '')}"
                named = named or bool(by)
                proof = (
                    f"{p_word} p {_p_bound(float(rows.loc[hit, '_p'].max()))}" if tested else f"{ci_text} CIs above 1"
                )
                parts.append(f"more than random subspaces{by} at {', '.join(where)} ({count}, {proof})")
            elif kind == "less":
                parts.append(f"less at {', '.join(where)} ({ci_text} CIs below 1 at {count})")
            else:
                parts.append(f"not significantly more at {', '.join(where)} ({count})")
        clauses.append(f"{text} — " + ", ".join(parts))
    return lead + "; and ".join(clauses)


def enrichment_answer(
    results: pd.DataFrame,
    *,
    proxy: str,
    control: str,
    alpha: float,
    p_col: str = "p_adjusted",
    multiplicity: str = vocab.FDR_BH,
    ci_text: str = "95 %",
    unit_noun: str = "checkpoint",
) -> str:
    """The answer of an enrichment run from its (normalised) results table; "" when the table has
    no energy ratio of ``proxy`` against ``control``."""
    rows = results[
        (results["metric"] == "energy_ratio") & (results["proxy"] == proxy) & (results["control"] == control)
    ]
    if rows.empty:
        return ""
    p_word = ADJUSTED_NAMES.get(multiplicity, "adjusted") if p_col == "p_adjusted" else "unadjusted"
    ok = rows[(rows["status"] == "ok") & rows["estimate"].notna()].copy()
    ok["_p"] = pd.to_numeric(ok[p_col], errors="coerce") if p_col in ok else np.nan
    ranks = sorted(ok["rank"].dropna().unique())
    sentences: list[str] = []
    for model in ordered_by_first(rows["model"]):
        failed = int((rows["model"] == model).sum() - (ok["model"] == model).sum())
        mine = ok[ok["model"] == model]
        if mine.empty:
            sentences.append(
                f"{'N' if not sentences else 'n'}o answer for {model}: every one of its comparisons failed"
            )
            continue
        rank = min(mine["rank"].dropna().unique()) if mine["rank"].notna().any() else ranks[0]
        at_rank = mine[mine["rank"] == rank]
        text = _model_sentence(
            model,
            at_rank,
            classify(at_rank, "_p", alpha),
            rank=int(rank),
            proxy=proxy,
            control=control,
            p_word=p_word,
            ci_text=ci_text,
            unit_noun=unit_noun,
            first=not sentences,
        )
        if failed:
            text += f" ({failed} of its comparisons failed and are not counted)"
        sentences.append(text)
    answer = "; ".join(sentences) + "."
    others = ok[ok["rank"] != min(ranks)] if ranks else ok.iloc[0:0]
    if len(others):
        kinds = classify(others, "_p", alpha)
        shown = [str(int(r)) for r in ranks[1:]]
        rank_list = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
        n_less = int((kinds == "less").sum())
        answer += (
            f" At rank{'s' if len(shown) > 1 else ''} {rank_list}: more than random subspaces in "
            f"{int((kinds == 'more').sum())} of {len(kinds)} comparisons, {ci_text} CIs below 1 in "
            f"{n_less or 'none'}."
        )
    return answer


def null_check_answer(checks: Sequence[NullCheckSummary]) -> str:
    """The answer of a null-check run (an uninformative proxy): is each test calibrated?"""
    parts = []
    for check in checks:
        expected = f"{check.expected_rate:.1%}" if check.grid is not None or check.sequential else f"{check.alpha:.0%}"
        verdict = VERDICT_TEXT.get(check.verdict, check.verdict)
        parts.append(
            f"{NULL_CHECK_LABELS.get(check.test, check.test)} rejects it in {check.rejection_rate:.1%} of "
            f"{len(check.p_values)} tests at α = {check.alpha:g} ({check.rate_low:.1%}–{check.rate_high:.1%}"
            f", 95 % interval; a valid test: {expected}) — {verdict}"
        )
    calibrated = [c for c in checks if c.calibrated]
    head = (
        "Yes, calibrated"
        if checks and len(calibrated) == len(checks)
        else "Not all calibrated"
        if calibrated
        else "No, not calibrated"
    )
    return (
        f"{head}: this run asks whether the tests reject an uninformative (uniformly random) proxy at their "
        f"nominal rate, not whether a proxy captures more; " + "; ".join(parts) + "."
    )


def answer_sentence(
    results: pd.DataFrame,
    *,
    proxy: str,
    control: str,
    alpha: float,
    p_col: str,
    multiplicity: str,
    ci_text: str,
    unit_noun: str,
    null_checks: Sequence[NullCheckSummary] = (),
) -> str:
    """The one answer under the Question: about calibration when the primary proxy is an
    uninformative ``random`` one and the run carries its null check, else about enrichment."""
    if null_checks and proxy.split("@")[0] == vocab.RANDOM:
        return null_check_answer(null_checks)
    text = enrichment_answer(
        results,
        proxy=proxy,
        control=control,
        alpha=alpha,
        p_col=p_col,
        multiplicity=multiplicity,
        ci_text=ci_text,
        unit_noun=unit_noun,
    )
    if text:
        return text
    if results.empty:
        return "No answer: the results table has no rows."
    return (
        f"No answer from this run: it has no energy ratio of the {proxy or 'primary'} proxy against "
        f"{control or 'a'} control{'s' if control else ''}; see the results table for what it measured."
    )
