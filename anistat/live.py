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

**The oracle's eigenvalues.** Only the top ``K`` = max rank eigenvalues of the d × d matrix M are
needed, so instead of a full eigen-decomposition per step (O(d³)) `TopEigenvalues` runs block
subspace iteration on a (K + 8)-column block, warm-started from the previous step's block,
until the Ritz sum of the top K changes by less than ``1e-8`` relative (O(d²·(K + 8)) per
iteration; a few iterations once training is under way). Small problems (d ≤ 4·(K + 8)) and
blocks that do not settle within 60 iterations fall back to the full float64 ``eigvalsh``.

Where they go: under the Trainer, through ``Trainer.log`` (every ``report_to`` integration —
TensorBoard, W&B, MLflow, … — shows them, and ``trainer.state.log_history`` keeps them); in a
plain loop, to ``TrainingMeter(logger=...)``: a TensorBoard ``SummaryWriter`` (anything with
``add_scalar(name, value, step)``) or any callable ``(name, value, step)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .collect import BasisSet

#: every live scalar's name starts with this (one group in TensorBoard and W&B)
PREFIX = "anistat"

Publish = Callable[[dict[str, float], int], None]


class TopEigenvalues:
    """The ``k`` largest eigenvalues (descending, float64) of a sequence of symmetric positive
    semi-definite d × d matrices, by block subspace iteration warm-started from the previous call.

    Each iteration: ``Z = M Q``, Ritz values = eigenvalues of ``QᵀZ``, ``Q = qr(Z)``; stop when
    the sum of the top k Ritz values changes by at most ``rtol`` relative. Ritz values are lower
    bounds of the true eigenvalues (Cauchy interlacing), so an early stop can only understate
    the oracle. Falls back to a full ``eigvalsh`` when the block is not small against d, or when
    `max_iter` iterations do not settle (``self.full_solves`` counts those)."""

    def __init__(self, k: int, *, oversample: int = 8, rtol: float = 1e-8, max_iter: int = 60, seed: int = 0):
        self.k, self.width, self.rtol, self.max_iter, self.seed = int(k), int(k) + oversample, rtol, max_iter, seed
        self._block: torch.Tensor | None = None
        self.iterations = 0
        self.full_solves = 0

    def __call__(self, matrix: torch.Tensor) -> torch.Tensor:
        m = matrix.to(torch.float64)
        d = m.shape[0]
        if d <= 4 * self.width:
            self.full_solves += 1
            return torch.linalg.eigvalsh(m).flip(0)[: self.k]
        block = self._block
        if block is None or block.shape[0] != d or block.device != m.device:
            generator = torch.Generator().manual_seed(self.seed)
            block = torch.linalg.qr(torch.randn(d, self.width, generator=generator, dtype=torch.float64)
                                    .to(m.device))[0]
        previous = None
        for _ in range(self.max_iter):
            self.iterations += 1
            product = m @ block
            ritz = torch.linalg.eigvalsh(block.T @ product).flip(0)[: self.k]
            block = torch.linalg.qr(product)[0]
            total = float(ritz.sum())
            if previous is not None and abs(total - previous) <= self.rtol * max(abs(total), 1e-300):
                self._block = block
                return ritz
            previous = total
        self._block = None
        self.full_solves += 1
        return torch.linalg.eigvalsh(m).flip(0)[: self.k]


def scalar_name(site: str, proxy: str, rank: int, metric: str) -> str:
    """``anistat/<site>/<proxy>_k<rank>/<metric>``."""
    return f"{PREFIX}/{site}/{proxy}_k{rank}/{metric}"


class LiveMetrics:
    """Computes the live point estimates (module docstring) from each site's second moment and
    hands them to `publish(scalars, step)`; one `TopEigenvalues` per site keeps the warm start."""

    def __init__(self, bases: Mapping[str, list[BasisSet]], publish: Publish):
        self.bases = bases
        self.publish = publish
        self._top = {site: TopEigenvalues(max(s.rank for s in sets)) for site, sets in bases.items()}

    def point_estimates(self, second_moments: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """``{scalar name: value}`` from ``{site: M}`` (sites whose M has zero trace are left out)."""
        scalars: dict[str, float] = {}
        for site, m in second_moments.items():
            m = m.to(torch.float64)
            trace = float(torch.trace(m))
            if not trace > 0:
                continue
            d = m.shape[0]
            top = self._top[site](m)
            for basis_set in self.bases[site]:
                k = basis_set.rank
                u = basis_set.basis.to(device=m.device, dtype=torch.float64)
                fraction = float(((m @ u) * u).sum()) / trace  # tr(UᵀMU) / tr(M)
                oracle = float(top[:k].sum()) / trace
                values = {"energy_fraction": fraction, "energy_over_k_d": fraction / (k / d), "oracle_fraction": oracle,
                          "energy_over_oracle": fraction / oracle if oracle > 0 else float("nan")}
                scalars.update({scalar_name(site, basis_set.proxy, k, metric): value
                                for metric, value in values.items()})
        return scalars

    def __call__(self, second_moments: Mapping[str, torch.Tensor], step: int) -> dict[str, float]:
        scalars = self.point_estimates(second_moments)
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
    raise TypeError(f"logger must be a SummaryWriter-like object with add_scalar(name, value, step) or a callable "
                    f"(name, value, step); got {type(logger).__name__}")


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
