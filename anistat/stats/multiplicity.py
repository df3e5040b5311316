"""Multiple-testing correction and the Monte-Carlo resolution guard.

``adjust_pvalues`` wraps ``statsmodels.stats.multitest.multipletests``; NaN p-values stay NaN
and are excluded from the family (so ``m`` counts only real tests).

Resolution guard: with ``n`` Monte-Carlo draws the smallest p-value is ``f = 1/(n+1)``.
Across ``m`` tests at level ``alpha``:

* ``bonferroni`` and ``holm``: a test is rejected only if its p-value is at most ``alpha/m``
  (Holm's first step); with ``f > alpha/m`` nothing can be rejected.
* ``fdr_bh``: the ``r`` smallest p-values are rejected when ``p_(r) <= r alpha/m``. With
  ``f > alpha/m`` a lone effect can never be detected, and any rejection needs at least
  ``ceil(f m / alpha)`` tests at or near the floor — so whether anything passes depends on how
  many effects there are, not only on the evidence of each.
* ``none``: ``f`` must be at most ``alpha``.

``min_controls_needed`` gives the smallest ``n`` with ``1/(n+1) <= alpha/m`` (``alpha`` for
``none``), i.e. ``n >= m/alpha - 1``: with it, every correction can reject any single test on
its own evidence. anistat draws at least that many Haar subspaces by default
(``stats.n_null_draws: auto``), so the floor never decides a result.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from statsmodels.stats.multitest import multipletests

from .. import vocabulary as vocab
from ._validation import check_choice

#: The corrections of :func:`adjust_pvalues` (:data:`anistat.vocabulary.CORRECTIONS`).
METHODS = vocab.CORRECTIONS


def adjust_pvalues(p: ArrayLike, method: str = vocab.HOLM) -> np.ndarray:
    """Adjusted p-values (same shape as ``p``); NaNs stay NaN and are not counted in ``m``.

    Parameters
    ----------
    p : array_like
        P-values in ``[0, 1]``, any shape; NaN for a missing test.
    method : {"holm", "fdr_bh", "bonferroni"}, default "holm"
        Holm's step-down, Benjamini–Hochberg FDR or Bonferroni (via statsmodels' formulas).

    Returns
    -------
    ndarray
        The adjusted p-values, of ``p``'s shape.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.adjust_pvalues([0.01, 0.04, 0.03], method='holm').tolist()
    [0.03, 0.06, 0.06]
    >>> stats.adjust_pvalues([0.01, 0.04, 0.03], method='fdr_bh').round(4).tolist()
    [0.03, 0.04, 0.04]
    """
    check_choice("method", method, METHODS)
    arr = np.asarray(p, dtype=np.float64)
    out = np.full(arr.shape, np.nan)
    flat = arr.ravel()
    ok = np.isfinite(flat)
    if ((flat[ok] < 0) | (flat[ok] > 1)).any():
        raise ValueError("p-values must lie in [0, 1]")
    if ok.any():
        adj = _holm(flat[ok]) if method == vocab.HOLM else multipletests(flat[ok], method=method)[1]
        res = out.ravel()
        res[ok] = adj
        out = res.reshape(arr.shape)
    return out


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment, ``max_{j ≤ i} min(1, (m − j + 1) p_(j))`` in sorted order —
    statsmodels' formula (``multipletests(method="holm")``, checked against it in the tests),
    written out because statsmodels runs ``gc.collect()`` on every Holm call (0.1 s each in a
    process holding torch, which adds up in simulations and per-claim families)."""
    order = np.argsort(p, kind="mergesort")
    m = p.size
    stepped = np.maximum.accumulate(p[order] * np.arange(m, 0, -1))
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out


