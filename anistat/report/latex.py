"""``tables.tex`` (booktabs + siunitx + multirow) and ``report.tex`` (standalone article), and the
pdflatex build of ``report.pdf``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ._content import (
    CONTROL_INDEPENDENT_METRICS,
    DOWN,
    QUESTION,
    UP,
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
from ._data import (
    METRIC_LABELS_TEX,
    checkpoint_order,
    interval_phrase,
    natural_key,
    ordered_by_first,
    phase_last_checkpoints,
)
from .claim_text import DOCUMENTS, SUBSPACES
from .escape import tex, tex_num
from .figures import SavedFigure
from .latex_table import ADDSPACE, MIDRULE, Row, booktabs_table
from .refit import refit_tex

PACKAGES_NOTE = r"% Requires: \usepackage{booktabs,siunitx,multirow,adjustbox}" "\n"


class PdfLatexError(RuntimeError):
    """pdflatex failed to build report.pdf; the message ends with the tail of its log."""


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "anistat"


def metric_tex(metric: str) -> str:
    return METRIC_LABELS_TEX.get(metric, tex(metric.replace("_", " ")))


_NUM_RE = re.compile(r"^(-?)(\d+)(?:\.(\d+))?$")


def _table_format(texts: Sequence[str]) -> str | None:
    """siunitx table-format covering the formatted numbers, or None when not plain decimals."""
    neg, ints, decs, any_num = False, 1, 0, False
    for t in texts:
        if t == "":
            continue
        m = _NUM_RE.match(t)
        if not m:
            return None
        any_num = True
        neg |= m.group(1) == "-"
        ints = max(ints, len(m.group(2)))
        decs = max(decs, len(m.group(3) or ""))
    if not any_num:
        return "1.0"
    return f"{'-' if neg else ''}{ints}" + (f".{decs}" if decs else "")


class _Cell:
    __slots__ = ("est", "lo", "hi", "mark", "failed")

    def __init__(self, est: str = "", lo: str = "", hi: str = "", mark: str = "", failed: bool = False) -> None:
        self.est, self.lo, self.hi, self.mark, self.failed = est, lo, hi, mark, failed


def _control_independent(d: pd.DataFrame) -> bool:
    """True when every location's estimate is the same under every control kind (so a table
    shows it once); checked on the data, not assumed from the metric's name alone."""
    keyed = d[d["_ok"]].groupby(["model", "checkpoint", "_loc", "rank", "proxy"])["estimate"]
    spread = keyed.max() - keyed.min()
    scale = keyed.apply(lambda s: s.abs().max()).clip(lower=1e-300)
    return bool(len(spread)) and bool(((spread / scale) <= 1e-9).all())


def _metric_table(ctx: ReportContext, metric: str) -> str | None:
    d = ctx.main[(ctx.main["metric"] == metric)]
    if (d["proxy"] == ctx.proxy).any():
        d = d[d["proxy"] == ctx.proxy]
    if d.empty:
        return None
    if ctx.options.table_checkpoints == "phase_last":
        d = phase_last_checkpoints(d)
    controls = [c for c in ordered_by_first(d["control"])]
    once = metric in CONTROL_INDEPENDENT_METRICS and len(controls) > 1 and _control_independent(d)
    if once:
        # one estimate (with its CI) per location, then each control kind's mean with the mark
        # of the proxy-vs-control test
        return _once_table(ctx, metric, d, controls)
    transposed = ctx.options.transpose_tables
    ranks = sorted(d["rank"].dropna().unique())
    has_control = any(c != "none" for c in controls)
    group = ctx.options.group_by if ctx.options.group_by in d.columns else "model"

    # Row keys and column keys.
    col_keys: list[Any] = ranks if transposed else controls
    row_keys = _row_keys(d, group, controls if transposed else ranks, "control" if transposed else "rank")
    if not row_keys:
        return None

    cells = _metric_cells(ctx, d, group, row_keys, col_keys, transposed)
    has_ci = any(c.lo or c.hi for c in cells.values())
    has_mark = any(c.mark for c in cells.values())

    fmts = [_table_format([cells[k].est for k in cells if k[1] == ci]) for ci in range(len(col_keys))]
    spec, width = _colspec(fmts, has_mark, has_ci, "l" if transposed else "r")
    head_top = [tex(group.capitalize()), "Checkpoint", "Layer", r"Control" if transposed else r"$k$"]
    names = []
    for y in col_keys:
        if transposed:
            names.append(f"$k = {int(y)}$" if float(y).is_integer() else f"$k = {tex(y)}$")
        else:
            names.append("" if y == "none" else tex(y) + (" controls" if len(col_keys) < 3 else ""))
    sub_cells = _sub_heads(ctx, len(col_keys), has_mark, has_ci)
    if has_control or transposed:
        head = _grouped_head(head_top, names, width, sub_cells)
    else:
        head = [head_top + sub_cells]

    def row_cells(ri: int) -> list[str]:
        out: list[str] = []
        for ci in range(len(col_keys)):
            out += _value_cells(cells.get((ri, ci)), fmts[ci], has_mark, has_ci, width)
        return out

    body = _body(ctx, d, group, row_keys, transposed, row_cells)
    caption = _metric_caption(ctx, metric, d, has_control and not transposed, has_ci, has_mark)
    return _metric_booktabs(ctx, metric, spec, head, body, caption)


