"""``report.html``: one self-contained file (inline CSS/JS, base64 PNG figures, no URLs), rendered
from the jinja2 template ``anistat/templates/report.html.j2`` with autoescaping on.

This module only prepares plain values for the template (numbers formatted, rows grouped); every
string is escaped by jinja2 (the same rules as :func:`anistat.report.escape.esc`). The only
markup passed through unescaped is anistat's own: the stylesheet and script files next to the
template, and the methods' formulas (:class:`anistat.report._text.Math`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ._content import (
    DOWN,
    FREQUENCY_CAPTION,
    QUESTION,
    UP,
    FrequencyCorrelations,
    Headline,
    ReportContext,
    answer,
    failed_units,
    frequency_correlations,
    frequency_interval_sentences,
    headline,
    headline_legend,
    methods,
    settings_rows,
    summary_sentences,
)
from ._data import BUCKET_COLUMNS, fmt_p, ordered_by_first
from .figures import SavedFigure
from .refit import REFIT_HEADING, REFIT_TEXT, RefitSection, refit_section

#: The package's template folder (declared as package data in pyproject.toml).
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
DOT = " \u00b7 "
P_COLUMNS = {"p_value", "p_adjusted", "p_value_paper"}
INT_COLUMNS = {"step", "rank", "dim", "n_controls", "n_sequences", "n_tokens", "n_clusters"}


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The jinja2 environment of anistat's HTML outputs (autoescape for .html/.j2 templates)."""
    return Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )


def asset(name: str) -> Markup:
    """A stylesheet or script file of the template folder, inlined verbatim (anistat's own)."""
    return Markup((TEMPLATES / name).read_text(encoding="utf-8"))


def _attr_num(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if np.isnan(f) else repr(f)


def _cell(col: str, v: Any, ctx: ReportContext) -> tuple[str, str, str]:
    """(kind, text, sort value) of one results-table cell."""
    if col in P_COLUMNS:
        return "num", fmt_p(v), _attr_num(v)
    if col in INT_COLUMNS:
        txt = "" if pd.isna(v) else str(int(v)) if float(v).is_integer() else ctx.fmt(v)
        return "num", txt, _attr_num(v)
    if isinstance(v, (float, np.floating)):
        return "num", ctx.fmt(v), _attr_num(v)
    if col == "status" and v != "ok":
        return "failed", str(v), ""
    if col == "note":
        return "note", str(v), ""
    return "text", str(v), ""


def _results_table(ctx: ReportContext) -> dict[str, Any]:
    df = ctx.main
    if ctx.options.html_metrics is not None:
        df = df[df["metric"].isin(ctx.options.html_metrics)]
    extra = [c for c in ("p_test", "p_value_paper", "n_clusters", "effect_size_kind") if c in df.columns]
    cols = [c for c in ctx.options.html_columns if c in df.columns] + [
        c for c in extra if c not in ctx.options.html_columns
    ]
    for bc in BUCKET_COLUMNS:
        if bc in df.columns and (df[bc] != "").any() and bc not in cols:
            cols.insert(cols.index("metric") + 1 if "metric" in cols else len(cols), bc)
    numeric = {c for c in cols if c in P_COLUMNS | INT_COLUMNS or pd.api.types.is_float_dtype(df[c])}
    values = {c: df[c].tolist() for c in cols}
    models, metrics, statuses = df["model"].tolist(), df["metric"].tolist(), df["status"].tolist()
    rows = [
        {
            "model": models[i],
            "metric": metrics[i],
            "status": statuses[i],
            "cells": [_cell(c, values[c][i], ctx) for c in cols],
        }
        for i in range(len(df))
    ]
    filters = [(name, ordered_by_first(df[name])) for name in ("model", "metric", "status")]
    return {"columns": [(c, c in numeric) for c in cols], "rows": rows, "filters": filters}


def _figure(f: SavedFigure) -> dict[str, Any]:
    return {
        "name": f.name,
        "title": f.title,
        "caption": f.caption,
        "width": f.width,
        "height": f.height,
        "b64": base64.b64encode(f.png_bytes).decode("ascii"),
    }


def _cards(ctx: ReportContext) -> list[dict[str, Any]]:
    out = []
    for c in ctx.inputs.concept_cards:
        bits = [b for b in (c.model, c.checkpoint) if b]
        if c.layer:
            bits.append(f"L{c.layer}")
        if c.proxy:
            bits.append(c.proxy + (f" k={c.rank}" if c.rank is not None else ""))
        if c.direction is not None:
            bits.append(f"direction {c.direction}")
        out.append({"title": DOT.join(bits), "tokens": c.top_tokens[:30], "contexts": c.contexts[:8]})
    return out


def render_html(ctx: ReportContext, figs: list[SavedFigure], skipped: Mapping[str, str]) -> str:
    subtitle = _subtitle(ctx)
    frequency = frequency_correlations(ctx)
    cards = _cards(ctx)
    fu = failed_units(ctx)
    refit = refit_section(ctx)
    nav = _nav(frequency is not None, bool(cards), bool(fu), refit is not None)
    table = _results_table(ctx)
    claims = ctx.inputs.claims
    top = headline(ctx)
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            title=ctx.title,
            subtitle=subtitle,
            nav=nav,
            warnings=ctx.inputs.warnings,
            question=QUESTION,
            answer=answer(ctx),
            description=ctx.description,
            claims=claims,
            questions=ctx.questions,
            resampled=ctx.resampled,
            claims_passed=sum(c.passed for c in claims),
            findings=summary_sentences(ctx),
            headline=top,
            headline_phases=_headline_phases(top),
            proxy=ctx.proxy,
            control=ctx.control,
            ci_text=ctx.ci_text,
            unit_noun=ctx.unit_noun,
            legend=ctx.legend_text(),
            headline_legend=headline_legend(ctx),
            up=UP,
            down=DOWN,
            n_failed_groups=len(fu),
            figures=[_figure(f) for f in figs],
            skipped=[(k.replace("_", " "), v) for k, v in skipped.items()],
            frequency=_frequency_block(frequency),
            refit=_refit_block(refit),
            cards=cards,
            methods=methods(ctx),
            settings=settings_rows(ctx),
            table=table,
            filters=table["filters"],
            precision=ctx.options.precision,
            failed_units=fu,
            css=asset("report.css"),
            js=asset("report.js"),
            error_hook=asset("error-hook.js"),
        )
    )


