"""Analysis: collection artifacts → the tidy results table.

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
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from .collect import UnitArtifact
from .geometry import (
    ResampledCentroidDistance, ResampledTypeMeans, SpectralFrame, effective_rank_from_cov, haar_null_check,
    isoscore_from_cov, isoscore_star_from_cov, log_frequency_correlation, masked_correlations,
    oracle_fractions_of_spectrum, participation_ratio_from_cov, random_subspace_traces,
)
from .protocol import Protocol
from .seeding import derive_seed
from .stats import (
    EXACT_TEST, adjust_pvalues, analyze_energy, analyze_metric_vs_controls, expected_control_energy,
    min_controls_needed, resolution_warning, sequence_bootstrap_columns,
)

RESULT_COLUMNS = [
    "model", "objective", "checkpoint", "step", "phase", "layer", "site", "rank", "dim", "proxy", "control",
    "metric", "estimate", "control_mean", "control_sd", "ci_low", "ci_high", "ci_method", "p_value",
    "p_adjusted", "p_test", "p_value_paper", "effect_size", "effect_size_kind", "se", "n_controls",
    "n_sequences", "n_clusters", "n_tokens", "status", "note",
]
FREQUENCY_COLUMNS = [
    "model", "objective", "checkpoint", "step", "phase", "layer", "site", "dim", "n_sequences", "n_tokens", "proxy",
    "rank", "control", "bucket", "metric", "estimate", "ci_low", "ci_high", "ci_method", "p_value", "note",
]
ENERGY_METRICS = ("energy_fraction", "energy_ratio", "log2_energy_ratio", "z", "hedges_g", "anisotropy_capture")
DESCRIPTIVE_METRICS = ("isoscore", "isoscore_star", "participation_ratio", "effective_rank", "mean_cosine")


def _unit_columns(artifact: UnitArtifact) -> dict[str, Any]:
    key = artifact.key
    return {"model": key.model, "objective": key.objective, "checkpoint": key.checkpoint, "step": key.step,
            "phase": key.phase, "layer": key.layer, "site": key.site, "dim": artifact.dim,
            "n_sequences": int(artifact.n_tokens.shape[0]), "n_tokens": int(artifact.n_tokens.sum())}


def _cov(moments: dict) -> torch.Tensor:
    count = moments["count"]
    total = torch.as_tensor(moments["sum"], dtype=torch.float64)
    outer = torch.as_tensor(moments["outer"], dtype=torch.float64)
    mean = total / count
    return (outer - count * torch.outer(mean, mean)) / (count - 1)


def _mean_cosine(unit_sum: np.ndarray, count: int) -> float:
    """Mean pairwise cosine over distinct pairs from Σ u_i: (‖Σu‖² − N) / (N(N − 1))."""
    return float((np.dot(unit_sum, unit_sum) - count) / (count * (count - 1)))


def descriptive_rows(artifact: UnitArtifact, c0: str = "scaled_identity", zeta: float = 0.1) -> list[dict]:
    """IsoScore, IsoScore* (protocol C0 and zeta), participation ratio, effective rank and mean
    cosine of the test-split gradients and activations (conventions in `anistat.geometry`)."""
    rows = []
    for cloud, moments, unit_sum in (("gradient", artifact.gradient_moments, artifact.gradient_unit_sum),
                                     ("activation", artifact.activation_moments, artifact.activation_unit_sum)):
        cov = _cov(moments)
        values = {
            "isoscore": isoscore_from_cov(cov),
            "isoscore_star": isoscore_star_from_cov(cov, c0, zeta),
            "participation_ratio": participation_ratio_from_cov(cov),
            "effective_rank": effective_rank_from_cov(cov),
            "mean_cosine": _mean_cosine(unit_sum, moments["count"]),
        }
        for metric, value in values.items():
            rows.append({"proxy": "none", "control": "none", "rank": None, "metric": f"{cloud}_{metric}",
                         "estimate": float(value), "ci_method": "none", "n_controls": 0, "note": ""})
    return rows


@dataclass(frozen=True)
class NullSettings:
    """Monte-Carlo sizes used for every unit of one analysis (recorded in results and manifest).

    ``n_null_draws``: Haar draws of the exact tests; ``n_permutations``: sign vectors of the
    sign-flip test; ``n_tests``: the largest multiplicity family they were sized for."""

    n_null_draws: int
    n_permutations: int
    n_tests: int


def planned_tests(artifacts: list[UnitArtifact], protocol: Protocol) -> int:
    """Size of the largest multiplicity family: per unit and (proxy, rank), the exact energy test
    and the exact ΔIsoScore* test, plus the sign-flip tests (one for the closed-form kinds
    together, one per projected kind)."""
    per_model: dict[str, int] = {}
    for artifact in artifacts:
        groups = set(_proxy_groups(artifact))
        kinds = set(protocol.controls.kinds)
        projected = kinds & set(protocol.projected_control_kinds)
        sign_flips = len(projected) + (1 if kinds - projected else 0)
        per_model[artifact.key.model] = per_model.get(artifact.key.model, 0) + len(groups) * (2 + sign_flips)
    if not per_model:
        return 1
    return max(per_model.values()) if protocol.stats.family == "model" else sum(per_model.values())


def null_settings(artifacts: list[UnitArtifact], protocol: Protocol) -> NullSettings:
    """How many Haar draws and sign vectors: enough that the Monte-Carlo floor 1/(n+1) can pass
    the corrected threshold of the largest family (`stats.n_null_draws: auto`), so the floor
    never decides a result; an explicit `n_null_draws` is used as given."""
    stats = protocol.stats
    n_tests = planned_tests(artifacts, protocol)
    needed = min_controls_needed(stats.alpha, n_tests, stats.multiplicity)
    draws = max(9999, needed) if stats.n_null_draws == "auto" else int(stats.n_null_draws)
    return NullSettings(n_null_draws=draws, n_permutations=max(stats.n_permutations, needed), n_tests=n_tests)


def _floor_note(p_value: float, n: int) -> str:
    return f"p at its Monte-Carlo floor 1/({n}+1)" if np.isfinite(p_value) and p_value <= 1.0 / (n + 1) else ""


def unit_rows(artifact: UnitArtifact, protocol: Protocol, nulls: NullSettings | None = None
              ) -> tuple[list[dict], list[str]]:
    """All rows of one unit, plus any null-check warnings.

    Per (proxy, rank): the exact Haar Monte-Carlo tests of the energy fraction and of
    ΔIsoScore* (draws from the unit's gradient second moment / covariance, shared by every
    control kind), then per control kind the effect sizes and CIs of `analyze_energy`."""
    stats = protocol.stats
    nulls = nulls or null_settings([artifact], protocol)
    base = _unit_columns(artifact)
    rows: list[dict] = []
    notes: list[str] = []
    groups = _proxy_groups(artifact)
    if artifact.status != "ok":
        for proxy, rank in groups:
            for control in protocol.controls.kinds:
                for metric in ENERGY_METRICS + ("delta_isoscore_star",):
                    rows.append({**base, "proxy": proxy, "rank": rank, "control": control, "metric": metric,
                                 "status": "failed", "note": artifact.note})
        return rows, notes
    dim, unit_id = artifact.dim, artifact.key.id
    total = artifact.total_energy.sum(axis=1)
    energy = artifact.energy.sum(axis=1)  # (S, n_bases): frequency buckets summed
    documents = artifact.sequence_documents if stats.resampling_unit == "document" else None
    if documents is not None and len(np.unique(documents)) < 2:
        documents = None
        notes.append(f"{unit_id}: all test sequences come from one document; sequences resampled instead")
    second_moment = SpectralFrame(artifact.gradient_moments["outer"])
    covariance = SpectralFrame(_cov(artifact.gradient_moments))
    ranks = sorted({rank for _, rank in groups})
    n_null = nulls.n_null_draws
    delta_ok = dim - max(ranks) >= 2
    # one set of Haar draws serves the energy test (second moment) and the ΔIsoScore* test
    # (covariance): each frame reads them in its own eigen-coordinates (see random_subspace_traces)
    energy_traces, delta_traces = random_subspace_traces(
        [second_moment, covariance], ranks, n_null, derive_seed(protocol.seed, unit_id, "haar-null"))
    haar_energy = {rank: second_moment.energy_fractions(traces) for rank, traces in energy_traces.items()}
    haar_delta = ({rank: covariance.delta_isoscore_star(traces, rank, stats.isoscore_c0, stats.isoscore_zeta)
                   for rank, traces in delta_traces.items()} if delta_ok else {})
    oracle = oracle_fractions_of_spectrum(second_moment.eigenvalues, ranks)  # the null's own decomposition
    for rank, value in oracle.items():
        rows.append({**base, "proxy": "oracle", "rank": rank, "control": "none", "metric": "oracle_fraction",
                     "estimate": value, "ci_method": "none", "n_controls": 0, "status": "ok", "note": ""})
    projected = set(protocol.projected_control_kinds)
    for proxy, rank in groups:
        basis = artifact.proxy_bases[(proxy, rank)]
        proxy_energy = energy[:, artifact.columns_for(proxy, rank, "proxy")[0]]
        observed = float(second_moment.energy_fractions(second_moment.traces_of(basis))[0])
        observed_delta = (float(covariance.delta_isoscore_star(covariance.traces_of(basis), rank, stats.isoscore_c0,
                                                               stats.isoscore_zeta)[0]) if delta_ok else np.nan)
        for control in protocol.controls.kinds:
            # closed-form kinds share their resampling stream: their per-unit contributions are
            # proportional (see anistat.stats.energy), so g, its CI and the sign-flip test coincide
            stream = control if control in projected else "expected"
            seed = derive_seed(protocol.seed, unit_id, proxy, rank, stream, "analysis")
            if control in projected:
                columns = artifact.columns_for(proxy, rank, control)
                reference, reference_kind = energy[:, columns].mean(axis=1), "drawn"
                control_fractions = energy[:, columns].sum(axis=0) / total.sum()
                control_delta = artifact.delta_isoscore_star[columns]
            elif control == "haar":
                reference, reference_kind = expected_control_energy("haar", proxy_energy, total, rank, dim), "expected"
                control_fractions, control_delta = haar_energy[rank], haar_delta.get(rank, np.array([np.nan]))
            else:  # normal: uniform in the proxy's complement, drawn from the moments
                reference, reference_kind = expected_control_energy("normal", proxy_energy, total, rank, dim), "expected"
                n_normal = max(protocol.controls.n, 999)
                energy_normal, delta_normal = random_subspace_traces(
                    [second_moment, covariance], [rank], n_normal,
                    derive_seed(protocol.seed, unit_id, proxy, rank, "normal-draws"), exclude=basis)
                control_fractions = second_moment.energy_fractions(energy_normal[rank])
                control_delta = (covariance.delta_isoscore_star(delta_normal[rank], rank, stats.isoscore_c0,
                                                                stats.isoscore_zeta)
                                 if delta_ok else np.array([np.nan]))
            analysis = analyze_energy(
                proxy_energy, total, reference, rank=rank, dim=dim, null_fractions=haar_energy[rank],
                control_fractions=control_fractions, observed_fraction=observed,
                n_paper_controls=protocol.controls.n, group_ids=documents,
                oracle_fraction=oracle[rank], reference=reference_kind, control_kind=control,
                n_bootstrap=stats.n_bootstrap, ci_level=stats.ci_level, ci_method=stats.ci_method,
                n_permutations=nulls.n_permutations, alternative=stats.alternative, seed=seed,
            )
            group = {**base, "proxy": proxy, "rank": rank, "control": control, "status": "ok"}
            for record in analysis.to_records():
                test = ((unit_id, proxy, rank, EXACT_TEST) if record["p_test"] == EXACT_TEST
                        else (unit_id, proxy, rank, stream, record["p_test"]))
                n_draws = n_null if record["p_test"] == EXACT_TEST else analysis.sign_flip.n_permutations
                record["note"] = _join_notes(record["note"], _floor_note(record["p_value"], n_draws))
                rows.append({**group, **record, "_test": test})
            comparison = analyze_metric_vs_controls(observed_delta, control_delta, stats.alternative,
                                                    null_values=haar_delta.get(rank, np.array([np.nan])),
                                                    n_paper_controls=protocol.controls.n)
            rows.append({**group, "metric": "delta_isoscore_star", "estimate": comparison.observed,
                         "control_mean": comparison.control_mean, "control_sd": comparison.control_sd,
                         "ci_method": "none", "p_value": comparison.p_value, "p_test": EXACT_TEST,
                         "p_value_paper": comparison.p_value_paper, "effect_size": comparison.z,
                         "effect_size_kind": "z", "n_controls": comparison.n_controls,
                         "n_sequences": analysis.n_sequences, "n_clusters": analysis.n_clusters,
                         "note": _join_notes(f"IsoScore* C0={stats.isoscore_c0}, zeta={stats.isoscore_zeta}; "
                                             f"test against {n_null} Haar subspaces",
                                             _floor_note(comparison.p_value, n_null)),
                         "_test": (unit_id, proxy, rank, "haar_monte_carlo_delta_isoscore_star")})
        if "haar" in protocol.controls.kinds and "haar" in projected:
            columns = artifact.columns_for(proxy, rank, "haar")
            if len(columns) >= 2:
                check = haar_null_check(energy[:, columns].sum(axis=0) / total.sum(), rank, dim,
                                        torch.as_tensor(artifact.gradient_moments["outer"]))
                if not check.ok:
                    notes.append(f"{unit_id} {proxy} rank {rank}: Haar null check failed: {check.message}")
    for row in descriptive_rows(artifact, stats.isoscore_c0, stats.isoscore_zeta):
        rows.append({**base, **row, "status": "ok"})
    return rows, notes


def _join_notes(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _proxy_groups(artifact: UnitArtifact) -> list[tuple[str, int]]:
    """(proxy method, rank) pairs of a unit, in collection order."""
    seen: list[tuple[str, int]] = []
    for basis in artifact.bases:
        if basis.control == "proxy" and (basis.proxy, basis.rank) not in seen:
            seen.append((basis.proxy, basis.rank))
    return seen


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
    adjusted: dict[tuple, float] = {}
    for family in test_families(results, protocol):
        values = adjust_pvalues(family["p_value"].to_numpy(dtype=float), stats.multiplicity)
        adjusted.update(zip(family["_test"], values))
    results["p_adjusted"] = [adjusted.get(test, np.nan) if isinstance(test, tuple) else np.nan
                             for test in results["_test"]]
    return results


def multiplicity_warning(results: pd.DataFrame, protocol: Protocol, nulls: NullSettings) -> str | None:
    """The resolution guard: can the exact Monte-Carlo tests reach the corrected threshold of the
    largest family (wording right for each correction, see `anistat.stats.resolution_warning`)?"""
    stats = protocol.stats
    has_test = any(isinstance(t, tuple) and t[-1] == EXACT_TEST for t in results["_test"].dropna())
    if not has_test:
        return None
    n_tests = max(len(family) for family in test_families(results, protocol))
    return resolution_warning(nulls.n_null_draws, stats.alpha, n_tests, stats.multiplicity,
                              what="Haar null draws")


def analyze_units(artifacts: list[UnitArtifact], protocol: Protocol) -> pd.DataFrame:
    """The tidy results table (sorted, typed, deterministic) for a list of units.

    `results.attrs["warnings"]` lists run warnings; `results.attrs["null_settings"]` the
    Monte-Carlo sizes used (`NullSettings`)."""
    nulls = null_settings(artifacts, protocol)
    rows: list[dict] = []
    notes: list[str] = []
    for artifact in artifacts:
        unit_rows_, unit_notes = unit_rows(artifact, protocol, nulls)
        rows.extend(unit_rows_)
        notes.extend(unit_notes)
    results = pd.DataFrame(rows)
    for column in RESULT_COLUMNS + ["_test"]:
        if column not in results:
            results[column] = np.nan
    results = adjust(results, protocol)
    guard = multiplicity_warning(results, protocol, nulls)
    results = results[RESULT_COLUMNS].copy()
    for column in ("step", "rank", "layer", "dim", "n_controls", "n_sequences", "n_clusters", "n_tokens"):
        results[column] = pd.array(results[column], dtype="Int64")
    for column in ("ci_method", "note", "status", "p_test", "effect_size_kind"):
        # object first: a column that is all NaN (every unit failed) is float64
        results[column] = results[column].astype(object).fillna("").astype(str)
    results = results.reset_index(drop=True)
    results.attrs["warnings"] = ([guard] if guard else []) + notes
    results.attrs["null_settings"] = asdict(nulls)  # plain data: attrs travel into parquet metadata
    return results


# ----------------------------------------------------------------------------------------------
# frequency analysis
# ----------------------------------------------------------------------------------------------
def frequency_rows(artifacts: list[UnitArtifact], token_counts: dict[str, np.ndarray], protocol: Protocol) -> pd.DataFrame:
    """Per-frequency-bucket energy ratios and the log-frequency vs centroid-distance correlation.

    Bucket b holds the token types of the b-th quantile of corpus counts (0 = rarest). The
    ratio in a bucket is the proxy's energy over the expected control energy of the tokens in
    that bucket (closed form, or the drawn controls' mean for projected kinds); its CI is the
    same document / sequence bootstrap as the overall ratio, and its p-value the sign-flip test
    of per-unit contributions (the exact Haar test would need per-bucket second moments).

    Correlation: over token types seen at least twice in the test split (those with per-type
    statistics: past `data.type_statistics_memory_mb` the collector keeps the most frequent,
    and the rows' note says how many), Spearman and Pearson
    correlation of log corpus count with the type's Bessel-corrected RMS distance to its
    activation centroid, sqrt(Σ_i ‖a_i − c_t‖² / (n_t − 1)) — a root-mean-square form is
    computable from streamed sums (Σa, Σ‖a‖², count per type), so no activation matrix is kept,
    and the n − 1 divisor keeps a type's count from biasing it. Its CI is a sequence bootstrap
    (see `_correlation_rows`); the p-value is scipy's, over types. Two more definitions of a
    type's "distance" sit beside it, each named: `*_logfreq_mean_distance` (the type's mean
    activation from the global mean) and `*_logfreq_mean_norm` (the norm of that mean), see
    `geometry.type_mean_geometry`. For MLM, positions whose input is [MASK] or a random
    replacement are left out of every type statistic.
    """
    stats = protocol.stats
    rows = []
    for artifact in artifacts:
        if artifact.status != "ok":
            continue
        base = _unit_columns(artifact)
        documents = artifact.sequence_documents if stats.resampling_unit == "document" else None
        if documents is not None and len(np.unique(documents)) < 2:
            documents = None
        projected = set(protocol.projected_control_kinds)
        # the energy fraction of Haar subspaces is k/d in expectation: a placeholder null (the
        # per-bucket rows report the ratio's CI and the sign-flip test, not the Haar test,
        # which needs per-bucket second moments)
        for bucket in range(artifact.total_energy.shape[1]):
            total = artifact.total_energy[:, bucket]
            if not total.sum() > 0:
                continue
            energy = artifact.energy[:, bucket]
            for proxy, rank in _proxy_groups(artifact):
                proxy_energy = energy[:, artifact.columns_for(proxy, rank, "proxy")[0]]
                for control in protocol.controls.kinds:
                    if control in projected:
                        reference = energy[:, artifact.columns_for(proxy, rank, control)].mean(axis=1)
                    else:
                        reference = expected_control_energy(control, proxy_energy, total, rank, artifact.dim)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        analysis = analyze_energy(
                            proxy_energy, total, reference, rank=rank, dim=artifact.dim,
                            null_fractions=np.array([rank / artifact.dim]), group_ids=documents,
                            reference="drawn" if control in projected else "expected", control_kind=control,
                            n_bootstrap=stats.n_bootstrap, ci_level=stats.ci_level, ci_method="percentile",
                            n_permutations=stats.n_permutations, alternative=stats.alternative,
                            seed=derive_seed(protocol.seed, artifact.key.id, proxy, rank, control, bucket, "frequency"),
                        )
                    ratio = analysis["energy_ratio"]
                    rows.append({**base, "proxy": proxy, "rank": rank, "control": control, "bucket": str(bucket),
                                 "metric": "energy_ratio", "estimate": ratio.estimate, "ci_low": ratio.ci_low,
                                 "ci_high": ratio.ci_high, "ci_method": ratio.ci_method,
                                 "p_value": analysis.sign_flip.p_value,
                                 "note": _join_notes(ratio.note, "p: sign-flip test of per-unit contributions")})
        counts = token_counts.get(artifact.key.model)
        if counts is not None:
            rows.extend({**base, "proxy": "none", "rank": None, "control": "none", "bucket": "all", **row}
                        for row in _correlation_rows(artifact, counts, protocol))
    frame = pd.DataFrame(rows, columns=FREQUENCY_COLUMNS)
    if not frame.empty:
        frame["rank"] = pd.array(frame["rank"], dtype="Int64")
        frame["step"] = pd.array(frame["step"], dtype="Int64")
    return frame


def _correlation_rows(artifact: UnitArtifact, corpus_counts: np.ndarray, protocol: Protocol) -> list[dict]:
    """`spearman_logfreq_distance` and `pearson_logfreq_distance` of one unit, with CIs.

    Types: seen at least twice in the test split (and kept by the collector's type budget, most
    frequent first) and at least once in the corpus. The CI
    resamples test sequences (the sampling unit): every resample recomputes each type's
    centroid and RMS distance from the per-(sequence, type) sums (`ResampledCentroidDistance`),
    drops types that cannot pair (see `ResampledCentroidDistance`), and recomputes both
    correlations; log corpus counts are fixed.

    Interval: the *basic* bootstrap interval (the percentile interval reflected about the
    estimate), or percentile when the protocol asks for percentile. Why not BCa or studentized:
    every type's distance is a ratio estimated from the few sequences holding the type, so the
    correlation's bootstrap distribution sits off-centre (often 1–2.5 SE on real models), which
    is the estimate's own bias mirrored; BCa would then need quantiles beyond its resamples,
    and there is no standard error per resample for a studentized interval. In the calibration
    of `benchmarks/bench_frequency.py` the basic interval covers best at 30–100 sequences (see
    `benchmarks/README.md`). Endpoints are clipped to [−1, 1]."""
    vocab = artifact.type_count.shape[0]
    counts = np.zeros(vocab)
    counts[: min(vocab, corpus_counts.shape[0])] = corpus_counts[:vocab]
    present = (artifact.type_count >= 2) & np.isfinite(artifact.type_rms_distance) & (counts > 0)
    kept_note = artifact.extra.get("type_statistics_note", "")
    if present.sum() < 3:
        if not kept_note:
            return []
        # the budget, not the data, left too few types: say so rather than drop the rows silently
        return [{"metric": metric, "estimate": math.nan, "p_value": math.nan, "ci_low": math.nan,
                 "ci_high": math.nan, "ci_method": "none",
                 "note": f"{int(present.sum())} token types with per-type statistics, too few for a correlation; "
                         f"{kept_note}"}
                for metric in ("spearman_logfreq_distance", "pearson_logfreq_distance")]
    types = np.flatnonzero(present)
    correlation = log_frequency_correlation(counts[types], artifact.type_rms_distance[types])
    estimates = (("spearman_logfreq_distance", correlation.spearman_rho, correlation.spearman_p),
                 ("pearson_logfreq_distance", correlation.pearson_r, correlation.pearson_p))
    stats = protocol.stats
    intervals = [None, None]
    note = artifact.pair_note
    if artifact.pair_sums is not None:
        distance = ResampledCentroidDistance(artifact.pair_sums, types)
        log_count = np.log(counts[types])
        method = "percentile" if stats.ci_method == "percentile" else "basic"
        intervals = sequence_bootstrap_columns(
            lambda weights: np.column_stack(masked_correlations(log_count, distance(weights))),
            artifact.pair_sums.n_sequences, n_resamples=stats.n_bootstrap, ci_level=stats.ci_level, method=method,
            seed=derive_seed(protocol.seed, artifact.key.id, "logfreq_distance"),
        )
    rows = []
    spread = "distance = RMS spread of the type's activations around its own centroid"
    for (metric, value, p_value), interval in zip(estimates, intervals):
        parts = [f"{correlation.n_types} token types", spread, note if interval is None else interval.note, kept_note]
        if interval is not None and interval.bias_in_se is not None and abs(interval.bias_in_se) > 1:
            # a rank correlation over types, each estimated from few sequences, is not a smooth
            # function of the sequences: say so when its resamples are visibly off-centre
            parts.append(f"bootstrap mean {interval.bias_in_se:+.1f} SE from the estimate")
        rows.append({"metric": metric, "estimate": float(value), "p_value": float(p_value),
                     "ci_low": math.nan if interval is None else max(-1.0, interval.ci_low),
                     "ci_high": math.nan if interval is None else min(1.0, interval.ci_high),
                     "ci_method": "none" if interval is None else interval.method,
                     "note": "; ".join(part for part in parts if part)})
    rows.extend(_mean_geometry_rows(artifact, counts, types, protocol))
    return rows


def _mean_geometry_rows(artifact: UnitArtifact, counts: np.ndarray, types: np.ndarray,
                        protocol: Protocol) -> list[dict]:
    """The other two frequency definitions (geometry.type_mean_geometry) over the same types:
    `*_logfreq_mean_distance` (distance of the type's centroid from the global mean) and
    `*_logfreq_mean_norm` (norm of the type's centroid), both debiased for the centroid's
    sampling noise; scipy's p-value over types, and the same sequence bootstrap and interval
    as `_correlation_rows` (every resample recomputes centroids and global mean,
    `ResampledTypeMeans`)."""
    if artifact.type_mean_distance is None or artifact.type_mean_norm is None:
        return []  # a unit from an anistat without these statistics
    definitions = (("mean_distance", artifact.type_mean_distance, "distance of the type's mean activation from the "
                    "global mean (debiased)"),
                   ("mean_norm", artifact.type_mean_norm, "norm of the type's mean activation (debiased)"))
    stats = protocol.stats
    intervals: list = [None] * 4
    if artifact.pair_sums is not None:
        means = ResampledTypeMeans(artifact.pair_sums, types)
        log_count = np.log(counts[types])

        def statistic(weights):
            distance, norm = means(weights)
            return np.column_stack(masked_correlations(log_count, distance) + masked_correlations(log_count, norm))

        intervals = sequence_bootstrap_columns(
            statistic, artifact.pair_sums.n_sequences, n_resamples=stats.n_bootstrap, ci_level=stats.ci_level,
            method="percentile" if stats.ci_method == "percentile" else "basic",
            seed=derive_seed(protocol.seed, artifact.key.id, "logfreq_mean_geometry"))
    rows = []
    for index, (name, values, meaning) in enumerate(definitions):
        correlation = log_frequency_correlation(counts[types], values[types])
        for offset, (kind, value, p_value) in enumerate((("spearman", correlation.spearman_rho, correlation.spearman_p),
                                                        ("pearson", correlation.pearson_r, correlation.pearson_p))):
            interval = intervals[2 * index + offset]
            parts = [f"{correlation.n_types} token types", meaning,
                     artifact.pair_note if interval is None else interval.note,
                     artifact.extra.get("type_statistics_note", "")]
            rows.append({"metric": f"{kind}_logfreq_{name}", "estimate": float(value), "p_value": float(p_value),
                         "ci_low": math.nan if interval is None else max(-1.0, interval.ci_low),
                         "ci_high": math.nan if interval is None else min(1.0, interval.ci_high),
                         "ci_method": "none" if interval is None else interval.method,
                         "note": "; ".join(part for part in parts if part)})
    return rows
