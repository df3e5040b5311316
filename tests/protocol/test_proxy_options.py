"""Proxy options of issue #15: centring per method (closed forms) and refitting per checkpoint."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from anistat.errors import AnistatInputError
from anistat.geometry import center_default, fit_proxy, proxy_variants
from anistat.protocol import parse_protocol


def _cloud_with_large_mean(n=4000, seed=0):
    """Axis variances 9, 4, 1, 0.25, 0.09, 0.01 and a mean of norm 10 along the last axis."""
    generator = np.random.default_rng(seed)
    sd = np.array([3.0, 2.0, 1.0, 0.5, 0.3, 0.1])
    mean = np.zeros(6)
    mean[5] = 10.0
    return mean + generator.standard_normal((n, 6)) * sd, mean


def _projector(basis: torch.Tensor) -> np.ndarray:
    b = basis.double().numpy()
    return b @ b.T


def _top_eigenvectors(matrix: np.ndarray, k: int) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return vectors[:, np.argsort(values)[::-1][:k]]


def test_centred_pca_spans_the_top_covariance_eigenvectors():
    a, mean = _cloud_with_large_mean()
    proxy = fit_proxy(a, "pca", 2)
    top = _top_eigenvectors(np.cov(a, rowvar=False), 2)
    np.testing.assert_allclose(_projector(proxy.basis), top @ top.T, atol=1e-10)
    # the mean lies (almost) outside the span: its share inside is ~0
    inside = np.sum((proxy.basis.double().numpy().T @ mean) ** 2) / (mean @ mean)
    assert inside < 1e-3
    assert proxy.info["centered"] is True


def test_uncentred_pca_spans_the_top_second_moment_eigenvectors():
    """Closed form: the raw activations' top right singular vectors are the top eigenvectors of
    AᵀA/N = C + μμᵀ; with ‖μ‖² = 100 ≫ 9 the mean direction comes first."""
    a, mean = _cloud_with_large_mean()
    proxy = fit_proxy(a, "pca", 2, center=False)
    top = _top_eigenvectors(a.T @ a / a.shape[0], 2)
    np.testing.assert_allclose(_projector(proxy.basis), top @ top.T, atol=1e-10)
    inside = np.sum((proxy.basis.double().numpy().T @ mean) ** 2) / (mean @ mean)
    assert inside > 0.999
    assert proxy.info["centered"] is False
    # the reconstruction error is of the raw activations: ‖A − A B Bᵀ‖_F / ‖A‖_F
    b = proxy.basis.double().numpy()
    expected = np.linalg.norm(a - a @ b @ b.T) / np.linalg.norm(a)
    assert proxy.reconstruction_error == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("method", ["semi_nmf", "nmf"])
def test_centring_option_is_fitting_the_centred_activations(method):
    a, _ = _cloud_with_large_mean(n=300)
    centred = fit_proxy(a, method, 2, seed=3, center=True, max_iter=50)
    by_hand = fit_proxy(a - a.mean(0), method, 2, seed=3, center=False, max_iter=50)
    torch.testing.assert_close(centred.basis, by_hand.basis)
    assert centred.info["centered"] is True and by_hand.info["centered"] is False


def test_defaults_and_variant_labels():
    assert (center_default("pca"), center_default("semi_nmf"), center_default("nmf")) == (True, False, False)
    assert center_default("ica") is None and center_default("random") is None
    assert proxy_variants("pca") == [("pca", {"center": True})]
    assert proxy_variants("pca", False) == [("pca@uncentred", {"center": False})]
    assert proxy_variants("semi_nmf", "both") == [
        ("semi_nmf", {"center": False}),
        ("semi_nmf@centred", {"center": True}),
    ]
    assert proxy_variants("ica") == [("ica", {})]
    with pytest.raises(ValueError, match="no centring option"):
        proxy_variants("random", True)


def _protocol(**proxies):
    return {
        "name": "p",
        "models": [{"name": "m", "architecture": "gpt2", "hidden_size": 16}],
        "proxies": {"methods": ["pca", "ica"], "ranks": [2], **proxies},
    }


def test_protocol_checks_center_and_refit():
    spec = parse_protocol(_protocol(center={"pca": "both"}, refit="both")).proxies
    assert spec.center == {"pca": "both"} and spec.refit == "both"
    assert parse_protocol(_protocol()).proxies.refit == "frozen"
    with pytest.raises(AnistatInputError, match="ica.*no centring option"):
        parse_protocol(_protocol(center={"ica": True}))
    with pytest.raises(AnistatInputError, match="not in methods"):
        parse_protocol(_protocol(center={"nmf": True}))
    with pytest.raises(AnistatInputError, match="refit"):
        parse_protocol(_protocol(refit="sometimes"))


REFIT_PROTOCOL = """\
anistat_protocol: 1
name: refit
seed: 3
data: {seq_len: 16, n_fit_sequences: 8, n_test_sequences: 8, vocab_size: 300, batch_size: 8,
       frequency_ci_memory_mb: 0}