def _subtitle(ctx: ReportContext) -> str:
    """The line under the title: protocol, its sha256, the anistat version, the size of the run
    and when it finished."""
    rec = ctx.record
    sub = [f"protocol {ctx.name}"]
    if rec.protocol_sha256:
        sub.append(f"sha256 {rec.protocol_sha256[:12]}")
    anistat_version = dict(rec.versions).get("anistat")
    if anistat_version:
        sub.append(f"anistat {anistat_version}")
    sub.append(f"{ctx.n_units()} units, {ctx.n_result_rows} result rows")
    if rec.finished_at:
        sub.append(f"finished {rec.finished_at}")
    return DOT.join(sub)


def _nav(has_frequency: bool, has_cards: bool, has_failed: bool, has_refit: bool) -> list[tuple[str, str]]:
    """(anchor, label) of the navigation bar's links, one per section the report shows."""
    nav = [("summary", "Summary"), ("figures", "Figures")]
    if has_frequency:
        nav.append(("frequency", "Frequency"))
    if has_refit:
        nav.append(("refit", "Frozen vs refit"))
    if has_cards:
        nav.append(("concepts", "Concept cards"))
    nav += [("methods", "Methods"), ("results", "Results table")]
    if has_failed:
        nav.append(("failed", "Failed units"))
    return nav


def _headline_phases(top: Headline | None) -> list[tuple[str, str, int]]:
    """The headline's phase header: (phase, checkpoint, columns) per phase, one cell per phase
    naming the checkpoint its columns show."""
    phases: list[tuple[str, str, int]] = []
    for ph, ck, _rank in top.columns if top else []:
        if phases and phases[-1][:2] == (ph, ck):
            phases[-1] = (ph, ck, phases[-1][2] + 1)
        else:
            phases.append((ph, ck, 1))
    return phases


def _frequency_block(frequency: FrequencyCorrelations | None) -> dict[str, Any] | None:
    """The template's frequency section: caption, interval methods, notes, sites and rows."""
    if frequency is None:
        return None
    return {
        "caption": " ".join(filter(None, [FREQUENCY_CAPTION, frequency_interval_sentences(frequency.ci_methods)])),
        "ci_methods": frequency.ci_methods,
        "notes": frequency.notes,
        "sites": frequency.sites,
        "rows": frequency.rows,
    }


def _refit_block(section: RefitSection | None) -> dict[str, Any] | None:
    """The template's refit − frozen section: heading, meaning, range, header and rows (each cell
    its text and, for a number, the unrounded value as a ``data-value`` attribute)."""
    if section is None:
        return None
    return {
        "heading": REFIT_HEADING,
        "text": REFIT_TEXT,
        "summary": section.summary,
        "headers": list(zip(section.headers, section.numeric)),
        "rows": [[(text, "" if number is None else repr(number)) for text, number in row] for row in section.rows],
    }
