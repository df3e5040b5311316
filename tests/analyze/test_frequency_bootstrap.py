"""Sequence-bootstrap CI of the log-frequency vs centroid-distance correlation.

Against brute force (a resample materialised row by row), against scipy (correlations per
resample), against the collector's own full-sample distances, and against the sampling
distribution itself (bootstrap SE ≈ the SD over independent simulated corpora).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import add_corpus
from scipy import stats

from anistat.analyze import frequency_rows
from anistat.collect import BasisSet, SiteAccumulator, UnitKey
from anistat.geometry import (
    ResampledCentroidDistance,
    masked_correlations,
    masked_correlations_many,
    sequence_type_sums,
)
from anistat.protocol import Protocol
from anistat.stats import iter_bootstrap_weights, sequence_bootstrap, sequence_bootstrap_columns


def _corpus(rng, n_sequences, length, vocab, dim, sequence_effect=0.5):
    """Token ids from a Zipf law; activations = type mean + noise whose scale grows with the
    type's rank (so rarer types sit farther from their centroid) + a per-sequence shift (so
    tokens within a sequence are dependent, which is why sequences are the resampling unit)."""
    probabilities = 1.0 / np.arange(1, vocab + 1)
    probabilities /= probabilities.sum()
    ids = rng.choice(vocab, size=(n_sequences, length), p=probabilities)
    means = rng.normal(size=(vocab, dim)) * 3.0
    scale = 0.5 + np.log1p(np.arange(vocab))[:, None] * 0.4
    shift = rng.normal(size=(n_sequences, 1, dim)) * sequence_effect
    activations = means[ids] + scale[ids] * rng.normal(size=(n_sequences, length, dim)) + shift
    return ids, activations, probabilities


def _brute_rms(activations, ids, weights, types):
    """The resample's distance per type, from its pairs: sequence s is drawn weights[s] times,
    and two tokens pair when they are distinct tokens of one drawn copy or come from different
    original sequences; rms² = mean ‖a_i − a_j‖² / 2 over those pairs."""
    n_sequences, length, dim = activations.shape
    out = np.full(len(types), np.nan)
    for j, t in enumerate(types):
        # one entry per drawn copy: (copy id, original sequence, activation)
        copies = [
            (c, s, a)
            for c, s in enumerate(np.repeat(np.arange(n_sequences), weights.astype(int)))
            for a in activations[s][ids[s] == t]
        ]
        total, pairs = 0.0, 0
        for x in range(len(copies)):
            for y in range(len(copies)):
                same_copy = copies[x][0] == copies[y][0]
                if x != y and (same_copy or copies[x][1] != copies[y][1]):
                    total += ((copies[x][2] - copies[y][2]) ** 2).sum() / 2
                    pairs += 1
        if pairs:
            out[j] = np.sqrt(total / pairs)
    return out


def _bessel_rms(points):
    return np.sqrt(((points - points.mean(0)) ** 2).sum() / (len(points) - 1))


@pytest.mark.parametrize("dim", [4, 40], ids=["types-in-more-sequences-than-d", "d-larger-than-sequences"])
def test_resampled_distance_equals_brute_force(dim):
    rng = np.random.default_rng(dim)
    n_sequences, length = 15, 12
    ids, activations, _ = _corpus(rng, n_sequences, length, vocab=25, dim=dim)
    ids[0, 0] = 99  # a type seen once, in one sequence: singletons path, NaN (one occurrence)
    ids[1, :2] = 98  # a type seen twice in one sequence: singletons path, defined
    n_sequences_full = n_sequences
    sums = sequence_type_sums(activations.reshape(-1, dim), ids.ravel(), np.repeat(np.arange(n_sequences), length))
    types = np.unique(ids)
    distance = ResampledCentroidDistance(sums, types)
    weights = np.vstack([np.ones(n_sequences), rng.multinomial(n_sequences, np.full(n_sequences, 1 / n_sequences), 6)])
    resampled = distance(weights)
    for row, w in enumerate(weights):
        np.testing.assert_allclose(
            resampled[row], _brute_rms(activations, ids, w, types), rtol=1e-9, atol=1e-10, equal_nan=True
        )
    # at w = 1 it is the Bessel-corrected RMS distance to the centroid
    full = [_bessel_rms(activations[ids == t]) if (ids == t).sum() >= 2 else np.nan for t in types]
    np.testing.assert_allclose(resampled[0], full, rtol=1e-10, equal_nan=True)
    assert np.isnan(resampled[0, types == 99]).all() and np.isfinite(resampled[0, types == 98]).all()
    # a sequence holding a type once, drawn twice, is not a pair: still undefined
    twice = np.zeros(n_sequences_full)
    twice[0] = 2
    assert np.isnan(distance(twice[None])[0, types == 99]).all()


def test_resampled_distance_is_shift_invariant_with_large_offsets():
    """A common offset 500× the within-type spread (residual streams have large-norm
    directions) leaves the distances intact to 1e-8: the only precision limit left is the
    float64 Σ‖a‖² itself (relative error ≈ 1e-16·‖a‖²/rms²)."""
    rng = np.random.default_rng(1)
    ids, activations, _ = _corpus(rng, 10, 10, vocab=12, dim=6)
    sequence = np.repeat(np.arange(10), 10)
    weights = rng.multinomial(10, np.full(10, 0.1), 4).astype(float)
    types = np.unique(ids)
    near = ResampledCentroidDistance(sequence_type_sums(activations.reshape(-1, 6), ids.ravel(), sequence), types)
    far = ResampledCentroidDistance(sequence_type_sums(activations.reshape(-1, 6) + 1e3, ids.ravel(), sequence), types)
    np.testing.assert_allclose(far(weights), near(weights), rtol=1e-8, equal_nan=True)


def test_masked_correlations_match_scipy_per_row():
    rng = np.random.default_rng(2)
    x = np.round(rng.normal(size=30), 1)  # ties in x
    y = rng.normal(size=(5, 30)) + x
    y[1, ::3] = np.nan
    y[2, :] = np.nan
    y[2, :2] = 1.0  # fewer than 3 pairs: NaN
    y[3, 5] = y[3, 6]  # ties in y
    spearman, pearson = masked_correlations(x, y)
    for row in (0, 1, 3, 4):
        keep = np.isfinite(y[row])
        assert spearman[row] == pytest.approx(stats.spearmanr(x[keep], y[row, keep]).statistic, abs=1e-12)
        assert pearson[row] == pytest.approx(stats.pearsonr(x[keep], y[row, keep]).statistic, abs=1e-12)
    assert np.isnan(spearman[2]) and np.isnan(pearson[2])
    constant = masked_correlations(x, np.full((1, 30), 2.0))
    assert np.isnan(constant[0][0]) and np.isnan(constant[1][0])
    # many rows, random subsets, ties on both sides: row by row what scipy gives
    x = np.round(rng.normal(size=40), 0)
    y = np.round(rng.normal(size=(200, 40)) + x, 1)
    y[rng.random(y.shape) < 0.3] = np.nan
    spearman, pearson = masked_correlations(x, y)
    for row in range(200):
        keep = np.isfinite(y[row])
        assert spearman[row] == pytest.approx(stats.spearmanr(x[keep], y[row, keep]).statistic, abs=1e-12)
        assert pearson[row] == pytest.approx(stats.pearsonr(x[keep], y[row, keep]).statistic, abs=1e-12)


def test_masked_correlations_many_share_the_ranking_and_agree_with_scipy():
    """One ranking of x serves arrays with the same mask; another mask gets its own (and a
    constant x within a row's subset is NaN, as scipy says)."""
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=50), 0)
    first = np.round(rng.normal(size=(60, 50)) + x, 1)
    first[rng.random(first.shape) < 0.25] = np.nan
    same_mask = np.where(np.isfinite(first), rng.normal(size=first.shape) - x, np.nan)
    other_mask = rng.normal(size=(60, 50))
    other_mask[rng.random(other_mask.shape) < 0.5] = np.nan
    results = masked_correlations_many(x, [first, same_mask, other_mask])
    for y, (spearman, pearson) in zip((first, same_mask, other_mask), results):
        alone = masked_correlations(x, y)
        assert np.array_equal(spearman, alone[0], equal_nan=True) and np.array_equal(pearson, alone[1], equal_nan=True)
        for row in range(y.shape[0]):
            keep = np.isfinite(y[row])
            assert spearman[row] == pytest.approx(stats.spearmanr(x[keep], y[row, keep]).statistic, abs=1e-12)
            assert pearson[row] == pytest.approx(stats.pearsonr(x[keep], y[row, keep]).statistic, abs=1e-12)
    flat_x = masked_correlations_many(np.ones(10), [rng.normal(size=(2, 10))])[0]
    assert np.isnan(flat_x[0]).all() and np.isnan(flat_x[1]).all()


