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


@dataclass
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
        if g.shape[1] != self.sum.shape[0]:
            raise ValueError(f"points have dimension {g.shape[1]}, moments have {self.sum.shape[0]}")
        g = g.to(self.sum.device)
        self.count += int(g.shape[0])
        self.sum += g.sum(dim=0)
        self.outer += g.T @ g
        return self

    def merge(self, other: GradientMoments) -> GradientMoments:
        """Add another set of statistics into this one (in place); returns ``self``."""
        if other.sum is None:
            return self
        if self.sum is None:
            self.count = other.count
            self.sum = other.sum.clone()
            self.outer = other.outer.clone()
            return self
        if other.sum.shape != self.sum.shape:
            raise ValueError(f"cannot merge moments of dimension {other.sum.shape[0]} into {self.sum.shape[0]}")
        self.count += int(other.count)
        self.sum += other.sum.to(self.sum.device, torch.float64)
        self.outer += other.outer.to(self.outer.device, torch.float64)
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
    def _require(self, minimum: int) -> None:
        if self.sum is None or self.count < minimum:
            raise ValueError(f"GradientMoments needs at least {minimum} point(s), has {self.count}")

    @property
    def second_moment(self) -> torch.Tensor:
        """``GᵀG = Σ_i g_i g_iᵀ`` (uncentred, not divided by N) — what energy fractions and the
        oracle use."""
        self._require(1)
        return self.outer

    @property
    def mean(self) -> torch.Tensor:
        """Σ_i g_i / N."""
        self._require(1)
        return self.sum / self.count

    @property
    def total_energy(self) -> float:
        """Σ_i ‖g_i‖² = tr(GᵀG)."""
        self._require(1)
        return float(torch.trace(self.outer))

    def covariance(self) -> torch.Tensor:
        """Unbiased covariance ``(GᵀG − N μμᵀ)/(N − 1)`` — identical to ``torch.cov(G.T)``."""
        self._require(2)
        mu = self.sum / self.count
        cov = (self.outer - self.count * torch.outer(mu, mu)) / (self.count - 1)
        return 0.5 * (cov + cov.T)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """``{"count": int, "sum": ndarray (d,), "outer": ndarray (d, d)}`` (float64, CPU)."""
        if self.sum is None:
            return {"count": 0, "sum": None, "outer": None}
        return {
            "count": int(self.count),
            "sum": self.sum.detach().cpu().numpy().copy(),
            "outer": self.outer.detach().cpu().numpy().copy(),
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
