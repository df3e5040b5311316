"""Power and sample size of anistat's tests and intervals on a ratio of means over documents.

statsmodels-like (``statsmodels.stats.power``): :class:`HalfWidth`, :class:`DataTestPower`
and :class:`ExactTestPower` each compute their target (a half-width, a power) from the
documents ``n``, the effect ``R`` and the per-document law, and ``solve_power`` solves for
whichever one of ``nobs`` (documents), ``ratio`` (the effect) and ``power`` / ``half_width``
is None. Documents are solved as the smallest integer that meets the target (the procedures'
small-sample laws are step functions of ``n``), the effect by bisection (closed forms where
they exist). The functions below them are the formulas, one per quantity; ``anistat plan``
(``anistat.plan``) reads a pilot's per-document law and calls them.

The quantities: a unit's energy ratio ``R̂ = (d/k) Σ p_i / Σ t_i`` over documents ``i``
(``p_i``: the proxy's energy in document ``i``, ``t_i``: its total energy), with

(a) the half-width of its CI at level ``L``,
(b) the power of the data test (the studentized ratio test of ``R = 1``, one-sided),
(c) the power of the exact Haar test,

both tests at a threshold ``a`` (the family's corrected ``α/m``), plus the Haar draws and the
data test's bootstrap resamples that resolve ``a``.

The per-document law
--------------------
A unit's energy fraction and energy ratio are ratios of sums over documents,
``F̂ = Σ p_i / Σ t_i`` (``p_i``: the proxy's energy in document ``i``, ``t_i``: its total energy)
and ``R̂ = F̂ d/k``. By the delta method, with ``n`` independent documents,

    Var(log R̂) = Var(log F̂) ≈ τ² / n,   τ² = Var(p_i/μ_p − t_i/μ_t) = cv_p² + cv_t² − 2 ρ cv_p cv_t,

the ratio-of-means variance: ``cv`` are the per-document coefficients of variation of the proxy
and total energies and ``ρ`` their correlation. ``τ`` is the *relative SD* of the plan. From a
pilot bundle it is read off the ``energy_fraction`` rows: ``τ̂ = √n_pilot · se / estimate``
(``se`` is the row's interval-implied SE, ``n_pilot`` its documents, ``n_clusters``).

Formulas (``t_{q,ν}``: Student quantile; ``Φ``: normal cdf; ``a = α/m``):

* half-width: the t interval on the log scale is ``log R̂ ± h``, ``h = t_{(1+L)/2, n−1} τ/√n``;
  its half-width on the ratio scale at ``R`` is ``R sinh(h)`` (half of ``R e^h − R e^{−h}``).
  Below :data:`SMALL_SAMPLE_LIMIT` documents the analysis' own interval (the protocol's
  ``stats.ci_method``, tails expanded for ``n``) is wider than that, so ``t τ/√n`` is replaced by
  its ends as simulated studies of ``n`` documents give them (:func:`small_sample_half_width`):
  total energies lognormal with the pilot's ``cv_t = √(n/n_eff − 1)`` (constant when unknown)
  and a normal residual, so an F-calibrated interval sees the totals' concentration (its
  effective size ``m ≤`` Kish ``n_eff ≈ n/(1 + cv_t²)``). From there the t width at ``c τ``
  (:func:`width_boundary`; past it where the last simulated size still has unbounded intervals).
  Planned ``n``: the smallest whose half-width ``≤`` the target.
* data test: its statistic ``log R̂ / (τ̂/√n)`` has about the one-sample t law,
  ``T_{n−1}(δ)``, noncentral ``δ = √n log R / τ``, and with many documents it is referred to
  ``t_{n−1}`` tails (the small-sample expansion, :func:`anistat.stats.expanded_tail`), so its
  power is the t-test's ``P(T_{n−1}(δ) > t_{1−a, n−1})`` (statsmodels ``TTestPower`` with
  effect size ``log R / τ``). With few documents that is far from the real test: the
  bootstrap-t law of a small sample is heavier-tailed than ``t_{n−1}``, the expansion moves its
  tail further out, and document energies are sums of squared projections, not normal — the
  documents with most energy carry the smallest proxy share, which skews ``p_i/μ_p − t_i/μ_t``
  to the left and costs the one-sided test power. So below :data:`DATA_TEST_SIMULATION_LIMIT`
  documents the power is the share of :data:`DATA_TEST_STUDIES` seeded studies of the plan's per-document
  law (:func:`document_law`: a lognormal document scale ``S`` whose CV with ``τ`` gives the
  pilot's ``cv_t = √(n/n_eff − 1)``, the proxy a fixed share ``R k/d`` of it and the
  complement's share lognormal with the CV that gives ``τ``) that the real test rejects
  (:func:`law_data_test_power`, the analysis' p-values over the plan's resamples; the studies are
  common to every size). From :data:`DATA_TEST_SIMULATION_LIMIT` documents the t-test's power at
  the relative SD that matches the law's power at the last simulated size
  (:func:`boundary_relative_sd`).
* exact test: it rejects when ``F̂`` exceeds the ``1 − a`` quantile ``q`` of the Haar null of the
  unit's own data (the energy fraction of a uniformly random rank-``k`` subspace). That null does
  not shrink like ``1/√n``: its spread is set by ``d``, ``k`` and the gradients' spectrum
  (``Var = 2k(d−k)/((d−1)d(d+2)) · (d Σw² − 1)``, ``w = λ/Σλ``,
  :func:`anistat.stats.control_energy_moments`). ``q`` is the quantile of the Beta law with the
  null's mean ``k/d`` and this variance: exact when the gradients' second moment has rank one
  (``PR = 1/Σw² = 1``, the null ``Beta(k/2, (d−k)/2)``), degenerate at ``k/d`` for isotropic
  gradients (``PR = d``: every subspace captures ``k/d``), a moment match between. Power ``Φ(√n (log(R k/d) − log q)/τ)``:
  it tends to 1 only when ``R k/d > q`` — below ``R = q d/k`` no number of documents makes the
  exact test reject, and the plan says so. The spectrum is the pilot's sample one; a larger study's
  is less noisy and its null narrower (:func:`null_sd_at` carries it up; conservative, as tokens
  are dependent), a smaller one's wider, so the exact test is never planned below the pilot's size.

How far to trust it
-------------------
The plan assumes the pilot's per-document law (the same ``τ`` at the stated ratio as at the
pilot's), independent documents, the normal approximation of ``log R̂`` and, for the exact test,
the Beta approximation of the Haar null's tail and the population spectrum for the sample's.
The small-sample half-width is that of documents with the pilot's ``τ`` and ``cv_t`` and a
normal residual; in the calibration's laws it held the 0.1 target to within 4 % (``docs/plan.md``),
and where ``cv_t`` is unknown (constant totals) an F-calibrated interval on concentrated
document energies is wider than planned. The data test's law has the
pilot's ``τ`` and ``cv_t`` and an assumed shape (lognormal scale and share, all of the share's
variation in the complement): in the calibration's laws the data test planned for power 0.8
achieved 0.80–0.91, in the heavy-tailed skewed law 0.76–0.77 (its τ underestimated;
``docs/plan.md``); a law whose residuals are more left-skewed than it assumes would fall short.
``τ̂`` from a pilot of ``n`` documents is itself uncertain: ``(n−1) τ̂²/τ² ≈ χ²_{n−1}``, so every
plan is also given at the upper ``c`` confidence limit ``τ_U² = (n−1) τ̂² / χ²_{1−c, n−1}``
(``c = 0.8`` by default, the pilot-study convention of Browne 1995). ``benchmarks/bench_plan.py``
checks the promises by simulation (``docs/plan.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from scipy import stats as sps

from .. import vocabulary as vocab
from .energy import MIN_RESAMPLING_UNITS

#: Largest document count searched (beyond it a target is reported unreachable: None).
MAX_DOCUMENTS = 10_000_000
#: Most bootstrap resamples the data test may need (see :func:`documents_for_data_test`).
MAX_TEST_RESAMPLES = 100_000
#: Probability with which the Monte-Carlo exact test rejects a test whose ideal p-value is half
#: the threshold (see :func:`null_draws_needed`).
DRAWS_RESOLUTION = 0.99


# ---------------------------------------------------------------------------------- formulas
def relative_sd(cv_proxy: float, cv_total: float, correlation: float) -> float:
    """``τ = √(cv_p² + cv_t² − 2 ρ cv_p cv_t)``: the per-document relative SD of a ratio of means.

    Parameters
    ----------
    cv_proxy, cv_total : float
        Per-document coefficients of variation of the proxy and total energies.
    correlation : float
        Their correlation ``ρ`` in [-1, 1].

    Returns
    -------
    float
        ``τ`` (``√n`` × the relative SE of ``Σp/Σt`` over ``n`` documents, delta method).

    Examples
    --------
    >>> from anistat.stats.power import relative_sd
    >>> round(relative_sd(0.5, 0.5, 0.0), 4)
    0.7071
    """
    value = cv_proxy**2 + cv_total**2 - 2.0 * correlation * cv_proxy * cv_total
    return math.sqrt(max(value, 0.0))


def ci_half_width(n: int, tau: float, ratio: float, ci_level: float = 0.95) -> float:
    """Half-width ``R sinh(t_{(1+L)/2, n−1} τ/√n)`` of the energy ratio's interval at ``n`` documents."""
    h = sps.t.ppf(0.5 + ci_level / 2.0, n - 1) * tau / math.sqrt(n)
    return float(ratio * math.sinh(h))


