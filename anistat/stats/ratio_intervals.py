"""Confidence intervals for a ratio of means ``θ = E[p] / E[e]`` over resampling units, for
skewed, concentrated data (the energy ratio ``Σp/Σe`` with per-document sums ``p_u``, ``e_u``).

Every method sees the per-unit numerator ``p_u`` and denominator ``e_u`` (``n`` units); the
bootstrap ones also the multiplicities ``W (B, n)`` (:func:`anistat.stats.bootstrap_weights`).
Two families:

**Bootstrap** (tails expanded for ``n`` units, Hesterberg 2015, when ``expand_units`` is given):

* ``studentized_log`` — bootstrap-t on the log scale with the delta-method SE of a ratio of sums
  (:func:`anistat.stats.ratio_se`): ``t*_b = (ln θ*_b − ln θ̂)/(se*_b/θ*_b)``, interval
  ``θ̂·exp(−q_{1−α/2}(t*)·se/θ̂), θ̂·exp(−q_{α/2}(t*)·se/θ̂)`` (Davison & Hinkley 1997, eq. 5.7);
  the analysis' ``studentized`` interval.
* ``bca_log`` — BCa (Efron 1987) of ``ln θ`` (replicates ``ln θ*_b``, jackknife
  ``ln θ_(i) = ln((Σp − p_i)/(Σe − e_i))`` from the leave-one-out sums, O(n) memory),
  exponentiated. BCa's quantiles are invariant under a monotone map; the log scale changes
  only the jackknife estimate of the acceleration.
* ``variance_stabilised`` — Tibshirani's (1988) variance-stabilised bootstrap-t: fit the SE as a
  smooth function of the statistic, ``se(θ) = c·θ^β`` (least squares of ``ln se*_b`` on
  ``ln θ*_b``), take the stabilising map ``g(θ) = ∫ dθ/se(θ)`` (``θ^{1−β}/(c(1−β))``, or
  ``ln θ / c`` at ``β = 1``), on which the SE is constant, and invert the bootstrap-t of
  ``g``: ``[g⁻¹(g(θ̂) − q_{1−α/2}), g⁻¹(g(θ̂) − q_{α/2})]`` with ``q`` the quantiles of
  ``g(θ*_b) − g(θ̂)``. Tibshirani estimates ``se*_b`` with an inner bootstrap (B₁ = 100 outer,
  B₂ = 25 inner resamples); for a ratio of sums the delta-method SE of each replicate
  (:func:`anistat.stats.ratio_se`) takes its place, so the cost is the plain bootstrap's and the
  same resamples serve steps 1 and 3. ``β = 1`` is the log-scale bootstrap-t with a constant
  relative SE.

**Empirical likelihood** (Owen 1988, 2001 §3.5 for estimating equations) of the estimating
function ``z_u(θ) = p_u − θ e_u`` (``E z(θ) = 0`` exactly at the population ratio):
``−2 ln R(θ) = 2 Σ_u ln(1 + λ z_u)`` with ``λ`` solving ``Σ_u z_u/(1 + λ z_u) = 0``, and the
interval ``{θ : −2 ln R(θ) ≤ χ²₁(1 − α)}`` (Wilks). No resampling.

* ``el`` — plain EL. ``R(θ) = 0`` outside ``(min p_u/e_u, max p_u/e_u)``, so the interval never
  leaves the range of the units' own ratios (its known undercoverage in small samples).
* ``adjusted_el`` — Chen, Variyath & Abraham (2008, J. Comput. Graph. Stat. 17: 426–443): one
  pseudo-unit ``z_{n+1} = −a_n z̄`` with ``a_n = max(1, ln(n)/2)``, so ``R(θ) > 0`` for every θ.
* ``balanced_el`` — Emerson & Owen (2009, Electron. J. Stat. 3: 1161–1192), balanced augmented
  EL in one dimension: two pseudo-units ``z_{n+1} = −s·sd(z)·u`` and
  ``z_{n+2} = 2 z̄ + s·sd(z)·u`` with ``u = sign(z̄)`` and ``s = 1.9`` (their recommendation),
  which keep the mean ``z̄`` and pull the statistic towards the χ² law in small samples.

* ``adjusted_el_f`` — the adjusted EL statistic with an F calibration on the data's effective
  size (Owen 2001 §3.5 calibrates ``−2 ln R`` of a ``p``-dimensional mean by
  ``p(n − 1)/(n − p)·F(p, n − p)``, ``F(1, n − 1)`` here, instead of ``χ²₁`` in small samples): the interval ``{θ : −2 ln R(θ) ≤ F_{1−α}(1, m − 1)}`` with ``m``
  (:func:`el_effective_size`) the smaller of Kish's effective size of the denominators
  ``(Σe)²/Σe²`` and the tail-weight size ``min(n, 3(Σz²)²/Σz⁴)`` of the estimating function at
  the estimate, ``z_u = p_u − θ̂ e_u`` (``n`` for normal ``z``, whose kurtosis is 3; ``3n/κ̂`` for a
  sample kurtosis ``κ̂``). Both sizes fall where a few units carry the estimate, so the critical
  value grows with the concentration, not only with a small ``n`` (chosen by coverage over
  ``anistat calibrate``'s scenarios: ``benchmarks/bench_ratio_calibration.py``).

The adjusted statistics are bounded in θ; where ``−2 ln R`` never reaches the χ² quantile on one
side, that end is the parameter's range bound (0 or ∞), with a note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import chi2
from scipy.stats import f as f_distribution

from .. import vocabulary as vocab
from ._validation import check_choice, check_ci_level
from .bootstrap import ci_from_replicates, expanded_tail, ratio_se
from .fallbacks import CI_UNBOUNDED, NO_INTERVAL

#: This module's name for the analysis' ``studentized`` interval (a ratio on the log scale).
STUDENTIZED_LOG = "studentized_log"
#: The empirical-likelihood adjustments of :func:`ratio_el_statistic`.
EL_ADJUSTMENTS = ("none", "adjusted", "balanced")
#: The critical values of the EL intervals: Wilks' ``χ²₁``, or ``F(1, m − 1)`` on the effective
#: size ``m`` of :func:`el_effective_size`.
EL_CALIBRATIONS = ("chi2", "f_effective")
#: Emerson & Owen's (2009) recommended scale ``s`` of the balanced augmentation.
BALANCED_EL_SCALE = 1.9
#: The levels ``[low, high)`` of a row's effective number of documents ``m_eff``
#: (:func:`el_effective_size`) of :data:`CONCENTRATION_COVERAGE`.
CONCENTRATION_LEVELS: tuple[tuple[float, float], ...] = (
    (1.0, 2.0),
    (2.0, 3.0),
    (3.0, 5.0),
    (5.0, 7.0),
    (7.0, 10.0),
    (10.0, 15.0),
    (15.0, 20.0),
    (20.0, 30.0),
    (30.0, 40.0),
    (40.0, 60.0),
    (60.0, 80.0),
    (80.0, 120.0),
    (120.0, float("inf")),
)
#: Calibrated coverage of each method's 95 % energy-ratio (haar) interval per
#: :data:`CONCENTRATION_LEVELS` level of ``m_eff``: of the laws measured there, the coverage
#: farthest from 0.95 (a row's document law is not known, so its level is judged by the worst one
#: measured). The laws: ``anistat calibrate``'s six scenarios pooled
#: (``benchmarks/bench_ratio_intervals.py --studies 200``, seeds 0–3, ``--pool``: 28 800 studies at
#: 30, 60 and 200 documents), and each heavier law of ``HEAVIER_SCENARIOS`` alone (a t₃ scale
#: mixture, 102 000 studies; 5 % of documents at 20× the energy, 135 000 studies:
#: ``bench_ratio_intervals.py --coverage``, at 10, 30, 60 and 200 documents, benchmarks/README.md;
#: a law counts at a level with at least 200 studies there); the random proxy and a planted ratio
#: of 1. :data:`CONCENTRATION_STUDIES` and :data:`CONCENTRATION_LAWS` say which cell each value is.
CONCENTRATION_COVERAGE: dict[str, tuple[float, ...]] = {
    STUDENTIZED_LOG: (0.615, 0.862, 0.912, 0.927, 0.924, 0.918, 0.913, 0.895, 0.903, 0.892, 0.946, 0.944, 0.925),
    vocab.BCA_LOG: (0.904, 0.886, 0.843, 0.856, 0.872, 0.881, 0.881, 0.866, 0.884, 0.872, 0.945, 0.936, 0.921),
    vocab.VARIANCE_STABILISED: (
        0.281,
        0.487,
        0.553,
        0.791,
        0.840,
        0.863,
        0.871,
        0.860,
        0.883,
        0.874,
        0.942,
        0.938,
        0.921,
    ),
    vocab.EL: (0.460, 0.674, 0.760, 0.845, 0.879, 0.894, 0.888, 0.872, 0.890, 0.882, 0.946, 0.943, 0.925),
    vocab.ADJUSTED_EL: (0.706, 0.753, 0.798, 0.876, 0.892, 0.899, 0.894, 0.877, 0.896, 0.882, 0.946, 0.947, 0.925),
    vocab.BALANCED_EL: (1.000, 0.992, 0.892, 0.915, 0.908, 0.904, 0.897, 0.879, 0.895, 0.884, 0.946, 0.945, 0.925),
    vocab.ADJUSTED_EL_F: (1.000, 1.000, 0.992, 0.980, 0.943, 0.931, 0.916, 0.897, 0.908, 0.898, 0.949, 0.950, 0.930),
}
#: The studies behind each level of :data:`CONCENTRATION_COVERAGE`.
CONCENTRATION_STUDIES: dict[str, tuple[int, ...]] = {
    STUDENTIZED_LOG: (602, 737, 2715, 22624, 29949, 13511, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.BCA_LOG: (602, 737, 2715, 22624, 29949, 13511, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.VARIANCE_STABILISED: (602, 737, 13530, 22624, 29949, 33823, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.EL: (602, 737, 22435, 18532, 29949, 33823, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.ADJUSTED_EL: (602, 737, 2715, 2742, 29949, 33823, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.BALANCED_EL: (2429, 2670, 13530, 22624, 29949, 33823, 17744, 10013, 1627, 508, 1239, 1440, 214),
    vocab.ADJUSTED_EL_F: (602, 737, 22435, 18532, 29949, 33823, 17744, 10013, 1627, 508, 1239, 1440, 214),
}
#: The law each level of :data:`CONCENTRATION_COVERAGE` was measured under ("six laws": pooled).
CONCENTRATION_LAWS: dict[str, tuple[str, ...]] = {
    STUDENTIZED_LOG: (
        "six laws",
        "six laws",
        "six laws",
        "two_point",
        "two_point",
        "t3",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.BCA_LOG: (
        "six laws",
        "six laws",
        "six laws",
        "two_point",
        "two_point",
        "t3",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.VARIANCE_STABILISED: (
        "six laws",
        "six laws",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.EL: (
        "six laws",
        "six laws",
        "t3",
        "t3",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.ADJUSTED_EL: (
        "six laws",
        "six laws",
        "six laws",
        "six laws",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.BALANCED_EL: (
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
    vocab.ADJUSTED_EL_F: (
        "six laws",
        "six laws",
        "t3",
        "t3",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "two_point",
        "six laws",
        "six laws",
        "six laws",
    ),
}
#: The levels ``[low, high)`` of a row's energy spread ``n/n_eff = 1 + cv_t²`` (its documents'
#: total energies' mean square over their squared mean, ``n`` = ``n_clusters``) of
#: :data:`SPREAD_DATA_TEST`.
SPREAD_LEVELS: tuple[tuple[float, float], ...] = (
    (1.0, 1.5),
    (1.5, 1.75),
    (1.75, 2.0),
    (2.0, 2.5),
    (2.5, 3.0),
    (3.0, 3.5),
    (3.5, 4.0),
    (4.0, 5.0),
    (5.0, 6.0),
    (6.0, 8.0),
    (8.0, 12.0),
    (12.0, float("inf")),
)
#: The data test's rejection rate at α = 0.05 and a planted ratio of 1 per :data:`SPREAD_LEVELS`
#: level (the runs of :data:`CONCENTRATION_COVERAGE`, the 14 400 studies at ratio 1;
#: :data:`SPREAD_DATA_TEST_STUDIES` per level). The bootstrap-t's level follows how heavy-tailed
#: the document energies are, not how many effective documents there are: within 1–3 it is
#: 0.023–0.052 at every size, from 3 up 0.069–0.129 at every size.
SPREAD_DATA_TEST: tuple[float, ...] = (
    0.052,
    0.049,
    0.032,
    0.023,
    0.038,
    0.076,
    0.077,
    0.073,
    0.077,
    0.069,
    0.091,
    0.129,
)
#: The studies behind each level of :data:`SPREAD_DATA_TEST`.
SPREAD_DATA_TEST_STUDIES: tuple[int, ...] = (2793, 3296, 1265, 1034, 783, 608, 431, 643, 494, 664, 836, 1553)
#: The bands: coverage below 0.93 (undercoverage; over-coverage is conservative) and a data-test
#: level above 0.06 (liberal) are what the diagnostic warns about, where a level lies beyond its
#: band by more than its Monte-Carlo margin (1.96 binomial SEs at the nominal 0.95 or 0.05).
COVERAGE_FLOOR, DATA_TEST_CEILING = 0.93, 0.06
#: Coverage above this (beyond its margin) is flagged too: the interval is then wider than its
#: level says (often the parameter's whole range), which a reader of the interval should know.
COVERAGE_CEILING = 0.97
#: The EL interval methods of :func:`ratio_interval`: (adjustment, calibration).
_EL_METHODS = {
    vocab.EL: ("none", "chi2"),
    vocab.ADJUSTED_EL: ("adjusted", "chi2"),
    vocab.BALANCED_EL: ("balanced", "chi2"),
    vocab.ADJUSTED_EL_F: ("adjusted", "f_effective"),
}


@dataclass(frozen=True, kw_only=True)
class RatioInterval:
    """A confidence interval for a ratio of means.

    Attributes
    ----------
    estimate : float
        ``θ̂ = Σp/Σe``.
    ci_low : float
        Lower end (NaN when undefined).
    ci_high : float
        Upper end (``inf`` where the method cannot bound it; NaN when undefined).
    method : str
        One of :data:`RATIO_INTERVAL_METHODS`.
    note : str
        Empty, or what limited the interval.
    fallback : str
        Empty, or the codes of :mod:`anistat.stats.fallbacks` the note describes.

    Examples
    --------
    >>> from anistat import stats
    >>> r = stats.RatioInterval(estimate=2.0, ci_low=1.5, ci_high=2.8, method='el')
    >>> r.ci_low < r.estimate < r.ci_high
    True
    """

    estimate: float
    ci_low: float
    ci_high: float
    method: str
    note: str = ""
    fallback: str = ""


def empirical_likelihood_statistic(z: ArrayLike) -> float:
    """``−2 ln R`` of the hypothesis ``E z = 0`` for one-dimensional data (Owen 2001, ch. 2).

    ``R = max{Π n w_i : w_i ≥ 0, Σ w_i = 1, Σ w_i z_i = 0} = Π 1/(1 + λ z_i)`` with ``λ`` the root
    of ``Σ z_i/(1 + λ z_i) = 0`` on ``(−1/max z, −1/min z)``, where every ``1 + λ z_i > 0``
    (found by safeguarded Newton, :func:`_el_multiplier`); ``inf`` when 0 is not strictly inside
    ``(min z, max z)``.

    Parameters
    ----------
    z : array_like of shape (n,)
        The values whose mean is hypothesised to be 0.

    Returns
    -------
    float
        ``2 Σ ln(1 + λ z_i)`` (0 when ``mean(z) = 0``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> z = np.array([-1.0, 0.5, 2.0, 1.5])
    >>> round(stats.empirical_likelihood_statistic(z), 4)
    1.5764
    >>> stats.empirical_likelihood_statistic(np.array([1.0, 2.0]))
    inf
    """
    z = np.asarray(z, dtype=np.float64).ravel()
    low, high = float(z.min()), float(z.max())
    if not (low < 0.0 < high):
        return float("inf")
    if float(z.mean()) == 0.0:
        return 0.0
    return _el_multiplier(z)[1]


def _el_multiplier(z: np.ndarray, start: float = 0.0) -> tuple[float, float]:
    """``(λ, −2 ln R)`` for ``E z = 0`` with ``min z < 0 < max z``: the root ``λ`` of the score
    ``f(λ) = Σ z_i/(1 + λ z_i)`` by Newton's method, ``λ ← λ − f/f'`` with
    ``f' = −Σ z_i²/(1 + λ z_i)²``, started from ``start`` (e.g. the previous θ's ``λ``) and kept
    inside the bracket ``(−1/max z, −1/min z)`` (``f`` decreases from +∞ to −∞ there), bisecting
    whenever a step would leave the bracket that the signs of ``f`` have narrowed (a start outside
    the bracket starts from 0). Stops after a step that changes every ``1 + λ z_i`` by less than
    a relative 1e-8 (Newton's error after it is of the order of its square, ~1e-16). ``−2 ln R``
    is stationary in ``λ`` (``∂/∂λ Σ ln(1 + λ z_i) = f(λ) = 0``), so an error ``δλ`` moves it by
    ``O(δλ²)`` only."""
    scale = max(-float(z.min()), float(z.max()))
    zs = z / scale  # λ is scale-free after this, so the bracket is well conditioned
    shrink = 1.0 - 1e-12
    low, high = -shrink / float(zs.max()), -shrink / float(zs.min())
    lam = start * scale if low < start * scale < high else 0.0
    for _ in range(200):
        weighted = zs / (1.0 + lam * zs)
        score = float(weighted.sum())
        if score > 0.0:
            low = lam
        else:
            high = lam
        step = score / float(weighted @ weighted)  # Newton: λ − f/f' = λ + step
        # converged: the step moves every 1 + λ z_i by less than a relative 1e-8, so the error left
        # after it is ~1e-16 (a step that is small only because λ sits next to a pole −1/z_i moves
        # that 1 + λ z_i by a lot); max|w_i| ≥ 1/(1 + |λ|) (|z_i| = 1 for one i), so the test
        # can only pass when |step| ≤ 1e-8·(1 + |λ|)
        if abs(step) <= 1e-8 * (1.0 + abs(lam)) and abs(step) * float(np.abs(weighted).max()) <= 1e-8:
            lam += step
            break
        lam = lam + step if low < lam + step < high else 0.5 * (low + high)  # NaN: bisect
    return lam / scale, float(2.0 * np.sum(np.log1p(lam * zs)))


def _augmented(z: np.ndarray, adjustment: str) -> np.ndarray:
    """The estimating-function values with the adjustment's pseudo-units appended."""
    n, mean = z.size, float(z.mean())
    if adjustment == "adjusted":
        return np.append(z, -max(1.0, np.log(n) / 2.0) * mean)
    if adjustment == "balanced":
        shift = BALANCED_EL_SCALE * float(z.std(ddof=1)) * float(np.sign(mean))
        return np.append(z, [-shift, 2.0 * mean + shift])
    return z


def ratio_el_statistic(
    numerator: ArrayLike, denominator: ArrayLike, theta: float, adjustment: str = "adjusted"
) -> float:
    """``−2 ln R(θ)`` of the ratio of means ``E[p]/E[e] = θ``, from ``z_u = p_u − θ e_u``.

    Parameters
    ----------
    numerator : array_like of shape (n,)
        ``p_u`` per unit.
    denominator : array_like of shape (n,)
        ``e_u`` per unit.
    theta : float
        The hypothesised ratio.
    adjustment : {"none", "adjusted", "balanced"}, default "adjusted"
        Plain EL, Chen et al.'s (2008) adjusted EL or Emerson & Owen's (2009) balanced augmented
        EL (module docstring).

    Returns
    -------
    float
        The statistic (χ²₁ under the hypothesis, asymptotically; ``inf`` where plain EL is 0).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> p, e = np.array([1.0, 2.0, 4.0, 3.0]), np.array([1.0, 1.0, 2.0, 2.0])
    >>> stats.ratio_el_statistic(p, e, p.sum() / e.sum())
    0.0
    >>> round(stats.ratio_el_statistic(p, e, 1.6, 'none'), 4), round(stats.ratio_el_statistic(p, e, 1.6), 4)
    (0.1392, 0.0771)
    """
    check_choice("adjustment", adjustment, EL_ADJUSTMENTS)
    p = np.asarray(numerator, dtype=np.float64).ravel()
    e = np.asarray(denominator, dtype=np.float64).ravel()
    z = (p - float(theta) * e) / float(np.mean(e))
    if abs(float(z.mean())) <= 1e-14 * float(np.abs(z).max(initial=0.0)):
        return 0.0
    return empirical_likelihood_statistic(_augmented(z, adjustment))


class _RatioElCurve:
    """``ln θ ↦ (−2 ln R(θ), d(−2 ln R)/d ln θ)`` of :func:`ratio_el_statistic` along a root search.

    The value is :func:`ratio_el_statistic`'s (the same ``z(θ)`` and :func:`_augmented`), with ``λ``
    warm-started from the previous θ on the same side of ``θ̂`` (:func:`_el_multiplier`). The slope
    is the envelope theorem's: with ``λ`` optimal, ``d/dθ 2 Σ ln(1 + λ z_i(θ)) =
    2 λ Σ z_i'(θ)/(1 + λ z_i(θ))``, where ``z_i' = −e_i/ē`` for the units and the pseudo-units'
    ``z_i'`` is a forward difference of :func:`_augmented` (a relative step of 1e-7 in θ); the
    slope only steers the search, the ends are roots of the value.
    """

    def __init__(self, p: np.ndarray, e: np.ndarray, adjustment: str) -> None:
        self.p, self.e, self.adjustment = p, e, adjustment
        self.mean_e = float(np.mean(e))
        self._last: tuple[float, float] | None = None  # (sign of z̄, λ) of the previous θ

    def _z(self, theta: float) -> np.ndarray:
        return _augmented((self.p - theta * self.e) / self.mean_e, self.adjustment)

    def __call__(self, log_theta: float) -> tuple[float, float]:
        theta = float(np.exp(log_theta))
        z = (self.p - theta * self.e) / self.mean_e
        mean = float(z.mean())
        if abs(mean) <= 1e-14 * float(np.abs(z).max(initial=0.0)):
            return 0.0, 0.0
        z = _augmented(z, self.adjustment)
        if not float(z.min()) < 0.0 < float(z.max()):
            return float("inf"), float("nan")
        side = float(np.sign(mean))
        start = self._last[1] if self._last is not None and self._last[0] == side else 0.0
        lam, value = _el_multiplier(z, start)
        self._last = (side, lam)
        step = 1e-7 * theta
        slope_z = (self._z(theta + step) - z) / step
        slope = 2.0 * lam * float(np.sum(slope_z / (1.0 + lam * z)))
        return value, theta * slope


def _schedule(first_step: float) -> list[float]:
    """The offsets ``ln s, ln s², ln s⁴, …`` in ``ln θ`` from ``θ̂`` (``s = first_step``, at least
    ``1 + 1e-6``, up to the last power ≤ 1e12 or 64 squarings): the points an end is bracketed on."""
    step, offsets = max(float(first_step), 1.0 + 1e-6), []
    for _ in range(64):
        offsets.append(float(np.log(step)))
        step = step * step
        if step > 1e12:
            break
    return offsets


def _el_end(
    stat: Callable[[float], tuple[float, float]],
    estimate: float,
    critical: float,
    upward: bool,
    limit: float,
    first_step: float,
) -> tuple[float, bool]:
    """The θ beyond ``estimate`` where ``−2 ln R(θ)`` first reaches ``critical``, or ``(limit,
    False)`` when it does not by the last bracketing point.

    Safeguarded Newton in ``x = ±ln(θ/θ̂)`` (``stat``: :class:`_RatioElCurve`) on the signed root
    ``h(x) = √(−2 ln R) − √critical``, nearly linear in ``x`` (Wilks: ``−2 ln R ≈ x²/se²``). It
    starts at the Wald end ``x = ln s`` (``s = first_step``) and never passes the next point of the
    bracketing schedule ``ln s, ln s², ln s⁴, …`` (:func:`_schedule`) before evaluating it, so it
    finds the crossing that stepping through the schedule and bisecting the first bracket would
    find (the statistics are bounded in θ and need not be monotone: a crossing is searched from
    ``θ̂`` outwards). Inside a bracket ``h(lo) < 0 ≤ h(hi)`` a Newton step that leaves it is
    replaced by bisection. Stops after a Newton step below 1e-9 in ``ln θ`` (the error left after
    it is of the order of its square times ``h''/h'``, ~1e-18; the slope's forward difference adds
    ~1e-9 of the step) or a bracket narrower than 1e-13: the ends are good to about 1e-13
    relative, far below the ten significant digits results.csv keeps, and agree to 1e-12 with a
    bisection (to 1e-15) from a dense θ grid on skewed data (tests/stats/test_ratio_intervals.py). The
    former search (squaring steps, then Brent to ``xtol = 1e-10·θ̂``, λ by Brent at every θ) took
    16–19 evaluations per interval; this one about 6.
    """
    sign = 1.0 if upward else -1.0
    origin, target = float(np.log(estimate)), float(np.sqrt(critical))
    offsets = _schedule(first_step)
    low, high, x = 0.0, np.inf, offsets[0]
    for _ in range(200):
        value, slope = stat(origin + sign * x)
        value = max(value, 0.0)  # −2 ln R ≥ 0 (a last-digit negative near θ̂)
        h = float(np.sqrt(value)) - target if value < np.inf else np.inf
        if h >= 0.0:
            high = x
        else:
            low = x
        if h == 0.0:
            break
        slope_h = sign * slope / (2.0 * np.sqrt(value)) if 0.0 < value < np.inf else np.nan
        proposal = x - h / slope_h if np.isfinite(slope_h) and slope_h > 0.0 else np.nan
        if abs(proposal - x) <= 1e-9 and low <= proposal <= high:  # Newton's error after it: O(1e-18)
            x = proposal
            break
        if high < np.inf:
            if not low < proposal < high:  # NaN included
                proposal = 0.5 * (low + high)
                if high - low <= 1e-13:
                    x = proposal
                    break
        else:
            ahead = [o for o in offsets if o > low]
            if not ahead:
                return limit, False
            if not low < proposal <= ahead[0]:  # NaN included: the next bracketing point
                proposal = ahead[0]
        x = proposal
    return float(np.exp(origin + sign * x)), True


def el_effective_size(numerator: ArrayLike, denominator: ArrayLike) -> float:
    """The effective number of units ``m`` of the F-calibrated EL interval (``adjusted_el_f``).

    ``m = min(n_eff, n_z)``: Kish's effective size of the denominators ``n_eff = (Σe)²/Σe²``
    (:func:`kish_effective_size`) and the tail-weight size of the estimating function at the
    estimate ``θ̂ = Σp/Σe``, ``n_z = min(n, 3(Σz²)²/Σz⁴)`` with ``z_u = p_u − θ̂ e_u``, which is
    ``3n/κ̂`` for the sample kurtosis ``κ̂ = n Σz⁴/(Σz²)²`` (normal data: ``κ = 3``, ``n_z ≈ n``).
    ``n_eff`` falls when a few units hold the denominator's mass, ``n_z`` when a few hold the
    numerator's departures from the ratio (a minority of units with another ratio).

    Parameters
    ----------
    numerator : array_like of shape (n,)
        ``p_u`` per unit.
    denominator : array_like of shape (n,)
        ``e_u`` per unit (positive sum).

    Returns
    -------
    float
        ``m`` in ``[1, n]`` (``n`` when every ``z_u`` is 0; NaN when the denominators sum to 0).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> e = np.ones(8)
    >>> stats.el_effective_size(2.0 * e, e)  # every unit at the ratio: z = 0
    8.0
    >>> # one unit off the ratio: z = (7, −1, …, −1), n_z = 3·56²/2408
    >>> round(stats.el_effective_size([9.0, 1, 1, 1, 1, 1, 1, 1], e), 3)
    3.907
    """
    p = np.asarray(numerator, dtype=np.float64).ravel()
    e = np.asarray(denominator, dtype=np.float64).ravel()
    n_eff = kish_effective_size(e)
    if not np.isfinite(n_eff):
        return float("nan")
    z = p - p.sum() / e.sum() * e
    z = z / max(float(np.abs(z).max()), 1e-300)  # scale-free, and no overflow in z⁴
    fourth = float(np.sum(z**4))
    n_z = min(float(p.size), 3.0 * float(np.sum(z * z)) ** 2 / fourth) if fourth > 1e-280 else float(p.size)
    return float(max(1.0, min(n_eff, n_z)))


def el_critical_value(ci_level: float, calibration: str = "chi2", effective_size: float = np.inf) -> float:
    """The critical value of an EL interval at ``ci_level``: ``χ²₁(ci_level)`` or ``F(1, m − 1)``.

    Parameters
    ----------
    ci_level : float
        Coverage of the interval.
    calibration : {"chi2", "f_effective"}, default "chi2"
        Wilks' ``χ²₁`` or the F calibration on the effective size ``m`` (Owen 2001 §3.5 with
        ``n`` replaced by ``m``, :func:`el_effective_size`).
    effective_size : float, default inf
        ``m``; ``F(1, m − 1) → χ²₁`` as ``m → ∞``.

    Returns
    -------
    float
        The quantile (``inf`` for ``m ≤ 1``, where the interval is the parameter's range).

    Examples
    --------
    >>> from anistat import stats
    >>> round(stats.el_critical_value(0.95), 3), round(stats.el_critical_value(0.95, 'f_effective', 11.0), 3)
    (3.841, 4.965)
    """
    check_ci_level(ci_level)
    check_choice("calibration", calibration, EL_CALIBRATIONS)
    if calibration == "chi2" or not np.isfinite(effective_size):
        return float(chi2.ppf(ci_level, 1))
    if not effective_size > 1.0:
        return float("inf")
    return float(f_distribution.ppf(ci_level, 1, effective_size - 1.0))


def ratio_el_interval(
    numerator: ArrayLike,
    denominator: ArrayLike,
    ci_level: float = 0.95,
    adjustment: str = "adjusted",
    calibration: str = "chi2",
) -> RatioInterval:
    """Empirical-likelihood interval ``{θ : −2 ln R(θ) ≤ c}`` for ``E[p]/E[e]``, ``c`` the
    calibration's critical value (:func:`el_critical_value`).

    Parameters
    ----------
    numerator : array_like of shape (n,)
        ``p_u`` per unit (non-negative).
    denominator : array_like of shape (n,)
        ``e_u`` per unit (positive sum).
    ci_level : float, default 0.95
        Coverage of the interval.
    adjustment : {"none", "adjusted", "balanced"}, default "adjusted"
        Plain, adjusted (Chen et al. 2008) or balanced augmented (Emerson & Owen 2009) EL.
    calibration : {"chi2", "f_effective"}, default "chi2"
        ``χ²₁(ci_level)``, or ``F(1, m − 1)`` with ``m`` of :func:`el_effective_size`.

    Returns
    -------
    RatioInterval
        The interval (an end the statistic never reaches is 0 or ``inf``, with a note).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> e = rng.uniform(1, 2, 40)
    >>> p = 2 * e * rng.uniform(0.5, 1.5, 40)
    >>> r = stats.ratio_el_interval(p, e, 0.95, 'none')
    >>> r.ci_low < r.estimate < r.ci_high, r.method
    (True, 'el')
    >>> f = stats.ratio_el_interval(p, e, 0.95, 'adjusted', 'f_effective')
    >>> a = stats.ratio_el_interval(p, e, 0.95, 'adjusted')
    >>> f.method, f.ci_low < a.ci_low < a.ci_high < f.ci_high
    ('adjusted_el_f', True)
    """
    check_ci_level(ci_level)
    check_choice("adjustment", adjustment, EL_ADJUSTMENTS)
    check_choice("calibration", calibration, EL_CALIBRATIONS)
    method = {v: k for k, v in _EL_METHODS.items()}.get((adjustment, calibration), f"{adjustment}_el_{calibration}")
    p = np.asarray(numerator, dtype=np.float64).ravel()
    e = np.asarray(denominator, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(p.sum() / e.sum())
    if not (np.isfinite(estimate) and estimate > 0 and p.size >= 2):
        return RatioInterval(
            estimate=estimate,
            ci_low=np.nan,
            ci_high=np.nan,
            method=method,
            note="no interval: the ratio is not finite and positive",
            fallback=NO_INTERVAL,
        )
    effective = el_effective_size(p, e) if calibration != "chi2" else np.inf
    critical = el_critical_value(ci_level, calibration, effective)

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # the Wald end (log scale): the first step
        first = float(np.exp(np.sqrt(critical) * ratio_se(np.ones((1, p.size)), p, e)[0] / estimate))
    first = first if np.isfinite(first) else 1.0 + 1e-3
    curve = _RatioElCurve(p, e, adjustment)
    low, low_found = _el_end(curve, estimate, critical, upward=False, limit=0.0, first_step=first)
    high, high_found = _el_end(curve, estimate, critical, upward=True, limit=np.inf, first_step=first)
    unbounded = [side for side, found in (("lower", low_found), ("upper", high_found)) if not found]
    note = ""
    if unbounded:
        quantile = "χ²" if calibration == "chi2" else f"F(1, {effective - 1:.3g})"
        note = f"the EL statistic stays below the {quantile} quantile {critical:.3g}: {' and '.join(unbounded)} end unbounded"
    return RatioInterval(
        estimate=estimate,
        ci_low=low,
        ci_high=high,
        method=method,
        note=note,
        fallback=CI_UNBOUNDED if unbounded else "",
    )


_Map = Callable[[ArrayLike], np.ndarray]


def _stabilising_map(replicates: np.ndarray, replicate_se: np.ndarray) -> tuple[_Map, _Map, float] | None:
    """``(g, g⁻¹, β)`` of the power-law fit ``se = c θ^β`` (module docstring), or None."""
    ok = np.isfinite(replicates) & np.isfinite(replicate_se) & (replicates > 0) & (replicate_se > 0)
    if ok.sum() < 3 or np.ptp(np.log(replicates[ok])) == 0:
        return None
    beta, log_c = np.polyfit(np.log(replicates[ok]), np.log(replicate_se[ok]), 1)
    c = float(np.exp(log_c))
    if abs(1.0 - beta) < 1e-6:
        return (lambda x: np.log(x) / c), (lambda y: np.exp(c * np.asarray(y, dtype=np.float64))), float(beta)
    power = 1.0 - beta

    def inverse(y: ArrayLike) -> np.ndarray:
        base = c * power * np.asarray(y, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(base > 0, base ** (1.0 / power), 0.0 if power > 0 else np.inf)
        return out

    with np.errstate(invalid="ignore", divide="ignore"):
        return (lambda x: np.asarray(x, dtype=np.float64) ** power / (c * power)), inverse, float(beta)


def _variance_stabilised(
    estimate: float, replicates: np.ndarray, replicate_se: np.ndarray, levels: np.ndarray
) -> RatioInterval:
    fitted = _stabilising_map(replicates, replicate_se)
    if fitted is None:
        return RatioInterval(
            estimate=estimate,
            ci_low=np.nan,
            ci_high=np.nan,
            method=vocab.VARIANCE_STABILISED,
            note="no interval: SE fit undefined",
            fallback=NO_INTERVAL,
        )
    g, g_inverse, beta = fitted
    with np.errstate(invalid="ignore", divide="ignore"):
        pivots = g(replicates) - g(estimate)
    pivots = pivots[np.isfinite(pivots)]
    q_low, q_high = np.quantile(pivots, levels)
    centre = float(g(estimate))
    low, high = (float(g_inverse(centre - q)) for q in (q_high, q_low))
    return RatioInterval(
        estimate=estimate, ci_low=low, ci_high=high, method=vocab.VARIANCE_STABILISED, note=f"se ∝ θ^{beta:.2f}"
    )


def _studentized_log(
    p: np.ndarray,
    e: np.ndarray,
    w: np.ndarray,
    estimate: float,
    replicates: np.ndarray,
    ci_level: float,
    expand_units: int | None,
) -> RatioInterval:
    r = ci_from_replicates(
        estimate,
        replicates,
        method=vocab.STUDENTIZED,
        se=float(ratio_se(np.ones((1, p.size)), p, e)[0]),
        replicate_se=ratio_se(w, p, e),
        log_scale=True,
        expand_units=expand_units,
    )
    return RatioInterval(
        estimate=estimate, ci_low=r.ci_low, ci_high=r.ci_high, method=STUDENTIZED_LOG, note=r.note, fallback=r.fallback
    )


def leave_one_out_ratios(numerator: ArrayLike, denominator: ArrayLike) -> np.ndarray:
    """The jackknife replicates ``θ_(i) = (Σp − p_i)/(Σe − e_i)`` of a ratio of sums from the
    leave-one-out sums: O(n) memory, where the matrix form ``((1 − I) p)/((1 − I) e)`` holds an
    ``n × n`` matrix (4.6 GB at 24,000 units); the two agree to rounding (~1e-15 relative).

    Examples
    --------
    >>> from anistat.stats.ratio_intervals import leave_one_out_ratios
    >>> leave_one_out_ratios([1.0, 2.0, 3.0], [1.0, 1.0, 2.0]).tolist()
    [1.6666666666666667, 1.3333333333333333, 1.5]
    """
    p = np.asarray(numerator, dtype=np.float64).ravel()
    e = np.asarray(denominator, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", divide="ignore"):
        return (p.sum() - p) / (e.sum() - e)


def _bca_log(
    p: np.ndarray,
    e: np.ndarray,
    w: np.ndarray,
    estimate: float,
    replicates: np.ndarray,
    ci_level: float,
    expand_units: int | None,
) -> RatioInterval:
    with np.errstate(invalid="ignore", divide="ignore"):
        jack = np.log(leave_one_out_ratios(p, e))
        r = ci_from_replicates(
            np.log(estimate), np.log(replicates), jack, ci_level, vocab.BCA, expand_units=expand_units
        )
    return RatioInterval(
        estimate=estimate,
        ci_low=float(np.exp(r.ci_low)),
        ci_high=float(np.exp(r.ci_high)),
        method=vocab.BCA_LOG,
        note=r.note,
        fallback=r.fallback,
    )


def _tail_stabilised(
    p: np.ndarray,
    e: np.ndarray,
    w: np.ndarray,
    estimate: float,
    replicates: np.ndarray,
    ci_level: float,
    expand_units: int | None,
) -> RatioInterval:
    tail = expanded_tail((1.0 - ci_level) / 2.0, expand_units) if expand_units else (1.0 - ci_level) / 2.0
    return _variance_stabilised(estimate, replicates, ratio_se(w, p, e), np.array([tail, 1.0 - tail]))


#: The bootstrap interval methods of :func:`ratio_interval`: ``(p, e, W, θ̂, θ*, level,
#: expand_units) -> RatioInterval``.
_BOOTSTRAP_INTERVALS: dict[str, Callable[..., RatioInterval]] = {
    STUDENTIZED_LOG: _studentized_log,
    vocab.BCA_LOG: _bca_log,
    vocab.VARIANCE_STABILISED: _tail_stabilised,
}
#: The interval methods of :func:`ratio_interval`, bootstrap ones first.
RATIO_INTERVAL_METHODS: tuple[str, ...] = (*_BOOTSTRAP_INTERVALS, *_EL_METHODS)
#: The methods that need bootstrap weights.
BOOTSTRAP_RATIO_METHODS: tuple[str, ...] = tuple(_BOOTSTRAP_INTERVALS)


def ratio_interval(
    numerator: ArrayLike,
    denominator: ArrayLike,
    method: str,
    weights: ArrayLike | None = None,
    ci_level: float = 0.95,
    expand_units: int | None = None,
) -> RatioInterval:
    """A confidence interval for ``E[p]/E[e]`` by one of :data:`RATIO_INTERVAL_METHODS`.

    Parameters
    ----------
    numerator : array_like of shape (n,)
        ``p_u`` per resampling unit (non-negative).
    denominator : array_like of shape (n,)
        ``e_u`` per resampling unit (positive sum).
    method : {"studentized_log", "bca_log", "variance_stabilised", "el", "adjusted_el", "balanced_el", \
"adjusted_el_f"}
        One of :data:`RATIO_INTERVAL_METHODS` (module docstring): the bootstrap intervals
        ``studentized_log`` (the analysis' ``studentized``), ``bca_log`` and
        ``variance_stabilised``, which need ``weights``, and the empirical-likelihood intervals
        ``el``, ``adjusted_el``, ``balanced_el`` and ``adjusted_el_f`` — the analysis' default
        (:data:`anistat.vocabulary.DEFAULT_CI_METHOD`).
    weights : array_like of shape (B, n), optional
        Bootstrap multiplicities; required by the bootstrap methods.
    ci_level : float, default 0.95
        Coverage of the interval.
    expand_units : int, optional
        Bootstrap methods: expand the tails for this many units (:func:`expanded_tail`).

    Returns
    -------
    RatioInterval
        The interval and what limited it.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(1)
    >>> e = rng.lognormal(0, 1, 50)
    >>> p = 0.5 * e * rng.uniform(0.5, 1.5, 50)
    >>> w = stats.bootstrap_weights(50, 400, seed=3)
    >>> ends = {m: stats.ratio_interval(p, e, m, w) for m in stats.RATIO_INTERVAL_METHODS}
    >>> all(r.ci_low < r.estimate < r.ci_high for r in ends.values())
    True
    """
    check_choice("method", method, RATIO_INTERVAL_METHODS)
    check_ci_level(ci_level)
    if method in _EL_METHODS:
        return ratio_el_interval(numerator, denominator, ci_level, *_EL_METHODS[method])
    if weights is None:
        raise ValueError(f"method={method!r} needs bootstrap weights")
    p = np.asarray(numerator, dtype=np.float64).ravel()
    e = np.asarray(denominator, dtype=np.float64).ravel()
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(p.sum() / e.sum())
        replicates = (w @ p) / (w @ e)
    if not (np.isfinite(estimate) and estimate > 0):
        return RatioInterval(
            estimate=estimate,
            ci_low=np.nan,
            ci_high=np.nan,
            method=method,
            note="no interval: the ratio is not finite and positive",
            fallback=NO_INTERVAL,
        )
    return _BOOTSTRAP_INTERVALS[method](p, e, w, estimate, replicates, ci_level, expand_units)


def _margin(nominal: float, studies: int) -> float:
    """The 95 % Monte-Carlo margin ``1.96·√(c(1 − c)/n)`` of a rate measured over ``n`` studies."""
    return 1.96 * float(np.sqrt(nominal * (1.0 - nominal) / max(int(studies), 1)))


def data_test_spread_threshold(
    levels: Sequence[tuple[float, float]], rates: Sequence[float], studies: Sequence[int], alpha: float = 0.05
) -> float:
    """The energy spread from which the data test counts as liberal: the lowest lower edge ``c``
    such that every level from ``c`` up rejects more than :data:`DATA_TEST_CEILING` and all of
    them pooled exceed it by more than their Monte-Carlo margin ``1.96·√(α(1 − α)/n)``
    (``inf``: none). Pooling the tail is what makes the rule decisive where each level alone
    has a few hundred studies: from spread 3 the levels reject 0.069–0.129, none of the lower
    ones more than 0.052.

    Examples
    --------
    >>> from anistat.stats.ratio_intervals import data_test_spread_threshold
    >>> data_test_spread_threshold([(1, 2), (2, 3), (3, float("inf"))], [0.05, 0.07, 0.12], [1000, 1000, 1000])
    2.0
    >>> data_test_spread_threshold([(1, 2), (2, float("inf"))], [0.05, 0.05], [1000, 1000])
    inf
    """
    threshold = float("inf")
    for start in range(len(levels) - 1, -1, -1):
        tail_rates, tail_studies = rates[start:], studies[start:]
        n = float(sum(tail_studies))
        pooled = sum(r * k for r, k in zip(tail_rates, tail_studies, strict=True)) / n
        if min(tail_rates) <= DATA_TEST_CEILING or pooled <= DATA_TEST_CEILING + _margin(alpha, int(n)):
            break
        threshold = float(levels[start][0])
    return threshold


def calibrated_concentration(
    m_eff: float, method: str = vocab.DEFAULT_CI_METHOD, spread: float = float("nan")
) -> dict[str, float | bool | str] | None:
    """What `anistat calibrate` measured at a row's effective size ``m_eff`` (its interval's
    coverage) and energy spread ``n/n_eff`` (its data test's level).

    ``m_eff`` is the row's :func:`el_effective_size` (the results column ``m_eff``): the smaller
    of Kish's ``n_eff`` of the denominators and the estimating function's tail-weight size, so it
    falls both when few documents hold the energy and when few hold the proxy's departures from
    the ratio (the ``hot`` law, which ``n_eff`` alone misses). ``coverage`` is the calibrated
    coverage at its level (:data:`CONCENTRATION_COVERAGE`: the law farthest from 0.95 of those
    measured there, the heavier t₃ and two-point laws included), and ``coverage_off`` says whether
    it lies outside ``[COVERAGE_FLOOR, COVERAGE_CEILING]`` = [0.93, 0.97] by more than the level's
    Monte-Carlo margin ``1.96·√(0.95·0.05/n)`` (``n`` its :data:`CONCENTRATION_STUDIES`; the
    row's own level decides, :func:`coverage_off`); ``coverage_off_levels`` names every such level
    of the method. Measured for ``adjusted_el_f`` (the default): off at ``m_eff`` < 7 (over-covers,
    0.98–1.00: the interval is often the parameter's whole range) and at 15–60 (0.897–0.916 under
    the two-point law, 508–17 744 studies); at 7–15 it covers 0.931–0.943 under that law, the
    worst measured there. Every other method is off over a wider range.

    The data test's level follows the spread ``n/n_eff = 1 + cv_t²`` (``n`` the row's
    ``n_clusters``; how heavy-tailed the documents' energies are) rather than ``m_eff``: it is
    0.023–0.052 below 3 and 0.069–0.129 from 3 up, at every study size (:data:`SPREAD_DATA_TEST`);
    a row whose spread reaches :func:`data_test_spread_threshold` of that table is flagged.

    Parameters
    ----------
    m_eff : float
        The row's effective number of resampling units (:func:`el_effective_size`).
    method : str, default "adjusted_el_f"
        A key of :data:`CONCENTRATION_COVERAGE` (the analysis' ``studentized`` is
        ``studentized_log``).
    spread : float, optional
        The row's ``n_clusters / n_eff``; NaN (default): the data test is not judged.

    Returns
    -------
    dict or None
        ``m_eff_low``, ``m_eff_high`` (the level), ``coverage`` (calibrated there),
        ``coverage_off`` and ``coverage_off_levels``; ``spread_low``, ``spread_high``,
        ``data_test`` (measured at the spread's level; NaN without a spread), ``data_test_from``
        (the spread threshold) and ``data_test_off``; None for a non-finite ``m_eff`` or a
        method without calibration.

    Examples
    --------
    >>> from anistat import stats
    >>> level = stats.calibrated_concentration(2.5, spread=4.2)
    >>> level["m_eff_low"], level["coverage"], level["coverage_off"], level["data_test_off"]
    (2.0, 1.0, True, True)
    >>> level["data_test"], level["data_test_from"]
    (0.073, 3.0)
    >>> stats.calibrated_concentration(4.0)["coverage_off_levels"]
    'm_eff 1–7, 15–60'
    """
    value = float(m_eff)
    if not np.isfinite(value) or method not in CONCENTRATION_COVERAGE:
        return None
    coverage, studies = CONCENTRATION_COVERAGE[method], CONCENTRATION_STUDIES[method]
    data_test_from = data_test_spread_threshold(SPREAD_LEVELS, SPREAD_DATA_TEST, SPREAD_DATA_TEST_STUDIES)
    spread_value = max(float(spread), 1.0)  # n/n_eff ≥ 1 up to rounding; NaN stays NaN
    spread_level = next((i for i, (low, high) in enumerate(SPREAD_LEVELS) if low <= spread_value < high), None)
    nan = float("nan")
    for index, (low, high) in enumerate(CONCENTRATION_LEVELS):
        if low <= value < high:
            return {
                "m_eff_low": low,
                "m_eff_high": high,
                "coverage": coverage[index],
                "coverage_off": coverage_off(coverage[index], studies[index]),
                "coverage_off_levels": coverage_off_levels(method),
                "spread_low": SPREAD_LEVELS[spread_level][0] if spread_level is not None else nan,
                "spread_high": SPREAD_LEVELS[spread_level][1] if spread_level is not None else nan,
                "data_test": SPREAD_DATA_TEST[spread_level] if spread_level is not None else nan,
                "data_test_from": data_test_from,
                "data_test_off": bool(np.isfinite(spread_value) and spread_value >= data_test_from),
            }
    return None


def coverage_off(coverage: float, studies: int) -> bool:
    """A measured 95 % coverage outside ``[COVERAGE_FLOOR, COVERAGE_CEILING]`` by more than its
    Monte-Carlo margin ``1.96·√(0.95·0.05/n)``."""
    margin = _margin(0.95, studies)
    return bool(coverage < COVERAGE_FLOOR - margin or coverage > COVERAGE_CEILING + margin)


def coverage_off_levels(method: str = "adjusted_el_f") -> str:
    """The ``m_eff`` levels where ``method``'s calibrated coverage is off (:func:`coverage_off`),
    adjacent levels joined: "m_eff 1–3, 20–30"; "" when none is."""
    spans: list[list[float]] = []
    for (low, high), value, n in zip(
        CONCENTRATION_LEVELS, CONCENTRATION_COVERAGE[method], CONCENTRATION_STUDIES[method], strict=True
    ):
        if coverage_off(value, n):
            if spans and spans[-1][1] == low:
                spans[-1][1] = high
            else:
                spans.append([low, high])
    shown = [f"{low:g}–{high:g}" if np.isfinite(high) else f"≥ {low:g}" for low, high in spans]
    return "m_eff " + ", ".join(shown) if shown else ""


def kish_effective_size(weights: ArrayLike) -> float:
    """Kish's (1965) effective sample size ``n_eff = (Σ w)² / Σ w²`` of non-negative weights.

    For a ratio of sums ``Σp/Σe = Σ_u (e_u/Σe)·(p_u/e_u)`` the estimate is an ``e``-weighted mean
    of the units' own ratios, so with ``w_u = e_u`` (a unit's energy) ``n_eff`` is the number of
    equally weighted units that would give that weighted mean the same variance: ``n`` for equal
    energies, near 1 when one unit holds most of the energy.

    Parameters
    ----------
    weights : array_like of shape (n,)
        Non-negative weights (per-unit energies).

    Returns
    -------
    float
        ``n_eff`` in ``[1, n]`` (NaN when the weights sum to 0).

    Examples
    --------
    >>> from anistat import stats
    >>> stats.kish_effective_size([1.0, 1.0, 1.0, 1.0])
    4.0
    >>> stats.kish_effective_size([9.0, 1.0, 1.0, 1.0])
    1.7142857142857142
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    square = float(np.sum(w * w))
    if not square > 0:
        return float("nan")
    return float(np.sum(w) ** 2 / square)
