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
Where the interval is undefined (non-finite or not positive on the log scale) the replicates'
SD (``fallback``) is returned, so a row without an interval keeps the bootstrap's spread.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from .. import vocabulary as vocab
from ._validation import check_ci_level
from .ratio_intervals import RATIO_INTERVAL_METHODS, STUDENTIZED_LOG


def interval_implied_se(
    estimate: float, ci_low: float, ci_high: float, ci_level: float, *, log_scale: bool, fallback: float = float("nan")
) -> float:
    """The interval-implied SE of ``estimate`` on its own scale (module docstring).

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
    fallback : float, default nan
        Returned when the interval cannot give an SE (e.g. the replicates' SD).

    Returns
    -------
    float
        The interval-implied SE, or ``fallback``.
    """
    z = float(ndtri(0.5 + check_ci_level(ci_level) / 2.0))
    theta, low, high = float(estimate), float(ci_low), float(ci_high)
    if not (np.isfinite(theta) and np.isfinite(low) and np.isfinite(high) and high >= low):
        return float(fallback)
    if log_scale:
        if not (low > 0 and theta > 0):
            return float(fallback)
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
