"""Across models / seeds / checkpoints: random-effects meta-analysis and trend tests.

**Random effects** (``random_effects_meta``): rows ``y_i`` with sampling variances ``v_i``,
``y_i = mu + u_i + e_i``, ``u_i ~ N(0, tau2)``. Between-row variance ``tau2``:

* ``"dl"`` DerSimonian–Laird moment estimator ``max(0, (Q − (k−1)) / (Σw − Σw²/Σw))``,
  ``w = 1/v`` (via ``statsmodels.stats.meta_analysis.combine_effects``, truncated at 0, which
  statsmodels' DL does not do);
* ``"pm"`` Paule–Mandel (statsmodels' iterated estimator);
* ``"reml"`` restricted maximum likelihood: ``tau2 ≥ 0`` maximising
  ``−½ [Σ log(v_i + tau2) + log Σ w*_i + Σ w*_i (y_i − mu*)²]`` — at an interior optimum it
  solves ``tau2 = Σ w*²((y − mu*)² − v) / Σ w*² + 1/Σ w*`` (Viechtbauer 2005). statsmodels has
  no REML for meta-analysis; the tests check it against metafor's published BCG numbers.

Estimate ``mu = Σ w* y / Σ w*`` with ``w* = 1/(v + tau2)``. Intervals: ``"wald"``
``mu ± z se``, ``se = 1/√Σw*``, normal p-value; ``"hksj"`` Hartung–Knapp–Sidik–Jonkman
``mu ± t_{k−1} se_HK``, ``se_HK² = s / Σ w*`` with the scale factor
``s = Σ w* (y − mu)² / (k − 1)``, p-value from ``t_{k−1}``. HKSJ keeps its coverage with few
rows, where the Wald interval is too narrow — but untruncated (``s < 1``, e.g. ``tau2 = 0`` and
``Q < k − 1``) it can be far *narrower* than the Wald interval (k = 3: (0.084, 0.133) against
Wald's (−0.068, 0.285)). By default the usual safeguard applies: the scale factor is
``max(1, s)`` (Knapp & Hartung 2003's ad hoc correction, metafor's ``test="adhoc"``, Jackson et
al. 2017), so ``se_HK`` is never below the Wald SE; ``hksj_safeguard=False`` gives the
untruncated interval (statsmodels' "random effect wls", metafor's ``test="knha"``).
``MetaResult.hksj_scale`` records ``s`` and ``safeguard_applied`` whether ``max(1, s)`` changed
it. Checked against metafor's published BCG output (REML, ``test="knha"``: −0.7145, SE 0.1808,
t −3.9522 on 12 df, 95 % CI (−1.1084, −0.3206); there ``s`` > 1, so both rules agree).
``Q`` is Cochran's statistic, ``I2 = max(0, (Q − (k−1)) / Q)``.

**Dependent rows.** Rows computed on the same data (e.g. the layers × ranks × checkpoints of one
model share its test sequences) are not independent studies; pooling them as if they were
shrinks the SE by about √(rows per model). Two remedies:

* ``aggregate_clusters``: one summary per cluster (the independent unit, e.g. the model) — the
  mean of its rows, with variance ``(Σ_i v_i + rho Σ_{i≠j} √(v_i v_j)) / k_j²`` under a common
  within-cluster correlation ``rho``; ``rho = 1`` (default) is the Cauchy–Schwarz upper bound,
  exact when the rows are perfectly correlated and conservative otherwise. The summaries are
  then pooled by ``random_effects_meta``.
* ``robust_meta``: robust variance estimation (Hedges, Tipton & Jackson 2010) — intercept-only
  weighted least squares over all rows with "correlated effects" working weights
  ``w_ij = 1/(k_j (v̄_j + tau2))`` and a cluster sandwich variance, valid whatever the
  within-cluster correlation. Small-sample correction CR2 (Bell & McCaffrey 2002; Tipton 2015):
  for an intercept-only model it is exactly
  ``V = Σ_j (Σ_i w_ij e_ij)² / (1 − W_j/W) / W²``, ``W_j = Σ_i w_ij``, ``W = Σ_j W_j``,
  ``e = y − mu``; CR0 omits the ``1/(1 − W_j/W)``. Interval and test use ``t_{m−1}`` (m
  clusters; HTJ 2010). Tipton (2015) shows Satterthwaite degrees of freedom to be better when
  clusters are few or unbalanced: with fewer than about 10 clusters the interval is approximate.

``trend_test`` fits ``estimate = a + b * step`` by weighted least squares (weights
``1/variance``; ordinary least squares without variances) with statsmodels and tests
``b = 0`` (t-test, ``n - 2`` df). With known variances the slope's covariance uses the
given variances directly (``cov_type="fixed scale"``) — the meta-regression convention.
It also tests early vs late: the first ``early_fraction`` of the sorted steps against the
rest — with variances an inverse-variance weighted difference and a z-test, without a Welch
t-test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize
from scipy import stats as sps

from ._validation import check_choice

META_METHODS = ("dl", "pm", "reml")
META_INTERVALS = ("wald", "hksj")
#: Small-sample corrections of the robust (sandwich) variance: Bell–McCaffrey CR2, or none (CR0).
SMALL_SAMPLE_CORRECTIONS = ("CR2", "CR0")


@dataclass(frozen=True, kw_only=True)
class MetaResult:
    """Random-effects pooled estimate of ``k`` estimates (:func:`random_effects_meta`): the
    estimate, its SE and interval, the between-study variance ``tau2``, ``I²``, Cochran's ``Q``
    with its p-value, and the ``method`` and ``interval`` used.

    Attributes
    ----------
    estimate : float
        The pooled estimate ``mu = Σ w* y / Σ w*``, ``w* = 1/(v + tau2)``.
    se : float
        Its standard error (Wald ``1/√Σw*``, or HKSJ's ``se_HK``).
    ci_low : float
        Lower end of the ``ci_level`` interval.
    ci_high : float
        Upper end of the ``ci_level`` interval.
    tau2 : float
        The between-row variance (truncated at 0).
    i2 : float
        ``I2 = max(0, (Q − (k−1)) / Q)``.
    q : float
        Cochran's ``Q``.
    p_value : float
        Two-sided p-value of ``mu = 0`` (normal for Wald, ``t_{k−1}`` for HKSJ).
    k : int
        The number of rows pooled (finite pairs).
    method : {"dl", "pm", "reml"}
        The ``tau2`` estimator.
    interval : {"wald", "hksj"}
        The interval used (``"wald"`` for a single row).
    df : float
        Degrees of freedom of the interval's t quantile (inf: normal).
    hksj_scale : float
        HKSJ's scale factor ``s = Σw*(y − mu)²/(k − 1)`` (NaN: not HKSJ).
    safeguard_applied : bool
        HKSJ: ``s < 1`` was raised to 1 (the Wald SE, with ``t_{k−1}``).
    excluded : int
        Rows left out: a non-finite estimate or variance (an unbounded interval's ``se = inf``
        gives an infinite variance, i.e. no weight; it is left out and counted, not pooled).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> m = stats.random_effects_meta([0.5, 0.7, 0.6], [0.01, 0.02, 0.015])
    >>> type(m).__name__, m.k, round(m.estimate, 3)
    ('MetaResult', 3, 0.577)
    """

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
    interval: str = "wald"
    df: float = float("inf")  # degrees of freedom of the interval's t quantile (inf: normal)
    hksj_scale: float = float("nan")  # HKSJ's scale factor s = Σw*(y − mu)²/(k − 1) (NaN: not HKSJ)
    safeguard_applied: bool = False  # HKSJ: s < 1 was raised to 1 (the Wald SE, with t_{k−1})
    excluded: int = 0  # rows left out: non-finite estimate or variance


@dataclass(frozen=True, kw_only=True)
class RobustMetaResult:
    """Robust-variance (cluster sandwich) pooled estimate; ``k`` rows in ``m`` clusters."""

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    tau2: float
    k: int
    m: int
    df: float
    small_sample: str


@dataclass(frozen=True, kw_only=True)
class TrendResult:
    """Weighted linear trend of estimates over training steps (:func:`trend_test`): the slope,
    its SE, interval and p-value, and the mean of the early and late steps.

    Attributes
    ----------
    slope : float
        The fitted ``b`` of ``estimate = a + b * step``.
    slope_se : float
        Its standard error (fixed scale with variances).
    ci_low : float
        Lower end of the slope's ``ci_level`` interval.
    ci_high : float
        Upper end of the slope's ``ci_level`` interval.
    p_value : float
        P-value of ``b = 0``.
    intercept : float
        The fitted ``a``.
    n : int
        The number of finite points used.
    early_mean : float
        Mean of the early steps (inverse-variance weighted with variances).
    late_mean : float
        Mean of the late steps (likewise).
    difference : float
        ``late_mean - early_mean``.
    difference_se : float
        Its standard error (NaN without variances and fewer than 2 points on a side).
    difference_p_value : float
        Two-sided p-value of the difference (z-test with variances, else Welch's t-test).
    weighted : bool
        Whether variances were given (WLS) or not (OLS).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> t = stats.trend_test([0, 1, 2, 3], [1.0, 1.2, 1.4, 1.6], [0.01, 0.01, 0.01, 0.01])
    >>> type(t).__name__, round(t.slope, 3), t.n
    ('TrendResult', 0.2, 4)
    """

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


def _clean(estimates, variances, *others):
    y = np.asarray(estimates, dtype=np.float64).ravel()
    v = np.asarray(variances, dtype=np.float64).ravel()
    if y.shape != v.shape:
        raise ValueError("estimates and variances must have the same length")
    for other in others:
        if len(other) != y.size:
            raise ValueError("every input must have one entry per estimate")
    ok = np.isfinite(y) & np.isfinite(v)
    if (v[ok] <= 0).any():
        raise ValueError("variances must be positive")
    return ok, y[ok], v[ok]


def reml_tau2(estimates, variances) -> float:
    """REML between-study variance (see module docstring), by bounded Brent maximisation of the
    restricted log-likelihood on [0, 10·(sample variance of y + max v)]."""
    y = np.asarray(estimates, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if y.size < 2:
        return 0.0

    def negative_restricted_loglik(tau2: float) -> float:
        w = 1.0 / (v + tau2)
        mu = (w * y).sum() / w.sum()
        return 0.5 * (np.log(v + tau2).sum() + np.log(w.sum()) + (w * (y - mu) ** 2).sum())

    upper = 10.0 * (float(np.var(y, ddof=1)) + float(v.max()))
    if upper <= 0:
        return 0.0
    found = optimize.minimize_scalar(
        negative_restricted_loglik,
        bounds=(0.0, upper),
        method="bounded",
        options={"xatol": 1e-12 * upper, "maxiter": 500},
    )
    tau2 = float(found.x)
    # Brent never evaluates the bound itself: compare with the boundary solution tau2 = 0
    return 0.0 if negative_restricted_loglik(0.0) <= negative_restricted_loglik(tau2) else tau2


def random_effects_meta(
    estimates,
    variances,
    method: str = "dl",
    ci_level: float = 0.95,
    interval: str = "wald",
    hksj_safeguard: bool = True,
) -> MetaResult:
    """Random-effects pooled estimate; see the module docstring. Rows with a non-finite estimate or
    variance (NaN, or the infinite variance of an unbounded interval) are left out and counted
    (``excluded``).

    Parameters
    ----------
    estimates : array_like of shape (k,)
        The rows' estimates ``y_i``.
    variances : array_like of shape (k,)
        Their sampling variances ``v_i``.
    method : {"dl", "pm", "reml"}, default "dl"
        The ``tau2`` estimator: DerSimonian–Laird, Paule–Mandel or REML.
    ci_level : float, default 0.95
        Coverage of the interval.
    interval : {"wald", "hksj"}, default "wald"
        Wald ``mu ± z se`` or Hartung–Knapp–Sidik–Jonkman ``mu ± t_{k−1} se_HK``.
    hksj_safeguard : bool, default True
        HKSJ only: scale factor ``max(1, s)``, so the interval is never narrower than the Wald SE
        with the same ``t_{k−1}`` quantile; ``False``: untruncated.

    Returns
    -------
    MetaResult
        The pooled estimate, interval, heterogeneity and the settings used; all NaN with no
        finite row, the row's own normal interval with one.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> m = stats.random_effects_meta([0.5, 0.7, 0.6], [0.01, 0.02, 0.015], method='dl')
    >>> round(m.estimate, 4), round(m.ci_low, 4), round(m.ci_high, 4), m.k
    (0.5769, np.float64(0.4438), np.float64(0.7101), 3)
    """
    from statsmodels.stats.meta_analysis import combine_effects

    check_choice("method", method, META_METHODS)
    check_choice("interval", interval, META_INTERVALS)
    ok, y, v = _clean(estimates, variances)
    k, excluded = y.size, int((~ok).sum())
    if k <= 1:  # nothing to pool
        return replace(_unpooled_meta(y, v, method, interval, ci_level), excluded=excluded)
    if method == "reml":
        tau2 = reml_tau2(y, v)
        w_fixed = 1.0 / v
        q = float((w_fixed * (y - (w_fixed * y).sum() / w_fixed.sum()) ** 2).sum())
    else:
        res = combine_effects(y, v, method_re="chi2" if method == "dl" else "iterated", alpha=1 - ci_level)
        tau2 = max(0.0, float(res.tau2))  # statsmodels does not truncate DL's tau2 at 0
        q = float(res.q)
    w = 1.0 / (v + tau2)
    est = float((w * y).sum() / w.sum())
    i2 = max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0
    scale, raised = np.nan, False
    if interval == "hksj":
        df = float(k - 1)
        scale = float((w * (y - est) ** 2).sum() / df)
        raised = hksj_safeguard and scale < 1.0
        se = float(np.sqrt(max(scale, 1.0) if hksj_safeguard else scale) / np.sqrt(w.sum()))
        crit = sps.t.ppf(0.5 + ci_level / 2, df)
        p = float(2 * sps.t.sf(abs(est) / se, df)) if se > 0 else (0.0 if est != 0 else 1.0)
    else:
        df = np.inf
        se = float(1.0 / np.sqrt(w.sum()))
        crit = sps.norm.ppf(0.5 + ci_level / 2)
        p = float(2 * sps.norm.sf(abs(est) / se))
    return MetaResult(
        estimate=est,
        se=se,
        ci_low=est - crit * se,
        ci_high=est + crit * se,
        tau2=tau2,
        i2=float(i2),
        q=q,
        p_value=p,
        k=int(k),
        method=method,
        interval=interval,
        df=df,
        hksj_scale=scale,
        safeguard_applied=bool(raised),
        excluded=excluded,
    )


def _unpooled_meta(y: np.ndarray, v: np.ndarray, method: str, interval: str, ci_level: float) -> MetaResult:
    """:func:`random_effects_meta` of fewer than 2 rows: all NaN for none; for one, the row's own
    normal (Wald) interval."""
    if y.size == 0:
        nan = np.nan
        return MetaResult(
            estimate=nan,
            se=nan,
            ci_low=nan,
            ci_high=nan,
            tau2=nan,
            i2=nan,
            q=nan,
            p_value=nan,
            k=0,
            method=method,
            interval=interval,
            df=nan,
        )
    # one row: its own normal interval
    se = float(np.sqrt(v[0]))
    zc = sps.norm.ppf(0.5 + ci_level / 2)
    return MetaResult(
        estimate=float(y[0]),
        se=se,
        ci_low=y[0] - zc * se,
        ci_high=y[0] + zc * se,
        tau2=0.0,
        i2=0.0,
        q=0.0,
        p_value=float(2 * sps.norm.sf(abs(y[0]) / se)),
        k=1,
        method=method,
        interval="wald",
        df=np.inf,
    )


def aggregate_clusters(estimates, variances, clusters, correlation: float = 1.0):
    """One summary per cluster: (means (m,), variances (m,), sizes (m,), cluster labels (m,)).

    Mean of the cluster's rows and its variance under a common within-cluster correlation
    ``correlation`` between rows' sampling errors (module docstring); NaN rows are dropped."""
    if not 0.0 <= correlation <= 1.0:
        raise ValueError(f"correlation must be in [0, 1], got {correlation}")
    labels = np.asarray(clusters, dtype=object).ravel()
    ok, y, v = _clean(estimates, variances, labels)
    labels = labels[ok]
    order = list(dict.fromkeys(labels.tolist()))
    means, variances_out, sizes = [], [], []
    for label in order:
        rows = labels == label
        yj, sj = y[rows], np.sqrt(v[rows])
        kj = int(rows.sum())
        total = (1 - correlation) * (sj**2).sum() + correlation * sj.sum() ** 2
        means.append(yj.mean())
        variances_out.append(total / kj**2)
        sizes.append(kj)
    return np.asarray(means), np.asarray(variances_out), np.asarray(sizes), order


def robust_meta(
    estimates, variances, clusters, ci_level: float = 0.95, small_sample: str = "CR2", tau2: float | None = None
) -> RobustMetaResult:
    """Robust variance estimation over dependent rows (module docstring).

    ``tau2``: between-cluster variance of the working weights; default the REML estimate of the
    cluster summaries of ``aggregate_clusters`` (rho = 1). The weights only affect efficiency:
    the sandwich variance is valid for any weights."""
    check_choice("small_sample", small_sample, SMALL_SAMPLE_CORRECTIONS)
    labels = np.asarray(clusters, dtype=object).ravel()
    ok, y, v = _clean(estimates, variances, labels)
    labels = labels[ok]
    names = list(dict.fromkeys(labels.tolist()))
    m = len(names)
    if m < 2:
        raise ValueError(f"robust variance estimation needs at least 2 clusters, got {m}")
    index = np.array([names.index(label) for label in labels])
    sizes = np.bincount(index, minlength=m).astype(float)
    mean_v = np.bincount(index, weights=v, minlength=m) / sizes
    if tau2 is None:
        summary_y, summary_v, _, _ = aggregate_clusters(y, v, labels)
        tau2 = reml_tau2(summary_y, summary_v)
    w = 1.0 / (sizes[index] * (mean_v[index] + tau2))
    total_w = w.sum()
    estimate = float((w * y).sum() / total_w)
    residual_sums = np.bincount(index, weights=w * (y - estimate), minlength=m)
    if small_sample == "CR2":
        cluster_w = np.bincount(index, weights=w, minlength=m)
        residual_sums = residual_sums / np.sqrt(1.0 - cluster_w / total_w)
    se = float(np.sqrt((residual_sums**2).sum()) / total_w)
    df = float(m - 1)
    crit = sps.t.ppf(0.5 + ci_level / 2, df)
    p = float(2 * sps.t.sf(abs(estimate) / se, df)) if se > 0 else (0.0 if estimate != 0 else 1.0)
    return RobustMetaResult(
        estimate=estimate,
        se=se,
        ci_low=estimate - crit * se,
        ci_high=estimate + crit * se,
        p_value=p,
        tau2=float(tau2),
        k=int(y.size),
        m=m,
        df=df,
        small_sample=small_sample,
    )


def trend_test(steps, estimates, variances=None, ci_level: float = 0.95, early_fraction: float = 0.5) -> TrendResult:
    """Linear trend of ``estimates`` over ``steps`` plus an early-vs-late difference test.

    Non-finite points are dropped; at least 3 must remain.

    Parameters
    ----------
    steps : array_like of shape (n,)
        The training steps.
    estimates : array_like of shape (n,)
        The estimate at each step.
    variances : array_like of shape (n,), optional
        Positive sampling variances: WLS with weights ``1/variance`` and fixed scale; None: OLS.
    ci_level : float, default 0.95
        Coverage of the slope's interval.
    early_fraction : float, default 0.5
        Share of the sorted steps counted as early (at least one step on each side).

    Returns
    -------
    TrendResult
        The slope with its SE, interval and p-value, and the early-vs-late difference test.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> t = stats.trend_test([0, 1, 2, 3], [1.0, 1.2, 1.4, 1.6], [0.01, 0.01, 0.01, 0.01])
    >>> round(t.slope, 4), t.p_value < 0.05
    (0.2, True)
    """
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
    return TrendResult(
        slope=slope,
        slope_se=se,
        ci_low=float(lo),
        ci_high=float(hi),
        p_value=float(fit.pvalues[1]),
        intercept=float(fit.params[0]),
        n=int(n),
        early_mean=em,
        late_mean=lm,
        difference=lm - em,
        difference_se=dse,
        difference_p_value=dp,
        weighted=v is not None,
    )
