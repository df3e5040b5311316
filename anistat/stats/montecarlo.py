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

**Sequential stopping** (:class:`SequentialMonteCarlo`, Besag & Clifford 1991, "Sequential Monte
Carlo p-values", Biometrika 78:301–304): read the null draws in order and stop once ``h`` of them
reach the observed value, or after ``n`` draws. With the ``h``-th exceedance at draw ``L ≤ n``,
``p = h / L``; otherwise ``p = (1 + g) / (1 + n)`` with ``g < h`` exceedances (the fixed-``n``
p-value above). The p-value is exactly valid (``P(p ≤ a) ≤ a`` under exchangeability, for every
``a``) and a test whose p-value is large stops after about ``h / p`` draws, so only tests near or
past the significance threshold pay for all ``n``; a test that stops is never significant at any
level below ``h / n``. ``h = 0`` turns stopping off (every test uses ``n`` draws).
"""

from __future__ import annotations

import numpy as np

from ._validation import check_alternative


def monte_carlo_pvalue(observed, null, alternative: str = "greater"):
    """Monte-Carlo p-value of ``observed`` against the control values ``null``.

    Vectorised over the leading axes, e.g. ``observed (m,)`` and ``null (m, n)`` for ``m`` units
    at once. ``p = (1 + #{q_j >= u}) / (1 + n)`` for ``"greater"`` (see the module).

    Parameters
    ----------
    observed : float or array_like of shape (...)
        The observed value(s) ``u``.
    null : array_like of shape (..., n)
        The control values ``q_j`` along the last axis, broadcast against ``observed``; NaN
        controls are dropped.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        ``"greater"`` counts ``q_j >= u``, ``"less"`` ``q_j <= u``; two-sided doubles the smaller.

    Returns
    -------
    float or ndarray of shape (...)
        A Python float for scalar input, else an array; NaN for a NaN observed value or no
        finite control.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.monte_carlo_pvalue(0.9, [0.1, 0.5, 0.95, 0.2])
    0.4
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
    """Smallest one-sided Monte-Carlo p-value with ``n_controls`` controls: ``1/(n+1)``.

    Parameters
    ----------
    n_controls : int
        The number of controls ``n``.

    Returns
    -------
    float
        ``1 / (n + 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.min_attainable_pvalue(19)
    0.05
    """
    return 1.0 / (int(n_controls) + 1)


class SequentialMonteCarlo:
    """Monte-Carlo p-values of ``m`` tests read off one stream of null draws, each stopping on its own.

    Feed the null values in draw order with :meth:`update` (``(m, c)``, one column per draw, at
    most :attr:`remaining` columns) while :attr:`active` has any test; read :meth:`p_values` and
    :attr:`draws_used`. A NaN observed value gives a NaN p-value (the test is never active).

    Parameters
    ----------
    observed : array_like of shape (m,)
        The observed values of the ``m`` tests.
    n_max : int
        The most draws any test uses (``n``), at least 1.
    stop_after : int, default 0
        ``h``: a test stops at its ``h``-th exceedance, ``p = h / L``; 0 turns stopping off.
        ``two-sided`` tests never stop (both tails are counted).
    alternative : {"greater", "less", "two-sided"}, default "greater"
        The tail tested.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> mc = stats.SequentialMonteCarlo(np.array([0.9, 0.2]), n_max=99, stop_after=5)
    >>> mc.update(np.random.default_rng(0).uniform(size=(2, 99)))
    >>> mc.p_values().round(4).tolist(), mc.draws_used.tolist()
    ([0.1282, 1.0], [39, 5])
    """

    def __init__(self, observed, n_max: int, stop_after: int = 0, alternative: str = "greater") -> None:
        check_alternative(alternative)
        self.observed = np.asarray(observed, dtype=np.float64).ravel()
        self.n_max = int(n_max)
        if self.n_max < 1:
            raise ValueError(f"n_max must be >= 1, got {n_max}")
        self.stop_after = 0 if alternative == "two-sided" else int(stop_after)
        self.alternative = alternative
        m = self.observed.size
        self.exceed = np.zeros(m, dtype=np.int64)  # draws >= observed (greater) or <= (less)
        self.exceed_low = np.zeros(m, dtype=np.int64)  # two-sided only: draws <= observed
        self.draws_used = np.zeros(m, dtype=np.int64)
        self.stopped = np.zeros(m, dtype=bool)
        self.active = np.isfinite(self.observed)

    @property
    def remaining(self) -> int:
        """Draws the slowest active test may still use (0 when every test is done)."""
        if not self.active.any():
            return 0
        return int(self.n_max - self.draws_used[self.active].min())

    def update(self, null) -> None:
        """Count the next draws (``(m, c)``, draw order along axis 1) for the active tests."""
        values = np.asarray(null, dtype=np.float64)
        if values.ndim != 2 or values.shape[0] != self.observed.size:
            raise ValueError(f"null must have shape (m={self.observed.size}, c), got {values.shape}")
        tests = np.flatnonzero(self.active)
        if tests.size == 0 or values.shape[1] == 0:
            return
        # every active test has used the same number of draws (they start together)
        width = min(values.shape[1], self.n_max - int(self.draws_used[tests].max()))
        chunk, observed = values[tests, :width], self.observed[tests, None]
        high = chunk >= observed
        if self.alternative == "two-sided":
            self.exceed[tests] += high.sum(axis=1)
            self.exceed_low[tests] += (chunk <= observed).sum(axis=1)
            self.draws_used[tests] += width
        else:
            hits = high if self.alternative == "greater" else chunk <= observed
            running = self.exceed[tests, None] + np.cumsum(hits, axis=1)
            stop = (running >= self.stop_after) if self.stop_after else np.zeros_like(hits)
            stops = stop.any(axis=1)
            first = np.argmax(stop, axis=1)
            self.exceed[tests] = np.where(stops, self.stop_after, running[:, -1])
            self.draws_used[tests] += np.where(stops, first + 1, width)
            self.stopped[tests] |= stops
        self.active[tests] = ~self.stopped[tests] & (self.draws_used[tests] < self.n_max)

    def p_values(self) -> np.ndarray:
        """``h / L`` for tests that stopped, ``(1 + g) / (1 + n)`` otherwise (see the module)."""
        used = self.draws_used.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.alternative == "two-sided":
                high = (1.0 + self.exceed) / (1.0 + used)
                low = (1.0 + self.exceed_low) / (1.0 + used)
                p = np.minimum(1.0, 2.0 * np.minimum(high, low))
            else:
                p = np.where(self.stopped, self.exceed / used, (1.0 + self.exceed) / (1.0 + used))
        return np.where(np.isfinite(self.observed) & (used > 0), p, np.nan)


def sequential_monte_carlo_pvalue(observed, null, stop_after: int, alternative: str = "greater"):
    """:class:`SequentialMonteCarlo` on a whole ``(m, n)`` array of null draws (``observed`` ``(m,)``),
    or a scalar observed value and ``(n,)`` draws.

    Parameters
    ----------
    observed : float or array_like of shape (m,)
        The observed value(s).
    null : array_like of shape (m, n) or (n,)
        The null draws in draw order along the last axis.
    stop_after : int
        ``h``, the exceedances that stop a test (0: no stopping).
    alternative : {"greater", "less", "two-sided"}, default "greater"
        The tail tested.

    Returns
    -------
    p_values : float or ndarray of shape (m,)
        ``h / L`` for a test that stopped at draw ``L``, else ``(1 + g) / (1 + n)``.
    draws_used : int or ndarray of int, shape (m,)
        The draws each test read (scalars for a scalar ``observed``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> null = rng.uniform(size=999)
    >>> stats.sequential_monte_carlo_pvalue(0.5, null, stop_after=10)
    (0.6666666666666666, 15)
    """
    obs = np.asarray(observed, dtype=np.float64)
    nul = np.asarray(null, dtype=np.float64)
    scalar = obs.ndim == 0
    obs, nul = np.atleast_1d(obs), (nul[None, :] if nul.ndim == 1 else nul)
    engine = SequentialMonteCarlo(obs, nul.shape[1], stop_after, alternative)
    engine.update(nul)
    p, used = engine.p_values(), engine.draws_used
    return (float(p[0]), int(used[0])) if scalar else (p, used)
