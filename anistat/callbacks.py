"""Measure inside someone else's training loop: a plain-PyTorch `TrainingMeter` and a
`transformers.TrainerCallback` (`AnistatCallback`) on top of it.

**Piggyback, no extra passes.** On a measured step the meter adds the additive probe
(`h + δ`, see `anistat.collect.sites`) to the chosen sites before the training forward; the
training step's *own* `loss.backward()` then fills `δ.grad = ∂L/∂h` next to the parameter
gradients — no second forward or backward. After the backward the meter projects those
gradients on the frozen proxy and control bases and keeps only per-sequence sums (the same
`SiteAccumulator` as `anistat run`), then drops them. On fit steps only activations are read
(forward hooks); after the last fit step the proxies are fitted and the controls drawn —
through the fit core `anistat run` uses (`anistat.collect.bases.fit_site_bases`): the same
proxy variants (`proxies.center`), the same derived seeds and controls. With `proxies.refit`
per_checkpoint or both, every unit also gets proxies refitted on its first step's own
activations (labelled `METHOD@refit`, as `anistat run` refits on each checkpoint's).

What is measured is the gradient of *the loss the training loop optimises* on *its own
batches*: every sequence of a measured step is one statistical sequence. (The post-hoc
collector instead uses a fixed held-out test split and `data.loss_reduction`, by default the
mean over all targets with one split-wide normaliser.) Its overall
scale (batch mean, gradient-accumulation division, AMP loss scaling) cancels in every energy
fraction; batches whose probed gradients are not finite (e.g. an AMP overflow step the
optimiser skips) are skipped and counted in the unit's `extra`.

Units: one per (window of measured steps, site); `window=w` pools steps s … s+w−1 into the unit
labelled `step{s}` (more sequences per unit). Phase: the first `proxies.fit_window` share of
units is `early`, the rest `late` (as in `anistat run`). `close()` writes unit artifacts to
`<out>.units/` as they finish and, at the end, a full bundle at `out` (`anistat report` works
on it; `anistat.finalize.finalize_bundle` can rebuild it from the units directory).

Example (plain PyTorch)::

    meter = TrainingMeter(model, out="reports/mine", fit_steps=range(0, 20), measure_steps=range(20, 1000, 50),
                          sites={"layers": [0, 3]}, proxies={"ranks": [4]}, controls={"n": 20})
    for step, batch in enumerate(loader):
        with meter.step(step):
            loss = model(**batch).loss
            loss.backward()
        optimizer.step(); optimizer.zero_grad()
    meter.close()

Example (Trainer)::

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[AnistatCallback(out="reports/mine", fit_steps=[0, 1], measure_steps=[2, 10, 50])])

Not supported: gradient checkpointing (the recomputed forward would create new probes) — the
meter refuses it with a clear error.

**Every protocol field honoured or refused.** `METER_FIELDS` says, field by field, what the
meter does with the protocol: honoured as in `anistat run`, or refused with one line when the
protocol sets it (the data, the threads, the model's loading and training are the loop's; the
meter has no tokenizer for concept cards, and records `concept_card_tokens: 0`).

**Checked before the first step.** The meter (and so the callback, in `on_train_begin`) checks
everything it can before training starts: the proxy ranks and control kinds against the model's
hidden size d (rank < d, 2k ≤ d for normal controls, …, one rule with `anistat run`:
`anistat.protocol.control_problem`), the sites against the model, the claims against the units
it will write, that measured and fit steps fall before `max_steps` (unreachable measured steps
are dropped with an `AnistatWarning`, and none reachable is an error), gradient checkpointing,
and that `out` holds no bundle yet (`overwrite=True` replaces one). It then prints one line
saying what it will measure (`verbose=False` silences it).

**Truthful record.** The bundle's protocol describes the external model with its real hidden
size and number of blocks (and, under the Trainer, the real training settings: steps, batch,
learning rate, warm-up); the manifest's corpus and model entries say that the protocol's
`data` settings do not apply (the loop's own batches were measured) and give the sequence
length and counts actually seen. After the bundle is written the `<out>.units/` folder is
removed (`keep_units=True` keeps it for `finalize_bundle`). The callback never raises at the end
of training: a failure to write the bundle becomes an `AnistatWarning` (units kept), so the
user's own saving after `trainer.train()` still happens.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel

from .collect import BasisSet, Site, SiteAccumulator, UnitArtifact, UnitKey, probe, sites_from_spec
from .collect.bases import check_fit_sample, fit_site_bases, fits_frozen, fits_per_unit, site_seed_key
from .collect.sites import forward_inputs
from .errors import AnistatInputError, AnistatWarning
from .finalize import finalize_bundle
from .geometry import frequency_buckets
from .live import LiveMetrics, Publish, find_trainer, logger_publisher
from .models import infer_objective
from .protocol import Protocol, control_problem, fit_window_size, load_protocol, parse_protocol
from .seeding import derive_seed

if TYPE_CHECKING:
    from .bundle import RunResult


def model_sizes(model: torch.nn.Module) -> tuple[int | None, int | None]:
    """(hidden size d, number of blocks) from a transformers-style config; None where unknown."""
    config = getattr(model, "config", None)
    hidden = (
        (getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or getattr(config, "d_model", None))
        if config is not None
        else None
    )
    layers = (
        (getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)) if config is not None else None
    )
    return (int(hidden) if hidden else None), (int(layers) if layers else None)


#: What the record says where the model or the loop does not tell.
NOT_KNOWN = "not known"


def model_configuration(model: torch.nn.Module) -> dict[str, Any]:
    """The model's real configuration, read from its transformers-style ``config`` and its
    parameters (``"not known"`` where they do not say): class, hidden size, blocks, attention
    heads, MLP width (GPT-2's ``n_inner=None`` is its rule ``4 × n_embd``), vocabulary and the
    parameters' dtype(s)."""
    config = getattr(model, "config", None)

    def first(*names: str) -> int | None:
        for name in names:
            value = getattr(config, name, None) if config is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return int(value)
        return None

    hidden = first("hidden_size", "n_embd", "d_model")
    mlp = first("intermediate_size", "n_inner", "ffn_dim", "d_ff")
    if mlp is None and hidden and getattr(config, "model_type", None) == "gpt2":
        mlp = 4 * hidden
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    values = {
        "model_class": type(model).__name__,
        "hidden_size": hidden,
        "num_layers": first("num_hidden_layers", "n_layer", "num_layers"),
        "num_heads": first("num_attention_heads", "n_head", "num_heads"),
        "intermediate_size": mlp,
        "vocab_size": first("vocab_size"),
        "parameter_dtype": "/".join(dtypes) or None,
    }
    return {key: NOT_KNOWN if value is None else value for key, value in values.items()}


#: The protocol fields the meter honours as `anistat run` does (``device`` and the model's sizes
#: checked against the model; ``models.*`` is the one external model, ``claims``, ``stats`` and
#: ``report`` every field of theirs).
_HONOURED = """
    anistat_protocol name description seed device claims stats report replication.tolerance
    data.n_frequency_buckets data.frequency_ci_memory_mb sites.kind sites.layers sites.names sites.modules
    models.name models.source models.objective models.hidden_size models.num_layers models.num_heads
    models.intermediate_size proxies.methods proxies.ranks proxies.fit_window proxies.max_fit_tokens
    proxies.refit proxies.center controls.kinds controls.n controls.pca_span_dim
"""
#: The fields the loop decides (its batches, loss, threads, model and training) and why the meter
#: refuses them when the protocol sets them.
_REFUSED = {
    "threads": "the training loop sets the CPU threads, the meter does not",
    " ".join(
        f"data.{name}"
        for name in "source paths text_field dataset dataset_config dataset_split max_documents seq_len "
        "n_fit_sequences n_test_sequences vocab_size mlm_probability batch_size special_tokens loss_reduction".split()
    ): "the training loop's own batches and loss are measured, not the protocol's data",
    "data.type_statistics_memory_mb": "in a training loop every token type seen is kept (no budget applies)",
    " ".join(
        f"models.{name}"
        for name in "architecture path checkpoints steps hub_id revisions trust_remote_code precision "
        "attn_implementation".split()
    ): "the meter measures the model it is given, not one the protocol loads or trains",
    " ".join(
        f"models.train.{name}"
        for name in "steps batch_size learning_rate weight_decay warmup_steps checkpoints precision".split()
    ): "the meter records the loop's own training settings (TrainingMeter(training=...))",
    "proxies.concept_card_tokens": "the meter has no tokenizer to write concept cards with",
}
#: What the meter does with every protocol field (dotted path): None — honoured; a sentence — the
#: reason it refuses the field when the protocol sets it. tests/training/test_meter_protocol.py checks this
#: table against the Protocol's fields, so a new field needs a decision here.
METER_FIELDS: dict[str, str | None] = {
    **dict.fromkeys(_HONOURED.split()),
    **{path: reason for paths, reason in _REFUSED.items() for path in paths.split()},
}


def _set_fields(section: BaseModel, prefix: str = "") -> Iterator[str]:
    """The dotted paths of the fields a protocol section sets (explicitly, not by default),
    down to the paths of `METER_FIELDS` (the model list's entries as ``models.*``)."""
    for name in sorted(section.model_fields_set):
        path, value = prefix + name, getattr(section, name)
        if path in METER_FIELDS:
            yield path
        elif isinstance(value, BaseModel):
            yield from _set_fields(value, path + ".")
        elif isinstance(value, list):
            for item in value:
                yield from _set_fields(item, path + ".")


def _refuse_unhonoured(user: Protocol, facts: dict[str, Any], device: torch.device) -> None:
    """One `AnistatInputError` for the first protocol field the meter cannot honour: a field
    `METER_FIELDS` refuses, a model that is not the one external model, sizes or a device that
    disagree with the model's."""
    if len(user.models) != 1 or user.models[0].source != "external":
        raise AnistatInputError(
            "TrainingMeter: models: the meter measures one model of source 'external' (the model it is given); "
            f"got {[f'{m.name} ({m.source})' for m in user.models]}"
        )
    for path in _set_fields(user):
        if METER_FIELDS[path] is not None:
            raise AnistatInputError(f"TrainingMeter: protocol field {path}: {METER_FIELDS[path]}; remove it")
    model = user.models[0]
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        if name in model.model_fields_set and name in facts and getattr(model, name) != facts[name]:
            raise AnistatInputError(
                f"TrainingMeter: protocol field models.{name} is {getattr(model, name)}, "
                f"but the model's is {facts[name]}; remove it"
            )
    if "device" in user.model_fields_set and user.device not in ("auto", device.type):
        raise AnistatInputError(
            f"TrainingMeter: protocol field device is {user.device}, but the model is on {device}; "
            "the meter measures where the model is (remove device)"
        )


def _external_protocol(
    protocol: Protocol | str | Path | dict | None,
    name: str,
    objective: str | None,
    overrides: dict[str, Any],
    model_facts: dict[str, Any],
    device: torch.device,
) -> Protocol:
    """The protocol of a measured training run: the one the user gave (a `Protocol`, a file, or a
    dict / None with keyword `overrides`; default one `external` model named `name`), every field
    it sets honoured or refused (`METER_FIELDS`, `_refuse_unhonoured`), recorded with what the
    meter knows: the model's real sizes and (under the Trainer) training settings (`model_facts`),
    so the bundle never records built-in defaults that never applied (the protocol records only the
    fields set for an external model, `Protocol.normalised`), and no concept cards."""
    if isinstance(protocol, (Protocol, str, Path)) and overrides:
        raise TypeError("pass either a Protocol (or a protocol file) or keyword overrides, not both")
    if isinstance(protocol, Protocol):
        user = protocol
    elif isinstance(protocol, (str, Path)):
        user = load_protocol(protocol)
    else:
        data: dict[str, Any] = {"name": name, **dict(protocol or {}), **overrides}
        data.setdefault("models", [{"name": name, "source": "external"}])
        data.setdefault("report", {"compile_pdf": False})  # no PDF unless asked: a loop's script waits for it
        user = parse_protocol(data, "TrainingMeter protocol")
    _refuse_unhonoured(user, model_facts, device)
    recorded = user.model_dump(mode="json", exclude_unset=True)
    recorded["models"] = [
        {
            **model_facts,
            **recorded["models"][0],
            **({"objective": objective} if objective else {}),
        }
    ]
    recorded.setdefault("proxies", {})["concept_card_tokens"] = 0
    return parse_protocol(recorded, "TrainingMeter protocol")


# ----------------------------------------------------------------------------------------------
# planning: which steps are fitted and measured, checked before the first step
# ----------------------------------------------------------------------------------------------
def _reachable_steps(
    measure_steps: list[int], fit_steps: list[int], max_steps: int | None, first_step: int
) -> tuple[list[int], list[int]]:
    """(measured steps kept, measured steps dropped): the measured steps outside the training
    run's steps [first_step, max_steps) are dropped with an `AnistatWarning`; an unreachable fit
    step, or no reachable measured step, is an error."""
    end = max_steps if max_steps is not None and max_steps > 0 else None
    outside = [s for s in measure_steps if s < first_step or (end is not None and s >= end)]
    span = f"steps {first_step}…{end - 1}" if end is not None else f"steps from {first_step}"
    if len(outside) == len(measure_steps):
        raise AnistatInputError(
            f"TrainingMeter: no measured step is reached: measure_steps {measure_steps} "
            f"all lie outside the training run's {span}"
        )
    late_fit = [s for s in fit_steps if s < first_step or (end is not None and s >= end)]
    if late_fit:
        raise AnistatInputError(
            f"TrainingMeter: fit step(s) {late_fit} lie outside the training run's {span}; "
            "the proxies could not be fitted"
        )
    if outside:
        warnings.warn(
            AnistatWarning(
                f"TrainingMeter: measured step(s) {outside} lie outside the training run's {span} and will not be "
                f"measured; measuring {len(measure_steps) - len(outside)} step(s)"
            ),
            stacklevel=3,  # the caller of TrainingMeter(...)
        )
        return [s for s in measure_steps if s not in outside], outside
    return measure_steps, outside


def _check_fit_before_measure(measure_steps: list[int], fit_steps: list[int]) -> None:
    """The proxies are frozen before they are used: no measured step before the last fit step."""
    if fit_steps and measure_steps[0] < fit_steps[-1]:
        raise AnistatInputError(
            f"TrainingMeter: measured step {measure_steps[0]} comes before the last fit step "
            f"{fit_steps[-1]}; proxies must be frozen before they are used"
        )


def _check_out(out: Path, overwrite: bool) -> None:
    """`out` may receive a bundle: no foreign folder there, and no bundle unless `overwrite`."""
    from .bundle import check_destination

    check_destination(out)
    if not overwrite and (out / "manifest.json").is_file():
        raise AnistatInputError(
            f"TrainingMeter: out {out}: a bundle already exists there; pass "
            "overwrite=True to replace it, or choose another out"
        )


def _model_facts(
    configuration: dict[str, Any],
    hidden_size: int | None,
    num_layers: int | None,
    training: dict[str, Any] | None,
    measure_steps: list[int],
) -> dict[str, Any]:
    """The model facts the protocol records: the sizes that are known, and the training
    settings with the measured steps as their checkpoints."""
    facts: dict[str, Any] = {}
    if hidden_size:
        facts["hidden_size"] = hidden_size
    if num_layers:
        facts["num_layers"] = num_layers
    for key in ("num_heads", "intermediate_size"):
        if configuration[key] != NOT_KNOWN:
            facts[key] = configuration[key]
    if training:
        facts["train"] = {**training, "checkpoints": measure_steps}
    return facts


def _check_sizes(protocol: Protocol, name: str, hidden_size: int | None, sites: list[Site]) -> None:
    """Ranks and control kinds against d, before training (module sites, whose width is known
    only once the model runs, are checked when the proxies are fitted)."""
    if hidden_size is None or not any(s.kind != "module" for s in sites):
        return
    problem = control_problem(protocol.controls, protocol.proxies.ranks, hidden_size)
    if problem:
        raise AnistatInputError(f"TrainingMeter: models.{name}: {problem}")


def _check_claims(
    protocol: Protocol, name: str, objective: str, hidden_size: int | None, sites: list[Site], measure_steps: list[int]
) -> None:
    """The protocol's claims against the units the meter will write (as `anistat validate`)."""
    if not protocol.claims:
        return
    from .preflight import PlannedModel, PlannedSite, check_claim, row_plan

    planned = PlannedModel(
        name,
        "external",
        objective,
        hidden_size,
        None,
        tuple((f"step{s}", s) for s in measure_steps),
        tuple(PlannedSite(s.name, s.layer, hidden_size if s.kind != "module" else None) for s in sites),
    )
    plan = row_plan(protocol, [planned])
    for index, claim in enumerate(protocol.claims):
        check_claim(index, claim, plan)


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether gradient (activation) checkpointing is on: its recomputed forward would create new probes."""
    attribute = (
        "is_activation_checkpointing"
        if hasattr(type(model), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(model, attribute, False))


def _check_no_checkpointing(model: torch.nn.Module) -> None:
    if _checkpointing(model):
        raise AnistatInputError(
            "TrainingMeter: gradient checkpointing is not supported (it re-runs the forward); "
            "turn it off for the measured run"
        )


def _description(meter: TrainingMeter) -> str:
    """`TrainingMeter.describe`: the model, sites, proxies, controls, fit and measured steps, `out`."""
    p = meter.protocol
    sites = ", ".join(s.name for s in meter.sites)
    steps = ", ".join(map(str, meter.measure_steps[:8])) + (", …" if len(meter.measure_steps) > 8 else "")
    window = f" (windows of {meter.window} steps)" if meter.window > 1 else ""
    fits = ", ".join(map(str, meter.fit_steps))
    return (
        f"anistat: measuring '{meter.name}' (d={meter.hidden_size or '?'}) at {sites}; proxies "
        f"{'/'.join(p.proxies.methods)} rank {'/'.join(map(str, p.proxies.ranks))} fitted on training "
        f"step{'s' if len(meter.fit_steps) > 1 else ''} {fits}; controls: {', '.join(p.controls.kinds)} "
        f"({p.controls.n} per kind); measured steps {steps}{window} → {meter.out}"
    )


class _UnitWindows:
    """Which unit a training step belongs to: unit `step{s}` pools the steps s … s+w−1 of a
    measured step s (`window` w); the first `fit_window` share of the units is `early`, the rest
    `late` (as in `anistat run`)."""

    def __init__(self, measure_steps: list[int], window: int, fit_window: float):
        self.measure_steps, self.window = measure_steps, window
        self.n_early = fit_window_size(len(measure_steps), fit_window)
        self.index = {step: i for i, step in enumerate(measure_steps)}

    def start(self, step: int) -> int | None:
        """The measured step whose window contains `step`, if any."""
        for start in self.measure_steps:
            if start <= step < start + self.window:
                return start
        return None

    def phase(self, start: int) -> str:
        return "early" if self.index[start] < self.n_early else "late"


class _ScheduleRecord:
    """The schedule as the meter sees it run: the training steps it is called on (counted once
    each, however often a driver calls `begin`) and the optimiser's learning rate at each."""

    def __init__(self) -> None:
        self.steps_seen = 0
        self.first: int | None = None
        self.last: int | None = None
        self.rates: list[float] = []

    def see(self, step: int, optimizer: torch.optim.Optimizer | None) -> None:
        if step != self.last:
            self.steps_seen += 1
            self.first = step if self.first is None else self.first
            self.last = step
            if optimizer is not None and optimizer.param_groups:
                self.rates.append(float(optimizer.param_groups[0]["lr"]))

    def as_dict(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The manifest's `schedule`: steps seen, first and last, the learning rate's first, last,
        min and max ("not known" without an optimiser), then the driver's `settings`."""
        rates = self.rates
        if rates:
            rate: Any = {"first": rates[0], "last": rates[-1], "min": min(rates), "max": max(rates)}
        else:
            rate = NOT_KNOWN
        return {
            "steps_seen": self.steps_seen,
            "first_step": self.first,
            "last_step": self.last,
            "learning_rate": rate,
            "learning_rate_source": (
                "read from the optimiser at every step seen"
                if rates
                else "no optimiser given (TrainingMeter(optimizer=...))"
            ),
            "scheduler": NOT_KNOWN,
            **settings,
        }


# ----------------------------------------------------------------------------------------------
# hooks: what one training step's forwards and backward leave behind
# ----------------------------------------------------------------------------------------------
class _StepCapture:
    """The hooks of one training step, from `TrainingMeter.begin` to `close`: the additive probes
    (`anistat.collect.probe`, accumulated over the step's forwards for gradient accumulation) at
    every site — activations, and with `measure` the δ whose `.grad` the step's own backward
    fills with ∂L/∂h — and each forward's input ids, from a forward pre-hook on the model."""

    def __init__(self, model: torch.nn.Module, sites: list[Site], step: int, *, fit: bool, measure: bool):
        self.step, self.fit, self.measure = step, fit, measure
        self.inputs: list[torch.Tensor | None] = []
        self._stack = contextlib.ExitStack()
        self.record = self._stack.enter_context(
            probe(model, {s.name: s for s in sites}, gradients=measure, accumulate=True)
        )
        self._stack.enter_context(forward_inputs(model, self._grab_inputs))

    def _grab_inputs(self, args: tuple, kwargs: dict) -> None:
        if self.measure and not torch.is_grad_enabled():
            return  # not a training forward (pairs with the probe's accumulated records)
        ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], torch.Tensor) else None)
        self.inputs.append(ids.detach() if isinstance(ids, torch.Tensor) else None)

    def close(self) -> None:
        """Remove the probes and the pre-hook (the record and the inputs stay readable)."""
        self._stack.close()

    def forward(
        self, forward: int, sites: list[Site], device: torch.device
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
        """One forward's ∂L/∂h and activations at every site, and its input ids (batch, length;
        zeros where the pre-hook did not see them). An error when the backward missed a site."""
        grads = {}
        for site in sites:
            delta = self.record.all_deltas[site.name][forward]
            if delta.grad is None:
                raise AnistatInputError(
                    f"TrainingMeter: no gradient reached {site.name} on step {self.step} — call loss.backward() "
                    "inside the measured step"
                )
            grads[site.name] = delta.grad
        activations = {site.name: self.record.all_activations[site.name][forward] for site in sites}
        batch, length = activations[sites[0].name].shape[:2]
        ids = self.inputs[forward] if forward < len(self.inputs) else None
        if ids is None or ids.shape[:2] != (batch, length):
            ids = torch.zeros(batch, length, dtype=torch.long, device=device)
        return grads, activations, ids

    def release(self, forward: int, sites: list[Site]) -> None:
        """Drop one forward's ∂L/∂h once it is in the statistics."""
        for site in sites:
            self.record.all_deltas[site.name][forward].grad = None


# ----------------------------------------------------------------------------------------------
# fitting: the fit steps' activations → frozen proxies and controls
# ----------------------------------------------------------------------------------------------
class _FitSample:
    """The fit steps' activations: per site a seeded share of each step's token rows (at most
    `proxies.max_fit_tokens` over all fit steps), the input ids seen (for the token counts) and
    the number of fit sequences."""

    def __init__(self, sites: list[Site]):
        self.rows: dict[str, list[torch.Tensor]] = {s.name: [] for s in sites}
        self.ids: list[torch.Tensor] = []
        self.sequences = 0

    def add(self, capture: _StepCapture, sites: list[Site], per_step: int, seed: int) -> None:
        """Keep `per_step` rows per site of the step's activations, drawn with `seed`."""
        if not capture.record.all_activations[sites[0].name]:
            return  # the step ran no forward through the model: nothing to keep (`_fit` says so if no step did)
        generator = torch.Generator().manual_seed(seed)
        ids = [i for i in capture.inputs]
        self.sequences += sum(int(a.shape[0]) for a in capture.record.all_activations[sites[0].name])
        for site in sites:
            rows = torch.cat([a.reshape(-1, a.shape[-1]) for a in capture.record.all_activations[site.name]])
            rows = rows.float().cpu()
            keep = torch.randperm(rows.shape[0], generator=generator)[:per_step].sort().values
            self.rows[site.name].append(rows[keep])
        if ids and all(i is not None for i in ids):
            self.ids.extend(i.reshape(-1).cpu() for i in ids)

    def release(self) -> None:
        """Let go of the rows and ids once the proxies are fitted (the sequence count stays)."""
        self.rows = {name: [] for name in self.rows}
        self.ids = []


def _frequency_table(
    token_counts: np.ndarray | None, seen: torch.Tensor, vocab_size: int, n_buckets: int
) -> tuple[int, np.ndarray | None, int, torch.Tensor]:
    """(vocabulary size, token counts, number of buckets, bucket of each token id) from the
    caller's counts, else the counts of the ids `seen` on the fit steps; one bucket when neither
    is known. The vocabulary grows to cover every id seen."""
    vocab_size = max(vocab_size, int(seen.max()) + 1 if seen.numel() else 1)
    counts = token_counts
    if counts is None:
        counts = np.bincount(seen.numpy(), minlength=vocab_size) if seen.numel() else None
    if counts is None:
        return vocab_size, None, 1, torch.zeros(vocab_size, dtype=torch.long)
    counts = np.asarray(counts, dtype=np.int64)
    return vocab_size, counts, n_buckets, torch.as_tensor(frequency_buckets(counts, n_buckets)).clamp(min=0)


def _fit_bases(meter: TrainingMeter, sample: _FitSample, refit_label: str | None = None) -> dict[str, list[BasisSet]]:
    """Every site's proxies and controls from the fit sample, through the one fit core
    (`anistat.collect.bases.fit_site_bases`, as `anistat run`): frozen ones from the fit steps,
    refitted ones (`refit_label` = the unit's label) from the unit's first step."""
    bases = {}
    for site in meter.sites:
        rows = torch.cat(sample.rows[site.name])
        check_fit_sample(rows, meter.protocol, "TrainingMeter", site.name, "the fit steps")
        bases[site.name] = fit_site_bases(
            rows,
            meter.protocol,
            model=meter.name,
            site_key=site_seed_key(site),
            device=meter.device,
            refit_label=refit_label,
        )
    return bases


def _unit_bases(meter: TrainingMeter, capture: _StepCapture, start: int) -> dict[str, list[BasisSet]]:
    """The bases of the unit opening at `start`: the frozen ones, and with `proxies.refit`
    per_checkpoint or both the ones refitted on the step's own activations (sampled as a
    single fit step's would be), as `anistat run` refits on each checkpoint."""
    frozen = meter.bases if meter.bases is not None else {}
    if not fits_per_unit(meter.protocol):
        return frozen
    sample = _FitSample(meter.sites)
    seed = derive_seed(meter.protocol.seed, meter.name, capture.step, "fit")
    sample.add(capture, meter.sites, meter.protocol.proxies.max_fit_tokens, seed)
    refitted = _fit_bases(meter, sample, refit_label=f"step{start}")
    return {name: frozen[name] + refitted[name] for name in frozen}


# ----------------------------------------------------------------------------------------------
# measuring: the open unit's per-sequence statistics
# ----------------------------------------------------------------------------------------------
class _OpenUnit:
    """The unit being measured — the window of steps starting at `start` — with one
    `SiteAccumulator` per site, the sequences it holds and the batches it skipped."""

    def __init__(
        self,
        start: int,
        bases: dict[str, list[BasisSet]],
        *,
        n_buckets: int,
        vocab_size: int,
        device: torch.device,
        dtype: torch.dtype,
        pair_budget_bytes: int,
    ):
        self.start, self.bases = start, bases
        self.sequences: list[int] = []
        self.skipped = 0
        self.started = time.perf_counter()
        # rows are appended as the training batches come (n_seq=None)
        self.accumulators = {
            site: SiteAccumulator(
                site_bases,
                dim=site_bases[0].basis.shape[0],
                n_seq=None,
                n_buckets=n_buckets,
                vocab_size=vocab_size,
                device=device,
                dtype=dtype,
                pair_budget_bytes=pair_budget_bytes,
            )
            for site, site_bases in bases.items()
        }

    def add(
        self,
        grads: dict[str, torch.Tensor],
        activations: dict[str, torch.Tensor],
        ids: torch.Tensor,
        onehot: torch.Tensor,
        used: int,
        step: int,
    ) -> None:
        """One forward's batch at every site: its first `used` positions (CLM: the last position
        predicts nothing)."""
        for name, accumulator in self.accumulators.items():
            accumulator.add(grads[name][:, :used], activations[name][:, :used], ids, onehot, where=f"step {step}")

    def live_moments(self) -> dict[str, torch.Tensor]:
        """Σ g gᵀ so far of every site that has gradients and no failure (for `anistat.live`)."""
        return {
            name: accumulator.grad.outer
            for name, accumulator in self.accumulators.items()
            if accumulator.grad.count > 0 and accumulator.grad.outer is not None and not accumulator.failure
        }

    def finish(self, key: UnitKey, protocol: Protocol, window: int) -> UnitArtifact:
        """The artifact of one site (`key.site`)."""
        return self.accumulators[key.site].finish(
            key,
            sequence_documents=np.asarray(self.sequences, dtype=np.int64),
            seconds=time.perf_counter() - self.started,
            isoscore_c0=protocol.stats.isoscore_c0,
            isoscore_zeta=protocol.stats.isoscore_zeta,
            extra={"source": "training", "window": window, "skipped_batches": self.skipped},
        )


# ----------------------------------------------------------------------------------------------
# finalisation: the measured units → finalize_bundle, with the record of what was measured
# ----------------------------------------------------------------------------------------------
#: What the manifest says of the protocol's `data` settings under a training loop.
_DATA_NOTE = (
    "the training loop's own batches were measured; the protocol's data settings (source, seq_len, "
    "n_fit_sequences, n_test_sequences, vocab_size, batch_size) were not used"
)


def _manifest_record(meter: TrainingMeter) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's model entry (the model's real configuration, the steps measured and the
    schedule that ran) and corpus entry (the training batches: sequence length and counts seen)."""
    first_site = meter.sites[0].name
    measured = sorted({a.key.step for a in meter.artifacts if a.key.site == first_site and a.key.step is not None})
    models = {
        meter.name: {
            "source": "external",
            "objective": meter.objective,
            "model_class": type(meter.model).__name__,
            "hidden_size": meter.hidden_size,
            "num_layers": model_sizes(meter.model)[1],
            "sites": [s.name for s in meter.sites],
            "fit_steps": meter.fit_steps,
            "measure_steps": meter.measure_steps,
            "measured_steps": measured,
            "unreached_steps": sorted(set(meter.measure_steps) - set(measured)),
            "dropped_steps": meter.dropped_steps,
            "window": meter.window,
            "driver": meter.driver,
            "training": meter.training,
            "configuration": meter.configuration,
            "schedule": meter.schedule(),
            "data": _DATA_NOTE,
        }
    }
    corpus = {
        "name": "training batches",
        "sha256": None,
        "documents": None,
        "note": _DATA_NOTE,
        "sequence_length": meter._seen_length,
        "fit_sequences": meter._fit_sample.sequences,
        "measured_sequences": meter._sequence_counter,
        "token_counts": "given by the caller" if meter._counts_given else "counted on the fit steps' batches",
    }
    return models, corpus


def _write_bundle(meter: TrainingMeter) -> RunResult:
    """The meter's units → `finalize_bundle` at `meter.out`, with the manifest's record of what
    was measured; then the saved unit files are removed (unless `keep_units`)."""
    models, corpus = _manifest_record(meter)
    result = finalize_bundle(
        meter.artifacts,
        meter.protocol,
        meter.out,
        token_counts={meter.name: meter.token_counts} if meter.token_counts is not None else None,
        models=models,
        device=str(meter.device),
        started_at=meter._started_at,
        corpus=corpus,
    )
    if not meter.keep_units:
        _remove_saved_units(meter.units_dir, meter.artifacts)
    return result


def _remove_saved_units(units_dir: Path, artifacts: list[UnitArtifact]) -> None:
    """Delete the unit files a meter saved (`<id>.json` + its arrays) and then the folder if it
    is empty: never a file it did not write (the folder's name is chosen from `out`, and a
    user's folder of that name keeps its own files)."""
    from .collect.artifact import _arrays_path

    for artifact in artifacts:
        meta = units_dir / f"{artifact.key.id}.json"
        for path in (meta, _arrays_path(meta)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    with contextlib.suppress(OSError):
        units_dir.rmdir()


# The meter drives; its parts live above, one section per seam: planning (`_reachable_steps` and
# the `_check_*` functions before the first step, `_UnitWindows`: which unit a step belongs to,
# `_ScheduleRecord`: the steps and learning rates seen), the hooks of one step (`_StepCapture`),
# fitting (`_FitSample`, `_frequency_table`, `_fit_bases`, `_unit_bases`: the one fit core), the open unit's statistics
# (`_OpenUnit`) and finalisation (`_write_bundle`: `_manifest_record` → `finalize_bundle`, then
# `_remove_saved_units`).
class TrainingMeter:
    """Measure true gradients at chosen steps of any PyTorch training loop (see module docstring).

    Parameters
    ----------
    model : the `torch.nn.Module` being trained (a transformers model or any model whose blocks
        `anistat sites` can find; `module:` sites work for anything).
    protocol : a `Protocol`, a protocol file, a dict, or None; with None (or a dict) a protocol
        with one `source: external` model is built from `name` and the keyword `overrides`
        (`sites=`, `proxies=`, `controls=`, `stats=`, `seed=` …, validated like a protocol file).
    out : where `close()` writes the bundle.
    measure_steps : the steps whose gradients are measured (each starts a unit of `window` steps).
    fit_steps : steps whose activations fit the proxies (default: the first measured step); every
        measured step must come at or after the last fit step (bases are frozen before use).
    token_counts : corpus token counts (vocab,) for frequency buckets; default: counts of the
        tokens seen on fit steps.
    exact : per-batch statistics in float64 (default float32 products, float64 running sums).
    max_steps, first_step : the steps the training run will take, [first_step, max_steps) (when
        known): measured steps outside are dropped with a warning; fit steps outside are an error.
    overwrite : replace an existing bundle at `out` (refused by default, as `anistat run`).
    keep_units : keep `<out>.units/` after the bundle is written (default: removed).
    verbose : print one line on stderr saying what will be measured.
    training : the run's real training settings (`steps`, `batch_size`, `learning_rate`,
        `weight_decay`, `warmup_steps`) recorded as the external model's `train` section.
    logger : where each measured step's live metrics go (`anistat.live`: uncorrected point
        estimates of the energy fractions, against k/d and the oracle): a TensorBoard
        `SummaryWriter` or any callable ``(name, value, step)``; None publishes nothing. The
        bundle does not depend on it.
    live_oracle_every : compute the live oracle fraction on every n-th measured step only (it
        costs one d × d eigen-decomposition per site; see `anistat.live`).
    optimizer : the loop's optimiser: the learning rate is read from its first parameter group at
        every step (`meter.step(i)` / `begin(i)`) and the schedule that ran is recorded in the
        manifest (first → last rate); without it the rate is recorded as "not known".

    Notes
    -----
    The manifest's model entry records the model's real configuration (`configuration`:
    :func:`model_configuration`) and the schedule that actually ran (`schedule`: steps seen,
    first and last step, the learning rate read from the optimiser and, under the Trainer,
    `max_steps`, effective batch, scheduler, weight decay and warm-up); the report's methods text
    is built from them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        protocol: Protocol | str | Path | dict | None = None,
        *,
        out: str | Path,
        measure_steps: Iterable[int],
        fit_steps: Iterable[int] | None = None,
        window: int = 1,
        name: str = "training",
        objective: str | None = None,
        token_counts: np.ndarray | None = None,
        exact: bool = False,
        max_steps: int | None = None,
        first_step: int = 0,
        overwrite: bool = False,
        keep_units: bool = False,
        verbose: bool = True,
        training: dict[str, Any] | None = None,
        logger: Any = None,
        live_oracle_every: int = 1,
        optimizer: torch.optim.Optimizer | None = None,
        **overrides: Any,
    ):
        self.model = model
        # live metrics: `publish_live(scalars, step)` (AnistatCallback points it at Trainer.log)
        self.publish_live: Publish | None = logger_publisher(logger) if logger is not None else None
        self._live: LiveMetrics | None = None
        if live_oracle_every < 1:
            raise AnistatInputError(f"TrainingMeter: live_oracle_every must be at least 1, got {live_oracle_every}")
        self.live_oracle_every = int(live_oracle_every)
        self.optimizer = optimizer
        self.configuration = model_configuration(model)
        #: the schedule settings a driver knows beyond the steps and rates measured here (the
        #: Trainer's max_steps, effective batch, scheduler, weight decay, warm-up)
        self.schedule_settings: dict[str, Any] = {}
        hidden_size, num_layers = model_sizes(model)
        self.measure_steps = sorted(set(int(s) for s in measure_steps))
        if not self.measure_steps:
            raise AnistatInputError("TrainingMeter: measure_steps is empty")
        self.fit_steps = sorted(set(int(s) for s in (fit_steps if fit_steps is not None else self.measure_steps[:1])))
        self.measure_steps, self.dropped_steps = _reachable_steps(
            self.measure_steps, self.fit_steps, max_steps, first_step
        )
        facts = _model_facts(self.configuration, hidden_size, num_layers, training, self.measure_steps)
        self.training = dict(training or {})
        # who measures: the report's methods text names it (AnistatCallback sets its own name)
        self.driver = "TrainingMeter"
        self.device = next(model.parameters()).device
        self.protocol = _external_protocol(protocol, name, objective, overrides, facts, self.device)
        self.name = self.protocol.models[0].name
        self.out = Path(out)
        self.units_dir = self.out.parent / f"{self.out.name}.units"
        self.keep_units = keep_units
        _check_out(self.out, overwrite)
        _check_fit_before_measure(self.measure_steps, self.fit_steps)
        if window < 1:
            raise AnistatInputError("TrainingMeter: window must be at least 1")
        self.window = window
        config = getattr(model, "config", None)
        self.objective = (
            objective or self.protocol.models[0].objective or (infer_objective(config) if config is not None else "clm")
        )
        self.vocab_size = int(getattr(config, "vocab_size", 0) or 0)
        self.sites = sites_from_spec(model, self.protocol.sites, self.name)
        self.hidden_size = hidden_size
        _check_sizes(self.protocol, self.name, hidden_size, self.sites)
        _check_claims(self.protocol, self.name, self.objective, hidden_size, self.sites, self.measure_steps)
        _check_no_checkpointing(model)
        self.token_counts = token_counts
        self._counts_given = token_counts is not None
        # per-batch statistics in float32 by default (halves the cost inside training; every
        # running sum stays float64, so per-unit relative error stays ~1e-7); exact=True: float64
        self.compute_dtype = torch.float64 if exact else torch.float32
        self._init_measurement_state()
        self._windows = _UnitWindows(self.measure_steps, self.window, self.protocol.proxies.fit_window)
        if verbose:
            print(self.describe(), file=sys.stderr)

    def _init_measurement_state(self) -> None:
        """The state the training steps fill: nothing fitted, measured or open yet."""
        self._schedule = _ScheduleRecord()
        self._fit_sample = _FitSample(self.sites)
        self.bases: dict[str, list[BasisSet]] | None = None
        self.buckets: torch.Tensor | None = None
        self.n_buckets = 1
        self.artifacts: list[UnitArtifact] = []
        self.concept_cards: list[dict] = []
        self._open: _OpenUnit | None = None
        self._sequence_counter = 0
        self._capture: _StepCapture | None = None
        self._started_at = None
        self._seen_length = 0

    def describe(self) -> str:
        """One line: what will be measured, where, and where the bundle goes."""
        return _description(self)

    def schedule(self) -> dict[str, Any]:
        """The schedule that actually ran, as far as the meter saw it: the training steps it was
        called on, the learning rate read from the optimiser at each ("not known" without
        `optimizer=`), and the driver's settings (`schedule_settings`)."""
        return self._schedule.as_dict(self.schedule_settings)

    # -- per step -------------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Install the probes for training step `step` (no-op on steps that are not measured); the
        step and the optimiser's learning rate are recorded for the schedule."""
        if self._capture is not None:
            self.end()
        self._schedule.see(step, self.optimizer)
        fit = step in self.fit_steps and self.bases is None
        measure = self._windows.start(step) is not None
        if not (fit or measure):
            return
        if _checkpointing(self.model):  # switched on after the meter was made
            raise AnistatInputError("TrainingMeter: gradient checkpointing is not supported (it re-runs the forward)")
        if self._started_at is None:
            from .bundle import utc_now

            self._started_at = utc_now()
        self._capture = _StepCapture(self.model, self.sites, step, fit=fit, measure=measure)

    def end(self) -> None:
        """After the step's backward: read ∂L/∂h, update the statistics, remove the probes."""
        if self._capture is None:
            return
        capture, self._capture = self._capture, None
        capture.close()
        if capture.fit:
            per_step = math.ceil(self.protocol.proxies.max_fit_tokens / max(1, len(self.fit_steps)))
            seed = derive_seed(self.protocol.seed, self.name, capture.step, "fit")
            self._fit_sample.add(capture, self.sites, per_step, seed)
            if capture.step == self.fit_steps[-1]:
                self._fit()
        if capture.measure:
            if self.bases is None:
                self._fit()
            self._add_measure(capture)

    @contextlib.contextmanager
    def step(self, step: int):
        """`with meter.step(i): loss.backward()` — probes around one training step."""
        self.begin(step)
        try:
            yield self
        except BaseException:
            if self._capture is not None:
                self._capture.close()
                self._capture = None
            raise
        self.end()

    # -- fitting --------------------------------------------------------------------------------
    def _fit(self) -> None:
        """Freeze the proxies and controls of every site, and the token frequency buckets."""
        sample = self._fit_sample
        if not any(sample.rows[s.name] for s in self.sites):
            raise AnistatInputError("TrainingMeter: no activations were seen on the fit steps (did the model run?)")
        seen = torch.cat(sample.ids) if sample.ids else torch.zeros(0, dtype=torch.long)
        self.vocab_size, self.token_counts, self.n_buckets, self.buckets = _frequency_table(
            self.token_counts, seen, self.vocab_size, self.protocol.data.n_frequency_buckets
        )
        frozen = fits_frozen(self.protocol)
        self.bases = _fit_bases(self, sample) if frozen else {site.name: [] for site in self.sites}
        sample.release()

    # -- measuring ------------------------------------------------------------------------------
    def _add_measure(self, capture: _StepCapture) -> None:
        """Add the step's forwards to the open unit (opening it, or closing the previous one, as
        the step's window says); batches whose gradients are not finite are skipped and counted."""
        step, record = capture.step, capture.record
        start = self._windows.start(step)
        if self._open is not None and self._open.start != start:
            self._close_unit()
        if self._open is None:
            self._open = _OpenUnit(
                start,
                _unit_bases(self, capture, start),
                n_buckets=self.n_buckets,
                vocab_size=self.vocab_size,
                device=self.device,
                dtype=self.compute_dtype,
                pair_budget_bytes=int(self.protocol.data.frequency_ci_memory_mb * 2**20) // len(self.sites),
            )
        for f in range(len(record.all_deltas[self.sites[0].name])):
            grads, activations, ids = capture.forward(f, self.sites, self.device)
            if not all(bool(torch.isfinite(g.sum())) for g in grads.values()):  # NaN/Inf propagate into the sum
                self._open.skipped += 1
                continue
            batch, length = ids.shape[:2]
            self._seen_length = max(self._seen_length, int(length))
            used = length - 1 if self.objective == "clm" else length
            ids = ids[:, :used].to(self.device).clamp(0, self.vocab_size - 1)
            onehot = torch.nn.functional.one_hot(self.buckets.to(self.device)[ids], self.n_buckets)
            self._open.add(grads, activations, ids, onehot, used, step)
            self._open.sequences.extend(range(self._sequence_counter, self._sequence_counter + batch))
            self._sequence_counter += batch
            capture.release(f, self.sites)
        self._publish_live(step)
        if step == start + self.window - 1:
            self._close_unit()

    def _publish_live(self, step: int) -> None:
        """The open unit's live point estimates (`anistat.live`), when a publisher is set."""
        if self.publish_live is None or self._open is None or self.bases is None:
            return
        if self._live is None:
            self._live = LiveMetrics(self._open.bases, self.publish_live, oracle_every=self.live_oracle_every)
        self._live.bases, self._live.publish = self._open.bases, self.publish_live
        self._live(self._open.live_moments(), step)

    def _close_unit(self) -> None:
        """Finish the open unit: one artifact per site, saved to `<out>.units/` as it is made."""
        start = self._open.start
        if len(self._open.sequences) < 2:
            # a unit needs two sequences for its moments; a window whose batches were all skipped
            # (non-finite gradients) or never ran a forward is left out, and training goes on
            warnings.warn(
                AnistatWarning(
                    f"TrainingMeter: the unit at step {start} has {len(self._open.sequences)} finite sequence(s) "
                    f"({self._open.skipped} batch(es) skipped for non-finite gradients); it needs at least 2 "
                    "and is left out of the bundle"
                ),
                stacklevel=3,
            )
            self._open = None
            return
        phase = self._windows.phase(start)
        for site in self.sites:
            key = UnitKey(self.name, self.objective, f"step{start}", start, phase, site.layer, site.name)
            artifact = self._open.finish(key, self.protocol, self.window)
            artifact.save(self.units_dir)
            self.artifacts.append(artifact)
        self._open = None

    # -- finalisation ---------------------------------------------------------------------------
    def close(self) -> RunResult:
        """Finish the open unit and write the bundle at `out`; returns the `RunResult`."""
        if self._capture is not None:
            self.end()
        if self._open is not None:
            self._close_unit()
        if not self.artifacts:
            raise AnistatInputError("TrainingMeter: no measured step was reached; nothing to write")
        return _write_bundle(self)


def _trainer_callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a dependency
        return object
    return TrainerCallback


class AnistatCallback(_trainer_callback_base()):
    """`transformers.TrainerCallback` measuring at chosen optimiser steps (see `TrainingMeter`).

    Step numbering: the step about to run, `state.global_step` at `on_step_begin` (0 = the
    first update, measured on the initial weights). Gradient accumulation is supported (every
    micro-batch of a measured step is measured). Everything is checked in `on_train_begin`,
    before the first step, against the model and the `TrainingArguments` (`TrainingMeter`'s
    checks, with `max_steps`, a resumed run's first step and gradient checkpointing from the
    Trainer). The bundle is written at `on_train_end` and is available as `callback.result`;
    if writing it fails, `on_train_end` warns (`AnistatWarning`, the reason in `callback.error`,
    the measured units kept in `<out>.units/`) instead of raising, so the rest of the user's
    script — saving the model — still runs. Only the main process measures under multi-process
    training.

    Live metrics: with ``live=True`` (the default) each measured step's uncorrected point
    estimates (`anistat.live`: energy fractions, against k/d and the oracle, scalars named
    ``anistat/<site>/<proxy>_k<k>/<metric>``) go through ``Trainer.log``, so every ``report_to``
    integration shows them at the measured steps and ``trainer.state.log_history`` keeps them.
    ``live=False`` publishes nothing; the bundle is the same either way.
    """

    def __init__(
        self,
        protocol: Protocol | str | Path | dict | None = None,
        *,
        out: str | Path,
        measure_steps: Iterable[int],
        fit_steps: Iterable[int] | None = None,
        window: int = 1,
        live: bool = True,
        **kwargs: Any,
    ):
        self.live = live
        self._args = dict(
            protocol=protocol,
            out=out,
            measure_steps=list(measure_steps),
            fit_steps=None if fit_steps is None else list(fit_steps),
            window=window,
            **kwargs,
        )
        self.meter: TrainingMeter | None = None
        self.result = None
        self.error: BaseException | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise AnistatInputError("AnistatCallback: the Trainer passed no model")
        if getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None):
            raise AnistatInputError(
                "AnistatCallback: gradient checkpointing is not supported (it re-runs the "
                "forward); set gradient_checkpointing=False in TrainingArguments"
            )
        if not getattr(state, "is_world_process_zero", True):
            return
        max_steps = int(getattr(state, "max_steps", 0) or 0) or (args.max_steps if args.max_steps > 0 else None)
        training = None
        if max_steps:
            world = int(getattr(args, "world_size", 1) or 1)
            training = {
                "steps": max_steps,
                "batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * world,
                "learning_rate": float(args.learning_rate),
                "weight_decay": float(args.weight_decay),
                "warmup_steps": int(args.get_warmup_steps(max_steps)),
            }
        self.meter = TrainingMeter(
            model,
            max_steps=max_steps,
            first_step=int(state.global_step or 0),
            training=training,
            optimizer=kwargs.get("optimizer"),
            **self._args,
        )
        self.meter.driver = "AnistatCallback"
        scheduler = getattr(args, "lr_scheduler_type", None)
        world = int(getattr(args, "world_size", 1) or 1)
        self.meter.schedule_settings = {
            "max_steps": max_steps or NOT_KNOWN,
            "effective_batch": args.per_device_train_batch_size * args.gradient_accumulation_steps * world,
            "scheduler": str(getattr(scheduler, "value", scheduler) or NOT_KNOWN),
            "weight_decay": float(args.weight_decay),
            "warmup_steps": int(args.get_warmup_steps(max_steps)) if max_steps else NOT_KNOWN,
        }
        if self.live:
            trainer = find_trainer(self)
            if trainer is None:
                warnings.warn(
                    AnistatWarning(
                        "AnistatCallback: the Trainer calling this callback was not found; live "
                        "metrics are not published (the bundle is unaffected)"
                    ),
                    stacklevel=2,
                )
            else:
                own = self.meter.publish_live  # a `logger=` passed through, if any, also gets them

                def publish(scalars: dict[str, float], step: int) -> None:
                    trainer.log(dict(scalars))
                    if own is not None:
                        own(scalars, step)

                self.meter.publish_live = publish

    def on_step_begin(self, args, state, control, **kwargs):
        if self.meter is not None:
            if self.meter.optimizer is None and kwargs.get("optimizer") is not None:
                self.meter.optimizer = kwargs["optimizer"]
            self.meter.begin(state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.meter is not None:
            self.meter.end()

    def on_step_end(self, args, state, control, **kwargs):
        if self.meter is not None:
            self.meter.end()

    def on_train_end(self, args, state, control, **kwargs):
        if self.meter is None:
            return
        try:
            self.result = self.meter.close()
        except Exception as error:  # noqa: BLE001 - never break the user's script after training
            self.error = error
            kept = (
                f"; the measured units are kept in {self.meter.units_dir} (anistat.collect.finalize_bundle)"
                if self.meter.units_dir.is_dir()
                else ""
            )
            warnings.warn(AnistatWarning(f"AnistatCallback: no bundle was written: {error}{kept}"), stacklevel=2)