def _metric_booktabs(
    ctx: ReportContext, metric: str, spec: list[str], head: Sequence[Row], body: Sequence[Row], caption: str
) -> str:
    """One metric's booktabs table (both layouts): small, centred, narrow column gaps, labelled
    ``tab:<run>-<metric>``."""
    return booktabs_table(
        "".join(spec),
        head,
        body,
        caption=caption,
        label=f"tab:{slug(ctx.name)}-{slug(metric)}",
        preamble=(r"\centering\small", r"\setlength{\tabcolsep}{4pt}"),
    )


def _metric_cells(
    ctx: ReportContext,
    d: pd.DataFrame,
    group: str,
    row_keys: list[tuple[str, str, str, Any]],
    col_keys: list[Any],
    transposed: bool,
) -> dict[tuple[int, int], _Cell]:
    """(row, column) -> the formatted estimate, CI and test mark of that table cell; a failed unit
    or a missing estimate gives a failed cell, an absent combination no cell."""
    cells: dict[tuple[int, int], _Cell] = {}
    for ri, (g, ck, loc, x) in enumerate(row_keys):
        sub = d[(d[group] == g) & (d["checkpoint"] == ck) & (d["_loc"] == loc)]
        sub = sub[sub["control"] == x] if transposed else sub[sub["rank"] == x]
        for ci, y in enumerate(col_keys):
            s = sub[sub["rank"] == y] if transposed else sub[sub["control"] == y]
            if s.empty:
                continue
            r = s.iloc[0]
            if r["status"] != "ok" or pd.isna(r["estimate"]):
                cells[(ri, ci)] = _Cell(failed=True)
                continue
            cells[(ri, ci)] = _Cell(
                ctx.fmt(r["estimate"]), ctx.fmt(r["ci_low"]), ctx.fmt(r["ci_high"]), ctx.mark(r[ctx.p_col])
            )
    return cells


def _metric_caption(
    ctx: ReportContext, metric: str, d: pd.DataFrame, per_control: bool, has_ci: bool, has_mark: bool
) -> str:
    """The caption of a metric's table: what is shown and when, the intervals, the marks' legend
    and the protocol."""
    what = (
        "per checkpoint"
        if ctx.options.table_checkpoints == "all"
        else f"at the last {ctx.unit_noun} of each training phase"
    )
    mt = metric_tex(metric)
    cap = [mt[:1].upper() + mt[1:] if mt[:1].isalpha() else mt, f" of the {tex(ctx.proxy)} proxy {what}"]
    if per_control:
        cap.append(", against each control kind")
    cap.append(". ")
    if has_ci:
        cap.append(f"Brackets: {tex(interval_phrase(d, ctx.ci_text) or ctx.ci_text + ' intervals')}. ")
    if has_mark:
        cap.append(tex(ctx.legend_text()) + ". ")
    cap.append(f"Protocol: {tex(ctx.name)}.")
    return "".join(cap)


def _row_keys(d: pd.DataFrame, group: str, inner: list[Any], inner_col: str) -> list[tuple[str, str, str, Any]]:
    """(group value, checkpoint, location, rank | control) of every table row, in order."""
    keys = []
    for g in ordered_by_first(d[group]):
        dg = d[d[group] == g]
        for ck in checkpoint_order(dg):
            dc = dg[dg["checkpoint"] == ck]
            for loc in sorted(dc["_loc"].unique(), key=natural_key):
                for x in inner:
                    if ((dc["_loc"] == loc) & (dc[inner_col] == x)).any():
                        keys.append((g, ck, loc, x))
    return keys