def adjust_in_families(
    df: pd.DataFrame,
    family_columns: str | list[str] | None,
    method: str = vocab.HOLM,
    p_column: str = "p_value",
    out_column: str = "p_adjusted",
) -> pd.DataFrame:
    """Return a copy of ``df`` with ``out_column`` = p-values adjusted within each family.

    Rows with NaN p-values (or a NaN family key) get NaN.

    Parameters
    ----------
    df : pandas.DataFrame
        The tests, one a row; left unchanged.
    family_columns : str or list of str or None
        Column name(s) defining a family (e.g. ``["model"]``), or an empty list / ``None`` /
        ``"run"`` for one family made of all rows with a p-value.
    method : {"holm", "fdr_bh", "bonferroni"}, default "holm"
        The correction applied within each family (:func:`adjust_pvalues`).
    p_column : str, default "p_value"
        The column holding the p-values.
    out_column : str, default "p_adjusted"
        The column written with the adjusted p-values.

    Returns
    -------
    pandas.DataFrame
        A copy of ``df`` with ``out_column`` added (or replaced).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> import pandas as pd
    >>> df = pd.DataFrame({'model': ['a', 'a', 'b'], 'p_value': [0.01, 0.04, 0.03]})
    >>> stats.adjust_in_families(df, ['model'], method='holm')['p_adjusted'].tolist()
    [0.02, 0.04, 0.03]
    """
    check_choice("method", method, METHODS)
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
    if method == vocab.NO_CORRECTION:
        return alpha
    check_choice("method", method, (*METHODS, vocab.NO_CORRECTION))
    return alpha / int(n_tests)


def min_controls_needed(alpha: float = 0.05, n_tests: int = 1, method: str = vocab.HOLM) -> int:
    """Smallest ``n`` with ``1/(n+1) <= threshold`` (see module docstring): ``ceil(m/alpha) - 1``.

    Parameters
    ----------
    alpha : float, default 0.05
        The family-wise (or FDR) level, in ``(0, 1)``.
    n_tests : int, default 1
        The family's size ``m``, at least 1.
    method : {"holm", "fdr_bh", "bonferroni", "none"}, default "holm"
        The correction; the threshold is ``alpha/m``, or ``alpha`` for ``"none"``.

    Returns
    -------
    int
        The smallest number of Monte-Carlo draws ``n`` (at least 1) whose floor ``1/(n+1)``
        is at most the threshold.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.min_controls_needed(0.05, 1), stats.min_controls_needed(0.05, 10, method='bonferroni')
    (19, 199)
    """
    thr = _threshold(alpha, n_tests, method)
    n = math.ceil(1.0 / thr - 1e-9) - 1
    return max(n, 1)


def resolution_warning(
    n_controls: int, alpha: float = 0.05, n_tests: int = 1, method: str = vocab.HOLM, what: str = "controls"
) -> str | None:
    """A one-line warning when ``n_controls`` Monte-Carlo draws leave the floor above the
    corrected threshold of a single test (see the module docstring), else ``None``.

    Parameters
    ----------
    n_controls : int
        The Monte-Carlo draws ``n``; the p-value floor is ``1/(n+1)``.
    alpha : float, default 0.05
        The family-wise (or FDR) level, in ``(0, 1)``.
    n_tests : int, default 1
        The family's size ``m``.
    method : {"holm", "fdr_bh", "bonferroni", "none"}, default "holm"
        The correction.
    what : str, default "controls"
        The word naming the draws in the message.

    Returns
    -------
    str or None
        The warning, naming the floor, the threshold and the draws needed
        (:func:`min_controls_needed`); ``None`` when ``n_controls`` suffice.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.resolution_warning(99) is None
    True
    >>> print(stats.resolution_warning(9))
    9 controls give a p-value floor of 1/10 ≈ 0.1, above alpha/m = 0.05: no test of a Holm-corrected family of 1 tests at alpha=0.05 can be significant; use ≥ 19
    """
    need = min_controls_needed(alpha, n_tests, method)
    n = int(n_controls)
    if n >= need:
        return None
    floor = 1.0 / (n + 1)
    m = int(n_tests)
    if method == "none":
        return (
            f"{n} {what} give a p-value floor of 1/{n + 1} ≈ {floor:.3g}, above alpha={alpha:g}: no test can "
            f"be significant; use ≥ {need}"
        )
    family = f"{vocab.MULTIPLICITY[method].label}-corrected family of {m} tests at alpha={alpha:g}"
    if method == vocab.FDR_BH:
        at_least = math.ceil(floor * m / alpha - 1e-12)
        return (
            f"{n} {what} give a p-value floor of 1/{n + 1} ≈ {floor:.3g}, above alpha/m = {alpha / m:.3g} for a "
            f"{family}: a lone effect can never pass, and a rejection needs at least {at_least} tests at the "
            f"floor; use ≥ {need}"
        )
    return (
        f"{n} {what} give a p-value floor of 1/{n + 1} ≈ {floor:.3g}, above alpha/m = {alpha / m:.3g}: no test "
        f"of a {family} can be significant; use ≥ {need}"
    )
