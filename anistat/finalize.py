"""Turn unit artifacts into a bundle outside `anistat run` (e.g. after measuring inside training).

`finalize_bundle(artifacts_or_units_dir, protocol, out)` runs the same analysis as `anistat run`
and writes the bundle through the same function (`anistat.bundle.publish_bundle`), so
`anistat report` and `anistat verify` work on it. It lives above `collect/` (it analyses and
publishes), so the collection stage imports nothing from the stages after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .collect.artifact import UnitArtifact


def load_units(directory: str | Path) -> list[UnitArtifact]:
    """Every complete unit (`<id>.json` + `<id>.npz`) in a directory, in file-name order."""
    return [UnitArtifact.load(path) for path in sorted(Path(directory).glob("*.json"))]


def finalize_bundle(
    units: Iterable[UnitArtifact] | str | Path,
    protocol: Any,
    out: str | Path,
    *,
    token_counts: dict[str, np.ndarray] | None = None,
    models: dict[str, Any] | None = None,
    concept_cards: list[dict] | None = None,
    corpus: dict[str, Any] | None = None,
    device: str = "cpu",
    started_at: str | None = None,
):
    """Analyse `units` (artifacts or a directory of them) under `protocol` and write a bundle at
    `out`. `token_counts` (model → corpus token counts) enables the frequency table. Returns
    the `RunResult` (out, results, manifest, claims) that `anistat.run` returns."""
    from .analyze import analyze_run
    from .bundle import (
        RunFacts,
        check_destination,
        concentration_warnings,
        few_resampling_units_warnings,
        publish_bundle,
        unit_records,
        utc_now,
    )
    from .claims import evaluate_claims
    from .errors import AnistatInputError
    from .protocol import Protocol, load_protocol

    check_destination(Path(out))  # before the analysis: a folder that cannot be replaced is said at once
    started = time.perf_counter()
    started_at = started_at or utc_now()
    if not isinstance(protocol, Protocol):
        protocol = load_protocol(protocol)
    artifacts = load_units(units) if isinstance(units, (str, Path)) else list(units)
    if not artifacts:
        raise AnistatInputError("no measured units to write a bundle from")
    results, frequency = analyze_run(artifacts, token_counts or {}, protocol, device=device)
    claims = evaluate_claims(results, protocol.claims, frequency, stats=protocol.stats)
    facts = RunFacts(
        device=device,
        started_at=started_at,
        seconds=time.perf_counter() - started,
        corpus=corpus or {"name": "external", "sha256": None, "documents": None},
        models=models or {},
        units=unit_records(artifacts),
        warnings=(
            *results.attrs.get("warnings", []),
            *few_resampling_units_warnings(results),
            *concentration_warnings(results),
        ),
        null_settings=dict(results.attrs.get("null_settings", {})),
    )
    return publish_bundle(Path(out), protocol, results, frequency, claims, list(concept_cards or []), facts)
