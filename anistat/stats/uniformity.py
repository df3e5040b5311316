"""Is a set of p-values uniform? The verdict of a run's own null check.

With an uninformative proxy every null hypothesis is true, so a valid test's p-values follow its
null law. For a Monte-Carlo test with ``n`` draws that law is *discrete*: ``p = (1 + #)/(1 + n)``
takes only the values ``j/G``, ``G = n + 1`` (the paper's 20 normal controls: multiples of 1/21),
each with probability ``1/G`` under exchangeability. A Kolmogorov–Smirnov test against the
continuous U(0, 1) is wrong there (its null distribution assumes a continuous law: on a coarse
grid it rejects a perfectly calibrated test), and ``P(p ≤ alpha)`` is ``floor(alpha·G)/G``, not
``alpha`` (1/21 = 0.0476 at alpha = 0.05).

:func:`p_value_uniformity` therefore runs two tests, both on the p-values' own grid (``grid =
None``: continuous):

* **rejection share** — the number of ``p ≤ alpha`` against Binomial(N, ``expected_rate``) with
  ``expected_rate = floor(alpha·G)/G`` (``alpha`` when continuous), exact two-sided binomial test
  (scipy), with its Clopper–Pearson 95 % interval;
* **uniformity** — the Kolmogorov–Smirnov distance between the p-values' empirical CDF and the
  CDF of the uniform law *on the grid* (``j/G`` at ``j/G``), ``D = max_i max(i/N − p_(i),
  p_(i) − 1/G − (i − 1)/N)`` (exact for step CDFs on one grid; ``1/G → 0`` gives the usual KS
  distance), with a Monte-Carlo p-value ``(1 + #{D* ≥ D})/(1 + B)`` from ``B`` samples of N
  p-values drawn from that same law (seeded, so the verdict is reproducible).

**Sequential p-values.** With sequential stopping (``stop_after = h``, at most ``n`` draws:
:class:`anistat.stats.SequentialMonteCarlo`) a p-value is ``h/L`` when the test stopped, else
``(1 + g)/(1 + n)``: not a grid. Its null law is simulated exactly — the observed value's
exceedance probability ``u`` is uniform, each draw exceeds it independently with probability
``u`` (:func:`sample_sequential_pvalues`) — and both tests are run against that law
(``expected_rate`` = its ``P(p ≤ alpha)``, the KS distance from its CDF).

**Verdict** (at ``level``, default 0.05): the two tests are one family, decided by Holm's
procedure — the smaller p-value is compared with ``level/2``, and only when it rejects the larger
one with ``level`` — so a calibrated test is called NOT calibrated with probability at most
``level`` (each test at ``level`` on its own would make that up to ``2·level``: about 0.09 for 192
independent p-values of the sequential law, ``benchmarks/README.md``). ``anti-conservative`` when
the rejection share is rejected and above ``expected_rate``, ``conservative`` when rejected and
below, else ``not uniform`` when the uniformity test is rejected, else ``calibrated``. Only
``calibrated`` reads "consistent with a calibrated test": a rejected test can never be called
consistent.

**Independence.** Both tests, and the reference law, take the p-values as independent draws of
one law. For Monte-Carlo tests of uninformative proxies that holds *given the data* when every
test has its own random proxy and its own stream of null draws (``stats.null_draws: per_test``):
each p-value is then a function of its proxy and its stream only, which are independent of each
other and of the other tests' (the data enter only as the fixed spectrum against which both are
measured). Draws shared by the units of a width, or nested ranks of one stream, make the tests
dependent, and the verdict approximate (the report says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VERDICTS = ("calibrated", "anti-conservative", "conservative", "not uniform")


@dataclass(frozen=True, kw_only=True)
class UniformityCheck:
    """How a set of p-values compares with a valid test's null law (see the module docstring).

    Attributes
    ----------
    n : int
        The number of finite p-values checked ``N``.
    alpha : float
        The level whose rejection share is tested.
    grid : int or None
        G when every p-value is a multiple of 1/G (a Monte-Carlo test with G − 1 draws), None
        when they are treated as continuous (or follow a sequential test's law).
    expected_rate : float
        P(p ≤ ``alpha``) under the null law: ``floor(alpha·G)/G`` on a grid, else ``alpha``.
    rejections : int
        The number of p ≤ ``alpha``.
    rejection_rate : float
        The observed share of p ≤ ``alpha``.
    rate_ci : tuple of (float, float)
        Its exact (Clopper–Pearson) 95 % interval.
    binomial_p : float
        The exact two-sided binomial test of the share against ``expected_rate``.
    ks_distance : float
        The KS distance ``D`` of the p-values from the null law on the grid.
    uniformity_p : float
        Its Monte-Carlo p-value ``(1 + #{D* ≥ D})/(1 + B)``.
    n_simulations : int
        ``B``, the simulated samples behind ``uniformity_p``.
    level : float
        The family-wise level of the verdict (Holm over its two tests).
    verdict : {"calibrated", "anti-conservative", "conservative", "not uniform"}
        One of :data:`VERDICTS` at ``level``; the property ``calibrated`` is verdict
        "calibrated".

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> check = stats.p_value_uniformity(rng.uniform(size=200), n_simulations=199, seed=3)
    >>> type(check).__name__, check.n, check.verdict
    ('UniformityCheck', 200, 'calibrated')
    """

    n: int
    alpha: float
    grid: int | None
    expected_rate: float
    rejections: int
    rejection_rate: float
    rate_ci: tuple[float, float]
    binomial_p: float
    ks_distance: float
    uniformity_p: float
    n_simulations: int
    level: float
    verdict: str

    @property
    def calibrated(self) -> bool:
        return self.verdict == "calibrated"


def sample_sequential_pvalues(n_draws: int, stop_after: int, size: int, rng) -> np.ndarray:
    """``size`` p-values drawn from the null law of a Monte-Carlo test with at most ``n_draws``
    draws that stops after ``stop_after`` exceedances (0: never; see the module docstring)."""
    u = rng.uniform(size=size)
    n, h = int(n_draws), int(stop_after)
    if h <= 0:
        return (1.0 + rng.binomial(n, u)) / (n + 1.0)
    stop_at = h + rng.negative_binomial(h, u)  # the draw holding the h-th exceedance
    out = np.where(stop_at <= n, h / np.minimum(stop_at, np.iinfo(np.int64).max).astype(float), np.nan)
    pending = np.flatnonzero(np.isnan(out))
    for _ in range(1000):  # the exceedances among n draws, given fewer than h of them
        if pending.size == 0:
            break
        g = rng.binomial(n, u[pending])
        ok = g < h
        out[pending[ok]] = (1.0 + g[ok]) / (n + 1.0)
        pending = pending[~ok]
    if pending.size:  # pragma: no cover - needs u with P(G < h) below ~1e-300
        out[pending] = h / (n + 1.0)
    return out


def holm_rejections(p_values, level: float) -> tuple[bool, ...]:
    """Holm's step-down decisions at family-wise level ``level``: the ``i``-th smallest p-value
    (``i = 1 … m``) is rejected when it and every smaller one lie below ``level/(m − i + 1)``.

    >>> from anistat.stats.uniformity import holm_rejections
    >>> holm_rejections((0.03, 0.04), 0.05), holm_rejections((0.02, 0.04), 0.05)
    ((False, False), (True, True))
    """
    p = np.asarray(p_values, dtype=np.float64)
    rejected = np.zeros(p.size, dtype=bool)
    for step, index in enumerate(np.argsort(p, kind="stable")):
        if not p[index] < level / (p.size - step):
            break
        rejected[index] = True
    return tuple(bool(r) for r in rejected)


#: Relative tolerance within which a p-value is one of the law's atoms. A p-value read back from
#: results.csv keeps 10 significant digits (``0.9090909091`` for 10/11), so an exact comparison
#: would put it just above its own atom; the sequential law's atoms ``h/L`` and ``(1 + g)/(1 + n)``
#: lie at least ~1/(n + 1) apart (relative), far beyond this.
ATOM_TOLERANCE = 1e-9


class _Law:
    """A discrete null law known by a large sample: ``cdf(x)`` = P(X ≤ x), ``below(x)`` = P(X < x),
    values within :data:`ATOM_TOLERANCE` (relative) of an atom counted as that atom."""

    def __init__(self, sample: np.ndarray) -> None:
        self.sorted = np.sort(sample)

    def cdf(self, x):
        return np.searchsorted(self.sorted, np.asarray(x) * (1 + ATOM_TOLERANCE), side="right") / self.sorted.size

    def below(self, x):
        return np.searchsorted(self.sorted, np.asarray(x) * (1 - ATOM_TOLERANCE), side="left") / self.sorted.size


def law_ks_distance(p_values, law: _Law) -> np.ndarray:
    """KS distance ``sup_x |F_N(x) − F(x)|`` of each row of ``p_values`` (…, N) from ``law``.

    On each interval between consecutive sorted values the empirical CDF ``F_N`` is constant and
    the law's CDF ``F`` non-decreasing, so ``sup (F_N − F)`` is reached at a value, ``max_i i/N −
    F(p_(i))``, and ``sup (F − F_N)`` just below one, ``max_i F(p_(i)−) − (i − 1)/N``. Both are
    exact with ties (a discrete law's atoms, such as the sequential test's ``p = 1``): in a block
    of equal values the first maximum is reached at the block's last index, where ``i/N`` is
    ``F_N`` at the value, and the second at its first, where ``(i − 1)/N`` is ``F_N`` just below
    it. (Absolute values of both terms at every index would count a tied block's own mass as a
    distance: about ``P(p = 1) = 1/(h + 1)`` for every sample of the sequential law.)"""
    p = np.sort(np.asarray(p_values, dtype=np.float64), axis=-1)
    n = p.shape[-1]
    i = np.arange(1, n + 1, dtype=np.float64)
    above = (i / n - law.cdf(p)).max(axis=-1)
    below = (law.below(p) - (i - 1) / n).max(axis=-1)
    return np.maximum(above, below)


def p_value_grid(p_values, n_draws: int | None) -> int | None:
    """G = ``n_draws`` + 1 when every p-value is a multiple of 1/G (a Monte-Carlo p-value with
    ``n_draws`` draws), else None (treated as continuous).

    Parameters
    ----------
    p_values : array_like
        The p-values.
    n_draws : int or None
        The Monte-Carlo draws behind each p-value; None (or < 1) for continuous p-values.

    Returns
    -------
    int or None
        ``G = n_draws + 1`` when every ``p·G`` is an integer ``>= 1`` (to ``1e-6·G``), else None.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.p_value_grid([0.01, 0.02, 0.5], n_draws=99), stats.p_value_grid([0.013, 0.5], None)
    (100, None)
    """
    if n_draws is None or n_draws < 1:
        return None
    grid = int(n_draws) + 1
    scaled = np.asarray(p_values, dtype=np.float64) * grid
    on_grid = np.all(np.abs(scaled - np.round(scaled)) <= 1e-6 * grid) and np.all(np.round(scaled) >= 1)
    return grid if bool(on_grid) else None


def ks_distance(p_values, grid: int | None) -> np.ndarray:
    """KS distance of each row of ``p_values`` (…, N) from the uniform law on ``j/G`` (continuous
    U(0, 1) when ``grid`` is None); see the module docstring."""
    p = np.sort(np.asarray(p_values, dtype=np.float64), axis=-1)
    n = p.shape[-1]
    i = np.arange(1, n + 1, dtype=np.float64)
    step = 0.0 if grid is None else 1.0 / grid
    above = np.max(i / n - p, axis=-1)
    below = np.max(p - step - (i - 1) / n, axis=-1)
    return np.maximum(above, below)


def p_value_uniformity(
    p_values,
    alpha: float = 0.05,
    *,
    n_draws: int | None = None,
    stop_after: int = 0,
    level: float = 0.05,
    n_simulations: int = 9999,
    seed: int = 0,
) -> UniformityCheck:
    """Null check of p-values that should follow a valid test's null law (module docstring).

    Parameters
    ----------
    p_values : array_like
        The p-values, any shape; non-finite ones are dropped (at least one must be finite).
    alpha : float, default 0.05
        The level whose rejection share is tested, in ``(0, 1)``.
    n_draws : int or None, default None
        The Monte-Carlo draws behind each p-value, when the p-values should lie on the grid
        ``j/(n_draws + 1)``; p-values found off that grid are treated as continuous.
    stop_after : int, default 0
        With ``stop_after > 0`` (and ``n_draws``) the law is that of the sequential test
        stopping after ``stop_after`` exceedances; ``n_draws`` is then its cap ``n`` (the run's
        ``n_null_draws``), not the draws the tests happened to use.
    level : float, default 0.05
        The family-wise level of the verdict (Holm over the binomial and uniformity tests), in
        ``(0, 1)``.
    n_simulations : int, default 9999
        ``B``, the samples of the null law behind the uniformity test's p-value.
    seed : int, default 0
        Seed of those samples (the verdict is reproducible).

    Returns
    -------
    UniformityCheck
        The rejection share, the KS distance, both tests' p-values and the verdict.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> check = stats.p_value_uniformity(rng.uniform(size=500), alpha=0.05, n_simulations=199, seed=3)
    >>> check.verdict, check.n
    ('calibrated', 500)
    """
    from scipy import stats as sps

    if not 0 < alpha < 1 or not 0 < level < 1:
        raise ValueError(f"alpha and level must lie in (0, 1), got {alpha}, {level}")
    p = np.asarray(p_values, dtype=np.float64).ravel()
    p = p[np.isfinite(p)]
    if p.size == 0:
        raise ValueError("no finite p-values")
    rng = np.random.default_rng(seed)
    sequential = bool(stop_after) and n_draws is not None and n_draws >= 1
    grid = None if sequential else p_value_grid(p, n_draws)
    if sequential:
        law = _Law(sample_sequential_pvalues(n_draws, stop_after, 400_000, rng))
        expected = float(law.cdf(alpha + 1e-12))
    else:
        expected = math.floor(alpha * grid + 1e-9) / grid if grid is not None else alpha
    hits = int((p <= alpha + 1e-12).sum())
    binomial = sps.binomtest(hits, p.size, expected) if expected > 0 else None
    interval = sps.binomtest(hits, p.size, 0.5).proportion_ci(confidence_level=0.95, method="exact")
    binomial_p = float(binomial.pvalue) if binomial is not None else (1.0 if hits == 0 else 0.0)
    observed = float(law_ks_distance(p, law) if sequential else ks_distance(p, grid))
    simulated = np.empty(n_simulations)
    chunk = max(1, 2_000_000 // p.size)
    for start in range(0, n_simulations, chunk):
        size = (min(chunk, n_simulations - start), p.size)
        if sequential:
            draws = sample_sequential_pvalues(n_draws, stop_after, size[0] * size[1], rng).reshape(size)
            simulated[start : start + size[0]] = law_ks_distance(draws, law)
            continue
        draws = (rng.integers(1, grid + 1, size=size) / grid) if grid is not None else rng.uniform(size=size)
        simulated[start : start + size[0]] = ks_distance(draws, grid)
    uniformity_p = float((1 + np.count_nonzero(simulated >= observed - 1e-12)) / (1 + n_simulations))
    rate = hits / p.size
    share_rejected, uniformity_rejected = holm_rejections((binomial_p, uniformity_p), level)
    if share_rejected and rate > expected:
        verdict = "anti-conservative"
    elif share_rejected:
        verdict = "conservative"
    elif uniformity_rejected:
        verdict = "not uniform"
    else:
        verdict = "calibrated"
    return UniformityCheck(
        n=int(p.size),
        alpha=float(alpha),
        grid=grid,
        expected_rate=float(expected),
        rejections=hits,
        rejection_rate=float(rate),
        rate_ci=(float(interval.low), float(interval.high)),
        binomial_p=binomial_p,
        ks_distance=observed,
        uniformity_p=uniformity_p,
        n_simulations=int(n_simulations),
        level=float(level),
        verdict=verdict,
    )
