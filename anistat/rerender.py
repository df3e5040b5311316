"""`anistat report BUNDLE`: re-render every report output from the bundle's tables alone.

Reads `results.csv`, `manifest.json` and the optional `claims.json`, `concept_cards.json`,
`frequency.csv`; no model is loaded and nothing is recomputed. The rendered files replace the
old ones atomically (rendered into a temporary directory first), and the manifest's file
digests are updated so `anistat verify` keeps working.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from .bundle import file_digests, read_manifest, utc_now, write_json
from .errors import AnistatInputError

RENDERED = ("report.html", "tables.tex", "report.tex", "report.pdf", "figures")
TEXT_COLUMNS = ("ci_method", "note", "status", "p_test", "effect_size_kind")
INTEGER_COLUMNS = ("step", "rank", "layer", "dim", "n_controls", "n_sequences", "n_clusters", "n_tokens")


def report_options(protocol: dict, **overrides):
    """ReportOptions from the protocol's `report` section (title, precision, PDF), then overrides."""
    from .report import ReportOptions

    section = protocol.get("report", {}) if isinstance(protocol, dict) else {}
    values = {"title": section.get("title"), "precision": section.get("precision", 3),
              "compile_pdf": None if section.get("compile_pdf", True) else False}
    values.update(overrides)
    return ReportOptions(**values)


def render_inputs(results: pd.DataFrame, frequency: pd.DataFrame) -> pd.DataFrame:
    """The table the report draws from: results plus the per-frequency-bucket energy ratios
    (kept in `frequency.csv`, not `results.csv`; the report recognises them by `bucket`)."""
    if frequency is None or frequency.empty or "bucket" not in frequency:
        return results
    buckets = frequency[(frequency["metric"] == "energy_ratio") & (frequency["bucket"].astype(str) != "all")]
    return pd.concat([results.assign(bucket=""), buckets.assign(bucket=buckets["bucket"].astype(str))],
                     ignore_index=True)


def read_results(bundle: Path) -> pd.DataFrame:
    path = bundle / "results.csv"
    if not path.is_file():
        raise AnistatInputError(f"{bundle}: bundle has no results.csv")
    try:
        results = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise AnistatInputError(f"{path}: cannot be read as CSV ({' '.join(str(error).split())})") from None
    missing = {"model", "metric", "estimate"} - set(results.columns)
    if missing:
        raise AnistatInputError(f"{path}: missing column(s) {sorted(missing)}")
    # the dtypes `anistat.analyze.analyze_units` gives (tests/test_workflow.py compares a bundle
    # read back with the run's own table): text columns as str ("" for empty), counts as Int64
    for column in TEXT_COLUMNS:
        if column in results:
            results[column] = results[column].astype(object).fillna("").astype(str)
    for column in INTEGER_COLUMNS:
        if column in results:
            results[column] = pd.array(results[column], dtype="Int64")
    return results


def read_frequency(bundle: Path) -> pd.DataFrame | None:
    """The bundle's optional frequency.csv (None when absent); a damaged file is a user error."""
    path = bundle / "frequency.csv"
    if not path.is_file():
        return None
    try:
        frequency = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise AnistatInputError(f"{path}: cannot be read as CSV ({' '.join(str(error).split())})") from None
    for column in ("ci_method", "note"):
        if column in frequency:
            frequency[column] = frequency[column].fillna("").astype(str)
    return frequency


def _optional_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AnistatInputError(f"{path}: not valid JSON ({error})") from None


def table_metrics(metrics: str, results: pd.DataFrame) -> tuple[str, ...]:
    """`--metrics a,b` → ('a', 'b'); a name that is not a metric of the bundle is one clear line
    listing the valid ones (never an empty table)."""
    wanted = tuple(dict.fromkeys(m.strip() for m in metrics.split(",") if m.strip()))
    valid = sorted(results["metric"].dropna().astype(str).unique())
    unknown = [m for m in wanted if m not in valid]
    if unknown or not wanted:
        import difflib

        close = difflib.get_close_matches(unknown[0], valid, n=1) if unknown else []
        hint = f"did you mean '{close[0]}'? " if close else ""
        what = f"unknown metric(s) {', '.join(unknown)}" if unknown else "no metric named"
        raise AnistatInputError(f"--metrics: {what}; {hint}valid metrics in this bundle: {', '.join(valid)}")
    return wanted


def rerender(bundle: Path, *, precision: int | None = None, metrics: str | None = None, transpose: bool = False,
             compile_pdf: bool = True, log=None) -> list[Path]:
    """Re-render every report output of `bundle` in place (see module docstring); `log` gets
    one line per stage (the figures and the PDF take most of the time)."""
    import time

    from .report import render_bundle

    log = log or (lambda message: None)
    started = time.perf_counter()
    manifest = read_manifest(bundle)
    results = read_results(bundle)
    claims = _optional_json(bundle / "claims.json")
    cards = _optional_json(bundle / "concept_cards.json") or []
    frequency = read_frequency(bundle)
    frequency = pd.DataFrame() if frequency is None else frequency
    overrides = {"transpose_tables": transpose}
    if not compile_pdf:
        overrides["compile_pdf"] = False
    if precision is not None:
        overrides["precision"] = precision
    if metrics is not None:
        overrides["table_metrics"] = table_metrics(metrics, results)
    options = report_options(manifest.get("protocol", {}), **overrides)
    log(f"re-rendering {bundle}: {len(results)} result rows → figures, report.html, tables.tex, report.tex"
        + (", report.pdf" if options.compile_pdf is not False else "") + " …")
    staging = Path(tempfile.mkdtemp(prefix=".rerender.", dir=bundle))
    try:
        render_bundle(render_inputs(results, frequency), manifest, staging, claims=claims, extras={"concept_cards": cards, "frequency": frequency},
                      options=options)
        written = []
        trash = staging / ".replaced"
        trash.mkdir()
        for name in RENDERED:
            target, fresh = bundle / name, staging / name
            if fresh.is_file() and not target.is_dir():
                os.replace(fresh, target)  # one atomic rename per file: never half a file
                written.append(target)
                continue
            if target.exists() or target.is_symlink():
                os.replace(target, trash / name)  # moved aside, removed with the staging dir
            if fresh.exists():
                os.replace(fresh, target)
                written.append(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"  rendered ({time.perf_counter() - started:.1f}s)")
    manifest["rerendered_at"] = utc_now()
    manifest["files"] = file_digests(bundle)
    write_json(bundle / "manifest.json", manifest)
    return written