def _colspec(fmts: list[str | None], has_mark: bool, has_ci: bool, fourth: str) -> tuple[list[str], int]:
    spec = ["l", "l", "l", fourth]
    width = 1 + has_mark + has_ci
    for f in fmts:
        spec.append(f"S[table-format={f}]" if f else "c")
        if has_mark:
            spec.append(r"@{}l")
        if has_ci:
            spec.append("c")
    return spec, width


def _sub_heads(ctx: ReportContext, n: int, has_mark: bool, has_ci: bool, first: str = "{Est.}") -> list[str]:
    out: list[str] = []
    for _ in range(n):
        out.append(first)
        if has_mark:
            out.append("")
        if has_ci:
            out.append(f"{tex(ctx.ci_text)} CI")
    return out


def _grouped_head(head_top: list[str], names: list[str], width: int, sub_cells: list[str]) -> list[Any]:
    top, rules, col = [], [], len(head_top) + 1
    for name in names:
        top.append(r"\multicolumn{%d}{c}{%s}" % (width, name))
        rules.append(r"\cmidrule(lr){%d-%d}" % (col, col + width - 1))
        col += width
    return [head_top + top, "".join(rules), [""] * len(head_top) + sub_cells]


def _value_cells(c: _Cell | None, fmt: str | None, has_mark: bool, has_ci: bool, width: int) -> list[str]:
    if c is None:
        return ["{--}"] + ([""] if has_mark else []) + (["--"] if has_ci else [])
    if c.failed:
        return [r"\multicolumn{%d}{c}{\textit{failed}}" % width]
    out = [c.est if fmt else tex_num(c.est)]
    if has_mark:
        out.append(r"\textsuperscript{%s}" % c.mark if c.mark else "")
    if has_ci:
        out.append(f"[{tex_num(c.lo)}, {tex_num(c.hi)}]" if c.lo or c.hi else "--")
    return out


def _body(
    ctx: ReportContext,
    d: pd.DataFrame,
    group: str,
    row_keys: list[tuple[str, str, str, Any]],
    transposed: bool,
    row_cells,
) -> list[Any]:
    counts: dict[str, int] = {}
    for rk in row_keys:
        counts[rk[0]] = counts.get(rk[0], 0) + 1
    body: list[Any] = []
    prev_g, prev_ck = None, None
    for ri, (g, ck, loc, x) in enumerate(row_keys):
        if prev_g is not None and g != prev_g:
            body.append(MIDRULE)
        elif prev_ck is not None and ck != prev_ck:
            body.append(ADDSPACE)
        first_g = g != prev_g
        gcell = (r"\multirow{%d}{*}{%s}" % (counts[g], tex(g))) if first_g else ""
        sub = d[(d[group] == g) & (d["checkpoint"] == ck)]
        ph = sub["phase"].iloc[0] if len(sub) else ""
        ck_txt = f"{tex(ck)} ({tex(ph)})" if ph else tex(ck)
        ckcell = ck_txt if (first_g or ck != prev_ck) else ""
        xcell = tex(x) if transposed else (str(int(x)) if float(x).is_integer() else tex(x))
        body.append([gcell, ckcell, tex(loc), xcell] + row_cells(ri))
        prev_g, prev_ck = g, ck
    return body


def _once_table(ctx: ReportContext, metric: str, d: pd.DataFrame, controls: list[str]) -> str | None:
    """A control-independent metric: its estimate and CI once per row, then per control kind the
    control mean (the metric of the control subspaces) with the mark of the proxy's test."""
    group = ctx.options.group_by if ctx.options.group_by in d.columns else "model"
    ranks = sorted(d["rank"].dropna().unique())
    row_keys = _row_keys(d, group, ranks, "rank")
    if not row_keys:
        return None
    value, means, shared = _once_cells(ctx, d, group, row_keys, controls)
    has_ci = any(c.lo or c.hi for c in value.values())
    has_mark = any(c.mark for c in means.values())
    mark_value = shared and any(c.mark for c in value.values())
    has_means = any(c.est for c in means.values())
    fmt_value = _table_format([c.est for c in value.values()])
    fmt_means = [_table_format([means[k].est for k in means if k[1] == ci]) for ci in range(len(controls))]
    spec, width = _colspec([fmt_value], mark_value, has_ci, "r")
    if has_means:
        for f in fmt_means:
            spec.append(f"S[table-format={f}]" if f else "c")
            if has_mark:
                spec.append(r"@{}l")
    head = _once_head(ctx, group, controls, width, has_means, has_mark, mark_value, has_ci)

    def row_cells(ri: int) -> list[str]:
        out = _value_cells(value.get(ri), fmt_value, mark_value, has_ci, width)
        if has_means and not (value.get(ri) and value[ri].failed):
            for ci in range(len(controls)):
                out += _value_cells(means.get((ri, ci)), fmt_means[ci], has_mark, False, 1 + has_mark)
        elif has_means:
            out += [""] * (len(controls) * (1 + has_mark))
        return out

    body = _body(ctx, d, group, row_keys, False, row_cells)
    caption = _once_caption(ctx, metric, d, has_means, has_ci, mark_value, has_mark)
    return _metric_booktabs(ctx, metric, spec, head, body, caption)


