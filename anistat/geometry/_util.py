"""Small shared helpers for :mod:`anistat.geometry` (input coercion, QR with a sign convention).

Internal module: nothing here is part of the public API.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "DegenerateMetricWarning",
    "as_float64",
    "as_tensor",
    "cpu_generator",
    "output_dtype",
    "qr_positive",
    "sym_eigvalsh",
]


class DegenerateMetricWarning(UserWarning):
    """A metric was requested in a degenerate case (zero energy, oracle at k/d, ...); the
    returned value is ``nan`` and the warning says why."""


def as_tensor(x: Any, *, name: str = "input") -> torch.Tensor:
    """Return ``x`` as a torch tensor without copying when it already is one.

    numpy arrays (and nested sequences) are converted; the device is kept for tensors."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    try:
        return torch.as_tensor(np.asarray(x))
    except Exception as exc:  # pragma: no cover - defensive
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x)!r}") from exc


def as_float64(x: Any, *, name: str = "input", ndim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Coerce to a float64 tensor on the input's device; optionally check the number of dims."""
    t = as_tensor(x, name=name)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if t.ndim not in allowed:
            raise ValueError(
                f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {tuple(t.shape)}"
            )
    if t.is_complex():
        raise TypeError(f"{name} must be real")
    return t.to(torch.float64)


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The input's floating dtype promoted to at least float32 (bf16/f16/int -> float32)."""
    if not dtype.is_floating_point:
        return torch.float32
    return torch.promote_types(dtype, torch.float32)


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: draws made with it are identical on every device
    because they are made on the CPU and then moved."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def qr_positive(a: torch.Tensor) -> torch.Tensor:
    """Reduced QR of ``a`` (..., d, k) with the sign ambiguity fixed: columns of Q are multiplied
    by sign(diag(R)) so that R has a non-negative diagonal.  For a Gaussian ``a`` this makes Q
    exactly Haar-distributed on the Stiefel manifold (plain LAPACK QR is not)."""
    q, r = torch.linalg.qr(a, mode="reduced")
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    signs = torch.where(diag < 0, -torch.ones_like(diag), torch.ones_like(diag))
    return q * signs.unsqueeze(-2)


def sym_eigvalsh(m: torch.Tensor) -> torch.Tensor:
    """Eigenvalues (ascending) of the symmetric part of ``m`` (..., d, d)."""
    return torch.linalg.eigvalsh(0.5 * (m + m.transpose(-1, -2)))


def warn_degenerate(message: str) -> None:
    warnings.warn(message, DegenerateMetricWarning, stacklevel=3)


def check_rank(rank: Any, d: int) -> int:
    """Validate ``1 <= rank < d`` and return it as an int."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise ValueError(f"rank must be an integer, got {rank!r}")
    rank = int(rank)
    if not 1 <= rank < d:
        raise ValueError(f"rank must satisfy 1 <= rank < d = {d}, got {rank}")
    return rank
