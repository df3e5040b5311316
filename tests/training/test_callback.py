"""Measuring inside someone else's training: the Trainer callback and the plain-PyTorch meter
piggyback on the training step's own backward and write a bundle `anistat report` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import PLAIN_SCHEDULE, SETTINGS, batches, tiny_gpt2, tiny_trainer

from anistat.callbacks import AnistatCallback, TrainingMeter
from anistat.errors import AnistatInputError
from anistat.finalize import finalize_bundle, load_units


@pytest.mark.slow
def test_plain_meter_piggybacks_on_the_training_backward(tmp_path: Path):
    model = tiny_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = batches(5)
    meter = TrainingMeter(
        model,
        out=tmp_path / "bundle",
        **PLAIN_SCHEDULE,
        keep_units=True,
        **SETTINGS,
    )
    forwards = {"n": 0}
    model.register_forward_pre_hook(lambda *a: forwards.__setitem__("n", forwards["n"] + 1))
    expected = {}
    for step, batch in enumerate(steps):
        if step in (1, 2):  # reference ∂L/∂h for the first unit, taken independently
            reference = model.transformer.h[0]
            captured = {}
            handle = reference.register_forward_hook(lambda m, i, o, captured=captured: captured.__setitem__("h", o))
            loss = model(input_ids=batch, labels=batch).loss
            expected[step] = torch.autograd.grad(loss, captured["h"])[0].double()[:, :-1]
            handle.remove()
            forwards["n"] -= 1
        with meter.step(step):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    assert forwards["n"] == len(steps)  # one forward per step: no extra pass
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
        TrainingMeter(tiny_gpt2(), out=tmp_path / "x", fit_steps=[5], measure_steps=[2], **SETTINGS)


@pytest.mark.slow
def test_trainer_callback_writes_a_bundle_that_report_accepts(tmp_path: Path):
    from anistat.cli import main

    callback = AnistatCallback(
        out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 2, 4], name="trained", **SETTINGS
    )
    tiny_trainer(tmp_path, [callback], gradient_accumulation_steps=2).train()
    assert not (tmp_path / "bundle.units").exists()  # cleaned up once the bundle is written
    artifacts = callback.meter.artifacts
    assert sorted({a.key.checkpoint for a in artifacts}) == ["step0", "step2", "step4"]
    assert all(a.n_tokens.shape[0] == 8 for a in artifacts)  # 2 micro-batches × 4 sequences per step
    assert all(a.status == "ok" for a in artifacts)
    bundle = tmp_path / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    recorded = manifest["models"]["trained"]
    assert recorded["source"] == "external" and recorded["hidden_size"] == 16 and recorded["num_layers"] == 2
    assert recorded["measured_steps"] == [0, 2, 4] and "data settings" in recorded["data"]
    # the protocol in the bundle describes the real model and training run, not built-in defaults
    spec = manifest["protocol"]["models"][0]
    assert (spec["hidden_size"], spec["num_layers"]) == (16, 2)
    assert spec["train"]["steps"] == 5 and spec["train"]["batch_size"] == 8
    assert spec["train"]["learning_rate"] == 1e-2 and spec["train"]["checkpoints"] == [0, 2, 4]
    assert manifest["corpus"]["sequence_length"] == 12 and manifest["corpus"]["measured_sequences"] == 24
    assert main(["report", str(bundle), "--no-pdf"]) == 0
    assert main(["verify", str(bundle)]) == 0
    assert (bundle / "report.html").is_file()


# ----------------------------------------------------------------------------------------------
# AnistatCallback: everything is checked in on_train_begin, before the first optimiser step
# ----------------------------------------------------------------------------------------------
def _settings(**changes):
    return {**SETTINGS, **changes}


def _rejected_at_begin(tmp_path: Path, callback, *needles: str, **arguments) -> None:
    """trainer.train() raises before the first step: no weight changed, nothing written."""
    trainer = tiny_trainer(tmp_path, [callback], **arguments)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(AnistatInputError) as raised:
        trainer.train()
    for needle in needles:
        assert needle in str(raised.value), (needle, str(raised.value))
    assert trainer.state.global_step == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert not (tmp_path / "bundle").exists() and not (tmp_path / "bundle.units").exists()


def test_callback_rank_not_below_d_fails_at_train_begin(tmp_path: Path):
    callback = AnistatCallback(
        out=tmp_path / "bundle",
        measure_steps=[0, 2],
        **_settings(proxies={"ranks": [16]}, controls={"kinds": ["haar"], "n": 4}),
    )
    _rejected_at_begin(tmp_path, callback, "models.training", "rank 16 must be smaller than the hidden size 16")


def test_callback_normal_controls_need_2k_at_most_d_at_train_begin(tmp_path: Path):
    callback = AnistatCallback(out=tmp_path / "bundle", measure_steps=[0, 2], **_settings(proxies={"ranks": [9]}))
    _rejected_at_begin(tmp_path, callback, "controls.kinds 'normal'", "hidden size 16")


def test_callback_measure_steps_beyond_max_steps(tmp_path: Path):
    callback = AnistatCallback(out=tmp_path / "bundle", fit_steps=[0], measure_steps=[7, 9], **SETTINGS)
    _rejected_at_begin(tmp_path, callback, "no measured step is reached", "[7, 9]", "steps 0…4")


def test_meter_fit_steps_before_a_resumed_runs_first_step(tmp_path: Path):
    with pytest.raises(AnistatInputError, match=r"fit step\(s\) \[0\] lie outside the training run's steps 3…9"):
        TrainingMeter(
            tiny_gpt2(), out=tmp_path / "x", fit_steps=[0], measure_steps=[4], max_steps=10, first_step=3, **SETTINGS
        )


@pytest.mark.slow
def test_callback_warns_at_begin_about_unreachable_steps_and_records_them(tmp_path: Path):
    from anistat.errors import AnistatWarning

    callback = AnistatCallback(out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 3, 8], **SETTINGS)
    trainer = tiny_trainer(tmp_path, [callback])
    with pytest.warns(AnistatWarning, match=r"measured step\(s\) \[8\] lie outside the training run's steps 0…4"):
        trainer.train()
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["models"]["training"]["dropped_steps"] == [8]
    assert manifest["models"]["training"]["measured_steps"] == [0, 3]


def test_callback_refuses_gradient_checkpointing_at_begin(tmp_path: Path):
    callback = AnistatCallback(out=tmp_path / "bundle", measure_steps=[0, 2], **SETTINGS)
    _rejected_at_begin(tmp_path, callback, "gradient checkpointing", gradient_checkpointing=True)


def test_callback_checks_claims_and_destination_at_begin(tmp_path: Path):
    typo = [{"id": "c", "metric": "energy_ration"}]
    callback = AnistatCallback(out=tmp_path / "bundle", measure_steps=[0, 2], claims=typo, **SETTINGS)
    _rejected_at_begin(tmp_path, callback, "claims[0] 'c'", "did you mean 'energy_ratio'")
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text("{}")
    callback = AnistatCallback(out=tmp_path / "bundle", measure_steps=[0, 2], **SETTINGS)
    trainer = tiny_trainer(tmp_path, [callback])
    with pytest.raises(AnistatInputError, match="a bundle already exists there; pass overwrite=True"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_callback_never_raises_at_train_end(tmp_path: Path):
    """Training stopped before the measured step (e.g. early stopping): a warning, not an
    exception, so the user's script goes on to save the model."""
    from transformers import TrainerCallback

    from anistat.errors import AnistatWarning

    class StopAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = True

    callback = AnistatCallback(out=tmp_path / "bundle", fit_steps=[0], measure_steps=[3], **SETTINGS)
    trainer = tiny_trainer(tmp_path, [callback, StopAfterFirstStep()])
    with pytest.warns(AnistatWarning, match="no bundle was written: TrainingMeter: no measured step was reached"):
        trainer.train()
    assert trainer.state.global_step == 1 and callback.result is None
    assert isinstance(callback.error, AnistatInputError)
    trainer.save_model(str(tmp_path / "saved"))  # the user's saving still happens
    assert (tmp_path / "saved" / "config.json").is_file()


