"""``report.html``: one self-contained file (inline CSS/JS, base64 PNG figures, no URLs)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ._content import (
    FREQUENCY_CAPTION,
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
from ._data import BUCKET_COLUMNS, fmt_p, ordered_by_first
from ._text import esc
from .figures import SavedFigure

DOT = " \u00b7 "
P_COLUMNS = {"p_value", "p_adjusted"}
INT_COLUMNS = {"step", "rank", "dim", "n_controls", "n_sequences", "n_tokens"}

CSS = """
:root{--fg:#1d2430;--muted:#5b6573;--line:#d8dde5;--bg:#ffffff;--soft:#f4f6f9;
--pass:#0b6aa8;--fail:#b34700;--accent:#0072B2}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{background:var(--soft);border-bottom:1px solid var(--line);padding:1.2rem 0}
header .inner,main,nav .inner,footer{max-width:1180px;margin:0 auto}
header .inner{padding:0 1rem}
h1{font-size:1.6rem;margin:0 0 .3rem;line-height:1.25;overflow-wrap:anywhere}
h2{font-size:1.3rem;margin:2.2rem 0 .8rem;padding-bottom:.3rem;border-bottom:2px solid var(--line)}
h3{font-size:1.05rem;margin:1.4rem 0 .5rem}
.sub{color:var(--muted);margin:0;font-size:.92rem;overflow-wrap:anywhere}
nav{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid var(--line)}
nav .inner{display:flex;flex-wrap:wrap;gap:.2rem 1rem;padding:.45rem 1rem;font-size:.9rem}
nav a{color:var(--accent);text-decoration:none}nav a:hover{text-decoration:underline}
main{padding:0 1rem 3rem}
.question{font-size:1.05rem;background:#eef5fb;border-left:4px solid var(--accent);
padding:.7rem 1rem;margin:1.2rem 0}
.claims{list-style:none;padding:0;margin:0}
.claims li{border:1px solid var(--line);border-radius:6px;padding:.6rem .8rem;margin:.5rem 0}
.badge{display:inline-block;min-width:3.6em;text-align:center;font-weight:700;font-size:.78rem;
letter-spacing:.04em;border-radius:4px;padding:.1rem .45rem;color:#fff;margin-right:.5rem}
.badge.pass{background:var(--pass)}.badge.fail{background:var(--fail)}
.claims .id{font-family:ui-monospace,Menlo,Consolas,monospace;color:var(--muted);font-size:.85rem}
.evidence{margin:.35rem 0 0;font-size:.88rem;color:var(--muted)}
.evidence dt{display:inline;font-weight:600}.evidence dd{display:inline;margin:0 .9rem 0 .25rem}
.findings li{margin:.25rem 0}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;border:1px solid var(--line);
border-radius:6px;margin:.6rem 0}
table{border-collapse:collapse;width:100%;font-size:.86rem}
th,td{padding:.3rem .55rem;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
thead th{background:var(--soft);position:sticky;top:0;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.headline td.cell{white-space:nowrap;text-align:right;font-variant-numeric:tabular-nums}
.headline .ci{color:var(--muted);font-size:.8rem}
.mark{color:var(--pass);font-weight:700}
tr.failed td{background:#fff3ec}td .st-failed{color:var(--fail);font-weight:700}
.warn{background:#fff8e6;border:1px solid #f0d48a;border-radius:6px;padding:.6rem .9rem;margin:1rem 0}
.warn.failed{background:#fff3ec;border-color:#f0b48a}
figure{margin:1.2rem 0 2rem}
figure img{display:block;max-width:100%;height:auto;margin:0 auto;border:1px solid var(--line);
border-radius:4px;background:#fff}
figcaption{font-size:.9rem;color:var(--muted);margin-top:.45rem;max-width:70rem}
figcaption b{color:var(--fg)}
.skipped{font-size:.88rem;color:var(--muted)}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:.8rem}
.card{border:1px solid var(--line);border-radius:6px;padding:.65rem .8rem;background:#fff}
.card h4{margin:0 0 .4rem;font-size:.9rem;overflow-wrap:anywhere}
.tok{display:inline-block;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.82rem;
background:var(--soft);border:1px solid var(--line);border-radius:3px;padding:0 .3rem;
margin:.1rem .15rem .1rem 0;white-space:pre}
.card ol{margin:.4rem 0 0;padding-left:1.2rem;font-size:.85rem}
.methods p{max-width:75rem}
details{margin:.8rem 0}summary{cursor:pointer;color:var(--accent)}
.settings td:first-child,.settings td:nth-child(2){font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:.8rem;white-space:nowrap}
.settings td:last-child{overflow-wrap:anywhere}
.controls{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;margin:.5rem 0}
.controls input,.controls select{font:inherit;font-size:.9rem;padding:.25rem .4rem;
border:1px solid var(--line);border-radius:4px;max-width:100%}
.controls input{min-width:14rem}
#results-count{color:var(--muted);font-size:.88rem}
#results-table th{cursor:pointer;user-select:none}
#results-table th[aria-sort=ascending]::after{content:" \\25B2";font-size:.7em}
#results-table th[aria-sort=descending]::after{content:" \\25BC";font-size:.7em}
#results-table td{white-space:nowrap}
#results-table td.note{min-width:16rem;max-width:28rem;white-space:normal;overflow-wrap:anywhere}
#results-table tbody{max-height:none}
.tablewrap{max-height:70vh;overflow:auto;border:1px solid var(--line);border-radius:6px}
footer{color:var(--muted);font-size:.82rem;padding:1rem;border-top:1px solid var(--line)}
@media (max-width:700px){body{font-size:14px}h1{font-size:1.3rem}
.controls input{min-width:0;width:100%}}
@media print{nav{display:none}.tablewrap{max-height:none}}
"""

# The inline script: sorting and filtering of the results table, and a readiness flag
# (`data-ready` on <html>) plus image checks that headless tests read from the dumped DOM.
JS = r"""
(function () {
  "use strict";
  var root = document.documentElement;
  var table = document.getElementById("results-table");
  if (table) {
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.forEach(function (r, i) { r._i = i; r._text = r.textContent.toLowerCase(); });
    var q = document.getElementById("results-filter");
    var sel = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
    var count = document.getElementById("results-count");
    var apply = function () {
      var needle = q ? q.value.trim().toLowerCase() : "";
      var terms = needle ? needle.split(/\s+/) : [];
      var shown = 0;
      rows.forEach(function (r) {
        var ok = true;
        for (var t = 0; t < terms.length && ok; t++) { ok = r._text.indexOf(terms[t]) !== -1; }
        for (var s = 0; s < sel.length && ok; s++) {
          var v = sel[s].value;
          if (v) { ok = r.getAttribute("data-" + sel[s].getAttribute("data-filter")) === v; }
        }
        r.hidden = !ok;
        if (ok) { shown++; }
      });
      if (count) { count.textContent = shown + " of " + rows.length + " rows"; }
    };
    if (q) {
      q.addEventListener("input", apply);
      // A link like report.html#q=tiny-bert%20late opens with the filter applied.
      var m = /^#q=(.*)$/.exec(window.location.hash || "");
      if (m) { try { q.value = decodeURIComponent(m[1]); } catch (e) { q.value = m[1]; } }
    }
    sel.forEach(function (s) { s.addEventListener("change", apply); });
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      th.setAttribute("tabindex", "0");
      var sort = function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        var numeric = th.classList.contains("num");
        var key = function (r) {
          var c = r.cells[col];
          if (numeric) {
            var v = parseFloat(c.getAttribute("data-v"));
            return isNaN(v) ? null : v;
          }
          return c.textContent;
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === null || x === "") { return (y === null || y === "") ? a._i - b._i : 1; }
          if (y === null || y === "") { return -1; }
          var c = numeric ? x - y : x.localeCompare(y, undefined, {numeric: true});
          return c !== 0 ? dir * c : a._i - b._i;
        });
        var frag = document.createDocumentFragment();
        rows.forEach(function (r) { frag.appendChild(r); });
        tbody.appendChild(frag);
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
      });
    });
    apply();
  }
  var checkImages = function () {
    var imgs = document.images, ok = 0, bad = [];
    for (var i = 0; i < imgs.length; i++) {
      if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } else { bad.push(imgs[i].alt || String(i)); }
    }
    root.setAttribute("data-images-total", String(imgs.length));
    root.setAttribute("data-images-ok", String(ok));
    root.setAttribute("data-images-bad", bad.join("|"));
  };
  if (document.readyState === "complete") { checkImages(); }
  else { window.addEventListener("load", checkImages); }
  root.setAttribute("data-ready", "1");
})();
"""

ERROR_HOOK = ("window.addEventListener('error',function(e){document.documentElement."
              "setAttribute('data-js-error',String(e.message||'error'));});")


def _attr_num(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if np.isnan(f) else repr(f)


def _cell(col: str, v: Any, ctx: ReportContext) -> str:
    if col in P_COLUMNS:
        return f'<td class="num" data-v="{_attr_num(v)}">{esc(fmt_p(v))}</td>'
    if col in INT_COLUMNS:
        txt = "" if pd.isna(v) else str(int(v)) if float(v).is_integer() else ctx.fmt(v)
        return f'<td class="num" data-v="{_attr_num(v)}">{esc(txt)}</td>'
    if isinstance(v, (float, np.floating)):
        return f'<td class="num" data-v="{_attr_num(v)}">{esc(ctx.fmt(v))}</td>'
    if col == "status" and v != "ok":
        return f'<td><span class="st-failed">{esc(v)}</span></td>'
    if col == "note":
        return f'<td class="note">{esc(v)}</td>'
    return f"<td>{esc(v)}</td>"


def _results_table(ctx: ReportContext) -> str:
    df = ctx.full
    if ctx.options.html_metrics is not None:
        df = df[df["metric"].isin(ctx.options.html_metrics)]
    cols = [c for c in ctx.options.html_columns if c in df.columns]
    for bc in BUCKET_COLUMNS:
        if bc in df.columns and (df[bc] != "").any() and bc not in cols:
            cols.insert(cols.index("metric") + 1 if "metric" in cols else len(cols), bc)
    numeric = {c for c in cols if c in P_COLUMNS | INT_COLUMNS
               or pd.api.types.is_float_dtype(df[c])}
    num_cls = ' class="num"'
    head = "".join(
        f'<th scope="col"{num_cls if c in numeric else ""}>{esc(c)}</th>' for c in cols)
    body = []
    values = {c: df[c].tolist() for c in cols}
    models, metrics, statuses = df["model"].tolist(), df["metric"].tolist(), df["status"].tolist()
    for i in range(len(df)):
        cls = ' class="failed"' if statuses[i] != "ok" else ""
        cells = "".join(_cell(c, values[c][i], ctx) for c in cols)
        body.append(f'<tr{cls} data-model="{esc(models[i])}" data-metric="{esc(metrics[i])}" '
                    f'data-status="{esc(statuses[i])}">{cells}</tr>')

    def select(name: str, label: str, options: Sequence[str]) -> str:
        opts = "".join(f'<option value="{esc(o)}">{esc(o)}</option>' for o in options)
        return (f'<label>{esc(label)} <select data-filter="{esc(name)}">'
                f'<option value="">all</option>{opts}</select></label>')

    controls = (
        '<div class="controls">'
        '<label>Filter <input id="results-filter" type="search" '
        'placeholder="words in any column, e.g. tiny late 8" aria-label="filter rows"></label>'
        + select("model", "model", ordered_by_first(df["model"]))
        + select("metric", "metric", ordered_by_first(df["metric"]))
        + select("status", "status", ordered_by_first(df["status"]))
        + f'<span id="results-count">{len(df)} of {len(df)} rows</span></div>'
    )
    return (controls + '<div class="tablewrap"><table id="results-table">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
            f'<p class="skipped">Click a column header to sort. Numbers are shown to '
            f"{ctx.options.precision} significant digits; the CSV holds full precision. "
            f"p marks: {esc(ctx.legend_text())}.</p>")


def _claims(claims: list[dict[str, Any]]) -> str:
    if not claims:
        return ""
    items = []
    for c in claims:
        passed = bool(c.get("passed"))
        badge = ('<span class="badge pass">PASS</span>' if passed
                 else '<span class="badge fail">FAIL</span>')
        ev = claim_evidence_items(c.get("evidence"))
        if isinstance(ev, list):
            ev_html = ('<dl class="evidence">' + "".join(
                f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in ev) + "</dl>") if ev else ""
        else:
            ev_html = f'<p class="evidence">{esc(ev)}</p>' if ev else ""
        cid = f'<span class="id">{esc(c.get("id", ""))}</span> ' if c.get("id") else ""
        items.append(f"<li>{badge}{cid}{esc(c.get('statement', ''))}{ev_html}</li>")
    n_pass = sum(bool(c.get("passed")) for c in claims)
    return (f"<h3>Claims: {n_pass} of {len(claims)} passed</h3>"
            f'<ul class="claims">{"".join(items)}</ul>')


def _headline_table(ctx: ReportContext) -> str:
    h = headline(ctx)
    if h is None:
        return ""
    head1 = "".join(f"<th class=\"num\">{esc(ph or 'all')} \u00b7 k = {int(r)}</th>"
                    for ph, _c, r in h.columns)
    body = []
    for model, loc, cells in h.rows:
        tds = []
        for cell in cells:
            if cell is None:
                tds.append('<td class="cell"></td>')
            elif cell[0] == "failed":
                tds.append('<td class="cell"><span class="st-failed">failed</span></td>')
            else:
                est, ci, p, mark = cell
                tds.append(f'<td class="cell">{esc(est)}<span class="mark">{esc(mark)}</span>'
                           f'<br><span class="ci">{esc(ci)}</span></td>')
        body.append(f"<tr><th scope=\"row\">{esc(model)}</th><td>{esc(loc)}</td>{''.join(tds)}</tr>")
    return ("<h3>Headline: energy ratios</h3>"
            f"<p>Energy ratio R of the <b>{esc(ctx.proxy)}</b> proxy against <b>"
            f"{esc(ctx.control)}</b> controls at the last checkpoint of each training phase, "
            f"with {esc(ctx.ci_text)} CIs. {esc(ctx.legend_text())}.</p>"
            '<div class="scroll"><table class="headline"><thead><tr><th>model</th><th>layer</th>'
            f"{head1}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _frequency(ctx: ReportContext) -> str:
    table = frequency_correlations(ctx)
    if table is None:
        return ""
    head = "".join(f'<th class="num">{esc(site)}</th>' for site in table.sites)
    body = []
    for model, checkpoint, cells in table.rows:
        tds = "".join('<td class="cell"></td>' if cell is None else
                      f'<td class="cell">{esc(cell[0])}<br><span class="ci">{esc(cell[1])}</span></td>'
                      for cell in cells)
        body.append(f'<tr><th scope="row">{esc(model)}</th><td>{esc(checkpoint)}</td>{tds}</tr>')
    methods_text = f" CI method: {', '.join(table.ci_methods)}." if table.ci_methods else ""
    notes = "".join(f"<li>{esc(n)}</li>" for n in table.notes)
    return ('<section id="frequency"><h2>Token frequency and centroid distance</h2>'
            f"<p>{esc(FREQUENCY_CAPTION)}{esc(methods_text)}</p>"
            + (f'<div class="warn"><ul>{notes}</ul></div>' if notes else "")
            + '<div class="scroll"><table class="headline"><thead><tr><th>model</th><th>checkpoint</th>'
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div></section>")


def _figures(figs: list[SavedFigure], skipped: Mapping[str, str]) -> str:
    out = []
    for i, f in enumerate(figs, start=1):
        b64 = base64.b64encode(f.png_bytes).decode("ascii")
        out.append(
            f'<figure id="fig-{esc(f.name)}"><img src="data:image/png;base64,{b64}" '
            f'alt="{esc(f.title)}" width="{f.width}" height="{f.height}" loading="eager">'
            f"<figcaption><b>Figure {i}. {esc(f.title)}.</b> {esc(f.caption)} "
            f"(PDF: figures/{esc(f.name)}.pdf)</figcaption></figure>")
    if not figs and not skipped:
        out.append('<p class="skipped">Figures were not drawn (figures=False).</p>')
    if skipped:
        out.append('<p class="skipped">Not shown (no data): ' + "; ".join(
            f"{esc(k.replace('_', ' '))} \u2014 {esc(v)}" for k, v in skipped.items()) + ".</p>")
    return "".join(out)


def _concept_cards(cards: Any) -> str:
    if not isinstance(cards, (list, tuple)) or not cards:
        return ""
    out = []
    for c in cards:
        if not isinstance(c, Mapping):
            continue
        bits = [str(c.get(k)) for k in ("model", "checkpoint") if c.get(k) not in (None, "")]
        if c.get("layer") not in (None, ""):
            bits.append(f"L{c.get('layer')}")
        if c.get("proxy") not in (None, ""):
            bits.append(f"{c.get('proxy')}" + (f" k={c.get('rank')}" if c.get("rank") is not None else ""))
        if c.get("direction") is not None:
            bits.append(f"direction {c.get('direction')}")
        toks = c.get("top_tokens") or []
        ctxs = c.get("contexts") or []
        tok_html = "".join(f'<span class="tok">{esc(t)}</span>' for t in list(toks)[:30])
        ctx_html = ("<ol>" + "".join(f"<li>{esc(x)}</li>" for x in list(ctxs)[:8]) + "</ol>"
                    if ctxs else "")
        title = " \u00b7 ".join(bits)
        out.append(f'<div class="card"><h4>{esc(title)}</h4>'
                   f"<div>{tok_html}</div>{ctx_html}</div>")
    if not out:
        return ""
    return ('<section id="concepts"><h2>Concept cards</h2><p>Tokens and contexts whose '
            'activations load most on individual proxy directions.</p>'
            f'<div class="cards">{"".join(out)}</div></section>')


def _methods(ctx: ReportContext) -> str:
    paras = "".join(p.to_html() for p in methods(ctx))
    rows = settings_rows(ctx)
    table = ""
    if rows:
        table = ("<details><summary>All protocol settings and manifest fields "
                 f"({len(rows)})</summary><div class=\"scroll\"><table class=\"settings\">"
                 "<thead><tr><th>source</th><th>key</th><th>value</th></tr></thead><tbody>"
                 + "".join(f"<tr><td>{esc(s)}</td><td>{esc(k)}</td><td>{esc(v)}</td></tr>"
                           for s, k, v in rows)
                 + "</tbody></table></div></details>")
    return f'<section id="methods" class="methods"><h2>Methods</h2>{paras}{table}</section>'


def _failed(ctx: ReportContext) -> str:
    fu = failed_units(ctx)
    if not fu:
        return ""
    rows = "".join(
        f"<tr class=\"failed\"><td>{esc(m)}</td><td>{esc(ck)}</td><td>{esc(layer)}</td>"
        f"<td>{esc(site)}</td><td class=\"num\">{n}</td><td>{esc(reason)}</td></tr>"
        for m, ck, layer, site, reason, n in fu)
    return ('<section id="failed"><h2>Failed units</h2><div class="warn failed">'
            f"{len(fu)} failed unit(s); their rows carry NaN estimates and are left out of "
            "figures and summaries.</div><div class=\"scroll\"><table><thead><tr><th>model</th>"
            "<th>checkpoint</th><th>layer</th><th>site</th><th class=\"num\">rows</th>"
            f"<th>reason</th></tr></thead><tbody>{rows}</tbody></table></div></section>")


def render_html(ctx: ReportContext, figs: list[SavedFigure], skipped: Mapping[str, str]) -> str:
    man = ctx.manifest
    sub = [f"protocol {ctx.name}"]
    if man.get("protocol_sha256"):
        sub.append(f"sha256 {str(man['protocol_sha256'])[:12]}")
    versions = man.get("versions")
    if isinstance(versions, Mapping) and versions.get("anistat"):
        sub.append(f"anistat {versions['anistat']}")
    sub.append(f"{ctx.n_units()} units, {len(ctx.full)} result rows")
    if man.get("finished_at"):
        sub.append(f"finished {man['finished_at']}")

    findings = summary_sentences(ctx)
    warnings = ctx.extras.get("warnings") or []
    if isinstance(warnings, str):
        warnings = [warnings]
    warn_html = ""
    if warnings:
        warn_html = ('<div class="warn"><b>Warnings</b><ul>'
                     + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul></div>")
    failed_note = ""
    if len(ctx.failed):
        failed_note = ('<div class="warn failed"><b>Failed units.</b> '
                       f"{len(failed_units(ctx))} unit/reason group(s) failed; see "
                       '<a href="#failed">Failed units</a>.</div>')
    summary = (
        '<section id="summary"><h2>Summary</h2>'
        f'<p class="question"><b>Question.</b> {esc(QUESTION)}</p>'
        + (f"<p>{esc(ctx.description)}</p>" if ctx.description else "")
        + _claims(ctx.claims)
        + (('<h3>Findings</h3><ul class="findings">'
            + "".join(f"<li>{esc(s)}</li>" for s in findings) + "</ul>") if findings else "")
        + _headline_table(ctx) + failed_note + warn_html + "</section>"
    )
    nav_items = [("summary", "Summary"), ("figures", "Figures")]
    frequency = _frequency(ctx)
    if frequency:
        nav_items.append(("frequency", "Frequency"))
    concepts = _concept_cards(ctx.extras.get("concept_cards"))
    if concepts:
        nav_items.append(("concepts", "Concept cards"))
    nav_items += [("methods", "Methods"), ("results", "Results table")]
    failed = _failed(ctx)
    if failed:
        nav_items.append(("failed", "Failed units"))
    nav = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in nav_items)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(ctx.title)}</title>",
        f"<script>{ERROR_HOOK}</script>",
        f"<style>{CSS}</style></head><body>",
        f'<header><div class="inner"><h1>{esc(ctx.title)}</h1>'
        f'<p class="sub">{esc(DOT.join(sub))}</p></div></header>',
        f'<nav aria-label="sections"><div class="inner">{nav}</div></nav>',
        "<main>",
        summary,
        f'<section id="figures"><h2>Figures</h2>{_figures(figs, skipped)}</section>',
        frequency,
        concepts,
        _methods(ctx),
        f'<section id="results"><h2>Results table</h2>{_results_table(ctx)}</section>',
        failed,
        "</main>",
        "<footer>Generated by anistat report from the results table and manifest; figures as "
        "PDF in figures/, publication tables in tables.tex.</footer>",
        f"<script>{JS}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
