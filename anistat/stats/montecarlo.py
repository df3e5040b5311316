"""Monte-Carlo p-values against a finite set of control (null) draws.

Convention (Davison & Hinkley 1997, eq. 4.11; Phipson & Smyth 2010): with ``n`` control values
``q_1..q_n`` and an observed value ``u``,

* ``alternative="greater"``:  ``p = (1 + #{q_j >= u}) / (1 + n)``
* ``alternative="less"``:     ``p = (1 + #{q_j <= u}) / (1 + n)``
* ``alternative="two-sided"``: ``p = min(1, 2 * min(p_greater, p_less))`` (the doubled
  one-sided p-value, the same convention as ``scipy.stats.permutation_test``).

Ties count against the observed value (conservative). The smallest attainable one-sided
p-value is ``1 / (n + 1)``; see :func:`anistat.stats.multiplicity.min_controls_needed`.
Under exchangeability of the observed basis with the controls the one-sided p-value is exactly
valid: ``P(p <= a) <= a`` for every ``a``.

NaN controls are dropped (``n`` counts finite controls only); a NaN observed value gives NaN.
"""

from __future__ import annotations

import numpy as np

from ._validation import check_alternative


def monte_carlo_pvalue(observed, null, alternative: str = "greater"):
    """Monte-Carlo p-value of ``observed`` against the control values ``null``.

    Vectorised: ``observed`` has shape ``(...)`` and ``null`` shape ``(..., n)`` (broadcast
    over the leading axes), e.g. ``observed (m,)`` and ``null (m, n)`` for ``m`` units at once.
    Returns a Python float for scalar input, else an ndarray of shape ``(...)``.
    """
    check_alternative(alternative)
    obs = np.asarray(observed, dtype=np.float64)
    nul = np.asarray(null, dtype=np.float64)
    if nul.ndim == 0:
        raise ValueError("null must have at least one axis (the controls)")
    obs_b = obs[..., None]
    finite = np.isfinite(nul)
    n = finite.sum(axis=-1)
    ge = ((nul >= obs_b) & finite).sum(axis=-1)
    le = ((nul <= obs_b) & finite).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_greater = (1.0 + ge) / (1.0 + n)
        p_less = (1.0 + le) / (1.0 + n)
    if alternative == "greater":
        p = p_greater
    elif alternative == "less":
        p = p_less
    else:
        p = np.minimum(1.0, 2.0 * np.minimum(p_greater, p_less))
    p = np.where(np.isfinite(obs) & (n > 0), p, np.nan)
    if p.ndim == 0:
        return float(p)
    return p


def min_attainable_pvalue(n_controls: int) -> float:
    """Smallest one-sided Monte-Carlo p-value with ``n_controls`` controls: ``1/(n+1)``."""
    return 1.0 / (int(n_controls) + 1)