def data_test_power(n: int, tau: float, ratio: float, threshold: float) -> float:
    """Power of the one-sided data test of ``R = 1`` at ``threshold`` with ``n`` documents:
    ``P(T_{n−1}(√n log R/τ) > t_{1−threshold, n−1})`` (noncentral t)."""
    df = n - 1
    critical = sps.t.isf(threshold, df)
    return float(sps.nct.sf(critical, df, math.sqrt(n) * math.log(ratio) / tau))


# ------------------------------------------------------------- small-sample (simulated) laws
#: Below this many documents the half-width and the data test's power are planned with the
#: small-sample behaviour of the real procedures (:func:`small_sample_half_width`,
#: :func:`law_data_test_power`); at and above it with the t formulas, which they approach.
SMALL_SAMPLE_LIMIT = 300
#: Below this many documents the data test's power is the simulated law's (:func:`law_data_test_power`);
#: at and above it the noncentral-t power at the law's boundary relative SD. Higher than
#: :data:`SMALL_SAMPLE_LIMIT`: under heavy-tailed documents the law's power curve is flatter than
#: the t formula's, so a boundary matched at 299 documents promised too much at 567 (the
#: calibration's hot law at R = 1.40: the law 0.720, the real test 0.72–0.77, the formula 0.800;
#: benchmarks/README.md, "Planning a study").
DATA_TEST_SIMULATION_LIMIT = 1000
#: Simulated studies behind each small-sample half-width (one seeded set per simulated size).
SMALL_SAMPLE_STUDIES = 64
#: The document counts simulated: every count to 20, then steps of about 10 % (a count between
#: two is planned with the smaller one's simulated studies: wider, so conservative).
SIMULATED_SIZES = (
    *range(2, 21),
    *(22, 24, 27, 30, 33, 36, 40, 44, 48, 53, 58, 64, 70, 77, 85, 94, 103, 113, 124, 136, 150, 165, 181),
    *(199, 219, 241, 265, 292),
)
#: Sizes past :data:`SMALL_SAMPLE_LIMIT` simulated for an interval that the last simulated size
#: leaves unbounded in some studies (totals so concentrated that the F-calibrated interval's
#: effective size ``m`` is about 2 there: the calibration's heavy law, ``cv_t`` ≈ 13): steps of
#: about 25 % to :data:`EXTENDED_SIZE_LIMIT`, empirical-likelihood methods only (they need no
#: bootstrap weights, which at these sizes would not fit in memory).
EXTENDED_SIZE_LIMIT = 200_000
EXTENDED_SIZES = tuple(
    sorted({int(round(292 * 1.25**i)) for i in range(1, 30) if 292 * 1.25**i <= EXTENDED_SIZE_LIMIT})
)
#: Relative SD of the simulated documents: small, so that the pivots' scale-free small-sample
#: law is measured apart from the log scale's curvature, which the formulas apply at ``τ``.
SIMULATED_RELATIVE_SD = 0.05
#: Bootstrap resamples of the simulated intervals (the protocol's default ``stats.n_bootstrap``).
SIMULATED_RESAMPLES = 1000
#: The interval methods that need no bootstrap weights (simulated at :data:`EXTENDED_SIZES` too).
EL_INTERVAL_METHODS = tuple(name for name, m in vocab.CI_METHODS.items() if not m.resamples)
#: Decimals of ``cv_t`` kept in the small-sample half-width's cache key (:func:`interval_log_factors`).
SIMULATED_CV_DECIMALS = 2


def simulated_size(n: int) -> int:
    """The largest of :data:`SIMULATED_SIZES` not above ``n``, whose simulated studies stand for
    ``n`` documents (fewer documents: heavier tails, so the plan errs on the safe side)."""
    return max(size for size in SIMULATED_SIZES if size <= n)


