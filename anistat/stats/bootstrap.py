"""Sequence (cluster) bootstrap, vectorised over a weights matrix.

Sequences are the sampling unit (tokens inside a sequence are dependent), so a bootstrap
resample is a vector ``w in N^S`` of sequence multiplicities with ``sum(w) = S`` drawn
``Multinomial(S, 1/S, ..., 1/S)``. Every statistic is a function of a weights matrix
``W (B, S) -> (B,)``; for sums-based statistics that is a matrix product, e.g. the energy
fraction ``(W @ proxy_energy) / (W @ total_energy)``. The point estimate uses
``W = ones((1, S))`` and the BCa jackknife the leave-one-out rows ``W = ones - eye``.

Hierarchical resampling (``group_ids``, e.g. sequences within documents): resample the
``G`` groups with replacement, then, for each drawn copy of a group with ``n_g`` sequences,
resample ``n_g`` sequences with replacement inside it. The jackknife then leaves one *group*
out.

Confidence intervals (two-sided, level ``1 - alpha``):

* ``percentile``: the ``alpha/2`` and ``1 - alpha/2`` quantiles of the ``B`` replicates
  (linear interpolation, ``numpy.quantile``'s default).
* ``basic`` (Davison & Hinkley 1997, eq. 5.6): ``[2 theta - q_{1-alpha/2}, 2 theta -
  q_{alpha/2}]``, the percentile interval reflected about the estimate, so a bootstrap bias
  ``mean(theta*) - theta`` is subtracted rather than added. Used where the bootstrap
  distribution is visibly off-centre and BCa would need extreme quantiles (the correlation of
  per-type centroid distances with frequency, see ``anistat.analyze``).
* ``normal`` (the standard bootstrap interval, Efron & Tibshirani 1993 §13.2):
  ``theta ± z_{1-alpha/2} se*`` with ``se*`` the standard deviation of the replicates. No
  bias correction: used where the bootstrap's own estimate of the bias is unreliable — the
  rank correlation of per-type spreads with frequency, whose resampled bias tracks the
  sample's error rather than the estimator's (``benchmarks/bench_frequency.py``: basic and BCa
  over-correct and cover 0.89–0.91 at 100–300 sequences, this interval 0.94–0.95).
* ``bca`` (Efron 1987): bias correction ``z0 = Phi^-1(p0)`` with ``p0`` the mid-rank share of
  replicates below the estimate ``(#{theta* < theta} + #{theta* <= theta}) / 2B``; acceleration
  ``a = sum(m - theta_(i))^3 / (6 (sum(m - theta_(i))^2)^1.5)`` from the jackknife values
  ``theta_(i)`` (mean ``m``); endpoints are the replicate quantiles at
  ``Phi(z0 + (z0 + z_q) / (1 - a (z0 + z_q)))`` for ``z_q = Phi^-1(alpha/2), Phi^-1(1-alpha/2)``.
  These are the conventions of ``scipy.stats.bootstrap(method="BCa")``.
* ``studentized`` (bootstrap-t, equal-tailed; Davison & Hinkley 1997, eq. 5.7): with a
  standard error ``se`` of the estimate and ``se*_b`` of every replicate (same formula, e.g.
  the delta-method SE of a ratio of sums, :func:`ratio_se`), ``t*_b = (theta*_b - theta) /
  se*_b`` and the interval is ``[theta - q_{1-alpha/2}(t*) se, theta - q_{alpha/2}(t*) se]``.
  Second-order accurate like BCa, but it also captures the correlation between an estimate
  and its own SE, which dominates the coverage error of ratio-of-sums estimators over
  sequences with heavy-tailed energies (BCa / percentile undercover there; see the P3 section
  of ``benchmarks/README.md``). Replicates with a non-finite ``t*`` (``se*_b = 0``) are dropped
  and counted in ``note``; without a finite positive ``se`` it falls back to ``percentile``.

Where BCa is undefined (fewer than 3 jackknife units, all replicates equal, ``p0`` in {0, 1}
so ``z0`` is infinite, acceleration NaN because the jackknife values are all equal,
non-finite adjusted levels, or an adjusted level whose tail holds less than one replicate, so
the endpoint would be the most extreme replicate — the condition under which R's ``boot``
warns "extreme order statistics used as endpoints") the interval falls back to
``percentile`` and the reason is put in ``BootstrapResult.note``; ``method`` then reads
``"percentile"``.

Weights are generated in fixed blocks of ``_BLOCK`` resamples from one seeded generator, so the
result depends on ``(seed, n_sequences, n_resamples, group_ids)`` only, never on the chunk size
used to stream them (memory is ``O(chunk * S)``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import t as student_t

from .. import vocabulary as vocab
from ._validation import DegenerateStatisticWarning, check_alternative, check_choice, check_ci_level, check_positive_int
from .fallbacks import CI_METHOD_FALLBACK, NO_DATA_TEST, NO_INTERVAL, RESAMPLES_DROPPED, join_fallbacks

_BLOCK = 256
#: The confidence-interval methods of :func:`ci_from_replicates` (module docstring).
METHODS = (vocab.BCA, vocab.PERCENTILE, vocab.STUDENTIZED, vocab.BASIC, vocab.NORMAL_INTERVAL)
#: The methods of :func:`sequence_bootstrap_columns`: all but ``studentized``, which needs a
#: standard error per statistic.
COLUMN_METHODS = tuple(method for method in METHODS if method != vocab.STUDENTIZED)
#: The intervals BCa may fall back to where it is undefined.
BCA_FALLBACKS = (vocab.PERCENTILE, vocab.BASIC)


@dataclass(frozen=True, kw_only=True)
class BootstrapResult:
    """A bootstrap confidence interval.

    Attributes
    ----------
    estimate : float
        The statistic on the full data.
    ci_low : float
        Lower end of the interval.
    ci_high : float
        Upper end of the interval.
    method : {"bca", "percentile", "studentized", "basic", "normal", "none"}
        The method actually used: one of :data:`METHODS`, the fallback where the requested one
        was undefined, or ``"none"`` when no interval exists.
    note : str
        Empty, or why the requested method was not used / what was dropped.
    se : float
        The standard deviation of the replicates.
    n_resamples : int
        The number of bootstrap replicates.
    ci_level : float
        Coverage of the interval.
    bias : float
        The bootstrap bias estimate ``mean(replicates) - estimate``.
    fallback : str
        Empty, or the :data:`anistat.stats.FALLBACK_CODES` behind ``note`` (``";"``-joined):
        ``ci_method_fallback``, ``no_interval``, ``resamples_dropped``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(1.0, 1.0, 30)
    >>> r = stats.sequence_bootstrap(lambda w: (w @ x) / w.sum(1), 30, n_resamples=500, seed=2, method='percentile')
    >>> r.method, r.n_resamples, r.ci_low < r.estimate < r.ci_high
    ('percentile', 500, True)
    """

    estimate: float
    ci_low: float
    ci_high: float
    method: str
    note: str
    se: float
    n_resamples: int
    ci_level: float = 0.95
    bias: float = float("nan")
    fallback: str = ""

    @property
    def bias_in_se(self) -> float | None:
        """``bias / se`` (None when either is undefined or se is 0)."""
        if not (np.isfinite(self.bias) and np.isfinite(self.se) and self.se > 0):
            return None
        return float(self.bias / self.se)


def _group_codes(group_ids, n_sequences: int) -> np.ndarray | None:
    if group_ids is None:
        return None
    g = np.asarray(group_ids)
    if g.shape != (n_sequences,):
        raise ValueError(f"group_ids must have shape ({n_sequences},), got {g.shape}")
    _, codes = np.unique(g, return_inverse=True)
    return codes.astype(np.int64)


def _uniform_counts(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """``(b, n)``: each row the multiplicities of ``n`` draws with replacement from ``n`` items
    (``Multinomial(n, uniform)``), counted for all rows at once with one ``bincount``."""
    idx = rng.integers(0, n, size=(b, n))
    idx += (np.arange(b, dtype=np.int64) * n)[:, None]  # row r counts into bins r·n … r·n + n − 1
    return np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)


def _block(rng: np.random.Generator, n_sequences: int, b: int, codes, members) -> np.ndarray:
    if codes is None:
        return _uniform_counts(rng, b, n_sequences)
    gcount = _uniform_counts(rng, b, len(members))
    w = np.zeros((b, n_sequences), dtype=np.int64)
    for g, mem in enumerate(members):
        ng = mem.size
        if ng == 1:
            w[:, mem[0]] = gcount[:, g]
        else:
            w[:, mem] = rng.multinomial(gcount[:, g] * ng, np.full(ng, 1.0 / ng))
    return w


def iter_bootstrap_weights(
    n_sequences: int, n_resamples: int, seed: int = 0, group_ids=None, chunk_size: int = _BLOCK, dtype=np.float64
) -> Iterator[np.ndarray]:
    """Yield the bootstrap weights matrix in row chunks of at most ``chunk_size`` rows.

    The chunks stacked are :func:`bootstrap_weights` with the same arguments.

    Parameters
    ----------
    n_sequences : int
        The number of sequences ``S``.
    n_resamples : int
        The number of resamples ``B``.
    seed : int, default 0
        Seed of the resampling.
    group_ids : array_like of shape (S,), optional
        A group label per sequence (e.g. its document): whole groups are resampled, then
        sequences within each drawn group (hierarchical counts); None: sequences are the unit.
    chunk_size : int, default 256
        The most rows per chunk.
    dtype : numpy dtype, default numpy.float64
        The chunks' dtype.

    Returns
    -------
    Iterator[ndarray of shape (b, S)]
        Chunks of multiplicities, ``b <= chunk_size`` rows each, ``B`` rows in all.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> blocks = list(stats.iter_bootstrap_weights(5, 600, seed=0, chunk_size=256))
    >>> [b.shape for b in blocks]
    [(256, 5), (256, 5), (88, 5)]
    >>> bool((np.vstack(blocks) == stats.bootstrap_weights(5, 600, seed=0)).all())
    True
    """
    s = check_positive_int(n_sequences, "n_sequences")
    b_total = check_positive_int(n_resamples, "n_resamples")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    codes = _group_codes(group_ids, s)
    members = None if codes is None else [np.flatnonzero(codes == g) for g in range(codes.max() + 1)]
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xB007]))
    pending: list[np.ndarray] = []
    n_pending = 0
    done = 0
    while done < b_total:
        b = min(_BLOCK, b_total - done)
        pending.append(_block(rng, s, b, codes, members))
        n_pending += b
        done += b
        while n_pending >= chunk_size or (done == b_total and n_pending):
            stack = np.concatenate(pending) if len(pending) > 1 else pending[0]
            out, rest = stack[:chunk_size], stack[chunk_size:]
            yield out.astype(dtype, copy=False)
            pending = [rest] if rest.shape[0] else []
            n_pending = rest.shape[0]


@lru_cache(maxsize=8)
def _cached_weights(n_sequences: int, n_resamples: int, seed: int, codes_key, dtype_str: str):
    codes = None if codes_key is None else np.frombuffer(codes_key, dtype=np.int64)
    w = np.concatenate(
        list(iter_bootstrap_weights(n_sequences, n_resamples, seed, codes, chunk_size=max(n_resamples, 1)))
    )
    w = w.astype(np.dtype(dtype_str))
    w.setflags(write=False)
    return w


def bootstrap_weights(
    n_sequences: int, n_resamples: int, seed: int = 0, group_ids=None, dtype=np.float64
) -> np.ndarray:
    """The ``(B, S)`` matrix of sequence multiplicities (read-only, cached per arguments).

    Rows are ``Multinomial(S, uniform)`` counts (or hierarchical counts with ``group_ids``).

    Parameters
    ----------
    n_sequences : int
        The number of sequences ``S``.
    n_resamples : int
        The number of resamples ``B``.
    seed : int, default 0
        Seed of the resampling.
    group_ids : array_like of shape (S,), optional
        A group label per sequence (e.g. its document): whole groups are resampled, then
        sequences within each drawn group (hierarchical counts); None: sequences are the unit.
    dtype : numpy dtype, default numpy.float64
        The matrix's dtype.

    Returns
    -------
    ndarray of shape (B, S)
        Read-only multiplicities; each row sums to ``S``.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> w = stats.bootstrap_weights(5, 3, seed=0)
    >>> w.shape, w.sum(axis=1).tolist()
    ((3, 5), [5.0, 5.0, 5.0])
    """
    s = check_positive_int(n_sequences, "n_sequences")
    codes = _group_codes(group_ids, s)
    key = None if codes is None else codes.tobytes()
    return _cached_weights(s, check_positive_int(n_resamples, "n_resamples"), int(seed), key, np.dtype(dtype).str)


def jackknife_weights(n_sequences: int, group_ids=None) -> np.ndarray:
    """Leave-one-out weights: ``ones - eye`` (``(S, S)``) or leave-one-group-out ``(G, S)``.

    Parameters
    ----------
    n_sequences : int
        The number of sequences ``S``.
    group_ids : array_like of shape (S,), optional
        A group label per sequence (e.g. its document): one row leaves out each group;
        None: one row leaves out each sequence.

    Returns
    -------
    ndarray of shape (S, S) or (G, S)
        0.0 for the left-out sequences, 1.0 elsewhere.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.jackknife_weights(3).tolist()
    [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    >>> stats.jackknife_weights(4, group_ids=[0, 0, 1, 1]).tolist()
    [[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
    """
    codes = _group_codes(group_ids, n_sequences)
    if codes is None:
        return 1.0 - np.eye(n_sequences)
    return 1.0 - (codes[None, :] == np.arange(codes.max() + 1)[:, None]).astype(np.float64)


def ratio_se(weights, numerator, denominator) -> np.ndarray:
    """Delta-method (linearisation) SE of ``(W @ numerator) / (W @ denominator)`` per row of W.

    ``se_b = sqrt(n_b / (n_b - 1) * sum_s w_bs (num_s - theta_b den_s)^2) / sum_s w_bs den_s``
    with ``theta_b`` the row's ratio and ``n_b = sum_s w_bs``; the sandwich / jackknife-type SE
    of a ratio estimator. Residuals are taken around the full-data ratio first (three matrix
    products, well conditioned), so the cost is ``O(B S)``. Rows with ``n_b <= 1`` or a zero
    denominator give NaN.

    Parameters
    ----------
    weights : array_like of shape (B, S)
        Multiplicities, one resample a row (a 1-D vector is one row).
    numerator : array_like of shape (S,)
        The per-sequence numerator terms.
    denominator : array_like of shape (S,)
        The per-sequence denominator terms.

    Returns
    -------
    ndarray of shape (B,)
        ``se_b`` per row.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> num, den = np.array([2.0, 3.0, 4.0]), np.array([1.0, 1.0, 2.0])
    >>> stats.ratio_se(np.ones((1, 3)), num, den).round(4).tolist()
    [0.2864]
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    num = np.asarray(numerator, dtype=np.float64).ravel()
    den = np.asarray(denominator, dtype=np.float64).ravel()
    if num.shape != den.shape or w.shape[1] != num.size:
        raise ValueError(
            f"weights (B, S) and numerator/denominator (S,) do not match: {w.shape}, {num.shape}, {den.shape}"
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        theta0 = num.sum() / den.sum()
        e = num - theta0 * den
        sums = w @ np.stack([num, den, e * e, e * den, den * den], axis=1)
        return _ratio_se_from_sums(
            sums[:, 1], sums[:, 0] / sums[:, 1] - theta0, sums[:, 2], sums[:, 3], sums[:, 4], w.sum(axis=1)
        )


def _ratio_se_from_sums(den_sum, delta, ee, ed, dd, n):
    """SE of a ratio from resampled sums (see :func:`ratio_se`); ``delta = theta_b - theta``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rss = np.maximum(ee - 2.0 * delta * ed + delta * delta * dd, 0.0)
        return np.where(n > 1, np.sqrt(rss * n / (n - 1.0)), np.nan) / np.abs(den_sum)


def expanded_tail(tail: float, n_units: int) -> float:
    """The bootstrap tail probability ``a'`` behind a nominal one-sided tail ``a`` with Hesterberg's
    small-sample expansion (2015, "What teachers should know about the bootstrap", §5.4):
    ``z_{1−a'} = sqrt(n/(n − 1)) · t_{1−a, n−1}`` — the resampling distribution is narrower than
    the sampling one by ``sqrt((n − 1)/n)`` and a studentized statistic has ``t_{n−1}`` tails.
    ``a`` itself when ``n_units`` is None or below 3.

    Parameters
    ----------
    tail : float
        The nominal one-sided tail probability ``a``.
    n_units : int
        The number of resampling units ``n``.

    Returns
    -------
    float
        The bootstrap tail ``a'`` (smaller than ``a``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> stats.expanded_tail(0.025, 10) < 0.025
    True
    """
    if n_units is None or n_units < 3:
        return float(tail)
    n = float(n_units)
    return float(ndtr(-np.sqrt(n / (n - 1.0)) * student_t.isf(tail, n - 1.0)))


def expanded_pvalue(p_raw, n_units: int | None):
    """The nominal p-value whose expanded tail (:func:`expanded_tail`) is the bootstrap tail
    probability ``p_raw`` (the inverse map; monotone, and ``≥ p_raw`` for small p).

    Parameters
    ----------
    p_raw : float or array_like
        Bootstrap tail probabilities ``a'``.
    n_units : int or None
        The number of resampling units ``n``; None or below 3: no expansion.

    Returns
    -------
    ndarray
        The nominal p-values ``a``, of ``p_raw``'s shape (``p_raw`` itself without expansion).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> float(stats.expanded_pvalue(0.05, None)), round(float(stats.expanded_pvalue(0.05, 10)), 4)
    (0.05, 0.0765)
    """
    p_raw = np.asarray(p_raw, dtype=np.float64)
    if n_units is None or n_units < 3:
        return p_raw
    n = float(n_units)
    with np.errstate(invalid="ignore"):
        return student_t.sf(ndtri(1.0 - p_raw) / np.sqrt(n / (n - 1.0)), n - 1.0)


def ci_from_replicates(
    estimate: float,
    replicates,
    jackknife=None,
    ci_level: float = 0.95,
    method: str = vocab.BCA,
    *,
    se=None,
    replicate_se=None,
    bca_fallback: str = vocab.PERCENTILE,
    log_scale: bool = False,
    expand_units: int | None = None,
) -> BootstrapResult:
    """Confidence interval from bootstrap replicates (and jackknife values for BCa).

    Non-finite replicates are dropped (and counted in ``note``). See the module docstring for
    the formulas and the fallback rules.

    Parameters
    ----------
    estimate : float
        The statistic ``θ`` on the full data.
    replicates : array_like of shape (B,)
        The bootstrap replicates ``θ*_b``.
    jackknife : array_like of shape (J,), optional
        Leave-one-out (or leave-one-group-out) values, BCa's acceleration; needed for BCa.
    ci_level : float, default 0.95
        Coverage of the interval.
    method : {"bca", "percentile", "studentized", "basic", "normal"}, default "bca"
        The interval (one of :data:`METHODS`).
    se : float, optional
        ``method="studentized"``: the estimate's standard error.
    replicate_se : array_like of shape (B,), optional
        ``method="studentized"``: one standard error per replicate, same formula.
    bca_fallback : {"percentile", "basic"}, default "percentile"
        The interval BCa falls back to where it is undefined.
    log_scale : bool, default False
        Studentized on the log scale: the pivot is ``(log θ*_b − log θ) / (se*_b/θ*_b)`` and the
        interval ``θ·exp(−q·se/θ)`` (for positive statistics such as ratios of positive sums).
    expand_units : int, optional
        ``n``: apply the small-sample expansion of :func:`expanded_tail` to the tail levels.

    Returns
    -------
    BootstrapResult
        The interval, the method actually used and why (``note``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> replicates = rng.normal(1.0, 0.1, 1000)
    >>> r = stats.ci_from_replicates(1.0, replicates, method='percentile')
    >>> r.method, round(r.ci_low, 2), round(r.ci_high, 2)
    ('percentile', 0.81, 1.18)
    """
    ci_level = check_ci_level(ci_level)
    check_choice("method", method, METHODS)
    check_choice("bca_fallback", bca_fallback, BCA_FALLBACKS)
    theta = float(estimate)
    reps = np.asarray(replicates, dtype=np.float64).ravel()
    n_total = reps.size
    rep_se = _checked_replicate_se(method, se, replicate_se, reps.shape)
    notes: list[str] = []
    codes: list[str] = []  # fallback codes, beside the notes

    def result(low, high, used: str, spread: float, bias: float = np.nan) -> BootstrapResult:
        return BootstrapResult(
            estimate=theta,
            ci_low=float(low),
            ci_high=float(high),
            method=used,
            note="; ".join(notes),
            se=spread,
            n_resamples=n_total,
            ci_level=ci_level,
            bias=bias,
            fallback=join_fallbacks(*codes),
        )

    reps, rep_se = _finite_replicates(reps, rep_se, notes, codes)
    if reps.size == 0 or not np.isfinite(theta):
        notes.append("estimate or all resamples non-finite; no interval")
        codes.append(NO_INTERVAL)
        return result(np.nan, np.nan, "none", np.nan)
    tail = expanded_tail((1.0 - ci_level) / 2.0, expand_units)
    if expand_units is not None and expand_units >= 3:
        notes.append(f"tails expanded for {expand_units} resampling units (Hesterberg): {tail:.4f} per side")
    levels = np.array([tail, 1.0 - tail])
    se_reps = float(reps.std(ddof=1)) if reps.size > 1 else np.nan
    bias = float(reps.mean() - theta)
    used = method
    if method == vocab.STUDENTIZED:
        interval, reason = _studentized(theta, reps, rep_se, float(se), levels, log_scale, notes, codes)
        if interval is not None:
            return result(interval[0], interval[1], vocab.STUDENTIZED, se_reps, bias)
        used = vocab.PERCENTILE
        notes.append(f"studentized fell back to percentile: {reason}")
        codes.append(CI_METHOD_FALLBACK)
        warnings.warn(notes[-1], DegenerateStatisticWarning, stacklevel=2)
    if method == vocab.BCA:
        adjusted, reason = _bca_levels(theta, reps, jackknife, levels)
        if reason is None:
            levels = adjusted
        else:
            used = bca_fallback
            notes.append(f"BCa fell back to {bca_fallback}: {reason}")
            codes.append(CI_METHOD_FALLBACK)
            warnings.warn(notes[-1], DegenerateStatisticWarning, stacklevel=2)
    if used == vocab.NORMAL_INTERVAL:
        if not (np.isfinite(se_reps) and se_reps > 0):
            notes.append("normal interval undefined (replicates without spread); no interval")
            codes.append(NO_INTERVAL)
            return result(np.nan, np.nan, "none", se_reps, bias)
        half = float(ndtri(1.0 - tail)) * se_reps
        return result(theta - half, theta + half, vocab.NORMAL_INTERVAL, se_reps, bias)
    lo, hi = np.quantile(reps, levels)
    if used == vocab.BASIC:
        lo, hi = 2.0 * theta - hi, 2.0 * theta - lo
    return result(float(lo), float(hi), used, se_reps, bias)


def _checked_replicate_se(method: str, se, replicate_se, shape: tuple[int, ...]) -> np.ndarray | None:
    """The replicates' standard errors as a flat array (bootstrap-t only; None otherwise)."""
    if method != vocab.STUDENTIZED:
        return None
    if se is None or replicate_se is None:
        raise ValueError("method='studentized' needs se and replicate_se")
    rep_se = np.asarray(replicate_se, dtype=np.float64).ravel()
    if rep_se.shape != shape:
        raise ValueError(f"replicate_se must have shape {shape}, got {rep_se.shape}")
    return rep_se


def _finite_replicates(
    reps: np.ndarray, rep_se: np.ndarray | None, notes: list[str], codes: list[str]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The finite replicates (and their SEs); dropping any is said in ``notes`` and ``codes``."""
    finite = np.isfinite(reps)
    if finite.all():
        return reps, rep_se
    notes.append(f"{reps.size - int(finite.sum())} of {reps.size} resamples non-finite, dropped")
    codes.append(RESAMPLES_DROPPED)
    return reps[finite], None if rep_se is None else rep_se[finite]


def _studentized(theta, reps, rep_se, se0, levels, log_scale, notes, codes):
    """Bootstrap-t endpoints ``((lo, hi), None)``, or ``(None, reason)`` when undefined."""
    if log_scale:
        if not theta > 0:
            return None, "estimate not positive (log scale)"
        with np.errstate(invalid="ignore", divide="ignore"):
            tstar = (np.log(reps) - np.log(theta)) / (rep_se / reps)
        scale = se0 / theta
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            tstar = (reps - theta) / rep_se
        scale = se0
    ok = np.isfinite(tstar)
    if not (np.isfinite(scale) and scale > 0):
        return None, "standard error of the estimate not finite and positive"
    if ok.sum() < 2:
        return None, "fewer than 2 finite studentized resamples"
    if not ok.all():
        notes.append(f"{int((~ok).sum())} resamples with zero or non-finite SE left out of the studentized quantiles")
        codes.append(RESAMPLES_DROPPED)
    q_high, q_low = np.quantile(tstar[ok], levels[::-1])
    if log_scale:
        return (float(theta * np.exp(-q_high * scale)), float(theta * np.exp(-q_low * scale))), None
    return (float(theta - q_high * scale), float(theta - q_low * scale)), None


def _bca_levels(theta, reps, jackknife, levels):
    """BCa-adjusted quantile levels ``(levels, None)``, or ``(None, reason)`` when undefined."""
    jack = None if jackknife is None else np.asarray(jackknife, dtype=np.float64).ravel()
    if reps.min() == reps.max():
        return None, "all bootstrap resamples equal"
    if jack is None or jack.size < 3:
        return None, "too few sequences for the jackknife acceleration"
    if not np.all(np.isfinite(jack)):
        return None, "non-finite jackknife values"
    p0 = ((reps < theta).sum() + (reps <= theta).sum()) / (2.0 * reps.size)
    z0 = ndtri(p0)
    dev = jack.mean() - jack
    denom = (dev**2).sum()
    flat = np.ptp(jack) <= 1e-12 * max(1.0, float(np.abs(jack).max()))
    a = np.nan if flat or not denom > 0 else (dev**3).sum() / (6.0 * denom**1.5)
    if not np.isfinite(z0):
        return None, "bias correction infinite (estimate outside the bootstrap distribution)"
    if not np.isfinite(a):
        return None, "acceleration undefined (jackknife values all equal)"
    zq = ndtri(levels)
    adj = ndtr(z0 + (z0 + zq) / (1.0 - a * (z0 + zq)))
    if not np.all(np.isfinite(adj)):
        return None, "BCa adjusted levels non-finite"
    if min(adj.min(), 1.0 - adj.max()) * reps.size < 1.0:
        # the endpoint would be the most extreme replicate (or beyond it): the bias
        # correction / acceleration have run out of bootstrap distribution
        return None, f"BCa endpoint beyond the most extreme resample (z0 = {z0:.2f}, acceleration = {a:.3f})"
    return adj, None


@dataclass(frozen=True, kw_only=True)
class StudentizedTest:
    """A bootstrap-t test of ``H0: θ = θ0`` for a positive ratio ``θ``, the test dual to the
    studentized log-scale interval: ``statistic`` ``t = (log θ̂ − log θ0)/(se/θ̂)``; ``p_raw`` the
    bootstrap tail ``(1 + #{t*_b beyond t})/(1 + B)``; ``p_value`` its small-sample expansion
    (:func:`expanded_pvalue`).

    Attributes
    ----------
    statistic : float
        ``t = (log θ̂ − log θ0)/(se/θ̂)``.
    p_value : float
        The p-value after the small-sample expansion (NaN when there is no test).
    p_raw : float
        The bootstrap tail ``(1 + #{t*_b beyond t})/(1 + B)`` (two-sided: doubled, at most 1).
    n_resamples : int
        The resamples with a finite ``t*_b``.
    alternative : {"greater", "less", "two-sided"}
        The tail tested.
    note : str
        Empty, or why there is no test.
    fallback : str
        Empty, or the :data:`anistat.stats.FALLBACK_CODES` behind ``note`` (``no_data_test``).

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> num, den = rng.uniform(2, 3, 20), rng.uniform(1, 2, 20)
    >>> test = stats.studentized_ratio_test(num, den, stats.bootstrap_weights(20, 200, seed=1))
    >>> type(test).__name__, test.alternative, test.p_value < 0.05
    ('StudentizedTest', 'greater', True)
    """

    statistic: float
    p_value: float
    p_raw: float
    n_resamples: int
    alternative: str
    note: str = ""
    fallback: str = ""


def studentized_ratio_test(
    numerator,
    denominator,
    weights,
    *,
    null_value: float = 1.0,
    alternative: str = "greater",
    expand_units: int | None = None,
) -> StudentizedTest:
    """Bootstrap-t test that the population ratio ``E[Σ numerator] / E[Σ denominator]`` equals
    ``null_value``, on the log scale, with the delta-method SE of a ratio of sums
    (:func:`ratio_se`) for the estimate and every resample (rows of ``weights``).

    The pivot is the one :func:`ci_from_replicates` inverts for ``method="studentized",
    log_scale=True`` (same weights, same expansion), so the test rejects at level ``a``
    one-sided exactly when the one-sided ``1 − a`` bound excludes ``null_value``, up to the
    ``+1`` in the tail count. Exact for no law; its level is measured in ``anistat calibrate``.

    Parameters
    ----------
    numerator : array_like of shape (S,)
        The per-sequence numerator terms.
    denominator : array_like of shape (S,)
        The per-sequence denominator terms.
    weights : array_like of shape (B, S)
        The bootstrap multiplicities (:func:`bootstrap_weights`).
    null_value : float, default 1.0
        ``θ0``, the ratio under H0.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        ``"greater"`` counts ``t*_b >= t``, ``"less"`` ``t*_b <= t``; two-sided doubles the smaller.
    expand_units : int, optional
        ``n`` for the small-sample expansion of the p-value (:func:`expanded_pvalue`); None: none.

    Returns
    -------
    StudentizedTest
        The statistic, the raw and expanded p-values.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> num, den = rng.uniform(2, 3, 20), rng.uniform(1, 2, 20)
    >>> weights = stats.bootstrap_weights(20, 500, seed=1)
    >>> test = stats.studentized_ratio_test(num, den, weights, alternative='greater')
    >>> round(test.statistic, 3), test.p_value < 0.01
    (9.407, True)
    """
    check_alternative(alternative)
    num = np.asarray(numerator, dtype=np.float64).ravel()
    den = np.asarray(denominator, dtype=np.float64).ravel()
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    b = w.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = num.sum() / den.sum()
        se = float(ratio_se(np.ones((1, num.size)), num, den)[0])
        reps = (w @ num) / (w @ den)
        tstar = (np.log(reps) - np.log(theta)) / (ratio_se(w, num, den) / reps)
        statistic = float((np.log(theta) - np.log(null_value)) / (se / theta))
    tstar = tstar[np.isfinite(tstar)]
    if not (np.isfinite(statistic) and tstar.size):
        return StudentizedTest(
            statistic=statistic,
            p_value=np.nan,
            p_raw=np.nan,
            n_resamples=b,
            alternative=alternative,
            note="no test: the ratio or its standard error is not finite and positive",
            fallback=NO_DATA_TEST,
        )
    upper = (1.0 + np.sum(tstar >= statistic)) / (1.0 + tstar.size)
    lower = (1.0 + np.sum(tstar <= statistic)) / (1.0 + tstar.size)
    if alternative == "greater":
        raw = float(upper)
        p = float(expanded_pvalue(raw, expand_units))
    elif alternative == "less":
        raw = float(lower)
        p = float(expanded_pvalue(raw, expand_units))
    else:
        raw = float(min(1.0, 2.0 * min(upper, lower)))
        p = float(min(1.0, 2.0 * expanded_pvalue(min(upper, lower), expand_units)))
    return StudentizedTest(
        statistic=statistic, p_value=min(p, 1.0), p_raw=raw, n_resamples=int(tstar.size), alternative=alternative
    )


def _evaluate(statistic: Callable[[np.ndarray], np.ndarray], weights: np.ndarray) -> np.ndarray:
    out = np.asarray(statistic(weights), dtype=np.float64)
    if out.shape != (weights.shape[0],):
        raise ValueError(f"statistic must map W {weights.shape} to shape ({weights.shape[0]},), got {out.shape}")
    return out


def sequence_bootstrap(
    statistic: Callable[[np.ndarray], np.ndarray],
    n_sequences: int,
    n_resamples: int = 2000,
    seed: int = 0,
    ci_level: float = 0.95,
    method: str = vocab.BCA,
    group_ids=None,
    chunk_size: int = 512,
    *,
    standard_error: Callable[[np.ndarray], np.ndarray] | None = None,
) -> BootstrapResult:
    """Bootstrap CI of ``statistic`` over sequences.

    Parameters
    ----------
    statistic : callable
        Maps a weights matrix ``W (b, S)`` to ``(b,)``; called on chunks of at most
        ``chunk_size`` rows, on ``ones((1, S))`` for the estimate and (BCa only) on the
        jackknife rows (``ones - eye``, or leave-one-group-out with ``group_ids``).
    n_sequences : int
        The number of sequences ``S``.
    n_resamples : int, default 2000
        The number of resamples ``B``.
    seed : int, default 0
        Seed of the resampling (:func:`bootstrap_weights`).
    ci_level : float, default 0.95
        Coverage of the interval.
    method : {"bca", "percentile", "studentized", "basic", "normal"}, default "bca"
        The interval (:func:`ci_from_replicates`).
    group_ids : array_like of shape (S,), optional
        A group label per sequence (e.g. its document): whole groups are resampled, then
        sequences within each drawn group (hierarchical counts); None: sequences are the unit.
    chunk_size : int, default 512
        The most weight rows per call of ``statistic``.
    standard_error : callable, optional
        ``method="studentized"`` only (then required): ``W (b, S) -> (b,)``, the SE of the
        statistic under weights ``W`` (e.g. ``lambda w: ratio_se(w, num, den)``), evaluated on
        the same rows.

    Returns
    -------
    BootstrapResult
        The interval from ``n_resamples`` replicates.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(1.0, 1.0, 30)
    >>> r = stats.sequence_bootstrap(lambda w: (w @ x) / w.sum(1), 30, n_resamples=500, seed=2, method='percentile')
    >>> round(r.estimate, 4), r.ci_low < r.estimate < r.ci_high
    (0.8785, True)
    """
    s = check_positive_int(n_sequences, "n_sequences")
    check_ci_level(ci_level)
    check_choice("method", method, METHODS)
    if method == vocab.STUDENTIZED and standard_error is None:
        raise ValueError("method='studentized' needs a standard_error function")
    ones = np.ones((1, s))
    estimate = float(_evaluate(statistic, ones)[0])
    reps, rep_se = [], []
    for w in iter_bootstrap_weights(s, n_resamples, seed, group_ids, chunk_size):
        reps.append(_evaluate(statistic, w))
        if method == vocab.STUDENTIZED:
            rep_se.append(_evaluate(standard_error, w))
    reps = np.concatenate(reps)
    jack = None
    if method == vocab.BCA:
        jw = jackknife_weights(s, group_ids)
        jack = np.concatenate([_evaluate(statistic, jw[i : i + chunk_size]) for i in range(0, jw.shape[0], chunk_size)])
    if method == vocab.STUDENTIZED:
        return ci_from_replicates(
            estimate,
            reps,
            None,
            ci_level,
            method,
            se=float(_evaluate(standard_error, ones)[0]),
            replicate_se=np.concatenate(rep_se),
        )
    return ci_from_replicates(estimate, reps, jack, ci_level, method)


def sequence_bootstrap_columns(
    statistic: Callable[[np.ndarray], np.ndarray],
    n_sequences: int,
    n_resamples: int = 2000,
    seed: int = 0,
    ci_level: float = 0.95,
    method: str = vocab.BCA,
    group_ids=None,
    chunk_size: int = 512,
    bca_fallback: str = vocab.PERCENTILE,
) -> list[BootstrapResult]:
    """:func:`sequence_bootstrap` of several statistics that share one expensive step.

    Parameters
    ----------
    statistic : callable
        Maps ``W (b, S)`` to ``(b, m)``: m statistics computed from the same resample (e.g.
        Spearman and Pearson correlations of one resampled table).
    n_sequences : int
        The number of sequences ``S``.
    n_resamples : int, default 2000
        The number of resamples ``B``, the same as :func:`sequence_bootstrap` would draw.
    seed : int, default 0
        Seed of the resampling.
    ci_level : float, default 0.95
        Coverage of the intervals.
    method : {"bca", "percentile", "basic", "normal"}, default "bca"
        The interval (a studentized interval needs a standard error per statistic).
    group_ids : array_like of shape (S,), optional
        A group label per sequence (e.g. its document): whole groups are resampled, then
        sequences within each drawn group (hierarchical counts); None: sequences are the unit.
    chunk_size : int, default 512
        The most weight rows per call of ``statistic``.
    bca_fallback : {"percentile", "basic"}, default "percentile"
        The interval BCa falls back to where it is undefined.

    Returns
    -------
    list of BootstrapResult
        One interval per column of ``statistic``'s output.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(1.0, 1.0, 30)
    >>> mean_and_sq = lambda w: np.column_stack([(w @ x) / w.sum(1), (w @ x**2) / w.sum(1)])
    >>> rs = stats.sequence_bootstrap_columns(mean_and_sq, 30, n_resamples=300, seed=2, method='percentile')
    >>> len(rs), [r.method for r in rs]
    (2, ['percentile', 'percentile'])
    """
    s = check_positive_int(n_sequences, "n_sequences")
    check_ci_level(ci_level)
    check_choice("method", method, COLUMN_METHODS)
    check_choice("bca_fallback", bca_fallback, BCA_FALLBACKS)

    def evaluate(weights: np.ndarray) -> np.ndarray:
        out = np.asarray(statistic(weights), dtype=np.float64)
        if out.ndim != 2 or out.shape[0] != weights.shape[0]:
            raise ValueError(f"statistic must map W {weights.shape} to shape ({weights.shape[0]}, m), got {out.shape}")
        return out

    estimate = evaluate(np.ones((1, s)))[0]
    reps = np.concatenate([evaluate(w) for w in iter_bootstrap_weights(s, n_resamples, seed, group_ids, chunk_size)])
    jack = None
    if method == vocab.BCA:
        jw = jackknife_weights(s, group_ids)
        jack = np.concatenate([evaluate(jw[i : i + chunk_size]) for i in range(0, jw.shape[0], chunk_size)])
    return [
        ci_from_replicates(
            estimate[j], reps[:, j], None if jack is None else jack[:, j], ci_level, method, bca_fallback=bca_fallback
        )
        for j in range(estimate.size)
    ]
