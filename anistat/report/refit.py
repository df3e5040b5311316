"""The report's refit − frozen section: frozen against refitted proxies (``proxies.refit: both``).

Rendered from ``ReportInputs.refit_contrast`` (built outside this package by
``anistat.staleness.refit_contrast_table``): one row per late-phase pair of a frozen proxy
(``pca``, fitted on the early window) and the proxy refitted on that checkpoint's own fit split
(``pca@refit``), with the energy fraction under each, ``difference`` = refit − frozen and
``ratio`` = refit / frozen. Absent when the run has no such pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._content import ReportContext
from .escape import tex, tex_num
from .latex_table import booktabs_table

REFIT_HEADING = "Frozen against refitted proxies"
#: What the contrast means (``anistat.staleness``), said beside the table in every output.
REFIT_TEXT = (
    "With proxies.refit: both, every checkpoint is measured with the frozen proxy (fitted on the early "
    "checkpoints) and with the same method refitted on that checkpoint's own fit sequences (labelled "
    "METHOD@refit). The table gives, at the late checkpoints, the energy fraction of the test gradients "
    "that each captures, and refit − frozen. A difference near 0 says the early proxy still spans what a "
    "fresh one would, so a weaker late effect is a weaker phenomenon; a large positive difference says the "
    "frozen proxy went stale: the frozen proxy's late effect understates what the late activations capture."
)
#: (column of the contrast table, header) in display order; ``control`` only where the numbers
#: differ by control kind.
COLUMNS = (
    ("model", "model"),
    ("checkpoint", "checkpoint"),
    ("site", "site"),
    ("rank", "rank"),
    ("control", "control"),
    ("proxy", "frozen proxy"),
    ("frozen", "frozen"),
    ("refit", "refit"),
    ("difference", "refit − frozen"),
    ("ratio", "refit / frozen"),
)
NUMBERS = ("frozen", "refit", "difference", "ratio")


@dataclass(frozen=True)
class RefitSection:
    """The section's display-ready parts: ``headers``; ``rows`` of (text, value) cells, value
    the unrounded number (None for a text cell); ``summary`` one sentence on the range of
    refit − frozen."""

    headers: tuple[str, ...]
    rows: tuple[tuple[tuple[str, float | None], ...], ...]
    summary: str
    numeric: tuple[bool, ...]


def refit_section(ctx: ReportContext) -> RefitSection | None:
    """The section of this run, or None when its results hold no frozen/refitted pair."""
    table = ctx.inputs.refit_contrast
    if table is None or table.empty:
        return None
    shown = [(column, header) for column, header in COLUMNS if column in table.columns]
    rows = []
    for record in table.to_dict("records"):
        cells: list[tuple[str, float | None]] = []
        for column, _ in shown:
            value = record[column]
            if column in NUMBERS:
                number = float(value) if pd.notna(value) else float("nan")
                cells.append((ctx.fmt(number), number))
            elif column == "rank":
                cells.append(("" if pd.isna(value) else str(int(value)), None))
            else:
                cells.append((str(value), None))
        rows.append(tuple(cells))
    differences = table["difference"].astype(float).dropna()
    summary = f"{len(table)} pair(s) at the late checkpoints" + (
        f"; refit − frozen ranges from {ctx.fmt(differences.min())} to {ctx.fmt(differences.max())} "
        f"(median {ctx.fmt(float(np.median(differences)))})."
        if len(differences)
        else "."
    )
    return RefitSection(
        headers=tuple(header for _, header in shown),
        rows=tuple(rows),
        summary=summary,
        numeric=tuple(column in NUMBERS for column, _ in shown),
    )


def refit_tex(ctx: ReportContext) -> list[str]:
    """report.tex's section: the meaning, the range and one booktabs table (every cell escaped)."""
    section = refit_section(ctx)
    if section is None:
        return []
    head = [[tex(h) for h in section.headers]]
    body = [[tex_num(text) if number is not None else tex(text) for text, number in row] for row in section.rows]
    colspec = "".join("r" if numeric else "l" for numeric in section.numeric)
    caption = tex(f"Energy fraction of the frozen and the refitted proxies. {section.summary}")
    return [
        r"\section{" + tex(REFIT_HEADING) + "}",
        tex(REFIT_TEXT),
        "",
        booktabs_table(colspec, head, body, caption=caption, label="tab:refit-contrast", long=True),
    ]
