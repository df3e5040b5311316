"""Shared input checks for :mod:`anistat.stats` (validate once at the public boundary)."""

from __future__ import annotations

import numpy as np

ALTERNATIVES = ("greater", "less", "two-sided")


class DegenerateStatisticWarning(RuntimeWarning):
    """A statistic could not be computed as requested (e.g. BCa fell back to percentile)."""


def check_alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    return alternative


def check_ci_level(ci_level: float) -> float:
    ci_level = float(ci_level)
    if not 0.0 < ci_level < 1.0:
        raise ValueError(f"ci_level must be in (0, 1), got {ci_level}")
    return ci_level


def check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_1d_float(x, name: str, *, finite: bool = True) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values")
    return arr
