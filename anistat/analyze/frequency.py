"""The frequency table: per-frequency-bucket energy ratios and the log-frequency vs
centroid-distance correlations (``frequency.csv``; columns in :data:`FREQUENCY_COLUMNS`)."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from .. import _columns
from .. import vocabulary as vocab
from ..collect import UnitArtifact
from ..geometry import ResampledTypeMeans, log_frequency_correlation, masked_correlations_many
from ..protocol import Protocol
from ..seeding import derive_seed
from ..stats import ExactTestResult, analyze_energy, expected_control_energy, sequence_bootstrap_columns
from ..stats.fallbacks import NO_EXACT_TEST
from .nulls import ExactNulls, UnitSpectrum
from .units import exact_note, join_notes, proxy_groups, unit_columns

FREQUENCY_COLUMNS = list(_columns.FREQUENCY_COLUMNS)  # a list, like analyze.RESULT_COLUMNS


def bucket_id(unit_id: str, bucket: int) -> str:
    """The exact-test key of one frequency bucket of a unit."""
    return f"{unit_id}#bucket{bucket}"


def bucket_matrices(artifact: UnitArtifact) -> list[torch.Tensor]:
    """Each frequency bucket's gradient second moment ``M_b``, symmetrised, float64 ([] for a
    failed unit or one without per-bucket moments)."""
    outers = artifact.gradient_moments.get("bucket_outer")
    if artifact.status != "ok" or outers is None:
        return []
    return [torch.from_numpy(0.5 * (outer + outer.T)) for outer in np.asarray(outers, dtype=np.float64)]


def bucket_spectra(artifact: UnitArtifact, eigenvalues: list[np.ndarray] | None = None) -> list[UnitSpectrum]:
    """One energy-only :class:`UnitSpectrum` per frequency bucket of a unit: the eigenvalues of the
    bucket's gradient second moment ``M_b`` and each proxy's ``tr(UᵀM_bU)/tr M_b`` from that same
    (stored) matrix, so the exact test reads its observed value and its null off one matrix.
    ``eigenvalues``: those of :func:`bucket_matrices`, in order, when computed on the run's
    device (else here). None for units without per-bucket moments (collected by an older anistat)."""
    spectra = []
    for bucket, matrix in enumerate(bucket_matrices(artifact)):
        trace = float(torch.trace(matrix))
        if not trace > 0:
            continue
        observed = {}
        for proxy, rank in proxy_groups(artifact):
            basis = torch.as_tensor(artifact.proxy_bases[(proxy, rank)], dtype=torch.float64)
            observed[(proxy, rank)] = float(torch.trace(basis.T @ matrix @ basis)) / trace
        values = (
            eigenvalues[bucket] if eigenvalues is not None else torch.linalg.eigvalsh(matrix).clamp_min(0.0).numpy()
        )
        spectra.append(
            UnitSpectrum(
                unit_id=bucket_id(artifact.key.id, bucket),
                dim=artifact.dim,
                energy_eigenvalues=values,
                energy_observed=observed,
            )
        )
    return spectra


def frequency_rows(
    artifacts: list[UnitArtifact],
    token_counts: dict[str, np.ndarray],
    protocol: Protocol,
    nulls: ExactNulls | None = None,
) -> pd.DataFrame:
    """Per-frequency-bucket energy ratios and the log-frequency vs centroid-distance correlation.

    Bucket b holds the token types of the b-th quantile of corpus counts (0 = rarest). The
    ratio in a bucket is the proxy's energy over the expected control energy of the tokens in
    that bucket (closed form, or the drawn controls' mean for projected kinds); its CI is the
    same document / sequence bootstrap as the overall ratio (the protocol's interval), and its
    p-value the exact Haar test of the bucket's energy fraction against its own gradient second
    moment (:func:`bucket_spectra`; from ``nulls`` when the run's analysis computed them with its
    other exact tests, else computed here from the same streams).

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
    if nulls is None:
        from . import null_settings, run_exact_tests  # the package's stream seeding and options

        spectra = [spectrum for artifact in artifacts for spectrum in bucket_spectra(artifact)]
        nulls = run_exact_tests(spectra, protocol, null_settings(artifacts, protocol))
    rows = [
        row
        for artifact in artifacts
        if artifact.status == "ok"
        for row in unit_frequency_rows(artifact, token_counts.get(artifact.key.model), protocol, nulls)
    ]
    return frequency_table(rows)


def unit_frequency_rows(
    artifact: UnitArtifact, counts: np.ndarray | None, protocol: Protocol, nulls: ExactNulls
) -> list[dict]:
    """One analysable unit's frequency rows: its buckets, then (with the model's corpus token
    ``counts``) its log-frequency correlations (see :func:`frequency_rows`)."""
    base = unit_columns(artifact)
    rows = [{**base, **row} for row in _bucket_rows(artifact, protocol, nulls)]
    if counts is not None:
        rows.extend(
            {**base, "proxy": "none", "rank": None, "control": "none", "bucket": "all", **row}
            for row in _correlation_rows(artifact, counts, protocol)
        )
    return rows


def frequency_table(rows: list[dict]) -> pd.DataFrame:
    """frequency.csv's table from its rows (columns `FREQUENCY_COLUMNS`, integer rank and step)."""
    frame = pd.DataFrame(rows, columns=FREQUENCY_COLUMNS)
    if not frame.empty:
        frame["rank"] = pd.array(frame["rank"], dtype="Int64")
        frame["step"] = pd.array(frame["step"], dtype="Int64")
    return frame


def _bucket_rows(artifact: UnitArtifact, protocol: Protocol, nulls: ExactNulls) -> list[dict]:
    """The energy_ratio rows of every (bucket, proxy, rank, control kind) of one unit."""
    stats = protocol.stats
    documents = artifact.sequence_documents if stats.resampling_unit == "document" else None
    if documents is not None and len(np.unique(documents)) < 2:
        documents = None
    projected = set(protocol.projected_control_kinds)
    rows = []
    for bucket in range(artifact.total_energy.shape[1]):
        total = artifact.total_energy[:, bucket]
        if not total.sum() > 0:
            continue
        energy = artifact.energy[:, bucket]
        for proxy, rank in proxy_groups(artifact):
            proxy_energy = energy[:, artifact.columns_for(proxy, rank, "proxy")[0]]
            test = nulls.energy.get((bucket_id(artifact.key.id, bucket), proxy, rank))
            exact = (
                replace(test, note=exact_note(test, None))
                if test is not None
                else ExactTestResult(
                    p_value=np.nan,
                    n_draws=0,
                    note="no exact test: the unit has no per-bucket second moments",
                    fallback=NO_EXACT_TEST,
                )
            )
            for control in protocol.controls.kinds:
                if control in projected:
                    reference = energy[:, artifact.columns_for(proxy, rank, control)].mean(axis=1)
                else:
                    reference = expected_control_energy(control, proxy_energy, total, rank, artifact.dim)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    analysis = analyze_energy(
                        proxy_energy,
                        total,
                        reference,
                        rank=rank,
                        dim=artifact.dim,
                        exact=exact,
                        group_ids=documents,
                        reference="drawn" if control in projected else "expected",
                        control_kind=control,
                        n_bootstrap=stats.n_bootstrap,
                        ci_level=stats.ci_level,
                        ci_method=stats.ci_method,
                        alternative=stats.alternative,
                        seed=derive_seed(protocol.seed, artifact.key.id, proxy, rank, control, bucket, "frequency"),
                    )
                ratio = analysis["energy_ratio"]
                rows.append(
                    {
                        "proxy": proxy,
                        "rank": rank,
                        "control": control,
                        "bucket": str(bucket),
                        "metric": "energy_ratio",
                        "estimate": ratio.estimate,
                        "ci_low": ratio.ci_low,
                        "ci_high": ratio.ci_high,
                        "ci_method": ratio.ci_method,
                        "p_value": analysis.p_value,
                        "note": join_notes(
                            ratio.note,
                            "p: exact Haar test of the bucket's energy fraction (its own gradient second moment)",
                        ),
                    }
                )
    return rows


#: The frequency/distance definitions: (metric suffix, artifact attribute, what "distance" means).
DEFINITIONS = (
    ("distance", "type_rms_distance", "distance = RMS spread of the type's activations around its own centroid"),
    ("mean_distance", "type_mean_distance", "distance of the type's mean activation from the global mean (debiased)"),
    ("mean_norm", "type_mean_norm", "norm of the type's mean activation (debiased)"),
)


def _correlation_rows(artifact: UnitArtifact, corpus_counts: np.ndarray, protocol: Protocol) -> list[dict]:
    """Spearman and Pearson correlations of log corpus count with each type "distance" of
    :data:`DEFINITIONS` (`*_logfreq_distance`, `*_logfreq_mean_distance`, `*_logfreq_mean_norm`),
    with CIs from one sequence bootstrap.

    Types: seen at least twice in the test split (and kept by the collector's type budget, most
    frequent first) and at least once in the corpus. The CI resamples test sequences (the sampling
    unit): every resample recomputes each type's centroid, RMS spread, mean distance and mean
    norm from the per-(sequence, type) sums (`ResampledTypeMeans`, whose spread is
    `ResampledCentroidDistance`: computed once per resample for all three), drops types that
    cannot pair, and recomputes all six correlations; log corpus counts are fixed. The p-value is
    scipy's, over types.

    Interval: the *normal* bootstrap interval, estimate ± z·(standard deviation of the
    resamples), or percentile when the protocol asks for percentile. Why no bias correction (basic,
    BCa): every type's distance is a ratio estimated from the few sequences holding the type, so
    the correlation's bootstrap distribution sits off-centre (often 1–2.5 SE on real models), but
    that resampled bias follows the sample's own error rather than the estimator's bias: in the
    calibration of `benchmarks/bench_frequency.py` (3 000 corpora per size) correcting for it
    covers 0.89–0.91 at 100–300 sequences, the normal interval 0.94–0.95 (its SE is right to
    within 1 %). BCa would also need quantiles beyond its resamples, and there is no standard
    error per resample for a studentized interval. Endpoints are clipped to [−1, 1]."""
    vocab = artifact.type_count.shape[0]
    counts = np.zeros(vocab)
    counts[: min(vocab, corpus_counts.shape[0])] = corpus_counts[:vocab]
    present = (artifact.type_count >= 2) & np.isfinite(artifact.type_rms_distance) & (counts > 0)
    kept_note = artifact.extra.get("type_statistics_note", "")
    if present.sum() < 3:
        if not kept_note:
            return []
        # the budget, not the data, left too few types: say so rather than drop the rows silently
        return [
            {
                "metric": metric,
                "estimate": math.nan,
                "p_value": math.nan,
                "ci_low": math.nan,
                "ci_high": math.nan,
                "ci_method": "none",
                "note": f"{int(present.sum())} token types with per-type statistics, too few for a correlation; "
                f"{kept_note}",
            }
            for metric in ("spearman_logfreq_distance", "pearson_logfreq_distance")
        ]
    types = np.flatnonzero(present)
    # units from an anistat without the mean geometry have the RMS spread only
    definitions = [d for d in DEFINITIONS if getattr(artifact, d[1]) is not None]
    intervals = _correlation_intervals(artifact, np.log(counts[types]), types, len(definitions), protocol)
    rows = []
    for index, (name, attribute, meaning) in enumerate(definitions):
        correlation = log_frequency_correlation(counts[types], getattr(artifact, attribute)[types])
        for offset, (kind, value, p_value) in enumerate(
            (
                ("spearman", correlation.spearman_rho, correlation.spearman_p),
                ("pearson", correlation.pearson_r, correlation.pearson_p),
            )
        ):
            interval = intervals[2 * index + offset]
            parts = [
                f"{correlation.n_types} token types",
                meaning,
                artifact.pair_note if interval is None else interval.note,
                kept_note,
            ]
            if interval is not None and interval.bias_in_se is not None and abs(interval.bias_in_se) > 1:
                # a rank correlation over types, each estimated from few sequences, is not a smooth
                # function of the sequences: say so when its resamples are visibly off-centre
                parts.append(f"bootstrap mean {interval.bias_in_se:+.1f} SE from the estimate")
            rows.append(
                {
                    "metric": f"{kind}_logfreq_{name}",
                    "estimate": float(value),
                    "p_value": float(p_value),
                    "ci_low": math.nan if interval is None else max(-1.0, interval.ci_low),
                    "ci_high": math.nan if interval is None else min(1.0, interval.ci_high),
                    "ci_method": "none" if interval is None else interval.method,
                    "note": "; ".join(part for part in parts if part),
                }
            )
    return rows


def _correlation_intervals(
    artifact: UnitArtifact, log_count: np.ndarray, types: np.ndarray, n_definitions: int, protocol: Protocol
) -> list:
    """One sequence bootstrap of the ``2 × n_definitions`` correlations (None each without pair sums)."""
    if artifact.pair_sums is None:
        return [None] * (2 * n_definitions)
    stats = protocol.stats
    means = ResampledTypeMeans(artifact.pair_sums, types)

    def statistic(weights):
        spread, distance, norm = means.all_three(weights)
        columns = [spread, distance, norm][:n_definitions]
        return np.column_stack([c for pair in masked_correlations_many(log_count, columns) for c in pair])

    return sequence_bootstrap_columns(
        statistic,
        artifact.pair_sums.n_sequences,
        n_resamples=stats.n_bootstrap,
        ci_level=stats.ci_level,
        method=vocab.PERCENTILE if stats.ci_method == vocab.PERCENTILE else vocab.NORMAL_INTERVAL,
        seed=derive_seed(protocol.seed, artifact.key.id, "logfreq_correlations"),
    )
