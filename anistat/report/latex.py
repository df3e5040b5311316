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
    QUESTION,
    ReportContext,
    claim_evidence_items,
    failed_units,
    frequency_correlations,
    headline,
    methods,
    settings_rows,
    summary_sentences,
)
from ._data import (
    METRIC_LABELS_TEX,
    checkpoint_order,
    natural_key,
    ordered_by_first,
    phase_last_checkpoints,
)
from ._text import tex, tex_num
from .figures import SavedFigure

PACKAGES_NOTE = (r"% Requires: \usepackage{booktabs,siunitx,multirow,adjustbox}" "\n")


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

    def __init__(self, est: str = "", lo: str = "", hi: str = "", mark: str = "",
                 failed: bool = False) -> None:
        self.est, self.lo, self.hi, self.mark, self.failed = est, lo, hi, mark, failed


def _metric_table(ctx: ReportContext, metric: str) -> str | None:
    d = ctx.main[(ctx.main["metric"] == metric)]
    if (d["proxy"] == ctx.proxy).any():
        d = d[d["proxy"] == ctx.proxy]
    if d.empty:
        return None
    if ctx.options.table_checkpoints == "phase_last":
        d = phase_last_checkpoints(d)
    transposed = ctx.options.transpose_tables
    controls = [c for c in ordered_by_first(d["control"])]
    ranks = sorted(d["rank"].dropna().unique())
    has_control = any(c != "none" for c in controls)
    group = ctx.options.group_by if ctx.options.group_by in d.columns else "model"

    # Row keys and column keys.
    col_keys: list[Any] = ranks if transposed else controls
    models = ordered_by_first(d[group])
    row_keys: list[tuple[str, str, str, Any]] = []  # (group value, checkpoint, loc, rank|control)
    for g in models:
        dg = d[d[group] == g]
        for ck in checkpoint_order(dg):
            dc = dg[dg["checkpoint"] == ck]
            for loc in sorted(dc["_loc"].unique(), key=natural_key):
                inner = controls if transposed else ranks
                for x in inner:
                    sel = dc[(dc["_loc"] == loc)
                             & ((dc["control"] == x) if transposed else (dc["rank"] == x))]
                    if len(sel):
                        row_keys.append((g, ck, loc, x))
    if not row_keys:
        return None

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
            cells[(ri, ci)] = _Cell(ctx.fmt(r["estimate"]), ctx.fmt(r["ci_low"]),
                                    ctx.fmt(r["ci_high"]), ctx.mark(r[ctx.p_col]))
    has_ci = any(c.lo or c.hi for c in cells.values())
    has_mark = any(c.mark for c in cells.values())

    # Column spec.
    fmts = []
    for ci in range(len(col_keys)):
        fmts.append(_table_format([cells[k].est for k in cells if k[1] == ci]))
    spec = ["l", "l", "l", "r" if not transposed else "l"]
    per = []
    for f in fmts:
        cols = [f"S[table-format={f}]" if f else "c"]
        if has_mark:
            cols.append(r"@{}l")
        if has_ci:
            cols.append("c")
        per.append(len(cols))
        spec.extend(cols)
    width = per[0] if per else 1

    lab4 = r"Control" if transposed else r"$k$"
    head_top = [tex(group.capitalize()), "Checkpoint", "Layer", lab4]
    top_cells, mid_rules, sub_cells = [], [], []
    col = 5
    for y in col_keys:
        if transposed:
            name = f"$k = {int(y)}$" if float(y).is_integer() else f"$k = {tex(y)}$"
        else:
            name = "" if y == "none" else tex(y) + (" controls" if len(col_keys) < 3 else "")
        top_cells.append(r"\multicolumn{%d}{c}{%s}" % (width, name))
        mid_rules.append(r"\cmidrule(lr){%d-%d}" % (col, col + width - 1))
        col += width
        sub_cells.append("{Est.}")
        if has_mark:
            sub_cells.append("")
        if has_ci:
            sub_cells.append(f"{tex(ctx.ci_text)} CI" if ctx.ci_level else "CI")
    lines = [r"\toprule"]
    if has_control or transposed:
        lines.append(" & ".join(head_top[:4] + top_cells) + r" \\")
        lines.append("".join(mid_rules))
        lines.append(" & ".join(["", "", "", ""] + sub_cells) + r" \\")
    else:
        lines.append(" & ".join(head_top[:4] + sub_cells) + r" \\")
    lines.append(r"\midrule")

    group_counts: dict[str, int] = {}
    for rk in row_keys:
        group_counts[rk[0]] = group_counts.get(rk[0], 0) + 1
    prev_g, prev_ck = None, None
    for ri, (g, ck, loc, x) in enumerate(row_keys):
        if prev_g is not None and g != prev_g:
            lines.append(r"\midrule")
        elif prev_ck is not None and ck != prev_ck:
            lines.append(r"\addlinespace[2pt]")
        first_g = g != prev_g
        gcell = (r"\multirow{%d}{*}{%s}" % (group_counts[g], tex(g))) if first_g else ""
        sub = d[(d[group] == g) & (d["checkpoint"] == ck)]
        ph = sub["phase"].iloc[0] if len(sub) else ""
        ck_txt = f"{tex(ck)} ({tex(ph)})" if ph else tex(ck)
        ckcell = ck_txt if (first_g or ck != prev_ck) else ""
        if transposed:
            xcell = tex(x)
        else:
            xcell = str(int(x)) if float(x).is_integer() else tex(x)
        row = [gcell, ckcell, tex(loc), xcell]
        for ci in range(len(col_keys)):
            c = cells.get((ri, ci))
            if c is None:
                row.extend(["{--}"] + ([""] if has_mark else []) + (["--"] if has_ci else []))
            elif c.failed:
                row.append(r"\multicolumn{%d}{c}{\textit{failed}}" % width)
            else:
                row.append(c.est if fmts[ci] else tex_num(c.est))
                if has_mark:
                    row.append(r"\textsuperscript{%s}" % c.mark if c.mark else "")
                if has_ci:
                    row.append(f"[{tex_num(c.lo)}, {tex_num(c.hi)}]" if c.lo or c.hi else "--")
        lines.append(" & ".join(row) + r" \\")
        prev_g, prev_ck = g, ck
    lines.append(r"\bottomrule")

    what = ("per checkpoint" if ctx.options.table_checkpoints == "all"
            else "at the last checkpoint of each training phase")
    mt = metric_tex(metric)
    cap = [mt[:1].upper() + mt[1:] if mt[:1].isalpha() else mt, f" of the {tex(ctx.proxy)} proxy {what}"]
    if has_control and not transposed:
        cap.append(", against each control kind")
    cap.append(". ")
    if has_ci:
        cap.append(f"Brackets: {tex(ctx.ci_text)} bootstrap confidence intervals over sequences. ")
    if has_mark:
        cap.append(tex(ctx.legend_text()) + ". ")
    cap.append(f"Protocol: {tex(ctx.name)}.")
    label = f"tab:{slug(ctx.name)}-{slug(metric)}"
    return "\n".join([
        r"\begin{table}[htbp]",
        r"\centering\small",
        r"\setlength{\tabcolsep}{4pt}",
        r"\caption{" + "".join(cap) + "}",
        r"\label{" + label + "}",
        r"\begin{adjustbox}{max width=\linewidth}",
        r"\begin{tabular}{" + "".join(spec) + "}",
        *lines,
        r"\end{tabular}",
        r"\end{adjustbox}",
        r"\end{table}",
    ])