# ----------------------------------------------------------------------------------------------
# the record: the model's real configuration and the schedule that actually ran
# ----------------------------------------------------------------------------------------------
def _four_head_gpt2():
    return tiny_gpt2(layers=3, heads=4, inner=24)


REAL_CONFIGURATION = {
    "model_class": "GPT2LMHeadModel",
    "hidden_size": 16,
    "num_layers": 3,
    "num_heads": 4,
    "intermediate_size": 24,
    "vocab_size": 48,
    "parameter_dtype": "float32",
}


def _methods(bundle: Path) -> str:
    """The methods text of a bundle's report, as plain text."""
    from anistat.bundle import Bundle
    from anistat.report import ReportOptions
    from anistat.report._content import ReportContext, methods

    options = ReportOptions(compile_pdf=False, figures=False)
    paragraphs = methods(ReportContext(inputs=Bundle.load(bundle).report_inputs(), options=options))
    return "\n".join(p.plain() for p in paragraphs)


def test_meter_records_the_real_model_and_the_schedule_that_ran(tmp_path: Path, capsys):
    model = _four_head_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    decay = torch.optim.lr_scheduler.LinearLR(optimiser, start_factor=1.0, end_factor=0.2, total_iters=5)
    meter = TrainingMeter(
        model,
        out=tmp_path / "bundle",
        **PLAIN_SCHEDULE,
        optimizer=optimiser,
        **SETTINGS,
    )
    start = capsys.readouterr().err
    assert "fitted on training steps 0, 1; controls: normal (4 per kind); measured steps 1, 3" in start
    rates = []
    for step, batch in enumerate(batches(6)):
        rates.append(optimiser.param_groups[0]["lr"])
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        decay.step()
    meter.close()
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    recorded = manifest["models"]["plain"]
    assert recorded["configuration"] == REAL_CONFIGURATION
    schedule = recorded["schedule"]
    assert (schedule["steps_seen"], schedule["first_step"], schedule["last_step"]) == (6, 0, 5)
    assert schedule["learning_rate"] == {"first": rates[0], "last": rates[-1], "min": min(rates), "max": max(rates)}
    assert rates[0] == 0.01 and rates[-1] == pytest.approx(0.002)
    # the protocol lists what was set: the real sizes, no built-in training defaults
    spec = manifest["protocol"]["models"][0]
    assert (spec["hidden_size"], spec["num_layers"], spec["num_heads"], spec["intermediate_size"]) == (16, 3, 4, 24)
    assert "train" not in spec and "precision" not in spec
    text = _methods(tmp_path / "bundle")
    assert "6 training steps, learning rate 0.01 → 0.002" in text
    assert (
        "model GPT2LMHeadModel: 3 blocks, 4 attention heads, hidden size 16, MLP width 24, vocabulary 48, "
        "float32 parameters"
    ) in text


