"""The report stage's entry point: :func:`render_bundle`."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ._content import ReportContext
from ._data import BUCKET_COLUMNS, is_bucket_metric, normalise_results
from .figures import render_figures
from .html import render_html
from .latex import PdfLatexError, compile_pdf, render_report_tex, render_tables
from .options import ReportOptions


def render_bundle(
    results: pd.DataFrame,
    manifest: Mapping[str, Any] | None,
    out_dir: Path,
    *,
    claims: Sequence[Mapping[str, Any]] | None = None,
    extras: Mapping[str, Any] | None = None,
    options: ReportOptions | None = None,
) -> list[Path]:
    """Write the report files of a bundle into ``out_dir`` (which must exist).

    Writes ``report.html`` (self-contained), ``tables.tex``, ``report.tex``,
    ``figures/<name>.pdf`` and ``.png``, and ``report.pdf`` when pdflatex is available (see
    ``ReportOptions.compile_pdf``). Nothing is written outside ``out_dir``. Returns the written
    paths, sorted.

    ``extras`` may hold ``concept_cards`` (list of dicts), ``calibration`` (DataFrame or dict),
    ``warnings`` (list of str) and ``control_draws`` (DataFrame of raw control energies with
    ``model, checkpoint, layer, rank, control`` and ``energy``).

    Raises:
        FileNotFoundError: ``out_dir`` does not exist.
        PdfLatexError: pdflatex failed (message ends with the log tail), or was required
            (``compile_pdf=True``) but is missing.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"output directory does not exist: {out_dir}")
    options = options or ReportOptions()
    want_pdf = options.compile_pdf
    if want_pdf is None:
        want_pdf = shutil.which("pdflatex") is not None
    elif want_pdf and shutil.which("pdflatex") is None:
        raise PdfLatexError("compile_pdf=True but pdflatex is not on PATH")
    manifest = dict(manifest or {})
    extras = dict(extras or {})
    claims_list = [dict(c) for c in (claims or []) if isinstance(c, Mapping)]

    full = normalise_results(results)
    bucket = pd.Series(False, index=full.index)
    for col in BUCKET_COLUMNS:
        if col in full.columns:
            bucket |= full[col].astype(str) != ""
    bucket |= full["metric"].map(is_bucket_metric).astype(bool)
    main = full[~bucket]

    ctx = ReportContext(full=full, main=main, manifest=manifest, claims=claims_list,
                        extras=extras, options=options)
    fig_ctx = {"proxy": ctx.proxy, "control": ctx.control, "max_panels": options.max_panels,
               "ci_text": ctx.ci_text, "calibration": extras.get("calibration"),
               "control_draws": extras.get("control_draws")}

    fig_dir = out_dir / "figures"
    if options.figures:
        figs, skipped = render_figures(main, full, fig_ctx, fig_dir, options.figure_dpi)
    else:
        figs, skipped = [], {}

    written: list[Path] = [p for f in figs for p in (f.pdf, f.png)]
    html_path = out_dir / "report.html"
    html_path.write_text(render_html(ctx, figs, skipped), encoding="utf-8")
    tables, labels = render_tables(ctx)
    tables_path = out_dir / "tables.tex"
    tables_path.write_text(tables, encoding="utf-8")
    report_tex = out_dir / "report.tex"
    report_tex.write_text(render_report_tex(ctx, figs, labels), encoding="utf-8")
    written += [html_path, tables_path, report_tex]

    if want_pdf:
        written.append(compile_pdf(out_dir))
    return sorted(written)


__all__ = ["render_bundle", "ReportOptions", "PdfLatexError"]