@pytest.mark.parametrize("method", ["percentile", "bca", "basic", "normal"])
def test_bootstrap_columns_equal_one_statistic_at_a_time(method):
    rng = np.random.default_rng(3)
    numerator, denominator = rng.gamma(2.0, size=40), rng.gamma(3.0, size=40)

    def ratio(w):
        return (w @ numerator) / (w @ denominator)

    def difference(w):
        return (w @ numerator - w @ denominator) / w.sum(1)

    both = sequence_bootstrap_columns(
        lambda w: np.column_stack([ratio(w), difference(w)]), 40, n_resamples=300, seed=5, method=method, chunk_size=70
    )
    for result, statistic in zip(both, (ratio, difference)):
        alone = sequence_bootstrap(statistic, 40, n_resamples=300, seed=5, method=method)
        # numbers with approx, the method name exactly (pytest >= 9 refuses approx on a string)
        assert (result.estimate, result.ci_low, result.ci_high) == pytest.approx(
            (alone.estimate, alone.ci_low, alone.ci_high), rel=1e-12
        )
        assert result.method == alone.method
    with pytest.raises(ValueError):
        sequence_bootstrap_columns(lambda w: np.column_stack([ratio(w)]), 40, method="studentized")
    # basic = the percentile interval reflected about the estimate
    percentile, basic = (
        sequence_bootstrap_columns(lambda w: np.column_stack([ratio(w)]), 40, n_resamples=300, seed=5, method=m)[0]
        for m in ("percentile", "basic")
    )
    assert basic.ci_low == pytest.approx(2 * basic.estimate - percentile.ci_high)
    assert basic.ci_high == pytest.approx(2 * basic.estimate - percentile.ci_low)
    # normal = the estimate ± z_{0.975} × the standard deviation of the same resamples
    normal = sequence_bootstrap_columns(
        lambda w: np.column_stack([ratio(w)]), 40, n_resamples=300, seed=5, method="normal"
    )[0]
    replicates = np.concatenate([ratio(w) for w in iter_bootstrap_weights(40, 300, 5)])
    half = stats.norm.ppf(0.975) * replicates.std(ddof=1)
    assert (normal.ci_low, normal.ci_high) == pytest.approx((normal.estimate - half, normal.estimate + half), rel=1e-12)
    assert normal.method == "normal" and normal.se == pytest.approx(replicates.std(ddof=1), rel=1e-12)