def _once_cells(
    ctx: ReportContext,
    d: pd.DataFrame,
    group: str,
    row_keys: list[tuple[str, str, str, Any]],
    controls: list[str],
) -> tuple[dict[int, _Cell], dict[tuple[int, int], _Cell], bool]:
    """The cells of a control-independent metric's table: row -> the estimate with its CI,
    (row, control) -> that control kind's mean, and whether the test marks are shared by the
    control kinds (then they move onto the estimate)."""
    value: dict[int, _Cell] = {}
    means: dict[tuple[int, int], _Cell] = {}
    for ri, (g, ck, loc, k) in enumerate(row_keys):
        sub = d[(d[group] == g) & (d["checkpoint"] == ck) & (d["_loc"] == loc) & (d["rank"] == k)]
        first = sub.iloc[0]
        if first["status"] != "ok" or pd.isna(first["estimate"]):
            value[ri] = _Cell(failed=True)
            continue
        value[ri] = _Cell(ctx.fmt(first["estimate"]), ctx.fmt(first["ci_low"]), ctx.fmt(first["ci_high"]))
        for ci, control in enumerate(controls):
            s = sub[sub["control"] == control]
            if len(s):
                r = s.iloc[0]
                means[(ri, ci)] = _Cell(ctx.fmt(r["control_mean"]), mark=ctx.mark(r[ctx.p_col]))
    # The stars are the proxy's test: where every control kind's row carries the same p-value
    # (the exact test is shared by the kinds) they follow the estimate, not the control means;
    # only kind-specific p-values are starred per control column.
    shared = all(len({means[(ri, ci)].mark for ci in range(len(controls)) if (ri, ci) in means}) <= 1 for ri in value)
    if shared:
        for ri, cell in value.items():
            marks = [means[(ri, ci)].mark for ci in range(len(controls)) if (ri, ci) in means]
            if marks and not cell.failed:
                value[ri] = _Cell(cell.est, cell.lo, cell.hi, mark=marks[0])
        for key, cell in means.items():
            means[key] = _Cell(cell.est)
    return value, means, shared


def _once_head(
    ctx: ReportContext,
    group: str,
    controls: list[str],
    width: int,
    has_means: bool,
    has_mark: bool,
    mark_value: bool,
    has_ci: bool,
) -> list[Any]:
    """The header of a control-independent metric's table: the proxy's column group, then one
    column group per control kind's mean."""
    head_top = [tex(group.capitalize()), "Checkpoint", "Layer", "$k$"]
    names = ["Proxy"] + ([tex(c) + " controls (mean)" for c in controls] if has_means else [])
    top, rules, col = [], [], len(head_top) + 1
    for i, name in enumerate(names):
        w = width if i == 0 else 1 + has_mark
        top.append(r"\multicolumn{%d}{c}{%s}" % (w, name))
        rules.append(r"\cmidrule(lr){%d-%d}" % (col, col + w - 1))
        col += w
    sub_heads = _sub_heads(ctx, 1, mark_value, has_ci)
    if has_means:
        sub_heads += _sub_heads(ctx, len(controls), has_mark, False, first="{Mean}")
    return [head_top + top, "".join(rules), [""] * len(head_top) + sub_heads]


