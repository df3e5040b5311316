"""One fit core for `anistat run`, `TrainingMeter` and `AnistatCallback`: the meter honours
`proxies.center` and `proxies.refit` exactly as the run does (same bases on the same
activations, real training with real backprop), and every protocol field is either honoured by
the meter or refused with one line — none is ignored silently."""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import SETTINGS, batches, tiny_gpt2, tiny_trainer
from pydantic import BaseModel

from anistat.callbacks import METER_FIELDS, AnistatCallback, TrainingMeter
from anistat.errors import AnistatInputError
from anistat.protocol import Protocol

PACKAGE = Path(__file__).resolve().parents[2] / "anistat"

#: The proxy settings both tests measure with: uncentred PCA (not the method's default), frozen
#: and refitted proxies side by side, a projected control kind (its draws are compared too), and
#: a fit cap above the rows of a step (4 × 12), so each fit uses every row of its batches.
VARIANTS = dict(
    sites={"names": ["residual.0"]},
    proxies={"methods": ["pca"], "ranks": [2], "center": {"pca": False}, "refit": "both", "max_fit_tokens": 1000},
    controls={"kinds": ["pca_span", "haar"], "n": 3},
    stats={"n_bootstrap": 20, "n_permutations": 20},
)


# ----------------------------------------------------------------------------------------------
# every protocol field: honoured or refused
# ----------------------------------------------------------------------------------------------
def _section(annotation) -> type[BaseModel] | None:
    """The protocol section (pydantic model) a field holds, directly or in a list / union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_section, typing.get_args(annotation))), None)


def _protocol_fields(model: type[BaseModel] = Protocol, prefix: str = "") -> list[str]:
    """Every field of the protocol, as a dotted path, down to the entries of `METER_FIELDS`."""
    paths = []
    for name, info in model.model_fields.items():
        path, section = prefix + name, _section(info.annotation)
        paths.extend([path] if path in METER_FIELDS or section is None else _protocol_fields(section, path + "."))
    return paths


def test_every_protocol_field_has_a_meter_decision():
    fields = _protocol_fields()
    assert sorted(fields) == sorted(METER_FIELDS), (
        f"fields without a decision: {sorted(set(fields) - set(METER_FIELDS))}; "
        f"decisions for no field: {sorted(set(METER_FIELDS) - set(fields))}"
    )
    refused = [path for path, reason in METER_FIELDS.items() if reason is not None]
    assert "data.seq_len" in refused and "proxies.concept_card_tokens" in refused
    assert METER_FIELDS["proxies.center"] is None and METER_FIELDS["proxies.refit"] is None


def _default(path: str):
    """The protocol's default of a field (set explicitly, it is still refused: the meter would
    ignore it)."""
    section: type[BaseModel] = Protocol
    *parents, name = path.split(".")
    for parent in parents:
        section = _section(section.model_fields[parent].annotation)
    info = section.model_fields[name]
    return info.get_default(call_default_factory=True)


def _setting(path: str) -> dict:
    """A protocol dict that sets `path` (to its default) and nothing the meter refuses."""
    value = _default(path)
    top, *rest = path.split(".")
    if top == "models":
        entry = {"name": "training", "source": "external"}
        entry.update({"train": {rest[1]: value}} if rest[0] == "train" else {rest[0]: value})
        return {"models": [entry]}
    return {top: {rest[0]: value}} if rest else {top: value}


@pytest.mark.parametrize("path", [path for path, reason in METER_FIELDS.items() if reason is not None])
def test_the_meter_refuses_a_field_it_cannot_honour_with_one_line(tmp_path: Path, path: str):
    settings = {key: value for key, value in SETTINGS.items() if key != path.split(".")[0]}
    with pytest.raises(AnistatInputError) as refused:
        TrainingMeter(tiny_gpt2(), _setting(path), out=tmp_path / "b", measure_steps=[1], verbose=False, **settings)
    message = str(refused.value)
    assert f"protocol field {path}: {METER_FIELDS[path]}" in message and "\n" not in message
    assert not (tmp_path / "b").exists()


def test_the_meter_refuses_sizes_a_device_or_a_model_that_are_not_the_models(tmp_path: Path):
    def refused(protocol: dict) -> str:
        with pytest.raises(AnistatInputError) as error:
            TrainingMeter(tiny_gpt2(), protocol, out=tmp_path / "b", measure_steps=[1], verbose=False, **SETTINGS)
        return str(error.value)

    external = {"name": "training", "source": "external"}
    assert "models.hidden_size is 32, but the model's is 16" in refused({"models": [{**external, "hidden_size": 32}]})
    assert "device is cuda, but the model is on cpu" in refused({"device": "cuda"})
    built_in = {"name": "b", "architecture": "gpt2", "hidden_size": 16, "num_heads": 2}
    assert "one model of source 'external'" in refused({"models": [built_in]})
    # the model's own sizes and device, set explicitly, are honoured
    meter = TrainingMeter(
        tiny_gpt2(),
        {"device": "cpu", "models": [{**external, "hidden_size": 16, "num_layers": 2}]},
        out=tmp_path / "b",
        measure_steps=[1],
        verbose=False,
        **SETTINGS,
    )
    assert meter.protocol.models[0].hidden_size == 16 and meter.protocol.proxies.concept_card_tokens == 0


# ----------------------------------------------------------------------------------------------
# centring and refitting: the meter's bases are the run's on the same activations
# ----------------------------------------------------------------------------------------------
def _series(model: torch.nn.Module, label: str, step: int, batch: torch.Tensor):
    """A one-checkpoint series whose fit split is `batch`: what `anistat run` would fit on."""
    from anistat.data import Splits
    from anistat.models import Checkpoint, ModelSeries
    from anistat.protocol import ModelSpec

    splits = Splits(
        test=batch,
        fit=batch,
        train=batch,
        test_documents=np.arange(batch.shape[0]),
        token_counts=np.ones(48, dtype=np.int64),
        vocab_size=48,
        mask_token_id=None,
        pad_token_id=None,
        decode=lambda ids: " ".join(map(str, ids)),
    )
    frozen = copy.deepcopy(model)
    return ModelSeries(
        spec=ModelSpec(name="training", source="external"),
        objective="clm",
        splits=splits,
        checkpoints=[Checkpoint(label, step, lambda: copy.deepcopy(frozen))],
        hidden_size=16,
        num_layers=2,
    )


def _rows(output) -> torch.Tensor:
    """A block's output hidden state (a tensor, or the first of a tuple) as token rows (N, d)."""
    hidden = output[0] if isinstance(output, tuple) else output
    return hidden.detach().reshape(-1, hidden.shape[-1]).clone()


