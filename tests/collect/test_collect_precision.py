"""The collector's float32 hot path against a float64 reference of every statistic, and
byte-identical reruns on CPU."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from _helpers import measure_arguments

from anistat.analyze import frequency_rows
from anistat.collect import BasisSet, SiteAccumulator, TypePlan, UnitKey, measure_checkpoint
from anistat.collect.collector import GRAM_BLOCK, add_gram_
from anistat.corpus import load_corpus
from anistat.data import BuiltinTokenizer, make_splits
from anistat.geometry import SpectralFrame, delta_isoscore_star, draw_controls, fit_proxy, oracle_fractions_of_spectrum
from anistat.models import build_builtin_model
from anistat.protocol import DataSpec, ModelSpec, Protocol

RELATIVE = 1e-6


def _relative(got, expected) -> float:
    """Normwise relative error ‖got − expected‖ / ‖expected‖."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def _scaled_max(got, expected_matrix) -> float:
    """Largest entry error of a second moment relative to sqrt(M_ii M_jj), the scale of the
    products each entry sums."""
    diagonal = np.sqrt(np.diag(expected_matrix))
    return float(np.max(np.abs(np.asarray(got) - expected_matrix) / np.outer(diagonal, diagonal)))


def _inputs(seed=0, n_seq=12, length=40, dim=48, vocab=60):
    """float32 gradients (anisotropic, with a mean, some exactly-zero rows) and activations with
    a mean much larger than their spread — the case where uncentred float32 products lose digits."""
    rng = np.random.default_rng(seed)
    spread = np.geomspace(5.0, 0.05, dim)
    gradients = (rng.standard_normal((n_seq, length, dim)) * spread + 0.3 * spread).astype(np.float32) * 1e-3
    gradients[:, ::7] = 0.0  # unevaluated positions
    activations = (rng.standard_normal((n_seq, length, dim)) + 40.0 * rng.standard_normal(dim)).astype(np.float32)
    ids = rng.zipf(1.5, size=(n_seq, length)) % vocab
    buckets = rng.integers(0, 3, size=vocab)
    return gradients, activations, ids, buckets


