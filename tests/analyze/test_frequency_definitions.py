"""Frequency analysis definitions of issue #15: spread around the type's own centroid, distance
of the type's centroid from the global mean, norm of the centroid — against brute force, a
closed form for the debiasing, and the MLM rule that corrupted-input positions stay out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import add_corpus, measure_arguments

from anistat.collect import BasisSet, SiteAccumulator, UnitKey, measure_checkpoint
from anistat.collect.collector import model_inputs
from anistat.corpus import load_corpus
from anistat.data import BuiltinTokenizer, make_splits
from anistat.geometry import draw_controls, fit_proxy, sequence_type_sums, type_mean_geometry
from anistat.models import build_builtin_model
from anistat.protocol import DataSpec, ModelSpec


def _sums(activations, ids, vocab):
    count = np.bincount(ids, minlength=vocab).astype(float)
    vector = np.zeros((vocab, activations.shape[1]))
    np.add.at(vector, ids, activations)
    square = np.bincount(ids, weights=(activations**2).sum(1), minlength=vocab)
    return count, vector, square


def test_type_mean_geometry_equals_brute_force():
    rng = np.random.default_rng(0)
    vocab, dim = 12, 4
    ids = rng.integers(0, vocab - 1, size=300)  # the last type never occurs
    ids[:1] = vocab - 2
    ids[ids == vocab - 2] = 0
    ids[0] = vocab - 2  # type vocab − 2 occurs once
    activations = rng.normal(size=(300, dim)) + 3 * rng.normal(size=(vocab, dim))[ids]
    result = type_mean_geometry(*_sums(activations, ids, vocab))
    global_mean = activations.mean(0)
    np.testing.assert_allclose(result.global_mean, global_mean, rtol=1e-12)
    for t in range(vocab):
        rows = activations[ids == t]
        if rows.shape[0] < 2:
            assert (
                np.isnan(result.rms_spread[t]) and np.isnan(result.mean_distance[t]) and np.isnan(result.mean_norm[t])
            )
            continue
        centroid = rows.mean(0)
        variance = ((rows - centroid) ** 2).sum() / (rows.shape[0] - 1)
        noise = variance / rows.shape[0]
        assert result.rms_spread[t] == pytest.approx(np.sqrt(variance), rel=1e-10)
        assert result.mean_distance[t] == pytest.approx(
            np.sqrt(max(0.0, ((centroid - global_mean) ** 2).sum() - noise)), rel=1e-10
        )
        assert result.mean_norm[t] == pytest.approx(np.sqrt(max(0.0, (centroid**2).sum() - noise)), rel=1e-10)


def test_debiased_centroid_distance_is_unbiased_whatever_the_count():
    """Closed form: types with true mean θ (‖θ − μ‖² = 4, the global mean μ = 0 pinned by a huge
    centred type) and isotropic noise of total variance 3 have E‖c − μ‖² = 4 + 3/n; the
    debiased square is 4 on average for n = 5 and n = 50 alike (clipping at 0 is negligibly
    rare here), the plug-in is not. Each replicate is one type of a single call."""
    rng = np.random.default_rng(1)
    dim, replicates = 3, 20000
    theta = np.array([2.0, 0.0, 0.0])
    for n in (5, 50):
        rows = theta + rng.normal(size=(replicates, n, dim))
        count = np.r_[np.full(replicates, float(n)), 1e12]
        vector = np.vstack([rows.sum(1), np.zeros((1, dim))])
        square = np.r_[(rows**2).sum((1, 2)), 1e12 * dim * 1e-6]
        result = type_mean_geometry(count, vector, square)
        assert np.abs(result.global_mean).max() < 1e-4
        plug_in = (rows.mean(1) ** 2).sum(1)
        assert plug_in.mean() == pytest.approx(4 + 3 / n, abs=0.03)
        assert (result.mean_distance[:replicates] ** 2).mean() == pytest.approx(4.0, abs=0.03)


def test_mlm_type_statistics_leave_corrupted_inputs_out():
    spec = DataSpec(seq_len=16, n_fit_sequences=8, n_test_sequences=6, vocab_size=300)
    corpus = load_corpus(spec)
    splits = make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=0)
    model = build_builtin_model(
        ModelSpec(name="e", architecture="bert", hidden_size=16, num_layers=1, num_heads=2),
        splits.vocab_size,
        16,
        seed=0,
    ).eval()
    proxy = fit_proxy(torch.randn(100, 16, generator=torch.Generator().manual_seed(0)), "pca", 2)
    bases = {0: [BasisSet("pca", 2, proxy.basis, {"haar": draw_controls("haar", proxy.basis, 3, seed=1)})]}
    key = UnitKey("e", "mlm", "c", 0, "early", 0, "residual.0")
    arguments = measure_arguments(
        splits, keys={0: key}, bases=bases, objective="mlm", mlm_probability=0.3, pair_budget_bytes=2**24
    )
    artifact = measure_checkpoint(model, **arguments)[0]
    inputs, _ = model_inputs(splits.test, splits, "mlm", 0.3, 0, "test")
    shown = inputs == splits.test
    assert not shown.all()
    expected = np.bincount(splits.test[shown].numpy(), minlength=splits.vocab_size)
    np.testing.assert_array_equal(artifact.type_count, expected)
    assert artifact.pair_sums.count.sum() == shown.sum()
    assert np.isfinite(artifact.type_mean_distance[expected >= 2]).all()


def test_accumulator_type_mask_selects_positions():
    rng = np.random.default_rng(3)
    n_seq, length, dim, vocab = 5, 7, 4, 9
    ids = rng.integers(0, vocab, size=(n_seq, length))
    activations = rng.normal(size=(n_seq, length, dim))
    mask = rng.random((n_seq, length)) < 0.7
    basis = torch.linalg.qr(torch.randn(dim, 1, dtype=torch.float64))[0]
    accumulator = SiteAccumulator(
        [BasisSet("pca", 1, basis, {"haar": basis.unsqueeze(0)})],
        dim=dim,
        n_seq=n_seq,
        n_buckets=1,
        vocab_size=vocab,
        device=torch.device("cpu"),
        pair_budget_bytes=2**20,
    )
    add_corpus(accumulator, rng, ids, activations, type_mask=torch.as_tensor(mask))
    artifact = accumulator.finish(
        UnitKey("m", "mlm", "c", 0, "early", 0, "residual.0"),
        sequence_documents=np.arange(n_seq),
        seconds=0.0,
        isoscore_c0="scaled_identity",
        isoscore_zeta=0.1,
    )
    kept = activations[mask]
    expected = type_mean_geometry(*_sums(kept, ids[mask], vocab))
    np.testing.assert_allclose(artifact.type_mean_norm, expected.mean_norm, rtol=1e-10)
    np.testing.assert_allclose(artifact.type_rms_distance, expected.rms_spread, rtol=1e-10)
    pairs = sequence_type_sums(kept, ids[mask], np.nonzero(mask)[0], n_seq)
    np.testing.assert_allclose(artifact.pair_sums.vector_sum, pairs.vector_sum, rtol=1e-12)


def test_resampled_type_means_equal_brute_force_resamples():
    """At w = 1 the collector's values; under integer weights the plug-in centroid distance and
    norm of the materialised resample (sequence s repeated w_s times), less the noise term of
    the resampled spread."""
    from anistat.geometry import ResampledCentroidDistance, ResampledTypeMeans

    rng = np.random.default_rng(7)
    n_seq, length, dim, vocab = 9, 12, 3, 6
    ids = rng.integers(0, vocab, size=(n_seq, length))
    activations = 4 * rng.normal(size=(vocab, dim))[ids] + rng.normal(size=(n_seq, length, dim))
    sums = sequence_type_sums(activations.reshape(-1, dim), ids.ravel(), np.repeat(np.arange(n_seq), length))
    full = type_mean_geometry(*_sums(activations.reshape(-1, dim), ids.ravel(), vocab))
    types = np.flatnonzero(np.bincount(ids.ravel(), minlength=vocab) >= 2)
    resampled = ResampledTypeMeans(sums, types)
    distance, norm = resampled(np.ones((1, n_seq)))
    np.testing.assert_allclose(distance[0], full.mean_distance[types], rtol=1e-9)
    np.testing.assert_allclose(norm[0], full.mean_norm[types], rtol=1e-9)
    weights = rng.multinomial(n_seq, np.full(n_seq, 1 / n_seq), size=3).astype(float)
    distance, norm = resampled(weights)
    spread = ResampledCentroidDistance(sums, types)(weights)
    for b, w in enumerate(weights):
        rows = np.repeat(activations, w.astype(int), axis=0).reshape(-1, dim)
        row_ids = np.repeat(ids, w.astype(int), axis=0).ravel()
        mean = rows.mean(0)
        for j, t in enumerate(types):
            mine = rows[row_ids == t]
            if mine.shape[0] == 0:
                assert np.isnan(distance[b, j])
                continue
            noise = spread[b, j] ** 2 / mine.shape[0]
            centroid = mine.mean(0)
            assert distance[b, j] ** 2 == pytest.approx(max(0.0, ((centroid - mean) ** 2).sum() - noise), rel=1e-8)
            assert norm[b, j] ** 2 == pytest.approx(max(0.0, (centroid**2).sum() - noise), rel=1e-8)


def test_frequency_rows_name_every_definition_with_a_ci():
    from anistat.analyze import frequency_rows
    from anistat.protocol import Protocol

    rng = np.random.default_rng(11)
    n_seq, length, dim, vocab = 30, 20, 4, 25
    probabilities = 1 / np.arange(1, vocab + 1)
    ids = rng.choice(vocab, size=(n_seq, length), p=probabilities / probabilities.sum())
    activations = 3 * rng.normal(size=(vocab, dim))[ids] + rng.normal(size=(n_seq, length, dim))
    basis = torch.linalg.qr(torch.randn(dim, 1, dtype=torch.float64))[0]
    controls = torch.linalg.qr(torch.randn(3, dim, 1, dtype=torch.float64))[0]
    accumulator = SiteAccumulator(
        [BasisSet("pca", 1, basis, {"haar": controls})],
        dim=dim,
        n_seq=n_seq,
        n_buckets=1,
        vocab_size=vocab,
        device=torch.device("cpu"),
        pair_budget_bytes=2**22,
    )
    add_corpus(accumulator, rng, ids, activations)
    artifact = accumulator.finish(
        UnitKey("m", "clm", "c", 0, "early", 0, "residual.0"),
        sequence_documents=np.arange(n_seq),
        seconds=0.0,
        isoscore_c0="scaled_identity",
        isoscore_zeta=0.1,
    )
    protocol = Protocol(name="p", models=[{"name": "m", "architecture": "gpt2"}], stats={"n_bootstrap": 50})
    corpus_counts = np.bincount(ids.ravel(), minlength=vocab) * 10
    frame = frequency_rows([artifact], {"m": corpus_counts}, protocol)
    correlations = frame[frame.bucket == "all"].set_index("metric")
    for name in ("distance", "mean_distance", "mean_norm"):
        for kind in ("spearman", "pearson"):
            row = correlations.loc[f"{kind}_logfreq_{name}"]
            assert row.ci_method == "normal" and row.ci_low <= row.estimate <= row.ci_high, (kind, name)
    assert "global mean" in correlations.loc["spearman_logfreq_mean_distance", "note"]
    assert "own centroid" in correlations.loc["spearman_logfreq_distance", "note"]
    types = np.flatnonzero(artifact.type_count >= 2)
    from scipy import stats as sps

    expected = sps.spearmanr(np.log(corpus_counts[types]), artifact.type_mean_norm[types]).statistic
    assert correlations.loc["spearman_logfreq_mean_norm", "estimate"] == pytest.approx(expected, rel=1e-12)
