"""Analysis: collection artifacts → the tidy results table (and the frequency table).

Pure functions over `UnitArtifact`s (no model is touched), so changing alpha, the number of
bootstrap resamples or the multiplicity method re-runs only this stage.

One row per unit × rank × proxy × control kind × metric (columns in `RESULT_COLUMNS`):

* energy metrics from `anistat.stats.analyze_energy` — `energy_fraction`, `energy_ratio`,
  `log2_energy_ratio`, `z`, `anisotropy_capture` share the exact Monte-Carlo test of the
  proxy against Haar subspaces drawn from the unit's gradient second moment (`p_test`
  `haar_monte_carlo`, exact under "the proxy is a uniformly random subspace"; the paper's
  test against the row's own control kind is `p_value_paper`, not exact for `normal`);
  `hedges_g` carries the sign-flip test of per-unit contributions (documents, else sequences);
* `delta_isoscore_star` (per basis, from the gradient covariance) with its own exact Haar test;
* `oracle_fraction` per unit and rank (proxy `oracle`, control `none`, no test), from the
  eigenvalues of the unit's gradient second moment (the decomposition the exact test needs);
* descriptive metrics per unit (proxy and control `none`): IsoScore, IsoScore*, participation
  ratio, effective rank and mean cosine of the gradients (`gradient_*`) and of the activations
  (`activation_*`).

Multiplicity: each distinct test enters the family once — the exact energy test of a (unit,
proxy, rank), shared by every control kind, its ΔIsoScore* test, and one sign-flip test per
control kind — and the metrics sharing a test share its adjusted p-value. The family is the
whole run or one model (protocol `stats.family`; `claim` families are formed per claim by
`anistat.claims`). The number of Haar draws is chosen so that the Monte-Carlo floor can pass
the largest family's corrected threshold (`NullSettings`).

Modules: `nulls` (the exact tests of every unit from Haar draws shared by all units of a width,
with sequential stopping), `units` (one unit's rows), `frequency` (frequency.csv).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from .. import _columns
from .. import vocabulary as vocab
from ..collect import UnitArtifact
from ..protocol import Protocol
from ..seeding import derive_seed
from ..stats import EXACT_TEST, adjust_pvalues, min_controls_needed, resolution_warning
from ..stats.resampling_risk import family_decisions
from ..vocabulary import ENERGY_METRICS
from .frequency import FREQUENCY_COLUMNS, bucket_spectra, frequency_rows
from .nulls import ExactNulls, NullOptions, UnitSpectrum, exact_tests
from .units import (
    descriptive_rows,
    failed_rows,
    prepare_unit,
    proxy_groups,
    rows_of_unit,
    screen_units,
)

__all__ = [
    "DESCRIPTIVE_METRICS",
    "ENERGY_METRICS",
    "FREQUENCY_COLUMNS",
    "RESULT_COLUMNS",
    "NullSettings",
    "adjust",
    "analyze_run",
    "analyze_units",
    "descriptive_rows",
    "frequency_rows",
    "multiplicity_warning",
    "null_settings",
    "planned_tests",
    "run_exact_tests",
    "test_families",
    "unit_rows",
]

RESULT_COLUMNS = list(_columns.RESULT_COLUMNS)  # a list: the decision columns are appended
#: Columns added when `stats.resampling_risk` is set: the risk-bounded decision of the exact energy
#: test in its family and the confidence-sequence interval of its ideal p-value.
DECISION_COLUMNS = ["mc_decision", "mc_p_low", "mc_p_high"]
DESCRIPTIVE_METRICS = ("isoscore", "isoscore_star", "participation_ratio", "effective_rank", "mean_cosine")


@dataclass(frozen=True, kw_only=True)
class NullSettings:
    """Monte-Carlo sizes used for every unit of one analysis (recorded in results and manifest).

    ``n_null_draws``: the most Haar draws an exact test uses; ``stop_after``: its sequential
    stopping rule (a test stops once this many draws reach its observed value; 0: never);
    ``n_test_resamples``: bootstrap resamples of the data test; ``n_tests``: the largest
    multiplicity family they were sized for; ``resampling_risk``: the bound ε on the probability
    that a family's risk-bounded decisions (``mc_decision``) differ from the ideal ones (None: off)."""

    n_null_draws: int
    n_test_resamples: int
    n_tests: int
    stop_after: int = 0
    null_draws: str = "shared"
    resampling_risk: float | None = None


