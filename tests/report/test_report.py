"""Report stage: files, escaping, self-containment, determinism, robustness, options."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _helpers import CHROMIUM, run_chromium  # noqa: E402
from test_report_fixtures import (  # noqa: E402
    COLUMNS,
    make_claims,
    make_extras,
    make_inputs,
    make_manifest,
    make_protocol,
    make_results,
    split_buckets,
)

from anistat.report import PdfLatexError, ReportOptions, render_bundle  # noqa: E402
from anistat.report.escape import tex  # noqa: E402
from anistat.report.figures import FIGURES  # noqa: E402

NO_PDF = ReportOptions(compile_pdf=False)
FAST = ReportOptions(compile_pdf=False, figures=False)
XSS = "<script>alert(1)</script>"
TEXY = "tiny_bert & 50% $#{}~^\\ é 模"
IMG_RE = re.compile(r"<img\b[^>]*>", re.I)


def _render(
    tmp: Path, results: pd.DataFrame, name: str = "bundle", *, options: ReportOptions = NO_PDF, **kw
) -> tuple[Path, list[Path]]:
    """Render through the one adapter; `kw`: manifest, protocol, claims, extras (see make_inputs)."""
    out = tmp / name
    out.mkdir()
    paths = render_bundle(make_inputs(results, **kw), out, options=options)
    return out, paths


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A bundle whose user strings try to break out of HTML."""
    res = make_results(with_buckets=True)
    res.loc[res["model"] == "tiny-gpt2", "model"] = XSS
    res.loc[res["model"] == "tiny-bert", "model"] = TEXY
    res.loc[res["status"] == "failed", "note"] = "bad <b>gradients</b> & NaN"
    protocol = make_protocol(title="<img src=x onerror=alert(2)>", description=XSS + " description")
    man = make_manifest()
    claims = make_claims() + [{"id": "<i>x</i>", "statement": XSS, "passed": False, "evidence": {"<k>": XSS}}]
    extras = make_extras()
    extras["frequency"].loc[0, "model"] = XSS  # the frequency table escapes too
    extras["frequency"].loc[1, "site"] = TEXY
    extras["concept_cards"][0]["top_tokens"].append("</span>" + XSS)
    extras["concept_cards"][0]["contexts"].append('" onmouseover="alert(3)')
    man["warnings"].append(XSS)
    tmp = tmp_path_factory.mktemp("hostile")
    t0 = time.perf_counter()
    out, paths = _render(tmp, res, manifest=man, protocol=protocol, claims=claims, extras=extras)
    seconds = time.perf_counter() - t0
    return tmp, out, paths, (out / "report.html").read_text(encoding="utf-8"), res, seconds


@pytest.mark.slow
def test_writes_bundle_files_only_inside_out_dir(hostile):
    tmp, out, paths = hostile[:3]
    assert [p.name for p in tmp.iterdir()] == ["bundle"]
    names = {p.relative_to(out).as_posix() for p in paths}
    assert {"report.html", "tables.tex", "report.tex"} <= names
    for fig in (name for name, _figure, _full in FIGURES if name != "null_check"):  # no random proxy here
        assert f"figures/{fig}.pdf" in names
        assert (out / "figures" / f"{fig}.pdf").read_bytes().startswith(b"%PDF")
    assert "report.pdf" not in names
    assert all(p.exists() and out in p.parents for p in paths)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_user_strings_are_html_escaped(hostile):
    html = hostile[3]
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(2)&gt;" in html
    assert not re.search(r"<img\s+src=x", html)
    assert '" onmouseover="alert(3)' not in html
    assert "<b>gradients</b>" not in html and "bad &lt;b&gt;gradients&lt;/b&gt; &amp; NaN" in html
    assert "<i>x</i>" not in html
    # Only the report's own two scripts exist.
    assert len(re.findall(r"<script\b", html, re.I)) == 2


@pytest.mark.slow
def test_html_is_self_contained(hostile):
    html = hostile[3]
    low = html.lower()
    for bad in ("http://", "https://", "//cdn", 'src="http', "src='http", "<link", "@import", "url("):
        assert bad not in low, bad


