"""The report's typed inputs and what the report says from them: methods text generated from the
protocol (golden test for protocols/quickstart.yaml), run warnings in both documents, row counts
from the written table, per-source settings, control-independent metrics shown once, the one
publish path and bundle reading, and the HTML's layout at 1400 px in headless Chromium."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _helpers import CHROMIUM, run_chromium  # noqa: E402
from test_report_fixtures import (  # noqa: E402
    make_claims,
    make_inputs,
    make_protocol,
    make_results,
    null_check_results,
)

from anistat.bundle import (  # noqa: E402
    Bundle,
    RunFacts,
    publish_bundle,
    report_inputs,
)
from anistat.errors import AnistatInputError  # noqa: E402
from anistat.protocol import load_protocol, parse_protocol  # noqa: E402
from anistat.report import ReportOptions, render_bundle  # noqa: E402
from anistat.report._content import ReportContext, methods  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "golden" / "quickstart_methods.txt"
FAST = ReportOptions(compile_pdf=False, figures=False)
WARNING = "99 controls cannot pass this corrected family: the smallest p is 1/100"


def plan_results(protocol, proxies=("pca",)) -> pd.DataFrame:
    """A results table shaped exactly like the plan of `protocol` for built-in residual sites:
    model × checkpoint × residual.L × rank × proxy × control × metric, with deterministic numbers.
    The oracle rows come first in each unit with proxy 'oracle' (as the analysis writes them).
    Anisotropy capture and ΔIsoScore* have the same estimate under every control kind (as the
    analysis writes them); only their control mean differs."""
    rows = []
    for m, model in enumerate(protocol.models):
        n_ck = len(model.train.checkpoints)
        n_early = max(1, int(np.ceil(protocol.proxies.fit_window * n_ck - 1e-9)))
        for c, step in enumerate(model.train.checkpoints):
            for layer in range(model.num_layers):
                unit = dict(
                    model=model.name,
                    objective=model.resolved_objective,
                    checkpoint=f"step{step}",
                    step=step,
                    phase="early" if c < n_early else "late",
                    layer=layer,
                    site=f"residual.{layer}",
                    dim=model.hidden_size,
                    n_sequences=protocol.data.n_test_sequences,
                    n_tokens=4032 if model.resolved_objective == "clm" else 580 + 7 * c + layer,
                    status="ok",
                    note="",
                    ci_method="studentized",
                )
                for k in protocol.proxies.ranks:
                    base = 0.1 + 0.01 * (m + c + layer) + k / 200
                    rows.append(
                        {
                            **unit,
                            "rank": k,
                            "proxy": "oracle",
                            "control": "none",
                            "metric": "oracle_fraction",
                            "estimate": 2 * base,
                            "ci_method": "none",
                        }
                    )
                    for j, (proxy, control) in enumerate((p, c) for p in proxies for c in protocol.controls.kinds):
                        common = {
                            **unit,
                            "rank": k,
                            "proxy": proxy,
                            "control": control,
                            "n_controls": 11519,
                            "p_value": 0.0001,
                            "p_adjusted": 0.0003,
                            "p_test": "haar_monte_carlo",
                            "p_value_paper": 0.01,
                            "n_clusters": 41 - layer,
                        }
                        rows.append(
                            {
                                **common,
                                "metric": "energy_ratio",
                                "estimate": 1.5 + j + base,
                                "ci_low": 1.4 + j + base,
                                "ci_high": 1.6 + j + base,
                                "control_mean": 1.0,
                            }
                        )
                        rows.append(
                            {
                                **common,
                                "metric": "anisotropy_capture",
                                "estimate": base,
                                "ci_low": base - 0.01,
                                "ci_high": base + 0.01,
                                "control_mean": -0.01 * (j + 1),
                            }
                        )
                        rows.append(
                            {
                                **common,
                                "metric": "delta_isoscore_star",
                                "estimate": base / 3,
                                "control_mean": 0.001 * (j + 1),
                                "ci_method": "none",
                            }
                        )
    return pd.DataFrame(rows)


def quickstart_manifest(protocol) -> dict:
    return {
        "protocol": protocol.normalised(),
        "protocol_sha256": protocol.sha256(),
        "versions": {"anistat": "0.1.0"},
        "device": "cpu",
        "finished_at": "2026-01-01T00:00:00+00:00",
        "corpus": {"name": "builtin", "documents": 79},
        "warnings": [WARNING],
        "null_settings": {"n_null_draws": 11519, "n_permutations": 11519, "n_tests": 576},
    }


def methods_text(inputs) -> str:
    ctx = ReportContext(inputs=inputs, options=FAST)
    return "\n\n".join(p.plain() for p in methods(ctx)) + "\n"


# ------------------------------------------------------------------ methods text


def test_quickstart_methods_text_matches_the_golden_file():
    """The methods text is generated from the typed run description of the shipped quickstart
    protocol. Regenerate after an intended change with ANISTAT_UPDATE_GOLDEN=1."""
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    results = plan_results(protocol)
    text = methods_text(report_inputs(protocol, results, quickstart_manifest(protocol)))
    if os.environ.get("ANISTAT_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_methods_text_states_what_the_protocol_says():
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    text = methods_text(report_inputs(protocol, plan_results(protocol), quickstart_manifest(protocol)))
    proxies = text[text.index("Proxies and gradients.") : text.index("Controls.")]
    # the proxy methods are the protocol's, never the metric/control placeholders
    assert "fitted with PCA" in proxies and "oracle" not in proxies and "none" not in proxies
    assert "k ∈ {4, 8, 16}" in proxies and "early-phase checkpoints (the earliest 30 %" in proxies
    # the number of controls is the protocol's n, not the range of a count column
    controls = text[text.index("Controls.") : text.index("Metrics.")]
    assert "draws made at analysis time from each unit's gradient second moment" in controls
    assert "–" not in controls and "against the first 99 draws of the row's own control kind" in text
    # IsoScore*'s C0 and zeta from stats.isoscore_c0 / stats.isoscore_zeta
    assert "C0 = scaled_identity" in text and "ζ = 0.1" in text
    assert "Benjamini–Hochberg correction over all tests of the run" in text
    assert "2 models: tiny-decoder" in text
    assert "6 checkpoints (step0 … step400); early phase (the first 30 % of the checkpoints): step0, step25" in text


def test_methods_text_follows_the_protocol_not_the_fixture_values():
    """Changing the protocol's C0, zeta, n and correction changes the text accordingly."""
    protocol = make_protocol(
        controls={"n": 7}, stats={"isoscore_c0": "identity", "isoscore_zeta": 0.25, "multiplicity": "none"}
    )
    inputs = make_inputs(make_results(with_failed=False), protocol=protocol)
    text = methods_text(inputs)
    assert "smallest attainable p with n = 7: 1/8" in text
    assert "C0 = identity" in text and "ζ = 0.25" in text
    assert "not adjusted for multiplicity" in text


