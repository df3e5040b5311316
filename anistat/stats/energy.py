"""Analysis of one proxy basis: an exact test against random subspaces, effect sizes with CIs.

Inputs, for one (unit, proxy, rank, control kind), per test sequence ``s``::

    proxy_energy     p_s = Σ_{i∈s} ‖Uᵀg_i‖²
    total_energy     t_s = Σ_{i∈s} ‖g_i‖²
    reference_energy e_s = the control energy the proxy is compared with (see below)

plus Monte-Carlo draws of random subspaces evaluated on the whole test split (from its
gradient second moment, :class:`anistat.geometry.SpectralFrame`): ``null_fractions`` (Haar
draws, for the exact test) and ``control_fractions`` (draws of this row's control kind).

Two sources of randomness, reported separately.

**The control draw → the exact primary test.** ``p_value = (1 + #{E(Q_j) ≥ E(U)}) / (1 + n)``
against ``n`` Haar draws ``Q_j``. Under "U is a uniformly random subspace" U is exchangeable
with the Haar draws, so this p-value is exact (``P(p ≤ a) ≤ a``) whatever the gradients'
anisotropy. ``E(U)`` and every ``E(Q_j)`` are evaluated with the same formula
``tr(QᵀMQ)/tr M`` (``observed_fraction``). ``p_value_paper`` is the paper's convention: the
same statistic against the first ``n_paper_controls`` draws of the row's own control kind.
For ``normal`` controls (uniform in U's orthogonal complement) it is *not* exact: U is never
exchangeable with subspaces drawn in its own complement, and under anisotropic gradients a
random U is rejected too often (measured in the null check over five seeds: P(p ≤ 0.05) = 0.071;
``benchmarks/README.md``, "The null check over seeds").

**The data → CIs and the data test.** Sequences cut from one document are dependent,
so the resampling unit is the document (``group_ids``), else the sequence: per-unit sums
``P_u, T_u, E_u`` (sums are additive, so a ratio of sums is unchanged by grouping), then a
bootstrap over units. Each interval is a CI of a population quantity *for this fixed
proxy*::

    energy_fraction   E[Σp] / E[Σt]
    energy_ratio      E[Σp] / E[Σe]      (e = expected control energy, see below)

With ``reference="expected"`` (default, haar and normal) ``e_s`` is the closed-form
expectation of the control energy over the control distribution: ``k/d · t_s`` (haar) and
``k/(d − k) · (t_s − p_s)`` (normal), so the ratio's CI has no noise from particular draws.
It describes the effect size over data sampling; it is *not* a test against random
subspaces (a fixed random proxy has a true ratio ≠ 1 — the test is ``p_value``). With
``reference="drawn"`` (the paper's conditional ratio, kinds without a closed form) ``e_s``
is the mean energy of the ``n`` drawn controls in sequence ``s``, and the CI is conditional
on those draws.

The data test (:data:`DATA_TEST`: the studentized bootstrap test of "the population ratio is
1", dual to the ratio's interval, on the same resamples) and Hedges' g use the headline
quantity's own per-unit contribution ``d_u = P_u − E_u`` (energy units, not a mean of
per-sequence ratios), so they agree in direction with the ratio, conditional on the proxy. For
the closed-form references, ``P − k/(d−k)(T − P) = d/(d−k) · (P − k/d · T)``: the haar and
normal contributions are proportional, so both kinds give the same g and the same test.

CI methods (:data:`anistat.vocabulary.CI_METHODS`): ``studentized`` (bootstrap-t with the
delta-method SE of a ratio of sums, :func:`.bootstrap.ratio_se`), ``bca`` or ``percentile``, and the
ratio-of-means intervals of :mod:`.ratio_intervals` (:data:`RATIO_CI_METHODS`), among them
``adjusted_el_f`` (adjusted EL F-calibrated on the units' effective size), the default of this
function and of the protocol (:data:`anistat.vocabulary.DEFAULT_CI_METHOD`), chosen by coverage over every ``anistat calibrate`` scenario (``benchmarks/README.md``);
``hedges_g`` always uses BCa.
``log2_energy_ratio`` is the log2 of the ratio interval; ``z`` and ``anisotropy_capture``
are monotone maps of the fraction interval with the control distribution / oracle held
fixed, and the capture interval is clipped to the metric's range ``[−(k/d)/(E*−k/d), 1]``
(``E(U) ≤ E*_k`` on any data).

Ranges and degenerate data. Every interval lies in its parameter's range: the fraction in
``[0, 1]``, the ratio to the expected Haar-control energy in ``[0, d/k]`` (``E ≤ 1``), the
ratio to the expected ``normal``-control energy in ``[0, ∞)``; an interval that passes a bound
is clipped there, with a note (clipping at a true bound never lowers coverage). The sample
oracle ``E*_k`` only estimates the population ceiling, so the fraction is never clipped there;
an upper bound above it is said in the note. With fewer than :data:`MIN_RESAMPLING_UNITS`
resampling units the intervals, their SEs and the data test are withheld (NaN, the reason in
the note): at 5 documents the interval over-covers and the data test has a third of its power at
10, and at 2 the interval covers a third of the time (``benchmarks/README.md``, "The fewest
resampling units for an interval"). When the
control is deterministic (``normal`` at ``k = d/2``: the whole complement) its moments are
exact (mean ``1 − E(U)``, sd 0) and ``z`` is undefined, with the reason.

Every row's ``se`` is its reported (range-clipped) interval's implied SE on the row's scale
(:mod:`.interval_se`), not the spread of the replicates, so pooled analyses weight a row as its
interval does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .. import vocabulary as vocab
from ._validation import as_1d_float, check_alternative, check_choice, check_ci_level, check_positive_int
from .bootstrap import (
    BootstrapResult,
    StudentizedTest,
    bootstrap_weights,
    ci_from_replicates,
    ratio_se,
    studentized_ratio_test,
)
from .effects import anisotropy_capture, hedges_correction
from .fallbacks import (
    CAPTURE_UNDEFINED,
    CI_CLIPPED,
    CI_UNBOUNDED,
    NO_INTERVAL,
    WITHHELD_FEW_UNITS,
    ZERO_CONTROL_SD,
    join_fallbacks,
)
from .interval_se import interval_implied_se, interval_log_scale, se_note
from .montecarlo import monte_carlo_pvalue
from .ratio_intervals import RATIO_INTERVAL_METHODS, STUDENTIZED_LOG, el_effective_size, ratio_interval

METRICS = vocab.ENERGY_METRICS
#: Names of the tests behind ``p_value`` (the ``p_test`` column of the results).
EXACT_TEST = "haar_monte_carlo"
#: The data test of "this proxy's population ratio is 1" (hedges_g rows): the studentized
#: bootstrap test dual to the energy ratio's interval (:func:`anistat.stats.studentized_ratio_test`).
DATA_TEST = "bootstrap_t"
#: The sign-flip test of per-unit contributions (:mod:`anistat.stats.permutation`), reported
#: beside the data test in `anistat calibrate`.
SIGN_FLIP_TEST = "sign_flip"
CLOSED_FORM_KINDS = vocab.CLOSED_FORM_KINDS
MIN_RESAMPLING_UNITS = vocab.MIN_RESAMPLING_UNITS
#: The ratio-of-means intervals of :mod:`.ratio_intervals` offered besides them (``studentized`` is
#: that module's ``studentized_log``).
RATIO_CI_METHODS = tuple(m for m in RATIO_INTERVAL_METHODS if m != STUDENTIZED_LOG)
#: The interval methods `analyze_energy` offers for its ratio estimands: ``bootstrap.METHODS``'s
#: measured for these ratios in ``anistat calibrate``, and :data:`RATIO_CI_METHODS`.
CI_METHODS = tuple(vocab.CI_METHODS)
#: What the energy ratio divides by: the controls' closed-form expected energy, or the drawn controls'.
REFERENCES = ("expected", "drawn")


@dataclass(frozen=True, kw_only=True)
class MetricResult:
    """One metric of one analysis (one row of the tidy results table).

    Attributes
    ----------
    metric : str
        The metric's name, one of :data:`METRICS`.
    estimate : float
        The metric's value for the proxy.
    control_mean : float
        The same metric evaluated on the draws of the row's control kind (mean; NaN for
        ``hedges_g``).
    control_sd : float
        Their sd (ddof=1; NaN for ``hedges_g``).
    ci_low : float
        Lower end of the metric's interval.
    ci_high : float
        Upper end of the metric's interval.
    ci_method : str
        The interval method actually used.
    note : str
        What the interval and test condition on, and any fallback.
    p_value : float
        The p-value of the test named by ``p_test``.
    p_test : str
        :data:`EXACT_TEST` or :data:`DATA_TEST`.
    p_value_paper : float
        The paper's convention (see the module docstring).
    effect_size : float
        The effect size, of kind ``effect_size_kind``.
    effect_size_kind : str
        ``"z"`` or ``"hedges_g"``.
    se : float
        The estimate's standard error (NaN where none).
    fallback : str
        Empty, or the :data:`FALLBACK_CODES` behind ``note`` (``";"``-joined).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> p, t = rng.uniform(1, 2, 16), rng.uniform(4, 6, 16)
    >>> a = stats.analyze_energy(p, t, t * 2 / 16, rank=2, dim=16, null_fractions=rng.uniform(0.05, 0.2, 99), n_bootstrap=200)
    >>> fraction = a.metrics[0]
    >>> fraction.metric, fraction.ci_low < fraction.estimate < fraction.ci_high
    ('energy_fraction', True)
    """

    metric: str
    estimate: float
    control_mean: float
    control_sd: float
    ci_low: float
    ci_high: float
    ci_method: str
    note: str
    p_value: float
    p_test: str
    p_value_paper: float
    effect_size: float
    effect_size_kind: str
    se: float = np.nan
    fallback: str = ""


@dataclass(frozen=True, kw_only=True)
class EnergyAnalysis:
    """Result of :func:`analyze_energy`. ``analysis["energy_ratio"]`` gives a metric.

    Attributes
    ----------
    metrics : tuple of MetricResult
        One row per metric of :data:`METRICS` computed.
    p_value : float
        The exact Haar Monte-Carlo test's p-value.
    p_value_paper : float
        The paper's convention's p-value.
    data_test : StudentizedTest
        The studentized bootstrap test of ratio 1.
    n_null : int
        The draws of the exact test.
    n_controls : int
        The drawn control fractions behind the control moments.
    n_sequences : int
        The number of sequences ``S``.
    n_clusters : int
        The number of resampling units (documents, else sequences).
    rank : int
        The proxy's rank ``k``.
    dim : int
        The dimension ``d``.
    n_bootstrap : int
        Bootstrap resamples of the intervals.
    ci_level : float
        Coverage of the intervals.
    alternative : {"greater", "less", "two-sided"}
        The tail tested.
    seed : int
        Seed of the resampling.
    note : str
        The exact test's note.
    fallback : str
        The exact test's :data:`FALLBACK_CODES` (empty, or ``"no_exact_test"``).
    m_eff : float
        The effective number of resampling units of the data test and the energy ratio
        (:func:`~anistat.stats.el_effective_size` of the proxy energies against the test's
        denominators): what the concentration diagnostic reads for the interval's coverage.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> p, t = rng.uniform(1, 2, 16), rng.uniform(4, 6, 16)
    >>> a = stats.analyze_energy(p, t, t * 2 / 16, rank=2, dim=16, null_fractions=rng.uniform(0.05, 0.2, 99), n_bootstrap=200)
    >>> type(a).__name__, a.n_sequences, [m.metric for m in a.metrics][:2]
    ('EnergyAnalysis', 16, ['energy_fraction', 'energy_ratio'])
    """

    metrics: tuple[MetricResult, ...]
    p_value: float  # exact Haar Monte-Carlo test
    p_value_paper: float
    data_test: StudentizedTest
    n_null: int
    n_controls: int
    n_sequences: int
    n_clusters: int
    rank: int
    dim: int
    n_bootstrap: int
    ci_level: float
    alternative: str
    seed: int
    note: str = ""
    fallback: str = ""
    m_eff: float = float("nan")

    def __getitem__(self, name: str) -> MetricResult:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)

    def to_records(self) -> list[dict]:
        """One dict per metric with the results-table columns this layer knows."""
        return [
            {
                "metric": m.metric,
                "estimate": m.estimate,
                "control_mean": m.control_mean,
                "control_sd": m.control_sd,
                "ci_low": m.ci_low,
                "ci_high": m.ci_high,
                "ci_method": m.ci_method,
                "p_value": m.p_value,
                "p_test": m.p_test,
                "p_value_paper": m.p_value_paper,
                "effect_size": m.effect_size,
                "effect_size_kind": m.effect_size_kind,
                "se": m.se,
                "n_controls": self.data_test.n_resamples if m.p_test == DATA_TEST else self.n_null,
                "n_sequences": self.n_sequences,
                "n_clusters": self.n_clusters,
                "m_eff": self.m_eff,
                "note": m.note,
                "fallback": m.fallback,
            }
            for m in self.metrics
        ]


def expected_control_energy(kind: str, proxy_energy, total_energy, rank: int, dim: int) -> np.ndarray:
    """Closed-form expectation of a control's energy, per sequence, over the control draw.

    ``E[QQᵀ] = k/d · I`` for Haar Q, so ``E Σ‖Qᵀg‖² = k/d · Σ‖g‖²``; a ``normal`` control is
    uniform in the complement of U, ``E[QQᵀ] = k/(d − k) · (I − UUᵀ)``, so
    ``E Σ‖Qᵀg‖² = k/(d − k) · (Σ‖g‖² − Σ‖Uᵀg‖²)``.

    Parameters
    ----------
    kind : {"haar", "normal"}
        The control kind (the other kinds have no closed form: use the drawn controls' mean).
    proxy_energy : array_like of shape (S,)
        Per-sequence energy in the proxy ``Σ‖Uᵀg‖²``.
    total_energy : array_like of shape (S,)
        Per-sequence total energy ``Σ‖g‖²``.
    rank : int
        The rank ``k``.
    dim : int
        The dimension ``d``.

    Returns
    -------
    ndarray of shape (S,)
        The expected control energy per sequence.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.expected_control_energy('haar', [1.0, 2.0], [4.0, 8.0], rank=2, dim=8).tolist()
    [1.0, 2.0]
    >>> stats.expected_control_energy('normal', [1.0, 2.0], [4.0, 8.0], rank=2, dim=8).tolist()
    [1.0, 2.0]
    """
    check_choice("kind", kind, CLOSED_FORM_KINDS)  # other kinds: use the drawn controls' mean
    p = np.asarray(proxy_energy, dtype=np.float64)
    t = np.asarray(total_energy, dtype=np.float64)
    if kind == vocab.HAAR:
        return rank / dim * t
    return rank / (dim - rank) * np.maximum(t - p, 0.0)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _mean_sd(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.nan, np.nan
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else np.nan


def cluster_sums(columns: np.ndarray, group_ids) -> tuple[np.ndarray, int]:
    """Sum the rows of ``columns`` (S, m) per group (documents) → ((G, m), G); rows as they
    are when ``group_ids`` is None.

    Parameters
    ----------
    columns : ndarray of shape (S, m)
        Per-sequence values.
    group_ids : array_like of shape (S,) or None
        The group (document) of each sequence; None: no grouping.

    Returns
    -------
    sums : ndarray of shape (G, m)
        Per-group sums, groups in sorted label order (``columns`` itself without groups).
    n_units : int
        ``G``, the number of groups (``S`` without groups).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> sums, n_units = stats.cluster_sums(np.ones((4, 2)), [0, 0, 1, 1])
    >>> sums.tolist(), n_units
    ([[2.0, 2.0], [2.0, 2.0]], 2)
    """
    if group_ids is None:
        return columns, columns.shape[0]
    codes = np.unique(np.asarray(group_ids), return_inverse=True)[1].ravel()
    n_groups = int(codes.max()) + 1
    out = np.zeros((n_groups, columns.shape[1]))
    np.add.at(out, codes, columns)
    return out, n_groups


def _hedges_g(weights: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Bias-corrected standardized mean of ``d`` under each row of weights (``n = Σw``)."""
    n = weights.sum(axis=1)
    mean = (weights @ d) / n
    var = (weights @ (d * d) - n * mean**2) / (n - 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hedges_correction(n - 1.0) * mean / np.sqrt(var)


def _leave_one_out_hedges_g(d: np.ndarray) -> np.ndarray:
    """:func:`_hedges_g` of each leave-one-out sample of ``d`` (the jackknife rows ``1 − I``), from
    the full sums in O(n) memory."""
    n = d.size - 1.0
    mean = (d.sum() - d) / n
    var = ((d * d).sum() - d * d - n * mean**2) / (n - 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hedges_correction(n - 1.0) * mean / np.sqrt(var)


@dataclass(frozen=True, kw_only=True)
class ControlMoments:
    """Mean and sd of a control kind's energy fraction ``E(Q)`` over its draw, and their source
    (``"closed form"`` or ``"N draws"``): the ``control_mean`` / ``control_sd`` of the energy
    rows and the scale of ``z``.

    Attributes
    ----------
    mean : float
        Mean of ``E(Q)``.
    sd : float
        Its sd.
    source : str
        ``"closed form"`` or ``"N draws"`` (with a note where the sd is exactly 0).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> moments = stats.control_energy_moments('haar', rank=2, dim=8, trace=8.0, frobenius_sq=8.0)
    >>> moments.mean, moments.sd, moments.source
    (0.25, 0.0, 'closed form')
    """

    mean: float
    sd: float
    source: str

    @classmethod
    def of_draws(cls, fractions) -> ControlMoments:
        mean, sd = _mean_sd(np.asarray(fractions, dtype=np.float64).ravel())
        return cls(mean=mean, sd=sd, source=f"{np.isfinite(np.asarray(fractions, dtype=float)).sum()} draws")


def control_energy_moments(
    kind: str,
    rank: int,
    dim: int,
    trace: float,
    frobenius_sq: float,
    proxy_trace: float = 0.0,
    proxy_cross_sq: float = 0.0,
    proxy_block_sq: float = 0.0,
) -> ControlMoments:
    """Exact mean and sd of ``E(Q) = tr(QᵀMQ)/tr M`` over a Haar or ``normal`` control draw.

    For ``P`` a Haar rank-``k`` projection in ``m`` dimensions and symmetric ``A`` (``m × m``):
    ``E tr(PA) = k/m · tr A`` and ``Var tr(PA) = 2k(m − k) / ((m − 1) m (m + 2)) · (tr A² −
    (tr A)²/m)``. Haar: ``A = M``, ``m = d``. ``normal`` (uniform in the complement of the proxy
    ``U``): ``A`` is ``M`` compressed to that complement, ``m = d − k``, with ``tr A = tr M −
    tr(UᵀMU)`` and ``tr A² = ‖M‖_F² − 2‖MU‖_F² + ‖UᵀMU‖_F²`` — the proxy's three traces
    (:func:`anistat.geometry.removal_traces`). At ``m = k`` (``normal`` with ``k = d/2``) the
    control is the whole complement: mean ``tr A / tr M = 1 − E(U)`` and sd exactly 0.

    Parameters
    ----------
    kind : {"haar", "normal"}
        The control kind.
    rank : int
        The rank ``k``.
    dim : int
        The dimension ``d``.
    trace : float
        ``tr M``.
    frobenius_sq : float
        ``‖M‖_F²``.
    proxy_trace : float, default 0.0
        ``normal`` only: ``tr(UᵀMU)``.
    proxy_cross_sq : float, default 0.0
        ``normal`` only: ``‖MU‖_F²``.
    proxy_block_sq : float, default 0.0
        ``normal`` only: ``‖UᵀMU‖_F²``.

    Returns
    -------
    ControlMoments
        The mean and sd, ``"closed form"``; NaN when ``tr M <= 0`` or ``m < k``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> m = stats.control_energy_moments('haar', rank=2, dim=8, trace=10.0, frobenius_sq=30.0)
    >>> round(m.mean, 4), round(m.sd, 4)
    (0.25, 0.0866)
    """
    check_choice("kind", kind, CLOSED_FORM_KINDS)  # no closed-form moments for the other kinds
    if kind == vocab.HAAR:
        m, a_trace, a_frob = dim, trace, frobenius_sq
    else:  # normal
        m = dim - rank
        a_trace = trace - proxy_trace
        a_frob = frobenius_sq - 2.0 * proxy_cross_sq + proxy_block_sq
    if not (trace > 0 and m >= rank):
        return ControlMoments(mean=np.nan, sd=np.nan, source="closed form")
    if m == rank:  # the control is the whole space it is drawn in: one subspace, no spread
        whole = "the proxy's whole complement (k = d/2)" if kind == vocab.NORMAL else "the whole space (k = d)"
        return ControlMoments(
            mean=float(a_trace / trace), sd=0.0, source=f"closed form; the control is {whole}, sd exactly 0"
        )
    mean = rank / m * a_trace / trace
    variance = (
        2.0
        * rank
        * (m - rank)
        / ((m - 1.0) * m * (m + 2.0))
        * max(a_frob - a_trace * a_trace / m, 0.0)
        / (trace * trace)
    )
    return ControlMoments(mean=float(mean), sd=float(np.sqrt(variance)), source="closed form")


@dataclass(frozen=True, kw_only=True)
class ExactTestResult:
    """One exact Monte-Carlo test against uniformly random (Haar) subspaces: its p-value, the
    draws it used, whether it stopped early, and (with a bounded resampling risk) the
    confidence-sequence interval of its ideal p-value.

    Computed by :func:`analyze_energy` itself (the Monte-Carlo p against the ``null`` draws), or
    elsewhere from draws shared by many units (:func:`anistat.analyze.nulls.exact_tests`) and
    passed in.

    Attributes
    ----------
    p_value : float
        The p-value: ``(1 + #{draws ≥ observed}) / (1 + n_draws)`` after all draws, or
        ``h / L`` when the test stopped sequentially at its ``h``-th exceedance after ``L`` draws
        (:class:`SequentialMonteCarlo`). NaN when no test was run.
    n_draws : int
        The Haar draws it used.
    stopped : bool, default False
        Whether it stopped sequentially before its ``n`` draws.
    p_low : float, default nan
        Lower end of the confidence-sequence interval of the ideal (infinite-draw) p-value of
        the risk-bounded decision (:class:`anistat.stats.resampling_risk.RiskBoundedMonteCarlo`);
        NaN without one.
    p_high : float, default nan
        Its upper end.
    risk_draws : int, default 0
        The draws that interval used.
    note : str, default ""
        Empty, or a note carried into :attr:`EnergyAnalysis.note`.
    fallback : str, default ""
        Empty, or the code of :data:`FALLBACK_CODES` naming why there is no test
        (``"no_exact_test"``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> result = stats.ExactTestResult(p_value=0.01, n_draws=99)
    >>> result.p_value, result.n_draws, result.stopped, result.note, result.fallback
    (0.01, 99, False, '', '')
    """

    p_value: float
    n_draws: int
    stopped: bool = False
    p_low: float = float("nan")
    p_high: float = float("nan")
    risk_draws: int = 0
    note: str = ""
    fallback: str = ""


@dataclass(frozen=True, kw_only=True)
class _Units:
    """Per-resampling-unit sums of proxy, total and reference energy."""

    proxy: np.ndarray
    total: np.ndarray
    reference: np.ndarray
    name: str

    @property
    def n(self) -> int:
        return int(self.proxy.size)


def analyze_energy(
    proxy_energy,
    total_energy,
    reference_energy,
    *,
    rank: int,
    dim: int,
    null_fractions=None,
    exact: ExactTestResult | None = None,
    control_fractions=None,
    control_moments: ControlMoments | None = None,
    paper_fractions=None,
    observed_fraction: float | None = None,
    n_paper_controls: int | None = None,
    group_ids=None,
    oracle_fraction: float | None = None,
    reference: str = "expected",
    control_kind: str = vocab.HAAR,
    n_bootstrap: int = 2000,
    ci_level: float = 0.95,
    ci_method: str = vocab.DEFAULT_CI_METHOD,
    n_test_resamples: int | None = None,
    alternative: str = "greater",
    seed: int = 0,
    min_resampling_units: int = MIN_RESAMPLING_UNITS,
) -> EnergyAnalysis:
    """Exact test, CIs and effect sizes of one proxy against one control kind.

    Parameters
    ----------
    proxy_energy : array_like of shape (S,)
        Per-sequence energy in the proxy (finite, non-negative), ``S >= 2``.
    total_energy : array_like of shape (S,)
        Per-sequence total energy (finite, non-negative).
    reference_energy : array_like of shape (S,)
        Per-sequence control energy the ratio divides by: from :func:`expected_control_energy`
        or the drawn controls' mean (finite, non-negative).
    rank : int
        The proxy's rank ``k``.
    dim : int
        The dimension ``d``.
    null_fractions : array_like of shape (n,), optional
        Energy fractions of Haar draws on the whole split, from which the fixed-``n``
        Monte-Carlo p-value is computed (needed without ``exact``).
    exact : ExactTestResult, optional
        The exact test's result, computed elsewhere (instead of ``null_fractions``).
    control_fractions : array_like of shape (n_c,), optional
        Drawn control fractions whose moments give the row's control distribution
        (``control_mean``, ``control_sd``, ``z``); default: ``null_fractions``.
    control_moments : ControlMoments, optional
        Exact moments (:func:`control_energy_moments`), used instead of ``control_fractions``.
    paper_fractions : array_like, optional
        ``p_value_paper`` is the Monte-Carlo p against the first ``n_paper_controls`` of these
        (default: ``control_fractions``).
    observed_fraction : float, optional
        ``E(U)`` evaluated like the draws (``tr(UᵀMU)/tr M``); defaults to ``Σp/Σt``.
    n_paper_controls : int, optional
        How many of ``paper_fractions`` the paper's p-value uses.
    group_ids : array_like of shape (S,), optional
        Document ids: the resampling unit is then the document.
    oracle_fraction : float, optional
        ``E*_k`` for the anisotropy capture row.
    reference : {"expected", "drawn"}, default "expected"
        Label for the notes: what ``reference_energy`` is (closed form or drawn controls).
    control_kind : str, default "haar"
        Label for the notes: the control kind.
    n_bootstrap : int, default 2000
        Bootstrap resamples of the intervals.
    ci_level : float, default 0.95
        Coverage of the intervals.
    ci_method : {"bca", "percentile", "studentized", "bca_log", "variance_stabilised", "el", "adjusted_el", \
"balanced_el", "adjusted_el_f"}, default "adjusted_el_f"
        The ratio estimands' interval method (:data:`CI_METHODS`; the last six:
        :func:`anistat.stats.ratio_interval`).
    n_test_resamples : int, optional
        Resamples for the data test (and, with ``n_bootstrap``, the CIs: both use the same
        ``max(n_bootstrap, n_test_resamples)`` resamples, so they agree).
    alternative : {"greater", "less", "two-sided"}, default "greater"
        The tail of every test.
    seed : int, default 0
        Seed of the resampling.
    min_resampling_units : int, default MIN_RESAMPLING_UNITS
        Below this many resampling units the intervals, their SEs and the data test are NaN with
        the reason in the note (the calibration study passes 2 to measure the intervals
        themselves at every study size).

    Returns
    -------
    EnergyAnalysis
        The tests and one :class:`MetricResult` per metric.

    See the module docstring for what every interval and test conditions on.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> p, t = rng.uniform(1, 2, 16), rng.uniform(4, 6, 16)
    >>> a = stats.analyze_energy(p, t, t * 2 / 16, rank=2, dim=16, null_fractions=rng.uniform(0.05, 0.2, 99), n_bootstrap=200)
    >>> a.p_value, a.n_null
    (0.01, 99)
    >>> ratio = [m for m in a.metrics if m.metric == 'energy_ratio'][0]
    >>> ratio.estimate > 1
    True
    """
    p, t, e = _checked_energies(proxy_energy, total_energy, reference_energy)
    null = _checked_null(null_fractions, exact)
    _check_settings(rank, dim, alternative, ci_level, n_bootstrap, min_resampling_units, ci_method, reference)
    units = _resampling_units(p, t, e, group_ids)
    draws = null if control_fractions is None else np.asarray(control_fractions, dtype=np.float64).ravel()
    control = control_moments if control_moments is not None else ControlMoments.of_draws(draws)
    paper = draws if paper_fractions is None else np.asarray(paper_fractions, dtype=np.float64).ravel()
    fraction = units.proxy.sum() / units.total.sum()
    observed = fraction if observed_fraction is None else float(observed_fraction)
    exact, p_paper = _exact_tests(observed, null, exact, paper, n_paper_controls, alternative)
    settings = (rank, dim, reference, control_kind, alternative, ci_level, ci_method)
    weights, data_test, ci_f, ci_r = _tests(
        units, fraction, n_bootstrap, n_test_resamples, seed, min_resampling_units, settings
    )
    rows = _metric_rows(
        units,
        control,
        exact,
        float(p_paper),
        ci_f,
        ci_r,
        weights,
        data_test,
        rank,
        dim,
        oracle_fraction,
        reference,
        control_kind,
        group_ids is not None,
        ci_level,
        draws.size if control.source != "closed form" else 0,
    )
    return EnergyAnalysis(
        metrics=tuple(rows),
        p_value=float(exact.p_value),
        p_value_paper=float(p_paper),
        data_test=data_test,
        n_null=int(exact.n_draws),
        n_controls=int(draws.size),
        n_sequences=int(p.size),
        n_clusters=units.n,
        rank=int(rank),
        dim=int(dim),
        n_bootstrap=int(n_bootstrap),
        ci_level=float(ci_level),
        alternative=alternative,
        seed=int(seed),
        note=exact.note,
        fallback=exact.fallback,
        m_eff=el_effective_size(units.proxy, _test_reference(units, rank, dim, reference)),
    )


def _test_reference(units: _Units, rank: int, dim: int, reference: str) -> np.ndarray:
    """The data test's denominators: ``k/d·t`` (the closed-form kinds share one test: haar ratio 1
    ⟺ normal ratio 1) or the drawn controls' energies."""
    return rank / dim * units.total if reference == "expected" else units.reference


def _checked_energies(proxy_energy, total_energy, reference_energy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`analyze_energy`'s per-sequence energies as ``(S,)`` arrays, validated once (the core
    never re-checks them)."""
    p = as_1d_float(proxy_energy, "proxy_energy")
    t = as_1d_float(total_energy, "total_energy")
    e = as_1d_float(reference_energy, "reference_energy")
    s = p.size
    if t.size != s or e.size != s:
        raise ValueError(
            f"proxy, total and reference energies must have the same shape (S,); got {p.shape}, {t.shape}, {e.shape}"
        )
    if s < 2:
        raise ValueError(f"need at least 2 sequences, got S={s}")
    if (p < 0).any() or (t < 0).any() or (e < 0).any():
        raise ValueError("energies must be non-negative")
    if not t.sum() > 0:
        raise ValueError("total_energy sums to zero")
    return p, t, e


def _checked_null(null_fractions, exact) -> np.ndarray:
    """The Haar null draws as a flat array (empty when absent), required unless ``exact`` is given."""
    null = np.empty(0) if null_fractions is None else np.asarray(null_fractions, dtype=np.float64).ravel()
    if exact is None and (null.size < 1 or not np.isfinite(null).all()):
        raise ValueError("null_fractions must be a non-empty array of finite values (or give `exact`)")
    return null


def _check_settings(rank, dim, alternative, ci_level, n_bootstrap, min_resampling_units, ci_method, reference) -> None:
    """Check :func:`analyze_energy`'s scalar settings."""
    check_positive_int(rank, "rank")
    check_positive_int(dim, "dim")
    check_alternative(alternative)
    check_ci_level(ci_level)
    check_positive_int(n_bootstrap, "n_bootstrap", 2)
    check_positive_int(min_resampling_units, "min_resampling_units", 2)
    check_choice("ci_method", ci_method, CI_METHODS)
    check_choice("reference", reference, REFERENCES)


def _exact_tests(observed, null, exact, paper, n_paper_controls, alternative) -> tuple[ExactTestResult, float]:
    """The exact test (given, or the Monte-Carlo p against ``null``) and the paper's p against the
    first ``n_paper_controls`` of ``paper`` (NaN without them)."""
    if exact is None:
        exact = ExactTestResult(p_value=monte_carlo_pvalue(observed, null, alternative), n_draws=int(null.size))
    p_paper = (
        monte_carlo_pvalue(observed, paper[:n_paper_controls], alternative)
        if n_paper_controls and paper.size
        else np.nan
    )
    return exact, p_paper


def _tests(
    units: _Units, fraction, n_bootstrap, n_test_resamples, seed, min_resampling_units, settings
) -> tuple[np.ndarray | None, StudentizedTest, BootstrapResult, BootstrapResult]:
    """The bootstrap weights (None when withheld), the data test and the fraction and ratio CIs:
    resampled with enough units, else withheld with the reason in their notes."""
    rank, dim, reference, control_kind, alternative, ci_level, ci_method = settings
    if units.n < min_resampling_units:
        return (None, *_withheld_tests(units, fraction, min_resampling_units, alternative, ci_level))
    weights = bootstrap_weights(units.n, max(n_bootstrap, n_test_resamples or 0), seed)
    return (
        weights,
        *_resampled_tests(units, weights, rank, dim, reference, control_kind, alternative, ci_level, ci_method),
    )


def _resampled_tests(
    units: _Units, weights, rank, dim, reference, control_kind, alternative, ci_level, ci_method
) -> tuple[StudentizedTest, BootstrapResult, BootstrapResult]:
    """The data test and the fraction and ratio CIs over the bootstrap ``weights``, each CI
    clipped to its parameter's range."""
    data_test = studentized_ratio_test(
        units.proxy,
        _test_reference(units, rank, dim, reference),
        weights,
        alternative=alternative,
        expand_units=units.n,
    )
    ci_f, ci_r = _ratio_intervals(units, weights, ci_level, ci_method)
    ci_f = _clipped(ci_f, 0.0, 1.0, "energy fraction")
    haar_bound = reference == "expected" and control_kind == vocab.HAAR
    ci_r = _clipped(ci_r, 0.0, dim / rank if haar_bound else np.inf, "energy ratio")
    return data_test, ci_f, ci_r


def _withheld_tests(
    units: _Units, fraction, min_resampling_units, alternative, ci_level
) -> tuple[StudentizedTest, BootstrapResult, BootstrapResult]:
    """Too few resampling units: the data test and both intervals NaN, the reason in their notes."""
    why = (
        f"intervals, their SEs and the data test withheld: {units.n} {units.name}, fewer than the "
        f"{min_resampling_units} resampling units they need"
    )
    data_test = StudentizedTest(
        statistic=np.nan,
        p_value=np.nan,
        p_raw=np.nan,
        n_resamples=0,
        alternative=alternative,
        note=why,
        fallback=WITHHELD_FEW_UNITS,
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = units.proxy.sum() / units.reference.sum()
    ci_f, ci_r = (
        BootstrapResult(
            estimate=float(estimate),
            ci_low=np.nan,
            ci_high=np.nan,
            method="none",
            note=why,
            se=np.nan,
            n_resamples=0,
            ci_level=ci_level,
            fallback=WITHHELD_FEW_UNITS,
        )
        for estimate in (fraction, ratio)
    )
    return data_test, ci_f, ci_r


def _resampling_units(p, t, e, group_ids) -> _Units:
    """Documents (sums per document) or sequences: sums are additive, so a ratio of sums is
    unchanged by the grouping."""
    sums, n_units = cluster_sums(np.stack([p, t, e], axis=1), group_ids)
    name = "documents" if group_ids is not None else "sequences"
    if n_units < 2:
        raise ValueError(f"need at least 2 resampling units, got {n_units} {name}")
    return _Units(proxy=sums[:, 0], total=sums[:, 1], reference=sums[:, 2], name=name)


def _clipped(interval: BootstrapResult, low: float, high: float, what: str) -> BootstrapResult:
    """The interval clipped to its parameter's range ``[low, high]``, with a note when it moved
    (the true value lies in the range, so clipping never lowers coverage)."""
    lo, hi = (float(np.clip(x, low, high)) for x in (interval.ci_low, interval.ci_high))
    if (lo == interval.ci_low or np.isnan(lo)) and (hi == interval.ci_high or np.isnan(hi)):
        return interval
    return replace(
        interval,
        ci_low=lo,
        ci_high=hi,
        note=_join(interval.note, f"CI clipped to the {what}'s range [{low:g}, {high:g}]"),
        fallback=join_fallbacks(interval.fallback, CI_CLIPPED),
    )


def _ratio_intervals(units: _Units, weights, ci_level, ci_method) -> tuple[BootstrapResult, BootstrapResult]:
    """Bootstrap CIs of the energy fraction Σp/Σt and the energy ratio Σp/Σe over the units."""
    out = []
    for numerator, denominator in ((units.proxy, units.total), (units.proxy, units.reference)):
        with np.errstate(invalid="ignore", divide="ignore"):
            estimate = numerator.sum() / denominator.sum()
            replicates = (weights @ numerator) / (weights @ denominator)
            # leave-one-out sums in O(n) memory (an n × n jackknife matrix is 4.6 GB at 24,000 documents)
            jack = (numerator.sum() - numerator) / (denominator.sum() - denominator)
        interval = INTERVALS[ci_method]
        out.append(interval(numerator, denominator, estimate, replicates, jack, weights, ci_level, ci_method))
    return out[0], out[1]


def _replicate_interval(
    numerator, denominator, estimate, replicates, jack, weights, ci_level, method
) -> BootstrapResult:
    """:func:`ci_from_replicates`' interval of the replicates (``bca``, ``percentile``)."""
    return ci_from_replicates(estimate, replicates, jack, ci_level, method)


def _studentized_interval(numerator, denominator, estimate, replicates, jack, weights, ci_level, method):
    """The bootstrap-t on the log scale with the delta-method SE, tails expanded for few units."""
    return ci_from_replicates(
        estimate,
        replicates,
        jack,
        ci_level,
        method,
        se=float(ratio_se(np.ones((1, numerator.size)), numerator, denominator)[0]),
        replicate_se=ratio_se(weights, numerator, denominator),
        log_scale=True,
        expand_units=numerator.size,
    )


def _ratio_method_interval(numerator, denominator, estimate, replicates, jack, weights, ci_level, method):
    """A :func:`ratio_interval` of ``Σ numerator/Σ denominator`` as a :class:`BootstrapResult` (the
    replicates' SD and bias beside it), tails expanded for the number of units."""
    interval = ratio_interval(numerator, denominator, method, weights, ci_level, expand_units=numerator.size)
    finite = replicates[np.isfinite(replicates)]
    return BootstrapResult(
        estimate=float(estimate),
        ci_low=float(interval.ci_low),
        ci_high=float(interval.ci_high),
        method=method,
        note=interval.note,
        se=float(finite.std(ddof=1)) if finite.size > 1 else np.nan,
        n_resamples=int(replicates.size),
        ci_level=ci_level,
        bias=float(finite.mean() - estimate) if finite.size else np.nan,
        fallback=interval.fallback,
    )


#: The interval of each of :data:`CI_METHODS`, by name: ``(numerator, denominator, θ̂, θ*, jackknife,
#: W, level, method) -> BootstrapResult``; every ratio interval of :mod:`.ratio_intervals` is one.
INTERVALS: dict[str, Callable[..., BootstrapResult]] = {
    vocab.BCA: _replicate_interval,
    vocab.PERCENTILE: _replicate_interval,
    vocab.STUDENTIZED: _studentized_interval,
    **dict.fromkeys(RATIO_CI_METHODS, _ratio_method_interval),
}


def _metric_rows(
    units: _Units,
    control: ControlMoments,
    exact: ExactTestResult,
    p_paper: float,
    ci_f: BootstrapResult,
    ci_r: BootstrapResult,
    weights,
    data_test,
    rank,
    dim,
    oracle_fraction,
    reference,
    control_kind,
    by_document,
    ci_level,
    n_drawn,
) -> list[MetricResult]:
    """The six metric rows; every ``se`` is its interval's implied SE on its own row's scale
    (:mod:`.interval_se`; delta method for the transforms)."""
    contribution = units.proxy - units.reference
    fraction, ratio = ci_f.estimate, ci_r.estimate
    se_f, se_r = (
        interval_implied_se(
            ci.estimate,
            ci.ci_low,
            ci.ci_high,
            ci_level,
            log_scale=interval_log_scale(ci.method),
            unbounded=CI_UNBOUNDED in ci.fallback.split(";"),
        )
        for ci in (ci_f, ci_r)
    )
    mean, sd = control.mean, control.sd
    reference_fraction = units.reference.sum() / units.total.sum()
    units_note = f"{units.n} {units.name} resampled"
    if by_document and units.n < 20:
        units_note += " (few documents: CIs may undercover)"
    kind_note = (
        f"expected {control_kind}-control energy (closed form)"
        if reference == "expected"
        else f"mean of the {n_drawn} drawn {control_kind} controls (conditional on the draw)"
    )
    moments_note = f"control mean and sd: {control.source}"
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (fraction - mean) / sd if sd > 0 else np.nan
    z_note = f"z undefined: the {control_kind} control's sd is 0 (one possible control)" if sd == 0 else ""
    fraction_note = _fraction_note(ci_f, moments_note, oracle_fraction)

    def row(metric, estimate, control_mean, control_sd, lo, hi, ci, note, se):
        # every energy row shares the exact test and carries z as its effect size
        return MetricResult(
            metric=metric,
            estimate=float(estimate),
            control_mean=float(control_mean),
            control_sd=float(control_sd),
            ci_low=float(lo),
            ci_high=float(hi),
            ci_method=ci.method,
            note=_join(note, units_note, ci.note, exact.note, z_note, se_note(se)),
            p_value=float(exact.p_value),
            p_test=EXACT_TEST,
            p_value_paper=float(p_paper),
            effect_size=float(z),
            effect_size_kind="z",
            se=float(se),
            fallback=join_fallbacks(ci.fallback, exact.fallback, ZERO_CONTROL_SD if sd == 0 else ""),
        )

    rows = [
        row("energy_fraction", fraction, mean, sd, ci_f.ci_low, ci_f.ci_high, ci_f, fraction_note, se_f),
        *_ratio_rows(row, ratio, ci_r, se_r, mean, sd, reference_fraction, kind_note, moments_note),
        _z_row(row, fraction, mean, sd, ci_f, se_f, control_kind, control.source),
        _hedges_row(units, weights, contribution, data_test, ci_level, kind_note, units_note),
    ]
    rows.append(_capture_row(row, fraction, mean, sd, ci_f, se_f, rank, dim, oracle_fraction, exact, p_paper, z))
    return rows


def _fraction_note(ci_f: BootstrapResult, moments_note: str, oracle_fraction) -> str:
    """The energy-fraction row's note, flagging an upper bound past the sample oracle fraction."""
    fraction_note = f"CI of E[Σ‖Uᵀg‖²]/E[Σ‖g‖²] for this proxy; {moments_note}"
    if oracle_fraction is not None and np.isfinite(oracle_fraction) and ci_f.ci_high > oracle_fraction:
        fraction_note = _join(
            fraction_note,
            f"upper bound {ci_f.ci_high:.4g} passes the sample oracle fraction "
            f"E*_k = {oracle_fraction:.4g}, which only estimates the population "
            "ceiling (not clipped there)",
        )
    return fraction_note


def _ratio_rows(row, ratio, ci_r, se_r, mean, sd, reference_fraction, kind_note, moments_note) -> list[MetricResult]:
    """The energy-ratio row and its log2 row; the controls' ratio moments are the fraction's
    divided by the reference fraction, their log2 moments by the delta method."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_mean, ratio_sd = mean / reference_fraction, sd / reference_fraction
        log2 = float(np.log2(ratio)) if ratio > 0 else np.nan
        log2_lo = float(np.log2(ci_r.ci_low)) if ci_r.ci_low > 0 else np.nan
        log2_hi = float(np.log2(ci_r.ci_high)) if ci_r.ci_high > 0 else np.nan
        # the controls' log2 ratio by the delta method (second order for the mean)
        log2_mean = np.log2(ratio_mean) - ratio_sd**2 / (2.0 * ratio_mean**2 * np.log(2.0))
        log2_sd = ratio_sd / (ratio_mean * np.log(2.0))
    return [
        row(
            "energy_ratio",
            ratio,
            ratio_mean,
            ratio_sd,
            ci_r.ci_low,
            ci_r.ci_high,
            ci_r,
            f"ratio to the {kind_note}; its CI is over data for this proxy, not a test against "
            f"random subspaces (that is p_value); {moments_note}",
            se_r,
        ),
        row(
            "log2_energy_ratio",
            log2,
            log2_mean,
            log2_sd,
            log2_lo,
            log2_hi,
            ci_r,
            "CI = log2 of the ratio CI; se by the delta method; control mean and sd by the delta method",
            se_r / (ratio * np.log(2.0)) if ratio > 0 else np.nan,
        ),
    ]


def _z_row(row, fraction, mean, sd, ci_f, se_f, control_kind, control_source) -> MetricResult:
    """z of the fraction against the controls' mean and sd; its CI maps the fraction CI."""
    with np.errstate(invalid="ignore", divide="ignore"):
        z_scale = 1.0 / sd if sd > 0 else np.nan
    return row(
        "z",
        (fraction - mean) * z_scale,
        0.0 if sd > 0 else np.nan,
        1.0 if sd > 0 else np.nan,
        (ci_f.ci_low - mean) * z_scale,
        (ci_f.ci_high - mean) * z_scale,
        ci_f,
        f"z against the {control_kind} controls' mean and sd ({control_source}); CI maps the fraction CI with "
        "them held fixed",
        se_f * z_scale,
    )


def _hedges_row(
    units: _Units, weights, contribution, data_test: StudentizedTest, ci_level, kind_note, units_note
) -> MetricResult:
    """Hedges' g of the per-unit contributions Σp − Σe, with a BCa CI and the data test."""
    ones = np.ones((1, units.n))
    g = float(_hedges_g(ones, contribution)[0]) if units.n > 2 else np.nan
    if weights is None:  # too few units: withheld (the reason is the data test's note)
        return MetricResult(
            metric="hedges_g",
            estimate=g,
            control_mean=np.nan,
            control_sd=np.nan,
            ci_low=np.nan,
            ci_high=np.nan,
            ci_method="none",
            note=_join(
                f"standardized mean of per-unit contributions Σp − Σe ({kind_note})", units_note, data_test.note
            ),
            p_value=np.nan,
            p_test=DATA_TEST,
            p_value_paper=np.nan,
            effect_size=g,
            effect_size_kind="hedges_g",
            se=np.nan,
            fallback=data_test.fallback,
        )
    if units.n > 3:
        interval = ci_from_replicates(
            g, _hedges_g(weights, contribution), _leave_one_out_hedges_g(contribution), ci_level, vocab.BCA
        )
    else:
        interval = BootstrapResult(
            estimate=g,
            ci_low=np.nan,
            ci_high=np.nan,
            method="none",
            note="too few resampling units for a CI of g",
            se=np.nan,
            n_resamples=0,
            ci_level=ci_level,
            fallback=NO_INTERVAL,
        )
    hedges_se = interval_implied_se(
        g, interval.ci_low, interval.ci_high, ci_level, log_scale=False, unbounded=CI_UNBOUNDED in interval.fallback
    )
    test_note = (
        "p: studentized bootstrap test of population ratio 1 (log scale, the energy ratio interval's "
        f"pivot, {data_test.n_resamples} resamples, tails expanded for {units.n} units)"
    )
    return MetricResult(
        metric="hedges_g",
        estimate=g,
        control_mean=np.nan,
        control_sd=np.nan,
        ci_low=interval.ci_low,
        ci_high=interval.ci_high,
        ci_method=interval.method,
        note=_join(
            f"standardized mean of per-unit contributions Σp − Σe ({kind_note})",
            units_note,
            interval.note,
            test_note,
            data_test.note,
            se_note(hedges_se),
        ),
        p_value=float(data_test.p_value),
        p_test=DATA_TEST,
        p_value_paper=np.nan,
        effect_size=g,
        effect_size_kind="hedges_g",
        se=hedges_se,
        fallback=join_fallbacks(interval.fallback, data_test.fallback),
    )


def _capture_row(row, fraction, mean, sd, ci_f, se_f, rank, dim, oracle_fraction, exact, p_paper, z) -> MetricResult:
    """Anisotropy capture ``(E − k/d)/(E*_k − k/d)``: an affine map of the fraction (and its CI,
    clipped to the metric's range ``[capture(0), 1]``), the oracle held fixed."""
    base = rank / dim
    if oracle_fraction is None or not np.isfinite(oracle_fraction) or not oracle_fraction > base:
        why = (
            "no oracle fraction given"
            if oracle_fraction is None or not np.isfinite(oracle_fraction)
            else f"oracle fraction {oracle_fraction:.4g} <= k/d; capture undefined"
        )
        return MetricResult(
            metric="anisotropy_capture",
            estimate=np.nan,
            control_mean=np.nan,
            control_sd=np.nan,
            ci_low=np.nan,
            ci_high=np.nan,
            ci_method="none",
            note=why,
            p_value=float(exact.p_value),
            p_test=EXACT_TEST,
            p_value_paper=float(p_paper),
            effect_size=float(z),
            effect_size_kind="z",
            fallback=join_fallbacks(CAPTURE_UNDEFINED, exact.fallback),
        )
    span = oracle_fraction - base

    def capture(x):
        return anisotropy_capture(x, rank, dim, oracle_fraction)

    low_bound = capture(0.0)
    lo = float(np.clip(capture(ci_f.ci_low), low_bound, 1.0))
    hi = float(np.clip(capture(ci_f.ci_high), low_bound, 1.0))
    return row(
        "anisotropy_capture",
        capture(fraction),
        capture(mean),
        sd / span,
        lo,
        hi,
        ci_f,
        "CI = affine map of the fraction CI with the oracle held fixed, clipped to [capture(0), 1]",
        se_f / span,
    )


@dataclass(frozen=True, kw_only=True)
class ControlComparison:
    """Result of :func:`analyze_metric_vs_controls`.

    Attributes
    ----------
    observed : float
        The proxy's value.
    control_mean : float
        Mean of the finite control values.
    control_sd : float
        Their sd (ddof=1).
    z : float
        ``(observed − mean) / sd`` (NaN for a zero sd).
    p_value : float
        Monte-Carlo p against the null values (or the control values).
    n_controls : int
        The values behind ``p_value``.
    alternative : {"greater", "less", "two-sided"}
        The tail tested.
    p_value_paper : float
        Monte-Carlo p against the first ``n_paper_controls`` control values (NaN: none asked).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> c = stats.analyze_metric_vs_controls(0.9, [0.5, 0.6, 0.55, 0.58])
    >>> type(c).__name__, round(c.z, 3), c.n_controls
    ('ControlComparison', 7.875, 4)
    """

    observed: float
    control_mean: float
    control_sd: float
    z: float
    p_value: float
    n_controls: int
    alternative: str
    p_value_paper: float = np.nan


def analyze_metric_vs_controls(
    observed: float,
    control_values,
    alternative: str = "greater",
    *,
    null_values=None,
    n_paper_controls: int | None = None,
) -> ControlComparison:
    """Compare a one-value-per-basis metric (e.g. ΔIsoScore*) with random subspaces.

    Parameters
    ----------
    observed : float
        The metric for the proxy.
    control_values : array_like of shape (n,)
        The metric for the controls; their mean, sd (ddof=1, NaN dropped) and
        ``z = (observed − mean) / sd`` describe them.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        The tail tested (:func:`monte_carlo_pvalue`).
    null_values : array_like of shape (n_null,), optional
        Haar draws: ``p_value`` against them is exact under a random proxy; default: the
        control values.
    n_paper_controls : int, optional
        ``p_value_paper`` is against the first ``n_paper_controls`` control values.

    Returns
    -------
    ControlComparison
        The control moments, ``z`` and both p-values.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> c = stats.analyze_metric_vs_controls(0.9, [0.5, 0.6, 0.55, 0.58], alternative='greater')
    >>> round(c.z, 3), c.p_value
    (7.875, 0.2)
    """
    check_alternative(alternative)
    cv = np.asarray(control_values, dtype=np.float64).ravel()
    fin = cv[np.isfinite(cv)]
    mean = float(fin.mean()) if fin.size else np.nan
    sd = float(fin.std(ddof=1)) if fin.size > 1 else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (float(observed) - mean) / sd if sd > 0 else np.nan
    reference = cv if null_values is None else np.asarray(null_values, dtype=np.float64).ravel()
    p = monte_carlo_pvalue(float(observed), reference, alternative) if reference.size else np.nan
    paper = (
        monte_carlo_pvalue(float(observed), cv[:n_paper_controls], alternative)
        if n_paper_controls and cv.size
        else np.nan
    )
    return ControlComparison(
        observed=float(observed),
        control_mean=mean,
        control_sd=sd,
        z=float(z),
        p_value=float(p),
        n_controls=int(reference.size),
        alternative=alternative,
        p_value_paper=float(paper),
    )
