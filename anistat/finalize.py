"""The one analyse → claims → warnings → publish path, and bundles from units measured elsewhere.

`analyse_and_publish` turns measured units into a bundle: `anistat.analyze.analyze_run` (the
results and frequency tables, the analysis' warnings and Monte-Carlo sizes, `RunAnalysis`),
the protocol's claims (`anistat.claims.evaluate_claims`), the run's warnings (the caller's,
then the analysis', then `few_resampling_units_warnings` and `concentration_warnings`) and
`anistat.bundle.publish_bundle`. `anistat run` (`anistat.pipeline`), `TrainingMeter` and
`AnistatCallback` (`anistat.callbacks`) and `finalize_bundle` all end in it, so `anistat report`
and `anistat verify` work on every bundle alike. It lives above `collect/` (it analyses and
publishes), so the collection stage imports nothing from the stages after it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import timing
from .analyze import RunAnalysis, analyze_run
from .bundle import (
    RunFacts,
    RunResult,
    check_destination,
    concentration_warnings,
    few_resampling_units_warnings,
    publish_bundle,
    unit_records,
    utc_now,
)
from .claims import evaluate_claims
from .collect.artifact import UnitArtifact
from .errors import AnistatInputError
from .explore import BASES_FILE, bases_file

if TYPE_CHECKING:
    import torch

    from .protocol import Protocol
    from .runtime import ThreadChoice


def load_units(directory: str | Path) -> list[UnitArtifact]:
    """Every complete unit (`<id>.json` + `<id>.npz`) in a directory, in file-name order."""
    return [UnitArtifact.load(path) for path in sorted(Path(directory).glob("*.json"))]


def analyse_and_publish(
    artifacts: list[UnitArtifact],
    token_counts: Mapping[str, np.ndarray],
    protocol: Protocol,
    out: Path,
    *,
    device: str | torch.device,
    started_at: str,
    started: float,
    corpus: Mapping[str, Any],
    models: Mapping[str, Any],
    concept_cards: list[dict] | None = None,
    warnings: Iterable[str] = (),
    threads: ThreadChoice | None = None,
    extra_files: Mapping[str, str] | None = None,
    log: Callable[[str], None] = lambda message: None,
    analysis: RunAnalysis | None = None,
    publishing: AbstractContextManager[None] | None = None,
) -> RunResult:
    """Analyse `artifacts` under `protocol`, check its claims and write the bundle at `out`.

    `token_counts` (model → corpus token counts) feed the frequency table; `warnings` are the
    caller's run warnings (e.g. the corpus'), recorded before the analysis'; `started` is the
    `time.perf_counter()` the run's `seconds` count from; `extra_files` (name → text, e.g. the
    protocol.yaml of a run built from options) are written into the bundle, with
    bases.safetensors when `report.keep_bases` asks for it. `log` receives the progress lines
    `anistat run` prints. `analysis`: the artifacts' analysis when the caller already made it
    (under torchrun every rank analyses its share of the units before the group ends).
    `publishing`: a context the bundle is written in (`anistat run`'s turns a full or read-only
    disk into one line naming the bundle)."""
    stage = time.perf_counter()
    log(
        f"analysing {len(artifacts)} unit(s): exact tests against Haar subspaces shared by the units of "
        f"each width, {protocol.stats.n_bootstrap} bootstrap resamples per interval, per-bucket energy "
        "ratios and log-frequency correlations …"
    )
    if analysis is None:
        analysis = analyze_run(
            artifacts, dict(token_counts), protocol, device=device, workers=threads.threads if threads else 1
        )
    results, frequency, nulls = analysis.results, analysis.frequency, analysis.null_settings
    made = (
        f"{nulls.get('draws')} in {nulls.get('streams')} stream(s), the longest {nulls.get('longest_stream')}"
        if nulls.get("streams")
        else ""
    )
    log(
        f"  analysed: {len(results)} result rows and {len(frequency)} frequency rows; at most "
        f"{nulls.get('n_null_draws')} Haar draws per test (drawn: {made or 'none'}) and "
        f"{nulls.get('n_test_resamples')} data-test resamples, sized for a family of {nulls.get('n_tests')} "
        f"({time.perf_counter() - stage:.1f}s)"
    )
    few_units = [*few_resampling_units_warnings(results), *concentration_warnings(results)]
    for warning in [*analysis.warnings, *few_units]:
        log(f"warning: {warning}")
    with timing.stage("claims"):
        claims = evaluate_claims(results, protocol.claims, frequency, stats=protocol.stats)
    stage = time.perf_counter()
    log(
        "writing the bundle: tables, figures, report.html, tables.tex"
        + (", report.pdf" if protocol.report.compile_pdf else "")
        + " …"
    )
    facts = RunFacts(
        device=str(device),
        started_at=started_at,
        seconds=time.perf_counter() - started,
        corpus=corpus,
        models=models,
        units=unit_records(artifacts),
        timer=timing.active_timer(),
        warnings=(*warnings, *analysis.warnings, *few_units),
        null_settings=dict(nulls),
        threads=threads,
    )
    kept: dict[str, str | bytes] = dict(extra_files or {})
    if protocol.report.keep_bases:
        kept[BASES_FILE] = bases_file(artifacts)
    with publishing or contextlib.nullcontext():
        outcome = publish_bundle(
            out, protocol, results, frequency, claims, list(concept_cards or []), facts, extra_files=kept
        )
    log(f"  rendered ({time.perf_counter() - stage:.1f}s)")
    for name, reason in outcome.manifest.get("omitted_files", {}).items():
        log(f"note: {name} was not written: {reason}")
    return outcome


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
) -> RunResult:
    """Analyse `units` (artifacts or a directory of them) under `protocol` and write a bundle at
    `out` (`analyse_and_publish`). `token_counts` (model → corpus token counts) enables the
    frequency table. Returns the `RunResult` (out, results, manifest, claims) that `anistat.run`
    returns."""
    from .protocol import Protocol, load_protocol

    check_destination(Path(out))  # before the analysis: a folder that cannot be replaced is said at once
    started = time.perf_counter()
    if not isinstance(protocol, Protocol):
        protocol = load_protocol(protocol)
    artifacts = load_units(units) if isinstance(units, (str, Path)) else list(units)
    if not artifacts:
        raise AnistatInputError("no measured units to write a bundle from")
    return analyse_and_publish(
        artifacts,
        token_counts or {},
        protocol,
        Path(out),
        device=device,
        started_at=started_at or utc_now(),
        started=started,
        corpus=corpus or {"name": "external", "sha256": None, "documents": None},
        models=models or {},
        concept_cards=concept_cards,
    )
