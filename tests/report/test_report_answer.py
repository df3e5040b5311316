"""The report answers first (issue #27): one answer sentence under the Question, generated from the
run; claim cards that say which of the two questions they answer, what decided them, and label an
interval of another estimand as context; raw fields collapsed in HTML and absent from the PDF;
shortfalls (CIs below 1) marked like excesses; page 1 of the PDF is question, answer, headline.

The answer is checked on small known tables (every comparison above, a mixed model, all failed, a
null check), the cards on claims evaluated from the shipped quickstart results, and the layout in
headless Chromium and in report.tex / report.pdf."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_report_fixtures import null_check_results  # noqa: E402
from test_report_inputs import CHROMIUM, FAST, probed_root  # noqa: E402

from anistat.bundle import Bundle, null_check_summaries  # noqa: E402
from anistat.claims import evaluate_claim, evaluate_claims  # noqa: E402
from anistat.protocol import ClaimSpec, load_protocol  # noqa: E402
from anistat.report import claim_outcome, render_bundle  # noqa: E402
from anistat.report._content import ReportContext, headline, summary_sentences  # noqa: E402
from anistat.report._data import fmt_p, normalise_results  # noqa: E402
from anistat.report.answer import enrichment_answer, null_check_answer  # noqa: E402
from anistat.report.claim_text import QUESTIONS, claim_reading, p_phrase  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "reports" / "quickstart"


def ratios(
    model: str,
    cells: dict[str, list[tuple[float, float, float, float]]],
    *,
    rank: int = 4,
    phases: dict[str, str] | None = None,
) -> list[dict]:
    """energy_ratio rows of one model: per checkpoint, one (estimate, ci_low, ci_high, p_adjusted)
    per layer."""
    rows = []
    for step, (checkpoint, layers) in enumerate(cells.items()):
        phase = (phases or {}).get(checkpoint, "early" if step < 2 else "late")
        for layer, (estimate, low, high, p) in enumerate(layers):
            rows.append(
                {
                    "model": model,
                    "checkpoint": checkpoint,
                    "step": step * 25,
                    "phase": phase,
                    "layer": layer,
                    "site": f"residual.{layer}",
                    "rank": rank,
                    "proxy": "pca",
                    "control": "normal",
                    "metric": "energy_ratio",
                    "estimate": estimate,
                    "ci_low": low,
                    "ci_high": high,
                    "p_value": p / 2,
                    "p_adjusted": p,
                    "p_test": "haar_monte_carlo",
                    "status": "ok",
                }
            )
    return rows


def answer_of(rows: list[dict], **kw) -> str:
    return enrichment_answer(
        normalise_results(pd.DataFrame(rows)), proxy="pca", control="normal", alpha=0.05, ci_text="95 %", **kw
    )


DECODER = ratios(
    "dec",
    {
        "step0": [(1.8, 1.7, 1.9, 0.0003), (2.0, 1.9, 2.1, 0.0003)],
        "step25": [(19.6, 16.0, 23.0, 0.0002), (9.8, 8.6, 15.0, 0.0003)],
        "step400": [(3.2, 3.1, 3.3, 0.0003), (4.1, 3.8, 4.3, 0.0001)],
    },
)
ENCODER = ratios(
    "enc",
    {
        "step0": [(1.28, 1.18, 1.37, 0.022), (1.31, 1.18, 1.40, 0.015)],
        "step25": [(0.87, 0.81, 0.95, 1.0), (0.78, 0.71, 0.85, 1.0)],
        "step400": [(1.32, 1.11, 1.53, 0.038), (1.08, 0.99, 1.17, 0.33)],
    },
)


# ------------------------------------------------------------------ the answer on known tables


def test_a_model_above_everywhere_is_a_yes_with_its_numbers_and_test():
    text = answer_of(DECODER)
    assert text.startswith(
        "Yes for dec: its rank-4 pca proxy captures 1.8–19.6× the gradient energy of normal "
        "controls early in training (step0, step25) and 3.2–4.1× late (step400)"
    )
    assert (
        "more than random subspaces at all 6 comparisons (exact test against random subspaces, BH-adjusted "
        "p ≤ 0.0003; every 95 % CI above 1)"
    ) in text
    assert text.endswith(").")


def test_a_mixed_model_says_where_it_is_more_and_where_it_is_less():
    text = answer_of(DECODER + ENCODER)
    decoder, encoder = text.split("; in part for enc: ")
    assert decoder.startswith("Yes for dec:")
    assert encoder.startswith(
        "its rank-4 pca proxy captures 0.78–1.3× the gradient energy of normal controls early "
        "in training (step0, step25) — more than random subspaces by the exact test at step0 "
        "(2 of 2 layers, BH-adjusted p ≤ 0.022), less at step25 (95 % CIs below 1 at 2 of 2 "
        "layers)"
    )
    assert (
        "1.1–1.3× late (step400) — more than random subspaces at step400 (layer 0: 1 of 2 layers, BH-adjusted "
        "p ≤ 0.038), not significantly more at step400 (layer 1: 1 of 2 layers)" in encoder
    )


def test_a_model_below_everywhere_is_a_no_and_failed_models_are_named():
    below = ratios("enc", {"step0": [(0.8, 0.7, 0.9, 1.0)], "step25": [(0.9, 0.85, 0.95, 0.9)]})
    text = answer_of(below)
    assert text.startswith("No for enc: its rank-4 pca proxy captures 0.80–0.90× ")
    assert "less at step0, step25 (95 % CIs below 1 at 2 of 2 comparisons)" in text
    failed = [dict(r, status="failed", estimate=np.nan, ci_low=np.nan, ci_high=np.nan) for r in below]
    assert answer_of(DECODER + failed).endswith("; no answer for enc: every one of its comparisons failed.")
    assert answer_of(failed) == "No answer for enc: every one of its comparisons failed."


def test_a_run_without_energy_ratios_says_it_has_no_answer():
    from anistat.report.answer import answer_sentence

    rows = normalise_results(pd.DataFrame(DECODER).assign(metric="energy_fraction"))
    kw = dict(
        proxy="pca",
        control="normal",
        alpha=0.05,
        p_col="p_adjusted",
        multiplicity="fdr_bh",
        ci_text="95 %",
        unit_noun="checkpoint",
    )
    assert answer_sentence(rows, **kw).startswith(
        "No answer from this run: it has no energy ratio of the pca proxy against normal controls"
    )
    assert answer_sentence(rows.iloc[0:0], **kw) == "No answer: the results table has no rows."


def test_other_ranks_are_counted_in_both_directions():
    rank8 = ratios("dec", {"step0": [(0.9, 0.8, 0.95, 1.0), (1.4, 1.2, 1.6, 0.01)]}, rank=8)
    text = answer_of(DECODER + rank8)
    assert text.endswith(" At rank 8: more than random subspaces in 1 of 2 comparisons, 95 % CIs below 1 in 1.")


def test_a_null_check_answers_about_calibration():
    exact, paper = null_check_summaries(null_check_results("random@refit"), 0.05)
    text = null_check_answer((exact, paper))
    assert text.startswith(
        "Not all calibrated: this run asks whether the tests reject an uninformative (uniformly "
        "random) proxy at their nominal rate, not whether a proxy captures more; "
    )
    assert f"the exact test (Haar draws) rejects it in {exact.rejection_rate:.1%} of 200 tests" in text
    assert "consistent with a calibrated test" in text and "NOT calibrated" in text
    assert null_check_answer((exact,)).startswith("Yes, calibrated: ")
    assert null_check_answer((paper,)).startswith("No, not calibrated: ")


def test_p_values_below_the_floor_print_as_a_bound_everywhere():
    assert p_phrase(4.03e-152) == "p < 1e-16" and p_phrase(0.000271698) == "p = 0.00027"
    assert fmt_p(4.03e-152) == "< 1e-16" and fmt_p(3e-5) == "3.0e-05"
    record = {
        "id": "x",
        "passed": True,
        "status": "pass",
        "decided_by": "interval",
        "p_value": {"value": 4.03e-152, "of": "H0"},
        "evidence": {"p_vs_threshold": 4.03e-152, "tau2": 0},
    }
    card = claim_outcome(record)
    assert card.p_value == "p < 1e-16 (H0)" and ("p_vs_threshold", "< 1e-16") in card.evidence
    # a hand-made record that does not say what decided it claims no question and no decision
    bare = claim_outcome({"id": "y", "passed": True, "evidence": {"units": 16}})
    assert (bare.question, bare.decision, bare.interval_role, bare.caveat) == ("", "", "none", "")


# ------------------------------------------------------------------ claim cards


def quickstart_results() -> pd.DataFrame:
    return pd.read_csv(QUICKSTART / "results.csv")


def test_which_question_each_kind_of_claim_answers():
    results = quickstart_results()
    where = {"objective": "mlm", "rank": 4, "control": "normal", "checkpoint": "step0"}
    by_test = evaluate_claim(results, ClaimSpec(id="t", metric="energy_ratio", where=where, threshold=1.0, alpha=0.05))
    by_bound = evaluate_claim(
        results, ClaimSpec(id="b", metric="energy_ratio", where=where, threshold=1.0, column="ci_low")
    )
    by_both = evaluate_claim(
        results, ClaimSpec(id="tb", metric="energy_ratio", where=where, threshold=1.0, column="ci_low", alpha=0.05)
    )
    by_point = evaluate_claim(results, ClaimSpec(id="p", metric="energy_ratio", where=where, threshold=1.0))
    assert by_test["answers"] == ["subspaces"] and by_test["interval_role"] == "context"
    assert QUESTIONS["subspaces"] in by_test["question"]
    assert by_bound["answers"] == ["documents"] and by_bound["interval_role"] == "decided"
    assert by_both["answers"] == ["subspaces", "documents"]
    assert by_point["answers"] == [] and "describes these data only" in by_point["decision"]
    assert by_test["decision"] == (
        "all 4 rows significant by the exact test against random subspaces, largest "
        f"adjusted p = {by_test['p_value']['value']:.2g}; every estimate above 1"
    )
    assert by_test["context"].startswith("Context — effect size against normal controls: 95 % interval [")
    assert by_test["context"].endswith("not what decided this claim.") and not by_test["caveat"]
    assert "decisive: the 95 % interval [" in by_bound["decision"]
    assert by_bound["decision"].endswith("on the ratio scale of the selected row with the lowest interval end)")


def encoder_step0_claim(claim_id: str) -> ClaimSpec:
    """The claim that the quickstart encoder's step-0 rank-4 energy ratio against normal controls
    is above 1.2, by the exact test at α = 0.05."""
    return ClaimSpec(
        id=claim_id,
        metric="energy_ratio",
        threshold=1.2,
        alpha=0.05,
        where={"objective": "mlm", "rank": 4, "control": "normal", "checkpoint": "step0"},
    )


def test_a_pass_by_the_exact_test_whose_intervals_include_the_threshold_says_so():
    """The newcomer's `1.44* [0.969, 1.50]`: two answers, said as two answers. The encoder's
    step-0 rank-4 ratios (1.25–1.31, exact p ≤ 0.026) have lower bounds 1.14–1.18: they pass
    "> 1.2" by the test, while every interval includes 1.2."""
    spec = encoder_step0_claim("enc")
    record = evaluate_claim(quickstart_results(), spec)
    assert record["passed"] and record["decided_by"] == "test"
    assert record["caveat"].startswith(
        "Two answers, not one: the exact test against random subspaces says the proxy "
        "is special among random subspaces on these data; whether its ratio would stay "
        "above 1.2 over new documents is not settled — the 95 % intervals of 4 of 4 "
        "rows include 1.2"
    )
    assert not re.search(r"\[\d", record["caveat"])  # the caveat quotes no interval of its own


def test_claims_json_keeps_every_field_and_an_old_record_reads_the_same():
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    shipped = json.loads((QUICKSTART / "claims.json").read_text(encoding="utf-8"))
    fresh = evaluate_claims(quickstart_results(), protocol.claims, stats=protocol.stats)
    added = {"answers", "question", "decision", "interval_role", "context", "caveat"}
    for old, new in zip(shipped, fresh):
        assert set(old) - added <= set(new), set(old) - set(new)  # nothing removed
        assert added <= set(new)
        stripped = {k: v for k, v in new.items() if k not in added}
        assert claim_reading(stripped) == {k: new[k] for k in added}  # read back from the rule alike


# ------------------------------------------------------------------ the rendered report


def quickstart_inputs():
    return Bundle.load(QUICKSTART).report_inputs()


def test_headline_marks_both_directions_and_names_its_checkpoints():
    ctx = ReportContext(inputs=quickstart_inputs(), options=FAST)
    table = headline(ctx)
    assert [(phase, checkpoint) for phase, checkpoint, _rank in table.columns][::3] == [
        ("early", "step25"),
        ("late", "step400"),
    ]
    marks = [cell[4] for _model, _loc, cells in table.rows for cell in cells if cell]
    encoder = [cells[0] for model, _loc, cells in table.rows if model == "tiny-encoder"]
    assert all(cell[4] == "↓" for cell in encoder)  # 0.78–0.88, CIs below 1
    # no mark where the CI spans 1: the decoder's step-25 cells whose ≈ 3.5 effective documents
    # leave the default interval unbounded below (`ci_unbounded`)
    assert marks.count("↓") == 4 and marks.count("") == 6 and marks.count("↑") == len(marks) - 10
    first = summary_sentences(ctx)[0]
    assert "its 95\xa0% CI lies above 1 in 134 and below 1 in 4 of 144" in first, first


PROBE = """<script>
window.addEventListener("load", function () {
  var root = document.documentElement, bad = [];
  var question = document.getElementById("question");
  var next = question ? question.nextElementSibling : null;
  root.setAttribute("data-after-question", next ? next.id : "");
  root.setAttribute("data-answer", next ? next.textContent.slice(0, 400) : "");
  var interval = /\\[-?\\d[\\d.e+-]*, -?\\d[\\d.e+-]*\\]/;
  var cards = document.querySelectorAll("li.claim"), contexts = 0, visibleRaw = 0, closed = 0;
  cards.forEach(function (card) {
    var id = card.querySelector(".id") ? card.querySelector(".id").textContent : "?";
    var role = card.getAttribute("data-interval-role");
    Array.prototype.forEach.call(card.children, function (el) {
      if (el.matches("details.raw")) { if (!el.open) { closed += 1; } return; }
      if (el.matches(".interval-context")) {
        contexts += 1;
        if (el.textContent.indexOf("Context \\u2014 ") !== 0 || el.textContent.indexOf("not what decided this claim") < 0) {
          bad.push(id + ": context without its label");
        }
        return;
      }
      if (role !== "decided" && interval.test(el.textContent)) { bad.push(id + ": " + el.textContent.slice(0, 60)); }
    });
    if (/failing_rows|tau2|n_pass|p_adjusted_max/.test(card.innerText)) { visibleRaw += 1; }
  });
  root.setAttribute("data-cards", String(cards.length));
  root.setAttribute("data-contexts", String(contexts));
  root.setAttribute("data-closed", String(closed));
  root.setAttribute("data-visible-raw", String(visibleRaw));
  root.setAttribute("data-unlabelled", bad.join("|"));
  root.setAttribute("data-below", String(document.querySelectorAll(".headline td.ci-below").length));
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (/usr/bin/chromium)")
@pytest.mark.slow
def test_quickstart_report_in_chromium_answers_first_and_labels_every_foreign_interval(tmp_path):
    """The shipped quickstart bundle's report, rendered by this code, plus one claim that passes by the
    exact test while its intervals include its threshold."""
    from dataclasses import replace

    inputs = quickstart_inputs()
    spec = encoder_step0_claim("enc-threshold")
    extra = claim_outcome(evaluate_claim(quickstart_results(), spec))
    inputs = replace(inputs, claims=inputs.claims + (extra,))
    render_bundle(inputs, tmp_path, options=FAST)
    root = probed_root(tmp_path, PROBE, 1366)
    assert 'data-after-question="answer"' in root, root
    assert "Answer. Yes for tiny-decoder: its rank-4 pca proxy captures" in root, root
    assert 'data-unlabelled=""' in root, root
    assert 'data-cards="5"' in root and 'data-closed="5"' in root and 'data-visible-raw="0"' in root, root
    assert 'data-contexts="3"' in root and 'data-below="4"' in root, root
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Two answers, not one" in html and "4.03e-152" not in html


def test_report_tex_page_one_is_question_answer_headline_then_findings_and_cards(tmp_path):
    render_bundle(quickstart_inputs(), tmp_path, options=FAST)
    tex = (tmp_path / "report.tex").read_text(encoding="utf-8")
    order = [
        r"\textbf{Question.}",
        r"\textbf{Answer.} Yes for tiny-decoder",
        r"\begin{table}[!h]",
        r"\subsection*{Findings}",
        r"\subsection*{Claims: 4 of 4 passed}",
        r"\section{Methods}",
    ]
    places = [tex.index(marker) for marker in order]
    assert places == sorted(places), dict(zip(order, places))
    summary = tex[: places[-1]]
    for raw in ("failing\\_rows", "tau2", "n\\_pass", "p\\_adjusted\\_max", "Recorded fields", "e-152"):
        assert raw not in summary, raw
    assert r"$\downarrow$" in summary and r"\cellcolor{cibelow}" in summary
    assert "early (step25), $k=4$" in summary


@pytest.mark.skipif(
    shutil.which("pdflatex") is None or shutil.which("pdftotext") is None, reason="pdflatex / pdftotext not installed"
)
@pytest.mark.slow
def test_pdf_page_one_shows_the_answer_and_the_headline_table(tmp_path):
    from anistat.report import ReportOptions

    render_bundle(quickstart_inputs(), tmp_path, options=ReportOptions(figures=False))
    page = subprocess.run(
        ["pdftotext", "-f", "1", "-l", "1", "-layout", str(tmp_path / "report.pdf"), "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Question." in page and "Answer. Yes for tiny-decoder" in page
    assert "Table 1: Headline energy ratios" in page and "Findings" in page
    assert page.index("Answer.") < page.index("Table 1") < page.index("Findings")
    assert "PASS" not in page  # the claim cards come after