def _accumulator(dim, n_seq, vocab, budget, growing=False):
    basis = torch.linalg.qr(torch.randn(dim, 2, dtype=torch.float64))[0]
    sets = [BasisSet("pca", 2, basis, {"normal": torch.linalg.qr(torch.randn(3, dim, 2, dtype=torch.float64))[0]})]
    return SiteAccumulator(
        sets,
        dim=dim,
        n_seq=None if growing else n_seq,
        n_buckets=1,
        vocab_size=vocab,
        device=torch.device("cpu"),
        pair_budget_bytes=budget,
    )


@pytest.mark.parametrize("growing", [False, True], ids=["post-hoc", "in-training"])
def test_collector_pair_sums_equal_the_raw_rows(growing, tmp_path):
    rng = np.random.default_rng(4)
    n_seq, length, dim, vocab = 11, 9, 5, 30
    ids, activations, _ = _corpus(rng, n_seq, length, vocab, dim)
    gradients = rng.normal(size=(n_seq, length, dim))
    accumulator = _accumulator(dim, n_seq, vocab, budget=2**20, growing=growing)
    for start in range(0, n_seq, 4):  # batches of 4, 4, 3 sequences
        stop = min(n_seq, start + 4)
        token_ids = torch.as_tensor(ids[start:stop])
        accumulator.add(
            torch.as_tensor(gradients[start:stop]),
            torch.as_tensor(activations[start:stop]),
            token_ids,
            torch.ones(stop - start, length, 1),
            start=start,
        )
    key = UnitKey("m", "clm", "step0", 0, "early", 0, "residual.0")
    artifact = accumulator.finish(
        key, sequence_documents=np.arange(n_seq), seconds=0.0, isoscore_c0="scaled_identity", isoscore_zeta=0.1
    )
    expected = sequence_type_sums(activations.reshape(-1, dim), ids.ravel(), np.repeat(np.arange(n_seq), length))
    for loaded in (artifact, type(artifact).load(artifact.save(tmp_path))):
        got = loaded.pair_sums
        assert got is not None and got.n_sequences == n_seq and loaded.pair_note == ""
        for name in ("sequence", "token_type", "count", "square_sum", "vector_sum"):
            np.testing.assert_allclose(
                getattr(got, name), getattr(expected, name), rtol=1e-12, atol=1e-12, err_msg=name
            )
        # the resampling code at w = 1 gives back the collector's own per-type distances
        types = np.flatnonzero(loaded.type_count >= 2)
        np.testing.assert_allclose(
            ResampledCentroidDistance(got, types)(np.ones((1, n_seq)))[0], loaded.type_rms_distance[types], rtol=1e-9
        )


