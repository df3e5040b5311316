"""Paired sign-flip permutation test of the mean per-sequence difference.

For per-sequence paired differences ``d_1..d_S`` (e.g. the proxy's energy fraction in
sequence ``s`` minus the mean energy fraction of the controls in the same sequence), the
statistic is ``T = mean_s d_s``. Under H0 (each ``d_s`` is symmetric about 0, sequences
independent) every sign vector ``eps in {-1, +1}^S`` is equally likely, so the null
distribution is ``T*(eps) = mean_s eps_s d_s``.

* Exact mode (``2**S <= n_permutations``): all ``2**S`` sign vectors are enumerated (the
  identity included) and ``p = #{T* >= T} / 2**S``.
* Randomised mode: ``B = n_permutations`` random sign vectors and
  ``p = (1 + #{T* >= T}) / (1 + B)`` (valid, never zero).
* ``alternative="less"`` counts ``T* <= T``; ``"two-sided"`` is ``min(1, 2 min(p_>, p_<))``.

These are exactly the conventions of ``scipy.stats.permutation_test`` with
``permutation_type="samples"`` on one sample, including its relative tie tolerance
(``100 * eps * |T|``), so exact-mode p-values agree with scipy bit for bit.

Implementation: one matrix-vector product of a ``(B, S)`` +-1 sign matrix with ``d`` (no
Python loop per permutation). Sign matrices are cached per ``(S, B, seed)`` so that many
analyses over the same sequences reuse one draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ._validation import as_1d_float, check_alternative, check_positive_int

_TOL = 100 * np.finfo(np.float64).eps
_MAX_EXACT_S = 20  # 2**20 sign vectors at most


@dataclass(frozen=True, kw_only=True)
class PermutationResult:
    """Result of :func:`sign_flip_test`.

    Attributes
    ----------
    statistic : float
        The observed mean difference ``T = mean_s d_s``.
    p_value : float
        The sign-flip p-value (exact or randomised convention, see the module).
    n_permutations : int
        The number of sign vectors actually used (``2**S`` in exact mode).
    exact : bool
        Whether all ``2**S`` sign vectors were enumerated.
    alternative : {"greater", "less", "two-sided"}
        The tail tested.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> r = stats.sign_flip_test([0.3, 0.5, 0.2, 0.4, 0.6], n_permutations=999)
    >>> type(r).__name__, r.exact, r.p_value
    ('PermutationResult', True, 0.03125)
    """

    statistic: float
    p_value: float
    n_permutations: int
    exact: bool = False
    alternative: str = "greater"


@lru_cache(maxsize=8)
def _sign_matrix(n_sequences: int, n_permutations: int, seed: int, exact: bool) -> np.ndarray:
    if exact:
        codes = np.arange(2**n_sequences, dtype=np.int64)[:, None]
        bits = (codes >> np.arange(n_sequences, dtype=np.int64)[None, :]) & 1
        signs = 1.0 - 2.0 * bits  # row 0 is the identity
    else:
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5F11]))
        n_bytes = n_permutations * ((n_sequences + 7) // 8)
        raw = np.frombuffer(rng.bytes(n_bytes), dtype=np.uint8)
        bits = np.unpackbits(raw.reshape(n_permutations, -1), axis=1)[:, :n_sequences]
        signs = 1.0 - 2.0 * bits.astype(np.float64)
    signs.setflags(write=False)
    return signs


def sign_flip_null(n_sequences: int, n_permutations: int, seed: int = 0) -> tuple[np.ndarray, bool]:
    """The ``(B, S)`` sign matrix used by :func:`sign_flip_test` and whether it is exact.

    Exact (all ``2**S`` sign vectors, row 0 the identity) when ``S <= 20`` and
    ``2**S <= n_permutations``; otherwise ``n_permutations`` random sign vectors, cached per
    ``(S, B, seed)``.

    Parameters
    ----------
    n_sequences : int
        The number of sequences ``S``.
    n_permutations : int
        The most sign vectors to use, ``B`` in randomised mode.
    seed : int, default 0
        Seed of the random sign vectors (unused in exact mode).

    Returns
    -------
    signs : ndarray of shape (B, S)
        Read-only matrix of ``+1.0`` / ``-1.0``.
    exact : bool
        Whether the rows enumerate all ``2**S`` sign vectors.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> signs, exact = stats.sign_flip_null(4, 999)
    >>> signs.shape, exact
    ((16, 4), True)
    """
    exact = n_sequences <= _MAX_EXACT_S and 2**n_sequences <= n_permutations
    return _sign_matrix(int(n_sequences), int(n_permutations), int(seed), exact), exact


def _pvalues(observed: np.ndarray, null: np.ndarray, alternative: str, exact: bool, scale):
    """observed (m,), null (m, B) -> (m,) p-values with scipy's tie tolerance."""
    gamma = np.maximum(np.abs(_TOL * observed), _TOL * scale)[:, None]
    obs = observed[:, None]
    adj = 0 if exact else 1
    b = null.shape[1]
    p_greater = ((null >= obs - gamma).sum(axis=1) + adj) / (b + adj)
    p_less = ((null <= obs + gamma).sum(axis=1) + adj) / (b + adj)
    if alternative == "greater":
        return p_greater
    if alternative == "less":
        return p_less
    return np.minimum(1.0, 2.0 * np.minimum(p_greater, p_less))


