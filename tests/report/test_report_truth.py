"""Every count, extreme and range the quickstart's answer, findings and claim cards state, regenerated
from results.csv and the claims' selected rows (not from the words' own code) and compared with the
rendered text, HTML and LaTeX (issue #38).

Runs on the shipped bundle ``reports/quickstart`` and on any bundle named in ``ANISTAT_TRUTH_BUNDLES``
(paths separated by ``:``), e.g. a fresh ``anistat run protocols/quickstart.yaml --out …``.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anistat.claims import select_rows
from anistat.protocol import parse_protocol
from anistat.report.escape import tex

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = [ROOT / "reports" / "quickstart"] + [
    Path(p) for p in os.environ.get("ANISTAT_TRUTH_BUNDLES", "").split(":") if p
]
NUMBER = r"-?[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?"


class Bundle:
    """A bundle's rows, claims, protocol and rendered texts (HTML as plain text, LaTeX as source)."""

    def __init__(self, path: Path) -> None:
        self.results = pd.read_csv(path / "results.csv")
        self.claims = json.loads((path / "claims.json").read_text(encoding="utf-8"))
        self.protocol = parse_protocol(json.loads((path / "manifest.json").read_text(encoding="utf-8"))["protocol"])
        raw = (path / "report.html").read_text(encoding="utf-8")
        raw = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", raw, flags=re.S)
        self.html = _spaces(html.unescape(re.sub(r"<[^>]+>", " ", raw)))
        # the LaTeX renderer ties "95 %" with ~: read it as a space
        self.tex = _spaces((path / "report.tex").read_text(encoding="utf-8").replace("~", " "))

    def shown(self, text: str) -> bool:
        """The sentence appears in both renderings."""
        return _spaces(text) in self.html and _spaces(tex(text).replace("~", " ")) in self.tex