def test_over_budget_reports_the_need_and_analysis_keeps_the_estimate():
    rng = np.random.default_rng(5)
    n_seq, length, dim, vocab = 8, 10, 6, 20
    ids, activations, _ = _corpus(rng, n_seq, length, vocab, dim)
    accumulator = _accumulator(dim, n_seq, vocab, budget=1000)  # bytes: two pairs' worth
    add_corpus(accumulator, rng, ids, activations)
    key = UnitKey("m", "clm", "step0", 0, "early", 0, "residual.0")
    artifact = accumulator.finish(
        key, sequence_documents=np.arange(n_seq), seconds=0.0, isoscore_c0="scaled_identity", isoscore_zeta=0.1
    )
    assert artifact.pair_sums is None
    assert "MiB" in artifact.pair_note and "frequency_ci_memory_mb" in artifact.pair_note
    protocol = Protocol.model_validate(
        {
            "anistat_protocol": 1,
            "name": "t",
            "models": [{"name": "m", "architecture": "gpt2"}],
            "stats": {"n_bootstrap": 50, "n_permutations": 50},
        }
    )
    counts = np.bincount(ids.ravel(), minlength=vocab) * 10
    frame = frequency_rows([artifact], {"m": counts}, protocol)
    correlation = frame[frame.metric == "spearman_logfreq_distance"].iloc[0]
    assert np.isfinite(correlation.estimate) and np.isnan(correlation.ci_low) and correlation.ci_method == "none"
    assert "frequency_ci_memory_mb" in correlation.note


def test_interval_covers_the_population_correlation():
    """Calibration against a known law. Each type t has a population spread (its activation
    variance is d·(scale_t² + shift²): own noise plus a per-sequence shift shared by the tokens
    of a sequence) and a corpus probability p_t; the estimand is Spearman's ρ between log p_t
    and that spread over the vocabulary. Over independent corpora of 100 sequences the
    bootstrap SE matches the SD of the estimates, and the normal interval (what the analysis
    uses) covers the population ρ (`benchmarks/bench_frequency.py` runs the long version and
    the alternatives: a bootstrap that lets copies of one sequence pair with each other covers
    far less)."""
    dim, vocab, n_seq, length, shift, n_corpora = 6, 40, 100, 25, 1.0, 60
    law = np.random.default_rng(123)
    probability = 1.0 / np.arange(1, vocab + 1)
    probability /= probability.sum()
    means = law.normal(size=(vocab, dim)) * 3.0
    scale = (0.5 + 0.3 * np.log1p(np.arange(vocab))) * np.exp(law.normal(size=vocab) * 0.35)
    population = stats.spearmanr(np.log(probability), np.sqrt(dim * (scale**2 + shift**2))).statistic
    rng = np.random.default_rng(0)
    estimates, standard_errors, covered = [], [], 0
    for _ in range(n_corpora):
        ids = rng.choice(vocab, size=(n_seq, length), p=probability)
        activations = (
            means[ids]
            + scale[ids][..., None] * rng.normal(size=(n_seq, length, dim))
            + rng.normal(size=(n_seq, 1, dim)) * shift
        )
        sums = sequence_type_sums(activations.reshape(-1, dim), ids.ravel(), np.repeat(np.arange(n_seq), length))
        types, counts = np.unique(ids, return_counts=True)
        types = types[counts >= 2]
        distance = ResampledCentroidDistance(sums, types)
        result = sequence_bootstrap_columns(
            lambda w, types=types, distance=distance: np.column_stack(
                masked_correlations(np.log(probability[types]), distance(w))[:1]
            ),
            n_seq,
            n_resamples=300,
            seed=int(rng.integers(1 << 31)),
            method="normal",
        )[0]
        estimates.append(result.estimate)
        standard_errors.append(result.se)
        covered += result.ci_low <= population <= result.ci_high
    se_ratio = np.mean(standard_errors) / np.std(estimates, ddof=1)
    assert 0.75 < se_ratio < 1.35, se_ratio
    assert covered / n_corpora >= 0.82, (covered / n_corpora, population, np.mean(estimates))
