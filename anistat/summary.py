"""The compact summary of a bundle: one row per claim and per headline cell (`Bundle.summary()`,
`anistat summary BUNDLE`), in the spirit of statsmodels' ``summary()``.

A **claim** row is the claim's verdict with the evidence that decided it (claims.json):
``estimate`` and the interval are the claim's ``interval`` (the weakest selected row's, or the
pooled one of a meta claim, whose ``se`` is the pooled SE), ``test`` is what decided it
(``decided_by``: the rows' own tests, the interval, or the pooled test) and ``p`` its p-value.

A **headline cell** row is one cell of the report's headline table: the energy ratio
``R = E(U) / mean E(Q)`` of the primary proxy against the primary control at the last checkpoint
of each phase, per model, site and rank — ``estimate``, ``se``, ``ci_low``, ``ci_high`` exactly
as results.csv holds them, ``test`` the row's ``p_test`` and ``p`` its adjusted p-value
(``p_adjusted``; ``p_value`` when the run corrects for no family).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: The columns of :attr:`Summary.table` (and of `anistat summary --json`'s rows), in order.
SUMMARY_COLUMNS = (
    "kind",
    "name",
    "model",
    "checkpoint",
    "phase",
    "site",
    "rank",
    "proxy",
    "control",
    "metric",
    "estimate",
    "se",
    "ci_low",
    "ci_high",
    "test",
    "p",
    "p_of",
    "verdict",
)
#: The columns the text, HTML, Markdown and LaTeX tables show (headers as shown).
SHOWN = (
    ("name", "row"),
    ("verdict", "verdict"),
    ("estimate", "estimate"),
    ("se", "se"),
    ("ci_low", "ci low"),
    ("ci_high", "ci high"),
    ("test", "decided by"),
    ("p", "p"),
)


@dataclass(frozen=True)
class Summary:
    """One bundle's compact table.

    ``table``: a DataFrame with :data:`SUMMARY_COLUMNS` (claims first, then headline cells);
    ``title``, ``notes``: the header line and the lines under the table; ``precision``:
    significant digits in the rendered tables (the DataFrame keeps every digit). ``str()`` is the
    plain-text table; ``_repr_html_`` renders it in Jupyter; :meth:`to_markdown`,
    :meth:`to_latex` and :meth:`to_dict` give the same rows for a paper or a script."""

    table: pd.DataFrame
    title: str
    notes: tuple[str, ...]
    precision: int = 3

    def to_frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (a copy)."""
        return self.table.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``title``, ``notes`` and ``rows`` (one mapping per row; NaN as None, an
        unbounded interval's end as ``"inf"``/``"-inf"``)."""
        rows = [{k: _plain(v) for k, v in row.items()} for row in self.table.to_dict(orient="records")]
        return {"title": self.title, "notes": list(self.notes), "rows": rows}

    def _cells(self) -> list[list[str]]:
        return [[_cell(row[key], key, self.precision) for key, _ in SHOWN] for _, row in self.table.iterrows()]

    def __str__(self) -> str:
        head = [label for _, label in SHOWN]
        cells = self._cells()
        widths = [max([len(head[i]), *(len(r[i]) for r in cells)]) for i in range(len(head))]

        def line(values: Sequence[str]) -> str:
            return "  ".join(
                v.ljust(w) if i in (0, 1, 6) else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))
            )

        width = max(len(line(head)), len(self.title))
        body = [line(r) for r in cells] or ["(no claim and no headline cell)"]
        return "\n".join(
            ["=" * width, self.title, "-" * width, line(head), "-" * width, *body, "=" * width, *self.notes]
        )

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        from .report import esc

        head = "".join(f"<th>{esc(label)}</th>" for _, label in SHOWN)
        rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for cells in self._cells())
        notes = "".join(f"<p>{esc(n)}</p>" for n in self.notes)
        return (
            f'<div class="anistat-summary"><table><caption>{esc(self.title)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{notes}</div>"
        )

    def to_markdown(self) -> str:
        """A GitHub-flavoured Markdown table (pipes in text escaped), then the notes."""
        head = [label for _, label in SHOWN]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in self._cells()]
        return "\n".join([f"**{self.title}**", "", *lines, "", *self.notes]) + "\n"

    def to_latex(self, caption: str | None = None, label: str = "tab:anistat-summary") -> str:
        """A booktabs table (needs ``booktabs``; ``adjustbox`` for the width), caption = the title."""
        from .report import booktabs_table, tex

        head = [[tex(label) for _, label in SHOWN]]
        body = [[tex(c) if c else "--" for c in cells] for cells in self._cells()]
        caption = tex(self.title if caption is None else caption)
        return booktabs_table("ll" + "r" * 4 + "lr", head, body, caption=caption, label=label) + "\n"


