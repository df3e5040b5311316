"""Monte-Carlo decisions with a uniformly bounded resampling risk.

A Monte-Carlo test estimates an *ideal* p-value ``p = P(T(Q) ≥ t)`` (the probability, over the
null draws ``Q``, that a draw reaches the observed value ``t``; the p-value of infinitely many
draws). A decision read off finitely many draws can differ from the ideal decision ``p < α``; the
*resampling risk* is the probability of that, over the draws (Gandy 2009, "Sequential
implementation of Monte Carlo tests with uniformly bounded resampling risk", JASA 104:1504). Fixed
``n`` or Besag–Clifford stopping (``h`` exceedances) leave it unbounded: near ``α`` it approaches
1/2, so one seed's decision about a borderline test can flip with the seed.

The procedure here bounds it uniformly in ``p`` by a confidence sequence — Clopper–Pearson
intervals at a fixed schedule of looks, the error split over the looks (a union bound):

* looks after ``n_1 = first_look, 2 n_1, 4 n_1, …`` draws, the last at ``n_max`` (``J`` looks);
* at look ``j`` a test with ``X`` exceedances in ``n_j`` draws gets the two-sided Clopper–Pearson
  interval ``[B(γ/2; X, n_j − X + 1), B(1 − γ/2; X + 1, n_j − X)]`` with ``γ = ε_test / J``,
  intersected with the test's earlier intervals;
* so with probability at least ``1 − ε_test`` every interval of the test covers its ideal ``p``
  (each look's interval misses with probability at most ``γ``, whatever ``p``, and there are
  ``J`` of them), whatever the dependence between tests or the stopping.

**One test** (``method="none"``): ``rejected`` once the interval lies below ``α``
(``high < α``), ``not rejected`` once it lies at or above (``low ≥ α``), else it draws on;
``undecided`` if neither holds after ``n_max`` draws (the ideal p is then within the interval,
which contains ``α``). A decision differs from the ideal one only if an interval missed ``p``:
probability ``≤ ε``.

**A family** under Holm, Benjamini–Hochberg or Bonferroni (``method``), in the manner of
MMCTest (Gandy & Hahn 2014, Scand. J. Stat. 41:1083): each of the ``m`` tests gets
``ε_test = ε / m``, so all intervals cover their ideal p-values at once with probability
``≥ 1 − ε``. The three procedures are monotone (lowering any p-value never un-rejects a test), so
with every ``p_i ∈ [low_i, high_i]`` the ideal rejection set lies between the procedure applied to
the upper ends (rejected for sure) and to the lower ends (possibly rejected). A test in the first
set is ``rejected``; a test outside the second is ``not rejected``; the others draw on. So the
probability that *any* decision of the family differs from the ideal family decision is at most
``ε``. Tests that are decided stop drawing; their intervals stay valid (they are among the looks).

Level: a test is rejected only when ``high < α``, so under the null
``P(rejected) ≤ P(p < α) + ε ≤ α + ε`` unconditionally (``p`` is uniform for a continuous
statistic); the exact Monte-Carlo p-value (:mod:`.montecarlo`) is reported beside the decision.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betaincinv

from .. import vocabulary as vocab
from ._validation import check_alternative
from .multiplicity import adjust_pvalues

#: Decision statuses, in the ``mc_decision`` vocabulary.
REJECTED, NOT_REJECTED, UNDECIDED = "rejected", "not rejected", "undecided"
#: The procedures a family can be decided under (``none``: each test on its own at ``alpha``).
FAMILY_METHODS = (vocab.NO_CORRECTION, *vocab.CORRECTIONS)


def clopper_pearson(exceedances: ArrayLike, draws: ArrayLike, error: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper–Pearson interval for a binomial proportion at total error ``error``:
    ``low = B⁻¹(error/2; X, n − X + 1)`` (0 when ``X = 0``), ``high = B⁻¹(1 − error/2; X + 1, n − X)``
    (1 when ``X = n``).

    Parameters
    ----------
    exceedances : array_like
        ``X``, the exceedance counts.
    draws : array_like
        ``n``, the draws behind each count (broadcast against ``exceedances``).
    error : float
        The total error ``γ`` of the two-sided interval.

    Returns
    -------
    low : ndarray
        The lower ends.
    high : ndarray
        The upper ends.
    """
    x = np.asarray(exceedances, dtype=np.float64)
    n = np.asarray(draws, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(x > 0, betaincinv(np.maximum(x, 1e-300), n - x + 1, error / 2), 0.0)
        high = np.where(x < n, betaincinv(x + 1, np.maximum(n - x, 1e-300), 1 - error / 2), 1.0)
    return low, high


def look_schedule(n_max: int, first_look: int = 16) -> np.ndarray:
    """Draw counts at which decisions are looked at: ``first_look · 2^j`` below ``n_max``, then
    ``n_max``.

    Parameters
    ----------
    n_max : int
        The last look, at least 1.
    first_look : int, default 16
        The first look ``n_1``, at least 1.

    Returns
    -------
    ndarray of int64, shape (J,)
        The draw counts of the ``J`` looks, increasing, the last ``n_max``.
    """
    if n_max < 1 or first_look < 1:
        raise ValueError(f"n_max and first_look must be >= 1, got {n_max} and {first_look}")
    looks = []
    n = int(first_look)
    while n < n_max:
        looks.append(n)
        n *= 2
    looks.append(int(n_max))
    return np.array(looks, dtype=np.int64)


def family_rejections(p: ArrayLike, alpha: float, method: str) -> np.ndarray:
    """The rejection set of ``method`` at level ``alpha`` (``adjusted p < alpha``; ``none``:
    ``p < alpha``) — monotone in ``p``.

    Parameters
    ----------
    p : array_like
        The family's p-values (clipped to ``[0, 1]`` before adjusting).
    alpha : float
        The level.
    method : {"none", "holm", "fdr_bh", "bonferroni"}
        The procedure (:func:`anistat.stats.adjust_pvalues`; ``none``: uncorrected).

    Returns
    -------
    ndarray of bool
        Whether each test is rejected, of ``p``'s shape.
    """
    p = np.asarray(p, dtype=np.float64)
    if method == "none":
        return p < alpha
    return adjust_pvalues(np.clip(p, 0.0, 1.0), method) < alpha


def family_decisions(p_low: ArrayLike, p_high: ArrayLike, alpha: float, method: str) -> np.ndarray:
    """Decisions of a family whose ideal p-values lie in ``[p_low, p_high]`` (equal ends for a
    p-value known exactly): ``rejected`` where ``method`` rejects even the upper ends,
    ``not rejected`` where it rejects not even the lower ends, else ``undecided`` — right
    whenever every interval covers its ideal p-value (the procedures are monotone).

    Parameters
    ----------
    p_low : array_like
        Lower ends of the ideal p-values' intervals.
    p_high : array_like
        Upper ends, of ``p_low``'s shape.
    alpha : float
        The level.
    method : {"none", "holm", "fdr_bh", "bonferroni"}
        The procedure the family is decided under.

    Returns
    -------
    ndarray of object
        ``"rejected"``, ``"not rejected"`` or ``"undecided"`` per test (``undecided`` for a NaN
        lower end).
    """
    low, high = np.asarray(p_low, dtype=np.float64), np.asarray(p_high, dtype=np.float64)
    sure = family_rejections(high, alpha, method)
    possible = family_rejections(low, alpha, method)
    out = np.full(low.shape, UNDECIDED, dtype=object)
    out[sure] = REJECTED
    out[~possible & ~sure & np.isfinite(low)] = NOT_REJECTED
    return out


class RiskBoundedMonteCarlo:
    """Decisions of ``m`` Monte-Carlo tests read off one stream of null draws, each stopping when
    its decision (or its family's, under ``method``) is settled; see the module docstring.

    ``n_split`` and ``stop_below`` serve decisions made later over a family that this engine does
    not see whole (tests on several streams): every test gets ``epsilon / n_split`` (``n_split`` at
    least the family's size, so all intervals of the family cover at once with probability
    ``≥ 1 − ε``), and under ``none`` a test stops as rejected only below ``stop_below`` (e.g.
    ``alpha / m``, below which Holm, BH and Bonferroni all reject); the family's decision is then
    :func:`family_decisions` of the intervals.

    Same feeding protocol as :class:`.montecarlo.SequentialMonteCarlo`: pass the next null
    values with :meth:`update` (``(m, c)``, draw order along axis 1) while :attr:`remaining` > 0.
    Read :meth:`decisions`, :attr:`p_low` / :attr:`p_high` (the last look's interval of each
    ideal p-value), :attr:`draws_used` and :attr:`exceed`. ``alternative`` ``greater`` counts draws
    ``≥`` the observed value, ``less`` draws ``≤`` it (``two-sided`` is not supported: its ideal
    p-value is not a binomial proportion). A NaN observed value is never active (status
    ``undecided``, interval NaN).

    Parameters
    ----------
    observed : array_like of shape (m,)
        The observed values of the ``m`` tests.
    alpha : float
        The level, in ``(0, 1)``.
    epsilon : float
        ``ε``, the resampling risk bound, in ``(0, 1)``.
    n_max : int
        The most draws any test uses.
    method : {"none", "holm", "fdr_bh", "bonferroni"}, default "none"
        The procedure the family is decided under (``none``: each test on its own).
    alternative : {"greater", "less"}, default "greater"
        ``greater`` counts draws ``≥`` the observed value, ``less`` draws ``≤`` it.
    first_look : int, default 16
        The first look ``n_1`` (:func:`look_schedule`).
    n_split : int, optional
        Every test gets ``epsilon / n_split`` (at least the family's size); default: the number
        of finite observed values under a multiplicity method, 1 under ``none``.
    stop_below : float, optional
        Under ``none``, a test stops as rejected only below this (e.g. ``alpha / m``); default
        ``alpha``.
    """

    def __init__(
        self,
        observed: ArrayLike,
        alpha: float,
        epsilon: float,
        n_max: int,
        method: str = "none",
        alternative: str = "greater",
        first_look: int = 16,
        *,
        n_split: int | None = None,
        stop_below: float | None = None,
    ) -> None:
        check_alternative(alternative)
        if alternative == "two-sided":
            raise ValueError("risk-bounded decisions need a one-sided alternative ('greater' or 'less')")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if not 0 < epsilon < 1:
            raise ValueError(f"epsilon (the resampling risk) must lie in (0, 1), got {epsilon}")
        if method not in FAMILY_METHODS:
            raise ValueError(f"method must be one of {FAMILY_METHODS}, got {method!r}")
        self.observed = np.asarray(observed, dtype=np.float64).ravel()
        self.alpha, self.epsilon, self.method, self.alternative = float(alpha), float(epsilon), method, alternative
        self.n_max = int(n_max)
        self.looks = look_schedule(self.n_max, first_look)
        m = self.observed.size
        tested = np.isfinite(self.observed)
        n_tests = max(int(tested.sum()), 1)
        #: each test's share of the risk (``n_split`` tests share ``epsilon``; default: the family's
        #: tests under a multiplicity method, the test alone under ``none``), and its error per look
        split = n_split if n_split is not None else (n_tests if method != "none" else 1)
        if split < 1:
            raise ValueError(f"n_split must be >= 1, got {n_split}")
        self.epsilon_test = self.epsilon / split
        #: ``none``: a test is rejected (and stops) once its interval lies below this
        self.stop_below = self.alpha if stop_below is None else float(stop_below)
        self.error_per_look = self.epsilon_test / self.looks.size
        self.exceed = np.zeros(m, dtype=np.int64)
        self.draws_used = np.zeros(m, dtype=np.int64)
        self.p_low = np.where(tested, 0.0, np.nan)
        self.p_high = np.where(tested, 1.0, np.nan)
        self.status = np.full(m, UNDECIDED, dtype=object)
        self.active = tested.copy()
        self._next_look = 0

    @property
    def remaining(self) -> int:
        """Draws the active tests may still use (0 when every test is decided or capped)."""
        if not self.active.any():
            return 0
        return int(self.n_max - self.draws_used[self.active].max())

    def update(self, null: ArrayLike) -> None:
        """Count the next draws (``(m, c)``) for the active tests, looking at every scheduled count."""
        values = np.asarray(null, dtype=np.float64)
        if values.ndim != 2 or values.shape[0] != self.observed.size:
            raise ValueError(f"null must have shape (m={self.observed.size}, c), got {values.shape}")
        start = 0
        while start < values.shape[1] and self.remaining:
            tests = np.flatnonzero(self.active)
            used = int(self.draws_used[tests].max())  # active tests have all used the same draws
            width = min(values.shape[1] - start, int(self.looks[self._next_look]) - used)
            chunk = values[tests, start : start + width]
            observed = self.observed[tests, None]
            hits = (chunk >= observed) if self.alternative == "greater" else (chunk <= observed)
            counts = np.zeros(self.observed.size, dtype=np.int64)
            counts[tests] = hits.sum(axis=1)
            self.add_counts(counts, width)
            start += width

    def add_counts(self, exceedances: ArrayLike, width: int) -> None:
        """Add ``exceedances`` (``(m,)``, counted over the next ``width`` draws; read only for
        active tests) and decide at a scheduled look. ``width`` must not pass the next look —
        :meth:`update` splits chunks so; simulations may feed binomial counts directly."""
        tests = np.flatnonzero(self.active)
        if tests.size == 0 or width <= 0:
            return
        target = int(self.looks[self._next_look])
        if int(self.draws_used[tests].max()) + width > target:
            raise ValueError(f"width {width} passes the next look at {target} draws")
        self.exceed[tests] += np.asarray(exceedances, dtype=np.int64)[tests]
        self.draws_used[tests] += width
        if int(self.draws_used[tests].max()) == target:
            self._look(tests, target)
            self._next_look += 1

    def _look(self, tests: np.ndarray, n: int) -> None:
        low, high = clopper_pearson(self.exceed[tests], n, self.error_per_look)
        # on the event that every look's interval covers p, so does their intersection
        self.p_low[tests] = np.maximum(self.p_low[tests], low)
        self.p_high[tests] = np.minimum(self.p_high[tests], high)
        tested = np.isfinite(self.observed)
        if self.method == "none":
            sure = self.p_high < self.stop_below
        else:
            sure = family_rejections(np.where(tested, self.p_high, np.nan), self.alpha, self.method)
        possible = family_rejections(np.where(tested, self.p_low, np.nan), self.alpha, self.method)
        undecided = self.status == UNDECIDED  # a decision, once made, stands
        self.status[undecided & tested & sure] = REJECTED
        self.status[undecided & tested & ~possible] = NOT_REJECTED
        self.active = tested & (self.status == UNDECIDED) & (self.draws_used < self.n_max)

    def decisions(self) -> np.ndarray:
        """Per test: ``rejected``, ``not rejected`` or ``undecided`` (the cap was reached first)."""
        return self.status.copy()

    def p_estimate(self) -> np.ndarray:
        """The Monte-Carlo estimate ``X / n`` of each ideal p-value (NaN without draws)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.draws_used > 0, self.exceed / self.draws_used, np.nan)


def risk_bounded_decisions(
    observed: ArrayLike,
    null: ArrayLike,
    alpha: float,
    epsilon: float,
    method: str = "none",
    alternative: str = "greater",
    first_look: int = 16,
) -> RiskBoundedMonteCarlo:
    """:class:`RiskBoundedMonteCarlo` on a whole ``(m, n)`` array of null draws (``n`` the cap).

    Parameters
    ----------
    observed : array_like of shape (m,)
        The observed values.
    null : array_like of shape (m, n)
        The null draws in draw order along axis 1.
    alpha : float
        The level.
    epsilon : float
        ``ε``, the resampling risk bound.
    method : {"none", "holm", "fdr_bh", "bonferroni"}, default "none"
        The procedure the family is decided under.
    alternative : {"greater", "less"}, default "greater"
        The tail tested.
    first_look : int, default 16
        The first look ``n_1``.

    Returns
    -------
    RiskBoundedMonteCarlo
        The engine after all draws: read :meth:`~RiskBoundedMonteCarlo.decisions`, ``p_low`` /
        ``p_high`` and ``draws_used``.
    """
    nul = np.asarray(null, dtype=np.float64)
    engine = RiskBoundedMonteCarlo(observed, alpha, epsilon, nul.shape[1], method, alternative, first_look)
    engine.update(nul)
    return engine
