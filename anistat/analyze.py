"""Analysis: collection artifacts → the tidy results table.

Pure functions over `UnitArtifact`s (no model is touched), so changing alpha, the number of
bootstrap resamples or the multiplicity method re-runs only this stage.

One row per unit × rank × proxy × control kind × metric (columns in `RESULT_COLUMNS`):

* energy metrics from `anistat.stats.analyze_energy` — `energy_fraction`, `energy_ratio`,
  `log2_energy_ratio`, `z`, `anisotropy_capture` share the Monte-Carlo test of the proxy
  against the control draw; `hedges_g` carries the paired sign-flip test over sequences;
* `delta_isoscore_star` (per basis, from the gradient moments) against the same controls;
* `oracle_fraction` per unit and rank (proxy `oracle`, control `none`, no test);
* descriptive metrics per unit (proxy and control `none`): IsoScore, IsoScore*, participation
  ratio, effective rank and mean cosine of the gradients (`gradient_*`) and of the activations
  (`activation_*`).

Multiplicity: each distinct test enters the family once — the Monte-Carlo energy test of a
basis, its sign-flip test and its ΔIsoScore* test — and the metrics sharing a test share its
adjusted p-value. The family is the whole run or one model (protocol `stats.family`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
import torch

from .collect import UnitArtifact
from .geometry import (
    ResampledCentroidDistance, effective_rank_from_cov, haar_null_check, isoscore_from_cov, isoscore_star_from_cov,
    log_frequency_correlation, masked_correlations, participation_ratio_from_cov,
)
from .geometry import ResampledTypeMeans
from .protocol import Protocol
from .seeding import derive_seed
from .stats import (
    adjust_pvalues, analyze_energy, analyze_metric_vs_controls, resolution_warning, sequence_bootstrap_columns,
)

RESULT_COLUMNS = [
    "model", "objective", "checkpoint", "step", "phase", "layer", "site", "rank", "dim", "proxy", "control",
    "metric", "estimate", "control_mean", "control_sd", "ci_low", "ci_high", "ci_method", "p_value",
    "p_adjusted", "effect_size", "n_controls", "n_sequences", "n_tokens", "status", "note",
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


def _basis_groups(artifact: UnitArtifact) -> list[tuple[str, int, str]]:
    seen = []
    for basis in artifact.bases:
        if basis.control != "proxy" and (basis.proxy, basis.rank, basis.control) not in seen:
            seen.append((basis.proxy, basis.rank, basis.control))
    return seen


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


def unit_rows(artifact: UnitArtifact, protocol: Protocol) -> tuple[list[dict], list[str]]:
    """All rows of one unit, plus any null-check warnings."""
    stats = protocol.stats
    base = _unit_columns(artifact)
    rows: list[dict] = []
    notes: list[str] = []
    if artifact.status != "ok":
        for proxy, rank, control in _basis_groups(artifact):
            for metric in ENERGY_METRICS + ("delta_isoscore_star",):
                rows.append({**base, "proxy": proxy, "rank": rank, "control": control, "metric": metric,
                             "status": "failed", "note": artifact.note})
        return rows, notes
    total = artifact.total_energy.sum(axis=1)
    energy = artifact.energy.sum(axis=1)  # (S, n_bases): frequency buckets summed
    second_moment = torch.as_tensor(artifact.gradient_moments["outer"])
    for rank, oracle in sorted(artifact.oracle_fraction.items()):
        rows.append({**base, "proxy": "oracle", "rank": rank, "control": "none", "metric": "oracle_fraction",
                     "estimate": oracle, "ci_method": "none", "n_controls": 0, "status": "ok", "note": ""})
    for proxy, rank, control in _basis_groups(artifact):
        proxy_column = artifact.columns_for(proxy, rank, "proxy")[0]
        control_columns = artifact.columns_for(proxy, rank, control)
        seed = derive_seed(protocol.seed, artifact.key.id, proxy, rank, control, "analysis")
        analysis = analyze_energy(
            energy[:, proxy_column], energy[:, control_columns], total, rank=rank, dim=artifact.dim,
            oracle_fraction=artifact.oracle_fraction.get(rank), n_bootstrap=stats.n_bootstrap,
            ci_level=stats.ci_level, ci_method=stats.ci_method, n_permutations=stats.n_permutations,
            alternative=stats.alternative, seed=seed,
        )
        group = {**base, "proxy": proxy, "rank": rank, "control": control, "status": "ok"}
        for record in analysis.to_records():
            kind = record.pop("p_value_kind")
            record["note"] = record["note"] or ""
            rows.append({**group, **record, "_test": (artifact.key.id, proxy, rank, control, kind)})
        delta = artifact.delta_isoscore_star
        comparison = analyze_metric_vs_controls(delta[proxy_column], delta[control_columns], stats.alternative)
        rows.append({**group, "metric": "delta_isoscore_star", "estimate": comparison.observed,
                     "control_mean": comparison.control_mean, "control_sd": comparison.control_sd,
                     "ci_method": "none", "p_value": comparison.p_value, "effect_size": comparison.z,
                     "n_controls": comparison.n_controls,
                     "note": f"IsoScore* C0={stats.isoscore_c0}, zeta={stats.isoscore_zeta}",
                     "_test": (artifact.key.id, proxy, rank, control, "delta_isoscore_star")})
        if control == "haar" and len(control_columns) >= 2:
            check = haar_null_check(analysis.control_fractions, rank, artifact.dim, second_moment)
            if not check.ok:
                notes.append(f"{artifact.key.id} {proxy} rank {rank}: Haar null check failed: {check.message}")
    for row in descriptive_rows(artifact, stats.isoscore_c0, stats.isoscore_zeta):
        rows.append({**base, **row, "status": "ok"})
    return rows, notes


def test_families(results: pd.DataFrame, protocol: Protocol) -> list[pd.DataFrame]:
    """The multiplicity families: each distinct test once, grouped by the protocol's `stats.family`
    (the whole run, or one model). Shared by the adjustment and the resolution guard."""
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


def multiplicity_warning(results: pd.DataFrame, protocol: Protocol) -> str | None:
    """The resolution guard: can the Monte-Carlo tests reach the corrected threshold of the
    largest family at all?"""
    stats = protocol.stats
    has_mc_test = any(isinstance(t, tuple) and t[-1] == "monte_carlo" for t in results["_test"].dropna())
    if not has_mc_test:
        return None
    if stats.multiplicity == "none":
        return resolution_warning(protocol.controls.n, stats.alpha, 1, "holm")
    n_tests = max(len(family) for family in test_families(results, protocol))
    return resolution_warning(protocol.controls.n, stats.alpha, n_tests, stats.multiplicity)


def analyze_units(artifacts: list[UnitArtifact], protocol: Protocol) -> pd.DataFrame:
    """The tidy results table (sorted, typed, deterministic) for a list of units."""
    rows: list[dict] = []
    notes: list[str] = []
    for artifact in artifacts:
        unit_rows_, unit_notes = unit_rows(artifact, protocol)
        rows.extend(unit_rows_)
        notes.extend(unit_notes)
    results = pd.DataFrame(rows)
    for column in RESULT_COLUMNS + ["_test"]:
        if column not in results:
            results[column] = np.nan
    results = adjust(results, protocol)
    guard = multiplicity_warning(results, protocol)
    results = results[RESULT_COLUMNS].copy()
    for column in ("step", "rank", "layer", "dim", "n_controls", "n_sequences", "n_tokens"):
        results[column] = pd.array(results[column], dtype="Int64")
    for column in ("ci_method", "note", "status"):
        # object first: a column that is all NaN (every unit failed) is float64
        results[column] = results[column].astype(object).fillna("").astype(str)
    results = results.reset_index(drop=True)
    results.attrs["warnings"] = ([guard] if guard else []) + notes
    return results


# ----------------------------------------------------------------------------------------------
# frequency analysis
# ----------------------------------------------------------------------------------------------
def frequency_rows(artifacts: list[UnitArtifact], token_counts: dict[str, np.ndarray], protocol: Protocol) -> pd.DataFrame:
    """Per-frequency-bucket energy ratios and the log-frequency vs centroid-distance correlation.

    Bucket b holds the token types of the b-th quantile of corpus counts (0 = rarest). The
    ratio in a bucket is E_b(U) / mean_j E_b(Q_j) with E_b the energy fraction of the tokens in
    that bucket; its CI is the same sequence bootstrap as the overall ratio.

    Correlation: over token types seen at least twice in the test split, Spearman and Pearson
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
        for bucket in range(artifact.total_energy.shape[1]):
            total = artifact.total_energy[:, bucket]
            if not total.sum() > 0:
                continue
            for proxy, rank, control in _basis_groups(artifact):
                proxy_column = artifact.columns_for(proxy, rank, "proxy")[0]
                control_columns = artifact.columns_for(proxy, rank, control)
                energy = artifact.energy[:, bucket]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    analysis = analyze_energy(
                        energy[:, proxy_column], energy[:, control_columns], total, rank=rank, dim=artifact.dim,
                        n_bootstrap=stats.n_bootstrap, ci_level=stats.ci_level, ci_method="percentile",
                        n_permutations=10, alternative=stats.alternative,
                        seed=derive_seed(protocol.seed, artifact.key.id, proxy, rank, control, bucket, "frequency"),
                    )
                ratio = analysis["energy_ratio"]
                rows.append({**base, "proxy": proxy, "rank": rank, "control": control, "bucket": str(bucket),
                             "metric": "energy_ratio", "estimate": ratio.estimate, "ci_low": ratio.ci_low,
                             "ci_high": ratio.ci_high, "ci_method": ratio.ci_method, "p_value": analysis.mc_p_value,
                             "note": ratio.note or ""})
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

    Types: seen at least twice in the test split and at least once in the corpus. The CI
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
    if present.sum() < 3:
        return []
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
        parts = [f"{correlation.n_types} token types", spread, note if interval is None else interval.note]
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
                     artifact.pair_note if interval is None else interval.note]
            rows.append({"metric": f"{kind}_logfreq_{name}", "estimate": float(value), "p_value": float(p_value),
                         "ci_low": math.nan if interval is None else max(-1.0, interval.ci_low),
                         "ci_high": math.nan if interval is None else min(1.0, interval.ci_high),
                         "ci_method": "none" if interval is None else interval.method,
                         "note": "; ".join(part for part in parts if part)})
    return rows
