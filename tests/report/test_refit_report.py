"""The refit − frozen contrast in the report (`proxies.refit: both`): a real run of the mini
protocol with both proxies, through the command line; the numbers in report.html and report.tex
are `anistat.staleness.refit_contrast`'s, and the section is absent without refitted proxies."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import MINI_PROTOCOL  # noqa: E402

from anistat.bundle import Bundle  # noqa: E402
from anistat.report import ReportOptions, render_bundle  # noqa: E402
from anistat.report._data import fmt_num  # noqa: E402
from anistat.staleness import KEYS, refit_contrast, refit_contrast_table  # noqa: E402

NUMBERS = ("frozen", "refit", "difference", "ratio")
SHOWN_KEYS = ("model", "checkpoint", "site", "rank", "proxy")


@pytest.fixture(scope="module")
def refit_bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refit-both")
    text = MINI_PROTOCOL.replace("concept_card_tokens: 3}", "concept_card_tokens: 3, refit: both}")
    assert "refit: both" in text
    (root / "refit.yaml").write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(root / "refit.yaml"), "--out", str(root / "bundle"), "-q"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return root / "bundle"


class _RefitTable(HTMLParser):
    """The header texts and the rows (cell text, data-value) of report.html's refit section."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.headers, self.rows = False, [], []
        self._cell: list | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.inside = attrs.get("id") == "refit"
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self._cell = [tag, "", attrs.get("data-value")]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag == "section":
            self.inside = False
        elif tag in ("td", "th") and self._cell is not None:
            kind, text, value = self._cell
            if kind == "th":
                self.headers.append(text)
            else:
                self.rows[-1].append((text, value))
            self._cell = None


def _section(html: str) -> _RefitTable:
    parser = _RefitTable()
    parser.feed(html)
    parser.rows = [row for row in parser.rows if row]
    return parser


@pytest.mark.slow
def test_the_report_shows_refit_contrast_numbers(refit_bundle):
    results = Bundle.load(refit_bundle).results
    expected = refit_contrast(results)  # one row per pair and control kind
    assert not expected.empty and set(expected["control"]) == {"normal", "haar"}
    html = (refit_bundle / "report.html").read_text(encoding="utf-8")
    assert '<a href="#refit">' in html
    table = _section(html)
    assert table.headers[:5] == ["model", "checkpoint", "site", "rank", "frozen proxy"]
    assert table.headers[5:] == ["frozen", "refit", "refit − frozen", "refit / frozen"]
    # the energy fraction does not depend on the control kind: each pair is shown once
    assert len(table.rows) == len(expected) // 2 == expected.drop_duplicates(list(SHOWN_KEYS)).shape[0]
    for row in table.rows:
        keys = dict(zip(SHOWN_KEYS, (text for text, _ in row[:5])))
        match = expected[
            (expected["model"] == keys["model"])
            & (expected["checkpoint"] == keys["checkpoint"])
            & (expected["site"] == keys["site"])
            & (expected["rank"].astype(int).astype(str) == keys["rank"])
            & (expected["proxy"] == keys["proxy"])
        ]
        assert len(match) == 2, keys
        for column, (text, value) in zip(NUMBERS, row[5:]):
            # the run's report shows the unrounded numbers; results.csv holds them to 10 digits (the
            # difference of two such numbers to about 1e-10)
            assert match[column].iloc[0] == match[column].iloc[1], (keys, column)
            assert float(value) == pytest.approx(match[column].iloc[0], rel=1e-9, abs=1e-9), (keys, column)
            assert text == fmt_num(float(value), 3)
        assert float(row[7][1]) == float(row[6][1]) - float(row[5][1])
    assert "went stale" in html