def _once_caption(
    ctx: ReportContext, metric: str, d: pd.DataFrame, has_means: bool, has_ci: bool, mark_value: bool, has_mark: bool
) -> str:
    """The caption of a control-independent metric's table, saying which test the marks are."""
    what = (
        "per checkpoint"
        if ctx.options.table_checkpoints == "all"
        else f"at the last {ctx.unit_noun} of each training phase"
    )
    mt = metric_tex(metric)
    cap = [
        mt[:1].upper() + mt[1:] if mt[:1].isalpha() else mt,
        f" of the {tex(ctx.proxy)} proxy {what}. It does not depend on the control kind, so it is shown once",
    ]
    if has_means:
        cap.append("; the next columns give the mean over the draws of each control kind")
    cap.append(". ")
    if has_ci:
        cap.append(f"Brackets: {tex(interval_phrase(d, ctx.ci_text) or ctx.ci_text + ' intervals')}. ")
    if mark_value:
        cap.append("Marks: the proxy's own test (shared by the control kinds); " + tex(ctx.legend_text()) + ". ")
    if has_mark:
        cap.append("Marks: the proxy against that control kind; " + tex(ctx.legend_text()) + ". ")
    cap.append(f"Protocol: {tex(ctx.name)}.")
    return "".join(cap)


def render_tables(ctx: ReportContext) -> tuple[str, list[str]]:
    """The text of tables.tex and the labels of the tables it holds."""
    out = [
        f"% anistat publication tables for protocol: {_comment(ctx.name)}",
        PACKAGES_NOTE.rstrip("\n"),
        r"% Significance marks come from " + ("adjusted" if ctx.p_col == "p_adjusted" else "unadjusted") + " p-values.",
        "",
    ]
    labels = []
    for metric in ctx.options.table_metrics:
        t = _metric_table(ctx, metric)
        if t is None:
            continue
        out.append(t)
        out.append("")
        labels.append(f"tab:{slug(ctx.name)}-{slug(metric)}")
    if not labels:
        out.append(
            r"% No table: none of the requested metrics ("
            + _comment(", ".join(ctx.options.table_metrics))
            + ") has rows."
        )
    return "\n".join(out) + "\n", labels


def _comment(s: str) -> str:
    return " ".join(str(s).split())


#: The headline cells' direction marks and shading in LaTeX (xcolor's ``table`` option).
DIRECTION_TEX = {UP: (r"$\uparrow$", r"\cellcolor{ciabove}"), DOWN: (r"$\downarrow$", r"\cellcolor{cibelow}")}


def _headline_tex(ctx: ReportContext) -> str:
    """The headline table, placed where it is written (``[!h]``): on page 1 under the answer."""
    h = headline(ctx)
    if h is None:
        return ""
    ncols = len(h.columns)
    head = [r"Model", "Layer"] + [
        f"{tex(ph or 'all')}" + (f" ({tex(ck)})" if ck else "") + f", $k={int(r)}$" for ph, ck, r in h.columns
    ]
    rows = []
    for model, loc, cells in h.rows:
        parts = [tex(model), tex(loc)]
        for c in cells:
            if c is None:
                parts.append("")
            elif c[0] == "failed":
                parts.append(r"\textit{failed}")
            else:
                est, ci, _p, mark, way = c
                arrow, shade = DIRECTION_TEX.get(way, ("", ""))
                parts.append(
                    shade
                    + tex_num(est)
                    + (r"\textsuperscript{%s}" % mark if mark else "")
                    + arrow
                    + (r" {\footnotesize " + _ci_tex(ci) + "}" if ci else "")
                )
        rows.append(parts)
    caption = (
        r"Headline energy ratios $R$ of the "
        + tex(ctx.proxy)
        + " proxy against "
        + tex(ctx.control)
        + f" controls at the last {ctx.unit_noun} of each phase (named in each column), "
        + "with "
        + tex(ctx.ci_text)
        + " CIs. "
        + tex(headline_legend(ctx))
    )
    table = booktabs_table("ll" + "r" * ncols, [head], rows, caption=caption)
    return table.replace(r"\begin{table}[htbp]", r"\begin{table}[!h]", 1)


