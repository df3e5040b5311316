"""The report stage's entry point: :func:`render_bundle`."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

from ._content import ReportContext
from .figures import TaskMap, render_figures
from .html import render_html
from .inputs import ReportInputs
from .latex import PdfLatexError, compile_pdf, render_report_tex, render_tables
from .options import ReportOptions


def figure_context(ctx: ReportContext) -> dict:
    """What the figure functions read besides the results: the primary proxy and control, and —
    for the captions — the run's own description (what its steps and phases are, the resampling
    unit of rows that do not record it)."""
    inputs, options = ctx.inputs, ctx.options
    return {
        "proxy": ctx.proxy,
        "control": ctx.control,
        "max_panels": options.max_panels,
        "ci_text": ctx.ci_text,
        "calibration": inputs.calibration,
        "control_draws": inputs.control_draws,
        "null_checks": inputs.null_checks,
        "step_word": "measured training steps" if ctx.run.measured_in_loop else "training steps",
        "unit_noun": ctx.unit_noun,
        "phase_rule": ctx.phase_rule(),
        "unit_hint": ctx.unit_hint(),
    }


def _untimed(_name: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def render_bundle(
    inputs: ReportInputs,
    out_dir: Path,
    *,
    options: ReportOptions | None = None,
    stage: Callable[[str], AbstractContextManager[None]] = _untimed,
    run_tasks: TaskMap | None = None,
) -> list[Path]:
    """Write the report files of a bundle into ``out_dir`` (which must exist).

    Writes ``report.html`` (self-contained), ``tables.tex``, ``report.tex``,
    ``figures/<name>.pdf`` and ``.png``, and ``report.pdf`` when pdflatex is available (see
    ``ReportOptions.compile_pdf``; pdflatex runs while the HTML is rendered). Nothing is written
    outside ``out_dir``. Returns the written paths, sorted. ``stage(name)`` wraps each part — ``figures``, ``HTML and LaTeX``, ``PDF`` — so a
    caller can time them (``anistat.timing.stage``); by default nothing is timed. ``run_tasks``
    draws the figures (e.g. in worker processes; see ``figures.render_figures``).

    Raises:
        FileNotFoundError: ``out_dir`` does not exist.
        PdfLatexError: pdflatex failed (message ends with the log tail), or was required
            (``compile_pdf=True``) but is missing.
    """
    if not isinstance(inputs, ReportInputs):
        raise TypeError(f"inputs must be ReportInputs, got {type(inputs).__name__}")
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"output directory does not exist: {out_dir}")
    options = options or ReportOptions()
    want_pdf = options.compile_pdf
    if want_pdf is None:
        want_pdf = shutil.which("pdflatex") is not None
    elif want_pdf and shutil.which("pdflatex") is None:
        raise PdfLatexError("compile_pdf=True but pdflatex is not on PATH")

    ctx = ReportContext(inputs=inputs, options=options)
    fig_ctx = figure_context(ctx)

    fig_dir = out_dir / "figures"
    with stage("figures"):
        if options.figures:
            figs, skipped = render_figures(ctx.main, ctx.full, fig_ctx, fig_dir, options.figure_dpi, run_tasks)
        else:
            figs, skipped = [], {}

    written: list[Path] = [p for f in figs for p in (f.pdf, f.png)]
    html_path, tables_path, report_tex = out_dir / "report.html", out_dir / "tables.tex", out_dir / "report.tex"
    # pdflatex, a process of its own, compiles the LaTeX while the HTML is rendered here
    with ThreadPoolExecutor(1, thread_name_prefix="anistat-pdflatex") as background:
        with stage("HTML and LaTeX"):
            tables, labels = render_tables(ctx)
            tables_path.write_text(tables, encoding="utf-8")
            report_tex.write_text(render_report_tex(ctx, figs, labels), encoding="utf-8")
            pdf = background.submit(compile_pdf, out_dir) if want_pdf else None
            html_path.write_text(render_html(ctx, figs, skipped), encoding="utf-8")
        written += [html_path, tables_path, report_tex]
        if pdf is not None:
            with stage("PDF"):  # what is left of the compilation
                written.append(pdf.result())
    return sorted(written)


__all__ = ["render_bundle", "ReportOptions", "PdfLatexError"]
