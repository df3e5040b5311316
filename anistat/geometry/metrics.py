"""Energy, oracle, anisotropy-capture, IsoScore family and descriptive metrics.

Conventions (DESIGN.md §2): points / gradients are ``(N, d)`` rows; a basis is ``(d, k)`` with
orthonormal columns; a stack of bases is ``(n, d, k)``.  Everything is computed in float64 on
the input's device.  Scalars come back as Python floats, batched results as float64 tensors.

The IsoScore family needs no eigen-decomposition: IsoScore = (PR − 1)/(d − 1) with
PR = tr(C)²/‖C‖_F² the participation ratio (exact for the package's definition; derivation
above :func:`isoscore_from_eigenvalues`).  Hence the gradient IsoScore and the gradient
participation ratio carry the same information.  IsoScore* and ΔIsoScore* follow from traces
and Frobenius norms too (O(d²k) per removed basis, O(dk²) in the covariance's eigenbasis).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ._util import as_float64, sym_eigvalsh, warn_degenerate
from .moments import GradientMoments

__all__ = [
    "DEFAULT_ZETA",
    "anisotropy_capture",
    "delta_isoscore_star",
    "delta_isoscore_star_from_traces",
    "effective_rank",
    "effective_rank_from_cov",
    "effective_rank_from_eigenvalues",
    "energy_fraction",
    "energy_fraction_from_moments",
    "isoscore",
    "isoscore_from_cov",
    "isoscore_from_eigenvalues",
    "isoscore_from_trace_frobenius",
    "isoscore_star",
    "isoscore_star_from_cov",
    "mean_cosine",
    "oracle_fraction",
    "oracle_fractions",
    "participation_ratio",
    "participation_ratio_from_cov",
    "removal_traces",
    "removal_traces_in_eigenbasis",
    "shrunk_trace_frobenius",
]

#: Default IsoScore* shrinkage weight ζ.  Light shrinkage: it keeps IsoScore* defined and
#: stable when there are fewer gradients than dimensions, while for N ≫ d it moves the score
#: only slightly (with C0 = scaled identity the shrunk spectrum is (1−ζ)λ + ζ·λ̄, so the
#: participation ratio — hence the score — is pulled towards isotropy by at most a factor
#: governed by ζ).  It is a protocol setting: record it with every result.
DEFAULT_ZETA: float = 0.1

C0Spec = str | torch.Tensor | np.ndarray


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

    Orthonormality of ``Q`` is assumed (not re-checked); with a non-orthonormal Q the value
    is ``‖GQ‖_F² / ‖G‖_F²``.  Returns ``nan`` (with a :class:`DegenerateMetricWarning`) when all
    gradients are zero.

    Parameters
    ----------
    gradients : array_like of shape (N, d)
        The gradients ``g_i``.
    bases : array_like of shape (d, k) or (n, d, k)
        Orthonormal bases ``Q``.

    Returns
    -------
    float or Tensor of shape (n,), float64
        ``E(Q)`` of the basis, or of each basis of the stack.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    >>> geometry.energy_fraction(g, torch.tensor([[1.0], [0.0]]))
    0.3103448275862069
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
    :func:`energy_fraction` on the same gradients.  (d, k) → float, (n, d, k) → tensor (n,).

    Parameters
    ----------
    second_moment : GradientMoments or array_like of shape (d, d)
        ``M = GᵀG`` (or the moments it is read from).
    bases : array_like of shape (d, k) or (n, d, k)
        Orthonormal bases.

    Returns
    -------
    float or Tensor of shape (n,)
        ``E(Q)`` of the basis, or of each basis of the stack (float64).

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> m = torch.tensor([[9.0, 12.0], [12.0, 20.0]])
    >>> geometry.energy_fraction_from_moments(m, torch.tensor([[1.0], [0.0]]))
    0.3103448275862069
    """
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
    energy fraction any rank-k subspace can capture (attained by the top-k eigenvectors).

    Parameters
    ----------
    second_moment : GradientMoments or array_like of shape (d, d)
        ``M = GᵀG``.
    k : int
        The rank.

    Returns
    -------
    float
        ``E*_k``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.oracle_fraction(torch.diag(torch.tensor([3.0, 1.0, 0.0, 0.0])), 1), 4)
    0.75
    """
    if isinstance(k, bool):
        raise ValueError(f"k must be an integer rank, got {k}")
    return oracle_fractions(second_moment, [k])[int(k)]


def oracle_fractions(second_moment: Any, ranks: Any) -> dict[int, float]:
    """:func:`oracle_fraction` for several ranks from one eigen-decomposition of ``M``:
    ``{k: E*_k}``.  Empty ``ranks`` → ``{}`` (nothing is decomposed).

    Parameters
    ----------
    second_moment : GradientMoments or array_like of shape (d, d)
        ``M = GᵀG``.
    ranks : iterable of int
        The ranks.

    Returns
    -------
    dict of int to float
        ``{k: E*_k}``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> geometry.oracle_fractions(torch.diag(torch.tensor([3.0, 1.0, 0.0, 0.0])), [1, 2])
    {1: 0.75, 2: 1.0}
    """
    m = _second_moment_of(second_moment)
    ranks = [int(k) for k in ranks]
    _check_oracle_ranks(ranks, m.shape[0])
    if not ranks:
        return {}
    return oracle_fractions_of_spectrum(sym_eigvalsh(m), ranks)


def oracle_fractions_of_spectrum(eigenvalues: Any, ranks: Any) -> dict[int, float]:
    """``{k: E*_k}`` from the eigenvalues of ``M`` in ascending order (e.g. a
    :class:`~anistat.geometry.SpectralFrame`'s, which the analysis has already computed);
    negative rounding residue is clamped to 0. Zero trace → NaN with a
    :class:`DegenerateMetricWarning`.

    Parameters
    ----------
    eigenvalues : array_like of shape (d,)
        The eigenvalues of ``M``, ascending.
    ranks : iterable of int
        The ranks.

    Returns
    -------
    dict of int to float
        ``{k: E*_k}``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> geometry.oracle_fractions_of_spectrum(torch.tensor([0.0, 0.0, 1.0, 3.0]), [1, 2])  # ascending, as eigh returns them
    {1: 0.75, 2: 1.0}
    """
    ev = torch.as_tensor(eigenvalues, dtype=torch.float64).clamp_min(0.0)
    ranks = [int(k) for k in ranks]
    _check_oracle_ranks(ranks, ev.shape[0])
    total = float(ev.sum())
    if not total > 0.0:
        warn_degenerate("second moment has zero trace; oracle fraction is nan")
        return {k: float("nan") for k in ranks}
    return {k: float(ev[-k:].sum()) / total for k in ranks}


def _check_oracle_ranks(ranks: list[int], d: int) -> None:
    for k in ranks:
        if not 1 <= k <= d:
            raise ValueError(f"k must satisfy 1 <= k <= d = {d}, got {k}")


def anisotropy_capture(energy: Any, k: int, d: int, oracle: float, *, atol: float = 1e-12) -> Any:
    """Share of the attainable above-isotropic energy that a basis captures:
    ``(E − k/d) / (E*_k − k/d)``.

    1 means the basis is as good as the oracle (top-k eigenvectors of GᵀG), 0 means no better
    than the isotropic baseline k/d (the Haar mean); negative values mean worse than random.

    Degenerate case: when ``|E*_k − k/d| <= atol`` the gradient second moment is isotropic
    (every rank-k subspace captures exactly k/d), there is no excess to capture and the result
    is ``nan`` with a :class:`DegenerateMetricWarning`.

    ``energy`` may be a float (→ float), a numpy array (→ array) or a tensor (→ tensor).

    Parameters
    ----------
    energy : float, ndarray or Tensor
        The basis' energy fraction ``E`` (any shape).
    k : int
        The basis' rank.
    d : int
        The dimension.
    oracle : float
        The oracle fraction ``E*_k`` (:func:`oracle_fraction`).
    atol : float, default 1e-12
        ``|E*_k − k/d|`` at or below this is the degenerate (isotropic) case.

    Returns
    -------
    float, ndarray or Tensor
        ``(E − k/d) / (E*_k − k/d)``, the type of ``energy``; NaN in the degenerate case.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(float(geometry.anisotropy_capture(0.5, k=2, d=16, oracle=0.8)), 4)
    0.5556
    """
    if not (1 <= k < d):
        raise ValueError(f"need 1 <= k < d, got k={k}, d={d}")
    base = k / d
    denom = float(oracle) - base
    degenerate = not math.isfinite(denom) or abs(denom) <= atol
    if degenerate:
        warn_degenerate(
            f"oracle fraction {oracle!r} equals the isotropic baseline k/d = {base:.6g}; anisotropy capture is nan"
        )
    if isinstance(energy, torch.Tensor):
        e = energy.to(torch.float64)
        return torch.full_like(e, float("nan")) if degenerate else (e - base) / denom
    if isinstance(energy, np.ndarray):
        e = energy.astype(np.float64)
        return np.full_like(e, np.nan) if degenerate else (e - base) / denom
    return float("nan") if degenerate else (float(energy) - base) / denom


# ============================================================================ IsoScore family
#
# IsoScore needs no eigen-decomposition.  The package (Rudman et al. 2022) takes the spectrum σ
# of the covariance (its singular values; for a PSD matrix these are its eigenvalues λ),
# normalises it to norm √m, measures δ² = ‖σ̂ − 1‖²/(2(m − √m)) and rescales.  Expanding,
# ‖σ̂ − 1‖² = 2m − 2√m·Σσ/‖σ‖, so m − δ²(m − √m) = √m·Σσ/‖σ‖ and
#     score = (m·(Σσ)²/‖σ‖² − m) / (m(m − 1)) = (PR − 1)/(m − 1),   PR = (Σσ)²/Σσ².
# For a PSD matrix C, Σσ = tr C and Σσ² = ‖C‖_F², so IsoScore = (tr(C)²/‖C‖_F² − 1)/(m − 1):
# the score is an affine function of the participation ratio, and every variant below only
# needs a trace and a Frobenius norm.
def isoscore_from_eigenvalues(eigenvalues: torch.Tensor) -> torch.Tensor:
    """IsoScore of a covariance spectrum, batched over leading dims (``(..., m)`` → ``(...)``).

    Rudman et al. (2022): with the spectrum normalised to norm √m, the isotropy defect
    ``δ² = ‖λ̂ − 1‖² / (2(m − √m))`` and ``score = ((m − δ²(m − √m))² − m) / (m(m − 1))``.
    Expanding the square shows this is exactly ``(PR − 1)/(m − 1)`` with
    ``PR = (Σ|λ|)² / Σλ²`` the participation ratio, which is how it is computed here
    (absolute values as in the reference package, which uses singular values of the
    covariance).  ``nan`` for m = 1 or an all-zero spectrum.

    Parameters
    ----------
    eigenvalues : Tensor of shape (..., m)
        Covariance spectra.

    Returns
    -------
    Tensor of shape (...)
        The IsoScore of each spectrum (NaN for m = 1 or an all-zero spectrum).

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(float(geometry.isoscore_from_eigenvalues(torch.tensor([1.0, 1.0, 1.0]))), 4)
    1.0
    """
    lam = eigenvalues.to(torch.float64).abs()
    return isoscore_from_trace_frobenius(lam.sum(dim=-1), (lam * lam).sum(dim=-1), lam.shape[-1])


def isoscore_from_trace_frobenius(trace: Any, frobenius_sq: Any, m: int) -> torch.Tensor:
    """IsoScore of an m×m PSD matrix C from ``tr C`` and ``‖C‖_F²`` (batched, broadcasting):
    ``(PR − 1)/(m − 1)`` with ``PR = tr(C)² / ‖C‖_F²``.  ``nan`` for m < 2 or ‖C‖_F = 0.

    Exact for positive semi-definite C (then Σ|λ| = tr C); see the derivation above
    :func:`isoscore_from_eigenvalues`.

    Parameters
    ----------
    trace : array_like
        ``tr C``.
    frobenius_sq : array_like
        ``‖C‖_F²``.
    m : int
        The matrix's size.

    Returns
    -------
    Tensor
        ``(PR − 1)/(m − 1)``, broadcast over the inputs.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(float(geometry.isoscore_from_trace_frobenius(torch.tensor(4.0), torch.tensor(4.0), 4)), 4)
    1.0
    """
    tr = torch.as_tensor(trace, dtype=torch.float64)
    fro2 = torch.as_tensor(frobenius_sq, dtype=torch.float64, device=tr.device)
    tr, fro2 = torch.broadcast_tensors(tr, fro2)
    if m < 2:
        return torch.full_like(tr, float("nan"))
    positive = fro2 > 0
    pr = torch.where(
        positive, tr * tr / torch.where(positive, fro2, torch.ones_like(fro2)), torch.full_like(tr, float("nan"))
    )
    return (pr - 1.0) / (m - 1.0)


def _trace_frobenius(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tr C`` and ``‖C‖_F²`` of (..., m, m) matrices."""
    return torch.diagonal(c, dim1=-2, dim2=-1).sum(-1), (c * c).sum(dim=(-2, -1))


def shrunk_trace_frobenius(
    trace: Any, frobenius_sq: Any, m: int, C0: str, zeta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tr S`` and ``‖S‖_F²`` of the IsoScore* shrinkage ``S = (1 − ζ)C + ζ·c·I_m`` in closed
    form from ``tr C`` and ``‖C‖_F²`` (batched):

        tr S    = (1 − ζ) tr C + ζ c m
        ‖S‖_F² = (1 − ζ)² ‖C‖_F² + 2 ζ (1 − ζ) c tr C + ζ² c² m,

    with ``c = 1`` for ``C0 = "identity"`` and ``c = tr(C)/m`` for ``"scaled_identity"``.

    Parameters
    ----------
    trace : array_like
        ``tr C``.
    frobenius_sq : array_like
        ``‖C‖_F²``.
    m : int
        The matrix's size.
    C0 : {"identity", "scaled_identity"}
        The scalar shrinkage target.
    zeta : float
        The shrinkage weight ``ζ``.

    Returns
    -------
    trace : Tensor
        ``tr S``.
    frobenius_sq : Tensor
        ``‖S‖_F²``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> t, f = geometry.shrunk_trace_frobenius(torch.tensor(4.0), torch.tensor(16.0), 4, 'scaled_identity', 0.1)
    >>> round(float(t), 4), round(float(f), 4)
    (4.0, 13.72)
    """
    z = _check_zeta(zeta)
    tr = torch.as_tensor(trace, dtype=torch.float64)
    fro2 = torch.as_tensor(frobenius_sq, dtype=torch.float64, device=tr.device)
    if C0 == "identity":
        c = torch.ones_like(tr)
    elif C0 == "scaled_identity":
        c = tr / m
    else:
        raise ValueError(f"C0 must be a matrix, 'identity' or 'scaled_identity', got {C0!r}")
    tr_s = (1.0 - z) * tr + z * c * m
    fro2_s = (1.0 - z) ** 2 * fro2 + 2.0 * z * (1.0 - z) * c * tr + z * z * c * c * m
    return tr_s, fro2_s


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
    """IsoScore of a covariance matrix (same value as ``IsoScore.IsoScore.IsoScore_cov``),
    computed without an eigen-decomposition as ``(PR − 1)/(d − 1)``, ``PR = tr(C)²/‖C‖_F²``.

    ``cov`` must be positive semi-definite (any covariance is); for a general symmetric
    matrix the package's singular-value definition is ``isoscore_from_eigenvalues(svdvals)``.
    The gradient IsoScore and the gradient participation ratio
    (:func:`participation_ratio_from_cov`) therefore carry the same information: one is an
    affine function of the other, ``IsoScore = (PR − 1)/(d − 1)``.

    Parameters
    ----------
    cov : array_like of shape (d, d)
        A covariance (PSD).

    Returns
    -------
    float
        ``(PR − 1)/(d − 1)``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.isoscore_from_cov(torch.eye(4)), 4), round(geometry.isoscore_from_cov(torch.diag(torch.tensor([1.0, 0.0, 0.0, 0.0]))), 4)
    (1.0, 0.0)
    """
    c = _check_cov(cov)
    tr, fro2 = _trace_frobenius(0.5 * (c + c.T))
    return float(isoscore_from_trace_frobenius(tr, fro2, c.shape[0]))


def isoscore(points: Any) -> float:
    """IsoScore of a point cloud ``(n_samples, dim)`` (Rudman et al. 2022), matching
    ``IsoScore.IsoScore.IsoScore``: covariance via ``torch.cov`` (centred, unbiased), then
    :func:`isoscore_from_cov` (closed form, no eigen-decomposition).  1 = isotropic, 0 = all
    variance on one axis.

    Parameters
    ----------
    points : array_like of shape (n_samples, dim)
        The point cloud.

    Returns
    -------
    float
        The IsoScore, in ``[0, 1]``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.isoscore(torch.randn(2000, 4, generator=torch.Generator().manual_seed(0))), 2)
    1.0
    """
    return isoscore_from_cov(_cov_of_points(points))


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
    ``S = (1 − ζ)·cov + ζ·C0``.

    ``C0``: a (d, d) matrix, ``"identity"`` (as in the reference package's usual call) or
    ``"scaled_identity"`` = ``tr(cov)/d · I`` — the scale-free choice: the score then does not
    change when the points are multiplied by a constant.

    Computation: for the two scalar targets ``tr S`` and ``‖S‖_F²`` are closed forms in
    ``tr C`` and ``‖C‖_F²`` (:func:`shrunk_trace_frobenius`), and IsoScore = (PR(S) − 1)/(d − 1)
    — no eigen-decomposition.  A matrix ``C0`` may be indefinite, where the package's
    singular-value definition differs from the trace form, so that case takes the general
    path (the spectrum of S).

    Parameters
    ----------
    cov : array_like of shape (d, d)
        The covariance.
    C0 : {"scaled_identity", "identity"} or array_like of shape (d, d), default "scaled_identity"
        The shrinkage target.
    zeta : float, default 0.1
        The shrinkage weight ``ζ``.

    Returns
    -------
    float
        IsoScore of ``(1 − ζ)·cov + ζ·C0``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.isoscore_star_from_cov(torch.eye(4)), 4)
    1.0
    """
    c = _check_cov(cov)
    z = _check_zeta(zeta)
    if isinstance(C0, str):
        tr, fro2 = _trace_frobenius(0.5 * (c + c.T))
        tr_s, fro2_s = shrunk_trace_frobenius(tr, fro2, c.shape[0], C0, z)
        return float(isoscore_from_trace_frobenius(tr_s, fro2_s, c.shape[0]))
    s = (1.0 - z) * c + z * _resolve_c0(C0, c)
    return float(isoscore_from_eigenvalues(sym_eigvalsh(s)))