def _frequency_tex(ctx: ReportContext) -> str:
    table = frequency_correlations(ctx)
    if table is None:
        return ""
    head = ["Model", "Checkpoint"] + [tex(site) for site in table.sites]
    rows = []
    for model, checkpoint, cells in table.rows:
        parts = [tex(model), tex(checkpoint)]
        for cell in cells:
            parts.append(
                ""
                if cell is None
                else tex_num(cell[0]) + (r" {\footnotesize " + _ci_tex(cell[1]) + "}" if cell[1] else "")
            )
        rows.append(parts)
    caption = (
        r"Spearman $\rho$ between a token type's log corpus frequency and the RMS distance of its "
        r"activations to the type's centroid, $\sqrt{\sum_i \lVert a_i - c\rVert^2/(n-1)}$, over the types "
        r"seen at least twice in the test split (negative: frequent tokens sit closer to their centroid). "
        r"Intervals resample test sequences, recomputing every centroid"
        + (" (" + tex(", ".join(table.ci_methods)) + ")" if table.ci_methods else "")
        + r". Pearson $r$ is in \texttt{frequency.csv}."
        + (" " + tex(frequency_interval_sentences(table.ci_methods)) if table.ci_methods else "")
        + "".join(" " + tex(note) + "." for note in table.notes)
    )
    return booktabs_table("ll" + "r" * len(table.sites), [head], rows, caption=caption, label="tab:frequency-distance")


def _ci_tex(ci: str) -> str:
    m = re.fullmatch(r"\[(.*), (.*)\]", ci)
    if not m:
        return tex(ci)
    return f"[{tex_num(m.group(1))}, {tex_num(m.group(2))}]"


def render_report_tex(ctx: ReportContext, figs: list[SavedFigure], table_labels: list[str]) -> str:
    L = _preamble_tex(ctx)
    L += _summary_tex(ctx)
    L += _claims_tex(ctx)

    L += ["", r"\section{Methods}"]
    L += [p.to_latex() + "\n" for p in methods(ctx)]

    L += _figures_tex(figs)
    frequency = _frequency_tex(ctx)
    if frequency:
        L += [r"\section{Token frequency and centroid distance}", frequency]
    L += refit_tex(ctx)
    L += _tables_section_tex(table_labels)
    L += _concept_cards_tex(ctx)
    L += _failed_units_tex(ctx)
    L += _settings_tex(ctx)
    L.append(r"\end{document}")
    return "\n".join(L) + "\n"


def _preamble_tex(ctx: ReportContext) -> list[str]:
    """The document class, packages, title block and the opening of the Summary section."""
    return [
        r"\documentclass[10pt,a4paper]{article}",
        r"\usepackage[T1]{fontenc}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{mathptmx}",
        r"\usepackage[scaled=.92]{helvet}",
        r"\usepackage{courier}",
        r"\usepackage{textcomp}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\usepackage{amsmath}",
        r"\usepackage{graphicx}",
        r"\usepackage{booktabs}",
        r"\usepackage{siunitx}",
        r"\usepackage{multirow}",
        r"\usepackage{adjustbox}",
        r"\usepackage{longtable}",
        r"\usepackage{caption}",
        r"\captionsetup{font=small,labelfont=bf,skip=6pt}",
        r"\captionsetup[table]{position=top}",
        r"\usepackage{array}",
        r"\usepackage[table]{xcolor}",
        r"\definecolor{ciabove}{HTML}{E8F1FA}",
        r"\definecolor{cibelow}{HTML}{FBEEE4}",
        r"\usepackage[hidelinks]{hyperref}",
        r"\sisetup{group-digits=integer, group-minimum-digits=5}",
        r"\pdfinfoomitdate=1",
        r"\pdftrailerid{}",
        r"\pdfsuppressptexinfo=-1",
        r"\setlength{\parskip}{0.4em}",
        r"\setlength{\parindent}{0pt}",
        r"\title{" + tex(ctx.title) + "}",
        r"\author{Generated by anistat from protocol \texttt{" + tex(ctx.name) + "}}",
        r"\date{" + tex(ctx.record.finished_at) + "}",
        r"\begin{document}",
        r"\maketitle",
        r"\section{Summary}",
    ]


def _summary_tex(ctx: ReportContext) -> list[str]:
    """Page 1 before the claim cards: run warnings, the question, its answer, the headline table
    and the findings."""
    L: list[str] = []
    if ctx.inputs.warnings:
        # run warnings first and framed: they can change how every number below is read; in small
        # type, so that the answer, the headline table and the findings stay on page 1
        L += [
            "",
            r"\begin{center}\fbox{\begin{minipage}{0.95\linewidth}\footnotesize",
            r"\textbf{Run warnings (%d).}" % len(ctx.inputs.warnings),
            r"\begin{itemize}\setlength{\itemsep}{0pt}\setlength{\topsep}{2pt}",
        ]
        L += [r"\item " + tex(w) for w in ctx.inputs.warnings]
        L += [r"\end{itemize}", r"\end{minipage}}\end{center}"]
    # page 1: the question, its answer, the headline table and the findings; the claim cards after
    L += ["", r"\textbf{Question.} " + tex(QUESTION)]
    answer_text = answer(ctx)
    if answer_text:
        L += ["", r"\textbf{Answer.} " + tex(answer_text)]
    if ctx.description:
        L += ["", tex(ctx.description)]
    hl = _headline_tex(ctx)
    if hl:
        L += ["", hl]
    findings = summary_sentences(ctx)
    if findings:
        L += [r"\subsection*{Findings}", r"\begin{itemize}"]
        L += [r"\item " + tex(s) for s in findings]
        L.append(r"\end{itemize}")
    return L


