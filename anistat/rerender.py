"""`anistat report BUNDLE`: re-render every report output from the bundle's tables alone.

Reads the bundle with `anistat.bundle.read_bundle` (results.csv, frequency.csv, manifest.json,
claims.json, concept_cards.json) and renders from the same typed `ReportInputs` as `anistat run`;
no model is loaded and nothing is recomputed. The rendered files replace the old ones
atomically (rendered into a temporary directory first), and the manifest's file digests are
updated so `anistat verify` keeps working.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .bundle import file_digests, read_bundle, report_options, utc_now, write_json
from .errors import AnistatInputError

RENDERED = ("report.html", "tables.tex", "report.tex", "report.pdf", "figures")


def rerender(bundle: Path, *, precision: int | None = None, metrics: str | None = None, transpose: bool = False,
             compile_pdf: bool = True) -> list[Path]:
    from .report import render_bundle

    contents = read_bundle(bundle)
    overrides: dict = {"transpose_tables": transpose}
    if not compile_pdf:
        overrides["compile_pdf"] = False
    if precision is not None:
        overrides["precision"] = precision
    if metrics:
        wanted = tuple(m.strip() for m in metrics.split(",") if m.strip())
        known = sorted({str(m) for m in contents.results["metric"].dropna()})
        unknown = [m for m in wanted if m not in known]
        if unknown or not wanted:
            raise AnistatInputError(f"--metrics: unknown metric(s) {', '.join(unknown) or '(none given)'}; "
                                    f"this bundle has: {', '.join(known)}")
        overrides["table_metrics"] = wanted
    options = report_options(contents.protocol, **overrides)
    staging = Path(tempfile.mkdtemp(prefix=".rerender.", dir=bundle))
    try:
        render_bundle(contents.report_inputs(), staging, options=options)
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
    manifest = dict(contents.manifest)
    manifest["rerendered_at"] = utc_now()
    manifest["files"] = file_digests(bundle)
    write_json(bundle / "manifest.json", manifest)
    return written
