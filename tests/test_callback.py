"""Measuring inside someone else's training: the Trainer callback and the plain-PyTorch meter
piggyback on the training step's own backward and write a bundle `anistat report` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from anistat.callbacks import AnistatCallback, TrainingMeter
from anistat.finalize import finalize_bundle, load_units
from anistat.errors import AnistatInputError

SETTINGS = dict(sites={"kind": ["residual", "mlp"], "layers": [0]}, proxies={"ranks": [2], "max_fit_tokens": 80},
                controls={"kinds": ["normal"], "n": 4}, stats={"n_bootstrap": 20, "n_permutations": 20})


def _tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=48, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config)


def _batches(n: int, batch: int = 4, length: int = 12):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 48, (batch, length), generator=generator) for _ in range(n)]


def test_plain_meter_piggybacks_on_the_training_backward(tmp_path: Path):
    model = _tiny_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(5)
    meter = TrainingMeter(model, out=tmp_path / "bundle", fit_steps=[0, 1], measure_steps=[1, 3], window=2,
                          name="plain", **SETTINGS)
    forwards = {"n": 0}
    model.register_forward_pre_hook(lambda *a: forwards.__setitem__("n", forwards["n"] + 1))
    expected = {}
    for step, batch in enumerate(batches):
        if step in (1, 2):  # reference ∂L/∂h for the first unit, taken independently
            reference = model.transformer.h[0]
            captured = {}
            handle = reference.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
            loss = model(input_ids=batch, labels=batch).loss
            expected[step] = torch.autograd.grad(loss, captured["h"])[0].double()[:, :-1]
            handle.remove()
            forwards["n"] -= 1
        with meter.step(step):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    assert forwards["n"] == len(batches)  # one forward per step: no extra pass
    result = meter.close()
    units = {(a.key.checkpoint, a.key.site): a for a in meter.artifacts}
    assert sorted(units) == [("step1", "mlp.0"), ("step1", "residual.0"), ("step3", "mlp.0"), ("step3", "residual.0")]
    first = units[("step1", "residual.0")]
    assert first.n_tokens.tolist() == [11] * 8  # two steps × 4 sequences, CLM positions 0..T−2
    gradients = torch.cat([expected[1], expected[2]])
    np.testing.assert_allclose(first.total_energy.sum(1), gradients.square().sum((1, 2)).numpy(), rtol=1e-6)
    assert first.key.phase == "early" and units[("step3", "mlp.0")].key.phase == "late"
    assert (result.results["status"] == "ok").all()
    # the units on disk rebuild the same bundle
    assert len(load_units(tmp_path / "bundle.units")) == 4
    again = finalize_bundle(tmp_path / "bundle.units", meter.protocol, tmp_path / "again").results
    columns = ["checkpoint", "site", "rank", "proxy", "control", "metric"]
    ordered = [frame.sort_values(columns).reset_index(drop=True) for frame in (again, result.results)]
    np.testing.assert_allclose(ordered[0]["estimate"], ordered[1]["estimate"], rtol=1e-12)
    assert all(not m._forward_hooks for m in model.transformer.h.modules())


def test_meter_refuses_measuring_before_fitting(tmp_path: Path):
    with pytest.raises(AnistatInputError, match="frozen"):
        TrainingMeter(_tiny_gpt2(), out=tmp_path / "x", fit_steps=[5], measure_steps=[2], **SETTINGS)


def test_trainer_callback_writes_a_bundle_that_report_accepts(tmp_path: Path):
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from transformers import Trainer, TrainingArguments

    from anistat.cli import main

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = torch.cat(_batches(6))

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, index):
            return {"input_ids": self.rows[index], "labels": self.rows[index]}

    callback = AnistatCallback(out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 2, 4], name="trained",
                               **SETTINGS)
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=4, max_steps=5,
                             gradient_accumulation_steps=2, learning_rate=1e-2, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                             seed=0)
    trainer = Trainer(model=_tiny_gpt2(), args=args, train_dataset=Tokens(), callbacks=[callback])
    trainer.train()
    artifacts = callback.meter.artifacts
    assert sorted({a.key.checkpoint for a in artifacts}) == ["step0", "step2", "step4"]
    assert all(a.n_tokens.shape[0] == 8 for a in artifacts)  # 2 micro-batches × 4 sequences per step
    assert all(a.status == "ok" for a in artifacts)
    bundle = tmp_path / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["models"]["trained"]["source"] == "external"
    assert main(["report", str(bundle), "--no-pdf"]) == 0
    assert main(["verify", str(bundle)]) == 0
    assert (bundle / "report.html").is_file()