def _figures_tex(figs: list[SavedFigure]) -> list[str]:
    """The Figures section: one floating figure per saved figure, then a page break."""
    L: list[str] = []
    if figs:
        L += [r"\section{Figures}"]
        for f in figs:
            L += [
                r"\begin{figure}[htbp]\centering",
                r"\includegraphics[width=\linewidth,height=0.8\textheight,keepaspectratio]{figures/" + f.name + ".pdf}",
                r"\caption{\textbf{" + tex(f.title) + ".} " + tex(f.caption) + "}",
                r"\label{fig:" + slug(f.name) + "}",
                r"\end{figure}",
            ]
        L.append(r"\clearpage")
    return L


def _tables_section_tex(table_labels: list[str]) -> list[str]:
    """The Tables section: references to the tables and the ``\\input`` of tables.tex."""
    L: list[str] = []
    if table_labels:
        L += [
            r"\section{Tables}",
            r"Tables~"
            + ", ".join(r"\ref{%s}" % t for t in table_labels)
            + " (also in \\texttt{tables.tex}, ready to \\texttt{\\textbackslash input} "
            "into a paper).",
            r"\input{tables.tex}",
            r"\clearpage",
        ]
    return L


def _concept_cards_tex(ctx: ReportContext) -> list[str]:
    """The Concept cards section: the first 40 cards, each with its top tokens and contexts."""
    L: list[str] = []
    cards = ctx.inputs.concept_cards
    if cards:
        L += [r"\section{Concept cards}", r"\begin{itemize}"]
        for c in cards[:40]:
            head = ", ".join(
                f"{name} {value}"
                for name, value in (
                    ("model", c.model),
                    ("checkpoint", c.checkpoint),
                    ("layer", c.layer),
                    ("proxy", c.proxy),
                    ("rank", c.rank),
                    ("direction", c.direction),
                )
                if value not in (None, "")
            )
            toks = ", ".join(r"\texttt{" + tex(t) + "}" for t in c.top_tokens[:20])
            ctxs = "; ".join("``" + tex(x) + "''" for x in c.contexts[:4])
            L.append(
                r"\item \textbf{"
                + tex(head)
                + ".} Top tokens: "
                + (toks or "--")
                + (r". Contexts: " + ctxs if ctxs else "")
                + "."
            )
        L.append(r"\end{itemize}")
    return L


def _failed_units_tex(ctx: ReportContext) -> list[str]:
    """The Failed units section: one row per failed unit with its reason and row count."""
    L: list[str] = []
    fu = failed_units(ctx)
    if fu:
        L += [
            r"\section{Failed units}",
            booktabs_table(
                r"@{}llll>{\raggedright\arraybackslash}p{6.5cm}@{}",
                [["Model", "Checkpoint", "Layer", "Site", "Reason"]],
                [
                    [tex(m), tex(ck), tex(layer), tex(site), f"{tex(reason)} ({n} rows)"]
                    for m, ck, layer, site, reason, n in fu
                ],
                long=True,
            ),
        ]
    return L


def _settings_tex(ctx: ReportContext) -> list[str]:
    """The All settings section: every recorded setting as a source/key/value row."""
    L: list[str] = []
    rows = settings_rows(ctx)
    if rows:
        L += [
            r"\section{All settings}",
            r"{\footnotesize",
            booktabs_table(
                r"@{}l>{\raggedright\arraybackslash}p{6cm}>{\raggedright\arraybackslash}p{7.5cm}@{}",
                [["Source", "Key", "Value"]],
                [[tex(s), r"\texttt{" + _breakable(k) + "}", _breakable(v)] for s, k, v in rows],
                long=True,
            )
            + "}",
        ]
    return L


