"""The replication comparison's rendered files: comparison.html and comparison.tex.

Rendered from one frozen :class:`ComparisonInputs` (built by ``anistat.replicate``): the row-by-row
table of ``anistat.comparison.Comparison.rows``, the claims compared claim by claim, the
environment rows and the summary. HTML goes through the autoescaping template
``templates/comparison.html.j2``, LaTeX through :func:`~anistat.report.latex_table.booktabs_table`
with every user string escaped by :func:`~anistat.report.escape.tex`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .escape import tex

#: The energy-ratio columns the comparison shows, in order.
HEADLINE_COLUMNS = (
    "model",
    "checkpoint",
    "site",
    "rank",
    "control",
    "estimate_original",
    "estimate_replication",
    "difference",
    "difference_ci_low",
    "difference_ci_high",
    "sign_agrees",
    "ci_overlap",
    "within_tolerance",
)


@dataclass(frozen=True)
class ComparisonInputs:
    """Everything the comparison's HTML and LaTeX are rendered from.

    ``comparison``: one row per result present in both bundles (key columns, ``*_original`` /
    ``*_replication`` estimates and intervals, ``difference`` with its interval, ``sign_agrees``,
    ``ci_overlap``, ``within_tolerance``); ``claims``: per claim ``id``, ``statement``,
    ``original`` and ``replication`` status and ``agree``; ``environment``: per manifest field
    ``field``, ``original``, ``replication``, ``differs``; ``summary``: the headline shares
    (name → number); ``titles``: the two bundles' names (original, replication)."""

    comparison: pd.DataFrame
    claims: tuple[Mapping[str, Any], ...]
    environment: tuple[Mapping[str, Any], ...]
    summary: Mapping[str, Any]
    titles: tuple[str, str]

    @property
    def headline(self) -> pd.DataFrame:
        """The energy-ratio rows, the ones both outputs show."""
        return self.comparison[self.comparison["metric"] == "energy_ratio"]


def fmt(value: Any, digits: int = 3) -> str:
    """A comparison cell: "–" for a missing or infinite number, yes/no for a flag, ``digits``
    significant digits for a number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{value:.{digits}g}"
    return str(value)


def render_comparison_html(inputs: ComparisonInputs) -> str:
    """comparison.html from the autoescaping template ``templates/comparison.html.j2``."""
    from .html import environment as templates

    rows = [[fmt(row[c]) for c in HEADLINE_COLUMNS] for _, row in inputs.headline.iterrows()]
    return (
        templates()
        .get_template("comparison.html.j2")
        .render(
            titles=inputs.titles,
            summary=[(k.replace("_", " "), fmt(v)) for k, v in inputs.summary.items()],
            claims=list(inputs.claims),
            rows=rows,
            environment=list(inputs.environment),
        )
    )


def render_comparison_tex(inputs: ComparisonInputs) -> str:
    """comparison.tex: the energy ratios, original against replication, as one booktabs table."""
    from .latex_table import booktabs_table

    body = []
    for _, row in inputs.headline.iterrows():
        agree = r"$\checkmark$" if row["sign_agrees"] and row["ci_overlap"] else "--"
        body.append(
            [
                tex(row["model"]),
                tex(row["checkpoint"]),
                tex(row["site"]),
                tex(row["rank"]),
                tex(fmt(row["estimate_original"])),
                tex(fmt(row["estimate_replication"])),
                f"{tex(fmt(row['difference']))} [{tex(fmt(row['difference_ci_low']))}, "
                f"{tex(fmt(row['difference_ci_high']))}]",
                agree,
            ]
        )
    head = [[r"Model", "Checkpoint", "Site", "$k$", "Original", "Replication", r"$\Delta$ [95\% CI]", "Agree"]]
    titles = inputs.titles
    caption = (
        r"Replication of " + tex(titles[0]) + " by " + tex(titles[1]) + r": energy ratios, original vs replication."
    )
    return (
        "% anistat replication table (requires booktabs, amssymb, adjustbox)\n"
        + booktabs_table("lllrrrrc", head, body, caption=caption, label="tab:anistat-replication")
        + "\n"
    )