def test_statistics_paragraph_reads_new_result_columns_when_present():
    protocol = make_protocol()
    results = make_results(with_failed=False)
    results["p_test"] = "haar_monte_carlo"
    results["p_value_paper"] = 0.05
    results["n_clusters"] = 31
    text = methods_text(make_inputs(results, protocol=protocol))
    assert "p_value comes from an exact Monte-Carlo test against uniformly random (Haar) subspaces" in text
    assert "p_value_paper" in text and "not exact" in text
    assert "resampling unit is the document (31 documents per unit)" in text
    # without the new columns (an older bundle) the text says what that bundle did
    old = methods_text(make_inputs(make_results(with_failed=False), protocol=protocol))
    assert "resampling unit is the sequence" in old and "Haar" not in old


# ------------------------------------------------------------------ warnings, counts, settings


@pytest.mark.slow
def test_run_warnings_are_prominent_in_html_and_latex(tmp_path):
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    results = plan_results(protocol)
    inputs = report_inputs(protocol, results, quickstart_manifest(protocol))
    assert inputs.warnings == (WARNING,)
    render_bundle(inputs, tmp_path, options=FAST)
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    box = html[html.index('id="run-warnings"') :]
    assert WARNING in box[: box.index("</div>")]
    # first in the summary, before the question and claims, and never inside a collapsed block
    assert html.index('id="run-warnings"') < html.index('class="question"')
    assert WARNING not in "".join(re.findall(r"<details>.*?</details>", html, re.S))
    tex = (tmp_path / "report.tex").read_text(encoding="utf-8")
    assert r"\textbf{Run warnings (1).}" in tex and WARNING.replace("%", r"\%") in tex
    assert tex.index("Run warnings") < tex.index(r"\textbf{Question.}") < tex.index(r"\section{Methods}")