def _projector(basis) -> torch.Tensor:
    u = torch.as_tensor(np.asarray(basis), dtype=torch.float64)
    return u @ u.T


def _uncentred_pca(rows: torch.Tensor, k: int) -> torch.Tensor:
    """The closed form: the top-k right singular vectors of the raw (uncentred) activations."""
    return torch.linalg.svd(rows.double(), full_matrices=False).Vh[:k].T


@pytest.mark.slow
def test_meter_fits_centring_and_refit_variants_exactly_as_the_run(tmp_path: Path):
    from anistat.pipeline import fit_bases

    model = tiny_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = TrainingMeter(
        model, out=tmp_path / "bundle", fit_steps=[1], measure_steps=[1, 3], verbose=False, **VARIANTS
    )
    series, recorded = {}, {1: []}
    model.transformer.h[0].register_forward_hook(
        lambda module, inputs, output: recorded.get(step, []).append(_rows(output))
    )
    for step, batch in enumerate(batches(4)):
        if step in (1, 3):  # the model as the step sees it, and the step's batch
            series[step] = _series(model, f"step{step}", step, batch)
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    result = meter.close()
    sites = meter.sites
    # the run's fit path on the same activations: frozen on step 1, refitted on step 3's own
    frozen, _ = fit_bases(series[1], sites, meter.protocol, torch.device("cpu"), lambda line: None)
    refitted, _ = fit_bases(series[3], sites, meter.protocol, torch.device("cpu"), lambda line: None, refit_at=0)
    units = {a.key.checkpoint: a for a in meter.artifacts}
    for unit, run_bases in (("step1", frozen), ("step3", frozen)):
        (basis_set,) = run_bases["residual.0"]
        assert basis_set.proxy == "pca@uncentred"
        np.testing.assert_array_equal(units[unit].proxy_bases[("pca@uncentred", 2)], basis_set.basis.numpy())
    (refit_set,) = refitted["residual.0"]
    assert refit_set.proxy == "pca@uncentred@refit"
    np.testing.assert_array_equal(units["step3"].proxy_bases[("pca@uncentred@refit", 2)], refit_set.basis.numpy())
    # and the controls drawn with them (pca_span is projected per token): the run's seeds
    (meter_frozen,) = [b for b in meter.bases["residual.0"]]
    torch.testing.assert_close(meter_frozen.controls["pca_span"], basis_set.controls["pca_span"], rtol=0, atol=0)
    # uncentred, as asked: the closed form of the fit rows, not the centred PCA
    expected = _projector(_uncentred_pca(torch.cat(recorded[1]), 2))
    torch.testing.assert_close(_projector(basis_set.basis), expected, atol=1e-5, rtol=0)
    # the rows: both proxies, and the energy fraction is tr(UᵀMU)/tr(M) with the run's basis
    rows_of = result.results
    assert set(rows_of["proxy"]) - {"none", "oracle"} == {"pca@uncentred", "pca@uncentred@refit"}
    assert set(rows_of.loc[rows_of["proxy"] == "pca@uncentred@refit", "checkpoint"]) == {"step1", "step3"}
    m = torch.as_tensor(units["step3"].gradient_moments["outer"], dtype=torch.float64)
    u = torch.as_tensor(refit_set.basis, dtype=torch.float64)
    fraction = rows_of[
        (rows_of["checkpoint"] == "step3")
        & (rows_of["proxy"] == "pca@uncentred@refit")
        & (rows_of["metric"] == "energy_fraction")
    ]["estimate"]
    np.testing.assert_allclose(fraction.unique(), [float(torch.trace(u.T @ m @ u) / torch.trace(m))], rtol=1e-6)


