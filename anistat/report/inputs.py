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

from .claim_text import P_FLOOR, claim_reading, interval_text, p_phrase, rule_terms


@dataclass(frozen=True)
class LoopDescription:
    """A model measured inside its own training loop (``TrainingMeter`` / ``AnistatCallback``):
    what the manifest records about the loop, so the report describes the loop's batches and
    steps, not the protocol's data settings (which were not used).

    ``driver`` names the measuring object (e.g. "AnistatCallback in a transformers Trainer run");
    ``training`` the training settings it recorded, in words ("" when unknown);
    ``fit_steps`` the steps whose activations fitted the proxies; ``measured_steps`` the first
    step of every measured unit (``window`` steps each); ``fit_sequences`` / ``measured_sequences``
    the sequences seen on them; ``sequence_length`` the longest sequence; ``token_counts`` where
    the frequency buckets' counts came from."""

    driver: str
    training: str
    fit_steps: tuple[int, ...]
    measured_steps: tuple[int, ...]
    window: int
    fit_sequences: int | None
    measured_sequences: int | None
    sequence_length: int | None
    token_counts: str = ""


@dataclass(frozen=True)
class ModelDescription:
    """One model of the run as the protocol declares it.

    ``kind`` is a human description of the source (e.g. "built-in GPT-2-style decoder trained in
    the run"); ``checkpoints`` are the labels in training order; ``early_checkpoints`` the ones
    of the early phase (the first ``proxies.fit_window`` share of the checkpoints); ``settings``
    the protocol fields that apply to this model's source only (a local model shows no built-in
    ``hidden_size`` or ``train.steps``); ``loop`` what was measured when the model was measured
    inside its own training loop (None for `anistat run`).
    """

    name: str
    source: str
    kind: str
    objective: str
    checkpoints: tuple[str, ...]
    early_checkpoints: tuple[str, ...]
    settings: tuple[tuple[str, str], ...]
    loop: LoopDescription | None = None