def _plain(value: Any) -> Any:
    """A strict-JSON value: NaN/None/NA as None, ±inf (an unbounded interval) as "inf"/"-inf",
    numpy scalars as Python numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if value is None or str(value) == "<NA>":
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _cell(value: Any, key: str, precision: int) -> str:
    from .report._data import fmt_num, fmt_p

    if key == "p":
        return fmt_p(value)
    if key in ("estimate", "se", "ci_low", "ci_high"):
        return fmt_num(value, precision)
    return "" if _plain(value) is None else str(value)


# ---------------------------------------------------------------------------------------------
# the rows
# ---------------------------------------------------------------------------------------------
def claim_rows(claims: Sequence[Mapping[str, Any]], metrics: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per claim record (claims.json): verdict, the interval that stood beside it (its
    estimate; a meta claim's pooled SE), what decided it, the p-value it reports and what that
    p is of (``p_of``); ``metrics``: each claim's metric by id (the protocol's)."""
    rows = []
    for record in claims:
        interval = record.get("interval") or {}
        evidence = record.get("evidence") or {}
        p_value = record.get("p_value") or {}
        estimate = interval.get("estimate", evidence.get("meta_estimate"))
        rows.append(
            {
                "kind": "claim",
                "name": str(record.get("id", "")),
                "metric": metrics.get(str(record.get("id", "")), ""),
                "estimate": _float(estimate),
                "se": _float(evidence.get("meta_se")),
                "ci_low": _float(interval.get("low")),
                "ci_high": _float(interval.get("high")),
                "test": str(record.get("decided_by", "")),
                "p": _float(p_value.get("value")),
                "p_of": str(p_value.get("of", "")),
                "verdict": str(record.get("status", "pass" if record.get("passed") else "fail")),
            }
        )
    return rows


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def headline_rows(context: Any) -> list[dict[str, Any]]:
    """The headline table's cells (``anistat.report._content.headline``'s selection): energy
    ratios of ``context.proxy`` against ``context.control`` at each phase's last checkpoint,
    one row per model, site, phase and rank, with the row's own numbers."""
    from .report._data import phase_last_checkpoints

    main = context.main
    chosen = main[
        (main["metric"] == "energy_ratio") & (main["proxy"] == context.proxy) & (main["control"] == context.control)
    ]
    rows = []
    for _, row in phase_last_checkpoints(chosen).iterrows():
        rank = int(row["rank"]) if not math.isnan(row["rank"]) else None
        rows.append(
            {
                "kind": "cell",
                "name": f"{row['model']} {row['site']} {row['checkpoint']} k={rank}",
                "model": row["model"],
                "checkpoint": row["checkpoint"],
                "phase": row["phase"],
                "site": row["site"],
                "rank": rank,
                "proxy": row["proxy"],
                "control": row["control"],
                "metric": "energy_ratio",
                "estimate": _float(row["estimate"]),
                "se": _float(row.get("se")),
                "ci_low": _float(row["ci_low"]),
                "ci_high": _float(row["ci_high"]),
                "test": str(row.get("p_test", "")),
                "p": _float(row[context.p_col]),
                "p_of": context.p_col,
                "verdict": "" if row["status"] == "ok" else str(row["status"]),
            }
        )
    return rows


def bundle_summary(bundle: Any, precision: int | None = None) -> Summary:
    """The :class:`Summary` of a loaded ``anistat.bundle.Bundle``."""
    import pandas as pd

    from .report import ReportOptions
    from .report._content import ReportContext

    precision = bundle.protocol.report.precision if precision is None else precision
    context = ReportContext(bundle.report_inputs(), ReportOptions(precision=precision, figures=False))
    metrics = {claim.id: claim.metric for claim in bundle.protocol.claims}
    rows = [*claim_rows(bundle.claims, metrics), *headline_rows(context)]
    table = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    table["rank"] = table["rank"].astype("Int64")
    passed = sum(1 for c in bundle.claims if c.get("passed"))
    manifest = bundle.manifest
    title = (
        f"anistat summary: {bundle.protocol.name} — {len(manifest.get('units', []))} unit(s), claims "
        f"{passed} passed / {len(bundle.claims) - passed} failed, finished {manifest.get('finished_at', '?')}"
    )
    notes = (
        f"Claims: the interval that stood beside the verdict and the p-value the claim reports; decided by "
        f"the rows' own tests ('test'), the interval ('interval') or both. Cells: energy ratio of proxy "
        f"{context.proxy} against control {context.control} at each phase's last checkpoint, "
        f"{context.ci_text} CI, p = {context.p_col} of the row's test.",
    )
    return Summary(table, title, notes, precision)
