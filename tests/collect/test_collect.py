"""Collector: hooked gradients are the true ∂L/∂h, and the streamed statistics equal brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import measure_arguments

from anistat.collect import BasisSet, UnitKey, measure_checkpoint, residual_probe
from anistat.collect.collector import model_inputs
from anistat.corpus import load_corpus
from anistat.data import BuiltinTokenizer, make_splits
from anistat.geometry import draw_controls, fit_proxy
from anistat.models import build_builtin_model, lm_loss
from anistat.protocol import DataSpec, ModelSpec


@pytest.fixture(scope="module")
def splits():
    spec = DataSpec(seq_len=16, n_fit_sequences=8, n_test_sequences=7, vocab_size=300)
    corpus = load_corpus(spec)
    return make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=0)


def _model(architecture: str, splits, layers: int = 3):
    spec = ModelSpec(
        name=f"t-{architecture}", architecture=architecture, hidden_size=16, num_layers=layers, num_heads=2
    )
    model = build_builtin_model(spec, splits.vocab_size, 16, seed=0)
    return model.eval(), ("clm" if architecture == "gpt2" else "mlm")


@pytest.mark.parametrize("architecture", ["gpt2", "bert"])
def test_hooked_gradient_equals_autograd(architecture, splits):
    model, objective = _model(architecture, splits)
    inputs, labels = model_inputs(splits.test, splits, objective, 0.15, 0, "test")
    # reference: autograd.grad of the loss w.r.t. the hidden states the model returns
    outputs = model(input_ids=inputs, output_hidden_states=True)
    logits = outputs.logits
    shifted = (logits[:, :-1], labels[:, 1:]) if objective == "clm" else (logits, labels)
    token_loss = torch.nn.functional.cross_entropy(
        shifted[0].reshape(-1, logits.shape[-1]), shifted[1].reshape(-1), ignore_index=-100, reduction="none"
    ).view(shifted[1].shape)
    loss = (token_loss.sum(1) / (shifted[1] != -100).sum(1)).sum()
    # GPT-2's last hidden state has ln_f applied, so compare the blocks whose output is returned as is
    layers = [0, 1] if objective == "clm" else [0, 1, 2]
    reference = torch.autograd.grad(loss, [outputs.hidden_states[layer + 1] for layer in layers])
    with residual_probe(model, layers, gradients=True) as record:
        hooked_loss = lm_loss(model, inputs, labels, objective, "per_sequence_mean")
        hooked = torch.autograd.grad(hooked_loss, [record.deltas[layer] for layer in layers])
    assert torch.allclose(hooked_loss, loss, atol=1e-5)
    for ref, got in zip(reference, hooked):
        assert got.abs().max() > 0
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    # parameter gradients are never required post hoc
    assert all(p.grad is None for p in model.parameters())


def test_probe_removes_hooks(splits):
    model, _ = _model("gpt2", splits)
    with residual_probe(model, [0], gradients=True):
        pass
    assert all(not block._forward_hooks for block in model.transformer.h)


@pytest.mark.parametrize("architecture", ["gpt2", "bert"])
def test_streamed_energies_equal_brute_force(architecture, splits):
    model, objective = _model(architecture, splits, layers=2)
    dim, rank, layer = 16, 3, 1
    proxy = fit_proxy(torch.randn(200, dim, generator=torch.Generator().manual_seed(0)), "pca", rank, seed=0)
    controls = {"normal": draw_controls("normal", proxy.basis, 5, seed=1)}
    bases = {layer: [BasisSet("pca", rank, proxy.basis, controls)]}
    key = UnitKey("m", objective, "c", 0, "early", layer, f"residual.{layer}")
    common = dict(keys={layer: key}, bases=bases, objective=objective)
    artifact = measure_checkpoint(model, **measure_arguments(splits, batch_size=3, **common))[layer]
    again = measure_checkpoint(model, **measure_arguments(splits, batch_size=7, **common))[layer]
    # batching changes only float32 rounding of the per-batch products (sums are float64)
    np.testing.assert_allclose(artifact.energy, again.energy, rtol=1e-6)

    inputs, labels = model_inputs(splits.test, splits, objective, 0.15, 0, "test")
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    with residual_probe(model, [layer], gradients=True) as record:
        gradient = torch.autograd.grad(lm_loss(model, inputs, labels, objective), record.deltas[layer])[0].double()
    used = 15 if objective == "clm" else 16
    gradient = gradient[:, :used]
    # evaluated tokens are the rows with a non-zero gradient (after an encoder's last block only
    # masked positions carry one)
    nonzero = gradient.norm(dim=-1) > 0
    assert artifact.n_tokens.tolist() == nonzero.sum(dim=1).tolist()
    if objective == "clm":
        assert nonzero.all()
    for s in range(gradient.shape[0]):
        g = gradient[s]
        np.testing.assert_allclose(artifact.total_energy[s, 0], g.square().sum().item(), rtol=1e-6)
        expected = [(g @ proxy.basis.double()).square().sum().item()]
        expected += [(g @ q.double()).square().sum().item() for q in controls["normal"]]
        np.testing.assert_allclose(artifact.energy[s, 0], expected, rtol=1e-6)
    flat = gradient.reshape(-1, dim)[nonzero.reshape(-1)]
    reference = (flat.T @ flat).numpy()
    # float32 per-batch products: each entry within 1e-6 of the scale sqrt(M_ii M_jj) it is
    # a sum of products at (entries near zero by cancellation have no relative precision)
    scale = np.sqrt(np.outer(np.diag(reference), np.diag(reference)))
    assert np.max(np.abs(artifact.gradient_moments["outer"] - reference) / scale) < 1e-6
    assert artifact.gradient_moments["count"] == flat.shape[0]


def test_nan_gradients_fail_the_unit_not_the_run(splits):
    model, objective = _model("gpt2", splits, layers=2)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.fill_(float("nan"))
    proxy = fit_proxy(torch.randn(100, 16, generator=torch.Generator().manual_seed(0)), "pca", 2, seed=0)
    bases = {
        layer: [BasisSet("pca", 2, proxy.basis, {"haar": draw_controls("haar", proxy.basis, 3, seed=1)})]
        for layer in (0, 1)
    }
    keys = {layer: UnitKey("m", objective, "c", 0, "early", layer, f"residual.{layer}") for layer in (0, 1)}
    artifacts = measure_checkpoint(model, **measure_arguments(splits, keys=keys, bases=bases, objective=objective))
    assert all(a.status == "failed" for a in artifacts.values())
    assert "non-finite" in artifacts[1].note
