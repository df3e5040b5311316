"""Report stage: typed :class:`ReportInputs` → report.html, tables.tex, report.tex, figures
(PDF + PNG) and, with pdflatex, report.pdf.

This package imports nothing from the rest of anistat. Its one input is a frozen
:class:`ReportInputs` (results and frequency tables, the typed run description, manifest fields,
run warnings, claims, concept cards), built by ``anistat.bundle.report_inputs``. HTML goes
through the jinja2 templates in ``anistat/templates/`` (autoescaped), LaTeX tables through
:func:`~anistat.report.latex_table.booktabs_table`, and every user string through one escaping
function per target (:mod:`anistat.report.escape`). The replication comparison's HTML and LaTeX
are rendered here too (:mod:`anistat.report.comparison`, from a frozen ``ComparisonInputs``).
"""

from .escape import esc, tex
from .inputs import (
    ClaimOutcome,
    ConceptCard,
    LoopDescription,
    ModelDescription,
    ReportInputs,
    RunDescription,
    RunRecord,
    claim_outcome,
    evidence_items,
)
from .latex import PdfLatexError
from .latex_table import booktabs_table
from .options import ReportOptions
from .render import render_bundle

__all__ = [
    "ClaimOutcome",
    "ConceptCard",
    "LoopDescription",
    "ModelDescription",
    "PdfLatexError",
    "ReportInputs",
    "ReportOptions",
    "RunDescription",
    "RunRecord",
    "booktabs_table",
    "claim_outcome",
    "esc",
    "evidence_items",
    "render_bundle",
    "tex",
]