@pytest.mark.parametrize("dim", [48, 150])  # 150: two full Gram column blocks and a partial one
def test_every_statistic_within_1e6_of_float64_reference(dim):
    gradients, activations, ids, buckets = _inputs(dim=dim)
    n_seq, length, dim = gradients.shape
    vocab, n_buckets, rank = 60, 3, 4
    proxy = fit_proxy(torch.from_numpy(activations.reshape(-1, dim)), "pca", rank, seed=0).basis
    controls = {"normal": draw_controls("normal", proxy, 6, seed=1)}
    sets = [BasisSet("pca", rank, proxy, controls)]
    accumulator = SiteAccumulator(
        sets, dim=dim, n_seq=n_seq, n_buckets=n_buckets, vocab_size=vocab, device=torch.device("cpu")
    )
    assert accumulator.dtype == torch.float32  # the default hot path
    onehot = torch.nn.functional.one_hot(torch.from_numpy(buckets[ids]), n_buckets)
    for start in range(0, n_seq, 5):
        stop = min(n_seq, start + 5)
        accumulator.add(
            torch.from_numpy(gradients[start:stop]),
            torch.from_numpy(activations[start:stop]),
            torch.from_numpy(ids[start:stop]),
            onehot[start:stop],
            start=start,
        )
    key = UnitKey("m", "clm", "c", 0, "early", 0, "residual.0")
    artifact = accumulator.finish(
        key, sequence_documents=np.arange(n_seq), seconds=0.0, isoscore_c0="scaled_identity", isoscore_zeta=0.1
    )

    # float64 reference from the same (float32-valued) inputs
    g = gradients.astype(np.float64)
    a = activations.astype(np.float64)
    stack = [proxy.double().numpy()] + [q.double().numpy() for q in controls["normal"]]
    bucket_of = buckets[ids]
    total = np.zeros((n_seq, n_buckets))
    energy = np.zeros((n_seq, n_buckets, len(stack)))
    for b in range(n_buckets):
        mask = (bucket_of == b)[..., None]
        total[:, b] = np.sum((g * mask) ** 2, axis=(1, 2))
        for j, q in enumerate(stack):
            energy[:, b, j] = np.sum(((g * mask) @ q) ** 2, axis=(1, 2))
    assert _relative(artifact.total_energy, total) < RELATIVE
    assert np.max(np.abs(artifact.energy - energy) / np.maximum(energy, 1e-300)) < RELATIVE  # every entry
    flat_g = g.reshape(-1, dim)
    evaluated = np.linalg.norm(flat_g, axis=1) > 0
    flat_g = flat_g[evaluated]
    flat_a = a.reshape(-1, dim)
    assert artifact.n_tokens.tolist() == evaluated.reshape(n_seq, length).sum(1).tolist()
    for moments, rows in ((artifact.gradient_moments, flat_g), (artifact.activation_moments, flat_a)):
        assert moments["count"] == rows.shape[0]
        assert _relative(moments["sum"], rows.sum(0)) < RELATIVE
        outer = rows.T @ rows
        assert _scaled_max(moments["outer"], outer) < RELATIVE
        # the covariance (outer − Nμμᵀ)/(N − 1) is where a large mean would cost float32 digits
        covariance = np.cov(rows.T)
        got_mean = moments["sum"] / moments["count"]
        got_cov = (moments["outer"] - moments["count"] * np.outer(got_mean, got_mean)) / (moments["count"] - 1)
        assert _scaled_max(got_cov, covariance) < RELATIVE
    # per frequency bucket, the gradients' second moment (the buckets' exact tests read it)
    buckets_of_rows = bucket_of.reshape(-1)[evaluated]
    for b in range(n_buckets):
        rows_b = flat_g[buckets_of_rows == b]
        got = artifact.gradient_moments["bucket_outer"][b].astype(np.float64)  # float32, as stored
        assert _scaled_max(got, rows_b.T @ rows_b) < RELATIVE
    unit_g = flat_g / np.linalg.norm(flat_g, axis=1, keepdims=True)
    assert _relative(artifact.gradient_unit_sum, unit_g.sum(0)) < RELATIVE
    assert (
        _relative(artifact.activation_unit_sum, (flat_a / np.linalg.norm(flat_a, axis=1, keepdims=True)).sum(0))
        < RELATIVE
    )
    flat_ids = ids.ravel()
    assert artifact.type_count.tolist() == np.bincount(flat_ids, minlength=vocab).tolist()
    for t in range(vocab):
        rows = flat_a[flat_ids == t]
        if rows.shape[0] >= 2:
            expected = np.sqrt(((rows - rows.mean(0)) ** 2).sum() / (rows.shape[0] - 1))
            assert artifact.type_rms_distance[t] == pytest.approx(expected, rel=RELATIVE)
        else:
            assert np.isnan(artifact.type_rms_distance[t])
    # the oracle fraction is taken at analysis time from the collected second moment
    second = flat_g.T @ flat_g
    eigenvalues = np.linalg.eigvalsh(second)
    oracle = oracle_fractions_of_spectrum(SpectralFrame(artifact.gradient_moments["outer"]).eigenvalues, [rank])
    assert oracle[rank] == pytest.approx(eigenvalues[-rank:].sum() / eigenvalues.sum(), rel=RELATIVE)
    reference_delta = delta_isoscore_star(np.cov(flat_g.T), torch.from_numpy(np.stack(stack)), "scaled_identity", 0.1)
    np.testing.assert_allclose(artifact.delta_isoscore_star, reference_delta.numpy(), atol=RELATIVE, rtol=0)