def sign_flip_pvalues(differences, n_permutations: int = 9999, seed: int = 0, alternative: str = "greater"):
    """Vectorised sign-flip test for ``m`` difference vectors at once.

    All rows share one sign matrix (:func:`sign_flip_null`).

    Parameters
    ----------
    differences : array_like of shape (m, S)
        ``m`` vectors of paired differences over the same ``S >= 1`` sequences, all finite.
    n_permutations : int, default 9999
        The most sign vectors to use (exact enumeration when ``2**S`` is no more).
    seed : int, default 0
        Seed of the random sign vectors.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        ``"greater"`` counts ``T* >= T``, ``"less"`` ``T* <= T``; two-sided doubles the smaller.

    Returns
    -------
    statistics : ndarray of shape (m,)
        Each row's mean difference ``T``.
    p_values : ndarray of shape (m,)
        Each row's p-value.
    n_used : int
        The number of sign vectors used.
    exact : bool
        Whether the sign vectors were enumerated.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> statistics, p, n_used, exact = stats.sign_flip_pvalues(np.array([[0.3, 0.5, 0.2, 0.4, 0.6], [0.1, -0.2, 0.1, -0.1, 0.0]]), n_permutations=999)
    >>> p.tolist(), n_used, exact
    ([0.03125, 0.75], 32, True)
    """
    check_alternative(alternative)
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or d.shape[1] < 1:
        raise ValueError(f"differences must be (m, S) with S >= 1, got {d.shape}")
    if not np.all(np.isfinite(d)):
        raise ValueError("differences contain non-finite values")
    check_positive_int(n_permutations, "n_permutations")
    s = d.shape[1]
    signs, exact = sign_flip_null(s, n_permutations, seed)
    observed = d.mean(axis=1)
    null = (d @ signs.T) / s  # (m, B)
    scale = np.abs(d).mean(axis=1)
    p = _pvalues(observed, null, alternative, exact, scale)
    return observed, p, signs.shape[0], exact


def sign_flip_test(
    differences, n_permutations: int = 9999, seed: int = 0, alternative: str = "greater"
) -> PermutationResult:
    """Paired sign-flip permutation test of ``mean(differences) = 0``.

    See the module docstring for the exact/randomised p-value conventions.

    Parameters
    ----------
    differences : array_like of shape (S,)
        Per-sequence paired differences, finite, not empty.
    n_permutations : int, default 9999
        The most sign vectors to use (exact enumeration when ``2**S`` is no more).
    seed : int, default 0
        Seed of the random sign vectors.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        The tail tested.

    Returns
    -------
    PermutationResult
        The statistic, p-value and the sign vectors' count and mode.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> r = stats.sign_flip_test([0.3, 0.5, 0.2, 0.4, 0.6], n_permutations=999)
    >>> r.p_value, r.exact
    (0.03125, True)
    """
    d = as_1d_float(differences, "differences")
    if d.size < 1:
        raise ValueError("differences must not be empty")
    stat, p, n_used, exact = sign_flip_pvalues(d[None, :], n_permutations, seed, alternative)
    return PermutationResult(
        statistic=float(stat[0]),
        p_value=float(p[0]),
        n_permutations=int(n_used),
        exact=bool(exact),
        alternative=alternative,
    )
