"""`anistat plan`: the pilot's per-document law, the plan's rows, its outputs (plan.csv, plan.html,
the planned protocol) and the command end to end on a real pilot bundle and on stated inputs.
The formulas are tests/stats/test_stats_power.py's; the ≥ 500-study validation is
benchmarks/bench_plan.py."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anistat import plan
from anistat.bundle import Bundle
from anistat.stats import power


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anistat", "plan", *args], capture_output=True, text=True, timeout=300)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as stream:
        return list(csv.DictReader(stream))


def test_null_sd_carried_to_another_size_is_the_pilot_sd_at_the_pilot_size():
    law = plan.UnitLaw("m", "residual", 4, 32, 0.4, 0.03, 20, 1.0, null_documents=20, tokens_per_document=10.0)
    assert law.null_sd_at(20) == pytest.approx(0.03)
    assert law.null_sd_at(200) < 0.03 and law.null_sd_at(None) < law.null_sd_at(200)
    assert plan.UnitLaw("m", "r", 4, 32, 0.4, 0.03).null_sd_at(5) == 0.03


# ------------------------------------------------------------------------- the command
@pytest.mark.slow
def test_plan_from_the_pilot_bundle_end_to_end(mini_bundle, tmp_path):
    out = tmp_path / "plan"
    done = _cli(str(mini_bundle), "--ratio", "1.5", "--half-width", "0.2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "docs: data test" in done.stdout and done.stderr == ""
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "plan.csv", "plan.html", "protocol.yaml"]
    rows = _rows(out / "plan.csv")
    assert list(rows[0]) == list(plan.PLAN_COLUMNS)
    pilot = Bundle.load(mini_bundle)
    kinds = pilot.results[pilot.results["metric"] == "energy_fraction"][["model", "rank"]].drop_duplicates()
    assert len(rows) == len(kinds)  # one site kind (residual) per model
    # the corrected threshold is alpha over the family the pilot's analysis recorded
    m = pilot.manifest["null_settings"]["n_tests"]
    assert float(rows[0]["threshold"]) == pytest.approx(pilot.protocol.stats.alpha / m)
    for row in rows:
        assert int(row["documents_half_width_upper"]) >= int(row["documents_half_width"]) >= 10
        assert int(row["documents_data_test"]) >= 10
    html = (out / "plan.html").read_text()
    assert '<section id="plan">' in html and "<script" not in html and "What the plan assumes" in html
    validated = subprocess.run(
        [sys.executable, "-m", "anistat", "validate", str(out / "protocol.yaml")], capture_output=True, text=True
    )
    assert validated.returncode == 0, validated.stderr
    import yaml

    planned = yaml.safe_load((out / "protocol.yaml").read_text())
    assert planned["data"]["n_test_sequences"] == max(int(r["test_sequences"]) for r in rows)
    assert planned["stats"]["n_null_draws"] == int(rows[0]["null_draws"])
    assert planned["models"] == pilot.protocol.normalised()["models"]
    # planning again into the same folder replaces anistat's own files
    again = _cli(str(mini_bundle), "--ratio", "1.25", "--out", str(out))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_stated_small_study_is_planned_above_the_t_formula_end_to_end(tmp_path):
    out = tmp_path / "small"
    done = _cli(
        "--dim", "32", "--rank", "4", "--relative-sd", "0.28", "--family-size", "10",
        "--ratio", "1.5", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = _rows(out / "plan.csv")
    assert int(row["documents_data_test"]) == power.documents_for_data_test(0.28, 1.5, 0.8, 0.005)
    assert int(row["documents_data_test"]) > power.documents_for_data_test(0.28, 1.5, 0.8, 0.005, small_sample=False)


@pytest.mark.slow
def test_plan_refuses_a_folder_with_files_it_did_not_write(mini_bundle, tmp_path):
    out = tmp_path / "plan"
    assert _cli(str(mini_bundle), "--ratio", "1.5", "--out", str(out)).returncode == 0
    notes = out / "my-notes.txt"
    notes.write_text("mine")
    done = _cli(str(mini_bundle), "--ratio", "1.5", "--out", str(out))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "my-notes.txt" in done.stderr and notes.read_text() == "mine"


def test_plan_from_stated_inputs(tmp_path):
    out = tmp_path / "stated"
    done = _cli(
        "--dim", "768", "--rank", "8", "--rank", "32", "--cv-proxy", "0.7", "--cv-total", "0.5",
        "--correlation", "0.6", "--participation-ratio", "40", "--pilot-documents", "30",
        "--ratio", "1.25", "--half-width", "0.05", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = _rows(out / "plan.csv")
    assert [r["rank"] for r in rows] == ["8", "32"]
    tau = power.relative_sd(0.7, 0.5, 0.6)
    assert float(rows[0]["relative_sd"]) == pytest.approx(tau)
    assert int(rows[0]["documents_half_width"]) == power.documents_for_half_width(
        tau, 1.25, 0.05, ci_method=plan.DEFAULT_CI_METHOD, total_cv=0.5
    )
    assert float(rows[0]["threshold"]) == pytest.approx(0.05 / 2)  # Holm over the two ranks
    assert not (out / "protocol.yaml").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["/nonexistent/pilot", "--ratio", "1.2"], "no such bundle"),
        (["--dim", "16", "--rank", "20", "--relative-sd", "0.5", "--ratio", "1.2"], "--rank 20"),
        (["--dim", "16", "--rank", "2", "--relative-sd", "0.5", "--ratio", "0.9"], "--ratio must be above 1"),
        (["--dim", "16", "--rank", "2", "--ratio", "1.2"], "per-document law"),
        (["--ratio", "1.2"], "not both"),
        (["--dim", "16", "--rank", "2", "--relative-sd", "0.5", "--ratio", "1.2", "--multiplicity", "sidak"], "sidak"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    out = tmp_path / "plan"
    done = _cli(*args, "--out", str(out))
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in done.stderr
    assert not out.exists()


def test_plan_html_escapes_every_value():
    law = plan.UnitLaw("<b>m&n</b>", 'site"x', 4, 32, 0.4, 0.02)
    targets = plan.PlanTargets(ratio=1.25)
    rows = plan.plan_rows([law], targets)
    html = plan.plan_html(rows, targets, ["a <script>note</script>"], "t<i>")
    assert "<b>m" not in html and "&lt;b&gt;m&amp;n&lt;/b&gt;" in html and "site&#34;x" in html
    assert "<script>" not in html and "<i>" not in html
    assert "not asked" in html  # no half-width target: the column says so, not "unreachable"


def test_each_unit_kind_is_planned_for_its_hardest_unit_read_off_the_pilot(mini_bundle):
    """τ = √n · se / estimate of each unit's haar energy_fraction row; a kind takes the largest."""
    pilot = Bundle.load(mini_bundle)
    laws = plan.laws_from_results(pilot.results)
    fractions = pilot.results[(pilot.results["metric"] == "energy_fraction") & (pilot.results["control"] == "haar")]
    expected = np.sqrt(fractions["n_clusters"].astype(float)) * fractions["se"] / fractions["estimate"]
    assert sorted(law.relative_sd for law in laws) == pytest.approx(sorted(expected))
    # cv_t from the row's Kish n_eff of the total energies: n/n_eff = 1 + cv_t²
    cvs = np.sqrt(fractions["n_clusters"].astype(float) / fractions["n_eff"].astype(float) - 1.0)
    assert sorted(law.total_cv for law in laws) == pytest.approx(sorted(cvs))
    rows = plan.plan_rows(laws, plan.PlanTargets(ratio=1.5, family_size=48))
    for row in rows:
        kind = fractions[(fractions["model"] == row.model) & (fractions["rank"] == row.rank)]
        assert row.relative_sd == pytest.approx(float(expected[kind.index].max()))
        assert row.units == len(kind)


