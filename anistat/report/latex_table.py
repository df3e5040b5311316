"""The one LaTeX table writer: every table anistat writes (tables.tex, report.tex, the replication
comparison) is built by :func:`booktabs_table`.

Conventions: cells arrive already in LaTeX (escape user text with ``anistat.report.escape.tex``
before); rules are booktabs (``\\toprule``, ``\\midrule``, ``\\bottomrule``), so every table
needs ``\\usepackage{booktabs}`` (plus ``siunitx`` for ``S`` columns, ``multirow`` and
``adjustbox`` where used, ``longtable`` for ``long=True``).
"""

from __future__ import annotations

from collections.abc import Sequence

#: Row markers: insert ``\midrule`` / a little vertical space between two body rows.
MIDRULE = r"\midrule"
ADDSPACE = r"\addlinespace[2pt]"

Row = Sequence[str] | str
"""A list of LaTeX cells (joined with ``&``, ended with ``\\\\``) or one raw line (a rule)."""


def _line(row: Row) -> str:
    if isinstance(row, str):
        return row
    return " & ".join(row) + r" \\"


def booktabs_table(
    colspec: str,
    head: Sequence[Row],
    body: Sequence[Row],
    *,
    caption: str = "",
    label: str = "",
    long: bool = False,
    fit_width: bool = True,
    preamble: Sequence[str] = (r"\centering\small",),
) -> str:
    """A booktabs table: ``\\toprule``, ``head`` rows, ``\\midrule``, ``body`` rows, ``\\bottomrule``.

    ``long=False`` (default) gives a floating ``table`` (caption on top, optionally scaled to the
    line width with ``adjustbox``); ``long=True`` a ``longtable`` that breaks across pages (its
    header repeats on every page; ``caption``/``label`` go in its first row).
    """
    lines_head = [_line(r) for r in head]
    lines_body = [_line(r) for r in body]
    if long:
        out = [r"\begin{longtable}{" + colspec + "}"]
        if caption:
            out.append(r"\caption{" + caption + "}" + (r"\label{" + label + "}" if label else "") + r" \\")
        out += [r"\toprule", *lines_head, r"\midrule", r"\endhead", *lines_body, r"\bottomrule", r"\end{longtable}"]
        return "\n".join(out)
    out = [r"\begin{table}[htbp]", *preamble]
    if caption:
        out.append(r"\caption{" + caption + "}")
    if label:
        out.append(r"\label{" + label + "}")
    if fit_width:
        out.append(r"\begin{adjustbox}{max width=\linewidth}")
    out += [
        r"\begin{tabular}{" + colspec + "}",
        r"\toprule",
        *lines_head,
        r"\midrule",
        *lines_body,
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if fit_width:
        out.append(r"\end{adjustbox}")
    out.append(r"\end{table}")
    return "\n".join(out)
