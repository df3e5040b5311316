"""Sites across architecture families: one naming scheme, and the probed gradient at every site
kind is exactly `torch.autograd.grad` of the model's own loss w.r.t. the tensor it consumes.

Tiny random models of each family are built from their transformers config classes and
`save_pretrained` to a temporary directory, then loaded back the way a protocol's local source
loads them — nothing is downloaded."""

from __future__ import annotations

import pytest
import torch

from anistat.collect import list_sites, probe, resolve_site, sites_from_spec
from anistat.errors import AnistatInputError
from anistat.models import _load_pretrained, lm_loss
from anistat.protocol import ModelSpec, SiteSpec

VOCAB = 40


def _config(family: str):
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    if family == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB,
            n_positions=32,
            n_embd=16,
            n_layer=2,
            n_head=2,
            n_inner=32,
            bos_token_id=None,
            eos_token_id=None,
        ), tf.GPT2LMHeadModel
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(**common, bos_token_id=None, eos_token_id=None), tf.GPTNeoXForCausalLM
    if family == "llama":
        return tf.LlamaConfig(
            **common, num_key_value_heads=1, bos_token_id=None, eos_token_id=None, pad_token_id=None
        ), tf.LlamaForCausalLM
    if family == "olmo":
        return tf.OlmoConfig(**common, pad_token_id=0, bos_token_id=None, eos_token_id=None), tf.OlmoForCausalLM
    if family == "bert":
        return tf.BertConfig(**common, pad_token_id=0), tf.BertForMaskedLM
    if family == "modernbert":
        return tf.ModernBertConfig(
            **common,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            sep_token_id=2,
            cls_token_id=1,
            global_attn_every_n_layers=1,
            local_attention=8,
        ), tf.ModernBertForMaskedLM
    raise ValueError(family)


FAMILIES = ["gpt2", "gpt_neox", "llama", "olmo", "bert", "modernbert"]


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    paths = {}
    for family in FAMILIES:
        torch.manual_seed(0)
        config, cls = _config(family)
        model = cls(config)
        path = root / family
        model.save_pretrained(path)
        paths[family] = path
    return paths


def _load(path, family):
    spec = ModelSpec(name=family, source="local", path=str(path))
    model, objective = _load_pretrained(str(path), None, None, spec, True)
    return model, objective


def _batch(objective: str):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (3, 10), generator=generator)
    if objective == "clm":
        return tokens, tokens
    labels = torch.full_like(tokens, -100)
    labels[:, ::3] = tokens[:, ::3]
    inputs = tokens.clone()
    inputs[:, ::3] = 3  # a "mask" id
    return inputs, labels


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_gradient_equals_autograd_at_every_site_kind(family, saved_models):
    model, objective = _load(saved_models[family], family)
    assert objective == ("mlm" if family in ("bert", "modernbert") else "clm")
    names = [s.name for s in list_sites(model)]
    assert names[0] == "embed" and "residual.1" in names and "attn.0" in names and "mlp.1" in names
    inputs, labels = _batch(objective)
    sites = {
        name: resolve_site(model, name)
        for name in ("embed", "attn.0", "mlp.0", "residual.0", "attn.1", "mlp.1", "residual.1")
    }

    # reference: capture the very tensors the model consumes, then autograd.grad w.r.t. them
    captured, handles = {}, []
    modules = dict(model.named_modules())
    for name, site in sites.items():
        if site.hook == "input":
            handles.append(
                modules[site.module].register_forward_pre_hook(
                    lambda m, args, kwargs, name=name: captured.__setitem__(name, args[0]), with_kwargs=True
                )
            )
        else:
            handles.append(
                modules[site.module].register_forward_hook(
                    lambda m, i, out, name=name: captured.__setitem__(name, out if torch.is_tensor(out) else out[0])
                )
            )
    loss = lm_loss(model, inputs, labels, objective)
    reference = dict(zip(captured, torch.autograd.grad(loss, list(captured.values()))))
    for handle in handles:
        handle.remove()

    for parameter in model.parameters():
        parameter.requires_grad_(False)  # the probe needs no parameter gradients
    with probe(model, sites, gradients=True) as record:
        hooked_loss = lm_loss(model, inputs, labels, objective)
        hooked = dict(zip(sites, torch.autograd.grad(hooked_loss, [record.deltas[n] for n in sites])))
    torch.testing.assert_close(hooked_loss, loss, rtol=0, atol=1e-6)
    for name in sites:
        assert hooked[name].abs().max() > 0, name
        torch.testing.assert_close(hooked[name], reference[name], rtol=1e-5, atol=1e-7, msg=name)
        torch.testing.assert_close(record.activations[name], captured[name].detach(), msg=name)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_sites_from_spec_kinds_layers_names_and_modules(saved_models):
    model, _ = _load(saved_models["gpt2"], "gpt2")
    picked = sites_from_spec(model, SiteSpec(kind=["embed", "mlp", "residual"], layers=[-1]), "m")
    assert [s.name for s in picked] == ["embed", "mlp.1", "residual.1"]
    assert [s.layer for s in picked] == [-1, 1, 1]
    modules = sites_from_spec(model, SiteSpec(kind="module", modules=["transformer.h.*.mlp.c_proj"]), "m")
    assert [s.name for s in modules] == ["module:transformer.h.0.mlp.c_proj", "module:transformer.h.1.mlp.c_proj"]
    assert [s.layer for s in modules] == [0, 1]
    named = sites_from_spec(model, SiteSpec(names=["attn.0", "module:transformer.ln_f"]), "m")
    assert [s.name for s in named] == ["attn.0", "module:transformer.ln_f"]
    bert, _ = _load(saved_models["bert"], "bert")
    assert resolve_site(bert, "attn.1").module == "bert.encoder.layer.1.attention.output.dense"
    assert resolve_site(bert, "mlp.0").module == "bert.encoder.layer.0.output.dense"


@pytest.mark.parametrize(
    "name, message",
    [
        ("residual.7", "has 2 blocks"),
        ("attention.0", "unknown site name"),
        ("module:nope", "no module named"),
    ],
)
def test_unknown_sites_are_user_errors(name, message, saved_models):
    model, _ = _load(saved_models["llama"], "llama")
    with pytest.raises(AnistatInputError, match=message):
        resolve_site(model, name)
    with pytest.raises(AnistatInputError, match="matches"):
        sites_from_spec(model, SiteSpec(kind="module", modules=["model.nothing.*"]), "m")


def test_sites_command_lists_sites(saved_models, capsys):
    from anistat.cli import main

    assert main(["sites", str(saved_models["gpt_neox"])]) == 0
    out = capsys.readouterr().out
    assert "residual.1" in out and "gpt_neox.layers.0.attention" in out and "embed" in out
    assert main(["sites", "builtin:bert", "--modules"]) == 0
    assert "module:bert.encoder.layer.0.output.dense" in capsys.readouterr().out
    assert main(["sites", "no-such-model-dir-or-id"]) == 2
    assert "cannot be loaded" in capsys.readouterr().err