@pytest.mark.slow
def test_report_tex_has_the_same_table(refit_bundle):
    tex = (refit_bundle / "report.tex").read_text(encoding="utf-8")
    assert r"\section{Frozen against refitted proxies}" in tex and r"\label{tab:refit-contrast}" in tex
    body = tex.split(r"\label{tab:refit-contrast}", 1)[1].split(r"\endhead", 1)[1].split(r"\bottomrule", 1)[0]
    lines = [line for line in body.strip().splitlines() if line.endswith(r"\\")]
    shown = refit_contrast_table(Bundle.load(refit_bundle).results)
    assert len(lines) == len(shown)
    for line, (_, row) in zip(lines, shown.iterrows()):
        cells = [c.strip() for c in line.removesuffix(r"\\").split("&")]
        assert cells[0] == row["model"] and cells[3] == str(int(row["rank"]))
        assert cells[5:] == [r"\num{" + fmt_num(row[c], 3) + "}" for c in NUMBERS]


@pytest.mark.slow
def test_no_section_without_refitted_proxies_and_text_is_escaped(refit_bundle, tmp_path):
    bundle = Bundle.load(refit_bundle)
    options = ReportOptions(figures=False, compile_pdf=False)
    frozen_only = bundle.results[~bundle.results["proxy"].astype(str).str.endswith("@refit")]
    plain = replace(bundle, results=frozen_only.reset_index(drop=True))
    (tmp_path / "plain").mkdir()
    render_bundle(plain.report_inputs(), tmp_path / "plain", options=options)
    assert plain.report_inputs().refit_contrast.empty
    assert 'id="refit"' not in (tmp_path / "plain" / "report.html").read_text(encoding="utf-8")
    assert "refitted proxies}" not in (tmp_path / "plain" / "report.tex").read_text(encoding="utf-8")

    hostile = bundle.results.replace({"model": {"dec": "<b>d&c_%"}})
    marked = replace(bundle, results=hostile)
    (tmp_path / "hostile").mkdir()
    render_bundle(marked.report_inputs(), tmp_path / "hostile", options=options)
    html = (tmp_path / "hostile" / "report.html").read_text(encoding="utf-8")
    section = html.split('<section id="refit">', 1)[1].split("</section>", 1)[0]
    assert "<td>&lt;b&gt;d&amp;c_%</td>" in section and "<b>d" not in section
    tex = (tmp_path / "hostile" / "report.tex").read_text(encoding="utf-8")
    refit_tex = tex.split(r"\label{tab:refit-contrast}", 1)[1]
    assert re.search(r"^\\textless\{\}b\\textgreater\{\}d\\&c\\_\\% & ", refit_tex, re.M), refit_tex[:400]


def _rows(**changes) -> list[dict]:
    base = {"objective": "clm", "checkpoint": "s9", "step": 9, "phase": "late", "layer": 0, "site": "residual.0"}
    base.update(model="m", rank=2, metric="energy_fraction", status="ok", **changes)
    return [
        {**base, "proxy": proxy, "control": control, "estimate": value}
        for proxy, control, value in (
            ("pca", "normal", 0.2),
            ("pca", "haar", 0.2),
            ("pca@refit", "normal", 0.5),
            ("pca@refit", "haar", 0.5),
        )
    ]


def test_the_shown_table_collapses_control_kinds_only_when_their_numbers_agree():
    agree = pd.DataFrame(_rows())
    shown = refit_contrast_table(agree)
    assert len(shown) == 1 and "control" not in shown.columns
    assert shown.loc[0, "difference"] == pytest.approx(0.3) and shown.loc[0, "ratio"] == pytest.approx(2.5)
    differ = agree.copy()
    differ.loc[3, "estimate"] = 0.6  # refit under haar differs: the control kind must stay visible
    kept = refit_contrast_table(differ)
    assert list(kept["control"]) == ["normal", "haar"]
    assert kept.equals(refit_contrast(differ))
    assert refit_contrast_table(agree[agree["proxy"] == "pca"]).empty
    assert refit_contrast_table(pd.DataFrame(columns=["model", "metric", "estimate"])).empty
    assert set(KEYS) - {"control"} <= set(shown.columns)
