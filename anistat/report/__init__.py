"""Report stage: results DataFrame + manifest dict → report.html, tables.tex, report.tex,
figures (PDF + PNG) and, with pdflatex, report.pdf.

This package imports nothing from the rest of anistat; its only inputs are the tidy results
table (see ARCHITECTURE.md, "Results table"), the manifest dict, optional claims and extras.

Token-frequency buckets are recognised in two forms: an extra column ``freq_bucket`` (or
``bucket``) holding the bucket label on bucket rows, or metric names such as
``energy_ratio_bucket_<label>``. Bucket rows are drawn in their own figure and kept out of the
other figures and tables.
"""

from .latex import PdfLatexError
from .options import ReportOptions
from .render import render_bundle

__all__ = ["render_bundle", "ReportOptions", "PdfLatexError"]
