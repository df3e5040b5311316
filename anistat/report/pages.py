"""anistat's standalone pages — plan.html (``anistat plan``) and calibration.html (``anistat
calibrate``) — rendered through the report's jinja2 environment (:func:`anistat.report.html.environment`,
autoescaped) from the templates ``plan.html.j2`` and ``calibration.html.j2``, with the shared
table macro of ``_macros.html.j2`` and the stylesheet ``page.css``. Self-contained: no script,
no URL; the one image is inlined as base64.

The callers pass plain values (strings, rows of cells, a pandas frame for a table); every one is
escaped by the template.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .html import asset, environment


def _render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(css=asset("page.css"), **context)


def render_plan_html(
    title: str,
    summary: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    notes: Sequence[str],
    warnings: Sequence[str] = (),
) -> str:
    """plan.html: the plan's title, a summary line, one table (``header``, ``rows`` of cells),
    the warnings (a planned size the pilot's corpus cannot hold) above it and what the plan
    assumes (``notes``) below it."""
    return _render(
        "plan.html.j2", title=title, summary=summary, header=list(header), rows=[list(r) for r in rows],
        notes=list(notes), warnings=list(warnings),
    )  # fmt: skip


def cell(value: Any) -> str:
    """A table cell of the calibration page: text as it is, a number to 4 significant digits."""
    return value if isinstance(value, str) else format(value, ".4g")


@dataclass(frozen=True)
class PageTable:
    """One table of a page: an optional heading and sentence above it, its columns and its rows
    (cells already text, :func:`cell`)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    heading: str = ""
    text: str = ""

    @classmethod
    def of(cls, frame, columns: Sequence[str] | None = None, heading: str = "", text: str = "") -> PageTable:
        """The table of a pandas ``frame`` (``columns``: all of them, in order, when None)."""
        columns = list(frame.columns) if columns is None else list(columns)
        rows = tuple(tuple(cell(row[c]) for c in columns) for _, row in frame.iterrows())
        return cls(tuple(columns), rows, heading, text)


def render_calibration_html(
    settings: Mapping[str, Any],
    elapsed_s: float,
    checks: Mapping[str, Mapping[str, Any]],
    png: bytes,
    tables: Sequence[PageTable],
    settings_text: str,
) -> str:
    """calibration.html: the study's size and time, each goal's check (value ± margin against its
    band and the verdict), the figure, the ``tables`` in order and the settings (``settings_text``,
    shown verbatim in a ``<pre>``)."""
    shown = [
        {
            "name": name,
            "value": format(c["value"], ".4f"),
            "margin": format(c["margin"], ".4f"),
            "low": c["low"],
            "high": c["high"],
            "verdict": c["verdict"],
            "needed": c["needed"] if c["verdict"] == "unresolved" else None,
        }
        for name, c in checks.items()
    ]
    return _render(
        "calibration.html.j2",
        n_simulations=settings["n_simulations"],
        n_documents=settings["n_documents"],
        elapsed=f"{elapsed_s:.1f}",
        checks=shown,
        png=base64.b64encode(png).decode("ascii"),
        sections=list(tables),
        settings=settings_text,
    )