def test_header_counts_the_rows_of_the_written_results_table(tmp_path):
    results = make_results(with_buckets=True)  # bucket rows travel in frequency.csv, not results.csv
    inputs = make_inputs(results)
    render_bundle(inputs, tmp_path, options=FAST)
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    n_written = len(inputs.results)
    assert n_written < len(results)
    assert f"{n_written} result rows" in html and f"{len(results)} result rows" not in html


def test_settings_table_shows_only_the_settings_of_each_source(tmp_path):
    protocol = parse_protocol(
        {
            "anistat_protocol": 1,
            "name": "mixed",
            "models": [
                {"name": "mine", "source": "local", "path": str(tmp_path)},
                {"name": "tiny", "source": "builtin", "architecture": "gpt2", "hidden_size": 16, "num_heads": 2},
            ],
            "proxies": {"ranks": [2]},
        }
    )
    rows = report_inputs(protocol, pd.DataFrame(columns=["model", "metric", "estimate"]), {}).run.settings
    keys = {k for _s, k, _v in rows}
    assert "models.mine.path" in keys
    assert not any(k.startswith(("models.mine.hidden_size", "models.mine.train", "models.mine.num_")) for k in keys)
    assert {"models.tiny.hidden_size", "models.tiny.train.steps"} <= keys
    assert "data.paths" not in keys and "data.dataset_split" not in keys


@pytest.mark.slow
def test_control_independent_metrics_are_shown_once_in_tables_tex(tmp_path):
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    results = plan_results(protocol)
    render_bundle(
        report_inputs(protocol, results, quickstart_manifest(protocol)),
        tmp_path,
        options=ReportOptions(
            compile_pdf=False,
            figures=False,
            table_metrics=("energy_ratio", "anisotropy_capture", "delta_isoscore_star"),
        ),
    )
    tables = (tmp_path / "tables.tex").read_text(encoding="utf-8")
    blocks = tables.split(r"\begin{table}")[1:]
    by_label = {re.search(r"\\label\{tab:quickstart-([a-z-]+)\}", b).group(1): b for b in blocks}
    for name in ("anisotropy-capture", "delta-isoscore-star"):
        block = by_label[name]
        assert "shown once" in block and "normal controls (mean)" in block and "haar controls (mean)" in block
    # one decoder unit at the last late checkpoint: layer 0, rank 4 — the estimate appears once
    last = results[
        (results["checkpoint"] == "step400")
        & (results["model"] == "tiny-decoder")
        & (results["layer"] == 0)
        & (results["rank"] == 4)
    ]
    capture = last[last["metric"] == "anisotropy_capture"]["estimate"].iloc[0]
    row = next(
        line for line in by_label["anisotropy-capture"].splitlines() if "step400" in line and "& L0 & 4 &" in line
    )
    assert row.count(f"{capture:.3g}") == 1, row
    # the energy ratio depends on the control kind: one column group per kind
    assert "normal controls" in by_label["energy-ratio"] and "shown once" not in by_label["energy-ratio"]


# ------------------------------------------------------------------ one publish path


@pytest.mark.slow
def test_publish_then_read_back_then_rerender_and_verify(tmp_path):
    from anistat.rerender import rerender
    from anistat.verify import verify_bundle

    protocol = make_protocol()
    results = make_results(with_failed=False)
    results["rank"] = results["rank"].astype(float)  # as the analysis writes it (4.0)
    facts = RunFacts(
        device="cpu",
        started_at="2026-01-01T00:00:00+00:00",
        seconds=1.5,
        corpus={"name": "builtin", "documents": 3},
        models={},
        units=({"id": "u", "status": "ok", "note": "", "seconds": 1.0},),
        warnings=(WARNING,),
    )
    out = tmp_path / "bundle"
    published = publish_bundle(out, protocol, results, pd.DataFrame(), make_claims(), [], facts, options=FAST)
    assert published.manifest["warnings"] == [WARNING]
    assert {"results.csv", "report.html", "tables.tex", "report.tex", "concept_cards.json"} <= set(
        published.manifest["files"]
    )
    head, first = (out / "results.csv").read_text(encoding="utf-8").splitlines()[:2]
    row = dict(zip(head.split(","), first.split(",")))
    assert row["rank"] == "4" and row["n_sequences"] == "64" and row["n_controls"] == ""  # integers stay integers
    contents = Bundle.load(out)
    assert len(contents.results) == len(results) and contents.manifest == published.manifest
    assert contents.protocol == protocol and contents.report_inputs().warnings == (WARNING,)
    before = (out / "report.html").read_text(encoding="utf-8")
    rerender(out, compile_pdf=False)
    after = (out / "report.html").read_text(encoding="utf-8")
    assert WARNING in after and f"{len(results)} result rows" in after
    assert before.count(WARNING) == after.count(WARNING) == 1
    assert verify_bundle(out).integrity_ok
    with pytest.raises(AnistatInputError, match=r"unknown metric\(s\) energy_ratoi; this bundle has: .*energy_ratio"):
        rerender(out, metrics="energy_ratoi", compile_pdf=False)


