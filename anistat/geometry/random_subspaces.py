"""Random subspaces evaluated from a second-moment matrix alone (the analysis-time null).

Every quantity anistat compares between a proxy ``U`` and random subspaces ``Q`` depends on the
gradients only through a symmetric PSD matrix ``S`` (``d × d``): the uncentred second moment
``M = Σ_i g_i g_iᵀ`` for energies, the covariance ``C`` for ΔIsoScore*. With ``S = V Λ Vᵀ``
and ``Q̃ = VᵀQ``::

    tr(QᵀSQ)     = Σ_j λ_j ‖Q̃_j‖²                 (energy, when S = M: E(Q) = tr(QᵀMQ)/tr M)
    ‖SQ‖_F²      = Σ_j λ_j² ‖Q̃_j‖²
    ‖QᵀSQ‖_F²    = ‖Q̃ᵀ Λ Q̃‖_F²

all ``O(d k²)`` per basis once ``S`` is diagonalised (one ``O(d³)`` eigen-decomposition per
matrix, shared by every draw). A Haar subspace stays Haar under the rotation ``Vᵀ``, so a Haar
draw is made directly in eigen-coordinates; a ``normal`` draw (uniform in the complement of
``U``) is ``(I − ŨŨᵀ)Z`` with ``Ũ = VᵀU``. No orthonormal basis is ever formed: the three
quantities are invariant to the choice of basis of span ``Z``, so with ``ZᵀZ = LLᵀ``
(Cholesky) the basis ``Z L⁻ᵀ`` gives ``Q̃ᵀΛQ̃ = L⁻¹ (ZᵀΛZ) L⁻ᵀ`` from three ``k × k`` Gram
matrices.

Because each draw costs ``O(d k²)``, the Monte-Carlo null can use thousands of draws at a
negligible cost next to the collection, which removes the ``1/(n + 1)`` floor of a handful of
controls (see :mod:`anistat.stats.montecarlo`). Draws come from numpy's PCG64 seeded with
``seed``, in fixed-size chunks, so they depend on neither the device nor memory settings.

ΔIsoScore* from traces (scalar targets C0 = ``identity`` or ``scaled_identity``, shrinkage
ζ): for a covariance with trace ``T`` and squared Frobenius norm ``F`` in ``m`` coordinates,
the shrunk spectrum ``(1 − ζ)λ + ζc`` has ``s1 = (1 − ζ)T + ζmc`` and
``s2 = (1 − ζ)²F + 2ζ(1 − ζ)cT + mζ²c²`` (``c = 1`` or ``T/m``), and IsoScore =
``(s1²/s2 − 1)/(m − 1)`` (the participation-ratio form of Rudman et al.'s score, see
:func:`anistat.geometry.isoscore_from_eigenvalues`). Removing ``Q`` leaves ``m = d − k``
coordinates with ``T' = T − tr(QᵀCQ)`` and ``F' = F − 2‖CQ‖_F² + ‖QᵀCQ‖_F²``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._util import as_float64

__all__ = [
    "SubspaceTraces",
    "SpectralFrame",
    "complement_subspace_traces",
    "complement_subspaces",
    "isoscore_star_from_traces",
    "random_subspace_traces",
    "subspace_traces",
]

#: Draws per chunk: fixed, so a seed gives the same draws whatever the memory available.
_CHUNK = 512


@dataclass(frozen=True, kw_only=True)
class SubspaceTraces:
    """``tr(QᵀSQ)``, ``‖SQ‖_F²`` and ``‖QᵀSQ‖_F²`` of ``n`` subspaces (each ``(n,)`` float64).

    Attributes
    ----------
    trace : ndarray of shape (n,)
        ``tr(QᵀSQ)``.
    trace_squared : ndarray of shape (n,)
        ``‖SQ‖_F²``.
    frobenius : ndarray of shape (n,)
        ``‖QᵀSQ‖_F²``.
    """

    trace: np.ndarray
    trace_squared: np.ndarray
    frobenius: np.ndarray


class SpectralFrame:
    """A symmetric PSD matrix ``S`` diagonalised once, for evaluating many subspaces.

    ``S`` is symmetrised and its eigenvalues clamped at 0 (rounding can make tiny ones
    negative). ``total_trace = tr S`` and ``total_frobenius = ‖S‖_F²``.
    """

    def __init__(self, matrix) -> None:
        s = as_float64(matrix, name="matrix", ndim=2).cpu()
        if s.shape[0] != s.shape[1]:
            raise ValueError(f"matrix must be square, got {tuple(s.shape)}")
        s = 0.5 * (s + s.T)
        eigenvalues, eigenvectors = torch.linalg.eigh(s)
        self.eigenvalues = eigenvalues.clamp_min(0.0)
        self.eigenvectors = eigenvectors
        self.dim = int(s.shape[0])
        self.total_trace = float(self.eigenvalues.sum())
        self.total_frobenius = float((self.eigenvalues**2).sum())

    def to_eigen_coordinates(self, basis) -> torch.Tensor:
        """``Vᵀ B`` for a basis ``(d, k)`` (float64, CPU)."""
        b = as_float64(basis, name="basis", ndim=2).cpu()
        if b.shape[0] != self.dim:
            raise ValueError(f"basis has ambient dimension {b.shape[0]}, expected {self.dim}")
        return self.eigenvectors.T @ b

    def traces_of(self, bases) -> SubspaceTraces:
        """The three traces for given bases ``(d, k)`` or ``(n, d, k)`` with orthonormal columns."""
        b = as_float64(bases, name="bases").cpu()
        stack = b.unsqueeze(0) if b.ndim == 2 else b
        rotated = torch.einsum("dj,ndk->njk", self.eigenvectors, stack)
        return self._traces(rotated)

    def random_traces(self, ranks, n: int, seed: int, *, exclude=None) -> dict[int, SubspaceTraces]:
        """The three traces of ``n`` random subspaces for each rank in ``ranks``.

        ``exclude=None``: Haar (uniform over all k-subspaces of R^d). ``exclude=U`` (``(d, k')``,
        orthonormal): uniform over k-subspaces of the orthogonal complement of ``U`` (the
        ``normal`` control of :func:`anistat.geometry.draw_controls`). See
        :func:`random_subspace_traces` for how the draws are made.
        """
        return random_subspace_traces([self], ranks, n, seed, exclude=exclude)[0]

    def _traces(self, q: torch.Tensor) -> SubspaceTraces:
        """Traces of orthonormal bases ``(n, d, k)`` given in eigen-coordinates."""
        weighted = self.eigenvalues[None, :, None] * q
        return _block_traces(q.transpose(1, 2) @ weighted, weighted.transpose(1, 2) @ weighted)

    def energy_fractions(self, traces: SubspaceTraces) -> np.ndarray:
        """``tr(QᵀSQ) / tr S`` — the energy fraction when ``S`` is the second moment ``M``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return traces.trace / self.total_trace

    def delta_isoscore_star(self, traces: SubspaceTraces, rank: int, c0: str, zeta: float) -> np.ndarray:
        """ΔIsoScore* of removing each subspace, when ``S`` is the gradient covariance."""
        full = isoscore_star_from_traces(self.total_trace, self.total_frobenius, self.dim, c0, zeta)
        removed = isoscore_star_from_traces(
            self.total_trace - traces.trace,
            self.total_frobenius - 2.0 * traces.trace_squared + traces.frobenius,
            self.dim - int(rank),
            c0,
            zeta,
        )
        return removed - full


def random_subspace_traces(frames, ranks, n: int, seed: int, *, exclude=None) -> list[dict[int, SubspaceTraces]]:
    """Traces of ``n`` random subspaces per rank, evaluated in every frame of ``frames``.

    One Gaussian ``Z`` (``d × K``, K the largest rank) per draw serves every rank and every
    frame. Ranks: the span of ``Z``'s first ``k`` columns is itself a uniform k-subspace, and
    with ``ZᵀZ = LLᵀ`` the basis ``Z L⁻ᵀ`` is Gram–Schmidt ordered, so rank ``k``'s traces are
    leading-block sums of ``L⁻¹(ZᵀΛZ)L⁻ᵀ`` and ``L⁻¹(ZᵀΛ²Z)L⁻ᵀ``. Frames: ``Z`` is read in each
    frame's own eigen-coordinates, where it is again a uniform draw, so each frame's null is
    exact on its own (the frames' draws are dependent, which no single test sees). With
    ``exclude=U`` each frame projects ``Vᵀ U`` out of ``Z``. Gaussians come from numpy's PCG64
    seeded with ``seed``, in chunks of fixed size (device- and memory-independent).

    Parameters
    ----------
    frames : sequence of SpectralFrame
        The diagonalised matrices to evaluate the draws in.
    ranks : iterable of int
        The ranks.
    n : int
        The number of draws.
    seed : int
        Seed of numpy's PCG64 generator of the Gaussians.
    exclude : array_like of shape (d, k), optional
        An orthonormal basis the draws are projected away from (the ``normal`` control).

    Returns
    -------
    list of dict of int to SubspaceTraces
        Per frame, the traces of every rank's ``n`` draws.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> frame = geometry.SpectralFrame(g.T @ g)
    >>> traces = geometry.random_subspace_traces([frame], [2], n=5, seed=0)
    >>> len(traces), sorted(traces[0])
    (1, [2])
    """
    frames = list(frames)
    d = frames[0].dim
    if any(frame.dim != d for frame in frames):
        raise ValueError("frames must share one dimension")
    ranks = sorted({int(r) for r in ([ranks] if np.isscalar(ranks) else ranks)})
    if not ranks or ranks[0] < 1 or ranks[-1] >= d:
        raise ValueError(f"ranks must satisfy 1 <= k < d = {d}, got {ranks}")
    top, n = ranks[-1], int(n)
    excluded = [None if exclude is None else frame.to_eigen_coordinates(exclude).numpy() for frame in frames]
    if exclude is not None and top > d - excluded[0].shape[1]:
        raise ValueError(f"a rank-{top} subspace does not fit in the {d - excluded[0].shape[1]}-dimensional complement")
    rng = np.random.default_rng(seed)
    parts: list[dict[int, list[SubspaceTraces]]] = [{k: [] for k in ranks} for _ in frames]
    for start in range(0, n, _CHUNK):
        gaussian = rng.standard_normal((min(_CHUNK, n - start), d, top))
        shared_chol = None  # without `exclude` every frame reads the same Z: one ZᵀZ, one Cholesky
        for frame, drop, out in zip(frames, excluded, parts):
            z = gaussian if drop is None else gaussian - drop @ (drop.T @ gaussian)
            # the K × K Gram matrices with numpy (faster than torch's bmm for these small
            # float64 blocks), the k × k algebra in torch; at d = 768, K = 4 the Gaussian draws
            # themselves are ~70 % of the time
            weighted = frame.eigenvalues.numpy()[None, :, None] * z
            if drop is not None or shared_chol is None:
                chol = torch.linalg.cholesky(torch.from_numpy(_gram(z, z)))
                if drop is None:
                    shared_chol = chol
            else:
                chol = shared_chol
            whitened = [
                _whiten(chol, torch.from_numpy(_gram(z, weighted))),  # L⁻¹ZᵀΛZL⁻ᵀ
                _whiten(chol, torch.from_numpy(_gram(weighted, weighted))),
            ]  # L⁻¹ZᵀΛ²ZL⁻ᵀ
            for k in ranks:
                out[k].append(_block_traces(*(w[:, :k, :k] for w in whitened)))
    return [
        {
            k: SubspaceTraces(
                **{f: np.concatenate([getattr(p, f) for p in chunks]) for f in ("trace", "trace_squared", "frobenius")}
            )
            for k, chunks in frame_parts.items()
        }
        for frame_parts in parts
    ]


def complement_subspaces(basis, n: int, seed: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``n`` orthonormal bases ``(n, d, k)`` of subspaces drawn uniformly in the orthogonal
    complement of ``basis`` ``U`` (``d × k``, orthonormal), of rank ``k`` — the paper's
    ``normal`` control.

    A draw is the span of ``(I − UUᵀ) Z`` for a Gaussian ``Z`` (``d × k``, from a CPU
    ``torch.Generator`` seeded with ``seed``; uniform in the complement because the projected
    Gaussian is), orthonormalised by Cholesky–QR, in ``dtype``; a draw whose Gram matrix is too
    ill-conditioned for Cholesky (likeliest at ``k = d/2``, where the complement has only ``k``
    dimensions) is orthonormalised by Householder QR of the same columns (the same span).

    Parameters
    ----------
    basis : array_like of shape (d, k)
        The orthonormal basis ``U`` whose complement the draws lie in (``2k <= d``).
    n : int
        The number of draws.
    seed : int
        Seed of the CPU generator of the Gaussians.
    dtype : torch.dtype, default torch.float32
        The draws' dtype.

    Returns
    -------
    Tensor of shape (n, d, k)
        Orthonormal bases of the drawn subspaces, on ``basis``' device.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> q = geometry.complement_subspaces(basis, n=3, seed=0)
    >>> tuple(q.shape)
    (3, 8, 2)
    >>> float((basis.T.float() @ q[0]).abs().max()) < 1e-5
    True
    """
    u = torch.as_tensor(np.asarray(basis)).to(dtype)
    d, k = u.shape
    if 2 * k > d:
        raise ValueError(f"normal controls need 2k <= d, got k={k}, d={d}")
    n = int(n)
    generator = torch.Generator().manual_seed(int(seed) & (2**63 - 1))
    z = torch.randn(d, n * k, generator=generator).to(dtype)  # draw j: columns j·k … j·k + k − 1
    z = z - u @ (u.T @ z)
    blocks = z.reshape(d, n, k).permute(1, 0, 2)  # (n, d, k)
    chol, info = torch.linalg.cholesky_ex(blocks.transpose(1, 2) @ blocks)
    eye = torch.eye(k, dtype=dtype).expand(n, k, k)
    q = blocks @ torch.linalg.solve_triangular(chol, eye, upper=False).transpose(1, 2)  # Z L⁻ᵀ, orthonormal
    failed = info != 0
    if failed.any():
        q[failed] = torch.linalg.qr(blocks[failed].double())[0].to(dtype)
    return q


def subspace_traces(matrix, q: torch.Tensor) -> SubspaceTraces:
    """``tr(QᵀSQ)``, ``‖SQ‖_F²`` and ``‖QᵀSQ‖_F²`` of every basis of the stack ``q`` (``(n, d, k)``)
    in the symmetric ``d × d`` ``matrix`` S, in ``q``'s dtype: S multiplies all bases in one
    ``d × d · d × nk`` product.

    Parameters
    ----------
    matrix : array_like of shape (d, d)
        The symmetric matrix ``S``.
    q : Tensor of shape (n, d, k)
        Orthonormal bases.

    Returns
    -------
    SubspaceTraces
        ``tr(QᵀSQ)``, ``‖SQ‖_F²`` and ``‖QᵀSQ‖_F²`` per basis.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> traces = geometry.subspace_traces(torch.eye(4, dtype=torch.float64), torch.eye(4, dtype=torch.float64)[:, :2].unsqueeze(0))
    >>> np.asarray(traces.trace).tolist()
    [2.0]
    """
    n, d, k = q.shape
    flat = q.permute(1, 0, 2).reshape(d, n * k)
    sq = (torch.as_tensor(matrix).to(q.dtype) @ flat).reshape(d, n, k).permute(1, 0, 2)  # S Q per draw
    qsq = q.transpose(1, 2) @ sq
    return SubspaceTraces(
        trace=torch.diagonal(qsq, dim1=1, dim2=2).sum(-1).double().numpy(),
        trace_squared=sq.square().sum(dim=(1, 2)).double().numpy(),
        frobenius=qsq.square().sum(dim=(1, 2)).double().numpy(),
    )


def complement_subspace_traces(
    matrices, basis, n: int, seed: int, *, dtype: torch.dtype = torch.float32
) -> list[SubspaceTraces]:
    """:func:`subspace_traces` in each of ``matrices`` of the ``n`` :func:`complement_subspaces`
    of ``basis`` — the ``normal`` control evaluated without projecting a token. Everything in
    ``dtype`` (float32 by default: these draws serve the paper's convention and descriptive
    control statistics, not the exact test).

    Parameters
    ----------
    matrices : sequence of array_like of shape (d, d)
        Symmetric matrices to evaluate the draws in.
    basis : array_like of shape (d, k)
        The orthonormal proxy basis ``U`` whose complement the draws lie in.
    n : int
        The number of draws.
    seed : int
        Seed of the draws (as in :func:`complement_subspaces`).
    dtype : torch.dtype, default torch.float32
        The dtype of the draws and of the traces' arithmetic.

    Returns
    -------
    list of SubspaceTraces
        One per matrix, each with ``(n,)`` arrays.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> m = g.T @ g
    >>> traces = geometry.complement_subspace_traces([m], basis, n=5, seed=0)
    >>> len(traces), traces[0].trace.shape
    (1, (5,))
    """
    q = complement_subspaces(basis, n, seed, dtype=dtype)
    return [subspace_traces(matrix, q) for matrix in matrices]


def isoscore_star_from_traces(trace, frobenius, dim: int, c0: str, zeta: float):
    """IsoScore* of a covariance known by its trace ``T`` and ``‖C‖_F²`` in ``dim`` coordinates,
    for a scalar shrinkage target (see the module docstring for the formula).

    Parameters
    ----------
    trace : array_like
        ``tr C``.
    frobenius : array_like
        ``‖C‖_F²``.
    dim : int
        The number of coordinates (at least 2).
    c0 : {"identity", "scaled_identity"}
        The scalar shrinkage target.
    zeta : float
        The shrinkage weight ``ζ``.

    Returns
    -------
    ndarray, float64
        IsoScore* (the broadcast shape of ``trace`` and ``frobenius``; NaN where ``‖S‖_F² = 0``).

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> import numpy as np
    >>> value = geometry.isoscore_star_from_traces(np.array([4.0]), np.array([4.0]), 4, 'scaled_identity', 0.1)
    >>> np.round(value, 4).tolist()
    [1.0]
    """
    if c0 not in ("identity", "scaled_identity"):
        raise ValueError(f"C0 must be 'identity' or 'scaled_identity', got {c0!r}")
    if dim < 2:
        raise ValueError(f"IsoScore needs at least 2 coordinates, got {dim}")
    t = np.asarray(trace, dtype=np.float64)
    f = np.maximum(np.asarray(frobenius, dtype=np.float64), 0.0)
    c = np.ones_like(t) if c0 == "identity" else t / dim
    z = float(zeta)
    s1 = (1.0 - z) * t + z * dim * c
    s2 = (1.0 - z) ** 2 * f + 2.0 * z * (1.0 - z) * c * t + dim * z * z * c * c
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s2 > 0, (s1 * s1 / s2 - 1.0) / (dim - 1.0), np.nan)


def _gram(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``leftᵀ right`` per draw: (n, d, K) × (n, d, K) → (n, K, K)."""
    return np.einsum("ndk,ndl->nkl", left, right, optimize=True)


def _whiten(chol: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``L⁻¹ G L⁻ᵀ`` for a batch of lower-triangular ``L`` and symmetric ``G``."""
    half = torch.linalg.solve_triangular(chol, gram, upper=False)
    return torch.linalg.solve_triangular(chol, half.transpose(1, 2), upper=False).transpose(1, 2)


def _block_traces(projected: torch.Tensor, projected_squared: torch.Tensor) -> SubspaceTraces:
    """From ``QᵀSQ`` and ``QᵀS²Q`` (``(n, k, k)``): ``tr(QᵀSQ)``, ``‖SQ‖_F² = tr(QᵀS²Q)``,
    ``‖QᵀSQ‖_F²``."""
    return SubspaceTraces(
        trace=torch.diagonal(projected, dim1=1, dim2=2).sum(-1).numpy(),
        trace_squared=torch.diagonal(projected_squared, dim1=1, dim2=2).sum(-1).numpy(),
        frobenius=projected.square().sum(dim=(1, 2)).numpy(),
    )
