"""Streaming first and second moments of per-token gradients.

:class:`GradientMoments` keeps the sufficient statistics of a gradient cloud ``G`` (N, d)
without keeping ``G``:

* ``count`` = N,
* ``sum``   = Σ_i g_i            (d,),   float64,
* ``outer`` = Σ_i g_i g_iᵀ = GᵀG (d, d), float64.

They are plain sums, so chunks can be merged in any order and across processes (an
all-reduce of ``count``, ``sum`` and ``outer`` under torch.distributed is exact).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ._util import as_float64, as_tensor

__all__ = ["GradientMoments"]


@dataclass(kw_only=True)
class GradientMoments:
    """Streaming sufficient statistics of a point cloud (usually per-token gradients).

    Attributes
    ----------
    count : int
        Number of points seen (N).
    sum : Tensor (d,), float64
        Σ_i g_i.
    outer : Tensor (d, d), float64
        Σ_i g_i g_iᵀ (the uncentred second moment ``GᵀG``).

    ``update`` and ``merge`` modify the object in place and return it.  Statistics live on
    the device of the first chunk (or the device given to :meth:`zeros`).

    Numerical note: :meth:`covariance` uses ``(outer − N·μμᵀ)/(N−1)`` in float64; this
    loses relative precision only when ‖mean‖ dwarfs the spread by ~1e7, which gradients
    never do.
    """

    count: int = 0
    sum: torch.Tensor | None = None
    outer: torch.Tensor | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def zeros(cls, dim: int, device: torch.device | str | None = None) -> GradientMoments:
        """Empty statistics for dimension ``dim``."""
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        return cls(
            count=0,
            sum=torch.zeros(dim, dtype=torch.float64, device=device),
            outer=torch.zeros(dim, dim, dtype=torch.float64, device=device),
        )

    @classmethod
    def from_points(cls, points: Any) -> GradientMoments:
        """Statistics of a whole (N, d) array at once."""
        g = as_float64(points, name="points", ndim=2)
        return cls.zeros(g.shape[1], device=g.device).update(g)

    # ------------------------------------------------------------------ streaming
    @property
    def dim(self) -> int | None:
        return None if self.sum is None else int(self.sum.shape[0])

    def update(self, points: Any) -> GradientMoments:
        """Add a chunk of points (N, d) (or one point (d,)); returns ``self``."""
        g = as_float64(points, name="points", ndim=(1, 2))
        if g.ndim == 1:
            g = g.unsqueeze(0)
        if self.sum is None:
            self.sum = torch.zeros(g.shape[1], dtype=torch.float64, device=g.device)
            self.outer = torch.zeros(g.shape[1], g.shape[1], dtype=torch.float64, device=g.device)
        total, outer = self._sums()
        if g.shape[1] != total.shape[0]:
            raise ValueError(f"points have dimension {g.shape[1]}, moments have {total.shape[0]}")
        g = g.to(total.device)
        self.count += int(g.shape[0])
        total += g.sum(dim=0)
        outer += g.T @ g
        return self

    def merge(self, other: GradientMoments) -> GradientMoments:
        """Add another set of statistics into this one (in place); returns ``self``."""
        if other.sum is None:
            return self
        other_sum, other_outer = other._sums()
        if self.sum is None:
            self.count = other.count
            self.sum = other_sum.clone()
            self.outer = other_outer.clone()
            return self
        total, outer = self._sums()
        if other_sum.shape != total.shape:
            raise ValueError(f"cannot merge moments of dimension {other_sum.shape[0]} into {total.shape[0]}")
        self.count += int(other.count)
        total += other_sum.to(total.device, torch.float64)
        outer += other_outer.to(outer.device, torch.float64)
        return self

    def __add__(self, other: GradientMoments) -> GradientMoments:
        return self.copy().merge(other)

    def copy(self) -> GradientMoments:
        return GradientMoments(
            count=self.count,
            sum=None if self.sum is None else self.sum.clone(),
            outer=None if self.outer is None else self.outer.clone(),
        )

    def to(self, device: torch.device | str) -> GradientMoments:
        """A copy on ``device``."""
        return GradientMoments(
            count=self.count,
            sum=None if self.sum is None else self.sum.to(device),
            outer=None if self.outer is None else self.outer.to(device),
        )

    # ------------------------------------------------------------------ derived
    def _sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Σ g_i, Σ g_i g_iᵀ)`` of moments that hold at least one point (both are set together)."""
        if self.sum is None or self.outer is None:
            raise ValueError("GradientMoments holds no points")
        return self.sum, self.outer

    def _require(self, minimum: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sum is None or self.count < minimum:
            raise ValueError(f"GradientMoments needs at least {minimum} point(s), has {self.count}")
        return self._sums()

    @property
    def second_moment(self) -> torch.Tensor:
        """``GᵀG = Σ_i g_i g_iᵀ`` (uncentred, not divided by N) — what energy fractions and the
        oracle use."""
        return self._require(1)[1]

    @property
    def mean(self) -> torch.Tensor:
        """Σ_i g_i / N."""
        return self._require(1)[0] / self.count

    @property
    def total_energy(self) -> float:
        """Σ_i ‖g_i‖² = tr(GᵀG)."""
        return float(torch.trace(self._require(1)[1]))

    def covariance(self) -> torch.Tensor:
        """Unbiased covariance ``(GᵀG − N μμᵀ)/(N − 1)`` — identical to ``torch.cov(G.T)``."""
        total, outer = self._require(2)
        mu = total / self.count
        cov = (outer - self.count * torch.outer(mu, mu)) / (self.count - 1)
        return 0.5 * (cov + cov.T)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """``{"count": int, "sum": ndarray (d,), "outer": ndarray (d, d)}`` (float64, CPU)."""
        if self.sum is None:
            return {"count": 0, "sum": None, "outer": None}
        total, outer = self._sums()
        return {
            "count": int(self.count),
            "sum": total.detach().cpu().numpy().copy(),
            "outer": outer.detach().cpu().numpy().copy(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], device: torch.device | str | None = None) -> GradientMoments:
        """Inverse of :meth:`to_dict`."""
        if data.get("sum") is None:
            return cls()
        s = as_tensor(np.asarray(data["sum"]), name="sum").to(torch.float64)
        o = as_tensor(np.asarray(data["outer"]), name="outer").to(torch.float64)
        if s.ndim != 1 or o.shape != (s.shape[0], s.shape[0]):
            raise ValueError(f"inconsistent shapes sum {tuple(s.shape)} / outer {tuple(o.shape)}")
        if device is not None:
            s, o = s.to(device), o.to(device)
        return cls(count=int(data["count"]), sum=s, outer=o)