class _ActivationRecorder:
    """A Trainer callback (listed before AnistatCallback) that records the residual stream after
    block 0 of every training forward of the chosen steps."""

    def __init__(self, model: torch.nn.Module, steps: list[int]):
        from transformers import TrainerCallback

        self.steps, self.step, self.rows = steps, -1, {s: [] for s in steps}
        self.callback = type("Recorder", (TrainerCallback,), {"on_step_begin": self._begin})()
        model.transformer.h[0].register_forward_hook(self._record)

    def _begin(self, args, state, control, **kwargs):
        self.step = state.global_step

    def _record(self, module, inputs, output):
        if self.step in self.steps and torch.is_grad_enabled():
            self.rows[self.step].append(_rows(output))


@pytest.mark.slow
def test_callback_honours_centring_and_refit_on_the_trainers_own_batches(tmp_path: Path):
    model = tiny_gpt2()
    recorder = _ActivationRecorder(model, [0, 2, 4])
    callback = AnistatCallback(
        out=tmp_path / "bundle", fit_steps=[0], measure_steps=[0, 2, 4], verbose=False, live=False, **VARIANTS
    )
    tiny_trainer(tmp_path, [recorder.callback, callback], model=model).train()
    assert callback.error is None, callback.error
    units = {a.key.checkpoint: a for a in callback.meter.artifacts}
    fitted = _projector(_uncentred_pca(torch.cat(recorder.rows[0]), 2))
    for step in (0, 2, 4):
        unit = units[f"step{step}"]
        torch.testing.assert_close(_projector(unit.proxy_bases[("pca@uncentred", 2)]), fitted, atol=1e-5, rtol=0)
        own = _projector(_uncentred_pca(torch.cat(recorder.rows[step]), 2))
        torch.testing.assert_close(_projector(unit.proxy_bases[("pca@uncentred@refit", 2)]), own, atol=1e-5, rtol=0)
    proxies = set(callback.result.results["proxy"]) - {"none", "oracle"}
    assert proxies == {"pca@uncentred", "pca@uncentred@refit"}
    assert callback.meter.protocol.proxies.center == {"pca": False}


# ----------------------------------------------------------------------------------------------
# hooks only through collect/sites.py
# ----------------------------------------------------------------------------------------------
def test_module_hooks_are_registered_only_in_collect_sites():
    pattern = re.compile(r"register_(forward|full_backward|backward|module_forward|module_full_backward)\w*hook")
    found = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    }
    assert found == {"collect/sites.py"}, found