models:
  - {name: dec, architecture: gpt2, hidden_size: 16, num_layers: 1, num_heads: 2,
     train: {steps: 6, batch_size: 4, warmup_steps: 1, checkpoints: [0, 3, 6]}}
sites: {layers: [0]}
proxies: {methods: [pca], ranks: [2], max_fit_tokens: 200, concept_card_tokens: 0, refit: both,
          center: {pca: both}}
controls: {kinds: [haar], n: 5}
stats: {n_bootstrap: 20, n_permutations: 20, multiplicity: none}
report: {compile_pdf: false}
"""


@pytest.mark.slow
def test_refit_rows_sit_beside_frozen_ones(tmp_path):
    """At the one checkpoint of the fit window the refitted proxy is fitted on exactly the same
    sample as the frozen one, so their energies coincide; later they differ."""
    from anistat.pipeline import run
    from anistat.protocol import load_protocol

    path = tmp_path / "refit.yaml"
    path.write_text(REFIT_PROTOCOL)
    result = run(load_protocol(path), tmp_path / "bundle")
    fractions = result.results[(result.results.metric == "energy_fraction")]
    assert set(fractions.proxy) == {"pca", "pca@uncentred", "pca@refit", "pca@uncentred@refit"}
    table = fractions.pivot_table(index="checkpoint", columns="proxy", values="estimate")
    for label in ("pca", "pca@uncentred"):
        assert table.loc["step0", label] == pytest.approx(table.loc["step0", f"{label}@refit"], rel=1e-12)
        assert table.loc["step6", label] != pytest.approx(table.loc["step6", f"{label}@refit"], rel=1e-6)
    assert table.loc["step6", "pca"] != pytest.approx(table.loc["step6", "pca@uncentred"], rel=1e-6)
    assert result.manifest["models"]["dec"]["proxy_refit"] == "both"
    assert result.manifest["protocol"]["proxies"]["center"] == {"pca": "both"}


def test_refit_contrast_pairs_frozen_and_refitted_rows():
    from anistat.staleness import refit_contrast

    base = {
        "model": "m",
        "objective": "clm",
        "step": 6,
        "layer": 0,
        "site": "residual.0",
        "rank": 2,
        "control": "haar",
        "metric": "energy_fraction",
        "status": "ok",
    }
    rows = [
        {**base, "checkpoint": "step6", "phase": "late", "proxy": "pca", "estimate": 0.2},
        {**base, "checkpoint": "step6", "phase": "late", "proxy": "pca@refit", "estimate": 0.5},
        {**base, "checkpoint": "step6", "phase": "late", "proxy": "pca@uncentred", "estimate": 0.1},
        {**base, "checkpoint": "step0", "phase": "early", "proxy": "pca", "estimate": 0.4},
        {**base, "checkpoint": "step0", "phase": "early", "proxy": "pca@refit", "estimate": 0.4},
        {**base, "checkpoint": "step6", "phase": "late", "proxy": "pca", "estimate": 9.0, "metric": "energy_ratio"},
    ]
    table = refit_contrast(pd.DataFrame(rows))
    assert len(table) == 1
    row = table.iloc[0]
    assert (row.proxy, row.frozen, row.refit) == ("pca", 0.2, 0.5)
    assert row.difference == pytest.approx(0.3) and row.ratio == pytest.approx(2.5)
    assert len(refit_contrast(pd.DataFrame(rows), phase=None)) == 2
    assert refit_contrast(pd.DataFrame(rows[:1])).empty