# ------------------------------------------------------------------ layout in a real browser


def probed_root(bundle: Path, probe: str, width: int) -> str:
    """The `<html>` tag of the bundle's report.html after headless Chromium ran `probe` (a
    script that writes its findings into data- attributes) at a window `width` px wide."""
    page = bundle / "probe.html"
    page.write_text(
        (bundle / "report.html").read_text(encoding="utf-8").replace("</body>", probe + "</body>"), encoding="utf-8"
    )
    proc = run_chromium(
        bundle / "profile",
        f"--window-size={width},900",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return re.search(r"<html\b[^>]*>", proc.stdout).group(0)


VIEWPORT_PROBE = """<script>
window.addEventListener("load", function () {
  var root = document.documentElement, vw = root.clientWidth, wide = [];
  document.querySelectorAll("body *").forEach(function (e) {
    if (e.parentElement && e.parentElement.closest(".scroll, .tablewrap")) { return; }  // clipped by a scroll container
    var r = e.getBoundingClientRect();
    if (r.right > vw + 1) { wide.push(e.tagName.toLowerCase() + "." + e.className + ":" + Math.round(r.right)); }
  });
  root.setAttribute("data-viewport", String(vw));
  root.setAttribute("data-scroll-width", String(root.scrollWidth));
  root.setAttribute("data-too-wide", wide.slice(0, 12).join("|"));
});
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (/usr/bin/chromium)")
@pytest.mark.parametrize("width", [1400, 600])
def test_no_element_is_wider_than_the_viewport(tmp_path, width):
    """The meta-analysis claim card (many evidence fields) used to overflow at 1400 px."""
    meta_claim = {
        "id": "decoder-doubling",
        "passed": True,
        "statement": "Pooled over layers, ranks and checkpoints, the proxy captures twice the energy",
        "evidence": {
            "meta_estimate": 2.14131,
            "meta_ci_low": 1.95351,
            "meta_ci_high": 2.32911,
            "tau2": 0.660442,
            "i2": 0.999266,
            "k": 72,
            "estimate_min": 0.775697,
            "estimate_max": 4.08689,
            "p_adjusted_max": 0.0130909,
            "selected_units": "tiny-decoder/step0/residual.0_" * 6,
        },
    }
    inputs = make_inputs(make_results(), claims=make_claims() + [meta_claim])
    render_bundle(inputs, tmp_path, options=FAST)
    root = probed_root(tmp_path, VIEWPORT_PROBE, width)
    viewport = int(re.search(r'data-viewport="(\d+)"', root).group(1))
    scroll_width = int(re.search(r'data-scroll-width="(\d+)"', root).group(1))
    assert viewport > 0.9 * width - 40, root
    assert 'data-too-wide=""' in root, root
    assert scroll_width <= viewport, root


def test_null_check_of_a_random_proxy_run_is_stated_and_plotted(tmp_path):
    from anistat.bundle import null_check_summaries
    from anistat.report._content import null_check_sentences

    exact, paper = null_check_summaries(null_check_results("random"), 0.05)
    assert (exact.test, paper.test) == ("exact", "paper") and len(exact.p_values) == 200
    assert exact.calibrated and not paper.calibrated and paper.rejection_rate > 0.15
    protocol = load_protocol(ROOT / "protocols" / "quickstart.yaml")
    inputs = report_inputs(protocol, plan_results(protocol), quickstart_manifest(protocol))
    assert inputs.null_checks == ()  # a PCA run has no null check
    from dataclasses import replace

    ctx = ReportContext(inputs=replace(inputs, null_checks=(exact, paper)), options=FAST)
    sentences = null_check_sentences(ctx)
    assert "consistent with a calibrated test" in sentences[0] and "NOT calibrated" in sentences[1]
    from anistat.report.figures import fig_null_check

    spec = fig_null_check(pd.DataFrame(), {"null_checks": (exact, paper)})
    assert spec.name == "null_check" and "NOT calibrated" in spec.caption
    assert fig_null_check(pd.DataFrame(), {}) == "no uninformative (random) proxy in this run"
