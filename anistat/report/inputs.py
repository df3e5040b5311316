"""The report's typed inputs: everything HTML, LaTeX, re-rendering and verification read.

One adapter outside this package (``anistat.bundle.report_inputs``) builds a frozen
:class:`ReportInputs` from the typed protocol, the written tables and the manifest, so the
renderers never guess at protocol keys: a setting the report states is a field here.

Conventions: strings are display-ready (not escaped; each renderer escapes for its target with
``anistat.report.escape``); counts are ``int``; optional numbers are ``None`` when unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class ModelDescription:
    """One model of the run as the protocol declares it.

    ``kind`` is a human description of the source (e.g. "built-in GPT-2-style decoder trained in
    the run"); ``checkpoints`` are the labels in training order; ``early_checkpoints`` the ones
    inside the proxy fit window; ``settings`` the protocol fields that apply to this model's
    source only (a local model shows no built-in ``hidden_size`` or ``train.steps``).
    """

    name: str
    source: str
    kind: str
    objective: str
    checkpoints: tuple[str, ...]
    early_checkpoints: tuple[str, ...]
    settings: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RunDescription:
    """What the protocol asked for, typed: the methods text is generated from these fields.

    ``n_controls`` is the protocol's number of control draws per kind (``controls.n``);
    ``isoscore_c0`` and ``isoscore_zeta`` are IsoScore*'s shrinkage target and weight
    (``stats.isoscore_c0``, ``stats.isoscore_zeta``).
    """

    name: str
    title: str
    description: str
    seed: int
    corpus: str
    seq_len: int
    n_fit_sequences: int
    n_test_sequences: int
    models: tuple[ModelDescription, ...]
    site_selection: str
    proxy_methods: tuple[str, ...]
    ranks: tuple[int, ...]
    fit_window: float
    max_fit_tokens: int
    control_kinds: tuple[str, ...]
    n_controls: int
    pca_span_dim: int | None
    alpha: float
    ci_level: float
    ci_method: str
    n_bootstrap: int
    n_permutations: int
    alternative: str
    multiplicity: str
    family: str
    isoscore_c0: str
    isoscore_zeta: float
    report_precision: int
    settings: tuple[tuple[str, str, str], ...]
    """(section, key, value) rows of the settings table: every protocol setting that applies to
    this run (per data and model source), then the manifest fields."""


@dataclass(frozen=True)
class RunRecord:
    """Manifest fields of one run: where, when and with what it ran."""

    protocol_sha256: str = ""
    versions: tuple[tuple[str, str], ...] = ()
    device: str = ""
    dtype: str = ""
    started_at: str = ""
    finished_at: str = ""
    command: str = ""
    unit_seconds: tuple[float, ...] = ()
    failed_units: int = 0


@dataclass(frozen=True)
class ClaimOutcome:
    """One evaluated claim: pass/fail and its evidence as (name, value) pairs or one sentence."""

    id: str
    statement: str
    passed: bool
    evidence: tuple[tuple[str, str], ...] | str = ()


@dataclass(frozen=True)
class ConceptCard:
    """Tokens and contexts that load most on one proxy direction."""

    model: str
    checkpoint: str
    layer: str
    site: str
    proxy: str
    rank: int | None
    direction: int | None
    top_tokens: tuple[str, ...]
    contexts: tuple[str, ...]


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report is rendered from.

    ``results`` is the table as written to ``results.csv`` (its row count is the report's);
    ``frequency`` the rows of ``frequency.csv`` (empty when the run has none); ``warnings`` the
    run's warnings as recorded in the manifest, shown prominently in every output.
    ``calibration`` and ``control_draws`` are optional extra figure data.
    """

    results: pd.DataFrame
    run: RunDescription
    record: RunRecord = field(default_factory=RunRecord)
    frequency: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: tuple[str, ...] = ()
    claims: tuple[ClaimOutcome, ...] = ()
    concept_cards: tuple[ConceptCard, ...] = ()
    calibration: pd.DataFrame | None = None
    control_draws: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.results, pd.DataFrame):
            raise TypeError(f"results must be a pandas DataFrame, got {type(self.results).__name__}")
        if not isinstance(self.run, RunDescription):
            raise TypeError(f"run must be a RunDescription, got {type(self.run).__name__}")
        object.__setattr__(self, "warnings", tuple(str(w) for w in self.warnings))


def evidence_items(evidence: Any) -> tuple[tuple[str, str], ...] | str:
    """A claim's recorded evidence as display pairs (a mapping) or one sentence (anything else)."""
    from collections.abc import Mapping

    if evidence is None:
        return ()
    if isinstance(evidence, Mapping):
        return tuple((str(k), _short(v)) for k, v in evidence.items())
    return str(evidence)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_short(v) for v in list(value)[:8])
        return f"[{shown}{', …' if len(value) > 8 else ''}]"
    return str(value)
