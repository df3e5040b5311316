"""Multiple-testing correction and the Monte-Carlo resolution guard.

``adjust_pvalues`` wraps ``statsmodels.stats.multitest.multipletests``; NaN p-values stay NaN
and are excluded from the family (so ``m`` counts only real tests).

Resolution guard: with ``n`` controls the smallest Monte-Carlo p-value is ``1/(n+1)``. A test
can only be declared significant after correction if that floor is at most the strictest
threshold a single test may face:

* ``bonferroni``: ``alpha / m``;
* ``holm``: ``alpha / m`` (the first step-down threshold; every rejection needs the smallest
  p-value to pass it);
* ``fdr_bh``: ``alpha / m`` in the worst case (a single true effect is rejected only when
  ``p <= alpha / m``; with many true effects BH is more lenient, up to ``alpha``) — we guard the
  worst case, because which case applies is unknown before the data;
* ``none``: ``alpha``.

So ``1/(n+1) <= alpha/m``, i.e. ``n >= m/alpha - 1``.
"""

from __future__ import annotations

import math

import numpy as np
from statsmodels.stats.multitest import multipletests

METHODS = ("holm", "fdr_bh", "bonferroni")
_NAMES = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg", "bonferroni": "Bonferroni",
          "none": "uncorrected"}


def adjust_pvalues(p, method: str = "holm") -> np.ndarray:
    """Adjusted p-values (same shape as ``p``); NaNs stay NaN and are not counted in ``m``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    arr = np.asarray(p, dtype=np.float64)
    out = np.full(arr.shape, np.nan)
    flat = arr.ravel()
    ok = np.isfinite(flat)
    if ((flat[ok] < 0) | (flat[ok] > 1)).any():
        raise ValueError("p-values must lie in [0, 1]")
    if ok.any():
        adj = multipletests(flat[ok], method=method)[1]
        res = out.ravel()
        res[ok] = adj
        out = res.reshape(arr.shape)
    return out


def adjust_in_families(df, family_columns, method: str = "holm", p_column: str = "p_value",
                       out_column: str = "p_adjusted"):
    """Return a copy of ``df`` with ``out_column`` = p-values adjusted within each family.

    ``family_columns``: list of column names defining a family (e.g. ``["model"]``), or an
    empty list / ``None`` / ``"run"`` for one family made of all rows with a p-value. Rows with
    NaN p-values (or a NaN family key) get NaN.
    """
    out = df.copy()
    if family_columns in (None, "run") or len(family_columns) == 0:
        out[out_column] = adjust_pvalues(out[p_column].to_numpy(dtype=float), method)
        return out
    if isinstance(family_columns, str):
        family_columns = [family_columns]
    adjusted = np.full(len(out), np.nan)
    pvals = out[p_column].to_numpy(dtype=float)
    for _, idx in out.groupby(list(family_columns), sort=False, dropna=True).indices.items():
        adjusted[idx] = adjust_pvalues(pvals[idx], method)
    out[out_column] = adjusted
    return out


def _threshold(alpha: float, n_tests: int, method: str) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if int(n_tests) < 1:
        raise ValueError(f"n_tests must be >= 1, got {n_tests}")
    if method == "none":
        return alpha
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS + ('none',)}, got {method!r}")
    return alpha / int(n_tests)


def min_controls_needed(alpha: float = 0.05, n_tests: int = 1, method: str = "holm") -> int:
    """Smallest ``n`` with ``1/(n+1) <= threshold`` (see module docstring): ``ceil(m/alpha) - 1``."""
    thr = _threshold(alpha, n_tests, method)
    n = math.ceil(1.0 / thr - 1e-9) - 1
    return max(n, 1)


def resolution_warning(n_controls: int, alpha: float = 0.05, n_tests: int = 1,
                       method: str = "holm") -> str | None:
    """A one-line warning when ``n_controls`` cannot reach significance, else ``None``."""
    need = min_controls_needed(alpha, n_tests, method)
    if int(n_controls) >= need:
        return None
    floor = 1.0 / (int(n_controls) + 1)
    fam = (f"{_NAMES[method]}-corrected family of {int(n_tests)} tests" if method != "none"
           else "test")
    return (f"{int(n_controls)} controls give a floor of 1/{int(n_controls) + 1} ≈ {floor:.3g}, "
            f"which no {fam} at alpha={alpha:g} can pass; use ≥ {need} controls")
