"""Energy, oracle, anisotropy-capture, IsoScore family and descriptive metrics.

Conventions (DESIGN.md §2): points / gradients are ``(N, d)`` rows; a basis is ``(d, k)`` with
orthonormal columns; a stack of bases is ``(n, d, k)``.  Everything is computed in float64 on
the input's device.  Scalars come back as Python floats, batched results as float64 tensors.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np
import torch

from ._util import as_float64, sym_eigvalsh, warn_degenerate
from .moments import GradientMoments

__all__ = [
    "DEFAULT_ZETA",
    "anisotropy_capture",
    "delta_isoscore_star",
    "effective_rank",
    "effective_rank_from_cov",
    "energy_fraction",
    "energy_fraction_from_moments",
    "isoscore",
    "isoscore_from_cov",
    "isoscore_from_eigenvalues",
    "isoscore_star",
    "isoscore_star_from_cov",
    "mean_cosine",
    "oracle_fraction",
    "participation_ratio",
    "participation_ratio_from_cov",
]

#: Default IsoScore* shrinkage weight ζ.  Light shrinkage: it keeps IsoScore* defined and
#: stable when there are fewer gradients than dimensions, while for N ≫ d it moves the score
#: only slightly (with C0 = scaled identity the shrunk spectrum is (1−ζ)λ + ζ·λ̄, so the
#: participation ratio — hence the score — is pulled towards isotropy by at most a factor
#: governed by ζ).  It is a protocol setting: record it with every result.
DEFAULT_ZETA: float = 0.1

C0Spec = Union[str, torch.Tensor, np.ndarray]


# ============================================================================ energy
def _check_bases(q: torch.Tensor, d: int, name: str = "Q") -> None:
    if q.ndim not in (2, 3):
        raise ValueError(f"{name} must be (d, k) or (n, d, k), got shape {tuple(q.shape)}")
    if q.shape[-2] != d:
        raise ValueError(f"{name} has ambient dimension {q.shape[-2]}, expected d = {d}")


def _second_moment_of(x: Any, name: str = "second_moment") -> torch.Tensor:
    if isinstance(x, GradientMoments):
        return x.second_moment
    m = as_float64(x, name=name, ndim=2)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} must be square (d, d), got {tuple(m.shape)}")
    return m


def energy_fraction(gradients: Any, bases: Any) -> float | torch.Tensor:
    """Pooled energy fraction ``E(Q) = Σ_i ‖Qᵀ g_i‖² / Σ_i ‖g_i‖²``.

    Parameters
    ----------
    gradients : (N, d)
    bases : (d, k) orthonormal → returns a float; or (n, d, k) → float64 tensor (n,).

    Orthonormality of ``Q`` is assumed (not re-checked); with a non-orthonormal Q the value
    is ``‖GQ‖_F² / ‖G‖_F²``.  Returns ``nan`` (with a :class:`DegenerateMetricWarning`) when all
    gradients are zero.
    """
    g = as_float64(gradients, name="gradients", ndim=2)
    q = as_float64(bases, name="bases").to(g.device)
    _check_bases(q, g.shape[1])
    total = torch.sum(g * g)
    if q.ndim == 2:
        num = torch.sum((g @ q) ** 2)
    elif g.shape[0] > g.shape[1]:
        m = g.T @ g  # cheaper than projecting N rows once per basis
        num = torch.einsum("bdk,de,bek->b", q, m, q)
    else:
        num = torch.einsum("nd,bdk->bnk", g, q).pow(2).sum(dim=(1, 2))
    return _ratio(num, total, q.ndim == 2)


def energy_fraction_from_moments(second_moment: Any, bases: Any) -> float | torch.Tensor:
    """``E(Q) = tr(Qᵀ M Q) / tr(M)`` with ``M = GᵀG`` (uncentred second moment, e.g.
    :attr:`GradientMoments.second_moment` or a :class:`GradientMoments`).  Equal to
    :func:`energy_fraction` on the same gradients.  (d, k) → float, (n, d, k) → tensor (n,)."""
    m = _second_moment_of(second_moment)
    q = as_float64(bases, name="bases").to(m.device)
    _check_bases(q, m.shape[0])
    if q.ndim == 2:
        num = torch.einsum("dk,de,ek->", q, m, q)
    else:
        num = torch.einsum("bdk,de,bek->b", q, m, q)
    return _ratio(num, torch.trace(m), q.ndim == 2)


def _ratio(num: torch.Tensor, total: torch.Tensor, scalar: bool) -> float | torch.Tensor:
    if not float(total) > 0.0:
        warn_degenerate("total gradient energy is zero; energy fraction is nan")
        out = torch.full_like(num, float("nan"))
    else:
        out = num / total
    return float(out) if scalar else out


def oracle_fraction(second_moment: Any, k: int) -> float:
    """Oracle ``E*_k`` = (sum of the k largest eigenvalues of ``M = GᵀG``) / tr(M): the largest
    energy fraction any rank-k subspace can capture (attained by the top-k eigenvectors)."""
    m = _second_moment_of(second_moment)
    d = m.shape[0]
    if isinstance(k, bool) or not 1 <= int(k) <= d:
        raise ValueError(f"k must satisfy 1 <= k <= d = {d}, got {k}")
    ev = sym_eigvalsh(m).clamp_min(0.0)
    total = float(ev.sum())
    if not total > 0.0:
        warn_degenerate("second moment has zero trace; oracle fraction is nan")
        return float("nan")
    return float(ev[-int(k):].sum()) / total


def anisotropy_capture(energy: Any, k: int, d: int, oracle: float, *, atol: float = 1e-12) -> Any:
    """Share of the attainable above-isotropic energy that a basis captures:
    ``(E − k/d) / (E*_k − k/d)``.

    1 means the basis is as good as the oracle (top-k eigenvectors of GᵀG), 0 means no better
    than the isotropic baseline k/d (the Haar mean); negative values mean worse than random.

    Degenerate case: when ``|E*_k − k/d| <= atol`` the gradient second moment is isotropic
    (every rank-k subspace captures exactly k/d), there is no excess to capture and the result
    is ``nan`` with a :class:`DegenerateMetricWarning`.

    ``energy`` may be a float (→ float), a numpy array (→ array) or a tensor (→ tensor).
    """
    if not (1 <= k < d):
        raise ValueError(f"need 1 <= k < d, got k={k}, d={d}")
    base = k / d
    denom = float(oracle) - base
    degenerate = not math.isfinite(denom) or abs(denom) <= atol
    if degenerate:
        warn_degenerate(f"oracle fraction {oracle!r} equals the isotropic baseline k/d = {base:.6g}; anisotropy capture is nan")
    if isinstance(energy, torch.Tensor):
        e = energy.to(torch.float64)
        return torch.full_like(e, float("nan")) if degenerate else (e - base) / denom
    if isinstance(energy, np.ndarray):
        e = energy.astype(np.float64)
        return np.full_like(e, np.nan) if degenerate else (e - base) / denom
    return float("nan") if degenerate else (float(energy) - base) / denom


# ============================================================================ IsoScore family
def isoscore_from_eigenvalues(eigenvalues: torch.Tensor) -> torch.Tensor:
    """IsoScore of a covariance spectrum, batched over leading dims (``(..., m)`` → ``(...)``).

    Rudman et al. (2022): with the spectrum normalised to norm √m, the isotropy defect
    ``δ² = ‖λ̂ − 1‖² / (2(m − √m))`` and ``score = ((m − δ²(m − √m))² − m) / (m(m − 1))``.
    Expanding the square shows this is exactly ``(PR − 1)/(m − 1)`` with
    ``PR = (Σ|λ|)² / Σλ²`` the participation ratio, which is how it is computed here
    (absolute values as in the reference package, which uses singular values of the
    covariance).  ``nan`` for m = 1 or an all-zero spectrum.
    """
    lam = eigenvalues.to(torch.float64).abs()
    m = lam.shape[-1]
    s1 = lam.sum(dim=-1)
    s2 = (lam * lam).sum(dim=-1)
    if m < 2:
        return torch.full_like(s1, float("nan"))
    pr = torch.where(s2 > 0, s1 * s1 / torch.where(s2 > 0, s2, torch.ones_like(s2)), torch.full_like(s1, float("nan")))
    return (pr - 1.0) / (m - 1.0)


def _cov_of_points(points: Any) -> torch.Tensor:
    x = as_float64(points, name="points", ndim=2)
    if x.shape[0] < 2:
        raise ValueError(f"need at least 2 points, got {x.shape[0]}")
    return torch.cov(x.T).reshape(x.shape[1], x.shape[1])


def _check_cov(cov: Any, name: str = "cov") -> torch.Tensor:
    c = as_float64(cov, name=name, ndim=2)
    if c.shape[0] != c.shape[1]:
        raise ValueError(f"{name} must be square, got {tuple(c.shape)}")
    return c


def isoscore_from_cov(cov: Any) -> float:
    """IsoScore of a covariance matrix (same meaning as ``IsoScore.IsoScore.IsoScore_cov``)."""
    c = _check_cov(cov)
    return float(isoscore_from_eigenvalues(sym_eigvalsh(c)))


def isoscore(points: Any) -> float:
    """IsoScore of a point cloud ``(n_samples, dim)`` (Rudman et al. 2022), matching
    ``IsoScore.IsoScore.IsoScore``: covariance via ``torch.cov`` (centred, unbiased), then
    :func:`isoscore_from_eigenvalues`.  1 = isotropic, 0 = all variance on one axis."""
    return float(isoscore_from_eigenvalues(sym_eigvalsh(_cov_of_points(points))))


def _resolve_c0(c0: C0Spec, cov: torch.Tensor) -> torch.Tensor:
    """Shrinkage target for a (possibly batched) covariance ``cov`` (..., m, m)."""
    m = cov.shape[-1]
    eye = torch.eye(m, dtype=torch.float64, device=cov.device)
    if isinstance(c0, str):
        if c0 == "identity":
            return eye
        if c0 == "scaled_identity":
            tr = torch.diagonal(cov, dim1=-2, dim2=-1).sum(-1)
            return (tr / m)[..., None, None] * eye
        raise ValueError(f"C0 must be a matrix, 'identity' or 'scaled_identity', got {c0!r}")
    t = _check_cov(c0, name="C0").to(cov.device)
    if t.shape[-1] != m:
        raise ValueError(f"C0 is {tuple(t.shape)}, covariance is {m}x{m}")
    return t


def _check_zeta(zeta: float) -> float:
    z = float(zeta)
    if not 0.0 <= z <= 1.0:
        raise ValueError(f"zeta must lie in [0, 1], got {zeta}")
    return z


def isoscore_star_from_cov(cov: Any, C0: C0Spec = "scaled_identity", zeta: float = DEFAULT_ZETA) -> float:
    """IsoScore* (Rudman & Eickhoff 2023) of a covariance: IsoScore of the shrunk covariance
    ``(1 − ζ)·cov + ζ·C0``.

    ``C0``: a (d, d) matrix, ``"identity"`` (as in the reference package's usual call) or
    ``"scaled_identity"`` = ``tr(cov)/d · I`` — the scale-free choice: the score then does not
    change when the points are multiplied by a constant.
    """
    c = _check_cov(cov)
    z = _check_zeta(zeta)
    s = (1.0 - z) * c + z * _resolve_c0(C0, c)
    return float(isoscore_from_eigenvalues(sym_eigvalsh(s)))


def isoscore_star(points: Any, C0: C0Spec = "scaled_identity", zeta: float = DEFAULT_ZETA) -> float:
    """IsoScore* of a point cloud ``(n_samples, dim)``, matching
    ``IsoScore.IsoScore.IsoScore_star(points, C0, zeta)`` when ``C0`` is a matrix: covariance
    via ``torch.cov`` (unbiased), shrunk ``(1 − ζ)C + ζC0``, then IsoScore of the spectrum.
    ``C0`` may also be ``"identity"`` or ``"scaled_identity"`` (see
    :func:`isoscore_star_from_cov`)."""
    return isoscore_star_from_cov(_cov_of_points(points), C0, zeta)


def delta_isoscore_star(
    moments: Any,
    bases: Any,
    C0: C0Spec = "scaled_identity",
    zeta: float = DEFAULT_ZETA,
    *,
    chunk_size: int | None = None,
) -> float | torch.Tensor:
    """ΔIsoScore*(Q) = IsoScore*(gradients in the complement of span Q) − IsoScore*(gradients).

    The complement term uses the (d − k)-dimensional coordinates ``W`` of the orthogonal
    complement (``[Q W]`` orthogonal): its covariance is ``WᵀCW`` and, for a matrix target,
    its shrinkage target ``WᵀC0W``; ``"scaled_identity"`` uses ``tr(WᵀCW)/(d−k)·I``.  Removing
    Q therefore creates no artificial zero-variance axes, and the result does not depend on
    which complement basis ``W`` is used.  Positive ΔIsoScore* = removing Q makes the
    gradient cloud more isotropic.

    Computation: the spectrum of ``Wᵀ S W`` (S = shrunk covariance in d coordinates, or C for
    scalar targets) equals the spectrum of ``(I − QQᵀ) S (I − QQᵀ)`` minus k zeros; because
    ``S`` is positive semi-definite those zeros are its k smallest eigenvalues, so they are
    dropped — no complement basis is ever formed.  A matrix ``C0`` must therefore be PSD.

    Parameters
    ----------
    moments : GradientMoments (its unbiased covariance is used) or a (d, d) covariance.
    bases : (d, k) → float, or (n, d, k) → float64 tensor (n,) (chunked to bound memory).
    """
    cov = moments.covariance() if isinstance(moments, GradientMoments) else _check_cov(moments)
    d = cov.shape[0]
    z = _check_zeta(zeta)
    q = as_float64(bases, name="bases").to(cov.device)
    _check_bases(q, d, "bases")
    k = q.shape[-1]
    if not 1 <= k < d - 1:
        raise ValueError(f"delta_isoscore_star needs 1 <= k < d - 1 (complement of dimension >= 2), got k={k}, d={d}")
    full = isoscore_star_from_cov(cov, C0, z)

    scalar_target = isinstance(C0, str)
    if scalar_target:
        if C0 not in ("identity", "scaled_identity"):
            raise ValueError(f"C0 must be a matrix, 'identity' or 'scaled_identity', got {C0!r}")
        s = cov
    else:
        c0 = _resolve_c0(C0, cov)
        c0 = 0.5 * (c0 + c0.T)
        ev0 = torch.linalg.eigvalsh(c0)
        if float(ev0[0]) < -1e-10 * max(float(ev0[-1].abs()), 1e-300):
            raise ValueError("a matrix C0 must be positive semi-definite")
        s = (1.0 - z) * cov + z * c0

    qs = q.unsqueeze(0) if q.ndim == 2 else q
    n = qs.shape[0]
    if chunk_size is None:
        chunk_size = max(1, int(2**24 // (d * d)))
    out = torch.empty(n, dtype=torch.float64, device=cov.device)
    for start in range(0, n, chunk_size):
        qb = qs[start : start + chunk_size]
        sq = torch.einsum("de,bek->bdk", s, qb)  # S Q
        qtsq = qb.transpose(1, 2) @ sq  # Qᵀ S Q
        # (I−P) S (I−P) = S − SQQᵀ − QQᵀS + Q(QᵀSQ)Qᵀ
        sqqt = sq @ qb.transpose(1, 2)
        proj = s.unsqueeze(0) - sqqt - sqqt.transpose(1, 2) + qb @ qtsq @ qb.transpose(1, 2)
        ev = sym_eigvalsh(proj)[:, k:].clamp_min(0.0)  # drop the k structural zeros
        if scalar_target:
            m = d - k
            target = torch.ones_like(ev) if C0 == "identity" else ev.sum(-1, keepdim=True) / m
            ev = (1.0 - z) * ev + z * target
        out[start : start + qb.shape[0]] = isoscore_from_eigenvalues(ev)
    out = out - full
    return float(out[0]) if q.ndim == 2 else out


# ============================================================================ descriptive
def mean_cosine(points: Any) -> float:
    """Mean pairwise cosine similarity over distinct pairs (i < j) of the *uncentred* points —
    the classic anisotropy measure (Ethayarajh 2019).

    Computed in O(N d): with unit vectors u_i, ``‖Σ u_i‖² = N + 2 Σ_{i<j} cos_ij`` so the mean is
    ``(‖Σ u_i‖² − N) / (N(N − 1))``.  Zero rows (cosine undefined) are dropped; fewer than two
    non-zero rows gives ``nan`` with a warning.
    """
    x = as_float64(points, name="points", ndim=2)
    norms = torch.linalg.vector_norm(x, dim=1)
    keep = norms > 0
    n = int(keep.sum())
    if n < 2:
        warn_degenerate("mean_cosine needs at least two non-zero points; returning nan")
        return float("nan")
    u = x[keep] / norms[keep, None]
    s = u.sum(dim=0)
    return float((torch.dot(s, s) - n) / (n * (n - 1)))


def participation_ratio_from_cov(matrix: Any) -> float:
    """Participation ratio ``(Σλ)² / Σλ²`` of the eigenvalues λ of a symmetric PSD matrix —
    computed as ``tr(C)² / ‖C‖_F²`` (no eigendecomposition).  Scale-free; between 1 (rank one)
    and d (isotropic).  Works for a covariance or for an uncentred second moment ``GᵀG``."""
    c = _check_cov(matrix, name="matrix")
    c = 0.5 * (c + c.T)
    fro2 = float(torch.sum(c * c))
    if not fro2 > 0:
        warn_degenerate("participation ratio of a zero matrix is nan")
        return float("nan")
    return float(torch.trace(c)) ** 2 / fro2


def participation_ratio(points: Any, *, center: bool = True) -> float:
    """Participation ratio ``(Σλ)² / Σλ²`` of the eigenvalues λ of the covariance of
    ``points`` (``center=True``, default) or of the uncentred second moment ``XᵀX``
    (``center=False``).  λ are covariance eigenvalues (= σ²/(N−1) of the centred data)."""
    x = as_float64(points, name="points", ndim=2)
    m = torch.cov(x.T).reshape(x.shape[1], x.shape[1]) if center else x.T @ x
    return participation_ratio_from_cov(m)


def _erank_from_singular_values(sv: torch.Tensor) -> float:
    sv = sv.clamp_min(0.0)
    total = float(sv.sum())
    if not total > 0:
        warn_degenerate("effective rank of a zero matrix is nan")
        return float("nan")
    p = sv / total
    p = p[p > 0]
    return float(torch.exp(-(p * torch.log(p)).sum()))


def effective_rank(points: Any, *, center: bool = True) -> float:
    """Effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p_i = σ_i / Σσ_j`` the
    normalised **singular values** σ of the data matrix — the centred matrix by default
    (``center=True``), the raw matrix with ``center=False``.  Between 1 and min(N, d).
    Note σ (not λ = σ²): it equals :func:`effective_rank_from_cov` of the covariance
    (resp. of ``XᵀX``)."""
    x = as_float64(points, name="points", ndim=2)
    if center:
        x = x - x.mean(dim=0, keepdim=True)
    return _erank_from_singular_values(torch.linalg.svdvals(x))


def effective_rank_from_cov(matrix: Any) -> float:
    """Roy–Vetterli effective rank from a covariance / second moment ``C``: singular values of
    the underlying data are ``σ_i ∝ √λ_i(C)``, so ``p_i = √λ_i / Σ√λ_j`` and the result is
    ``exp(H(p))``; consistent with :func:`effective_rank` on the points (the 1/(N−1) factor
    cancels)."""
    c = _check_cov(matrix, name="matrix")
    return _erank_from_singular_values(sym_eigvalsh(c).clamp_min(0.0).sqrt())