def planned_tests(artifacts: list[UnitArtifact], protocol: Protocol) -> int:
    """Size of the largest multiplicity family: per unit and (proxy, rank), the exact energy test
    and the exact ΔIsoScore* test, plus the data tests (one for the closed-form kinds together,
    one per projected kind)."""
    per_model: dict[str, int] = {}
    for artifact in artifacts:
        groups = set(proxy_groups(artifact))
        kinds = set(protocol.controls.kinds)
        projected = kinds & set(protocol.projected_control_kinds)
        data_tests = len(projected) + (1 if kinds - projected else 0)
        per_model[artifact.key.model] = per_model.get(artifact.key.model, 0) + len(groups) * (2 + data_tests)
    if not per_model:
        return 1
    return max(per_model.values()) if protocol.stats.family == "model" else sum(per_model.values())


def null_settings(artifacts: list[UnitArtifact], protocol: Protocol) -> NullSettings:
    """How many Haar draws and data-test resamples: enough that the Monte-Carlo floor 1/(n+1) can pass
    the corrected threshold of the largest family (`stats.n_null_draws: auto`), so the floor
    never decides a result; an explicit `n_null_draws` is used as given."""
    stats = protocol.stats
    n_tests = planned_tests(artifacts, protocol)
    needed = min_controls_needed(stats.alpha, n_tests, stats.multiplicity)
    draws = max(9999, needed) if stats.n_null_draws == "auto" else int(stats.n_null_draws)
    return NullSettings(
        n_null_draws=draws,
        n_test_resamples=max(stats.n_test_resamples, needed),
        n_tests=n_tests,
        stop_after=stats.null_stop_exceedances,
        null_draws=stats.null_draws,
        resampling_risk=stats.resampling_risk,
    )


def run_exact_tests(
    spectra: list[UnitSpectrum], protocol: Protocol, settings: NullSettings, device: str | torch.device = "cpu"
) -> ExactNulls:
    """Every prepared unit's exact tests from one stream of Haar draws per width (seeded by the
    protocol seed and the width, so a unit's null never depends on the other units), or one
    stream per test (`stats.null_draws: per_test`: every unit and rank, seeded by the unit's id
    and the rank)."""
    stats = protocol.stats
    record = protocol.controls.n if vocab.HAAR in protocol.controls.kinds else 0
    options = NullOptions(
        n_max=settings.n_null_draws,
        stop_after=settings.stop_after,
        alternative=stats.alternative,
        c0=stats.isoscore_c0,
        zeta=stats.isoscore_zeta,
        n_record=record,
        device=device,
        resampling_risk=settings.resampling_risk,
        alpha=stats.alpha,
        risk_tests=max(settings.n_tests, 1),
    )
    if settings.null_draws == "per_test":
        # every (unit, rank) its own stream: the unit's spectrum once per rank, with that rank's tests
        split = [
            replace(
                unit,
                energy_observed={k: v for k, v in unit.energy_observed.items() if k[1] == rank},
                delta_observed={k: v for k, v in unit.delta_observed.items() if k[1] == rank},
            )
            for unit in spectra
            for rank in sorted({k[1] for k in unit.energy_observed})
        ]
        return exact_tests(
            split,
            options,
            None,
            lambda unit: (
                f"{unit.unit_id}/k={next(iter(unit.energy_observed))[1]}",
                derive_seed(protocol.seed, "haar-null", unit.unit_id, next(iter(unit.energy_observed))[1]),
            ),
        )
    return exact_tests(spectra, options, lambda dim: derive_seed(protocol.seed, "haar-null", dim))


