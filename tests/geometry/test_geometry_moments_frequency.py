"""GradientMoments streaming/merge/persistence; frequency buckets, centroid distances,
log-frequency correlation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from anistat.geometry import (
    GradientMoments,
    centroid_distances,
    frequency_buckets,
    log_frequency_correlation,
)


def test_streaming_equals_batch_and_torch_cov():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((257, 9)) * np.linspace(1, 4, 9) + 2.0
    batch = GradientMoments.from_points(g)
    stream = GradientMoments()
    for chunk in np.array_split(g, 7):
        stream.update(torch.from_numpy(chunk))
    assert stream.count == batch.count == 257
    torch.testing.assert_close(stream.sum, batch.sum, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(stream.outer, batch.outer, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(batch.covariance(), torch.cov(torch.from_numpy(g).T), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(batch.second_moment, torch.from_numpy(g.T @ g), rtol=1e-12, atol=1e-10)
    assert batch.total_energy == pytest.approx(float((g**2).sum()))
    torch.testing.assert_close(batch.mean, torch.from_numpy(g.mean(0)))


def test_merge_and_roundtrip():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 5)), rng.standard_normal((13, 5))
    ma, mb = GradientMoments.from_points(a), GradientMoments.from_points(b)
    both = GradientMoments.from_points(np.vstack([a, b]))
    summed = ma + mb  # pure
    assert ma.count == 40
    merged = GradientMoments().merge(ma).merge(mb)  # in place from empty
    for m in (summed, merged):
        assert m.count == 53
        torch.testing.assert_close(m.outer, both.outer)
        torch.testing.assert_close(m.covariance(), both.covariance())
    d = merged.to_dict()
    assert isinstance(d["outer"], np.ndarray) and d["outer"].dtype == np.float64
    back = GradientMoments.from_dict(d)
    assert back.count == 53 and torch.equal(back.outer, merged.outer) and torch.equal(back.sum, merged.sum)
    with pytest.raises(ValueError):
        ma.merge(GradientMoments.from_points(np.ones((2, 4))))
    with pytest.raises(ValueError):
        GradientMoments.from_points(np.ones((1, 3))).covariance()


def test_frequency_buckets_quantiles_ties_and_zeros():
    counts = np.array([0, 1, 1, 1, 2, 3, 5, 8, 13, 100, 1000, 0])
    b = frequency_buckets(counts, 3)
    assert b[0] == -1 and b[-1] == -1
    assert len({b[1], b[2], b[3]}) == 1  # ties share a bucket
    seen = counts > 0
    order = np.argsort(counts[seen], kind="stable")
    assert np.all(np.diff(b[seen][order]) >= 0)  # monotone in count
    assert b[10] == 2 and b[1] == 0
    rng = np.random.default_rng(2)
    c = rng.permutation(np.arange(1, 1001))
    bb = frequency_buckets(c, 4)
    assert np.all(np.bincount(bb) == 250)
    # token mass: the top bucket holds few, very frequent types
    bt = frequency_buckets(c, 4, by="tokens")
    assert np.sum(bt == 3) < np.sum(bt == 0)
    mass = np.array([c[bt == j].sum() for j in range(4)]) / c.sum()
    assert np.all(np.abs(mass - 0.25) < 0.01)


def test_centroid_distances_match_bruteforce():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, 200)
    ids[ids == 5] = 4
    ids[0] = 5  # a singleton type
    a = rng.standard_normal((200, 7))
    res = centroid_distances(a, ids)
    assert 5 not in res.token_types
    for t, n, md in zip(res.token_types, res.n_occurrences, res.mean_distance):
        x = a[ids == t]
        assert n == len(x)
        assert md == pytest.approx(np.linalg.norm(x - x.mean(0), axis=1).mean(), rel=1e-12)
    assert res.token_distance.shape == (200,) and res.token_distance[0] == 0.0
    all_types = centroid_distances(a, ids, min_occurrences=1)
    assert 5 in all_types.token_types


def test_log_frequency_correlation_recovers_planted_relation():
    rng = np.random.default_rng(4)
    counts = rng.integers(1, 10_000, 300)
    dist = -0.3 * np.log(counts) + rng.standard_normal(300) * 0.5
    r = log_frequency_correlation(counts, dist)
    assert r.n_types == 300
    assert r.spearman_rho == pytest.approx(stats.spearmanr(np.log(counts), dist).statistic)
    assert r.pearson_r == pytest.approx(stats.pearsonr(np.log(counts), dist).statistic)
    assert r.spearman_rho < -0.35 and r.pearson_p < 1e-10
    r0 = log_frequency_correlation(np.r_[counts[:2], 0], np.r_[dist[:2], 1.0])
    assert r0.n_types == 2 and np.isnan(r0.spearman_rho)