def isoscore_star(points: Any, C0: C0Spec = "scaled_identity", zeta: float = DEFAULT_ZETA) -> float:
    """IsoScore* of a point cloud ``(n_samples, dim)``, matching
    ``IsoScore.IsoScore.IsoScore_star(points, C0, zeta)`` when ``C0`` is a matrix: covariance
    via ``torch.cov`` (unbiased), shrunk ``(1 − ζ)C + ζC0``, then IsoScore of the spectrum.
    ``C0`` may also be ``"identity"`` or ``"scaled_identity"`` (see
    :func:`isoscore_star_from_cov`).

    Parameters
    ----------
    points : array_like of shape (n_samples, dim)
        The point cloud.
    C0 : {"scaled_identity", "identity"} or array_like of shape (dim, dim), default "scaled_identity"
        The shrinkage target.
    zeta : float, default 0.1
        The shrinkage weight ``ζ``.

    Returns
    -------
    float
        IsoScore* of the points.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.isoscore_star(torch.randn(2000, 4, generator=torch.Generator().manual_seed(0))), 2)
    1.0
    """
    return isoscore_star_from_cov(_cov_of_points(points), C0, zeta)


#: below this share of ‖S‖_F² left after removing Q, the Frobenius identity
#: ‖PSP‖² = ‖S‖² − 2‖SQ‖² + ‖QᵀSQ‖² has cancelled too many digits (float64 keeps ~16; the
#: statistics promise 1e-6), and that basis' ‖PSP‖_F² is computed from PSP itself instead.
_CANCELLATION_GUARD = 1e-6


