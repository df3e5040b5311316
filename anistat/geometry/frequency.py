"""Token-frequency analysis on plain arrays (no resampling here — the analysis layer adds
sequence-bootstrap CIs).

* :func:`frequency_buckets` — bucket index per token id from corpus counts.
* :func:`centroid_distances` — per token type, the mean Euclidean distance of its occurrences'
  activations to the type's activation centroid.
* :func:`log_frequency_correlation` — Spearman and Pearson correlation of log-frequency with
  that distance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from scipy import stats

from ._util import as_tensor

__all__ = [
    "CentroidDistances",
    "FrequencyCorrelation",
    "centroid_distances",
    "frequency_buckets",
    "log_frequency_correlation",
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
    """
    c = np.asarray(counts.detach().cpu().numpy() if isinstance(counts, torch.Tensor) else counts, dtype=np.float64).ravel()
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


@dataclass(frozen=True)
class CentroidDistances:
    """Per token type (sorted by id): ``token_types`` (T,), ``n_occurrences`` (T,),
    ``mean_distance`` (T,) = mean over the type's occurrences of ‖a_i − c_t‖₂ with
    ``c_t`` the mean activation of the type; ``token_distance`` (N,) = ‖a_i − c_{t(i)}‖₂ for
    every input row (before any ``min_occurrences`` filter)."""

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
    """
    a = as_tensor(activations, name="activations").to(torch.float64)
    ids = as_tensor(token_ids, name="token_ids").to(a.device).long().ravel()
    if a.ndim != 2 or ids.shape[0] != a.shape[0]:
        raise ValueError(f"activations (N, d) and token_ids (N,) must align; got {tuple(a.shape)} and {tuple(ids.shape)}")
    types, inv, cnt = torch.unique(ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(types.shape[0], a.shape[1], dtype=torch.float64, device=a.device).index_add_(0, inv, a)
    cent = sums / cnt[:, None].to(torch.float64)
    dist = torch.linalg.vector_norm(a - cent[inv], dim=1)
    mean_d = torch.zeros(types.shape[0], dtype=torch.float64, device=a.device).index_add_(0, inv, dist) / cnt.to(torch.float64)
    keep = cnt >= int(min_occurrences)
    return CentroidDistances(
        token_types=types[keep].cpu().numpy(),
        n_occurrences=cnt[keep].cpu().numpy(),
        mean_distance=mean_d[keep].cpu().numpy(),
        token_distance=dist.cpu().numpy(),
    )


@dataclass(frozen=True)
class FrequencyCorrelation:
    """Correlation of ``log(count)`` with distance over ``n_types`` types."""

    spearman_rho: float
    spearman_p: float
    pearson_r: float
    pearson_p: float
    n_types: int


def log_frequency_correlation(counts: Any, distances: Any) -> FrequencyCorrelation:
    """Spearman ρ and Pearson r (``scipy.stats``, two-sided p) between ``log(counts)`` and
    ``distances`` (aligned per type, e.g. corpus counts of ``CentroidDistances.token_types``
    against ``mean_distance``).  Pairs with count ≤ 0 or a non-finite value are dropped;
    fewer than 3 pairs (or a constant input) gives nan."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    x = np.asarray(distances, dtype=np.float64).ravel()
    if c.shape != x.shape:
        raise ValueError(f"counts and distances must align, got {c.shape} and {x.shape}")
    ok = (c > 0) & np.isfinite(c) & np.isfinite(x)
    lc, x = np.log(c[ok]), x[ok]
    n = int(ok.sum())
    if n < 3 or np.ptp(lc) == 0 or np.ptp(x) == 0:
        nan = float("nan")
        return FrequencyCorrelation(nan, nan, nan, nan, n)
    sr = stats.spearmanr(lc, x)
    pr = stats.pearsonr(lc, x)
    return FrequencyCorrelation(float(sr.statistic), float(sr.pvalue), float(pr.statistic), float(pr.pvalue), n)