def test_moments_read_mid_stream_are_complete():
    """`grad` / `act` mirror the accumulated upper triangle on access, so a caller reading the
    moments between batches gets the whole matrix."""
    gradients, activations, ids, _ = _inputs(dim=150)
    n_seq, length, dim = gradients.shape
    basis = torch.linalg.qr(torch.randn(dim, 2, dtype=torch.float64))[0]
    accumulator = SiteAccumulator(
        [BasisSet("pca", 2, basis, {})], dim=dim, n_seq=n_seq, n_buckets=1, vocab_size=60, device=torch.device("cpu")
    )
    half = n_seq // 2
    accumulator.add(
        torch.from_numpy(gradients[:half]),
        torch.from_numpy(activations[:half]),
        torch.from_numpy(ids[:half]),
        torch.ones(half, length, 1),
        start=0,
    )
    rows = activations[:half].reshape(-1, dim).astype(np.float64)
    assert _scaled_max(accumulator.act.outer.numpy(), rows.T @ rows) < RELATIVE


@pytest.mark.parametrize("dim", [1, GRAM_BLOCK - 1, GRAM_BLOCK, 2 * GRAM_BLOCK + 5])
def test_upper_triangle_gram_equals_full_product(dim):
    rows = torch.randn(2, 37, dim, generator=torch.Generator().manual_seed(dim))
    full = torch.zeros(2, dim, dim, dtype=torch.float64)
    upper = torch.full((2, dim, dim), 7.0, dtype=torch.float64)
    add_gram_(full, rows, upper_only=False)
    add_gram_(upper, rows, upper_only=True)
    reference = torch.einsum("cni,cnj->cij", rows.double(), rows.double())
    assert torch.allclose(full, reference, rtol=1e-5, atol=1e-4)
    rows_i, cols_j = torch.triu_indices(dim, dim)
    assert torch.allclose(upper[:, rows_i, cols_j] - 7.0, reference[:, rows_i, cols_j], rtol=1e-5, atol=1e-4)
    # below the diagonal blocks nothing is touched (that is the work saved)
    block = torch.arange(dim) // GRAM_BLOCK
    untouched = block[:, None] > block[None, :]
    assert bool((upper[:, untouched] == 7.0).all())


def _small_run():
    spec = DataSpec(seq_len=16, n_fit_sequences=8, n_test_sequences=9, vocab_size=300)
    corpus = load_corpus(spec)
    splits = make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=0)
    model = build_builtin_model(
        ModelSpec(name="t", architecture="gpt2", hidden_size=32, num_layers=2, num_heads=2),
        splits.vocab_size,
        16,
        seed=0,
    ).eval()
    proxy = fit_proxy(torch.randn(200, 32, generator=torch.Generator().manual_seed(0)), "pca", 3, seed=0).basis
    bases = {
        layer: [BasisSet("pca", 3, proxy, {"haar": draw_controls("haar", proxy, 4, seed=layer)})] for layer in (0, 1)
    }
    keys = {layer: UnitKey("m", "clm", "c", 0, "early", layer, f"residual.{layer}") for layer in (0, 1)}
    return model, splits, bases, keys


def test_reruns_are_byte_identical_on_cpu(tmp_path):
    model, splits, bases, keys = _small_run()
    saved = []
    for run in range(2):
        arguments = measure_arguments(splits, keys=keys, bases=bases, objective="clm", pair_budget_bytes=2**20)
        artifacts = measure_checkpoint(model, **arguments)
        files = []
        for artifact in artifacts.values():
            meta = dataclasses.replace(artifact, seconds=0.0).save(tmp_path / f"run{run}")
            files.append((meta.read_bytes(), meta.with_name(meta.name[:-5] + ".npz").read_bytes()))
        saved.append(files)
    assert saved[0] == saved[1]


