"""Token-frequency analysis on plain arrays (no resampling here — the analysis layer adds
sequence-bootstrap CIs).

* :func:`frequency_buckets` — bucket index per token id from corpus counts.
* :func:`centroid_distances` — per token type, the mean Euclidean distance of its occurrences'
  activations to the type's activation centroid.
* :func:`type_mean_geometry` — from streamed per-type sums, the three per-type "distances"
  the frequency analysis offers (each named in the results): the RMS spread of a type's
  activations around its own centroid, the distance of the type's mean activation (centroid)
  from the global mean, and the norm of the type's mean activation.
* :func:`log_frequency_correlation` — Spearman and Pearson correlation of log-frequency with
  a per-type distance.
* :class:`SequenceTypeSums` / :func:`sequence_type_sums` — activation sums per (sequence, token
  type) pair, the sufficient statistics that let a sequence bootstrap recompute every type's
  centroid; :class:`ResampledCentroidDistance` evaluates the RMS centroid distance of every
  type under a matrix of sequence weights, and :func:`masked_correlations` the two
  correlations row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from scipy import sparse, stats

from ._util import as_tensor

__all__ = [
    "CentroidDistances",
    "FrequencyCorrelation",
    "ResampledCentroidDistance",
    "ResampledTypeMeans",
    "SequenceTypeSums",
    "TypeMeanGeometry",
    "centroid_distances",
    "frequency_buckets",
    "log_frequency_correlation",
    "masked_correlations",
    "masked_correlations_many",
    "sequence_type_sums",
    "type_mean_geometry",
]


def frequency_buckets(counts: Any, n_buckets: int, *, by: Literal["types", "tokens"] = "types") -> np.ndarray:
    """Quantile bucket of every token id from its corpus count.

    ``counts[t]`` is the corpus count of token id t (length = vocabulary size).  Returns an
    int64 array of the same length: bucket 0 = rarest … ``n_buckets − 1`` = most frequent, and
    ``-1`` for ids with count 0 (never seen: not bucketed).

    * ``by="types"`` (default): equal numbers of seen token *types* per bucket.  A type's
      position is its mid-rank ``(r − 0.5)/T`` among the T seen types (ties get the average
      rank) and its bucket ``floor(position · n_buckets)``.
    * ``by="tokens"``: equal corpus *mass* per bucket: the position is the midpoint of the
      type's tie group in the cumulative count distribution (sorted ascending).

    Ties: all types with the same count always land in the same bucket, so with heavy ties
    some buckets can be empty or larger than their quantile share.

    Parameters
    ----------
    counts : array_like of shape (V,)
        The corpus count of every token id.
    n_buckets : int
        The number of buckets.
    by : {"types", "tokens"}, default "types"
        Equal numbers of types, or equal corpus mass, per bucket.

    Returns
    -------
    ndarray of shape (V,), int64
        The bucket of every id (0 rarest), -1 for ids never seen.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> geometry.frequency_buckets(np.array([100, 50, 10, 1]), 2).tolist()
    [1, 1, 0, 0]
    """
    c = np.asarray(
        counts.detach().cpu().numpy() if isinstance(counts, torch.Tensor) else counts, dtype=np.float64
    ).ravel()
    if n_buckets < 1:
        raise ValueError("n_buckets must be >= 1")
    if np.any(c < 0) or not np.all(np.isfinite(c)):
        raise ValueError("counts must be finite and non-negative")
    out = np.full(c.shape, -1, dtype=np.int64)
    seen = c > 0
    t = int(seen.sum())
    if t == 0:
        return out
    cs = c[seen]
    if by == "types":
        pos = (stats.rankdata(cs, method="average") - 0.5) / t
    elif by == "tokens":
        uniq, inv = np.unique(cs, return_inverse=True)
        group_mass = uniq * np.bincount(inv, minlength=uniq.size)
        cum = np.cumsum(group_mass)
        mid = (cum - group_mass / 2.0) / cum[-1]
        pos = mid[inv]
    else:
        raise ValueError(f"by must be 'types' or 'tokens', got {by!r}")
    out[seen] = np.minimum((pos * n_buckets).astype(np.int64), n_buckets - 1)
    return out


@dataclass(frozen=True, kw_only=True)
class CentroidDistances:
    """Per token type (sorted by id): ``token_types`` (T,), ``n_occurrences`` (T,),
    ``mean_distance`` (T,) = mean over the type's occurrences of ‖a_i − c_t‖₂ with
    ``c_t`` the mean activation of the type; ``token_distance`` (N,) = ‖a_i − c_{t(i)}‖₂ for
    every input row (before any ``min_occurrences`` filter).

    Attributes
    ----------
    token_types : ndarray of shape (T,)
        The types kept, sorted by id.
    n_occurrences : ndarray of shape (T,)
        Their occurrences.
    mean_distance : ndarray of shape (T,)
        Mean ‖a_i − c_t‖₂ over each type's occurrences.
    token_distance : ndarray of shape (N,)
        ‖a_i − c_{t(i)}‖₂ of every input row.
    """

    token_types: np.ndarray
    n_occurrences: np.ndarray
    mean_distance: np.ndarray
    token_distance: np.ndarray


def centroid_distances(activations: Any, token_ids: Any, *, min_occurrences: int = 2) -> CentroidDistances:
    """Distance of occurrences to their token type's activation centroid.

    For token type t with occurrences ``{i : token_ids[i] = t}``: centroid
    ``c_t = mean_i a_i`` and ``mean_distance_t = mean_i ‖a_i − c_t‖₂`` (Euclidean, uncentred
    space, not squared).  Types with fewer than ``min_occurrences`` occurrences are left out
    of the per-type arrays (a singleton's distance is 0 by construction).  O(N d) with
    scatter-adds, on the activations' device; results as numpy.

    Parameters
    ----------
    activations : array_like of shape (N, d)
        One activation per token occurrence.
    token_ids : array_like of shape (N,)
        The token type of every row.
    min_occurrences : int, default 2
        Types seen fewer times are left out of the per-type arrays.

    Returns
    -------
    CentroidDistances
        Per type: ids, occurrence counts and mean distance; per row: its distance.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> acts = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    >>> cd = geometry.centroid_distances(acts, torch.tensor([5, 5, 7, 7]))
    >>> cd.token_types.tolist(), cd.n_occurrences.tolist()
    ([5, 7], [2, 2])
    """
    a = as_tensor(activations, name="activations").to(torch.float64)
    ids = as_tensor(token_ids, name="token_ids").to(a.device).long().ravel()
    if a.ndim != 2 or ids.shape[0] != a.shape[0]:
        raise ValueError(
            f"activations (N, d) and token_ids (N,) must align; got {tuple(a.shape)} and {tuple(ids.shape)}"
        )
    types, inv, cnt = torch.unique(ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(types.shape[0], a.shape[1], dtype=torch.float64, device=a.device).index_add_(0, inv, a)
    cent = sums / cnt[:, None].to(torch.float64)
    dist = torch.linalg.vector_norm(a - cent[inv], dim=1)
    mean_d = torch.zeros(types.shape[0], dtype=torch.float64, device=a.device).index_add_(0, inv, dist) / cnt.to(
        torch.float64
    )
    keep = cnt >= int(min_occurrences)
    return CentroidDistances(
        token_types=types[keep].cpu().numpy(),
        n_occurrences=cnt[keep].cpu().numpy(),
        mean_distance=mean_d[keep].cpu().numpy(),
        token_distance=dist.cpu().numpy(),
    )


@dataclass(frozen=True, kw_only=True)
class TypeMeanGeometry:
    """Per token type (arrays of the vocabulary's length, NaN where a type has fewer than two
    occurrences): ``rms_spread``, ``mean_distance``, ``mean_norm`` (see
    :func:`type_mean_geometry`) and the ``global_mean`` (d,) they refer to.

    Attributes
    ----------
    rms_spread : ndarray of shape (V,)
        Bessel-corrected RMS distance of each type's occurrences to its centroid.
    mean_distance : ndarray of shape (V,)
        Debiased distance of each type's mean from ``global_mean``.
    mean_norm : ndarray of shape (V,)
        Debiased norm of each type's mean.
    global_mean : ndarray of shape (d,)
        The token-weighted global mean ``μ``.
    """

    rms_spread: np.ndarray
    mean_distance: np.ndarray
    mean_norm: np.ndarray
    global_mean: np.ndarray


def type_mean_geometry(count: Any, vector_sum: Any, square_sum: Any, global_mean: Any = None) -> TypeMeanGeometry:
    """Three per-type geometries from streamed sums over a type's n_t occurrences
    (``count`` n_t (V,), ``vector_sum`` Σa (V, d), ``square_sum`` Σ‖a‖² (V,)).

    With centroid ``c_t = Σa / n_t`` and the token-weighted global mean
    ``μ = Σ_t Σa / Σ_t n_t`` (over the same occurrences):

    * ``rms_spread_t = sqrt(Σ_i ‖a_i − c_t‖² / (n_t − 1))`` — Bessel-corrected RMS distance of
      the occurrences to their own centroid (what ``*_logfreq_distance`` correlates);
    * ``mean_distance_t = sqrt(max(0, ‖c_t − μ‖² − rms_spread_t² / n_t))`` — distance of the
      type's mean representation from the global mean, the anisotropy literature's usual
      quantity (``*_logfreq_mean_distance``);
    * ``mean_norm_t = sqrt(max(0, ‖c_t‖² − rms_spread_t² / n_t))`` — the norm of the type's mean
      representation (``*_logfreq_mean_norm``).

    Why the ``− rms²/n_t`` term: a centroid of n_t noisy occurrences lies on average
    ``tr Σ_t / n_t`` (squared) farther from any fixed point than the type's true mean, and n_t
    follows the corpus count, so the plug-in distance alone would correlate with frequency
    (rare types pushed outward). Subtracting the unbiased ``rms_spread²/n_t`` makes each squared
    distance unbiased for the true one (μ is treated as fixed: it pools all tokens). Types with
    n_t < 2 get NaN.

    ``global_mean``: μ when the rows given are not all the occurrences it pools (a collector
    that keeps sums only for some types passes the mean of every occurrence); by default μ is
    pooled over the rows given.

    Parameters
    ----------
    count : array_like of shape (V,)
        Occurrences ``n_t`` per type.
    vector_sum : array_like of shape (V, d)
        ``Σa`` per type.
    square_sum : array_like of shape (V,)
        ``Σ‖a‖²`` per type.
    global_mean : array_like of shape (d,), optional
        ``μ`` (default: pooled over the rows given).

    Returns
    -------
    TypeMeanGeometry
        ``rms_spread``, ``mean_distance``, ``mean_norm`` per type and ``global_mean``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> geo = geometry.type_mean_geometry(np.array([2, 2]), np.array([[2.0, 0.0], [0.0, 2.0]]), np.array([2.0, 2.0]))
    >>> np.round(geo.mean_norm, 4).tolist()
    [1.0, 1.0]
    """
    n = np.asarray(count, dtype=np.float64).ravel()
    total = np.asarray(vector_sum, dtype=np.float64)
    square = np.asarray(square_sum, dtype=np.float64).ravel()
    if total.ndim != 2 or total.shape[0] != n.size or square.size != n.size:
        raise ValueError(
            f"count (V,), vector_sum (V, d) and square_sum (V,) must align; got {n.shape}, "
            f"{total.shape}, {square.shape}"
        )
    enough = n >= 2
    safe = np.maximum(n, 1.0)
    centroid = total / safe[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        scatter = np.maximum(square - np.einsum("vd,vd->v", total, total) / safe, 0.0)
        variance = np.where(enough, scatter / np.maximum(n - 1.0, 1.0), np.nan)
        if global_mean is None:
            global_mean = total.sum(0) / max(float(n.sum()), 1.0)
        global_mean = np.asarray(global_mean, dtype=np.float64)
        offset = centroid - global_mean
        noise = variance / safe
        mean_distance = np.sqrt(np.maximum(np.einsum("vd,vd->v", offset, offset) - noise, 0.0))
        mean_norm = np.sqrt(np.maximum(np.einsum("vd,vd->v", centroid, centroid) - noise, 0.0))
    nan = np.full(n.shape, np.nan)
    return TypeMeanGeometry(
        rms_spread=np.sqrt(variance),
        mean_distance=np.where(enough, mean_distance, nan),
        mean_norm=np.where(enough, mean_norm, nan),
        global_mean=global_mean,
    )


@dataclass(frozen=True, kw_only=True)
class FrequencyCorrelation:
    """Correlation of ``log(count)`` with distance over ``n_types`` types.

    Attributes
    ----------
    spearman_rho : float
        Spearman ρ of ``log(count)`` with distance.
    spearman_p : float
        Its two-sided p-value.
    pearson_r : float
        Pearson r of ``log(count)`` with distance.
    pearson_p : float
        Its two-sided p-value.
    n_types : int
        The types (pairs) used.
    """

    spearman_rho: float
    spearman_p: float
    pearson_r: float
    pearson_p: float
    n_types: int


def log_frequency_correlation(counts: Any, distances: Any) -> FrequencyCorrelation:
    """Spearman ρ and Pearson r (``scipy.stats``, two-sided p) between ``log(counts)`` and
    ``distances`` (aligned per type, e.g. corpus counts of ``CentroidDistances.token_types``
    against ``mean_distance``).  Pairs with count ≤ 0 or a non-finite value are dropped;
    fewer than 3 pairs (or a constant input) gives nan.

    Parameters
    ----------
    counts : array_like of shape (T,)
        Corpus counts per type.
    distances : array_like of shape (T,)
        The types' distances, aligned with ``counts``.

    Returns
    -------
    FrequencyCorrelation
        Spearman ρ, Pearson r, their two-sided p-values and the pairs used.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> r = geometry.log_frequency_correlation(np.array([1, 10, 100, 1000]), np.array([4.0, 3.0, 2.0, 1.0]))
    >>> r.spearman_rho, r.n_types
    (-1.0, 4)
    """
    c = np.asarray(counts, dtype=np.float64).ravel()
    x = np.asarray(distances, dtype=np.float64).ravel()
    if c.shape != x.shape:
        raise ValueError(f"counts and distances must align, got {c.shape} and {x.shape}")
    ok = (c > 0) & np.isfinite(c) & np.isfinite(x)
    lc, x = np.log(c[ok]), x[ok]
    n = int(ok.sum())
    if n < 3 or np.ptp(lc) == 0 or np.ptp(x) == 0:
        nan = float("nan")
        return FrequencyCorrelation(spearman_rho=nan, spearman_p=nan, pearson_r=nan, pearson_p=nan, n_types=n)
    sr = stats.spearmanr(lc, x)
    pr = stats.pearsonr(lc, x)
    return FrequencyCorrelation(
        spearman_rho=float(sr.statistic),
        spearman_p=float(sr.pvalue),
        pearson_r=float(pr.statistic),
        pearson_p=float(pr.pvalue),
        n_types=n,
    )


# ----------------------------------------------------------------------------------------------
# resampling the centroid distance over sequences
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SequenceTypeSums:
    """Activation sums per (sequence, token type) *pair*, one row per pair that occurs.

    For the occurrences ``i`` of type ``t`` in sequence ``s``: ``count = n_st``,
    ``square_sum = Σ_i ‖a_i‖²`` and ``vector_sum = Σ_i a_i`` (``(P, d)``). Resampling sequences
    with multiplicities ``w_s`` multiplies each pair's sums by ``w_s``, so every type's centroid
    and RMS distance under any resample follow from these rows (see
    :class:`ResampledCentroidDistance`). Memory is ``P·(d + 4)`` numbers with ``P`` at most the
    number of tokens.

    Attributes
    ----------
    sequence : ndarray of shape (P,), int64
        The pair's sequence, in ``[0, n_sequences)``.
    token_type : ndarray of shape (P,), int64
        The pair's token type.
    count : ndarray of shape (P,), float64
        ``n_st``.
    square_sum : ndarray of shape (P,), float64
        ``Σ_i ‖a_i‖²``.
    vector_sum : ndarray of shape (P, d), float64
        ``Σ_i a_i``.
    n_sequences : int
        The number of sequences.
    """

    sequence: np.ndarray  # (P,) int64, in [0, n_sequences)
    token_type: np.ndarray  # (P,) int64
    count: np.ndarray  # (P,) float64
    square_sum: np.ndarray  # (P,) float64
    vector_sum: np.ndarray  # (P, d) float64
    n_sequences: int

    @property
    def n_pairs(self) -> int:
        return int(self.sequence.shape[0])


def sequence_type_sums(
    activations: Any, token_ids: Any, sequence_ids: Any, n_sequences: int | None = None
) -> SequenceTypeSums:
    """:class:`SequenceTypeSums` of plain rows: activations ``(N, d)``, token ids ``(N,)`` and
    the sequence of every row ``(N,)`` (``n_sequences`` defaults to ``max + 1``). Pairs come out
    sorted by (token type, sequence).

    Parameters
    ----------
    activations : array_like of shape (N, d)
        One activation per token occurrence.
    token_ids : array_like of shape (N,)
        The token type of every row.
    sequence_ids : array_like of shape (N,)
        The sequence of every row.
    n_sequences : int, optional
        The number of sequences (default ``max(sequence_ids) + 1``).

    Returns
    -------
    SequenceTypeSums
        One row per (sequence, type) pair that occurs.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> sums = geometry.sequence_type_sums(np.ones((4, 2)), np.array([5, 5, 7, 5]), np.array([0, 0, 0, 1]))
    >>> sums.token_type.tolist(), sums.sequence.tolist(), sums.count.tolist()
    ([5, 5, 7], [0, 1, 0], [2.0, 1.0, 1.0])
    """
    a = as_tensor(activations, name="activations").to(torch.float64)
    ids = as_tensor(token_ids, name="token_ids").to(a.device).long().ravel()
    seq = as_tensor(sequence_ids, name="sequence_ids").to(a.device).long().ravel()
    if a.ndim != 2 or ids.shape[0] != a.shape[0] or seq.shape[0] != a.shape[0]:
        raise ValueError(
            f"activations (N, d), token_ids (N,) and sequence_ids (N,) must align; got "
            f"{tuple(a.shape)}, {tuple(ids.shape)}, {tuple(seq.shape)}"
        )
    if seq.numel() and int(seq.min()) < 0:
        raise ValueError("sequence_ids must be non-negative")
    n_seq = int(seq.max()) + 1 if n_sequences is None else int(n_sequences)
    if seq.numel() and int(seq.max()) >= n_seq:
        raise ValueError(f"sequence_ids must be < n_sequences={n_seq}")
    # type-major key, so unique() returns the pairs sorted by (type, sequence)
    pairs, inverse = torch.unique(ids * n_seq + seq, return_inverse=True)
    rows = pairs.shape[0]
    count = torch.zeros(rows, dtype=torch.float64, device=a.device).index_add_(
        0, inverse, torch.ones_like(inverse, dtype=torch.float64)
    )
    square = torch.zeros(rows, dtype=torch.float64, device=a.device).index_add_(0, inverse, a.square().sum(1))
    vector = torch.zeros(rows, a.shape[1], dtype=torch.float64, device=a.device).index_add_(0, inverse, a)
    return SequenceTypeSums(
        sequence=(pairs % n_seq).cpu().numpy(),
        token_type=(pairs // n_seq).cpu().numpy(),
        count=count.cpu().numpy(),
        square_sum=square.cpu().numpy(),
        vector_sum=vector.cpu().numpy(),
        n_sequences=n_seq,
    )


def _blocks_by_length(starts: np.ndarray, lengths: np.ndarray):
    """For each distinct length of the contiguous blocks ``[start, start + length)``: the length,
    the starts of the blocks that long, and their row indices ``(blocks, length)`` — so per-block
    work becomes one batched operation per length."""
    for length in np.unique(lengths):
        first = starts[lengths == length]
        yield int(length), first, first[:, None] + np.arange(length)[None, :]


class ResampledCentroidDistance:
    """Bessel-corrected RMS distance to the type centroid of each of ``token_types``, under
    sequence weights.

    The full-sample value (``w = 1``) is what the collector reports per type:

        rms_t = sqrt(Σ_i ‖a_i − c_t‖² / (n_t − 1)) = sqrt(mean over pairs i≠j of ‖a_i − a_j‖² / 2),

    an unbiased estimate of the type's total activation variance whatever its count n_t. (The
    plug-in divisor n_t would shrink a type seen twice by a factor 1/2 in expectation, and since
    the test-split count follows the corpus count, that alone would correlate distance with
    frequency.)

    Under weights ``w`` (sequence s drawn ``w_s`` times) the value is the same pairwise mean
    over the pairs a real sample has: two tokens of the same drawn copy of a sequence, or of two
    different original sequences. Pairs between two copies of one sequence are left out — they
    do not exist in the data, and counting them (a copy of a token paired with itself is at
    distance 0) is what biases a naive bootstrap of a spread downward, most for types held by
    few sequences. With per-(sequence, type) count ``n_st``, ``q_st = Σ_i ‖a_i − c_t‖²``,
    ``m_st = Σ_i (a_i − c_t)`` and the within-sequence pair sum ``u_st = n_st q_st − ‖m_st‖²``:

        rms_t(w)² = (n q − ‖m‖² − Σ_s (w_s² − w_s) u_st) / (n² − n − Σ_s (w_s² − w_s) n_st²)

    with ``n = Σ_s w_s n_st``, ``q = Σ_s w_s q_st``, ``m = Σ_s w_s m_st``. NaN where the
    denominator is 0 (fewer than two tokens that could pair).

    Sums are taken around the full-sample centroid ``c_t``: the result does not depend on that
    shift, and the factors below are then built from small centred vectors. (Precision is
    limited by the collector's float64 ``Σ‖a‖²``: relative error ≈ 1e-16·‖a‖²/rms².)

    ``‖m‖²`` is the only term that is not linear in ``w``: per type, the centred sums ``M_t``
    (``S_t × d`` over the ``S_t`` sequences holding the type) are replaced by a factor ``C_t``
    with ``C_t C_tᵀ = M_t M_tᵀ`` and ``min(S_t, d)`` columns (zero columns where the Gram's rank
    is lower), stacked per length ``S_t`` so that the types of one length are one batched
    product; a call costs ``O(b Σ_t S_t min(S_t, d))``."""

    def __init__(self, sums: SequenceTypeSums, token_types: Any):
        types = np.asarray(token_types, dtype=np.int64).ravel()
        self.n_sequences, self.n_types = int(sums.n_sequences), int(types.size)
        column = np.full(int(max(types.max(initial=-1), sums.token_type.max(initial=-1))) + 1, -1, dtype=np.int64)
        column[types] = np.arange(types.size)
        pair_column = column[sums.token_type]
        keep = pair_column >= 0
        order = np.lexsort((sums.sequence[keep], pair_column[keep]))
        #: rows of ``sums`` holding the kept pairs, ordered by (type column, sequence)
        self.pair_index = np.flatnonzero(keep)[order]
        col = pair_column[keep][order]
        seq = self.pair_sequence = sums.sequence[keep][order]
        count = sums.count[keep][order]
        vector = sums.vector_sum[keep][order]
        square = sums.square_sum[keep][order]
        # centre every pair's sums on the full-sample centroid of its type
        type_count = np.bincount(col, weights=count, minlength=self.n_types)
        membership = sparse.csr_matrix((np.ones(col.size), (col, np.arange(col.size))), shape=(self.n_types, col.size))
        centroid = np.asarray(membership @ vector) / np.maximum(type_count, 1.0)[:, None]
        c = centroid[col]
        centred_square = square - 2.0 * np.einsum("pd,pd->p", c, vector) + count * np.einsum("pd,pd->p", c, c)
        centred_vector = vector - count[:, None] * c
        within = count * centred_square - np.einsum("pd,pd->p", centred_vector, centred_vector)
        # per-type sums that are linear in w (count, centred Σ‖a‖²) and in w² − w (within-sequence
        # pair sums, count²), each pair of tables side by side so a call is two sparse products
        shape = (self.n_sequences, self.n_types)

        def table(values):
            return sparse.csr_matrix((values, (seq, col)), shape=shape)

        # the third linear table, ⟨m_st, c_t⟩, serves ResampledTypeMeans' ‖Σ_s w_s v_st‖²
        self._linear = sparse.hstack(
            [table(count), table(centred_square), table(np.einsum("pd,pd->p", centred_vector, c))]
        ).T.tocsr()
        self._repeated = sparse.hstack([table(within), table(count * count)]).T.tocsr()
        self.centroid_norm = np.einsum("td,td->t", centroid, centroid)  # ‖c_t‖²
        # factors: types seen in one sequence are one vectorised product; the rest one batched
        # product per length
        starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]]) if col.size else np.zeros(0, dtype=np.int64)
        # a type's pairs are contiguous: per-type sums over them are one reduceat over these starts
        self.pair_starts, self.start_column = starts, col[starts]
        stops = np.r_[starts[1:], col.size].astype(np.int64)
        single = stops - starts == 1
        self._single_column = col[starts[single]]
        self._single_sequence = seq[starts[single]]
        self._single_norm = np.einsum("pd,pd->p", centred_vector[starts[single]], centred_vector[starts[single]])
        self._factors: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (columns, sequences, factors)
        for length, first, index in _blocks_by_length(starts[~single], (stops - starts)[~single]):
            factors = centred_vector[index]  # (types, length, d)
            if length <= factors.shape[2]:  # a factor of the length × length Gram: one batched eigh
                eigenvalues, eigenvectors = np.linalg.eigh(np.matmul(factors, factors.transpose(0, 2, 1)))
                keep = eigenvalues > eigenvalues.max(axis=1, keepdims=True, initial=0.0) * 1e-13
                factors = eigenvectors * np.sqrt(np.where(keep, eigenvalues, 0.0))[:, None, :]
            self._factors.append((col[first], seq[index], factors))

    def __call__(self, weights: Any) -> np.ndarray:
        """``(b, n_types)`` RMS distances for weights ``(b, n_sequences)`` (NaN where undefined)."""
        return self.with_sums(weights)[0]

    def with_sums(self, weights: Any) -> tuple[np.ndarray, ...]:
        """``(rms_t(w), n_t(w), ‖m_t(w)‖², Σ_s w_s ⟨m_st, c_t⟩)``, each ``(b, n_types)``."""
        w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        if w.shape[1] != self.n_sequences:
            raise ValueError(f"weights must have {self.n_sequences} columns, got {w.shape[1]}")

        n, q, centroid_dot = np.split(np.asarray(self._linear @ w.T).T, 3, axis=1)
        repeats = w * w - w  # ordered pairs of distinct copies of each sequence
        within, count_squared = np.split(np.asarray(self._repeated @ repeats.T).T, 2, axis=1)
        centred_norm = np.zeros_like(n)
        centred_norm[:, self._single_column] = w[:, self._single_sequence] ** 2 * self._single_norm
        for columns, sequences, factors in self._factors:
            # (types, b, length) @ (types, length, r): every type of this length at once
            projected = np.matmul(w[:, sequences].transpose(1, 0, 2), factors)
            centred_norm[:, columns] = np.einsum("tbr,tbr->bt", projected, projected)
        numerator = n * q - centred_norm - within
        denominator = n * n - n - count_squared
        ok = denominator > 0.5  # an integer count of pairs; 0 when no two tokens can pair
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = np.where(ok, np.sqrt(np.maximum(numerator, 0.0) / np.where(ok, denominator, 1.0)), np.nan)
        return spread, n, centred_norm, centroid_dot


class ResampledTypeMeans:
    """:func:`type_mean_geometry`'s ``mean_distance`` and ``mean_norm`` of each of
    ``token_types`` under sequence weights (sequence s drawn ``w_s`` times).

    With per-(sequence, type) sums ``v_st = Σ a`` and counts ``n_st``, and per-sequence totals
    over *all* types ``V_s = Σ_t v_st``, ``N_s = Σ_t n_st``:

        A_t = Σ_s w_s v_st,  n_t = Σ_s w_s n_st,  B = Σ_s w_s V_s,  N = Σ_s w_s N_s
        ‖c_t − μ‖² = ‖A_t‖²/n_t² − 2⟨A_t, B⟩/(n_t N) + ‖B‖²/N²,   ‖c_t‖² = ‖A_t‖²/n_t²

    minus the noise term ``rms_t(w)²/n_t`` with ``rms_t(w)`` from
    :class:`ResampledCentroidDistance` (which leaves out pairs between copies of a sequence),
    then ``sqrt(max(0, ·))``. The quadratic terms reuse that class's sums about the full-sample
    centroid ``c_t``: with ``m_t(w) = A_t − n_t c_t``,
    ``‖A_t‖² = ‖m_t(w)‖² + 2 n_t Σ_s w_s ⟨m_st, c_t⟩ + n_t² ‖c_t‖²``; ``⟨A_t, B⟩`` sums
    ``w_s w_s' v_st·V_s'`` from the pair-by-sequence table (P × S) over each type's pairs, and
    ``‖B‖²`` uses ``V_s·V_s'`` (S × S). A call costs ``O(b (Σ_t S_t min(S_t, d) + P S))``.
    At ``w = 1`` the values are :func:`type_mean_geometry`'s."""

    def __init__(self, sums: SequenceTypeSums, token_types: Any):
        types = np.asarray(token_types, dtype=np.int64).ravel()
        self.n_sequences, self.n_types = int(sums.n_sequences), int(types.size)
        self._spread = ResampledCentroidDistance(sums, types)
        n_all = sums.sequence.size
        to_sequence = sparse.csr_matrix(
            (np.ones(n_all), (sums.sequence, np.arange(n_all))), shape=(self.n_sequences, n_all)
        )
        totals = np.asarray(to_sequence @ sums.vector_sum)  # (S, d): V_s = Σ_t v_st
        self._sequence_count = np.bincount(sums.sequence, weights=sums.count, minlength=self.n_sequences)
        self._sequence_gram = totals @ totals.T  # (S, S)
        # the pairs in the spread's order (by type, then sequence)
        self._cross = sums.vector_sum[self._spread.pair_index] @ totals.T  # (P, S): v_st · V_s'

    def __call__(self, weights: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean_distance, mean_norm)``, each ``(b, n_types)``, for weights ``(b, n_sequences)``."""
        return self.all_three(weights)[1:]

    def all_three(self, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rms_spread, mean_distance, mean_norm)`` for weights ``(b, n_sequences)``: the spread
        (:class:`ResampledCentroidDistance`) is computed once and serves the debiasing too."""
        w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        if w.shape[1] != self.n_sequences:
            raise ValueError(f"weights must have {self.n_sequences} columns, got {w.shape[1]}")
        spread, n, centred_norm, centroid_dot = self._spread.with_sums(w)
        a_squared = centred_norm + 2.0 * n * centroid_dot + n * n * self._spread.centroid_norm
        a_dot_b = np.zeros_like(n)
        pairs = self._spread
        if pairs.pair_starts.size:
            # in place and C-ordered (np.take, not w[:, seq]): these (b, P) arrays are the call's largest
            terms = w @ self._cross.T
            terms *= np.take(w, pairs.pair_sequence, axis=1)
            a_dot_b[:, pairs.start_column] = np.add.reduceat(terms, pairs.pair_starts, axis=1)
        b_squared = ((w @ self._sequence_gram) * w).sum(axis=1, keepdims=True)
        total = (w @ self._sequence_count)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            noise = spread**2 / n
            norm_squared = a_squared / n**2
            distance_squared = norm_squared - 2.0 * a_dot_b / (n * total) + b_squared / total**2
            usable = (n > 0) & np.isfinite(spread)
            distance = np.where(usable, np.sqrt(np.maximum(distance_squared - noise, 0.0)), np.nan)
            norm = np.where(usable, np.sqrt(np.maximum(norm_squared - noise, 0.0)), np.nan)
        return spread, distance, norm


def masked_correlations(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Spearman ρ and Pearson r of ``x`` (``(T,)``) with every row of ``y`` (``(b, T)``), each
    row over the entries where both are finite (ranks are taken within that subset, ties get
    average ranks — what ``scipy.stats.spearmanr`` does on the subset). Rows with fewer than
    3 pairs or a constant side give NaN.

    Vectorised over rows (the bootstrap calls it on thousands): ``x`` is sorted once and ranked
    within each row's subset by running counts over its tie groups; each row of ``y`` is sorted
    and its ties found by comparing neighbours.

    Parameters
    ----------
    x : array_like of shape (T,)
        The common variable (NaN where missing).
    y : array_like of shape (b, T)
        One variable per row (NaN where missing).

    Returns
    -------
    spearman : ndarray of shape (b,)
        Spearman ρ of ``x`` with each row.
    pearson : ndarray of shape (b,)
        Pearson r of ``x`` with each row.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> rho, r = geometry.masked_correlations(np.array([1.0, 2.0, 3.0, 4.0]), np.array([[2.0, 4.0, 6.0, 8.0]]))
    >>> np.round(rho, 4).tolist(), np.round(r, 4).tolist()
    ([1.0], [1.0])
    """
    return masked_correlations_many(x, [y])[0]


def masked_correlations_many(x: Any, ys: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`masked_correlations` of ``x`` with each array of ``ys``. The ranks of ``x`` within
    each row's subset are computed once per distinct mask: the frequency analysis' definitions of
    a type's distance are defined on the same (type, resample) entries, so one ranking serves all.

    Parameters
    ----------
    x : array_like of shape (T,)
        The common variable (NaN where missing).
    ys : sequence of array_like of shape (b, T)
        The arrays to correlate with.

    Returns
    -------
    list of tuple of ndarray
        ``(spearman, pearson)`` of each array, as :func:`masked_correlations` returns them.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> out = geometry.masked_correlations_many(np.array([1.0, 2.0, 3.0]), [np.array([[3.0, 2.0, 1.0]])])
    >>> [np.round(rho, 4).tolist() for rho, _ in out]
    [[-1.0]]
    """
    xs = np.asarray(x, dtype=np.float64).ravel()
    out: list[tuple[np.ndarray, np.ndarray]] = []
    last_mask, x_ranks = None, None
    for y in ys:
        values = np.atleast_2d(np.asarray(y, dtype=np.float64))
        if values.shape[1] != xs.size:
            raise ValueError(f"y must have {xs.size} columns, got {values.shape[1]}")
        mask = np.isfinite(values) & np.isfinite(xs)[None, :]
        if last_mask is None or not np.array_equal(last_mask, mask):  # False for other shapes too
            last_mask, x_ranks = mask, _ranks_of_fixed(xs, mask)
        ok = mask.sum(axis=1) >= 3
        pearson = _row_pearson(xs, values, mask)
        spearman = _spearman_rows(x_ranks, values, mask)
        out.append((np.where(ok, spearman, np.nan), np.where(ok, pearson, np.nan)))
    return out


def _spearman_rows(x_ranks: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise Spearman ρ of ``y`` (``(b, T)``) with a side whose average ranks within each
    row's ``mask`` are ``x_ranks`` (0 outside it): :func:`_rank_pearson` of the two rank arrays.

    A row of ``y`` without ties among its kept values (the rule for continuous statistics) is
    never ranked: with its sorting permutation π (unmasked entries last), ``Σ_i rx_i ry_i =
    Σ_j rx_{π_j}·j`` and ``Σ ry² = n(n + 1)(2n + 1)/6``, all sums of multiples of ½ and so exact —
    the same numbers as ranking, without scattering ranks back. Rows with ties are ranked in full
    (:func:`_ranks_of_rows`)."""
    filled = np.where(mask, y, np.inf)  # unmasked last, never inside a tie of kept values
    order = np.argsort(filled, axis=1)
    sorted_y = np.take_along_axis(filled, order, axis=1)
    tied = ((sorted_y[:, 1:] == sorted_y[:, :-1]) & np.isfinite(sorted_y[:, 1:])).any(axis=1)
    n = np.count_nonzero(mask, axis=1).astype(np.float64)
    centre = n * ((n + 1.0) / 2.0) ** 2
    sxy = np.take_along_axis(x_ranks, order, axis=1) @ np.arange(1.0, y.shape[1] + 1.0) - centre
    sxx = np.einsum("ij,ij->i", x_ranks, x_ranks) - centre
    syy = n * (n + 1.0) * (2.0 * n + 1.0) / 6.0 - centre
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    out = np.where((sxx <= 0) | (syy <= 0), np.nan, np.clip(r, -1.0, 1.0))
    if tied.any():
        out[tied] = _rank_pearson(x_ranks[tied], _ranks_of_rows(y[tied], mask[tied]), mask[tied])
    return out


def _rank_pearson(x_ranks: np.ndarray, y_ranks: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation of average ranks (``(b, T)``, 0 outside ``mask``): ranks
    1..n_b (ties averaged) always sum to n(n + 1)/2, so their mean is (n + 1)/2 exactly and the
    centred sums follow from raw ones; ranks are multiples of ½, so those sums are exact in
    float64 (no cancellation), and a constant side has exactly zero spread."""
    n = np.count_nonzero(mask, axis=1).astype(np.float64)
    centre = n * ((n + 1.0) / 2.0) ** 2
    sxy = np.einsum("ij,ij->i", x_ranks, y_ranks) - centre
    sxx = np.einsum("ij,ij->i", x_ranks, x_ranks) - centre
    syy = np.einsum("ij,ij->i", y_ranks, y_ranks) - centre
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    return np.where((sxx <= 0) | (syy <= 0), np.nan, np.clip(r, -1.0, 1.0))


def _ranks_of_fixed(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average ranks of ``x`` within each row's ``mask`` (``(b, T)``; unmasked entries: 0)."""
    finite = np.where(np.isfinite(x), x, np.inf)
    order = np.argsort(finite, kind="stable")
    sorted_x = finite[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])  # tie groups of sorted x
    group = np.cumsum(np.r_[True, sorted_x[1:] != sorted_x[:-1]]) - 1
    counts = np.add.reduceat(mask[:, order].astype(np.float64), starts, axis=1)  # (b, G) kept per group
    before = np.cumsum(counts, axis=1) - counts
    average = before + (counts + 1.0) / 2.0
    ranks = np.empty(mask.shape)
    ranks[:, order] = average[:, group]
    return np.where(mask, ranks, 0.0)


def _ranks_of_rows(y: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average ranks of each row of ``y`` within its ``mask`` (``(b, T)``; unmasked entries: 0)."""
    filled = np.where(mask, y, np.inf)  # unmasked last, never inside a tie of kept values
    # the default (vectorised quicksort) kind: 4-5x faster than a stable sort here, and a tie's
    # members all get the group's average rank below, so their order within the tie is immaterial
    order = np.argsort(filled, axis=1)
    values = np.take_along_axis(filled, order, axis=1)
    positions = np.broadcast_to(np.arange(1, y.shape[1] + 1, dtype=np.float64), y.shape)
    new_group = np.ones(y.shape, dtype=bool)
    new_group[:, 1:] = values[:, 1:] != values[:, :-1]
    first = np.maximum.accumulate(np.where(new_group, positions, 0.0), axis=1)
    ends_group = np.ones(y.shape, dtype=bool)
    ends_group[:, :-1] = new_group[:, 1:]
    last = np.minimum.accumulate(np.where(ends_group, positions, np.inf)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty(y.shape)
    np.put_along_axis(ranks, order, (first + last) / 2.0, axis=1)
    return np.where(mask, ranks, 0.0)


def _row_pearson(x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation of ``x`` (``(T,)`` or ``(b, T)``) and ``y`` (``(b, T)``)
    over each row's ``mask``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.count_nonzero(mask, axis=1)[:, None]
        xb = np.where(mask, x, 0.0)
        yb = np.where(mask, y, 0.0)
        # centred within the mask (two passes, for accuracy), in place: these arrays are (b, T)
        xc = xb - xb.sum(axis=1, keepdims=True) / n
        xc *= mask
        yc = yb - yb.sum(axis=1, keepdims=True) / n
        yc *= mask
        sxy, sxx, syy = (np.einsum("ij,ij->i", xc, yc), np.einsum("ij,ij->i", xc, xc), np.einsum("ij,ij->i", yc, yc))
        r = sxy / np.sqrt(sxx * syy)
        # a constant side: scipy returns NaN too (its variance is zero up to rounding)
        degenerate = (sxx <= 1e-24 * np.abs(xb).max(axis=1, initial=0.0) ** 2) | (
            syy <= 1e-24 * np.abs(yb).max(axis=1, initial=0.0) ** 2
        )
    return np.where(degenerate, np.nan, np.clip(r, -1.0, 1.0))
