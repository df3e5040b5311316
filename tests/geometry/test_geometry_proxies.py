"""Proxies: planted-subspace recovery, semi-NMF properties, determinism, registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anistat.geometry import (
    PROXY_METHODS,
    Proxy,
    ProxyMethod,
    fit_proxy,
    project,
    register_proxy,
    top_activating,
)


def _planted(n=400, d=40, k=3, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    b, _ = np.linalg.qr(rng.standard_normal((d, k)))
    codes = rng.exponential(1.0, (n, k))  # non-negative, non-degenerate covariance
    a = codes @ b.T + noise * rng.standard_normal((n, d))
    return a, b


def _max_sin_angle(b_true, basis):
    u = np.asarray(basis, dtype=np.float64)
    return np.linalg.norm(u - b_true @ (b_true.T @ u), ord=2)  # sin of largest principal angle


def _orthonormal(basis, tol=1e-5):
    b = basis.double()
    return torch.allclose(b.T @ b, torch.eye(b.shape[1], dtype=torch.float64), atol=tol)


@pytest.mark.parametrize("method", ["pca", "semi_nmf", "ica"])
def test_planted_subspace_is_recovered(method):
    a, b = _planted()
    p = fit_proxy(a, method, 3, seed=1)
    assert isinstance(p, Proxy) and p.basis.shape == (40, 3) and p.rank == 3
    assert _orthonormal(p.basis)
    assert _max_sin_angle(b, p.basis) < 0.05
    assert 0 <= p.reconstruction_error < 0.5


def test_nmf_recovers_nonnegative_planted_dictionary():
    rng = np.random.default_rng(3)
    d, k = 30, 3
    h = rng.exponential(1.0, (k, d)) * (rng.random((k, d)) < 0.4)
    w = rng.exponential(1.0, (500, k))
    a = w @ h
    b, _ = np.linalg.qr(h.T)
    p = fit_proxy(a, "nmf", k, seed=0, max_iter=2000, tol=1e-10)
    assert _max_sin_angle(b, p.basis) < 0.05
    obj = np.array(p.info["objective"])
    assert np.all(np.diff(obj) <= 1e-9 * obj[0])


def test_ica_spans_pca_subspace_and_unmixes_sources():
    rng = np.random.default_rng(4)
    n, d = 3000, 10
    s = np.stack([rng.laplace(size=n), rng.uniform(-1.7, 1.7, n)], 1)
    mixing = rng.standard_normal((2, d))
    a = s @ mixing + 0.01 * rng.standard_normal((n, d))
    pca = fit_proxy(a, "pca", 2)
    ica = fit_proxy(a, "ica", 2, seed=3)
    pp = pca.basis.double() @ pca.basis.double().T
    pi = ica.basis.double() @ ica.basis.double().T
    assert torch.allclose(pp, pi, atol=1e-8)
    est = (a - a.mean(0)) @ ica.info["unmixing"]
    corr = np.abs(np.corrcoef(est.T, s.T)[:2, 2:])
    assert np.all(corr.max(axis=1) > 0.98)


def test_semi_nmf_objective_monotone_codes_nonnegative_deterministic():
    a, _ = _planted(n=300, d=25, k=4, noise=0.2, seed=5)
    a = a - 0.3  # some negative entries: genuinely semi-NMF
    p1 = fit_proxy(a, "semi_nmf", 4, seed=7, max_iter=300)
    obj = np.array(p1.info["objective"])
    assert len(obj) > 2
    assert np.all(np.diff(obj) <= 1e-10 * obj[0]), np.diff(obj).max()
    assert obj[-1] < obj[0]
    assert p1.info["codes_nonnegative"]
    p2 = fit_proxy(a, "semi_nmf", 4, seed=7, max_iter=300)
    assert torch.equal(p1.basis, p2.basis)
    p3 = fit_proxy(a, "semi_nmf", 4, seed=8, max_iter=300)
    assert not torch.equal(p1.basis, p3.basis)
    assert p1.reconstruction_error == pytest.approx(np.sqrt(obj[-1] / (a**2).sum()), rel=1e-9)


@pytest.mark.parametrize("method", sorted(PROXY_METHODS))
def test_every_method_deterministic_orthonormal_and_handles_few_samples(method):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((12, 50)) + rng.exponential(1.0, (12, 1))  # n_samples < d
    for k in (3, 11, 20):  # 20 > n_samples: completed with seeded random directions
        p1 = fit_proxy(a, method, k, seed=2)
        p2 = fit_proxy(torch.from_numpy(a), method, k, seed=2)
        assert p1.basis.shape == (50, k)
        assert torch.allclose(p1.basis, p2.basis, atol=1e-12)
        assert _orthonormal(p1.basis, tol=1e-9)
        assert np.isfinite(p1.reconstruction_error)
    # dtype: float64 in → float64 out; float32 in → float32; half → float32
    assert fit_proxy(a, method, 2).basis.dtype == torch.float64
    assert fit_proxy(a.astype(np.float32), method, 2).basis.dtype == torch.float32
    assert fit_proxy(torch.from_numpy(a).half(), method, 2).basis.dtype == torch.float32


def test_pca_with_fewer_samples_completes_null_directions():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((5, 30))
    p = fit_proxy(a, "pca", 8)
    assert p.info["completed_dims"] == 4  # centred data has rank 4
    assert p.reconstruction_error == pytest.approx(0.0, abs=1e-9)


def test_rank_validation_and_unknown_method():
    a = np.random.default_rng(0).standard_normal((20, 6))
    for bad in (0, 6, 7, -1, 2.5):
        with pytest.raises(ValueError):
            fit_proxy(a, "pca", bad)
    with pytest.raises(ValueError):
        fit_proxy(a, "nope", 2)
    with pytest.raises(ValueError):
        fit_proxy(a, "pca", 2, bogus_option=1)


def test_register_new_proxy_plugs_in():
    name = "first_axes_for_test"

    @register_proxy(name)
    class FirstAxes(ProxyMethod):
        def fit(self, x, rank, seed):
            return torch.eye(x.shape[1], rank, dtype=torch.float64), 0.5, {"hello": 1}

    try:
        p = fit_proxy(np.ones((4, 5)), name, 2)
        assert p.method == name and p.info["hello"] == 1
        assert torch.equal(p.basis, torch.eye(5, 2, dtype=torch.float64))
        with pytest.raises(ValueError):
            register_proxy(name)(type("Other", (ProxyMethod,), {}))
    finally:
        PROXY_METHODS.pop(name)


def test_random_proxy_is_seeded_haar():
    a = np.zeros((10, 8))
    p1, p2 = fit_proxy(a, "random", 3, seed=1), fit_proxy(a, "random", 3, seed=1)
    assert torch.equal(p1.basis, p2.basis)
    assert not torch.equal(p1.basis, fit_proxy(a, "random", 3, seed=2).basis)


def test_top_activating_and_project():
    scores = torch.tensor([[0.1, -5.0], [3.0, 1.0], [2.0, 1.0], [-4.0, 0.0]])
    idx = top_activating(scores, 2)
    assert idx.tolist() == [[1, 2], [1, 2]]  # tie at 1.0 keeps the lower index first
    assert top_activating(scores, 2, absolute=True).tolist() == [[3, 1], [0, 1]]
    assert top_activating(scores, 10).shape == (2, 4)
    a = np.random.default_rng(0).standard_normal((6, 4))
    b = np.eye(4)[:, :2]
    np.testing.assert_allclose(project(a, b, center=a.mean(0)).numpy(), (a - a.mean(0))[:, :2])
