"""Small report items of issue #22: in the tables of control-independent metrics the significance
stars follow the proxy's estimate (its test), not the control means; an evidence name such as
"pooled" never wraps inside the word ("poo/led") in the HTML claim cards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_report_inputs import CHROMIUM, FAST, plan_results, probed_root, quickstart_manifest  # noqa: E402

from anistat.bundle import report_inputs  # noqa: E402
from anistat.protocol import load_protocol  # noqa: E402
from anistat.report import ReportOptions, render_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_stars_of_a_control_independent_metric_follow_the_estimate(tmp_path):
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    render_bundle(
        report_inputs(protocol, plan_results(protocol), quickstart_manifest(protocol)),
        tmp_path,
        options=ReportOptions(compile_pdf=False, figures=False, table_metrics=("anisotropy_capture",)),
    )
    tables = (tmp_path / "tables.tex").read_text(encoding="utf-8")
    label = tables.index(r"\label{tab:quickstart-anisotropy-capture}")
    block = tables[tables.rindex(r"\begin{table}", 0, label) :]
    head = next(line for line in block.splitlines() if line.startswith(" &  &  &  & {Est.}"))
    # Est., its mark, the CI, then one plain mean per control kind
    assert head.split("&")[4:] == [" {Est.} ", "  ", r" 95~\% CI ", " {Mean} ", r" {Mean} \\"]
    row = next(line for line in block.splitlines() if "step400 (late) & L0 & 4 &" in line)
    cells = [c.strip() for c in row.rstrip("\\ ").split("&")]
    assert cells[5] == r"\textsuperscript{***}" and cells[6].startswith("[")  # the estimate's mark
    assert all(r"\textsuperscript" not in c for c in cells[7:])  # none after the control means
    assert "Marks: the proxy's own test (shared by the control kinds)" in block


PROBE = """<script>
window.addEventListener("load", function () {
  var broken = [];
  // the evidence sits in the card's collapsed "Recorded fields" block: open it to lay it out
  document.querySelectorAll("details.raw").forEach(function (d) { d.open = true; });
  document.querySelectorAll(".evidence dt").forEach(function (dt) {
    var range = document.createRange();  // the text's own line boxes (the dt may be stretched)
    range.selectNodeContents(dt);
    if (range.getClientRects().length > 1) { broken.push(dt.textContent); }
  });
  document.documentElement.setAttribute("data-broken", broken.join("|"));
  document.documentElement.setAttribute("data-count", String(document.querySelectorAll(".evidence dt").length));
});
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (/usr/bin/chromium)")
@pytest.mark.parametrize("width", [1400, 600])
def test_evidence_names_never_wrap_inside_a_word(tmp_path, width):
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    claim = {
        "id": "decoder-doubling",
        "passed": True,
        "status": "pass",
        "statement": "twice the energy",
        "interval": {"low": 1.94, "high": 2.34, "level": 0.95, "of": "pooled log2_energy_ratio"},
        "evidence": {
            "pooled": "1 cluster summaries (model; mean of 72–72 rows each, within-cluster correlation "
            "1); a single independent unit: the interval covers its data sampling " * 2,
            "interval": "wald (a single unit: its own interval)",
            "k": 1,
        },
    }
    inputs = report_inputs(protocol, plan_results(protocol), quickstart_manifest(protocol), claims=[claim])
    render_bundle(inputs, tmp_path, options=FAST)
    root = probed_root(tmp_path, PROBE, width)
    assert 'data-count="3"' in root, root
    assert 'data-broken=""' in root, root