def _claims_tex(ctx: ReportContext) -> list[str]:
    """The claim cards: verdict, the evidence that decided it, the question it answers, the rule
    and an interval of another estimand only as labelled context. The raw recorded fields
    (evidence, failing rows) stay in claims.json and the HTML's collapsed block."""
    claims = ctx.inputs.claims
    if not claims:
        return []
    n_pass = sum(c.passed for c in claims)
    L = [
        "",
        r"\subsection*{Claims: %d of %d passed}" % (n_pass, len(claims)),
        r"{\small Each claim answers one of two questions: ``" + tex(ctx.questions[SUBSPACES]) + "'' (the exact test, "
        "conditional on the measured gradients) or ``"
        + tex(ctx.questions[DOCUMENTS])
        + "'' (the interval over "
        + tex(ctx.resampled)
        + ").}",
        r"\begin{itemize}",
    ]
    for c in claims:
        verdict = "PASS" if c.passed else ("ERROR" if c.status == "error" else "FAIL")
        cid = r"\texttt{" + tex(c.id) + "} " if c.id else ""
        head = (r"\textbf{" + tex(c.interval) + "} " if c.interval_role == "decided" else "") + cid + tex(c.statement)
        lines = [head]
        if c.decision:
            lines.append(
                r"\textit{Decided by the " + tex(c.decided_by or "recorded verdict") + ":} " + tex(c.decision) + "."
            )
        if c.question:
            lines.append(r"\textit{Answers:} " + tex(c.question) + ".")
        if c.caveat:
            lines.append(tex(c.caveat))
        if c.failed:
            lines.append(r"\textbf{Failed:} " + tex("; ".join(c.failed)))
        if c.rule:
            lines.append(r"{\small Rule: " + tex(c.rule) + ".}")
        if c.interval_role == "context" and c.context:
            lines.append(r"{\small " + tex(c.context) + "}")
        elif c.interval_role == "decided" and c.interval_of:
            lines.append(r"{\small Decisive interval: " + tex(c.interval) + " of " + tex(c.interval_of) + ".}")
        L.append(r"\item[\textbf{" + verdict + "}] " + r" \\ ".join(lines))
    L.append(r"\end{itemize}")
    return L


def _breakable(s: str) -> str:
    """Escape and allow line breaks after dots/commas/slashes in long keys and values."""
    t = tex(s)
    if len(s) <= 40:
        return t
    return re.sub(r"(\.|,|/)(?![^{]*\})", r"\1\\allowbreak{}", t)


def _log_excerpt(text: str) -> str:
    """The first TeX error with its context, then the log tail."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("!")), None)
    parts = []
    if first is not None:
        parts.append("first error:\n" + "\n".join(lines[first : first + 6]))
    parts.append("log tail:\n" + "\n".join(lines[-25:]))
    return "\n".join(parts)


def compile_pdf(out_dir: Path, tex_name: str = "report.tex", timeout: float = 180.0) -> Path:
    """Run pdflatex twice on out_dir/report.tex in a temp dir inside out_dir; return the PDF."""
    exe = shutil.which("pdflatex")
    if exe is None:
        raise PdfLatexError("pdflatex is not on PATH; install TeX Live or set compile_pdf=False")
    # absolute: pdflatex runs with cwd=out_dir, so a relative build path would be resolved twice
    out_dir = Path(out_dir).resolve()
    build = Path(tempfile.mkdtemp(prefix=".latex-", dir=out_dir))
    env = dict(os.environ)
    env.update(SOURCE_DATE_EPOCH="0", FORCE_SOURCE_DATE="1", TEXINPUTS=f"{out_dir}{os.pathsep}")
    try:
        for _ in range(2):
            try:
                proc = subprocess.run(
                    [
                        exe,
                        "-interaction=nonstopmode",
                        "-halt-on-error",
                        "-no-shell-escape",
                        f"-output-directory={build}",
                        tex_name,
                    ],
                    cwd=out_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise PdfLatexError(f"pdflatex timed out after {timeout:g} s") from e
            if proc.returncode != 0:
                log = build / (Path(tex_name).stem + ".log")
                text = log.read_text(errors="replace") if log.exists() else proc.stdout.decode(errors="replace")
                raise PdfLatexError(f"pdflatex failed on {tex_name} (exit {proc.returncode}); {_log_excerpt(text)}")
        pdf = build / (Path(tex_name).stem + ".pdf")
        if not pdf.exists():
            raise PdfLatexError("pdflatex produced no PDF")
        target = out_dir / pdf.name
        shutil.move(str(pdf), target)
        return target
    finally:
        shutil.rmtree(build, ignore_errors=True)