def unit_rows(
    artifact: UnitArtifact, protocol: Protocol, settings: NullSettings | None = None, nulls: ExactNulls | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """All rows of one unit, plus its warnings (before multiplicity adjustment). Without `nulls`
    the unit's exact tests run on their own (the same draws as in a run: the stream depends on the
    protocol seed and the width only)."""
    screen_units([artifact])
    if artifact.status != "ok":
        return failed_rows(artifact, protocol), []
    settings = settings or null_settings([artifact], protocol)
    prepared = prepare_unit(artifact, protocol)
    nulls = nulls or run_exact_tests([prepared.spectrum], protocol, settings)
    return rows_of_unit(prepared, nulls, protocol, settings)


def test_families(results: pd.DataFrame, protocol: Protocol) -> list[pd.DataFrame]:
    """The multiplicity families: each distinct test once, grouped by the protocol's `stats.family`
    (the whole run, or one model; `claim` families are formed by `anistat.claims`, and
    results.csv then adjusts over the run). Shared by the adjustment and the resolution guard."""
    tests = results.dropna(subset=["p_value"]).drop_duplicates("_test")
    if protocol.stats.family in ("run", "claim"):
        return [tests]
    return [group for _, group in tests.groupby("model", sort=False)]


def adjust(results: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    """p_adjusted: each distinct test once per family (see module docstring)."""
    stats = protocol.stats
    results["p_adjusted"] = np.nan
    if stats.multiplicity == "none":
        results["p_adjusted"] = results["p_value"]
        return results
    adjusted: dict[tuple[Any, ...], float] = {}
    for family in test_families(results, protocol):
        values = adjust_pvalues(family["p_value"].to_numpy(dtype=float), stats.multiplicity)
        adjusted.update(zip(family["_test"], values))
    results["p_adjusted"] = [
        adjusted.get(test, np.nan) if isinstance(test, tuple) else np.nan for test in results["_test"]
    ]
    return results


def decide_with_bounded_risk(results: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    """`mc_decision` of every exact energy test (`stats.resampling_risk`): per family, the
    protocol's correction applied to the ideal p-values' intervals `[mc_p_low, mc_p_high]` (the
    family's other tests at their reported p-values) — `rejected` where even the upper ends are
    rejected, `not rejected` where not even the lower ends are, else `undecided`
    (:func:`anistat.stats.resampling_risk.family_decisions`). Every test's interval has risk
    ε / n_tests with n_tests at least the family's size, so a family's decisions all agree with its
    ideal decisions with probability at least 1 − ε."""
    stats = protocol.stats
    method = "none" if stats.multiplicity == "none" else stats.multiplicity
    decided: dict[tuple[Any, ...], str] = {}
    families = (
        [results.dropna(subset=["p_value"]).drop_duplicates("_test")]
        if method == "none"
        else test_families(results, protocol)
    )
    for family in families:
        p = family["p_value"].to_numpy(dtype=float)
        low = np.where(family["mc_p_low"].notna(), family["mc_p_low"].astype(float), p)
        high = np.where(family["mc_p_high"].notna(), family["mc_p_high"].astype(float), p)
        status = family_decisions(low, high, stats.alpha, method)
        decided.update(
            (test, str(s)) for test, s, has in zip(family["_test"], status, family["mc_p_low"].notna()) if has
        )
    results["mc_decision"] = [decided.get(test, "") if isinstance(test, tuple) else "" for test in results["_test"]]
    return results


def multiplicity_warning(results: pd.DataFrame, protocol: Protocol, nulls: NullSettings) -> str | None:
    """The resolution guard: can the exact Monte-Carlo tests reach the corrected threshold of the
    largest family (wording right for each correction, see `anistat.stats.resolution_warning`)?"""
    stats = protocol.stats
    has_test = any(isinstance(t, tuple) and t[-1] == EXACT_TEST for t in results["_test"].dropna())
    if not has_test:
        return None
    n_tests = max(len(family) for family in test_families(results, protocol))
    return resolution_warning(nulls.n_null_draws, stats.alpha, n_tests, stats.multiplicity, what="Haar null draws")


def analyze_units(
    artifacts: list[UnitArtifact], protocol: Protocol, device: str | torch.device = "cpu"
) -> pd.DataFrame:
    """The tidy results table (sorted, typed, deterministic) for a list of units.

    `results.attrs["warnings"]` lists run warnings; `results.attrs["null_settings"]` the
    Monte-Carlo sizes used (`NullSettings`) and the draws each stream made."""
    return analyze_run(artifacts, {}, protocol, device, frequency=False)[0]


def analyze_run(
    artifacts: list[UnitArtifact],
    token_counts: dict[str, np.ndarray],
    protocol: Protocol,
    device: str | torch.device = "cpu",
    *,
    frequency: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The results table and (``frequency=True``) the frequency table of a run, with every exact
    test — each unit's, and each frequency bucket's — read off the same Haar streams, so the
    draws are made once. A unit that cannot be analysed (`units.unanalysable_reason`: zero
    gradient energy, a proxy that is not orthonormal, too little data) is marked failed with its
    reason, and the others proceed."""
    screen_units(artifacts)
    settings = null_settings(artifacts, protocol)
    prepared = {a.key.id: prepare_unit(a, protocol) for a in artifacts if a.status == "ok"}
    spectra = [unit.spectrum for unit in prepared.values()]
    if frequency:
        spectra += [spectrum for artifact in artifacts for spectrum in bucket_spectra(artifact)]
    nulls = run_exact_tests(spectra, protocol, settings, device)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for artifact in artifacts:
        if artifact.status != "ok":
            rows.extend(failed_rows(artifact, protocol))
            continue
        unit_rows_, unit_notes = rows_of_unit(prepared[artifact.key.id], nulls, protocol, settings)
        rows.extend(unit_rows_)
        notes.extend(unit_notes)
    results = _typed(pd.DataFrame(rows), protocol)
    guard = multiplicity_warning(results, protocol, settings)
    columns = RESULT_COLUMNS + (DECISION_COLUMNS if settings.resampling_risk is not None else [])
    results = results[columns].copy().reset_index(drop=True)
    results.attrs["warnings"] = ([guard] if guard else []) + notes
    # plain data: attrs travel into parquet metadata
    made = nulls.draws_made
    results.attrs["null_settings"] = {
        **asdict(settings),
        "streams": len(made),
        "draws": int(sum(made.values())),
        "longest_stream": int(max(made.values(), default=0)),
        # per width when the units of a width share a stream (one per test would bloat the manifest)
        **({"draws_made": {str(d): n for d, n in made.items()}} if settings.null_draws == "shared" else {}),
    }
    table = frequency_rows(artifacts, token_counts, protocol, nulls=nulls) if frequency else None
    return results, table


def _typed(results: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    for column in RESULT_COLUMNS + DECISION_COLUMNS + ["_test"]:
        if column not in results:
            results[column] = np.nan
    results = adjust(results, protocol)
    if protocol.stats.resampling_risk is not None:
        results = decide_with_bounded_risk(results, protocol)
    for column in ("step", "rank", "layer", "dim", "n_controls", "n_sequences", "n_clusters", "n_tokens"):
        results[column] = pd.array(results[column], dtype="Int64")
    for column in ("ci_method", "note", "fallback", "status", "p_test", "effect_size_kind"):
        # object first: a column that is all NaN (every unit failed) is float64
        results[column] = results[column].astype(object).fillna("").astype(str)
    return results
