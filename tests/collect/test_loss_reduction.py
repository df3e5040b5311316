"""The measured loss is the model's own loss: `lm_loss` reductions against the transformers
models' own `.loss` (autograd of the plain training loss) and against each other in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import measure_arguments

from anistat.collect import BasisSet, UnitKey, measure_checkpoint
from anistat.collect.collector import model_inputs
from anistat.corpus import load_corpus
from anistat.data import BuiltinTokenizer, make_splits
from anistat.geometry import draw_controls, fit_proxy
from anistat.models import build_builtin_model, count_targets, lm_loss
from anistat.protocol import DataSpec, ModelSpec, parse_protocol


@pytest.fixture(scope="module")
def splits():
    spec = DataSpec(seq_len=16, n_fit_sequences=8, n_test_sequences=6, vocab_size=300)
    corpus = load_corpus(spec)
    return make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=0)


def _model(architecture, splits):
    spec = ModelSpec(name=f"t-{architecture}", architecture=architecture, hidden_size=16, num_layers=2, num_heads=2)
    return build_builtin_model(spec, splits.vocab_size, 16, seed=0).eval()


def _mlm_batch(splits):
    inputs, labels = model_inputs(splits.test, splits, "mlm", 0.3, 0, "test")
    counts = count_targets(labels, "mlm")
    assert len(set(counts.tolist())) > 1  # sequences differ in their number of masked tokens
    return inputs, labels, counts


def _parameter_gradient(model, loss):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def test_global_mean_is_the_training_loss_gradient(splits):
    """global_mean = n_seq × transformers' own MLM loss (mean over all masked targets)."""
    model = _model("bert", splits)
    inputs, labels, counts = _mlm_batch(splits)
    n_seq = inputs.shape[0]
    own = model(input_ids=inputs, labels=labels).loss  # BertForMaskedLM: CE mean over targets
    ours = lm_loss(model, inputs, labels, "mlm", "global_mean", float(counts.sum()) / n_seq)
    torch.testing.assert_close(ours, n_seq * own, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        _parameter_gradient(model, ours), n_seq * _parameter_gradient(model, own), rtol=1e-4, atol=1e-6
    )


def test_global_mean_is_batch_independent(splits):
    """With the split-wide normaliser, batch gradients add up to the whole split's gradient."""
    model = _model("bert", splits)
    inputs, labels, counts = _mlm_batch(splits)
    m_bar = float(counts.sum()) / inputs.shape[0]
    whole = _parameter_gradient(model, lm_loss(model, inputs, labels, "mlm", "global_mean", m_bar))
    parts = sum(
        _parameter_gradient(model, lm_loss(model, inputs[a:b], labels[a:b], "mlm", "global_mean", m_bar))
        for a, b in ((0, 1), (1, 4), (4, 6))
    )
    torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-6)


def test_per_sequence_mean_is_a_sum_of_single_sequence_losses(splits):
    model = _model("bert", splits)
    inputs, labels, _ = _mlm_batch(splits)
    ours = lm_loss(model, inputs, labels, "mlm", "per_sequence_mean")
    own = sum(model(input_ids=inputs[s : s + 1], labels=labels[s : s + 1]).loss for s in range(inputs.shape[0]))
    torch.testing.assert_close(ours, own, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(_parameter_gradient(model, ours), _parameter_gradient(model, own), rtol=1e-4, atol=1e-6)


def test_clm_reductions_coincide_with_the_training_loss(splits):
    model = _model("gpt2", splits)
    tokens = splits.test
    own = model(input_ids=tokens, labels=tokens).loss  # GPT2LMHeadModel shifts labels inside
    n_seq, seq_len = tokens.shape
    global_mean = lm_loss(model, tokens, tokens, "clm", "global_mean", seq_len - 1)
    per_sequence = lm_loss(model, tokens, tokens, "clm", "per_sequence_mean")
    torch.testing.assert_close(global_mean, n_seq * own, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(per_sequence, global_mean, rtol=1e-6, atol=1e-6)
    assert count_targets(tokens, "clm").tolist() == [seq_len - 1] * n_seq


def test_unknown_reduction_is_refused(splits):
    model = _model("gpt2", splits)
    with pytest.raises(ValueError, match="reduction"):
        lm_loss(model, splits.test, splits.test, "clm", "mean")


def test_measured_energies_reweight_by_masked_tokens(splits):
    """Closed form: a sequence's hidden-state gradient is its own loss's, so switching from
    per-sequence means to the global normaliser scales it by m_s / m̄ and its energies (total
    and in every basis) by (m_s / m̄)²."""
    model = _model("bert", splits)
    dim, rank, layer = 16, 3, 0
    proxy = fit_proxy(torch.randn(200, dim, generator=torch.Generator().manual_seed(0)), "pca", rank, seed=0)
    bases = {layer: [BasisSet("pca", rank, proxy.basis, {"haar": draw_controls("haar", proxy.basis, 4, seed=1)})]}
    key = UnitKey("m", "mlm", "c", 0, "early", layer, f"residual.{layer}")
    common = measure_arguments(splits, keys={layer: key}, bases=bases, objective="mlm", mlm_probability=0.3)
    per_sequence = measure_checkpoint(model, loss_reduction="per_sequence_mean", **common)[layer]
    global_mean = measure_checkpoint(model, loss_reduction="global_mean", **common)[layer]
    _, labels = model_inputs(splits.test, splits, "mlm", 0.3, 0, "test")
    m = count_targets(labels, "mlm").double().numpy()
    weight = (m / m.mean()) ** 2
    np.testing.assert_allclose(global_mean.total_energy[:, 0], per_sequence.total_energy[:, 0] * weight, rtol=1e-5)
    np.testing.assert_allclose(global_mean.energy[:, 0], per_sequence.energy[:, 0] * weight[:, None], rtol=1e-5)
    assert not np.allclose(weight, 1.0)


def test_protocol_field_defaults_to_the_objectives_own_reduction():
    base = {"name": "p", "models": [{"name": "m", "architecture": "bert"}]}
    assert parse_protocol(base).data.loss_reduction == "global_mean"
    chosen = parse_protocol({**base, "data": {"loss_reduction": "per_sequence_mean"}})
    assert chosen.data.loss_reduction == "per_sequence_mean"