def test_type_plan_keeps_types_seen_twice_most_frequent_first_within_the_budget():
    ids = torch.tensor([[5, 5, 5, 2, 2, 9], [9, 7, 7, 1, 3, 3]])
    # occurrences: 5×3, 2×2, 9×2, 7×2, 3×2, 1×1 → eligible {2, 3, 5, 7, 9}
    dim = 5
    per_type = (dim + 3) * 8
    everything = TypePlan.from_tokens(ids, None, 12, dim, math.inf)
    assert everything.kept.tolist() == [2, 3, 5, 7, 9] and everything.n_eligible == 5 and everything.note == ""
    assert everything.occurrences.tolist() == [0, 1, 2, 2, 0, 3, 0, 2, 0, 2, 0, 0]
    three = TypePlan.from_tokens(ids, None, 12, dim, 3 * per_type + per_type - 1)
    assert three.kept.tolist() == [2, 3, 5]  # 5 first (3 occurrences), then the ties 2, 3 by id
    assert "3 most frequent of the 5 types" in three.note
    masked = TypePlan.from_tokens(ids, ids != 5, 12, dim, math.inf)
    assert 5 not in masked.kept.tolist() and int(masked.occurrences[5]) == 0
    assert TypePlan.from_tokens(ids, None, 12, dim, 0).kept.numel() == 0
    # the planned table is allocated once, at the plan's size, and never grows
    basis = torch.linalg.qr(torch.randn(dim, 1, dtype=torch.float64))[0]
    accumulator = SiteAccumulator(
        [BasisSet("pca", 1, basis, {})],
        dim=dim,
        n_seq=2,
        n_buckets=1,
        vocab_size=12,
        device=torch.device("cpu"),
        type_plan=three,
    )
    accumulator.add(torch.randn(2, 6, dim), torch.randn(2, 6, dim), ids, torch.ones(2, 6, 1), start=0)
    assert accumulator.types.sum.shape == (3, dim)


def test_a_type_budget_bounds_the_tables_and_changes_no_kept_value():
    """Post hoc with a budget for two types per site: the kept types' statistics equal the unlimited run's (the global mean
    still pools every occurrence), every other type is NaN, and the counts stay complete."""
    model, splits, bases, keys = _small_run()
    common = measure_arguments(splits, keys=keys, bases=bases, objective="clm")
    full = measure_checkpoint(model, **common)
    dim, n_kept = 32, 4
    limited = measure_checkpoint(model, **common, type_budget_bytes=len(keys) * n_kept * (dim + 3) * 8)
    for layer in keys:
        a, b = full[layer], limited[layer]
        np.testing.assert_array_equal(a.type_count, b.type_count)
        eligible = np.flatnonzero(a.type_count >= 2)
        assert len(eligible) > n_kept
        kept = np.flatnonzero(np.isfinite(b.type_rms_distance))
        order = sorted(eligible, key=lambda t: (-a.type_count[t], t))
        assert kept.tolist() == sorted(order[:n_kept])
        for name in ("type_rms_distance", "type_mean_distance", "type_mean_norm"):
            np.testing.assert_allclose(getattr(b, name)[kept], getattr(a, name)[kept], rtol=1e-12)
        assert f"{n_kept} most frequent of the {len(eligible)} types" in b.extra["type_statistics_note"]
        assert "type_statistics_note" not in a.extra
    # the frequency analysis says so beside the correlations it computes over the kept types
    protocol = Protocol.model_validate(
        {
            "anistat_protocol": 1,
            "name": "t",
            "models": [{"name": "m", "architecture": "gpt2"}],
            "stats": {"n_bootstrap": 20, "n_permutations": 20},
        }
    )
    counts = {"m": np.arange(1, splits.vocab_size + 1)}
    noted = frequency_rows([limited[0]], counts, protocol)
    row = noted[noted.metric == "spearman_logfreq_distance"].iloc[0]
    assert f"{n_kept} token types" in row.note and "data.type_statistics_memory_mb" in row.note
    plain = frequency_rows([full[0]], counts, protocol)
    assert "type_statistics_memory_mb" not in plain[plain.metric == "spearman_logfreq_distance"].iloc[0].note
    # a budget below one type keeps none: the correlation rows say why they have no estimate
    nothing = measure_checkpoint(model, **common, type_budget_bytes=0)
    assert not np.isfinite(nothing[0].type_rms_distance).any()
    empty = frequency_rows([nothing[0]], counts, protocol)
    row = empty[empty.metric == "spearman_logfreq_distance"].iloc[0]
    assert np.isnan(row.estimate) and "no per-type statistics kept" in row.note