def test_meter_without_an_optimiser_says_the_rate_is_not_known(tmp_path: Path):
    model = _four_head_gpt2()
    meter = TrainingMeter(
        model, out=tmp_path / "bundle", fit_steps=[0], measure_steps=[1], name="plain", verbose=False, **SETTINGS
    )
    for step, batch in enumerate(batches(2)):
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        model.zero_grad()
    meter.close()
    schedule = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["models"]["plain"]["schedule"]
    assert schedule["learning_rate"] == "not known" and schedule["scheduler"] == "not known"
    assert "learning rate not known" in _methods(tmp_path / "bundle")


def test_trainer_run_records_the_real_model_and_its_schedule(tmp_path: Path):
    callback = AnistatCallback(
        out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 2, 4], name="trained", verbose=False, **SETTINGS
    )
    rates = []

    class Rates(__import__("transformers").TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            rates.append(optimizer.param_groups[0]["lr"])

    trainer = tiny_trainer(
        tmp_path,
        [callback, Rates()],
        model=_four_head_gpt2(),
        gradient_accumulation_steps=2,
        weight_decay=0.05,
        lr_scheduler_type="linear",
    )
    trainer.train()
    assert callback.error is None, callback.error
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    recorded = manifest["models"]["trained"]
    assert recorded["configuration"] == REAL_CONFIGURATION
    schedule = recorded["schedule"]
    assert schedule["steps_seen"] == trainer.state.global_step == 5 and schedule["max_steps"] == 5
    assert schedule["effective_batch"] == 8 and schedule["scheduler"] == "linear"
    assert schedule["weight_decay"] == 0.05 and schedule["warmup_steps"] == 0
    assert [schedule["learning_rate"][k] for k in ("first", "last")] == [rates[0], rates[-1]]
    assert rates[0] == 0.01 and rates[-1] == pytest.approx(0.002)
    spec = manifest["protocol"]["models"][0]
    assert spec["num_heads"] == 4 and "precision" not in spec["train"]
    text = _methods(tmp_path / "bundle")
    assert (
        "AnistatCallback in a transformers Trainer run (5 optimiser steps, effective batch 8, "
        "learning rate 0.01 → 0.002 (linear), weight decay 0.05, 0 warm-up steps; model GPT2LMHeadModel: "
        "3 blocks, 4 attention heads"
    ) in text


def test_meter_leaves_out_a_unit_whose_batches_were_all_non_finite(tmp_path: Path):
    """A window whose gradients were all NaN (e.g. an AMP overflow) is left out with a warning,
    training goes on, and the bundle holds the other units; a fit step that ran no forward
    contributes nothing instead of failing."""
    from anistat.errors import AnistatWarning

    model = tiny_gpt2()
    steps = batches(4)
    meter = TrainingMeter(model, out=tmp_path / "bundle", fit_steps=[0, 1], measure_steps=[2, 3], **SETTINGS)
    with meter.step(0):  # a fit step without a forward (e.g. a skipped batch)
        pass
    warning = r"unit at step 2 has 0 finite sequence\(s\) \(1 batch\(es\) skipped for non-finite gradients\)"
    with pytest.warns(AnistatWarning, match=warning):
        for step in (1, 2, 3):
            batch = steps[step]
            with meter.step(step):
                loss = model(input_ids=batch, labels=batch).loss
                (loss * float("nan") if step == 2 else loss).backward()
            model.zero_grad()
    result = meter.close()
    assert sorted({a.key.checkpoint for a in meter.artifacts}) == ["step3"]
    assert (result.results["status"] == "ok").all()
