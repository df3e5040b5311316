"""`anistat plan`: how many documents (test sequences) and Haar draws a study needs.

From a pilot bundle (a small run of the same protocol) or from stated inputs, for an effect the
user states (the population energy ratio ``R`` of the proxy to the Haar expectation ``k/d``),
per unit kind (model × site kind × rank):

(a) documents for a target half-width of the energy ratio's CI,
(b) documents for a target power of the data test (the studentized ratio test of ``R = 1``),
(c) documents for a target power of the exact Haar test,

both tests at the family's corrected threshold ``α/m``, plus the Haar draws the exact test needs
to resolve that threshold.

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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from . import vocabulary as vocab
from .errors import AnistatInputError
from .stats import MIN_RESAMPLING_UNITS

#: The protocol's default ``stats.ci_method`` (the interval planned for stated inputs).
DEFAULT_CI_METHOD = vocab.DEFAULT_CI_METHOD
#: Multiplicity corrections the plan knows (the protocol's ``stats.multiplicity``).
CORRECTIONS = tuple(vocab.MULTIPLICITY)
#: Largest document count the planner searches (beyond it the target is reported unreachable).
MAX_DOCUMENTS = 10_000_000
#: Most bootstrap resamples the planned data test may need (see :func:`documents_for_data_test`).
MAX_TEST_RESAMPLES = 100_000
#: Probability with which the Monte-Carlo exact test rejects a test whose ideal p-value is half
#: the corrected threshold (see :func:`null_draws_needed`).
DRAWS_RESOLUTION = 0.99


@dataclass(frozen=True)
class PlanTargets:
    """What the user asks of the study.

    Attributes
    ----------
    ratio : float
        The effect: the population energy ratio ``R`` to the Haar expectation ``k/d`` (> 1).
    half_width : float or None
        Target half-width of the energy ratio's CI on the ratio scale (None: not planned).
    power : float
        Target power of the data test and of the exact test.
    alpha : float
        The family's level.
    multiplicity : str
        ``holm``, ``fdr_bh``, ``bonferroni`` or ``none``.
    family_size : int
        ``m``, the tests in the family.
    ci_level : float
        Level of the interval.
    variance_confidence : float
        ``c`` of the upper confidence limit of the pilot's variance.
    ci_method : str
        The analysis' interval method (the protocol's ``stats.ci_method``), whose small-sample
        half-width is planned.
    """

    ratio: float
    half_width: float | None = None
    power: float = 0.8
    alpha: float = 0.05
    multiplicity: str = vocab.HOLM
    family_size: int = 1
    ci_level: float = 0.95
    variance_confidence: float = 0.8
    ci_method: str = DEFAULT_CI_METHOD

    @property
    def threshold(self) -> float:
        """The corrected per-test threshold ``α/m`` (``α`` without correction): Holm's and
        Bonferroni's for a lone effect, and BH's smallest step — conservative for BH when many
        tests of the family carry effects."""
        return self.alpha if self.multiplicity == "none" else self.alpha / self.family_size


@dataclass(frozen=True)
class UnitLaw:
    """The per-document law of one unit (or one stated rank).

    Attributes
    ----------
    model, site_kind : str
        The unit kind's labels (``stated`` for stated inputs).
    rank, dim : int
        ``k`` and ``d``.
    relative_sd : float
        ``τ``: √n × the relative SE of the energy fraction (see the module docstring).
    null_sd : float
        SD of the Haar null of the energy fraction on the unit's data.
    pilot_documents : int or None
        The documents ``τ`` was estimated from (None: ``τ`` taken as known).
    sequences_per_document : float
        Test sequences per document (turns documents into ``data.n_test_sequences``).
    null_documents : int or None
        The documents whose sample second moment ``null_sd`` was measured on (a pilot's): the null
        is wider in smaller studies (fewer tokens, a noisier spectrum), so the exact test is never
        planned below this size. None: ``null_sd`` holds at every size.
    tokens_per_document : float or None
        Tokens per document: with ``null_documents``, the null's SD at another size follows from
        the spectrum's sampling noise (:func:`null_sd_at`).
    total_cv : float or None
        ``cv_t``, the CV of the per-document total energy (a pilot row's ``√(n/n_eff − 1)``, Kish
        ``n_eff``): with ``τ`` it sets the data test's simulated law (:func:`document_law`).
        None: not known (the law's document scale is then constant).
    """

    model: str
    site_kind: str
    rank: int
    dim: int
    relative_sd: float
    null_sd: float
    pilot_documents: int | None = None
    sequences_per_document: float = 1.0
    null_documents: int | None = None
    tokens_per_document: float | None = None
    total_cv: float | None = None


@dataclass(frozen=True)
class PlanRow:
    """One unit kind's plan (the rows of plan.csv). Document counts are None where the target
    cannot be reached (the exact test below its reachable ratio) or was not asked for."""

    model: str
    site_kind: str
    rank: int
    dim: int
    units: int
    pilot_documents: int | None
    relative_sd: float
    relative_sd_upper: float | None
    threshold: float
    null_quantile: float
    exact_ratio_needed: float
    documents_half_width: int | None
    documents_data_test: int | None
    documents_exact_test: int | None
    documents_half_width_upper: int | None
    documents_data_test_upper: int | None
    documents_exact_test_upper: int | None
    test_sequences: int | None
    null_draws: int
    test_resamples: int


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
    >>> from anistat.plan import relative_sd
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
    >>> from anistat.plan import document_law
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
    from .stats import expanded_pvalue

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
    >>> from anistat.plan import law_data_test_power
    >>> low, high = (law_data_test_power(n, 0.45, 1.25, 0.005, 0.78) for n in (30, 80))
    >>> 0.0 < low < high <= 1.0
    True
    """
    from .stats import bootstrap_weights

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
    from .stats import RATIO_INTERVAL_METHODS, bootstrap_weights, ratio_interval
    from .stats.energy import _ratio_intervals, _Units

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
    >>> from anistat.plan import width_boundary
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
    >>> from anistat.plan import haar_null_quantile
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


def null_sd_at(law: UnitLaw, n: int | None) -> float:
    """The Haar null's SD in a study of ``n`` documents (None: infinitely many).

    The null's variance is ``c (Σŵ² − 1/d)``, ``c = 2k(d−k)/((d−1)d(d+2))``, with ``Σŵ²`` the
    concentration of the *sample* spectrum, which ``N`` i.i.d. tokens inflate:
    ``E Σŵ² ≈ Σw² + (1 − Σw²)/N``. A pilot's ``null_sd`` at ``N_p = tokens_per_document ·
    null_documents`` tokens gives the population's ``Σw² = (Σŵ²_p − 1/N_p)/(1 − 1/N_p)`` (at
    least ``1/d``), and the study's at ``N = tokens_per_document · n``. Without the token count
    ``null_sd`` is returned as it is."""
    if law.tokens_per_document is None or law.null_documents is None:
        return law.null_sd
    d, k = law.dim, law.rank
    scale = 2.0 * k * (d - k) / ((d - 1.0) * d * (d + 2.0))
    pilot_tokens = law.tokens_per_document * law.null_documents
    sampled = law.null_sd**2 / scale + 1.0 / d
    population = max((sampled - 1.0 / pilot_tokens) / (1.0 - 1.0 / pilot_tokens), 1.0 / d)
    at_n = population if n is None else population + (1.0 - population) / (law.tokens_per_document * n)
    return float(math.sqrt(scale * max(at_n - 1.0 / d, 0.0)))


def exact_test_power(n: int, tau: float, ratio: float, rank: int, dim: int, null_quantile: float) -> float:
    """Power ``Φ(√n (log(R k/d) − log q)/τ)`` of the exact test with ``n`` documents (``q``: the
    null's quantile at the threshold, :func:`haar_null_quantile`)."""
    fraction = ratio * rank / dim
    return float(sps.norm.cdf(math.sqrt(n) * (math.log(fraction) - math.log(null_quantile)) / tau))


def smallest_n(meets, low: int = 2, high: int = MAX_DOCUMENTS) -> int | None:
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


def smallest_n_near(meets, guess: int, low: int, high: int = MAX_DOCUMENTS) -> int | None:
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
    >>> from anistat.plan import boundary_relative_sd
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
    >>> from anistat.plan import documents_for_half_width
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
    tau: float, ratio: float, power: float, rank: int, dim: int, null_quantile, least: int = 2
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
    >>> from anistat.plan import null_draws_needed
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
    >>> from anistat.plan import data_test_resamples
    >>> data_test_resamples(0.005, 10) > data_test_resamples(0.005, 1000) >= data_test_resamples(0.005, None)
    True
    """
    from .stats import expanded_tail

    tail = threshold if documents is None else expanded_tail(threshold, documents)
    return null_draws_needed(tail)


def upper_relative_sd(tau: float, pilot_documents: int | None, confidence: float) -> float | None:
    """``τ_U = τ √((n−1)/χ²_{1−c, n−1})``: the upper ``c`` confidence limit of ``τ`` from a pilot
    of ``n`` documents (None without a pilot size)."""
    if pilot_documents is None or pilot_documents < 2:
        return None
    df = pilot_documents - 1
    return float(tau * math.sqrt(df / sps.chi2.ppf(1.0 - confidence, df)))


# ------------------------------------------------------------------------------ planning
def plan_unit(law: UnitLaw, targets: PlanTargets, data_test: bool = True) -> dict[str, Any]:
    """The plan of one unit: documents for each target (point and upper variance limit; the data
    test's only with ``data_test``), the null's quantile and the ratio the exact test needs."""
    threshold = targets.threshold
    quantile = haar_null_quantile(law.rank, law.dim, null_sd_at(law, None), threshold)

    def quantile_at(n: int) -> float:
        return haar_null_quantile(law.rank, law.dim, null_sd_at(law, n), threshold)

    upper = upper_relative_sd(law.relative_sd, law.pilot_documents, targets.variance_confidence)

    def documents(tau: float | None) -> tuple[int | None, int | None, int | None]:
        if tau is None:
            return None, None, None
        width = (
            documents_for_half_width(
                tau, targets.ratio, targets.half_width, targets.ci_level, targets.ci_method, law.total_cv
            )
            if targets.half_width is not None
            else None
        )
        data = (
            documents_for_data_test(
                tau,
                targets.ratio,
                targets.power,
                threshold,
                total_cv=law.total_cv,
                haar_fraction=law.rank / law.dim,
            )
            if data_test
            else None
        )
        # the null is carried up from the pilot's size, never down: i.i.d. tokens understate the
        # noise of a smaller sample's spectrum (tokens of a sequence are dependent), so below the
        # pilot the carried null would be too narrow and the plan optimistic
        least = law.null_documents or 2
        exact = documents_for_exact_test(tau, targets.ratio, targets.power, law.rank, law.dim, quantile_at, least)
        return width, data, exact

    point, high = documents(law.relative_sd), documents(upper)
    return {
        "relative_sd_upper": upper,
        "null_quantile": quantile,
        "exact_ratio_needed": quantile * law.dim / law.rank,
        "documents": point,
        "documents_upper": high,
    }


def _worst(values: Sequence[int | None]) -> int | None:
    """The most documents any unit needs (None when one cannot reach the target at all)."""
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def _kind_data_test(
    laws: Sequence[UnitLaw], uppers: Sequence[float | None], targets: PlanTargets
) -> tuple[int | None, int | None]:
    """The data test's documents for a unit kind, point and upper variance limit: planned once,
    for the law of its unit with the largest ``τ`` (its own ``cv_t``; the simulated power,
    :func:`law_data_test_power`, is too costly to search per unit), at ``τ`` and at the kind's
    largest ``τ_U`` (searched from the point count times ``(τ_U/τ)²``)."""
    hardest = max(laws, key=lambda law: law.relative_sd)

    def documents(tau: float, start: int | None = None) -> int | None:
        return documents_for_data_test(
            tau,
            targets.ratio,
            targets.power,
            targets.threshold,
            total_cv=hardest.total_cv,
            haar_fraction=hardest.rank / hardest.dim,
            start=start,
        )

    point = documents(hardest.relative_sd)
    if None in uppers:
        return point, None
    upper = max(u for u in uppers if u is not None)
    start = None if point is None else math.ceil(point * (upper / hardest.relative_sd) ** 2)
    return point, documents(upper, start)


def plan_rows(laws: Sequence[UnitLaw], targets: PlanTargets, use_upper: bool = False) -> list[PlanRow]:
    """One :class:`PlanRow` per unit kind (model × site kind × rank): the plan must serve every
    unit of the kind, so each count is the largest over its units (the largest ``τ`` and null
    quantile decide). ``test_sequences``: the documents of the targets asked for (half-width
    when given, the data test, and the exact test where reachable), the upper-limit plan with
    ``use_upper``, times the sequences per document."""
    kinds: dict[tuple[str, str, int], list[tuple[UnitLaw, dict[str, Any]]]] = {}
    for law in laws:
        kinds.setdefault((law.model, law.site_kind, law.rank), []).append((law, plan_unit(law, targets, False)))
    draws = null_draws_needed(targets.threshold)
    rows = []
    for (model, site_kind, rank), members in kinds.items():
        point = [_worst([plan["documents"][i] for _, plan in members]) for i in range(3)]
        high = [_worst([plan["documents_upper"][i] for _, plan in members]) for i in range(3)]
        uppers = [plan["relative_sd_upper"] for _, plan in members]
        point[1], high[1] = _kind_data_test([law for law, _ in members], uppers, targets)
        pilots = [law.pilot_documents for law, _ in members]
        chosen = high if use_upper and None not in uppers else point
        wanted = [n for n in (chosen[0], chosen[1], chosen[2]) if n is not None]
        spd = max(law.sequences_per_document for law, _ in members)
        rows.append(
            PlanRow(
                model=model,
                site_kind=site_kind,
                rank=rank,
                dim=members[0][0].dim,
                units=len(members),
                pilot_documents=None if None in pilots else min(p for p in pilots if p is not None),
                relative_sd=max(law.relative_sd for law, _ in members),
                relative_sd_upper=None if None in uppers else max(u for u in uppers if u is not None),
                threshold=targets.threshold,
                null_quantile=max(plan["null_quantile"] for _, plan in members),
                exact_ratio_needed=max(plan["exact_ratio_needed"] for _, plan in members),
                documents_half_width=point[0],
                documents_data_test=point[1],
                documents_exact_test=point[2],
                documents_half_width_upper=high[0],
                documents_data_test_upper=high[1],
                documents_exact_test_upper=high[2],
                test_sequences=math.ceil(max(wanted) * spd) if wanted else None,
                null_draws=draws,
                test_resamples=data_test_resamples(targets.threshold, chosen[1]),
            )
        )
    return rows


# ------------------------------------------------------------------------- pilot bundles
def family_size_of(results, protocol, manifest: dict | None = None) -> int:
    """``m`` of the pilot's largest multiplicity family: the analysis' own count when the manifest
    records it (``null_settings.n_tests``), else counted the same way from the results: per unit
    (checkpoint × site) and (proxy, rank) the exact energy test, the exact ΔIsoScore* test and the
    data tests (one for the closed-form control kinds together, one per projected kind); summed
    over the run (``family: run``/``claim``) or the largest model's (``family: model``)."""
    recorded = (manifest or {}).get("null_settings", {}).get("n_tests")
    if isinstance(recorded, int) and recorded >= 1:
        return recorded
    kinds = set(protocol.controls.kinds)
    projected = kinds & set(protocol.projected_control_kinds)
    per_group = 2 + len(projected) + (1 if kinds - projected else 0)
    rows = results[results["status"].astype(str) == "ok"] if "status" in results else results
    rows = rows[rows["metric"] == "energy_fraction"]
    groups = rows[["model", "checkpoint", "site", "proxy", "rank"]].drop_duplicates()
    per_model = groups.groupby("model", sort=False).size() * per_group
    if per_model.empty:
        return 1
    return int(per_model.max() if protocol.stats.family == "model" else per_model.sum())


def laws_from_results(results) -> list[UnitLaw]:
    """Each unit's :class:`UnitLaw` from a pilot's results table: ``τ`` from the haar (else any)
    ``energy_fraction`` row (``√n_clusters · se / estimate``; ``n_sequences`` without documents)
    and the null's SD from the haar row's ``control_sd`` (else from the
    ``gradient_participation_ratio`` row through :func:`anistat.stats.control_energy_moments`)."""
    from .stats import control_energy_moments

    ok = results[results["status"].astype(str) == "ok"] if "status" in results else results
    fractions = ok[ok["metric"] == "energy_fraction"]
    laws = []
    for key, rows in fractions.groupby(["model", "checkpoint", "site", "proxy", "rank"], sort=False):
        haar = rows[rows["control"] == vocab.HAAR]
        row = (haar if len(haar) else rows).iloc[0]
        documents = row.get("n_clusters")
        documents = int(documents) if _present(documents) else int(row["n_sequences"])
        estimate, se = float(row["estimate"]), float(row["se"])
        if not (documents >= 2 and estimate > 0 and np.isfinite(se) and se > 0):
            continue
        dim, rank = int(row["dim"]), int(row["rank"])
        null_sd = float(row["control_sd"]) if len(haar) else float("nan")
        if not np.isfinite(null_sd):
            pr = ok[(ok["metric"] == "gradient_participation_ratio") & (ok["site"] == key[2])]
            pr = pr[(pr["model"] == key[0]) & (pr["checkpoint"] == key[1])]["estimate"]
            frobenius = 1.0 / float(pr.iloc[0]) if len(pr) else 1.0 / dim
            null_sd = control_energy_moments(vocab.HAAR, rank, dim, 1.0, frobenius).sd
        laws.append(
            UnitLaw(
                model=str(key[0]),
                site_kind=str(key[2]).split(".")[0],
                rank=rank,
                dim=dim,
                relative_sd=math.sqrt(documents) * se / estimate,
                null_sd=null_sd,
                pilot_documents=documents,
                sequences_per_document=float(row["n_sequences"]) / documents,
                null_documents=documents,
                tokens_per_document=float(row["n_tokens"]) / documents if _present(row.get("n_tokens")) else None,
                total_cv=_total_cv(documents, row.get("n_eff")),
            )
        )
    return laws


def _total_cv(documents: int, n_eff: Any) -> float | None:
    """``cv_t = √(n/n_eff − 1)``: Kish's ``n_eff = (Σt)²/Σt²`` of ``n`` per-document total
    energies is ``n/(1 + cv_t²)`` (the CV with divisor ``n``); None without an ``n_eff``."""
    if not _present(n_eff) or not float(n_eff) > 0:
        return None
    return math.sqrt(max(documents / float(n_eff) - 1.0, 0.0))


def _present(value: Any) -> bool:
    try:
        return value is not None and not bool(np.isnan(float(value)))
    except (TypeError, ValueError):
        return False


def stated_laws(
    dim: int,
    ranks: Sequence[int],
    tau: float,
    participation_ratio: float | None = None,
    pilot_documents: int | None = None,
    sequences_per_document: float = 1.0,
    total_cv: float | None = None,
) -> list[UnitLaw]:
    """:class:`UnitLaw` per stated rank: the Haar null's SD from the gradients' participation
    ratio ``PR = (Σλ)²/Σλ²`` (None: ``d``, isotropic gradients — the null is then the point
    ``k/d``, the optimistic end for the exact test)."""
    from .stats import control_energy_moments

    if dim < 2:
        raise AnistatInputError(f"--dim must be at least 2, got {dim}")
    bad = [k for k in ranks if not 1 <= k < dim]
    if bad:
        raise AnistatInputError(f"--rank {bad[0]} must be between 1 and --dim - 1 = {dim - 1}")
    pr = float(dim if participation_ratio is None else participation_ratio)
    if not 1.0 <= pr <= dim:
        raise AnistatInputError(f"--participation-ratio must be between 1 and --dim = {dim}, got {pr:g}")
    return [
        UnitLaw(
            model="stated",
            site_kind="stated",
            rank=int(k),
            dim=int(dim),
            relative_sd=tau,
            null_sd=control_energy_moments(vocab.HAAR, int(k), int(dim), 1.0, 1.0 / pr).sd,
            pilot_documents=pilot_documents,
            sequences_per_document=sequences_per_document,
            total_cv=total_cv,
        )
        for k in ranks
    ]


def check_targets(targets: PlanTargets) -> None:
    """One line naming the flag for every impossible target (exit 2 at the command line)."""
    if not targets.ratio > 1.0:
        raise AnistatInputError(f"--ratio must be above 1 (the effect to detect), got {targets.ratio:g}")
    if targets.half_width is not None and not targets.half_width > 0:
        raise AnistatInputError(f"--half-width must be positive, got {targets.half_width:g}")
    for name, value in (("--power", targets.power), ("--alpha", targets.alpha), ("--ci-level", targets.ci_level)):
        if not 0.0 < value < 1.0:
            raise AnistatInputError(f"{name} must be in (0, 1), got {value:g}")
    if not 0.0 < targets.variance_confidence < 1.0:
        raise AnistatInputError(f"--variance-confidence must be in (0, 1), got {targets.variance_confidence:g}")
    if targets.multiplicity not in CORRECTIONS:
        raise AnistatInputError(f"--multiplicity must be one of {', '.join(CORRECTIONS)}, got '{targets.multiplicity}'")
    if targets.family_size < 1:
        raise AnistatInputError(f"--family-size must be at least 1, got {targets.family_size}")


def row_dicts(rows: Sequence[PlanRow]) -> list[dict[str, Any]]:
    """The plan's rows as plain dicts (plan.csv's columns, in order)."""
    return [asdict(row) for row in rows]


PLAN_COLUMNS = tuple(f.name for f in fields(PlanRow))


def with_targets(targets: PlanTargets, **changes: Any) -> PlanTargets:
    """``targets`` with some fields replaced (the command line fills what the pilot did not)."""
    return replace(targets, **{k: v for k, v in changes.items() if v is not None})


def read_pilot(bundle: Path):
    """The pilot's :class:`anistat.bundle.BundleContents` (a missing or damaged bundle: exit 2)."""
    from .bundle import read_bundle

    if not Path(bundle).is_dir():
        raise AnistatInputError(f"{bundle}: no such bundle directory; give the folder a pilot `anistat run` wrote")
    return read_bundle(Path(bundle))


# ------------------------------------------------------------------------------- outputs
def assumptions(targets: PlanTargets, source: str) -> list[str]:
    """What the plan assumes and how far it can be trusted, in sentences (terminal and HTML)."""
    correction = (
        "no correction" if targets.multiplicity == "none" else f"{targets.multiplicity} over m = {targets.family_size}"
    )
    return [
        f"Effect: population energy ratio R = {targets.ratio:g} to the Haar expectation k/d, in every unit "
        f"kind; tests one-sided at the corrected threshold {targets.threshold:.3g} ({correction}, alpha = "
        f"{targets.alpha:g}; for fdr_bh this is the smallest step, conservative when many tests carry effects).",
        f"Per-document law: {source}; the same relative SD tau at the stated ratio, independent documents, "
        "and log R̂ approximately normal (delta method for a ratio of means).",
        f"Data test: below {DATA_TEST_SIMULATION_LIMIT} documents the share of {DATA_TEST_STUDIES} seeded simulated "
        "studies that the real bootstrap-t test (small-sample expansion, the plan's resamples) rejects; the "
        "studies' documents: a lognormal energy scale (its CV with tau gives the pilot's total-energy CV "
        "sqrt(n/n_eff - 1)), the proxy a fixed share R k/d of it, the complement's share lognormal with the CV "
        "that gives tau — an assumed shape (documents with more energy carry a smaller proxy share), "
        "conservative in the calibration's laws (docs/plan.md). From "
        f"{DATA_TEST_SIMULATION_LIMIT} documents the one-sample t-test's power with effect size log R / tau_b, "
        f"tau_b >= tau the relative SD at which it equals the law's power at {DATA_TEST_SIMULATION_LIMIT - 1} "
        "documents. With few "
        f"documents the expanded tail at a small threshold needs more than {MAX_TEST_RESAMPLES:,} resamples, so "
        f"the count is raised until it does not. Half-width: of the analysis' {targets.ci_method} interval, "
        f"simulated below {SMALL_SAMPLE_LIMIT} documents on documents whose total energies are lognormal with "
        "the pilot's total-energy CV (constant when it is unknown) and whose residual is normal (optimistic "
        "with heavier-tailed documents: read the upper-limit column), and further, up to the first size where "
        "every simulated interval is bounded, when they are not all bounded there.",
        "Exact test: rejects when the energy fraction exceeds the Haar null's quantile at the threshold; that "
        "null is set by d, k and the gradients' spectrum, not by the number of documents, so below the ratio "
        "'exact_ratio_needed' no study size reaches the power (empty count). The quantile is a Beta moment match to the null's mean and SD, "
        "measured on the pilot's gradients and carried to the planned size through the sample spectrum's noise "
        "(about (1 − Σw²)/N for N i.i.d. tokens; dependent tokens make this conservative above the pilot's size, "
        "so the exact test is never planned below it). Half-width and data test: at least "
        f"{MIN_RESAMPLING_UNITS} documents (fewer and the analysis withholds them).",
        f"Trust: tau estimated from a pilot of n documents is uncertain ((n − 1) tau_hat²/tau² ≈ chi-square, n − 1 "
        f"df); the *_upper columns plan at its upper {targets.variance_confidence:g} confidence limit. Each unit "
        "kind takes its hardest unit (largest tau and null quantile; the data test: the law of its unit with "
        "the largest tau).",
        f"Haar draws: enough that a test whose ideal p-value is half the threshold is rejected with probability "
        f"{DRAWS_RESOLUTION:g} (the floor 1/(n + 1) alone would let one unlucky draw decide); bootstrap "
        "resamples of the data test likewise for its expanded tail at the planned documents.",
        *_unresolvable_data_test(targets),
    ]


def _unresolvable_data_test(targets: PlanTargets) -> list[str]:
    """Why the data test has no count at a threshold too small for :data:`MAX_TEST_RESAMPLES`
    bootstrap resamples at any size ([] otherwise): its tail needs at least
    ``data_test_resamples(threshold, None)`` of them however many documents there are."""
    needed = data_test_resamples(targets.threshold, None)
    if needed <= MAX_TEST_RESAMPLES:
        return []
    return [
        f"Data test not planned (— in every row): at the threshold {targets.threshold:.3g} it needs at least "
        f"{needed:,} bootstrap resamples at any size, more than the {MAX_TEST_RESAMPLES:,} the planner allows; "
        "a smaller family (--family-size, the protocol's stats.family) or a larger alpha brings it in reach, "
        "and the exact test and the interval are planned regardless."
    ]


def _count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def table_cells(row: PlanRow) -> list[str]:
    """The terminal/HTML table's cells of one row."""
    upper = "" if row.relative_sd_upper is None else f" ({row.relative_sd_upper:.3g})"
    return [
        row.model,
        row.site_kind,
        str(row.rank),
        str(row.dim),
        f"{row.relative_sd:.3g}{upper}",
        # a half-width is always reachable with enough documents: no count means it was not asked
        "not asked"
        if row.documents_half_width is None
        else _count(row.documents_half_width) + _upper(row.documents_half_width_upper, row.relative_sd_upper),
        _count(row.documents_data_test) + _upper(row.documents_data_test_upper, row.relative_sd_upper),
        _count(row.documents_exact_test) + _upper(row.documents_exact_test_upper, row.relative_sd_upper),
        f"{row.exact_ratio_needed:.3g}",
        _count(row.test_sequences),
    ]


def _upper(value: int | None, upper_sd: float | None) -> str:
    return "" if upper_sd is None else f" ({_count(value)})"


TABLE_HEADER = (
    "model",
    "site",
    "k",
    "d",
    "tau",
    "docs: half-width",
    "docs: data test",
    "docs: exact test",
    "exact needs R ≥",
    "test sequences",
)


def terminal_table(rows: Sequence[PlanRow]) -> str:
    """The plan as an aligned text table (upper-limit plans in parentheses)."""
    cells = [list(TABLE_HEADER)] + [table_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def plan_html(rows: Sequence[PlanRow], targets: PlanTargets, notes: Sequence[str], title: str) -> str:
    """plan.html: one self-contained section (no scripts, no network), every value escaped."""
    from .report.escape import esc

    head = "".join(f"<th>{esc(h)}</th>" for h in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in table_cells(row)) + "</tr>" for row in rows)
    items = "".join(f"<li>{esc(note)}</li>" for note in notes)
    draws = rows[0].null_draws if rows else null_draws_needed(targets.threshold)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;max-width:70em;margin:2em auto}}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
        "</style></head><body>\n"
        f'<section id="plan"><h1>{esc(title)}</h1>\n'
        f"<p>Documents needed per unit kind for R = {esc(f'{targets.ratio:g}')}: CI half-width "
        f"{esc('not planned' if targets.half_width is None else f'{targets.half_width:g}')}, power "
        f"{esc(f'{targets.power:g}')} of the data test and of the exact test at {esc(f'{targets.threshold:.3g}')}; "
        f"in parentheses at the upper confidence limit of the pilot's variance. Haar draws: {esc(f'{draws:,}')}.</p>\n"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n"
        f"<h2>What the plan assumes</h2><ul>{items}</ul></section>\n</body></html>\n"
    )