def removal_traces(matrix: torch.Tensor, bases: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For a symmetric (d, d) ``matrix`` S and a stack of orthonormal bases (n, d, k): the three
    quantities that give ``tr`` and ``‖·‖_F²`` of S with span Q removed, in O(d²k) per basis:

        tr(QᵀSQ),  ‖SQ‖_F²,  ‖QᵀSQ‖_F²      (each (n,), float64)

    With ``P = I − QQᵀ``: ``tr(PSP) = tr S − tr(QᵀSQ)`` and
    ``‖PSP‖_F² = ‖S‖_F² − 2‖SQ‖_F² + ‖QᵀSQ‖_F²`` (expand ``PSP = S − SQQᵀ − QQᵀS +
    Q(QᵀSQ)Qᵀ`` and use ``QᵀQ = I``).  One (d, k) basis gives 0-d tensors.  See
    :func:`removal_traces_in_eigenbasis` for O(dk²).

    Parameters
    ----------
    matrix : Tensor of shape (d, d)
        The symmetric matrix ``S``.
    bases : Tensor of shape (n, d, k) or (d, k)
        Orthonormal bases.

    Returns
    -------
    trace : Tensor of shape (n,) (0-d for one basis), float64
        ``tr(QᵀSQ)``.
    cross_sq : Tensor of shape (n,) (0-d for one basis), float64
        ``‖SQ‖_F²``.
    block_sq : Tensor of shape (n,) (0-d for one basis), float64
        ``‖QᵀSQ‖_F²``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> t, c, b = geometry.removal_traces(torch.eye(8, dtype=torch.float64), basis.unsqueeze(0))
    >>> t.tolist(), c.tolist(), b.tolist()
    ([2.0], [2.0], [2.0])
    """
    s = as_float64(matrix, name="matrix", ndim=2)
    q = as_float64(bases, name="bases").to(s.device)
    _check_bases(q, s.shape[0], "bases")
    sq = s @ q  # S Q, batched over a leading dim
    qsq = q.transpose(-1, -2) @ sq  # Qᵀ S Q
    return (
        torch.diagonal(qsq, dim1=-2, dim2=-1).sum(-1),
        sq.square().sum(dim=(-2, -1)),
        qsq.square().sum(dim=(-2, -1)),
    )


def removal_traces_in_eigenbasis(eigenvalues: Any, bases: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same three quantities as :func:`removal_traces`, for ``S = V diag(λ) Vᵀ`` given its
    eigenvalues ``λ`` (d,) and bases already expressed in its eigenbasis (``Vᵀ Q``, shape
    (n, d, k) or (d, k)) — O(dk²) per basis, no d×d matrix touched:

        tr(QᵀSQ)   = Σ_j λ_j Σ_i Q_ji²
        ‖SQ‖_F²    = Σ_j λ_j² Σ_i Q_ji²
        ‖QᵀSQ‖_F² = ‖Qᵀ (λ ∘ Q)‖_F²

    Returns float64 tensors of shape (n,) (or scalars' 0-d tensors for one (d, k) basis) on
    the bases' device.  Feed them to :func:`delta_isoscore_star_from_traces` with
    ``trace = Σλ`` and ``frobenius_sq = Σλ²``.  Use it for many Monte-Carlo draws: a Haar draw
    can be made directly in eigenbasis coordinates (Haar measure is rotation invariant).

    Parameters
    ----------
    eigenvalues : array_like of shape (d,)
        The eigenvalues ``λ`` of ``S``.
    bases : array_like of shape (n, d, k) or (d, k)
        Orthonormal bases in ``S``'s eigenbasis (``VᵀQ``).

    Returns
    -------
    trace : Tensor of shape (n,) (0-d for one basis), float64
        ``tr(QᵀSQ)``.
    cross_sq : Tensor of shape (n,) (0-d for one basis), float64
        ``‖SQ‖_F²``.
    block_sq : Tensor of shape (n,) (0-d for one basis), float64
        ``‖QᵀSQ‖_F²``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> t, c, b = geometry.removal_traces_in_eigenbasis(torch.ones(8, dtype=torch.float64), basis.unsqueeze(0))
    >>> t.tolist(), c.tolist(), b.tolist()
    ([2.0], [2.0], [2.0])
    """
    q = as_float64(bases, name="bases")
    lam = as_float64(eigenvalues, name="eigenvalues", ndim=1).to(q.device)
    _check_bases(q, lam.shape[0], "bases")
    row_sq = q.square().sum(-1)  # (..., d): Σ_i Q_ji²
    lq = lam.unsqueeze(-1) * q  # Λ Q
    qlq = q.transpose(-1, -2) @ lq  # Qᵀ Λ Q  (k, k)
    return row_sq @ lam, row_sq @ (lam * lam), qlq.square().sum(dim=(-2, -1))


def delta_isoscore_star_from_traces(
    trace: Any,
    frobenius_sq: Any,
    removed_trace: Any,
    removed_cross_sq: Any,
    removed_block_sq: Any,
    *,
    dim: int,
    rank: int,
    C0: str | None = "scaled_identity",
    zeta: float = DEFAULT_ZETA,
) -> torch.Tensor:
    """ΔIsoScore* from traces (batched; see :func:`delta_isoscore_star` for the definition).

    ``trace``/``frobenius_sq``: ``tr S`` and ``‖S‖_F²`` of the d×d matrix; ``removed_*``:
    ``tr(QᵀSQ)``, ``‖SQ‖_F²``, ``‖QᵀSQ‖_F²`` per basis (:func:`removal_traces` or
    :func:`removal_traces_in_eigenbasis`).  ``C0``: ``"identity"`` or ``"scaled_identity"`` with
    S = C the (unshrunk) covariance — the shrinkage is applied in closed form, in d
    coordinates for the full score and in the (d − k) complement coordinates for the removed
    one; or ``None`` when S is already the shrunk ``(1 − ζ)C + ζC0`` of a PSD matrix target
    (its complement restriction ``Wᵀ S W`` is then the complement's shrunk covariance).

    Precision: ``‖PSP‖_F²`` is a difference of terms up to ``‖S‖_F²``; it loses
    ``log10(‖S‖_F²/‖PSP‖_F²)`` of float64's ~16 digits (irrelevant unless Q removes nearly all
    of S's Frobenius mass — :func:`delta_isoscore_star` recomputes such bases directly).

    Parameters
    ----------
    trace : array_like
        ``tr S`` of the d × d matrix.
    frobenius_sq : array_like
        ``‖S‖_F²``.
    removed_trace : array_like
        ``tr(QᵀSQ)`` per basis.
    removed_cross_sq : array_like
        ``‖SQ‖_F²`` per basis.
    removed_block_sq : array_like
        ``‖QᵀSQ‖_F²`` per basis.
    dim : int
        The dimension ``d``.
    rank : int
        The bases' rank ``k`` (``d − k >= 2``).
    C0 : {"scaled_identity", "identity"} or None, default "scaled_identity"
        The scalar shrinkage target; None when ``S`` is already shrunk.
    zeta : float, default 0.1
        The shrinkage weight ``ζ``.

    Returns
    -------
    Tensor, float64
        ΔIsoScore* per basis (broadcast shape of the ``removed_*`` inputs).

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> m = torch.cov(g.T)
    >>> t, c, b = geometry.removal_traces(m, basis.unsqueeze(0))
    >>> value = geometry.delta_isoscore_star_from_traces(torch.trace(m), (m * m).sum(), t, c, b, dim=8, rank=2)
    >>> bool(torch.isclose(value, torch.as_tensor(geometry.delta_isoscore_star(m, basis), dtype=value.dtype)).all())
    True
    """
    tr = torch.as_tensor(trace, dtype=torch.float64)
    fro2 = torch.as_tensor(frobenius_sq, dtype=torch.float64, device=tr.device)
    f64: dict[str, Any] = dict(dtype=torch.float64, device=tr.device)
    tr_p = tr - torch.as_tensor(removed_trace, **f64)
    fro2_p = fro2 - 2.0 * torch.as_tensor(removed_cross_sq, **f64) + torch.as_tensor(removed_block_sq, **f64)
    return _delta_from_parts(tr, fro2, tr_p, fro2_p.clamp_min(0.0), dim, rank, C0, zeta)


def _delta_from_parts(tr, fro2, tr_p, fro2_p, dim: int, rank: int, C0: str | None, zeta: float) -> torch.Tensor:
    z = _check_zeta(zeta)
    m = dim - rank
    if C0 is None:
        full = isoscore_from_trace_frobenius(tr, fro2, dim)
        removed = isoscore_from_trace_frobenius(tr_p, fro2_p, m)
    else:
        full = isoscore_from_trace_frobenius(*shrunk_trace_frobenius(tr, fro2, dim, C0, z), dim)
        removed = isoscore_from_trace_frobenius(*shrunk_trace_frobenius(tr_p, fro2_p, m, C0, z), m)
    return removed - full


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

    Computation (no eigen-decomposition, O(d²k) per basis): IsoScore = (PR − 1)/(m − 1) with
    PR = tr²/‖·‖_F² (see :func:`isoscore_from_cov`), and ``WᵀSW`` has the trace and Frobenius
    norm of ``PSP`` (P = I − QQᵀ): ``tr(PSP) = tr S − tr(QᵀSQ)``, ``‖PSP‖_F² = ‖S‖_F² −
    2‖SQ‖_F² + ‖QᵀSQ‖_F²`` (:func:`removal_traces`), with S = C for the scalar targets (shrunk
    afterwards in closed form) and S = (1 − ζ)C + ζC0 for a matrix target, which must then be
    positive semi-definite (checked once, by its eigenvalues).  Where removing Q leaves less
    than 1e-6 of ‖S‖_F² (the identity would cancel digits), that basis' ``PSP`` is formed
    and measured directly.

    Parameters
    ----------
    moments : GradientMoments or array_like of shape (d, d)
        The moments (their unbiased covariance is used) or a covariance ``C``.
    bases : array_like of shape (d, k) or (n, d, k)
        Orthonormal bases ``Q`` (``d − k >= 2``).
    C0 : {"scaled_identity", "identity"} or array_like of shape (d, d), default "scaled_identity"
        The shrinkage target.
    zeta : float, default 0.1
        The shrinkage weight ``ζ``.
    chunk_size : int, optional
        Bases per chunk of a stack (None: chosen to bound memory).

    Returns
    -------
    float or Tensor of shape (n,), float64
        ΔIsoScore* of the basis, or of each basis of the stack.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> cov = torch.cov(g.T)
    >>> round(float(geometry.delta_isoscore_star(cov, basis)), 4)
    0.0231
    """
    cov = moments.covariance() if isinstance(moments, GradientMoments) else _check_cov(moments)
    d = cov.shape[0]
    z = _check_zeta(zeta)
    q = as_float64(bases, name="bases").to(cov.device)
    _check_bases(q, d, "bases")
    k = q.shape[-1]
    if not 1 <= k < d - 1:
        raise ValueError(f"delta_isoscore_star needs 1 <= k < d - 1 (complement of dimension >= 2), got k={k}, d={d}")
    cov = 0.5 * (cov + cov.T)
    if isinstance(C0, str):
        if C0 not in ("identity", "scaled_identity"):
            raise ValueError(f"C0 must be a matrix, 'identity' or 'scaled_identity', got {C0!r}")
        s, target = cov, C0
    else:
        c0 = _resolve_c0(C0, cov)
        c0 = 0.5 * (c0 + c0.T)
        ev0 = torch.linalg.eigvalsh(c0)
        if float(ev0[0]) < -1e-10 * max(float(ev0[-1].abs()), 1e-300):
            raise ValueError("a matrix C0 must be positive semi-definite")
        s, target = (1.0 - z) * cov + z * c0, None

    tr_s, fro2_s = _trace_frobenius(s)
    qs = q.unsqueeze(0) if q.ndim == 2 else q
    n = qs.shape[0]
    if chunk_size is None:
        chunk_size = max(1, int(2**24 // (d * k)))
    tr_p = torch.empty(n, dtype=torch.float64, device=cov.device)
    fro2_p = torch.empty_like(tr_p)
    for start in range(0, n, chunk_size):
        qb = qs[start : start + chunk_size]
        removed_trace, cross_sq, block_sq = removal_traces(s, qb)
        tr_p[start : start + qb.shape[0]] = tr_s - removed_trace
        fro2_p[start : start + qb.shape[0]] = fro2_s - 2.0 * cross_sq + block_sq
    for i in torch.nonzero(fro2_p < _CANCELLATION_GUARD * fro2_s).flatten().tolist():
        qi = qs[i]
        sq = s @ qi
        sqqt = sq @ qi.T
        psp = s - sqqt - sqqt.T + qi @ (qi.T @ sq) @ qi.T
        tr_p[i], fro2_p[i] = _trace_frobenius(psp)
    out = _delta_from_parts(tr_s, fro2_s, tr_p, fro2_p.clamp_min(0.0), d, k, target, z)
    return float(out[0]) if q.ndim == 2 else out


# ============================================================================ descriptive
def mean_cosine(points: Any) -> float:
    """Mean pairwise cosine similarity over distinct pairs (i < j) of the *uncentred* points —
    the classic anisotropy measure (Ethayarajh 2019).

    Computed in O(N d): with unit vectors u_i, ``‖Σ u_i‖² = N + 2 Σ_{i<j} cos_ij`` so the mean is
    ``(‖Σ u_i‖² − N) / (N(N − 1))``.  Zero rows (cosine undefined) are dropped; fewer than two
    non-zero rows gives ``nan`` with a warning.

    Parameters
    ----------
    points : array_like of shape (N, d)
        The (uncentred) points.

    Returns
    -------
    float
        The mean cosine over distinct pairs of non-zero rows.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.mean_cosine(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])), 4)
    0.3333
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
    and d (isotropic).  Works for a covariance or for an uncentred second moment ``GᵀG``.
    Of a covariance it carries the same information as its IsoScore:
    ``IsoScore = (PR − 1)/(d − 1)`` (:func:`isoscore_from_cov`), so a gradient IsoScore and a
    gradient participation ratio are one measurement on two scales.

    Parameters
    ----------
    matrix : array_like of shape (d, d)
        A symmetric PSD matrix.

    Returns
    -------
    float
        ``tr(C)² / ‖C‖_F²``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.participation_ratio_from_cov(torch.diag(torch.tensor([1.0, 1.0, 0.0]))), 4)
    2.0
    """
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
    (``center=False``).  λ are covariance eigenvalues (= σ²/(N−1) of the centred data).

    Parameters
    ----------
    points : array_like of shape (N, d)
        The point cloud.
    center : bool, default True
        Use the covariance (False: the uncentred second moment).

    Returns
    -------
    float
        ``(Σλ)² / Σλ²``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.participation_ratio(torch.eye(4) * 2.0, center=False), 4)
    4.0
    """
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
    (resp. of ``XᵀX``).

    Parameters
    ----------
    points : array_like of shape (N, d)
        The point cloud.
    center : bool, default True
        Centre the points first (False: the raw matrix).

    Returns
    -------
    float
        ``exp(H(p))``, between 1 and ``min(N, d)``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.effective_rank(torch.eye(4) * 3.0, center=False), 4)
    4.0
    """
    x = as_float64(points, name="points", ndim=2)
    if center:
        x = x - x.mean(dim=0, keepdim=True)
    return _erank_from_singular_values(torch.linalg.svdvals(x))


def effective_rank_from_eigenvalues(eigenvalues: Any) -> float:
    """:func:`effective_rank_from_cov` from the matrix's eigenvalues (when they are at hand).

    Parameters
    ----------
    eigenvalues : array_like of shape (d,)
        The matrix's eigenvalues.

    Returns
    -------
    float
        The Roy–Vetterli effective rank.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.effective_rank_from_eigenvalues(torch.tensor([2.0, 2.0, 2.0, 2.0])), 4)
    4.0
    """
    lam = as_float64(eigenvalues, name="eigenvalues", ndim=1)
    return _erank_from_singular_values(lam.clamp_min(0.0).sqrt())


def effective_rank_from_cov(matrix: Any) -> float:
    """Roy–Vetterli effective rank from a covariance / second moment ``C``: singular values of
    the underlying data are ``σ_i ∝ √λ_i(C)``, so ``p_i = √λ_i / Σ√λ_j`` and the result is
    ``exp(H(p))``; consistent with :func:`effective_rank` on the points (the 1/(N−1) factor
    cancels).

    Parameters
    ----------
    matrix : array_like of shape (d, d)
        A covariance or second moment (symmetric PSD).

    Returns
    -------
    float
        The Roy–Vetterli effective rank.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> round(geometry.effective_rank_from_cov(torch.diag(torch.tensor([1.0, 1.0, 0.0]))), 4)
    2.0
    """
    c = _check_cov(matrix, name="matrix")
    return _erank_from_singular_values(sym_eigvalsh(c).clamp_min(0.0).sqrt())