def test_conservative_sizes_at_the_upper_limit_and_the_exact_test_not_below_the_pilot():
    law = plan.UnitLaw("m", "residual", 4, 32, 0.3, 0.01, pilot_documents=12, null_documents=12)
    targets = plan.PlanTargets(ratio=1.5, half_width=0.1)
    (point,) = plan.plan_rows([law], targets)
    (upper,) = plan.plan_rows([law], targets, use_upper=True)
    assert point.test_sequences == point.documents_half_width
    assert upper.test_sequences == upper.documents_half_width_upper > point.test_sequences
    # a narrow null: the exact test alone would need 2 documents, but the pilot's null holds from 12 up
    assert power.documents_for_exact_test(0.3, 1.5, 0.8, 4, 32, point.null_quantile) < 12
    assert point.documents_exact_test == 12


def test_a_pilot_without_standard_errors_is_refused_in_one_line(mini_bundle, tmp_path):
    import shutil

    import pandas as pd

    pilot = tmp_path / "pilot"
    shutil.copytree(mini_bundle, pilot)
    results = pd.read_csv(pilot / "results.csv")
    results["se"] = float("nan")  # what a pilot below MIN_RESAMPLING_UNITS documents holds
    results.to_csv(pilot / "results.csv", index=False)
    done = _cli(str(pilot), "--ratio", "1.2", "--out", str(tmp_path / "plan"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "run a larger pilot" in done.stderr and not (tmp_path / "plan").exists()


def test_a_data_test_beyond_the_resample_cap_is_explained():
    """At a threshold whose tail needs more than MAX_TEST_RESAMPLES bootstrap resamples at any size
    the data test has no count, and the notes say why and what brings it in reach; at 0.005 they
    say nothing of it."""
    wide = plan.PlanTargets(ratio=1.25, family_size=432, multiplicity="fdr_bh")
    assert power.data_test_resamples(wide.threshold, None) > power.MAX_TEST_RESAMPLES
    assert power.documents_for_data_test(0.5, 1.25, 0.8, wide.threshold) is None
    (note,) = [n for n in plan.assumptions(wide, "stated") if n.startswith("Data test not planned")]
    assert (
        f"{power.data_test_resamples(wide.threshold, None):,} bootstrap resamples" in note and "--family-size" in note
    )
    narrow = plan.PlanTargets(ratio=1.25, family_size=10)
    assert not [n for n in plan.assumptions(narrow, "stated") if n.startswith("Data test not planned")]


# ------------------------------------------------------------- what is written is what is planned
QUICKSTART = Path(__file__).resolve().parents[2] / "reports" / "quickstart"


@pytest.fixture(scope="module")
def quickstart_plan(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`anistat plan` of the shipped quickstart bundle for R = 1.25 and a half-width of 0.1: its
    432-test family puts the data test out of the planner's resamples, and the half-width needs
    more documents than the quickstart's corpus holds."""
    out = tmp_path_factory.mktemp("quickstart-plan") / "plan"
    done = _cli(str(QUICKSTART), "--ratio", "1.25", "--half-width", "0.1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return done, out


@pytest.mark.slow
def test_the_planned_protocol_carries_only_what_is_planned(quickstart_plan):
    """The notes say the data test is not planned: its resamples stay the pilot's (they were
    written as the 155,519 its tail would need), plan.csv leaves them empty, and the comment names
    what the plan set."""
    import yaml

    done, out = quickstart_plan
    assert "Data test not planned" in done.stdout
    rows = _rows(out / "plan.csv")
    assert all(row["documents_data_test"] == "" and row["test_resamples"] == "" for row in rows)
    pilot = Bundle.load(QUICKSTART).protocol
    text = (out / "protocol.yaml").read_text()
    planned = yaml.safe_load(text)
    assert planned["stats"]["n_test_resamples"] == pilot.stats.n_test_resamples
    assert "stats.n_test_resamples" not in text.splitlines()[0] and "data.n_test_sequences" in text.splitlines()[0]
    assert planned["data"]["n_test_sequences"] == max(int(row["test_sequences"]) for row in rows)


@pytest.mark.slow
def test_a_plan_beyond_the_corpus_says_so_everywhere(quickstart_plan):
    """The half-width needs hundreds of documents; the quickstart's corpus holds 79: said on the
    terminal, in plan.html and in the protocol's comment, and `anistat validate` of the planned
    protocol warns that the corpus is too small."""
    done, out = quickstart_plan
    corpus = Bundle.load(QUICKSTART).manifest["corpus"]["documents"]
    rows = _rows(out / "plan.csv")
    needed = max(int(row["documents"]) for row in rows)
    assert needed > corpus
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("warning:")]
    assert f"{needed:,} documents" in line and f"holds {corpus} documents" in line
    assert f"holds {corpus} documents" in (out / "plan.html").read_text()
    comment = [line for line in (out / "protocol.yaml").read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# warning:") and f"holds {corpus} documents" in line for line in comment)
    validated = subprocess.run(
        [sys.executable, "-m", "anistat", "validate", str(out / "protocol.yaml")], capture_output=True, text=True
    )
    assert validated.returncode == 0, validated.stderr
    (warning,) = [line for line in validated.stderr.splitlines() if "corpus too small" in line]
    assert f"corpus of {corpus} documents" in warning


@pytest.mark.slow
def test_the_planned_protocol_has_its_own_name(quickstart_plan):
    import yaml

    _done, out = quickstart_plan
    assert yaml.safe_load((out / "protocol.yaml").read_text())["name"] == "quickstart-planned"
    assert plan.planned_name("x" * 64) == "x" * 56 + "-planned"


ONE_DOCUMENT_PROTOCOL = """\
anistat_protocol: 1
name: one-document
seed: 3
data: {source: text, paths: [one.txt], seq_len: 24, n_fit_sequences: 12, n_test_sequences: 16, vocab_size: 300,
       batch_size: 8}
models:
  - {name: dec, architecture: gpt2, hidden_size: 16, num_layers: 1, num_heads: 2,
     train: {steps: 2, batch_size: 4, warmup_steps: 1, checkpoints: [2]}}
proxies: {methods: [pca], ranks: [2], max_fit_tokens: 200, concept_card_tokens: 3}
controls: {kinds: [haar], n: 9}
stats: {n_bootstrap: 100}
report: {compile_pdf: false}
"""


@pytest.mark.slow
def test_a_one_document_pilot_is_counted_as_one_document_and_refused(tmp_path):
    """All of the pilot's test sequences come from one document, so its intervals resampled
    sequences: the plan does not call that "16 documents per unit" and plan fewer sequences than
    the pilot measured — it says "1 document" and refuses in one line (exit 2, nothing written)."""
    from anistat.corpus import builtin_corpus

    (tmp_path / "one.txt").write_text(builtin_corpus()[1], encoding="utf-8")
    (tmp_path / "pilot.yaml").write_text(ONE_DOCUMENT_PROTOCOL, encoding="utf-8")
    pilot = tmp_path / "pilot"
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(tmp_path / "pilot.yaml"), "--out", str(pilot)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Bundle.load(pilot).manifest["corpus"]["documents"] == 1
    out = tmp_path / "plan"
    planned = _cli(str(pilot), "--ratio", "1.5", "--out", str(out))
    assert planned.returncode == 2 and "Traceback" not in planned.stderr
    (line,) = planned.stderr.strip().splitlines()
    assert "1 document" in line and "16 test sequences" in line and "documents per unit" not in line
    assert not out.exists()


def test_never_fewer_test_sequences_than_the_pilot():
    """A pilot of 40 documents (2 sequences each) whose targets need 10 (the exact test out of
    reach, so its floor at the pilot's size does not apply): the planned test split keeps the
    pilot's 80 sequences; stated inputs (no pilot run) have no such floor."""
    law = plan.UnitLaw("m", "residual", 4, 32, 0.2, 0.1, 40, 2.0, null_documents=40, tokens_per_document=50.0)
    targets = plan.PlanTargets(ratio=1.5, half_width=0.5)
    (row,) = plan.plan_rows([law], targets)
    assert row.documents_exact_test is None and row.documents == 10
    assert row.test_sequences == 80
    (stated,) = plan.plan_rows([plan.UnitLaw("m", "residual", 4, 32, 0.2, 0.1, 40, 2.0)], targets)
    assert stated.test_sequences == 20