def plan_csv(rows: Sequence[PlanRow]) -> str:
    """plan.csv's text (:data:`PLAN_COLUMNS`; an unreachable or unasked count is empty)."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(PLAN_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for record in row_dicts(rows):
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return buffer.getvalue()


def planned_protocol(protocol, rows: Sequence[PlanRow]) -> tuple[str, int | None]:
    """The pilot's protocol with the planned ``data.n_test_sequences`` (the most any unit kind
    needs; unchanged when no count is reachable) and ``stats.n_null_draws``, as YAML text, and
    the planned test sequences. The result parses as a protocol (checked here)."""
    import yaml

    from .protocol import parse_protocol

    data = protocol.normalised()
    needed = [row.test_sequences for row in rows if row.test_sequences is not None]
    sequences = max(needed) if needed else None
    if sequences is not None:
        data["data"]["n_test_sequences"] = int(max(sequences, 2))
    draws = max(row.null_draws for row in rows) if rows else 9999
    data["stats"]["n_null_draws"] = int(min(max(draws, 99), 10_000_000))
    resamples = max(row.test_resamples for row in rows) if rows else data["stats"]["n_test_resamples"]
    data["stats"]["n_test_resamples"] = int(min(max(resamples, data["stats"]["n_test_resamples"]), 1_000_000))
    parse_protocol(data, "the planned protocol")
    header = (
        f"# planned by `anistat plan` from the pilot protocol '{protocol.name}': "
        f"n_test_sequences and n_null_draws set by the plan (plan.csv)\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), sequences


def write_plan(
    out: Path, rows: Sequence[PlanRow], targets: PlanTargets, notes: Sequence[str], protocol=None
) -> list[str]:
    """plan.csv, plan.html, manifest.json and (from a pilot) protocol.yaml into ``out``, staged and
    swapped into place in one rename (nothing half-written; a folder holding files anistat did
    not write is refused). Returns the file names written."""
    from .bundle import file_digests, staged_bundle, write_json

    texts = {
        "plan.csv": plan_csv(rows),
        "plan.html": plan_html(rows, targets, notes, "anistat plan"),
    }
    if protocol is not None:
        texts["protocol.yaml"] = planned_protocol(protocol, rows)[0]
    with staged_bundle(out) as staging:
        for name, text in texts.items():
            (staging / name).write_text(text, encoding="utf-8")
        write_json(
            staging / "manifest.json",
            {"anistat_plan": 1, "targets": asdict(targets), "files": file_digests(staging)},
        )
    return sorted([*texts, "manifest.json"])


@dataclass(frozen=True)
class StatedInputs:
    """The per-document law stated on the command line instead of a pilot bundle.

    ``relative_sd`` (τ) directly, or from ``cv_proxy``, ``cv_total`` and ``correlation``
    (:func:`relative_sd`); ``participation_ratio`` of the gradients (None: isotropic);
    ``pilot_documents``: the documents the law was estimated from (for the upper limit)."""

    dim: int
    ranks: tuple[int, ...]
    relative_sd: float | None = None
    cv_proxy: float | None = None
    cv_total: float | None = None
    correlation: float = 0.0
    participation_ratio: float | None = None
    pilot_documents: int | None = None
    sequences_per_document: float = 1.0

    def tau(self) -> float:
        """τ, checked: stated directly or from the coefficients of variation."""
        if self.relative_sd is not None:
            tau = self.relative_sd
        elif self.cv_proxy is not None and self.cv_total is not None:
            if self.cv_proxy < 0 or self.cv_total < 0 or not -1.0 <= self.correlation <= 1.0:
                raise AnistatInputError("--cv-proxy and --cv-total must be >= 0 and --correlation in [-1, 1]")
            tau = relative_sd(self.cv_proxy, self.cv_total, self.correlation)
        else:
            raise AnistatInputError(
                "stated inputs need the per-document law: --relative-sd, or --cv-proxy and --cv-total "
                "(and --correlation)"
            )
        if not (math.isfinite(tau) and tau > 0):
            raise AnistatInputError(f"the per-document relative SD must be positive, got {tau:g}")
        return tau


@dataclass(frozen=True)
class Plan:
    """A finished plan: its rows, the targets it was made for, what it assumes, and the pilot's
    protocol (None for stated inputs)."""

    rows: tuple[PlanRow, ...]
    targets: PlanTargets
    notes: tuple[str, ...]
    protocol: Any = None


def plan_from_bundle(bundle: Path, given: dict[str, Any], use_upper: bool = False) -> Plan:
    """The plan from a pilot bundle: its per-unit laws (:func:`laws_from_results`), the targets in
    ``given`` (:class:`PlanTargets` fields) and, for those left None, the pilot protocol's
    ``alpha``, ``ci_level``, multiplicity and family size (:func:`family_size_of`)."""
    pilot = read_pilot(bundle)
    stats = pilot.protocol.stats
    defaults = PlanTargets(
        ratio=1.0,
        alpha=stats.alpha,
        multiplicity=stats.multiplicity,
        family_size=family_size_of(pilot.results, pilot.protocol, pilot.manifest),
        ci_level=stats.ci_level,
        ci_method=stats.ci_method,
    )
    targets = with_targets(defaults, **given)
    check_targets(targets)
    laws = laws_from_results(pilot.results)
    if not laws:
        raise AnistatInputError(
            f"{bundle}: no energy_fraction row with a standard error (every unit failed, or the pilot had "
            f"fewer than {MIN_RESAMPLING_UNITS} documents per unit, below which the analysis withholds it); "
            "run a larger pilot"
        )
    fewest = min(law.pilot_documents or 0 for law in laws)
    source = f"estimated from the pilot {Path(bundle).name} (at least {fewest} documents per unit)"
    rows = plan_rows(laws, targets, use_upper)
    return Plan(tuple(rows), targets, tuple(assumptions(targets, source)), pilot.protocol)


def plan_from_inputs(inputs: StatedInputs, given: dict[str, Any], use_upper: bool = False) -> Plan:
    """The plan from stated inputs and the targets in ``given`` (:class:`PlanTargets` fields; a
    None family size means one test per rank). No pilot, so no protocol is written."""
    targets = with_targets(PlanTargets(ratio=1.0, family_size=max(len(inputs.ranks), 1)), **given)
    check_targets(targets)
    tau = inputs.tau()
    if inputs.pilot_documents is not None and inputs.pilot_documents < 2:
        raise AnistatInputError(f"--pilot-documents must be at least 2, got {inputs.pilot_documents}")
    if not inputs.sequences_per_document >= 1.0:
        raise AnistatInputError(f"--sequences-per-document must be at least 1, got {inputs.sequences_per_document:g}")
    if not inputs.ranks:
        raise AnistatInputError("stated inputs need at least one --rank")
    laws = stated_laws(
        inputs.dim,
        inputs.ranks,
        tau,
        inputs.participation_ratio,
        inputs.pilot_documents,
        inputs.sequences_per_document,
        inputs.cv_total,
    )
    spectrum = (
        "isotropic" if inputs.participation_ratio is None else f"participation ratio {inputs.participation_ratio:g}"
    )
    spread = "unknown" if inputs.cv_total is None else f"{inputs.cv_total:.3g}"
    source = f"stated (tau = {tau:.3g}, total-energy CV {spread}, gradients {spectrum})"
    rows = plan_rows(laws, targets, use_upper)
    return Plan(tuple(rows), targets, tuple(assumptions(targets, source)), None)
