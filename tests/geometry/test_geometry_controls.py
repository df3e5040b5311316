"""Controls: orthonormality, geometry of each kind, determinism, device independence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anistat.geometry import CONTROL_KINDS, complement_basis, draw_controls, fit_proxy, principal_subspace


def _setup(d=24, k=3, n_act=200, seed=0):
    rng = np.random.default_rng(seed)
    acts = rng.standard_normal((n_act, d)) * np.geomspace(10, 0.1, d) + 1.0
    u = fit_proxy(acts, "pca", k).basis
    return acts, u


@pytest.mark.parametrize("kind", CONTROL_KINDS)
def test_controls_orthonormal_shaped_and_deterministic(kind):
    acts, u = _setup()
    q = draw_controls(kind, u, 16, seed=5, activations=acts)
    assert q.shape == (16, 24, 3) and q.dtype == torch.float64
    eye = torch.eye(3, dtype=torch.float64)
    assert torch.allclose(q.transpose(1, 2) @ q, eye.expand(16, 3, 3), atol=1e-12)
    assert torch.equal(q, draw_controls(kind, u, 16, seed=5, activations=acts))
    assert not torch.equal(q, draw_controls(kind, u, 16, seed=6, activations=acts))
    # the first draws do not depend on how many are drawn, nor on the global RNG state
    torch.manual_seed(123)
    q4 = draw_controls(kind, u, 4, seed=5, activations=acts)
    torch.testing.assert_close(q4, q[:4], rtol=0, atol=1e-12)


def test_normal_controls_orthogonal_to_proxy():
    acts, u = _setup()
    q = draw_controls("normal", u, 50, seed=1)
    assert float((u.T @ q).abs().max()) < 1e-13
    with pytest.raises(ValueError):
        draw_controls("normal", np.eye(5)[:, :3], 2, seed=0)  # 2k > d


def test_pca_span_inside_principal_subspace():
    acts, u = _setup()
    q = draw_controls("pca_span", u, 30, seed=2, activations=acts, pca_span_dim=7)
    # reference principal subspace from numpy
    _, _, vt = np.linalg.svd(acts - acts.mean(0), full_matrices=False)
    v = torch.from_numpy(vt[:7].T)
    resid = q - v @ (v.T @ q)
    assert float(resid.abs().max()) < 1e-10
    torch.testing.assert_close(principal_subspace(acts, 7) @ principal_subspace(acts, 7).T, v @ v.T, rtol=0, atol=1e-10)
    # default m = min(4k, d)
    q_default = draw_controls("pca_span", u, 5, seed=2, activations=acts)
    v12 = principal_subspace(acts, 12)
    assert float((q_default - v12 @ (v12.T @ q_default)).abs().max()) < 1e-10
    for bad in (3, 2):
        with pytest.raises(ValueError):
            draw_controls("pca_span", u, 2, seed=0, activations=acts, pca_span_dim=bad)
    with pytest.raises(ValueError):
        draw_controls("pca_span", u, 2, seed=0)  # activations missing


def test_cov_matched_follows_activation_covariance():
    rng = np.random.default_rng(3)
    d = 10
    acts = rng.standard_normal((5000, d)) * np.array([20.0] + [0.5] * (d - 1))
    u = np.eye(d)[:, :1]
    q = draw_controls("cov_matched", u, 500, seed=0, activations=acts)
    # directions concentrate on the dominant activation axis
    assert float((q[:, 0, 0] ** 2).mean()) > 0.8
    with pytest.raises(ValueError):
        draw_controls("cov_matched", np.eye(d)[:, :4], 2, seed=0, activations=acts[:3])  # rank 2 < k


def test_haar_controls_are_sign_fixed_haar():
    # first coordinate of a Haar unit vector (k = 1) is symmetric: plain QR would bias its sign
    q = draw_controls("haar", np.eye(6)[:, :1], 4000, seed=11)
    assert abs(float(q[:, 0, 0].mean())) < 4 * np.sqrt(1 / 6 / 4000)
    assert abs(float((q[:, 0, 0] ** 2).mean()) - 1 / 6) < 0.01


def test_draws_identical_across_dtypes_and_devices():
    acts, u = _setup()
    for kind in ("haar", "normal"):
        q64 = draw_controls(kind, u.double(), 8, seed=3, activations=acts)
        q32 = draw_controls(kind, u.float(), 8, seed=3, activations=acts)
        assert q32.dtype == torch.float32
        torch.testing.assert_close(q32.double(), q64, rtol=0, atol=1e-6)
        if torch.cuda.is_available():
            qg = draw_controls(kind, u.double().cuda(), 8, seed=3, activations=acts)
            assert qg.device.type == "cuda"
            torch.testing.assert_close(qg.cpu(), q64, rtol=0, atol=1e-10)


def test_complement_basis():
    u = torch.linalg.qr(torch.randn(9, 3, dtype=torch.float64))[0]
    w = complement_basis(u)
    assert w.shape == (9, 6)
    full = torch.cat([u, w], 1)
    torch.testing.assert_close(full.T @ full, torch.eye(9, dtype=torch.float64))


def test_bad_inputs():
    with pytest.raises(ValueError):
        draw_controls("gaussian", np.eye(4)[:, :1], 2, seed=0)
    with pytest.raises(ValueError):
        draw_controls("haar", np.eye(4)[:, :1], 0, seed=0)
    with pytest.raises(ValueError):
        draw_controls("haar", np.eye(4), 2, seed=0)  # k = d


def test_complement_subspaces_and_their_traces_match_a_direct_float64_computation():
    """The analysis' `normal` controls: orthonormal draws in the proxy's complement, their three
    traces in a matrix, and the second moment's trace from the covariance's plus ‖Qᵀs‖²/N (the
    rank-one identity `control_draws` uses instead of a second d × d product)."""
    from anistat.geometry import complement_subspaces, subspace_traces

    rng = np.random.default_rng(3)
    d, k, n, tokens = 40, 4, 12, 300
    grads = rng.standard_normal((tokens, d)) * np.geomspace(3, 0.2, d) + 0.7
    u = fit_proxy(grads, "pca", k).basis
    q = complement_subspaces(u, n, seed=9)
    assert q.shape == (n, d, k) and q.dtype == torch.float32
    torch.testing.assert_close(q.transpose(1, 2) @ q, torch.eye(k).expand(n, k, k), rtol=0, atol=1e-5)
    assert float((torch.as_tensor(u, dtype=torch.float32).T @ q).abs().max()) < 1e-5
    assert torch.equal(q, complement_subspaces(u, n, seed=9))
    outer = grads.T @ grads
    total = grads.sum(0)
    cov = (outer - np.outer(total, total) / tokens) / (tokens - 1)
    q64 = q.double().numpy()
    traces = subspace_traces(torch.as_tensor(cov), q)
    qcq = np.einsum("ndk,de,nel->nkl", q64, cov, q64)
    np.testing.assert_allclose(traces.trace, np.einsum("nkk->n", qcq), rtol=1e-5)
    np.testing.assert_allclose(traces.trace_squared, (np.einsum("de,nek->ndk", cov, q64) ** 2).sum((1, 2)), rtol=1e-5)
    np.testing.assert_allclose(traces.frobenius, (qcq**2).sum((1, 2)), rtol=1e-5)
    along_sum = (np.einsum("ndk,d->nk", q64, total) ** 2).sum(1)
    np.testing.assert_allclose(
        (tokens - 1) * traces.trace + along_sum / tokens, np.einsum("ndk,de,nek->n", q64, outer, q64), rtol=1e-5
    )
