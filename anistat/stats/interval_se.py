"""One standard error per result row, consistent with the row's interval.

A row's ``se`` is the *interval-implied* standard error: the SE for which the Wald interval
``θ̂ ± z·se`` on the interval's own working scale has the width of the reported interval, mapped
to the row's scale by the delta method::

    z        = Φ⁻¹((1 + ci_level)/2)                    (the run's nominal level, not the
                                                          tail-expanded one)
    linear   se = (ci_high − ci_low) / (2 z)             (BCa, percentile, … on the row's scale)
    log      se_log = (ln ci_high − ln ci_low) / (2 z)   (bootstrap-t on the log scale)
             se     = θ̂ · se_log                          (delta method: d θ = θ d ln θ)

Why not the standard deviation of the bootstrap replicates: on skewed rows the replicates' SD and
a studentized (bootstrap-t) interval disagree by more than 2× (the SD follows the bulk of the
replicates, the interval the pivot's tails), so a pooled analysis weighting rows by the SD
overweights exactly the rows whose interval says they are least certain. With this definition a
meta-analysis that reads ``se`` (``anistat.claims``: ``se/θ̂`` on the log scale for ratio
metrics) gets the same weights as one that recovers the SE from the interval's width.

A monotone map of an interval (``z`` and ``anisotropy_capture`` of the fraction interval,
``log2`` of the ratio interval) maps its SE by the same map's derivative; clipping a mapped
interval to the metric's range does not change the SE (it is taken before clipping).

At the edges the SE claims no precision the interval denies:

* **unbounded** — an end the method could not bound (``unbounded``: the interval's
  ``ci_unbounded`` code, also when the end was then clipped to the metric's range, e.g. a
  fraction's ``[0, 1]``), an infinite end, or on the log scale a lower end at 0: ``se = inf``;
* **no interval** (NaN ends: withheld for too few units, or not computable): ``se = NaN``.

Either way a meta-analysis leaves the row out (``anistat.claims`` counts it on the claim) rather
than weighting it by the bootstrap replicates' SD, which on these rows is small exactly because
the few documents that hold the energy rarely move it. :data:`SE_NOTES` says which on the row.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from .. import vocabulary as vocab
from ._validation import check_ci_level
from .ratio_intervals import RATIO_INTERVAL_METHODS, STUDENTIZED_LOG

#: The note a row carries beside a non-finite ``se``: ``inf`` (unbounded interval), NaN (none).
SE_NOTES = {
    "inf": "se = inf: the interval is unbounded, so it implies no finite SE (a meta-analysis leaves the row out)",
    "nan": "se = NaN: no interval, so no interval-implied SE (a meta-analysis leaves the row out)",
}


def se_note(se: float) -> str:
    """:data:`SE_NOTES`' sentence for a non-finite ``se``; "" for a finite one."""
    if np.isfinite(se):
        return ""
    return SE_NOTES["nan" if np.isnan(se) else "inf"]


def interval_implied_se(
    estimate: float, ci_low: float, ci_high: float, ci_level: float, *, log_scale: bool, unbounded: bool = False
) -> float:
    """The interval-implied SE of ``estimate`` on its own scale (module docstring): ``inf`` for an
    unbounded interval, NaN without one.

    Parameters
    ----------
    estimate : float
        The row's estimate ``θ̂``.
    ci_low : float
        Lower end of its interval.
    ci_high : float
        Upper end of its interval.
    ci_level : float
        The run's nominal coverage; ``z = Φ⁻¹((1 + ci_level)/2)``.
    log_scale : bool
        The interval was built on ``ln θ`` (the studentized ratio intervals), so the SE is
        ``θ̂ (ln hi − ln lo) / (2 z)``; else ``(hi − lo) / (2 z)``.
    unbounded : bool, default False
        The method could not bound an end (its ``ci_unbounded`` code), even if the end shown was
        clipped to the metric's range afterwards.

    Returns
    -------
    float
        The interval-implied SE; ``inf`` for an unbounded interval, NaN without an interval.

    Examples
    --------
    >>> from anistat.stats.interval_se import interval_implied_se
    >>> round(interval_implied_se(2.0, 1.0, 4.0, 0.95, log_scale=True), 4)
    0.7073
    >>> interval_implied_se(9.8, 0.0, float("inf"), 0.95, log_scale=True)
    inf
    >>> interval_implied_se(0.4, 0.0, 1.0, 0.95, log_scale=True, unbounded=True)
    inf
    >>> interval_implied_se(0.4, float("nan"), float("nan"), 0.95, log_scale=False)
    nan
    """
    z = float(ndtri(0.5 + check_ci_level(ci_level) / 2.0))
    theta, low, high = float(estimate), float(ci_low), float(ci_high)
    if np.isnan(theta) or np.isnan(low) or np.isnan(high) or high < low:
        return float("nan")
    if unbounded or not (np.isfinite(low) and np.isfinite(high)) or (log_scale and low <= 0):
        return float("inf")
    if log_scale:
        if not theta > 0:
            return float("nan")
        return float(theta * (np.log(high) - np.log(low)) / (2.0 * z))
    return float((high - low) / (2.0 * z))


#: The energy interval methods built for a positive ratio, whose SE is read on the log scale: the
#: studentized (log-scale bootstrap-t; ``studentized_log`` in :mod:`.ratio_intervals`) and the
#: ratio-of-means intervals of :mod:`.ratio_intervals`.
LOG_SCALE_METHODS = (vocab.STUDENTIZED, *(m for m in RATIO_INTERVAL_METHODS if m != STUDENTIZED_LOG))


def interval_log_scale(method: str) -> bool:
    """Whether an energy interval of this ``method`` is read on the log scale: the studentized
    ratio intervals (``anistat.stats.energy``) and the ratio-of-means intervals are, BCa and
    percentile are not.

    Parameters
    ----------
    method : str
        The interval method actually used (:attr:`BootstrapResult.method`).

    Returns
    -------
    bool
        ``method in LOG_SCALE_METHODS``.
    """
    return method in LOG_SCALE_METHODS
