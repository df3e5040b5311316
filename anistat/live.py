"""Live metrics: the measurement's cheap numbers, published while the model trains.

On every measured step `TrainingMeter` (and so `AnistatCallback`) already holds the open unit's
gradient second moment ``M = Σ g gᵀ`` per site (the running sum of `SiteAccumulator`) and the
frozen proxy bases ``U`` (d × k). From these it publishes, per site, proxy method and rank k:

* ``energy_fraction``     ``E(U) = tr(UᵀMU) / tr(M)`` — the share of the gradient energy in U;
* ``energy_over_k_d``     ``E(U) / (k/d)`` — against a uniformly spread (isotropic) gradient;
* ``oracle_fraction``     ``E*_k`` = (sum of the k largest eigenvalues of M) / tr(M) — the most any
  rank-k subspace captures;
* ``energy_over_oracle``  ``E(U) / E*_k`` (1 = as good as the top-k eigenvectors).

Scalar names: ``anistat/<site>/<proxy>_k<k>/<metric>``, e.g.
``anistat/residual.3/pca_k8/energy_fraction``; the step is the training step measured.

**Uncorrected point estimates.** These are the unit's point estimates *so far* (with
``window=1``, that step's batches; with a window of w steps, the window's batches up to this
step): no random controls, no confidence interval, no p-value, no multiplicity correction.
They show how the measurement moves while the model trains; the bundle written at the end
(`results.csv`, the report) is the analysis. Publishing them reads the accumulators and changes
nothing the bundle is built from.

**The oracle's eigenvalues.** ``E*_k`` needs the top k eigenvalues of the d × d matrix M: one
float32 ``eigvalsh`` per site (`top_eigenvalues`), the one O(d³) part of the live metrics. At
d = 768 it is ~0.1 s on one CPU thread (see benchmarks/README.md, "Live metrics"); where that is
too much for a short step, ``live_oracle_every=n`` (`TrainingMeter`, `AnistatCallback`) computes the oracle on every n-th measured step
only (the first included) — on the others ``oracle_fraction`` and ``energy_over_oracle`` are not
published, never carried over from an earlier step.

Where they go: under the Trainer, through ``Trainer.log`` (every ``report_to`` integration —
TensorBoard, W&B, MLflow, … — shows them, under its ``train/`` prefix, and
``trainer.state.log_history`` keeps them); in a plain loop, to ``TrainingMeter(logger=...)``: a
TensorBoard ``SummaryWriter`` (anything with ``add_scalar(name, value, step)``) or any callable
``(name, value, step)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .collect import BasisSet

#: every live scalar's name starts with this (one group in TensorBoard and W&B)
PREFIX = "anistat"

Publish = Callable[[dict[str, float], int], None]


def top_eigenvalues(matrix: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest eigenvalues of a symmetric positive semi-definite matrix, descending, as
    float64, from one float32 ``eigvalsh`` on the matrix's device (each eigenvalue to within
    ~1e-7·λ_max, so the oracle fraction to ~1e-6 relative; float32 costs about 0.6× float64)."""
    return torch.linalg.eigvalsh(matrix.to(torch.float32)).flip(0)[:k].to(torch.float64)


def scalar_name(site: str, proxy: str, rank: int, metric: str) -> str:
    """``anistat/<site>/<proxy>_k<rank>/<metric>``."""
    return f"{PREFIX}/{site}/{proxy}_k{rank}/{metric}"


class LiveMetrics:
    """Computes the live point estimates (module docstring) from each site's second moment and
    hands them to `publish(scalars, step)`; the oracle on every `oracle_every`-th call."""

    def __init__(self, bases: Mapping[str, list[BasisSet]], publish: Publish, *, oracle_every: int = 1):
        if oracle_every < 1:
            raise ValueError(f"oracle_every must be at least 1, got {oracle_every}")
        self.bases = bases
        self.publish = publish
        self.oracle_every = int(oracle_every)
        self.calls = 0

    def point_estimates(self, second_moments: Mapping[str, torch.Tensor], *, oracle: bool = True) -> dict[str, float]:
        """``{scalar name: value}`` from ``{site: M}`` (sites whose M has zero trace are left out;
        ``oracle=False`` leaves out the oracle and the energy against it)."""
        scalars: dict[str, float] = {}
        for site, m in second_moments.items():
            m = m.to(torch.float64)
            trace = float(torch.trace(m))
            if not trace > 0:
                continue
            d = m.shape[0]
            top = top_eigenvalues(m, max(s.rank for s in self.bases[site])) if oracle else None
            for basis_set in self.bases[site]:
                k = basis_set.rank
                u = basis_set.basis.to(device=m.device, dtype=torch.float64)
                fraction = float(((m @ u) * u).sum()) / trace  # tr(UᵀMU) / tr(M)
                values = {"energy_fraction": fraction, "energy_over_k_d": fraction / (k / d)}
                if top is not None:
                    best = float(top[:k].sum()) / trace
                    values["oracle_fraction"] = best
                    values["energy_over_oracle"] = fraction / best if best > 0 else float("nan")
                scalars.update(
                    {scalar_name(site, basis_set.proxy, k, metric): value for metric, value in values.items()}
                )
        return scalars

    def __call__(self, second_moments: Mapping[str, torch.Tensor], step: int) -> dict[str, float]:
        scalars = self.point_estimates(second_moments, oracle=self.calls % self.oracle_every == 0)
        self.calls += 1
        if scalars:
            self.publish(scalars, step)
        return scalars


def logger_publisher(logger: Any) -> Publish:
    """`publish(scalars, step)` for a plain loop's `logger`: a TensorBoard `SummaryWriter` (or
    anything with ``add_scalar(name, value, step)``) or a callable ``(name, value, step)``."""
    add_scalar = getattr(logger, "add_scalar", None)
    if callable(add_scalar):

        def to_writer(scalars: dict[str, float], step: int) -> None:
            for name, value in scalars.items():
                add_scalar(name, value, step)

        return to_writer
    if callable(logger):

        def to_callable(scalars: dict[str, float], step: int) -> None:
            for name, value in scalars.items():
                logger(name, value, step)

        return to_callable
    raise TypeError(
        f"logger must be a SummaryWriter-like object with add_scalar(name, value, step) or a callable "
        f"(name, value, step); got {type(logger).__name__}"
    )


def find_trainer(callback: Any, depth: int = 12) -> Any:
    """The `transformers.Trainer` whose callback handler is calling `callback` now (searched in
    the calling frames), or None. The `TrainerCallback` API hands callbacks no reference to the
    Trainer, and only ``Trainer.log`` reaches every ``report_to`` integration."""
    import sys
    from types import FrameType

    try:
        from transformers import Trainer
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in getattr(candidate.callback_handler, "callbacks", []):
            return candidate
        frame = frame.f_back
    return None