@pytest.mark.slow
def test_every_img_is_a_png_data_uri(hostile):
    out, html = hostile[1], hostile[3]
    imgs = IMG_RE.findall(html)
    assert len(imgs) == len(list((out / "figures").glob("*.pdf"))) == 7
    for tag in imgs:
        src = re.search(r'src="([^"]*)"', tag).group(1)
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        w = int(re.search(r'width="(\d+)"', tag).group(1))
        h = int(re.search(r'height="(\d+)"', tag).group(1))
        assert (w, h) == (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"))
        assert w > 100 and h > 100


@pytest.mark.slow
def test_summary_comes_first_and_sections_exist(hostile):
    html = hostile[3]
    order = [html.index(f'id="{s}"') for s in ("summary", "figures", "concepts", "methods", "results", "failed")]
    assert order == sorted(order)
    assert "PASS" in html and "FAIL" in html
    assert "Question." in html
    # Methods name the control kinds, their count, multiplicity and software versions.
    methods = html[html.index('id="methods"') : html.index('id="results"')]
    for needle in (
        "normal",
        "haar",
        "with n = 20: 1/21",
        "Holm",
        "torch 2.13.0",
        "10000 bootstrap resamples",
        "10000 resamples, tails expanded",
        "C0 = scaled_identity",
        "ζ = 0.5",
    ):
        assert needle in methods, needle
    # Raw draws are absent, so the null figure says it is an approximation.
    assert "normal density with the recorded control mean and SD" in html


@pytest.mark.slow
def test_failed_units_shown_with_reason(hostile):
    html = hostile[3]
    failed = html[html.index('<section id="failed"') :]
    assert "tiny_bert &amp; 50%" in failed and "step400" in failed
    assert "bad &lt;b&gt;gradients&lt;/b&gt; &amp; NaN" in failed
    assert 'class="failed"' in html


@pytest.mark.slow
def test_csv_round_trip_renders_identically(tmp_path):
    # One model keeps this quick; every figure kind is still drawn (PNG bytes are in the HTML).
    res = make_results(models=(("tiny-bert", "mlm"),), with_buckets=True)
    kw = dict(claims=make_claims(), extras=make_extras())
    out1, _ = _render(tmp_path, res, "a", **kw)
    csv = tmp_path / "results.csv"
    res.to_csv(csv, index=False)
    back = pd.read_csv(csv)
    out2, _ = _render(tmp_path, back, "b", **kw)
    for name in ("report.html", "tables.tex", "report.tex"):
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name
    for pdf in sorted((out1 / "figures").iterdir()):
        assert pdf.read_bytes() == (out2 / "figures" / pdf.name).read_bytes(), pdf.name
    assert b"CreationDate" not in (out1 / "figures" / "forest_effects.pdf").read_bytes()


@pytest.mark.slow
def test_each_figure_file_is_one_draw_and_the_same_bytes_as_with_the_layout_engine(tmp_path, monkeypatch):
    """save_figure drops the placeholder engine tight_layout leaves behind, so savefig skips its
    extra layout draw: one draw per PDF and per PNG, and byte for byte what the extra draw gave."""
    from matplotlib.figure import Figure

    res = make_results(models=(("tiny-bert", "mlm"),), with_buckets=True)
    kw = dict(claims=make_claims(), extras=make_extras())
    draws = {"n": 0}
    real_draw = Figure.draw

    def counted(self, renderer):
        draws["n"] += 1
        return real_draw(self, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    fast, _ = _render(tmp_path, res, "fast", **kw)
    n_files = len(list((fast / "figures").iterdir()))
    assert n_files >= 8 and draws["n"] == n_files
    # the previous behaviour: the placeholder engine stays, so every savefig of a figure laid out by
    # tight_layout (the single-panel ones; panel grids use fixed spacing) draws twice
    real_set = Figure.set_layout_engine
    monkeypatch.setattr(
        Figure,
        "set_layout_engine",
        lambda self, layout=None, **k: None if layout is None else real_set(self, layout, **k),
    )
    draws["n"] = 0
    slow, _ = _render(tmp_path, res, "slow", **kw)
    assert n_files < draws["n"] < 2 * n_files
    for path in sorted((fast / "figures").iterdir()):
        assert path.read_bytes() == (slow / "figures" / path.name).read_bytes(), path.name
    assert (fast / "report.html").read_bytes() == (slow / "report.html").read_bytes()


@pytest.mark.slow
def test_missing_metrics_and_figures_are_skipped(tmp_path):
    res = make_results()
    res = res[res["metric"].isin(["energy_fraction", "oracle_fraction"])]
    out, _ = _render(tmp_path, res, manifest={}, extras={"calibration": pd.DataFrame({"foo": [1, 2]})})
    html = (out / "report.html").read_text()
    assert "Not shown (no data)" in html
    assert "no delta_isoscore_star rows" in html and "no calibration data" in html
    assert {p.stem for p in (out / "figures").glob("*.pdf")} == {"null_distribution", "proxy_oracle_controls"}
    assert "% No table" in (out / "tables.tex").read_text()


def test_empty_and_all_failed_results(tmp_path):
    empty = pd.DataFrame(columns=COLUMNS)
    out, _ = _render(tmp_path, empty, "empty", manifest={})
    assert "<html" in (out / "report.html").read_text()
    res = make_results()
    res["status"] = "failed"
    res["note"] = "out of memory"
    res[["estimate", "ci_low", "ci_high", "control_mean", "control_sd"]] = np.nan
    out, _ = _render(tmp_path, res, "failed")
    html = (out / "report.html").read_text()
    assert "out of memory" in html and "16 unit(s) failed" in html
    assert not list((out / "figures").glob("*.pdf")) if (out / "figures").exists() else True


def test_extra_metrics_columns_and_odd_types(tmp_path):
    res = make_results(with_failed=False)
    extra = res[res["metric"] == "oracle_fraction"].copy()
    extra["metric"] = "participation_ratio"
    res = pd.concat([res, extra], ignore_index=True)
    res["seed"] = 7
    res["layer"] = res["layer"].astype(str)  # labels may arrive as strings
    res = res.drop(columns=["ci_method", "n_tokens"])  # and columns may be missing
    out, _ = _render(
        tmp_path,
        res,
        claims=[{"id": "c", "statement": "s", "passed": True}],
        options=ReportOptions(
            compile_pdf=False, figures=False, html_columns=("model", "layer", "metric", "estimate", "seed", "status")
        ),
    )
    html = (out / "report.html").read_text()
    assert "participation_ratio" in html and ">seed<" in html
    assert "Further metrics reported: participation_ratio" in html


def test_options_change_tables_and_title(tmp_path):
    res = make_results()
    opts = ReportOptions(
        compile_pdf=False,
        figures=False,
        title="My & title",
        transpose_tables=True,
        table_metrics=("energy_ratio", "hedges_g", "nope"),
        table_checkpoints="all",
        precision=2,
        html_metrics=("energy_ratio",),
        primary_control="haar",
    )
    out, _ = _render(tmp_path, res, options=opts)
    html = (out / "report.html").read_text()
    assert "<title>My &amp; title</title>" in html
    assert 'data-metric="energy_fraction"' not in html and 'data-metric="energy_ratio"' in html
    assert "against <b>haar</b> controls" in html
    tables = (out / "tables.tex").read_text()
    assert tables.count(r"\begin{table}") == 2
    assert "$k = 4$" in tables and "step200 (late)" in tables
    assert r"\title{My \& title}" in (out / "report.tex").read_text()
    with pytest.raises(ValueError):
        ReportOptions(precision=0)
    with pytest.raises(ValueError):
        ReportOptions(table_checkpoints="last")
    with pytest.raises(ValueError):
        ReportOptions(table_metrics="energy_ratio")


@pytest.mark.slow
def test_latex_tables_escape_and_structure(tmp_path):
    res = make_results()
    res.loc[res["model"] == "tiny-gpt2", "model"] = "gpt_2 & co % $x$ #1"
    out, _ = _render(tmp_path, res, protocol=make_protocol(name="proto_1", title="proto_1 & 50% #a"), options=FAST)
    tables = (out / "tables.tex").read_text()
    assert r"gpt\_2 \& co \% \$x\$ \#1" in tables
    assert "gpt_2 & co" not in tables
    assert r"\multirow{" in tables and r"\toprule" in tables and "S[table-format=" in tables
    assert r"\label{tab:proto-1-energy-ratio}" in tables
    assert r"Protocol: proto\_1." in tables
    assert r"\title{proto\_1 \& 50\% \#a}" in (out / "report.tex").read_text()
    assert "[" in tables and r"\textsuperscript{**}" in tables
    report = (out / "report.tex").read_text()
    assert r"\input{tables.tex}" in report


def test_tex_escape():
    assert tex("a_b & c % $ # { } ~ ^ \\") == (
        r"a\_b \& c \% \$ \# \{ \} \textasciitilde{} \textasciicircum{} \textbackslash{}"
    )
    assert tex("<x>") == r"\textless{}x\textgreater{}"
    assert tex("café Δ\u0120the 模") == r"café $\Delta$\textvisiblespace{}the \texttt{[U+6A21]}"


def test_pdf_required_without_pdflatex(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(PdfLatexError, match="pdflatex is not on PATH"):
        _render(tmp_path, make_results(), options=ReportOptions(compile_pdf=True))


def test_pdflatex_failure_raises_with_log_tail(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    script = fake / "pdflatex"
    script.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -output-directory=*) d="${a#-output-directory=}";; '
        "esac; done\n"
        'printf "This is fake TeX\\n! Undefined control sequence.\\nl.42 \\\\oops\\n" '
        '> "$d/report.log"\nexit 1\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    out = tmp_path / "b"
    out.mkdir()
    with pytest.raises(PdfLatexError) as err:
        render_bundle(make_inputs(make_results()), out, options=ReportOptions(compile_pdf=True, figures=False))
    msg = str(err.value)
    assert "Undefined control sequence" in msg and "l.42" in msg
    assert not [p for p in out.iterdir() if p.name.startswith(".latex")]


@pytest.mark.slow
def test_rerender_is_fast(hostile):
    """A quickstart-sized bundle (~380 rows + bucket rows, 7 figures) renders; its timing is a
    benchmark (benchmarks/README.md), not a test assertion on a shared machine."""
    res, seconds = hostile[4], hostile[5]
    assert 300 <= len(res[res["freq_bucket"].isna()]) <= 420
    assert seconds > 0


# ------------------------------------------------------------------ real tools (skip if absent)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not on PATH")
def test_headless_chromium_runs_script_and_loads_images(hostile, tmp_path):
    out = hostile[1]
    res = split_buckets(hostile[4])[0]  # the results table holds results.csv's rows only
    url = (out / "report.html").resolve().as_uri() + "#q=energy_ratio%20step400"
    proc = run_chromium(tmp_path / "profile", "--virtual-time-budget=10000", "--dump-dom", url)
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = re.search(r"<html\b[^>]*>", dom).group(0)
    assert 'data-ready="1"' in root, root
    assert "data-js-error" not in root, root
    assert "Uncaught" not in proc.stderr
    total = int(re.search(r'data-images-total="(\d+)"', root).group(1))
    assert total == 7
    assert f'data-images-ok="{total}"' in root and 'data-images-bad=""' in root, root
    # The #q= filter ran: only rows mentioning both words are visible.
    expected = int(((res["checkpoint"] == "step400") & res["metric"].str.contains("energy_ratio")).sum())
    assert f"{expected} of {len(res)} rows" in dom
    tbody = dom[dom.index('id="results-table"') :]
    assert len(re.findall(r"<tr[^>]*\bhidden\b", tbody)) == len(res) - expected
    shot = tmp_path / "shot.png"
    proc = run_chromium(
        tmp_path / "profile2", "--hide-scrollbars", "--window-size=1366,900", f"--screenshot={shot}", url
    )
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not on PATH")
def test_report_tex_compiles_with_pdflatex(hostile):
    from anistat.report.latex import compile_pdf

    out = hostile[1]
    pdf = compile_pdf(out)
    assert pdf == out / "report.pdf" and pdf.read_bytes().startswith(b"%PDF")
    assert not [p for p in out.iterdir() if p.name.startswith(".latex")]
    if shutil.which("pdftotext"):
        text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
        assert "tiny_bert & 50%" in text and "<script>alert(1)</script>" in text
        assert "Failed units" in text


def test_pdf_compiles_from_a_relative_output_directory(tmp_path, monkeypatch):
    """`anistat run` stages bundles under a relative path (reports/…); pdflatex must still work."""
    import shutil

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    from anistat.report.latex import compile_pdf

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "report.tex").write_text("\\documentclass{article}\\begin{document}hi\\end{document}\n")
    pdf = compile_pdf(Path("rel"))
    assert (tmp_path / "rel" / "report.pdf").is_file() and pdf.name == "report.pdf"


@pytest.mark.slow
def test_frequency_correlation_table_in_html_and_latex(hostile):
    """The log-frequency vs centroid-distance correlations (frequency.csv) get their own table:
    Spearman ρ with its CI per model × checkpoint × site, in both documents."""
    out, html = hostile[1], hostile[3]
    section = html[html.index('<section id="frequency">') :]
    section = section[: section.index("</section>")]
    assert section.count("-0.420") >= 6 and "[-0.520, -0.320]" in section
    assert "-0.310" not in section  # Pearson stays in the CSV
    assert "&lt;script&gt;" in section and XSS not in section
    assert 'href="#frequency"' in html
    tex = (out / "report.tex").read_text(encoding="utf-8")
    assert "tab:frequency-distance" in tex and r"\section{Token frequency and centroid distance}" in tex