@dataclass(frozen=True)
class RunDescription:
    """What the protocol asked for, typed: the methods text is generated from these fields.

    ``n_controls`` is the protocol's number of control draws per kind (``controls.n``, the
    paper's convention); ``n_null_draws`` the Haar draws of the exact test the run used;
    ``isoscore_c0`` and ``isoscore_zeta`` are IsoScore*'s shrinkage target and weight
    (``stats.isoscore_c0``, ``stats.isoscore_zeta``); ``proxy_refit`` is ``proxies.refit``
    (``frozen``: fitted on the early phase and frozen; ``per_checkpoint``: refitted on every
    checkpoint, labelled ``METHOD@refit``; ``both``). ``corpus``, ``seq_len`` and the sequence
    counts describe `anistat run`'s data; a model measured in its own loop carries its own
    (``ModelDescription.loop``).
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
    n_test_resamples: int
    alternative: str
    multiplicity: str
    family: str
    isoscore_c0: str
    isoscore_zeta: float
    report_precision: int
    settings: tuple[tuple[str, str, str], ...]
    """(section, key, value) rows of the settings table: every protocol setting that applies to
    this run (per data and model source), then the manifest fields."""
    energy_ratio_reference: str = "expected"
    resampling_unit: str = "document"
    n_null_draws: int | None = None
    """Haar subspaces drawn for the exact test (the manifest's ``null_settings``)."""
    n_test_resamples_used: int | None = None
    null_stop_exceedances: int = 0
    """Sequential stopping of the exact tests: a test stops once this many draws reach it (0: never)."""
    null_draws_auto: bool = True
    """``stats.n_null_draws: auto`` — the draws were sized so the floor can pass the family."""
    resampling_risk: float | None = None
    """``stats.resampling_risk``: the bound ε of the risk-bounded decisions (``mc_decision``; None: off)."""
    proxy_refit: str = "frozen"
    null_draws: str = "shared"
    """``stats.null_draws``: one stream of Haar draws per width (``shared``) or per test (``per_test``)."""

    @property
    def measured_in_loop(self) -> bool:
        """Every model was measured inside its own training loop (TrainingMeter / AnistatCallback)."""
        return bool(self.models) and all(m.loop is not None for m in self.models)


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
    """One evaluated claim, display-ready: pass/fail, what decided it and its evidence.

    ``interval`` is the short interval text shown beside the verdict (e.g. "95 % interval
    [1.94, 2.34]", or why there is none) and ``interval_of`` what it is an interval of;
    ``p_value`` the p-value with what it tests; ``rule`` the claim's rule in words;
    ``decided_by`` ``interval`` / ``test`` / ``point estimate``; ``failed`` the criteria that
    failed (empty on a pass); ``evidence`` the recorded evidence as (name, value) pairs or one
    sentence. Built from a claims.json record by :func:`claim_outcome`.

    The card's words (:func:`anistat.report.claim_text.claim_reading`): ``answers`` the keys of
    the question(s) the verdict answers and ``question`` them in words; ``decision`` the evidence
    that decided it; ``interval_role`` ``decided`` (``interval`` is the decisive interval),
    ``context`` (an interval of another estimand, shown only as ``context``) or ``none``;
    ``caveat`` what the verdict does not say (a PASS by the exact test whose rows' intervals
    include the threshold)."""

    id: str
    statement: str
    passed: bool
    evidence: tuple[tuple[str, str], ...] | str = ()
    status: str = ""
    rule: str = ""
    decided_by: str = ""
    interval: str = ""
    interval_of: str = ""
    p_value: str = ""
    failed: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    question: str = ""
    decision: str = ""
    interval_role: str = "none"
    context: str = ""
    caveat: str = ""


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
class NullCheckSummary:
    """A run's own null check: p-values of an uninformative (``random``) proxy, which must follow
    a valid test's null law (``anistat.stats.p_value_uniformity``).

    ``test`` is ``"exact"`` (the primary Haar Monte-Carlo test) or ``"paper"`` (normal controls,
    the paper's convention); ``p_values`` the distinct tests' p-values; ``grid`` G when they are
    multiples of 1/G (None: continuous); ``expected_rate`` P(p ≤ ``alpha``) on that grid;
    ``rejection_rate`` the share of p ≤ ``alpha`` with its exact 95 % interval
    ``rate_low``/``rate_high`` and the exact binomial test ``binomial_p`` against
    ``expected_rate``; ``uniformity_p`` the Monte-Carlo p-value of the KS distance from the
    uniform law on the grid; ``verdict`` ``calibrated`` / ``anti-conservative`` /
    ``conservative`` / ``not uniform`` at ``level``."""

    test: str
    p_values: tuple[float, ...]
    alpha: float
    rejection_rate: float
    rate_low: float
    rate_high: float
    expected_rate: float
    grid: int | None
    binomial_p: float
    uniformity_p: float
    level: float
    verdict: str
    sequential: bool = False
    """The p-values come from the sequential exact test (their law is simulated, not a grid)."""
    shared_draws: bool = False
    """The tests read Haar draws shared by the units of a width: dependent p-values."""
    seed: int | None = None
    """The run's seed (one run: one seed behind the verdict)."""

    @property
    def calibrated(self) -> bool:
        return self.verdict == "calibrated"

    @classmethod
    def from_check(cls, test: str, p_values: Any, check: Any, **provenance: Any) -> NullCheckSummary:
        """The summary of ``check``, an ``anistat.stats.UniformityCheck`` of ``p_values`` (its
        alpha, rejection rate with interval, expected rate, grid, binomial and uniformity p-values,
        level and verdict), with ``provenance`` (``sequential``, ``shared_draws``, ``seed``)."""
        return cls(
            test,
            tuple(float(v) for v in p_values),
            check.alpha,
            check.rejection_rate,
            check.rate_ci[0],
            check.rate_ci[1],
            check.expected_rate,
            check.grid,
            check.binomial_p,
            check.uniformity_p,
            check.level,
            check.verdict,
            **provenance,
        )


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report is rendered from.

    ``results`` is the table as written to ``results.csv`` (its row count is the report's);
    ``frequency`` the rows of ``frequency.csv`` (empty when the run has none); ``warnings`` the
    run's warnings as recorded in the manifest, shown prominently in every output.
    ``calibration`` and ``control_draws`` are optional extra figure data; ``null_checks`` the
    run's own null check when it measured an uninformative (``random``) proxy; ``refit_contrast``
    the late-phase refit − frozen contrast of the proxies' energy fraction when the run has both
    frozen and refitted proxies (``anistat.staleness.refit_contrast_table``: columns ``model``,
    ``checkpoint``, ``site``, ``rank``, ``proxy`` — the frozen label —, ``frozen``, ``refit``,
    ``difference``, ``ratio``, and ``control`` where the numbers differ by control kind; empty
    otherwise).
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
    null_checks: tuple[NullCheckSummary, ...] = ()
    refit_contrast: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __post_init__(self) -> None:
        if not isinstance(self.results, pd.DataFrame):
            raise TypeError(f"results must be a pandas DataFrame, got {type(self.results).__name__}")
        if not isinstance(self.run, RunDescription):
            raise TypeError(f"run must be a RunDescription, got {type(self.run).__name__}")
        object.__setattr__(self, "warnings", tuple(str(w) for w in self.warnings))


#: The fields `claim_reading` adds to a claims.json record.
READING_FIELDS = ("answers", "question", "decision", "interval_role", "context", "caveat")
NO_INTERVAL = "no interval: the selected rows carry no CI"
OLD_RECORD = "not recorded (a claims.json from an older anistat; `anistat verify` re-evaluates it)"


def claim_outcome(record: Any) -> ClaimOutcome:
    """A claims.json record (``anistat.claims.evaluate_claim``) as a display-ready outcome.

    Every card gets an interval text: the record's interval, or why there is none (rows without a
    CI; an older record that did not store one)."""
    from collections.abc import Mapping

    record = record if isinstance(record, Mapping) else {}
    interval, interval_of = OLD_RECORD, ""
    if "interval" in record:
        found = record.get("interval")
        interval = NO_INTERVAL
        if interval_text(found):
            interval = interval_text(found, rule_terms(str(record.get("rule", ""))).get("threshold"))
            interval_of = str(found.get("of") or "") if isinstance(found, Mapping) else ""
        elif record.get("status") == "error":
            interval = "no interval: the claim could not be evaluated"
    p_text = ""
    found_p = record.get("p_value")
    if isinstance(found_p, Mapping) and _is_number(found_p.get("value")):
        p_text = p_phrase(found_p["value"], alpha=rule_terms(str(record.get("rule", ""))).get("alpha")) + (
            f" ({found_p['of']})" if found_p.get("of") else ""
        )
    failed = record.get("failed") if isinstance(record.get("failed"), list) else []
    # the words as recorded; a record written without them (an older claims.json, a hand-made
    # record) is read the same way here
    words = {**claim_reading(record), **{k: record[k] for k in READING_FIELDS if k in record}}
    if words["interval_role"] == "context" and interval_of:
        interval_of = f"context, not what decided this claim: {interval_of}"
    return ClaimOutcome(
        id=str(record.get("id", "")),
        statement=str(record.get("statement", "")),
        passed=bool(record.get("passed")),
        evidence=evidence_items(record.get("evidence")),
        status=str(record.get("status", "")),
        rule=str(record.get("rule", "")),
        decided_by=str(record.get("decided_by", "")),
        interval=interval,
        interval_of=interval_of,
        p_value=p_text,
        failed=tuple(str(f) for f in failed),
        answers=tuple(str(a) for a in words["answers"] or ()),
        question=str(words["question"]),
        decision=str(words["decision"]),
        interval_role=str(words["interval_role"]),
        context=str(words["context"] or ""),
        caveat=str(words["caveat"] or ""),
    )


def _is_number(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def evidence_items(evidence: Any) -> tuple[tuple[str, str], ...] | str:
    """A claim's recorded evidence as display pairs (a mapping) or one sentence (anything else)."""
    from collections.abc import Mapping

    if evidence is None:
        return ()
    if isinstance(evidence, Mapping):
        return tuple((str(k), _p_short(v) if _is_p_name(str(k)) else _short(v)) for k, v in evidence.items())
    return str(evidence)


def _is_p_name(name: str) -> bool:
    """An evidence field that holds a p-value (p_adjusted_max, p_vs_threshold, p_value …)."""
    return name.startswith("p_") or name.endswith("_p") or name == "p"


def _p_short(value: Any) -> str:
    """A p-value as evidence: "< 1e-16" below the floor, else like any number."""
    if _is_number(value) and float(value) < P_FLOOR:
        return "< 1e-16"
    return _short(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_short(v) for v in list(value)[:8])
        return f"[{shown}{', …' if len(value) > 8 else ''}]"
    return str(value)