def _simulated_documents(n: int, total_cv: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:data:`SMALL_SAMPLE_STUDIES` seeded studies of ``n`` documents (rows): ``(proxy, total)``.

    ``total_cv`` None: normal documents, proxy energy ``1 + σ z`` against a constant total
    (σ = :data:`SIMULATED_RELATIVE_SD`), the law with the pilot's first two moments. Otherwise
    the totals are lognormal with mean 1 and CV ``cv_t`` (``σ_t² = ln(1 + cv_t²)``, the family of
    :func:`document_law`, on its seeded normals :func:`_law_normals`) and the proxy ``t + σ z``:
    the interval's calibration then sees the law's concentration (Kish ``n_eff ≈ n/(1 + cv_t²)``
    of the totals), with a normal residual ``p − t`` (document_law's share residual, scaled by
    the document's energy, is so heavy-tailed that its sample SE shrinks and the simulated
    interval is no wider than with constant totals). Either way ``p/μ_p − t/μ_t = σ z``, so
    ``log R̂`` has relative SD ``σ/√n`` (delta method); a proxy may fall below 0 where a total
    is below a few σ (the interval needs only ``Σp > 0``)."""
    if total_cv is None:
        proxy = 1.0 + SIMULATED_RELATIVE_SD * _standard_normals()[:, :n]
        return proxy, np.ones_like(proxy)
    if n <= DATA_TEST_SIMULATION_LIMIT:
        z = _law_normals()[:SMALL_SAMPLE_STUDIES, :n]
    else:  # an extended size: its own seeded draw
        z = np.random.default_rng(np.random.SeedSequence([29, 4, n])).standard_normal((SMALL_SAMPLE_STUDIES, n, 2))
    sd_log = math.sqrt(math.log1p(total_cv**2))
    total = np.exp(sd_log * z[..., 0] - sd_log**2 / 2.0)
    return total + SIMULATED_RELATIVE_SD * z[..., 1], total


@lru_cache(maxsize=1)
def _standard_normals() -> np.ndarray:
    """One seeded draw shared by every simulated size (common random numbers: the simulated
    quantities then move smoothly with ``n``, and the search over ``n`` is not misled by noise)."""
    rng = np.random.default_rng(np.random.SeedSequence([29, SMALL_SAMPLE_LIMIT]))
    return rng.standard_normal((SMALL_SAMPLE_STUDIES, SMALL_SAMPLE_LIMIT))


#: Simulated studies behind each simulated data-test power (:func:`law_data_test_power`; one
#: seeded set of draws shared by every size and every law: common random numbers).
DATA_TEST_STUDIES = 400


def document_law(tau: float, total_cv: float | None, fraction: float) -> tuple[float, float]:
    """The log-scale SDs ``(σ_S, σ_B)`` of the plan's per-document law for the data test.

    A document's energies are ``p = f S`` (proxy) and ``t = S (f + (1 − f) B)`` (total): ``S``
    the document's energy scale, ``B`` its complement's share (both lognormal, mean 1), ``f =
    R k/d`` the population energy fraction, so ``E p / E t = f``. Then ``r = p/μ_p − t/μ_t =
    (1 − f) S (1 − B)`` and

        τ² = (1 + s²)(1 − f)² c_B²,   cv_t² = s² + τ²,

    (``s``, ``c_B``: the CVs of ``S`` and ``B``), solved for ``1 + s² = max(1 + cv_t² − τ², 1)``
    and ``c_B² = τ² / ((1 − f)² (1 + s²))``; ``σ² = ln(1 + CV²)`` for each lognormal. ``cv_t``
    is a pilot row's ``√(n/n_eff − 1)`` (Kish ``n_eff`` of the total energies); None: 0 (all of
    ``τ`` in the share). Documents with more energy carry a smaller proxy share, so ``r`` is
    skewed to the left, as in the calibration's laws (``benchmarks/diag_plan_law.py``).

    Examples
    --------
    >>> from anistat.stats.power import document_law
    >>> sd_scale, sd_share = document_law(0.45, 0.78, 0.156)
    >>> round(sd_scale, 3), round(sd_share, 3)
    (0.584, 0.429)
    """
    scale_sq = max(1.0 + (total_cv or 0.0) ** 2 - tau**2, 1.0)
    share_cv_sq = tau**2 / ((1.0 - fraction) ** 2 * scale_sq)
    return math.sqrt(math.log(scale_sq)), math.sqrt(math.log1p(share_cv_sq))


@lru_cache(maxsize=1)
def _law_normals() -> np.ndarray:
    """Standard normals ``(studies, DATA_TEST_SIMULATION_LIMIT, 2)`` shared by every simulated law and
    size: the first :data:`SMALL_SAMPLE_LIMIT` documents from one seeded stream, the rest from
    another, so the simulated studies below that size do not depend on how far the law goes."""
    rng = np.random.default_rng(np.random.SeedSequence([29, 2, SMALL_SAMPLE_LIMIT]))
    first = rng.standard_normal((DATA_TEST_STUDIES, SMALL_SAMPLE_LIMIT, 2))
    more = np.random.default_rng(np.random.SeedSequence([29, 3, DATA_TEST_SIMULATION_LIMIT]))
    rest = more.standard_normal((DATA_TEST_STUDIES, DATA_TEST_SIMULATION_LIMIT - SMALL_SAMPLE_LIMIT, 2))
    return np.concatenate([first, rest], axis=1)


def law_documents(n: int, tau: float, total_cv: float | None, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """:data:`DATA_TEST_STUDIES` seeded studies of ``n`` documents of :func:`document_law`:
    ``(proxy, total)``, each of shape ``(studies, n)``."""
    sd_scale, sd_share = document_law(tau, total_cv, fraction)
    z = _law_normals()[:, :n]
    scale = np.exp(sd_scale * z[..., 0] - sd_scale**2 / 2.0)
    share = np.exp(sd_share * z[..., 1] - sd_share**2 / 2.0)
    return fraction * scale, scale * (fraction + (1.0 - fraction) * share)


def studentized_pvalues(
    proxy: np.ndarray, reference: np.ndarray, weights: np.ndarray, chunk_rows: int = 2048
) -> np.ndarray:
    """:func:`anistat.stats.studentized_ratio_test`'s one-sided (``greater``) expanded p-values of
    many studies at once (rows of ``proxy`` and ``reference``, one ``weights`` matrix): the same
    pivot ``(log θ*_b − log θ)/(se*_b/θ*_b)`` with the delta-method SE (:func:`anistat.stats.ratio_se`,
    every resample weighing ``n`` documents), the same ``(1 + #{t*_b ≥ t})/(1 + B)`` over the
    finite replicates, the same expansion for ``n`` documents; five matrix products for all
    studies, ``chunk_rows`` resamples at a time."""
    from .bootstrap import expanded_pvalue

    n = proxy.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = proxy.sum(axis=1) / reference.sum(axis=1)
        resid = proxy - theta[:, None] * reference
        full_se = np.sqrt(n / (n - 1.0) * (resid**2).sum(axis=1)) / reference.sum(axis=1)
        statistic = np.log(theta) / (full_se / theta)
    stacked = np.concatenate([proxy, reference, resid**2, resid * reference, reference**2]).T
    exceed = np.zeros(proxy.shape[0])
    finite_count = np.zeros(proxy.shape[0])
    for start in range(0, weights.shape[0], chunk_rows):
        pivots = _bootstrap_pivots(weights[start : start + chunk_rows], stacked, theta)
        finite = np.isfinite(pivots)
        exceed += (finite & (pivots >= statistic)).sum(axis=0)
        finite_count += finite.sum(axis=0)
    raw = (1.0 + exceed) / (1.0 + finite_count)
    return np.minimum(np.asarray(expanded_pvalue(raw, n), dtype=float), 1.0)


def _bootstrap_pivots(weights: np.ndarray, stacked: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``(log θ*_b − log θ)/(se*_b/θ*_b)`` per resample (rows) and study (columns) from the sums of
    ``stacked`` = ``[p, r, e², e r, r²]`` per study (``e = p − θ r``), as :func:`anistat.stats.ratio_se`."""
    with np.errstate(invalid="ignore", divide="ignore"):
        sums = (weights @ stacked).reshape(weights.shape[0], 5, -1)
        den = sums[:, 1]
        delta = sums[:, 0] / den - theta
        rss = np.maximum(sums[:, 2] - 2.0 * delta * sums[:, 3] + delta**2 * sums[:, 4], 0.0)
        counts = weights.sum(axis=1)[:, None]
        se = np.sqrt(rss * counts / (counts - 1.0)) / np.abs(den)
        replicates = sums[:, 0] / den
        return (np.log(replicates) - np.log(theta)) / (se / replicates)


#: Most bootstrap resamples of a simulated data test (:func:`law_data_test_power`): a plan at a
#: small threshold with few documents asks far more (about ``20/a'``); with this many the
#: simulated test's critical value is a noisier, slightly more conservative estimate of the same
#: tail quantile (a Monte-Carlo test's power grows with its resamples).
SIMULATED_TEST_RESAMPLES = 20_000
#: Resample-by-study products a simulated power may cost: above ``DATA_TEST_STUDIES`` studies ×
#: 10,000 resamples the first ``SIMULATED_WORK / B`` studies are used (at least 100).
SIMULATED_WORK = 4_000_000
#: Resample-by-study-by-document products a simulated power may cost (with :data:`SIMULATED_WORK`,
#: the smaller bound holds; at least 100 studies): 400 studies of 999 documents at 3,750 resamples.
SIMULATED_DOCUMENT_WORK = 1_500_000_000


@lru_cache(maxsize=4096)
def law_data_test_power(
    n: int, tau: float, ratio: float, threshold: float, total_cv: float | None = None, haar_fraction: float = 0.125
) -> float:
    """Power of the data test with ``n`` documents at ``threshold`` for the effect ``R``: the share
    of the :data:`DATA_TEST_STUDIES` simulated studies of :func:`document_law` (population energy
    fraction ``f = R k/d``, ``k/d`` = ``haar_fraction``) that the real test of ``R = 1`` rejects
    (:func:`studentized_pvalues`: proxy energies against ``k/d`` times the totals, over the plan's
    :func:`data_test_resamples` bootstrap resamples, seeded by ``n``, at most
    :data:`SIMULATED_TEST_RESAMPLES`; fewer studies when the resamples are many,
    :data:`SIMULATED_WORK`, :data:`SIMULATED_DOCUMENT_WORK`). At and above
    :data:`DATA_TEST_SIMULATION_LIMIT` documents the noncentral-t
    power :func:`data_test_power` at the law's boundary relative SD (:func:`boundary_relative_sd`),
    so the power does not jump up where the simulation stops.

    Examples
    --------
    >>> from anistat.stats.power import law_data_test_power
    >>> low, high = (law_data_test_power(n, 0.45, 1.25, 0.005, 0.78) for n in (30, 80))
    >>> 0.0 < low < high <= 1.0
    True
    """
    from .bootstrap import bootstrap_weights

    if n >= DATA_TEST_SIMULATION_LIMIT:
        effective = boundary_relative_sd(tau, ratio, threshold, total_cv, haar_fraction)
        return data_test_power(n, effective, ratio, threshold)
    resamples = min(data_test_resamples(threshold, n), SIMULATED_TEST_RESAMPLES)
    studies = max(min(DATA_TEST_STUDIES, SIMULATED_WORK // resamples, SIMULATED_DOCUMENT_WORK // (resamples * n)), 100)
    proxy, total = law_documents(n, tau, total_cv, ratio * haar_fraction)
    weights = bootstrap_weights(n, resamples, seed=n)
    pvalues = studentized_pvalues(proxy[:studies], haar_fraction * total[:studies], weights)
    return float(np.mean(pvalues <= threshold))


@lru_cache(maxsize=1024)
def interval_log_factors(
    n: int, ci_level: float, ci_method: str, total_cv: float | None = None
) -> tuple[tuple[float, float], ...]:
    """Per simulated study of ``n`` documents (:func:`_simulated_documents`: normal documents, or
    with ``total_cv`` lognormal document energies of that CV), the energy ratio interval's ends on
    the log scale in units of the true SE ``σ/√n``: ``(log R̂ − log lo, log hi − log R̂)/(σ/√n)``,
    ``R̂ = Σp/Σt``, from the analysis' own interval ``ci_method`` (:func:`anistat.stats.ratio_interval`
    for the ratio methods, the bootstrap methods over :data:`SIMULATED_RESAMPLES` resamples, tails
    expanded for ``n`` documents). For the t interval both factors would be ``t_{(1+L)/2, n−1} s/σ``;
    the F-calibrated intervals (``adjusted_el_f``) widen with the totals' concentration."""
    from .bootstrap import bootstrap_weights
    from .energy import _ratio_intervals, _Units
    from .ratio_intervals import RATIO_INTERVAL_METHODS, ratio_interval

    # the empirical-likelihood methods take no weights (and at extended sizes they would not fit)
    weights = bootstrap_weights(n, SIMULATED_RESAMPLES, seed=n) if ci_method not in EL_INTERVAL_METHODS else None
    scale = SIMULATED_RELATIVE_SD / math.sqrt(n)
    factors = []
    for proxy, total in zip(*_simulated_documents(n, total_cv)):
        if ci_method in RATIO_INTERVAL_METHODS:
            interval = ratio_interval(proxy, total, ci_method, weights, ci_level, expand_units=n)
            low, high = interval.ci_low, interval.ci_high
        else:
            units = _Units(proxy=proxy, total=total, reference=total, name="documents")
            result = _ratio_intervals(units, weights, ci_level, ci_method)[1]
            low, high = result.ci_low, result.ci_high
        estimate = proxy.sum() / total.sum()
        with np.errstate(divide="ignore"):  # an interval unbounded below (low = 0): an infinite factor
            factors.append((math.log(estimate / low) / scale, math.log(high / estimate) / scale))
    return tuple(factors)


def small_sample_half_width(
    n: int, tau: float, ratio: float, ci_level: float, ci_method: str, total_cv: float | None = None
) -> float:
    """Mean half-width of the energy ratio's ``ci_method`` interval at ``n`` documents: over the
    simulated studies' log-scale factors ``(f_lo, f_hi)`` (:func:`interval_log_factors` at
    :func:`simulated_size` of ``n`` and ``total_cv`` rounded to :data:`SIMULATED_CV_DECIMALS`),
    the mean of ``R (e^{f_hi τ/√n} − e^{−f_lo τ/√n})/2``. At and above :data:`SMALL_SAMPLE_LIMIT`
    documents :func:`ci_half_width`, with a known ``total_cv`` at ``c τ``
    (:func:`width_boundary`), so the width does not drop where the simulation stops; below
    the boundary size where every simulated interval is bounded (:func:`width_boundary`), infinite."""
    cv_key = None if total_cv is None else round(total_cv, SIMULATED_CV_DECIMALS)
    if n >= SMALL_SAMPLE_LIMIT:
        if cv_key is None:
            return ci_half_width(n, tau, ratio, ci_level)
        boundary, factor = width_boundary(ci_level, ci_method, cv_key)
        return ci_half_width(n, factor * tau, ratio, ci_level) if n >= boundary else math.inf
    factors = interval_log_factors(simulated_size(n), ci_level, ci_method, cv_key)
    scaled = np.asarray(factors) * (tau / math.sqrt(n))
    return float(np.mean(ratio * (np.exp(scaled[:, 1]) - np.exp(-scaled[:, 0])) / 2.0))


@lru_cache(maxsize=1024)
def width_boundary(ci_level: float, ci_method: str, total_cv: float) -> tuple[int, float]:
    """``(n_b, c)``: the size from which the half-width is the t interval's at ``c τ``, and
    ``c ≥ 1``, the simulated interval's mean log-scale half-factor ``(f_lo + f_hi)/2`` there
    (:func:`interval_log_factors`, totals of CV ``total_cv``) over the t interval's
    ``t_{(1+L)/2, n_b−1}`` (``n_b`` = 299 for the first). ``n_b`` is :func:`simulated_size` of ``SMALL_SAMPLE_LIMIT − 1``
    unless some of its simulated intervals are unbounded (the totals so concentrated that the
    F-calibrated interval's effective size ``m ≈ n/(1 + cv_t²)`` is near 2); then the first of
    :data:`EXTENDED_SIZES` where none is (EL methods; ``MAX_DOCUMENTS + 1``, unreachable, if none
    is or the method needs bootstrap weights). Concentrated totals keep an F-calibrated interval
    wider than the t interval beyond the simulated sizes; holding ``c`` fixed above them is
    conservative, as ``F(1, m − 1)`` tends to ``χ²₁``.

    Examples
    --------
    >>> from anistat.stats.power import width_boundary
    >>> size, factor = width_boundary(0.95, "adjusted_el_f", 0.8)
    >>> size, round(factor, 2)
    (292, 1.02)
    """
    sizes = (simulated_size(SMALL_SAMPLE_LIMIT - 1),) + (EXTENDED_SIZES if ci_method in EL_INTERVAL_METHODS else ())
    for size in sizes:
        factors = np.asarray(interval_log_factors(size, ci_level, ci_method, total_cv))
        if np.isfinite(factors).all():
            degrees = max(size, SMALL_SAMPLE_LIMIT - 1) - 1  # the first: the t interval at 299 documents
            return size, max(float(factors.mean()) / float(sps.t.ppf(0.5 + ci_level / 2.0, degrees)), 1.0)
    return MAX_DOCUMENTS + 1, math.inf


def haar_null_quantile(rank: int, dim: int, null_sd: float, tail: float) -> float:
    """The ``1 − tail`` quantile of the Haar null of the energy fraction: the Beta law with mean
    ``k/d`` and SD ``null_sd`` (exact for a rank-one gradient second moment, where the null is
    ``Beta(k/2, (d−k)/2)``; a moment match otherwise; ``k/d`` itself when the SD is 0).

    Examples
    --------
    >>> from anistat.stats.power import haar_null_quantile
    >>> from anistat import stats
    >>> sd = stats.control_energy_moments('haar', rank=2, dim=16, trace=1.0, frobenius_sq=1.0).sd
    >>> from scipy.stats import beta
    >>> bool(abs(haar_null_quantile(2, 16, sd, 0.01) - beta.isf(0.01, 1, 7)) < 1e-9)
    True
    """
    mean = rank / dim
    if not null_sd > 0:  # the null is one point (k = d): nothing exceeds it by chance
        return mean
    total = mean * (1.0 - mean) / null_sd**2 - 1.0
    return float(sps.beta.isf(tail, mean * total, (1.0 - mean) * total))


def null_sd_at(
    null_sd: float,
    rank: int,
    dim: int,
    n: int | None,
    null_documents: int | None = None,
    tokens_per_document: float | None = None,
) -> float:
    """The Haar null's SD in a study of ``n`` documents (None: infinitely many), from its SD
    ``null_sd`` measured on ``null_documents`` documents of ``tokens_per_document`` tokens.

    The null's variance is ``c (Σŵ² − 1/d)``, ``c = 2k(d−k)/((d−1)d(d+2))``, with ``Σŵ²`` the
    concentration of the *sample* spectrum, which ``N`` i.i.d. tokens inflate:
    ``E Σŵ² ≈ Σw² + (1 − Σw²)/N``. ``null_sd`` at ``N_p = tokens_per_document ·
    null_documents`` tokens gives the population's ``Σw² = (Σŵ²_p − 1/N_p)/(1 − 1/N_p)`` (at
    least ``1/d``), and the study's at ``N = tokens_per_document · n``. Without the token count
    ``null_sd`` is returned as it is."""
    if tokens_per_document is None or null_documents is None:
        return null_sd
    d, k = dim, rank
    scale = 2.0 * k * (d - k) / ((d - 1.0) * d * (d + 2.0))
    pilot_tokens = tokens_per_document * null_documents
    sampled = null_sd**2 / scale + 1.0 / d
    population = max((sampled - 1.0 / pilot_tokens) / (1.0 - 1.0 / pilot_tokens), 1.0 / d)
    at_n = population if n is None else population + (1.0 - population) / (tokens_per_document * n)
    return float(math.sqrt(scale * max(at_n - 1.0 / d, 0.0)))


def exact_test_power(n: int, tau: float, ratio: float, rank: int, dim: int, null_quantile: float) -> float:
    """Power ``Φ(√n (log(R k/d) − log q)/τ)`` of the exact test with ``n`` documents (``q``: the
    null's quantile at the threshold, :func:`haar_null_quantile`)."""
    fraction = ratio * rank / dim
    return float(sps.norm.cdf(math.sqrt(n) * (math.log(fraction) - math.log(null_quantile)) / tau))


def smallest_n(meets: Callable[[int], bool], low: int = 2, high: int = MAX_DOCUMENTS) -> int | None:
    """The smallest ``n`` in ``[low, high]`` with ``meets(n)`` true, for a monotone ``meets``
    (bisection on integers); None when even ``high`` fails."""
    if not meets(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return low


def smallest_n_near(meets: Callable[[int], bool], guess: int, low: int, high: int = MAX_DOCUMENTS) -> int | None:
    """:func:`smallest_n` searched outward from a first ``guess`` (the t formula's count): steps
    of a quarter of the guess, doubling, down while ``meets`` holds or up until it does, then
    bisection — a handful of evaluations of a costly ``meets`` when the guess is close."""
    guess = min(max(guess, low), high)
    step = max(guess // 4, 1)
    if meets(guess):
        fails, holds = guess, guess
        while fails > low and meets(fails):
            holds, fails = fails, max(low, fails - step)
            step *= 2
        if fails == low and meets(low):
            return low
    else:
        holds = guess
        while True:
            fails, holds = holds, min(holds + step, high)
            step *= 2
            if meets(holds):
                break
            if holds == high:
                return None
    while holds - fails > 1:  # meets(holds) and not meets(fails)
        middle = (fails + holds) // 2
        fails, holds = (fails, middle) if meets(middle) else (middle, holds)
    return holds


@lru_cache(maxsize=1024)
def boundary_relative_sd(
    tau: float, ratio: float, threshold: float, total_cv: float | None = None, haar_fraction: float = 0.125
) -> float:
    """``τ_b ≥ τ`` with which the noncentral-t power at ``n_b = DATA_TEST_SIMULATION_LIMIT − 1`` documents
    equals the simulated law's there (:func:`law_data_test_power`):
    ``P(T_{n_b−1}(√n_b log R/τ_b) > t_{1−a, n_b−1})`` = the law's power (bisection on ``log τ_b``;
    ``τ`` itself where the law is at least as powerful as the formula, ``100 τ`` at most).
    Above the simulated sizes the plan uses the formula at ``τ_b``: conservative, as the law's
    shortfall (its residuals' skew) shrinks like ``1/√n``.

    Examples
    --------
    >>> from anistat.stats.power import boundary_relative_sd
    >>> boundary_relative_sd(1.1, 1.25, 0.005, 1.0) > 1.1
    True
    """
    n = DATA_TEST_SIMULATION_LIMIT - 1
    target = law_data_test_power(n, tau, ratio, threshold, total_cv, haar_fraction)
    if data_test_power(n, tau, ratio, threshold) <= target:
        return tau
    low, high = math.log(tau), math.log(100.0 * tau)
    if data_test_power(n, math.exp(high), ratio, threshold) > target:
        return math.exp(high)
    for _ in range(50):  # the power falls as τ grows
        middle = (low + high) / 2.0
        low, high = (middle, high) if data_test_power(n, math.exp(middle), ratio, threshold) > target else (low, middle)
    return math.exp(high)


def documents_for_half_width(
    tau: float,
    ratio: float,
    half_width: float,
    ci_level: float = 0.95,
    ci_method: str | None = None,
    total_cv: float | None = None,
) -> int | None:
    """Documents for a CI half-width of at most ``half_width`` at ``R``, at least
    :data:`anistat.stats.MIN_RESAMPLING_UNITS` (below it the analysis withholds the interval and
    the data test): the mean half-width of the analysis' ``ci_method`` interval on documents whose
    total energies have CV ``total_cv`` (:func:`small_sample_half_width`), or the t interval's
    (:func:`ci_half_width`) when ``ci_method`` is None.

    Examples
    --------
    >>> from anistat.stats.power import documents_for_half_width
    >>> documents_for_half_width(0.5, 1.25, 0.1), documents_for_half_width(0.5, 1.25, 0.05)
    (153, 603)
    """
    if ci_method is None:
        return smallest_n(lambda n: ci_half_width(n, tau, ratio, ci_level) <= half_width, MIN_RESAMPLING_UNITS)
    guess = documents_for_half_width(tau, ratio, half_width, ci_level) or MAX_DOCUMENTS
    return smallest_n_near(
        lambda n: small_sample_half_width(n, tau, ratio, ci_level, ci_method, total_cv) <= half_width,
        guess,
        MIN_RESAMPLING_UNITS,
    )


def documents_for_data_test(
    tau: float,
    ratio: float,
    power: float,
    threshold: float,
    small_sample: bool = True,
    *,
    total_cv: float | None = None,
    haar_fraction: float = 0.125,
    start: int | None = None,
) -> int | None:
    """Documents for the data test to reach ``power`` at ``threshold`` — its power as the real
    bootstrap-t test has it on studies of the plan's per-document law
    (:func:`law_data_test_power`: :func:`document_law` with ``τ``, ``total_cv`` and ``f = R k/d``,
    ``k/d`` = ``haar_fraction``), or the t-test's (:func:`data_test_power`) without
    ``small_sample`` — at least :data:`anistat.stats.MIN_RESAMPLING_UNITS`, and enough that at
    most :data:`MAX_TEST_RESAMPLES` bootstrap resamples resolve its expanded tail
    (:func:`data_test_resamples`: with few documents a small threshold needs a far smaller tail).
    The search starts at ``start`` (None: the t formula's count; :func:`smallest_n_near`); the
    simulated studies are common to every size, so the simulated power moves smoothly with ``n``."""
    t_plan = smallest_n(
        lambda n: (
            data_test_power(n, tau, ratio, threshold) >= power
            and data_test_resamples(threshold, n) <= MAX_TEST_RESAMPLES
        ),
        MIN_RESAMPLING_UNITS,
    )
    if not small_sample or t_plan is None:
        return t_plan
    return smallest_n_near(
        lambda n: (
            # the resamples first: the simulated power is the costly check
            data_test_resamples(threshold, n) <= MAX_TEST_RESAMPLES
            and law_data_test_power(n, tau, ratio, threshold, total_cv, haar_fraction) >= power
        ),
        t_plan if start is None else start,
        MIN_RESAMPLING_UNITS,
    )


def documents_for_exact_test(
    tau: float,
    ratio: float,
    power: float,
    rank: int,
    dim: int,
    null_quantile: float | Callable[[int], float],
    least: int = 2,
) -> int | None:
    """Documents (at least ``least``) for the exact test to reach ``power``
    (:func:`exact_test_power`); ``null_quantile`` is the null's quantile, or a function of the
    documents giving it (it falls as the sample spectrum settles). None when ``R k/d`` does not
    exceed the quantile even with the most documents searched."""
    quantile_at = null_quantile if callable(null_quantile) else (lambda n: null_quantile)
    if ratio * rank / dim <= quantile_at(MAX_DOCUMENTS):
        return None
    return smallest_n(lambda n: exact_test_power(n, tau, ratio, rank, dim, quantile_at(n)) >= power, max(least, 2))


def null_draws_needed(threshold: float, resolution: float = DRAWS_RESOLUTION) -> int:
    """Haar draws ``n`` for the Monte-Carlo exact test at ``threshold``.

    The test with ``n`` draws rejects when ``p = (1 + g)/(1 + n) ≤ threshold``, i.e. when the
    exceedances ``g ≤ ⌊threshold (n + 1)⌋ − 1``; so ``n ≥ 1/threshold − 1`` is needed for any
    rejection (the floor, :func:`anistat.stats.min_controls_needed`). At the floor a test whose
    ideal p-value is far below the threshold still fails whenever one draw exceeds it, so the
    plan asks more: an ``n`` with which a test of ideal p-value ``threshold/2`` is rejected with
    probability ``resolution``: ``P(Binomial(n, threshold/2) ≤ ⌊threshold(n+1)⌋ − 1) ≥ resolution``
    (about ``20/threshold`` at 0.99; found by bisection — the condition is a sawtooth in ``n``, so
    the ``n`` found meets it but a few fewer draws may too). With sequential stopping after ``h``
    exceedances (``stats.null_stop_exceedances``) a stopped test has ``p = h/L ≥ h/n``; when
    ``n < h/threshold`` no stopped test can reject and the sequential test rejects exactly what
    the ``n``-draw test rejects (a test below the threshold never stops), so the draws planned
    here carry over to it.

    Examples
    --------
    >>> from anistat.stats.power import null_draws_needed
    >>> null_draws_needed(0.05) >= 19, null_draws_needed(0.005) > null_draws_needed(0.05)
    (True, True)
    """
    floor = max(math.ceil(1.0 / threshold - 1e-9) - 1, 1)

    def resolved(n: int) -> bool:
        allowed = math.floor(threshold * (n + 1) + 1e-12) - 1
        return allowed >= 0 and float(sps.binom.cdf(allowed, n, threshold / 2.0)) >= resolution

    found = smallest_n(resolved, floor, max(floor, 10_000_000))
    return max(found or 10_000_000, 99)


def data_test_resamples(threshold: float, documents: int | None) -> int:
    """Bootstrap resamples for the data test at ``documents``: it compares its expanded p-value
    (:func:`anistat.stats.expanded_pvalue`) with the threshold, so the raw bootstrap tail must
    resolve ``expanded_tail(threshold, n)`` — smaller than the threshold at few documents —
    exactly as the Haar draws resolve the threshold (:func:`null_draws_needed`).

    Examples
    --------
    >>> from anistat.stats.power import data_test_resamples
    >>> data_test_resamples(0.005, 10) > data_test_resamples(0.005, 1000) >= data_test_resamples(0.005, None)
    True
    """
    from .bootstrap import expanded_tail

    tail = threshold if documents is None else expanded_tail(threshold, documents)
    return null_draws_needed(tail)


def upper_relative_sd(tau: float, pilot_documents: int | None, confidence: float) -> float | None:
    """``τ_U = τ √((n−1)/χ²_{1−c, n−1})``: the upper ``c`` confidence limit of ``τ`` from a pilot
    of ``n`` documents (None without a pilot size)."""
    if pilot_documents is None or pilot_documents < 2:
        return None
    df = pilot_documents - 1
    return float(tau * math.sqrt(df / sps.chi2.ppf(1.0 - confidence, df)))


# ------------------------------------------------------------------ solve for the missing one
def _one_missing(**given: float | None) -> str:
    """The name of the one argument that is None (statsmodels' ``solve_power`` contract)."""
    missing = [name for name, value in given.items() if value is None]
    if len(missing) != 1:
        raise ValueError(f"give all but one of {', '.join(given)}; {len(missing)} are None")
    return missing[0]


def _given(value: float | None) -> float:
    """An argument :func:`_one_missing` found given, as a number."""
    if value is None:
        raise ValueError("solve_power: an argument it needs is None")
    return float(value)


def _smallest_ratio(meets: Callable[[float], bool], high: float = 100.0, rtol: float = 1e-6) -> float | None:
    """The smallest ``R`` in ``(1, high]`` with ``meets(R)`` (monotone in ``R``), by bisection
    on ``log R`` to a relative tolerance ``rtol`` (the end that meets); None when ``high`` fails."""
    if not meets(high):
        return None
    low, top = 0.0, math.log(high)
    while top - low > rtol:
        middle = (low + top) / 2.0
        low, top = (low, middle) if meets(math.exp(middle)) else (middle, top)
    return math.exp(top)


class HalfWidth:
    """Half-width of the energy ratio's CI, on the ratio scale, for a per-document law.

    ``half_width(nobs, ratio)``: the t interval's ``R sinh(t_{(1+L)/2, n−1} τ/√n)``
    (:func:`ci_half_width`) when ``ci_method`` is None, else the analysis' ``ci_method``
    interval's mean half-width on simulated studies (:func:`small_sample_half_width`). Both are
    ``R`` times the half-width at ``R = 1``, so the effect solves in closed form.

    Parameters
    ----------
    relative_sd : float
        ``τ``, the per-document relative SD of the ratio of means.
    ci_level : float
        The interval's level ``L``.
    ci_method : str or None
        The analysis' interval (None: the t interval on the log scale).
    total_cv : float or None
        ``cv_t`` of the per-document total energies (None: constant totals).

    Examples
    --------
    >>> from anistat.stats.power import HalfWidth
    >>> HalfWidth(0.5).solve_power(ratio=1.25, half_width=0.1)
    153
    >>> round(HalfWidth(0.5).solve_power(nobs=153, half_width=0.1), 3)
    1.251
    """

    def __init__(
        self, relative_sd: float, ci_level: float = 0.95, ci_method: str | None = None, total_cv: float | None = None
    ):
        self.relative_sd, self.ci_level, self.ci_method, self.total_cv = relative_sd, ci_level, ci_method, total_cv

    def half_width(self, nobs: int, ratio: float) -> float:
        """The half-width at ``nobs`` documents and effect ``ratio``."""
        if self.ci_method is None:
            return ci_half_width(nobs, self.relative_sd, ratio, self.ci_level)
        return small_sample_half_width(nobs, self.relative_sd, ratio, self.ci_level, self.ci_method, self.total_cv)

    def solve_power(
        self, nobs: int | None = None, ratio: float | None = None, half_width: float | None = None
    ) -> float | int | None:
        """Solve for the one of ``nobs`` (the fewest documents, :func:`documents_for_half_width`),
        ``ratio`` (the largest effect whose half-width is at most ``half_width``) and
        ``half_width`` that is None. None: not reachable within :data:`MAX_DOCUMENTS`."""
        missing = _one_missing(nobs=nobs, ratio=ratio, half_width=half_width)
        if missing == "half_width":
            return self.half_width(int(_given(nobs)), _given(ratio))
        if missing == "ratio":
            return _given(half_width) / self.half_width(int(_given(nobs)), 1.0)
        return documents_for_half_width(
            self.relative_sd,
            _given(ratio),
            _given(half_width),
            self.ci_level,
            self.ci_method,
            self.total_cv,
        )


class DataTestPower:
    """Power of the one-sided data test of ``R = 1`` (the studentized ratio test) at ``alpha``.

    ``power(nobs, ratio)``: with ``small_sample`` the real test's rejection rate on simulated
    studies of the per-document law below :data:`DATA_TEST_SIMULATION_LIMIT` documents and the
    matched noncentral t above (:func:`law_data_test_power`); without it the one-sample t-test's
    ``P(T_{n−1}(√n log R/τ) > t_{1−a, n−1})`` (:func:`data_test_power`, statsmodels
    ``TTestPower`` with effect size ``log R/τ``).

    Parameters
    ----------
    relative_sd : float
        ``τ``.
    alpha : float
        The test's threshold ``a`` (a family's corrected ``α/m``).
    small_sample : bool
        Plan with the real test's small-sample law (True) or the t formula.
    total_cv : float or None
        ``cv_t`` of the per-document total energies.
    haar_fraction : float
        ``k/d``, the Haar expectation of the energy fraction.

    Examples
    --------
    >>> from anistat.stats.power import DataTestPower
    >>> t_test = DataTestPower(0.5, 0.05, small_sample=False)
    >>> t_test.solve_power(ratio=1.2, power=0.8)
    48
    >>> round(t_test.solve_power(nobs=48, ratio=1.2), 3)
    0.801
    """

    def __init__(
        self,
        relative_sd: float,
        alpha: float,
        *,
        small_sample: bool = True,
        total_cv: float | None = None,
        haar_fraction: float = 0.125,
    ):
        self.relative_sd, self.alpha, self.small_sample = relative_sd, alpha, small_sample
        self.total_cv, self.haar_fraction = total_cv, haar_fraction

    def power(self, nobs: int, ratio: float) -> float:
        """The power at ``nobs`` documents and effect ``ratio``."""
        if not self.small_sample:
            return data_test_power(nobs, self.relative_sd, ratio, self.alpha)
        return law_data_test_power(nobs, self.relative_sd, ratio, self.alpha, self.total_cv, self.haar_fraction)

    def solve_power(
        self,
        nobs: int | None = None,
        ratio: float | None = None,
        power: float | None = None,
        *,
        start: int | None = None,
    ) -> float | int | None:
        """Solve for the one of ``nobs`` (the fewest documents that reach ``power`` with at most
        :data:`MAX_TEST_RESAMPLES` resamples, :func:`documents_for_data_test`, searched from
        ``start``, None: the t formula's count), ``ratio`` (the smallest effect that reaches
        ``power``, by bisection) and ``power`` that is None. None: not reachable."""
        missing = _one_missing(nobs=nobs, ratio=ratio, power=power)
        if missing == "power":
            return self.power(int(_given(nobs)), _given(ratio))
        if missing == "ratio":
            return _smallest_ratio(lambda r: self.power(int(_given(nobs)), r) >= _given(power))
        return documents_for_data_test(
            self.relative_sd,
            _given(ratio),
            _given(power),
            self.alpha,
            self.small_sample,
            total_cv=self.total_cv,
            haar_fraction=self.haar_fraction,
            start=start,
        )


class ExactTestPower:
    """Power ``Φ(√n (log(R k/d) − log q)/τ)`` of the exact Haar test (:func:`exact_test_power`):
    it rejects when the energy fraction exceeds ``q``, the Haar null's quantile at the threshold
    (:func:`haar_null_quantile`; a number, or a function of the documents when the null narrows
    as the sample spectrum settles). The effect solves in closed form,
    ``R = (q d/k) exp(τ Φ⁻¹(power)/√n)``.

    Parameters
    ----------
    relative_sd : float
        ``τ``.
    rank, dim : int
        ``k`` and ``d``.
    null_quantile : float or callable
        ``q``, or ``n ↦ q(n)``.
    least : int
        The fewest documents planned (the null is known from this size up).

    Examples
    --------
    >>> from anistat.stats.power import ExactTestPower
    >>> exact = ExactTestPower(0.4, 4, 32, 0.16)
    >>> exact.solve_power(ratio=1.5, power=0.8)
    5
    >>> exact.solve_power(ratio=1.2, power=0.8) is None  # R k/d below q: no size reaches it
    True
    """

    def __init__(
        self, relative_sd: float, rank: int, dim: int, null_quantile: float | Callable[[int], float], least: int = 2
    ):
        self.relative_sd, self.rank, self.dim, self.least = relative_sd, rank, dim, least
        self.quantile_at = null_quantile if callable(null_quantile) else (lambda n: float(null_quantile))

    def power(self, nobs: int, ratio: float) -> float:
        """The power at ``nobs`` documents and effect ``ratio``."""
        return exact_test_power(nobs, self.relative_sd, ratio, self.rank, self.dim, self.quantile_at(nobs))

    def solve_power(
        self, nobs: int | None = None, ratio: float | None = None, power: float | None = None
    ) -> float | int | None:
        """Solve for the one of ``nobs`` (:func:`documents_for_exact_test`), ``ratio`` and
        ``power`` that is None (None: not reachable at any size)."""
        missing = _one_missing(nobs=nobs, ratio=ratio, power=power)
        if missing == "power":
            return self.power(int(_given(nobs)), _given(ratio))
        if missing == "ratio":
            n = int(_given(nobs))
            shift = self.relative_sd * float(sps.norm.ppf(_given(power))) / math.sqrt(n)
            return self.quantile_at(n) * self.dim / self.rank * math.exp(shift)
        return documents_for_exact_test(
            self.relative_sd,
            _given(ratio),
            _given(power),
            self.rank,
            self.dim,
            self.quantile_at,
            self.least,
        )