def _spaces(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(params=BUNDLES, ids=lambda p: p.name)
def bundle(request) -> Bundle:
    if not (request.param / "claims.json").exists():
        pytest.skip(f"no bundle at {request.param}")
    return Bundle(request.param)


def _unbounded(rows: pd.DataFrame) -> pd.Series:
    return rows["fallback"].astype(str).str.contains("ci_unbounded")


def test_claim_cards_count_their_own_rows(bundle):
    """Each all/any card: its words are rendered as recorded, and every count, extreme, interval
    and p-value in them is the one its selected rows give."""
    specs = {claim.id: claim for claim in bundle.protocol.claims}
    for record in bundle.claims:
        claim = specs[record["id"]]
        words = [record.get(key) or "" for key in ("decision", "context", "caveat")]
        for text in words:
            assert not text or bundle.shown(text), (record["id"], text)
        if claim.aggregate == "meta":
            _check_meta_card(bundle, record, claim)
            continue
        rows = select_rows(bundle.results, claim)
        low, high = rows["ci_low"].astype(float), rows["ci_high"].astype(float)
        present = low.notna() & high.notna()
        if claim.compare in (">", ">="):
            inside = present & ~(low > claim.threshold if claim.compare == ">" else low >= claim.threshold)
        else:
            inside = present & ~(high < claim.threshold if claim.compare == "<" else high <= claim.threshold)
        decision, context, caveat = words
        found = re.search(r"all (\d+) rows significant", decision)
        if found:
            assert int(found.group(1)) == len(rows)
        found = re.search(r"intervals of (\d+) of (\d+) rows include", caveat)
        if inside.any() and record["decided_by"] == "test" and record["passed"]:
            assert found, (record["id"], caveat)
        if found:
            assert (int(found.group(1)), int(found.group(2))) == (int(inside.sum()), int(present.sum())), caveat
        found = re.search(r"largest adjusted p = (" + NUMBER + ")", decision)
        if found:
            largest = float(rows["p_adjusted"].astype(float).max())
            shown = float(found.group(1))
            assert shown == pytest.approx(largest, rel=0.05) and (shown < claim.alpha) == (largest < claim.alpha)
        if context:
            _check_context(record, context, rows, low, high, present, inside, claim)


def _check_context(record, context, rows, low, high, present, inside, claim) -> None:
    """The context interval is the selected row with the lowest interval end, labelled so (never
    "weakest" unless it also has the smallest estimate); the smallest estimate and "every row"."""
    found = re.search(r"interval \[(" + NUMBER + r"), (" + NUMBER + r"\]|∞\))", context)
    assert found, context
    chosen = low[present].idxmin() if claim.compare in (">", ">=") else high[present].idxmax()
    end = found.group(2)
    shown = (float(found.group(1)), math.inf if end == "∞)" else float(end.rstrip("]")))
    assert shown == pytest.approx((low[chosen], high[chosen]), rel=1e-3), (record["id"], context)
    smallest = rows["estimate"].astype(float).idxmin()
    assert "weakest" not in context or chosen == smallest, context
    assert "lowest interval end" in context or "highest interval end" in context, context
    found = re.search(r"smallest estimate (" + NUMBER + ")", context)
    if len(rows) > 1:
        assert found and float(found.group(1)) == pytest.approx(float(rows.loc[smallest, "estimate"]), rel=1e-3)
    found = re.search(r"lies above [0-9.]+ \((\d+) of (\d+)\)", context)
    if found:
        assert not inside.any() and int(found.group(1)) == int(found.group(2)) == int(present.sum())


def _check_meta_card(bundle, record, claim) -> None:
    """A meta card: its pooled interval is the recorded one with its scale named, and the rows
    with an unbounded interval are left out, counted."""
    rows = select_rows(bundle.results, claim)
    rows = rows[rows["status"] == "ok"]
    unbounded = int(_unbounded(rows).sum())
    decision = record["decision"]
    if unbounded:
        found = re.search(r"(\d+) of (\d+) rows left out: (\d+) with an unbounded interval", decision)
        assert found, (record["id"], decision)
        assert (int(found.group(2)), int(found.group(3))) == (len(rows), unbounded)
    scale = {"log2_energy_ratio": "log₂-ratio scale", "energy_ratio": "ratio scale"}.get(claim.metric)
    if scale and record.get("interval"):
        assert f"on the {scale}" in decision, decision


def test_unbounded_rows_carry_no_finite_se(bundle):
    """Every row whose interval is unbounded has a non-finite ``se`` and says why in ``note``."""
    rows = bundle.results[_unbounded(bundle.results)]
    assert not np.isfinite(rows["se"].astype(float)).any(), rows[["metric", "ci_low", "ci_high", "se"]]
    assert rows["note"].astype(str).str.contains("se = inf").all()


def _primary(bundle) -> tuple[pd.DataFrame, str, str, float]:
    answer = _answer_text(bundle)
    found = re.search(r"its rank-\d+ (\S+) proxy captures .*? of (\S+) controls", answer)
    assert found, answer
    proxy, control = found.groups()
    er = bundle.results[
        (bundle.results["metric"] == "energy_ratio")
        & (bundle.results["proxy"] == proxy)
        & (bundle.results["control"] == control)
        & (bundle.results["status"] == "ok")
    ]
    return er, proxy, control, float(bundle.protocol.stats.alpha)


def _answer_text(bundle) -> str:
    found = re.search(r"((?:Yes|No|In part)(?:, calibrated)? for .*?\.) (?=[A-Z])", bundle.html)
    assert found, "no answer in the report"
    return found.group(1)


def test_the_answer_counts_and_ranges_come_from_the_rows(bundle):
    er, _proxy, _control, alpha = _primary(bundle)
    answer = _answer_text(bundle)
    assert bundle.shown(answer)
    rank = er["rank"].min()
    for sentence in re.split(r"; (?=(?:yes|no|in part) for )", answer[0].lower() + answer[1:]):
        model = re.match(r"(?:yes|no|in part) for ([^:]+):", sentence).group(1)
        rows = er[(er["model"] == model) & (er["rank"] == rank)]
        found = re.search(r"at all (\d+) comparisons", sentence)
        if found:
            assert int(found.group(1)) == len(rows)
        found = re.search(r"CIs above 1 in (\d+) of (\d+)", sentence)
        if found:
            assert (int(found.group(1)), int(found.group(2))) == (int((rows["ci_low"] > 1).sum()), len(rows))
        for low, high, checkpoints in re.findall(r"(\d[\d.]*)(?:–(\d[\d.]*))?× [^()]*?\(([^)]*)\)", sentence):
            at = rows[rows["checkpoint"].isin(_checkpoints(checkpoints, rows))]
            assert float(low) == pytest.approx(at["estimate"].min(), rel=0.03), (sentence, checkpoints)
            assert float(high or low) == pytest.approx(at["estimate"].max(), rel=0.03), (sentence, checkpoints)
        kinds = np.where(
            (rows["p_adjusted"] < alpha) & (rows["estimate"] > 1), "more", np.where(rows["ci_high"] < 1, "less", "-")
        )
        _check_parts(sentence, rows.assign(kind=kinds))


def _checkpoints(text: str, rows: pd.DataFrame) -> list[str]:
    """ "step0, step25" or "step50–step400" (a span by step) as checkpoint names."""
    if "–" in text:
        first, last = text.split("–")
        steps = rows.groupby("checkpoint")["step"].min()
        return list(steps[(steps >= steps[first]) & (steps <= steps[last])].index)
    return text.split(", ")


def _check_parts(sentence: str, rows: pd.DataFrame) -> None:
    """Every verdict part counts the cells of its checkpoints (and named layers) with that verdict."""
    pattern = (
        r"(more than random subspaces|less|not significantly more)(?: by the [a-z ]+?)? at (step\d+(?:, step\d+)*) "
        r"\((?:95 % CIs below 1 at )?(?:([^:()]+): )?(\d+) of (\d+)"
    )
    for verdict, at, sites, k, n in re.findall(pattern, sentence):
        here = rows[rows["checkpoint"].isin(at.split(", "))]
        assert int(n) == len(here), (sentence, at)
        if sites:
            here = here[here["layer"].isin([int(s.removeprefix("layer ")) for s in sites.split(", ")])]
        kind = {"more than random subspaces": "more", "less": "less"}.get(verdict, "-")
        assert int(k) == len(here) and (here["kind"] == kind).all(), (sentence, at)


def test_the_findings_count_the_rows(bundle):
    er, proxy, control, alpha = _primary(bundle)
    head = f"Against {control} controls, the {proxy} proxy's energy ratio exceeds 1 in "
    found = re.search(re.escape(head) + r"(\d+) of (\d+) comparisons", bundle.html)
    assert found
    assert (int(found.group(1)), int(found.group(2))) == (int((er["estimate"] > 1).sum()), len(er))
    found = re.search(r"CI lies above 1 in (\d+) and below 1 in (\d+) of (\d+)", bundle.html)
    assert found
    counts = (int((er["ci_low"] > 1).sum()), int((er["ci_high"] < 1).sum()), len(er))
    assert tuple(int(g) for g in found.groups()) == counts
    found = re.search(r"random subspaces \(exact test, adjusted p < [0-9.]+\) in (\d+) of (\d+)", bundle.html)
    assert found
    significant = int(((er["p_adjusted"] < alpha) & (er["estimate"] > 1)).sum())
    assert (int(found.group(1)), int(found.group(2))) == (significant, int(er["p_adjusted"].notna().sum()))
    assert _spaces(tex(found.group(0))) in bundle.tex
