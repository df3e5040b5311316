"""Turn unit artifacts into a bundle outside `anistat run` (e.g. after measuring inside training).

`finalize_bundle(artifacts_or_units_dir, protocol, out)` runs the same analysis and writes the
same files as `anistat run` (results.csv/.parquet, frequency.csv, concept_cards.json,
manifest.json, report.html, tables.tex, …), atomically — so `anistat report` and
`anistat verify` work on it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .artifact import UnitArtifact


def load_units(directory: str | Path) -> list[UnitArtifact]:
    """Every complete unit (`<id>.json` + `<id>.npz`) in a directory, in file-name order."""
    return [UnitArtifact.load(path) for path in sorted(Path(directory).glob("*.json"))]


def finalize_bundle(units: Iterable[UnitArtifact] | str | Path, protocol: Any, out: str | Path, *,
                    token_counts: dict[str, np.ndarray] | None = None, models: dict[str, Any] | None = None,
                    concept_cards: list[dict] | None = None, corpus: dict[str, Any] | None = None,
                    device: str = "cpu", started_at: str | None = None):
    """Analyse `units` (artifacts or a directory of them) under `protocol` and write a bundle at
    `out`. `token_counts` (model → corpus token counts) enables the frequency table. Returns
    the `RunResult` (out, results, manifest, claims) that `anistat.run` returns."""
    from ..analyze import analyze_units, frequency_rows
    from ..bundle import command_line, environment, file_digests, staged_bundle, utc_now, write_json
    from ..claims import evaluate_claims
    from ..errors import AnistatInputError
    from ..pipeline import RunResult, write_results
    from ..protocol import Protocol, load_protocol
    from ..report import render_bundle
    from ..rerender import render_inputs, report_options

    started = time.perf_counter()
    started_at = started_at or utc_now()
    if not isinstance(protocol, Protocol):
        protocol = load_protocol(protocol)
    artifacts = load_units(units) if isinstance(units, (str, Path)) else list(units)
    if not artifacts:
        raise AnistatInputError("no measured units to write a bundle from")
    out = Path(out)
    results = analyze_units(artifacts, protocol)
    frequency = frequency_rows(artifacts, token_counts or {}, protocol)
    claims = evaluate_claims(results, protocol.claims, frequency, ci_level=protocol.stats.ci_level)
    failed = sorted({a.key.id for a in artifacts if a.status != "ok"})
    cards = list(concept_cards or [])
    manifest = {
        "anistat_bundle": 1,
        "protocol": protocol.normalised(),
        "protocol_sha256": protocol.sha256(),
        "versions": environment(),
        "device": device,
        "dtype": "float64 statistics, float32 model" if device == "cpu" else "float32 statistics",
        "seed": protocol.seed,
        "command": command_line(),
        "started_at": started_at,
        "finished_at": utc_now(),
        "seconds": round(time.perf_counter() - started, 3),
        "corpus": corpus or {"name": "external", "sha256": None, "documents": None},
        "models": models or {},
        "units": [{"id": a.key.id, "status": a.status, "note": a.note, "seconds": round(a.seconds, 3)}
                  for a in artifacts],
        "failed_units": len(failed),
        "warnings": list(results.attrs.get("warnings", [])),
    }
    with staged_bundle(out) as staging:
        write_results(results, staging)
        if not frequency.empty:
            frequency.to_csv(staging / "frequency.csv", index=False, float_format="%.10g", lineterminator="\n")
        write_json(staging / "concept_cards.json", cards)
        if protocol.claims:
            write_json(staging / "claims.json", claims)
        render_bundle(render_inputs(results, frequency), manifest, staging, claims=claims or None,
                      extras={"concept_cards": cards, "frequency": frequency},
                      options=report_options(protocol.normalised()))
        manifest["files"] = file_digests(staging)
        write_json(staging / "manifest.json", manifest)
    return RunResult(out=out, results=results, manifest=manifest, claims=claims)