def render_tables(ctx: ReportContext) -> tuple[str, list[str]]:
    """The text of tables.tex and the labels of the tables it holds."""
    out = [
        f"% anistat publication tables for protocol: {_comment(ctx.name)}",
        PACKAGES_NOTE.rstrip("\n"),
        r"% Significance marks come from "
        + ("adjusted" if ctx.p_col == "p_adjusted" else "unadjusted") + " p-values.",
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
        out.append(r"% No table: none of the requested metrics ("
                   + _comment(", ".join(ctx.options.table_metrics)) + ") has rows.")
    return "\n".join(out) + "\n", labels


def _comment(s: str) -> str:
    return " ".join(str(s).split())


def _headline_tex(ctx: ReportContext) -> str:
    h = headline(ctx)
    if h is None:
        return ""
    ncols = len(h.columns)
    head = " & ".join([r"Model", "Layer"] + [
        f"{tex(ph or 'all')}, $k={int(r)}$" for ph, _c, r in h.columns])
    rows = []
    for model, loc, cells in h.rows:
        parts = [tex(model), tex(loc)]
        for c in cells:
            if c is None:
                parts.append("")
            elif c[0] == "failed":
                parts.append(r"\textit{failed}")
            else:
                est, ci, _p, mark = c
                parts.append(tex_num(est) + (r"\textsuperscript{%s}" % mark if mark else "")
                             + (r" {\footnotesize " + _ci_tex(ci) + "}" if ci else ""))
        rows.append(" & ".join(parts) + r" \\")
    return "\n".join([
        r"\begin{table}[htbp]\centering\small",
        r"\caption{Headline energy ratios $R$ of the " + tex(ctx.proxy) + " proxy against "
        + tex(ctx.control) + " controls at the last checkpoint of each phase, with "
        + tex(ctx.ci_text) + " CIs. " + tex(ctx.legend_text()) + ".}",
        r"\begin{adjustbox}{max width=\linewidth}",
        r"\begin{tabular}{ll" + "r" * ncols + "}",
        r"\toprule", head + r" \\", r"\midrule", *rows, r"\bottomrule",
        r"\end{tabular}", r"\end{adjustbox}", r"\end{table}",
    ])


def _frequency_tex(ctx: ReportContext) -> str:
    table = frequency_correlations(ctx)
    if table is None:
        return ""
    head = " & ".join(["Model", "Checkpoint"] + [tex(site) for site in table.sites])
    rows = []
    for model, checkpoint, cells in table.rows:
        parts = [tex(model), tex(checkpoint)]
        for cell in cells:
            parts.append("" if cell is None else tex_num(cell[0])
                         + (r" {\footnotesize " + _ci_tex(cell[1]) + "}" if cell[1] else ""))
        rows.append(" & ".join(parts) + r" \\")
    caption = (r"Spearman $\rho$ between a token type's log corpus frequency and the RMS distance of its "
               r"activations to the type's centroid, $\sqrt{\sum_i \lVert a_i - c\rVert^2/(n-1)}$, over the types "
               r"seen at least twice in the test split (negative: frequent tokens sit closer to their centroid). "
               r"Intervals resample test sequences, recomputing every centroid"
               + (" (" + tex(", ".join(table.ci_methods)) + ")" if table.ci_methods else "")
               + r"; a basic interval reflects the percentile interval about the estimate, removing the "
               r"bootstrap's bias, and can exclude the estimate where that bias is large. Pearson $r$ is in "
               r"\texttt{frequency.csv}."
               + "".join(" " + tex(note) + "." for note in table.notes))
    return "\n".join([
        r"\begin{table}[htbp]\centering\small",
        r"\caption{" + caption + "}",
        r"\label{tab:frequency-distance}",
        r"\begin{adjustbox}{max width=\linewidth}",
        r"\begin{tabular}{ll" + "r" * len(table.sites) + "}",
        r"\toprule", head + r" \\", r"\midrule", *rows, r"\bottomrule",
        r"\end{tabular}", r"\end{adjustbox}", r"\end{table}",
    ])


def _ci_tex(ci: str) -> str:
    m = re.fullmatch(r"\[(.*), (.*)\]", ci)
    if not m:
        return tex(ci)
    return f"[{tex_num(m.group(1))}, {tex_num(m.group(2))}]"


def render_report_tex(ctx: ReportContext, figs: list[SavedFigure], table_labels: list[str]) -> str:
    L: list[str] = [
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
        r"\usepackage[hidelinks]{hyperref}",
        r"\sisetup{group-digits=integer, group-minimum-digits=5}",
        r"\pdfinfoomitdate=1",
        r"\pdftrailerid{}",
        r"\pdfsuppressptexinfo=-1",
        r"\setlength{\parskip}{0.4em}",
        r"\setlength{\parindent}{0pt}",
        r"\title{" + tex(ctx.title) + "}",
        r"\author{Generated by anistat from protocol \texttt{" + tex(ctx.name) + "}}",
        r"\date{" + tex(str(ctx.manifest.get("finished_at") or "")) + "}",
        r"\begin{document}",
        r"\maketitle",
        r"\section{Summary}",
        r"\textbf{Question.} " + tex(QUESTION),
    ]
    if ctx.description:
        L += ["", tex(ctx.description)]
    if ctx.claims:
        n_pass = sum(bool(c.get("passed")) for c in ctx.claims)
        L += ["", r"\subsection*{Claims: %d of %d passed}" % (n_pass, len(ctx.claims)),
              r"\begin{itemize}"]
        for c in ctx.claims:
            badge = r"\textbf{PASS}" if c.get("passed") else r"\textbf{FAIL}"
            cid = r" \texttt{" + tex(c.get("id")) + "}" if c.get("id") else ""
            ev = claim_evidence_items(c.get("evidence"))
            ev_t = ("; ".join(f"{tex(k)}: {tex(v)}" for k, v in ev) if isinstance(ev, list)
                    else tex(ev))
            L.append(r"\item[" + badge + "]" + cid + " " + tex(c.get("statement", ""))
                     + (r" \\ {\small Evidence: " + ev_t + "}" if ev_t else ""))
        L.append(r"\end{itemize}")
    findings = summary_sentences(ctx)
    if findings:
        L += [r"\subsection*{Findings}", r"\begin{itemize}"]
        L += [r"\item " + tex(s) for s in findings]
        L.append(r"\end{itemize}")
    warnings = ctx.extras.get("warnings") or []
    if isinstance(warnings, str):
        warnings = [warnings]
    if warnings:
        L += [r"\subsection*{Warnings}", r"\begin{itemize}"]
        L += [r"\item " + tex(w) for w in warnings]
        L.append(r"\end{itemize}")
    hl = _headline_tex(ctx)
    if hl:
        L += ["", hl]

    L += ["", r"\section{Methods}"]
    L += [p.to_latex() + "\n" for p in methods(ctx)]

    if figs:
        L += [r"\section{Figures}"]
        for f in figs:
            L += [
                r"\begin{figure}[htbp]\centering",
                r"\includegraphics[width=\linewidth,height=0.8\textheight,keepaspectratio]{figures/"
                + f.name + ".pdf}",
                r"\caption{\textbf{" + tex(f.title) + ".} " + tex(f.caption) + "}",
                r"\label{fig:" + slug(f.name) + "}",
                r"\end{figure}",
            ]
        L.append(r"\clearpage")
    frequency = _frequency_tex(ctx)
    if frequency:
        L += [r"\section{Token frequency and centroid distance}", frequency]
    if table_labels:
        L += [r"\section{Tables}", r"Tables~" + ", ".join(r"\ref{%s}" % t for t in table_labels)
              + " (also in \\texttt{tables.tex}, ready to \\texttt{\\textbackslash input} "
              "into a paper).", r"\input{tables.tex}", r"\clearpage"]

    cards = ctx.extras.get("concept_cards")
    if isinstance(cards, (list, tuple)) and cards:
        L += [r"\section{Concept cards}", r"\begin{itemize}"]
        for c in cards[:40]:
            if not isinstance(c, dict):
                continue
            head = ", ".join(f"{k} {c[k]}" for k in ("model", "checkpoint", "layer", "proxy",
                                                     "rank", "direction") if c.get(k) is not None)
            toks = ", ".join(r"\texttt{" + tex(t) + "}" for t in list(c.get("top_tokens") or [])[:20])
            ctxs = "; ".join("``" + tex(x) + "''" for x in list(c.get("contexts") or [])[:4])
            L.append(r"\item \textbf{" + tex(head) + ".} Top tokens: " + (toks or "--")
                     + (r". Contexts: " + ctxs if ctxs else "") + ".")
        L.append(r"\end{itemize}")

    fu = failed_units(ctx)
    if fu:
        L += [r"\section{Failed units}",
              r"\begin{longtable}{@{}llll>{\raggedright\arraybackslash}p{6.5cm}@{}}",
              r"\toprule Model & Checkpoint & Layer & Site & Reason \\ \midrule \endhead",
              *[f"{tex(m)} & {tex(ck)} & {tex(layer)} & {tex(site)} & {tex(reason)} "
                f"({n} rows) \\\\" for m, ck, layer, site, reason, n in fu],
              r"\bottomrule", r"\end{longtable}"]

    rows = settings_rows(ctx)
    if rows:
        L += [r"\section{All settings}", r"{\footnotesize",
              r"\begin{longtable}{@{}l>{\raggedright\arraybackslash}p{6cm}"
              r">{\raggedright\arraybackslash}p{7.5cm}@{}}",
              r"\toprule Source & Key & Value \\ \midrule \endhead",
              *[f"{tex(s)} & \\texttt{{{_breakable(k)}}} & {_breakable(v)} \\\\"
                for s, k, v in rows],
              r"\bottomrule", r"\end{longtable}}"]
    L.append(r"\end{document}")
    return "\n".join(L) + "\n"


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
        parts.append("first error:\n" + "\n".join(lines[first:first + 6]))
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
                    [exe, "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape",
                     f"-output-directory={build}", tex_name],
                    cwd=out_dir, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                    timeout=timeout, check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise PdfLatexError(f"pdflatex timed out after {timeout:g} s") from e
            if proc.returncode != 0:
                log = build / (Path(tex_name).stem + ".log")
                text = (log.read_text(errors="replace") if log.exists()
                        else proc.stdout.decode(errors="replace"))
                raise PdfLatexError(
                    f"pdflatex failed on {tex_name} (exit {proc.returncode}); "
                    f"{_log_excerpt(text)}")
        pdf = build / (Path(tex_name).stem + ".pdf")
        if not pdf.exists():
            raise PdfLatexError("pdflatex produced no PDF")
        target = out_dir / pdf.name
        shutil.move(str(pdf), target)
        return target
    finally:
        shutil.rmtree(build, ignore_errors=True)
