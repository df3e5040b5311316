"""Frozen vs refitted proxies: is a weaker late effect a weaker phenomenon or a stale proxy?

With `proxies.refit: both`, every unit has rows for the frozen proxy (`pca`, fitted on the early
window) and for the proxy refitted on that checkpoint's own fit split (`pca@refit`). The
contrast at a checkpoint is `refit − frozen` of one metric for the same model, site, rank and
control kind: near 0 late in training means the early proxy still spans what a fresh one would
(the late weakening is real); a large positive gap means the frozen proxy went stale.

The report shows :func:`refit_contrast_table` (``anistat.bundle.report_inputs`` puts it in
``ReportInputs.refit_contrast``; ``anistat.report.refit`` renders it).
"""

from __future__ import annotations

import pandas as pd

REFIT_SUFFIX = "@refit"
KEYS = ["model", "objective", "checkpoint", "step", "phase", "layer", "site", "rank", "control"]


def refit_contrast(results: pd.DataFrame, metric: str = "energy_fraction", phase: str | None = "late") -> pd.DataFrame:
    """One row per (unit, rank, control kind, frozen proxy label) that has both a frozen and a
    refitted row of `metric`: columns `KEYS`, `proxy` (the frozen label), `frozen`, `refit`,
    `difference` (= refit − frozen) and `ratio` (= refit / frozen). `phase`: keep only that
    phase (None: every checkpoint). Empty when the results hold no refitted proxies."""
    rows = results[results["metric"] == metric]
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    if phase is not None:
        rows = rows[rows["phase"] == phase]
    proxy = rows["proxy"].astype(str)
    refitted = rows[proxy.str.endswith(REFIT_SUFFIX)].assign(proxy=lambda f: f["proxy"].str[: -len(REFIT_SUFFIX)])
    frozen = rows[~proxy.str.endswith(REFIT_SUFFIX)]
    columns = KEYS + ["proxy", "frozen", "refit", "difference", "ratio"]
    if refitted.empty or frozen.empty:
        return pd.DataFrame(columns=columns)
    keys = [k for k in KEYS if k in rows.columns] + ["proxy"]
    merged = frozen[keys + ["estimate"]].merge(refitted[keys + ["estimate"]], on=keys, suffixes=("_frozen", "_refit"))
    merged = merged.rename(columns={"estimate_frozen": "frozen", "estimate_refit": "refit"})
    merged["difference"] = merged["refit"] - merged["frozen"]
    merged["ratio"] = merged["refit"] / merged["frozen"]
    return merged[[c for c in columns if c in merged.columns]].reset_index(drop=True)


def refit_contrast_table(results: pd.DataFrame) -> pd.DataFrame:
    """The contrast the report shows: :func:`refit_contrast` of ``energy_fraction`` in the late
    phase, one row per pair. The proxy's energy fraction does not depend on the control kind, so
    rows that repeat across control kinds (same pair, same numbers) are shown once, without the
    ``control`` column; where the numbers do differ by control kind, every row is kept with it.
    Empty when the results hold no frozen/refitted pair (or lack the columns that would pair them)."""
    if not {"metric", "proxy", "phase", "estimate"} <= set(results.columns):
        return pd.DataFrame(columns=[*KEYS, "proxy", "frozen", "refit", "difference", "ratio"])
    table = refit_contrast(results)
    if table.empty or "control" not in table.columns:
        return table
    keys = [k for k in [*KEYS, "proxy"] if k in table.columns and k != "control"]
    collapsed = table.drop(columns="control").drop_duplicates().reset_index(drop=True)
    if collapsed.duplicated(subset=keys).any():
        return table
    return collapsed
