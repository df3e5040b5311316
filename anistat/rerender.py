"""`anistat report BUNDLE`: re-render every report output from the bundle's tables alone.

Reads the bundle once into an `anistat.bundle.Bundle` (results.csv, frequency.csv, manifest.json,
claims.json, concept_cards.json) and renders from the same typed `ReportInputs` as `anistat run`;
no model is loaded and nothing is recomputed. The rendered files replace the old ones
atomically (rendered into a temporary directory first).

**Integrity first.** Re-rendering must never launder an edit: before anything is read, every
file is checked against the sha256 recorded in the manifest (`anistat.bundle.integrity_problems`).
A data file that differs (results.csv, frequency.csv, claims.json, …: anything that is not a
rendered output) is refused — one line, exit 2 — unless the caller passes
``allow_edited_data`` (`--allow-edited-data`). Then the manifest records each edit under
``edited_data`` (file, recorded and current sha256, when), keeps the *recorded* digest of the
edited files, so `anistat verify` keeps reporting them as modified, and every report says the
data were edited after the run. Edits already recorded there do not need the flag again.
Rendered outputs that differ (an edited report.html, a missing figure) are simply re-rendered;
a file anistat did not write among them (e.g. the user's own picture in figures/) is refused,
since replacing the folder would delete it.

A report.pdf that is not recompiled (`--no-pdf`, or no pdflatex) is kept as it was; the
manifest's ``rerenders`` entry says which files were re-rendered and which were kept from an
earlier rendering.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .bundle import (
    Bundle,
    IntegrityProblem,
    as_bundle,
    file_digests,
    foreign_files,
    foreign_files_message,
    is_rendered,
    report_options,
    utc_now,
    write_json,
)
from .errors import AnistatInputError

RENDERED = ("report.html", "tables.tex", "report.tex", "report.pdf", "figures")


def refuse_edited_data(bundle: Path, problems: list[IntegrityProblem]) -> None:
    """One clear line naming the first edit (and how many more), what to run to see them all and
    how to re-render them anyway."""
    first = problems[0]
    more = f" (and {len(problems) - 1} more difference(s))" if len(problems) > 1 else ""
    raise AnistatInputError(
        f"{bundle}: {first}{more}; refusing to re-render data that differ from the run's manifest "
        f"(`anistat verify {bundle}` lists every difference; `anistat report {bundle} --allow-edited-data` "
        "re-renders them and records the edit in the manifest)"
    )


def rerender(
    bundle: Bundle | Path,
    *,
    precision: int | None = None,
    metrics: str | None = None,
    transpose: bool = False,
    compile_pdf: bool = True,
    allow_edited_data: bool = False,
    log=None,
) -> list[Path]:
    """Re-render every report output of `bundle` in place (see module docstring); `log` gets
    one line before and one after rendering (the figures and the PDF take most of the time).
    A path is read with :meth:`Bundle.load`, the integrity check before the tables.

    Raises AnistatInputError (exit 2) when a data file differs from the manifest and
    ``allow_edited_data`` is False — before anything is written."""
    import time

    from .report import render_bundle

    log = log or (lambda message: None)
    started = time.perf_counter()
    found: list[IntegrityProblem] = []

    def check(path: Path, manifest: dict, problems: tuple[IntegrityProblem, ...]) -> None:
        found.extend(_checked_edits(path, problems, allow_edited_data))

    bundle = as_bundle(bundle, check=check)
    edits, manifest = found, bundle.manifest
    overrides = _report_overrides(bundle, precision, metrics, transpose, compile_pdf)
    options = report_options(bundle.protocol, **overrides)
    now = utc_now()
    new_manifest = dict(manifest)
    if edits:  # allowed: the report must say it was rendered from data edited after the run
        new_manifest["edited_data"] = _records(new_manifest.get("edited_data")) + [
            {
                "file": p.name,
                "change": p.kind,
                "recorded_sha256": (manifest.get("files") or {}).get(p.name),
                "sha256": p.sha256 or None,
                "accepted_at": now,
            }
            for p in edits
        ]
    log(
        f"re-rendering {bundle.path}: {len(bundle.results)} result rows → figures, report.html, tables.tex, "
        "report.tex" + (", report.pdf" if options.compile_pdf is not False else "") + " …"
    )
    staging = Path(tempfile.mkdtemp(prefix=".rerender.", dir=bundle.path))
    try:
        render_bundle(bundle.report_inputs(new_manifest if edits else None), staging, options=options)
        written, kept = _replace_rendered(bundle.path, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"  rendered ({time.perf_counter() - started:.1f}s)")
    new_manifest["rerendered_at"] = now
    new_manifest["rerenders"] = _records(new_manifest.get("rerenders")) + [
        {
            "at": now,
            "rendered": sorted(p.name for p in written),
            "kept_from_an_earlier_rendering": kept,
            **({"edited_data": [p.name for p in edits]} if edits else {}),
        }
    ]
    new_manifest["files"] = _digests_after(bundle.path, manifest)
    write_json(bundle.path / "manifest.json", new_manifest)
    return written


def _checked_edits(
    bundle: Path, problems: tuple[IntegrityProblem, ...], allow_edited_data: bool
) -> list[IntegrityProblem]:
    """The integrity check, before the tables are read or anything is written: a file anistat did not write among
    the rendered outputs is refused, and so are data files that differ from the manifest unless
    ``allow_edited_data``; returns those edits (not yet recorded in the manifest)."""
    # the rendered outputs are replaced whole (figures/ as a folder): a file the user put among
    # them would be lost, so it is refused like `--overwrite` refuses one (anistat.bundle)
    replaced = [name for name in foreign_files(bundle) if name.split("/", 1)[0] in RENDERED]
    if replaced:
        raise AnistatInputError(
            foreign_files_message(str(bundle), replaced, "re-render the report over them").replace(
                "choose another --out", "re-render a copy of the bundle"
            )
        )
    edits = [p for p in problems if not p.rendered and not p.accepted_at]
    if edits and not allow_edited_data:
        refuse_edited_data(bundle, edits)
    return edits


def _report_overrides(
    bundle: Bundle, precision: int | None, metrics: str | None, transpose: bool, compile_pdf: bool
) -> dict:
    """The protocol's report options overridden from the command line; ``metrics`` (comma-separated)
    must name metrics of this bundle."""
    overrides: dict = {"transpose_tables": transpose}
    if not compile_pdf:
        overrides["compile_pdf"] = False
    if precision is not None:
        overrides["precision"] = precision
    if metrics:
        wanted = tuple(m.strip() for m in metrics.split(",") if m.strip())
        known = sorted({str(m) for m in bundle.results["metric"].dropna()})
        unknown = [m for m in wanted if m not in known]
        if unknown or not wanted:
            raise AnistatInputError(
                f"--metrics: unknown metric(s) {', '.join(unknown) or '(none given)'}; "
                f"this bundle has: {', '.join(known)}"
            )
        overrides["table_metrics"] = wanted
    return overrides


def _replace_rendered(bundle: Path, staging: Path) -> tuple[list[Path], list[str]]:
    """Move the outputs rendered into `staging` over the bundle's, one atomic rename each (old
    folders moved aside into the staging dir); returns the files written and the names kept
    from an earlier rendering (a PDF not recompiled)."""
    written: list[Path] = []
    kept: list[str] = []
    trash = staging / ".replaced"
    trash.mkdir()
    for name in RENDERED:
        target, fresh = bundle / name, staging / name
        if name == "report.pdf" and not fresh.exists():
            # not recompiled (--no-pdf or no pdflatex): the earlier PDF stays, and the manifest says so
            if target.is_file() and not target.is_symlink():
                kept.append(name)
            continue
        if fresh.is_file() and not target.is_dir():
            os.replace(fresh, target)  # one atomic rename per file: never half a file
            written.append(target)
            continue
        if target.exists() or target.is_symlink():
            os.replace(target, trash / name)  # moved aside, removed with the staging dir
        if fresh.exists():
            os.replace(fresh, target)
            written.append(target)
    return written, kept


def _records(value) -> list:
    """A manifest list this module appends to (anything else — a hand-edited value — starts anew)."""
    return list(value) if isinstance(value, list) else []


def _digests_after(bundle: Path, manifest: dict) -> dict[str, str]:
    """The manifest's digests after a re-render: fresh ones for the rendered outputs, the
    recorded ones for every data file — an edited data file keeps the digest of the run, so
    `anistat verify` still reports it."""
    recorded = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    now = file_digests(bundle)
    digests = {name: digest for name, digest in now.items() if is_rendered(name)}
    digests.update({name: digest for name, digest in recorded.items() if not is_rendered(name)})
    # data files the manifest never recorded (an older bundle) are taken as they are
    digests.update({name: digest for name, digest in now.items() if name not in digests and not recorded})
    return dict(sorted(digests.items()))
