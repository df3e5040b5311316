"""Across models / seeds / checkpoints: random-effects meta-analysis and trend tests.

``random_effects_meta`` uses ``statsmodels.stats.meta_analysis.combine_effects``. Default
``method="dl"``: DerSimonian–Laird moment estimator of the between-study variance
``tau2 = max(0, (Q - (k-1)) / (sum w - sum w^2 / sum w))`` with ``w = 1/v``; ``"pm"`` gives
Paule–Mandel (statsmodels supplies ``tau2`` and ``Q``; ``tau2`` is truncated at 0, which
statsmodels' DL does not do). Estimate ``mu = sum w* y / sum w*`` with ``w* = 1/(v + tau2)``,
``se = 1/sqrt(sum w*)``, Wald CI ``mu ± z se`` and two-sided normal p-value for ``mu = 0``.
``Q`` is Cochran's heterogeneity statistic, ``I2 = max(0, (Q - (k-1)) / Q)``.
Typical input: log2 energy ratios and their bootstrap variances (``se**2``).

``trend_test`` fits ``estimate = a + b * step`` by weighted least squares (weights
``1/variance``; ordinary least squares without variances) with statsmodels and tests
``b = 0`` (t-test, ``n - 2`` df). With known variances the slope's covariance uses the
given variances directly (``cov_type="fixed scale"``) — the meta-regression convention.
It also tests early vs late: the first ``early_fraction`` of the sorted steps against the
rest — with variances an inverse-variance weighted difference and a z-test, without a Welch
t-test.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class MetaResult:
    estimate: float
    se: float
    ci_low: float
    ci_high: float
    tau2: float
    i2: float
    q: float
    p_value: float
    k: int
    method: str = "dl"


@dataclass(frozen=True)
class TrendResult:
    slope: float
    slope_se: float
    ci_low: float
    ci_high: float
    p_value: float
    intercept: float
    n: int
    early_mean: float
    late_mean: float
    difference: float  # late - early
    difference_se: float
    difference_p_value: float
    weighted: bool


def random_effects_meta(estimates, variances, method: str = "dl",
                        ci_level: float = 0.95) -> MetaResult:
    """Random-effects pooled estimate (NaN pairs are dropped)."""
    from statsmodels.stats.meta_analysis import combine_effects

    if method not in ("dl", "pm"):
        raise ValueError(f"method must be 'dl' or 'pm', got {method!r}")
    y = np.asarray(estimates, dtype=np.float64).ravel()
    v = np.asarray(variances, dtype=np.float64).ravel()
    if y.shape != v.shape:
        raise ValueError("estimates and variances must have the same length")
    ok = np.isfinite(y) & np.isfinite(v)
    y, v = y[ok], v[ok]
    if (v <= 0).any():
        raise ValueError("variances must be positive")
    k = y.size
    if k == 0:
        return MetaResult(*(np.nan,) * 8, 0, method)
    if k == 1:
        se = float(np.sqrt(v[0]))
        zc = sps.norm.ppf(0.5 + ci_level / 2)
        return MetaResult(float(y[0]), se, y[0] - zc * se, y[0] + zc * se, 0.0, 0.0, 0.0,
                          float(2 * sps.norm.sf(abs(y[0]) / se)), 1, method)
    res = combine_effects(y, v, method_re="chi2" if method == "dl" else "iterated",
                          alpha=1 - ci_level)
    tau2 = max(0.0, float(res.tau2))  # statsmodels does not truncate DL's tau2 at 0
    w = 1.0 / (v + tau2)
    est = float((w * y).sum() / w.sum())
    se = float(1.0 / np.sqrt(w.sum()))
    q = float(res.q)
    i2 = max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0
    zc = sps.norm.ppf(0.5 + ci_level / 2)
    p = float(2 * sps.norm.sf(abs(est) / se))
    return MetaResult(est, se, est - zc * se, est + zc * se, tau2, float(i2), q, p, int(k),
                      method)


def trend_test(steps, estimates, variances=None, ci_level: float = 0.95,
               early_fraction: float = 0.5) -> TrendResult:
    """Linear trend of ``estimates`` over ``steps`` plus an early-vs-late difference test."""
    import statsmodels.api as sm

    x = np.asarray(steps, dtype=np.float64).ravel()
    y = np.asarray(estimates, dtype=np.float64).ravel()
    v = None if variances is None else np.asarray(variances, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(y) & (np.ones_like(y, bool) if v is None else np.isfinite(v))
    x, y = x[ok], y[ok]
    v = None if v is None else v[ok]
    n = x.size
    if n < 3:
        raise ValueError(f"trend_test needs at least 3 points, got {n}")
    exog = sm.add_constant(x, has_constant="add")
    if v is None:
        fit = sm.OLS(y, exog).fit()
    else:
        if (v <= 0).any():
            raise ValueError("variances must be positive")
        fit = sm.WLS(y, exog, weights=1.0 / v).fit(cov_type="fixed scale")
    slope, se = float(fit.params[1]), float(fit.bse[1])
    lo, hi = fit.conf_int(alpha=1 - ci_level)[1]
    order = np.argsort(x, kind="stable")
    n_early = min(max(1, int(round(early_fraction * n))), n - 1)
    e, l_ = order[:n_early], order[n_early:]
    if v is None:
        em, lm = float(y[e].mean()), float(y[l_].mean())
        if e.size > 1 and l_.size > 1:
            tt = sps.ttest_ind(y[l_], y[e], equal_var=False)
            dse = float(np.sqrt(y[e].var(ddof=1) / e.size + y[l_].var(ddof=1) / l_.size))
            dp = float(tt.pvalue)
        else:
            dse, dp = np.nan, np.nan
    else:
        we, wl = 1 / v[e], 1 / v[l_]
        em, lm = float((we * y[e]).sum() / we.sum()), float((wl * y[l_]).sum() / wl.sum())
        dse = float(np.sqrt(1 / we.sum() + 1 / wl.sum()))
        dp = float(2 * sps.norm.sf(abs(lm - em) / dse))
    return TrendResult(slope, se, float(lo), float(hi), float(fit.pvalues[1]),
                       float(fit.params[0]), int(n), em, lm, lm - em, dse, dp, v is not None)
