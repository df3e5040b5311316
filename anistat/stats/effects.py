"""Effect sizes for a proxy basis against matched random controls.

Notation: ``E(U)`` the proxy's energy fraction, ``E(Q_j)`` the controls' (``j = 1..n``),
``k`` the rank, ``d`` the dimension, ``E*_k`` the oracle fraction.

* ratio ``R = E(U) / mean_j E(Q_j)``; ``log2 R``.
* ``z = (E(U) - mean_j E(Q_j)) / sd_j E(Q_j)`` with the sample sd (``ddof=1``).
* anisotropy capture ``(E(U) - k/d) / (E*_k - k/d)`` (NaN when ``E*_k <= k/d``).
* Hedges' g for *paired* per-sequence fractions: with ``d_s = f_U(s) - f_C(s)`` where
  ``f_U(s) = proxy_energy_s / total_energy_s`` and ``f_C(s) = mean_j control_energy_sj /
  total_energy_s``, the standardised mean difference of the paired differences
  (Cohen's ``d_z``) times the small-sample correction ``J``::

      g = J(S - 1) * mean_s(d_s) / sd_s(d_s)      (sd with ddof=1)
      J(nu) = Gamma(nu/2) / (sqrt(nu/2) Gamma((nu - 1)/2))   (~ 1 - 3 / (4 nu - 1))

  This is ``g_z`` ("d_z with Hedges' correction"), not the between-groups ``g_av``: it scales
  the mean paired difference by the sd of the differences, which is what the paired
  sign-flip test also uses.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import gammaln


def hedges_correction(df: ArrayLike) -> np.ndarray | float:
    """Exact small-sample correction ``J(df) = Gamma(df/2) / (sqrt(df/2) Gamma((df-1)/2))``.

    Parameters
    ----------
    df : float or array_like
        Degrees of freedom ``nu`` (``S - 1`` for ``S`` paired differences); NaN where ``df <= 1``.

    Returns
    -------
    float or ndarray
        ``J(df)``, a float for a scalar ``df``, else an array of ``df``'s shape.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> round(float(stats.hedges_correction(9)), 4)
    0.9139
    """
    df = np.asarray(df, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        j = np.exp(gammaln(df / 2) - gammaln((df - 1) / 2)) / np.sqrt(df / 2)
    j = np.where(df > 1, j, np.nan)
    return float(j) if j.ndim == 0 else j


def energy_ratio(proxy_fraction: float, control_fractions: ArrayLike) -> float:
    """``E(U) / mean_j E(Q_j)``.

    Parameters
    ----------
    proxy_fraction : float
        The proxy's energy fraction ``E(U)``.
    control_fractions : array_like of shape (n,)
        The controls' energy fractions ``E(Q_j)``.

    Returns
    -------
    float
        The ratio ``R`` (inf or NaN when the controls' mean is 0).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.energy_ratio(0.4, [0.1, 0.2, 0.3])
    1.9999999999999998
    """
    c = np.asarray(control_fractions, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(proxy_fraction) / c.mean())


def log2_energy_ratio(proxy_fraction: float, control_fractions: ArrayLike) -> float:
    """``log2(E(U) / mean_j E(Q_j))`` (NaN for a non-positive ratio).

    Parameters
    ----------
    proxy_fraction : float
        The proxy's energy fraction ``E(U)``.
    control_fractions : array_like of shape (n,)
        The controls' energy fractions ``E(Q_j)``.

    Returns
    -------
    float
        ``log2 R``; NaN when ``R <= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.log2_energy_ratio(0.4, [0.1, 0.2, 0.3])
    0.9999999999999999
    """
    r = energy_ratio(proxy_fraction, control_fractions)
    return float(np.log2(r)) if r > 0 else np.nan


def z_score(observed: float, control_values: ArrayLike) -> float:
    """``(observed - mean(controls)) / sd(controls)`` with ``ddof=1`` (NaN if sd is 0).

    Parameters
    ----------
    observed : float
        The proxy's value.
    control_values : array_like of shape (n,)
        The controls' values; non-finite ones are dropped.

    Returns
    -------
    float
        The z-score; NaN with fewer than 2 finite controls or a zero sd.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> round(stats.z_score(0.9, [0.5, 0.6, 0.55, 0.58]), 4)
    7.8748
    """
    c = np.asarray(control_values, dtype=np.float64)
    c = c[np.isfinite(c)]
    if c.size < 2:
        return np.nan
    sd = c.std(ddof=1)
    if not sd > 0:
        return np.nan
    return float((float(observed) - c.mean()) / sd)


def hedges_g_paired(differences: ArrayLike) -> float:
    """Hedges' ``g_z`` of paired differences: ``J(S-1) mean(d) / sd(d)`` (see module doc).

    Parameters
    ----------
    differences : array_like of shape (S,)
        Paired per-sequence differences ``d_s``; non-finite ones are dropped.

    Returns
    -------
    float
        ``g_z`` (sd with ``ddof=1``); NaN with fewer than 3 finite differences or a zero sd.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> round(stats.hedges_g_paired([0.3, 0.5, 0.2, 0.4, 0.6]), 4)
    2.0185
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size < 3:
        return np.nan
    sd = d.std(ddof=1)
    if not sd > 0:
        return np.nan
    return float(hedges_correction(d.size - 1) * d.mean() / sd)


def anisotropy_capture(fraction: ArrayLike, rank: int, dim: int, oracle_fraction: float) -> np.ndarray | float:
    """``(E - k/d) / (E*_k - k/d)``; vectorised over ``fraction``; NaN if ``E*_k <= k/d``.

    Parameters
    ----------
    fraction : float or array_like
        Energy fraction(s) ``E`` of the basis.
    rank : int
        The rank ``k`` of the basis.
    dim : int
        The dimension ``d`` of the space; ``k/d`` is the isotropic baseline.
    oracle_fraction : float
        The oracle fraction ``E*_k`` (the best rank-``k`` capture).

    Returns
    -------
    float or ndarray
        The capture, 0 at the isotropic baseline and 1 at the oracle; a float for a scalar
        ``fraction``, else an array of its shape.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> round(float(stats.anisotropy_capture(0.5, rank=2, dim=16, oracle_fraction=0.8)), 4)
    0.5556
    """
    base = rank / dim
    denom = np.float64(oracle_fraction) - base
    f = np.asarray(fraction, dtype=np.float64)
    out = (f - base) / denom if denom > 0 else np.full(f.shape, np.nan)
    return float(out) if out.ndim == 0 else out


def per_sequence_differences(
    proxy_energy: ArrayLike, control_energy: ArrayLike, total_energy: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence ``d_s = (proxy_s - mean_j control_sj) / total_s`` and the validity mask.

    Sequences with ``total_s <= 0`` (no gradient energy) are invalid (NaN).

    Parameters
    ----------
    proxy_energy : array_like of shape (S,)
        Each sequence's gradient energy in the proxy subspace.
    control_energy : array_like of shape (S, n)
        Each sequence's gradient energy in each of the ``n`` control subspaces.
    total_energy : array_like of shape (S,)
        Each sequence's total gradient energy.

    Returns
    -------
    differences : ndarray of shape (S,)
        ``d_s``, NaN for an invalid sequence.
    valid : ndarray of bool, shape (S,)
        ``total_s > 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> d, valid = stats.per_sequence_differences([2.0, 3.0], [[1.0, 3.0], [1.0, 1.0]], [4.0, 0.0])
    >>> d.tolist(), valid.tolist()
    ([0.0, nan], [True, False])
    """
    p = np.asarray(proxy_energy, dtype=np.float64)
    c = np.asarray(control_energy, dtype=np.float64)
    t = np.asarray(total_energy, dtype=np.float64)
    valid = t > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(valid, (p - c.mean(axis=1)) / t, np.nan)
    return d, valid
