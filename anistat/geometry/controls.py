"""Matched-rank random control subspaces.

``draw_controls(kind, proxy_basis, n, seed, *, activations=None, pca_span_dim=None)`` returns
``n`` orthonormal (d, k) bases stacked as (n, d, k), k = rank of the proxy basis.

Kinds (:data:`CONTROL_KINDS`, named in :data:`anistat.vocabulary.CONTROL_KINDS`; each draws
through its function in :data:`CONTROL_DRAWS`):

* ``normal``      — QR of ``(I − UUᵀ) Z``: uniform over k-subspaces of the orthogonal
  complement of the proxy U (the paper's control).  Needs ``2k <= d``.
* ``haar``        — QR of ``Z``: uniform (Haar) over all k-subspaces of R^d; its expected
  energy fraction is exactly k/d (see :mod:`.null_check`).
* ``pca_span``    — a Haar k-subspace inside the top-m principal subspace of the centred
  activations (m = ``pca_span_dim``, default ``min(4k, d)``): ``V_m · QR(Z_m)``.  A hard
  control — does the proxy beat *any* high-variance direction?  Requires ``m > k``
  (``ValueError`` otherwise: with m = k every draw would be the top-k PCA subspace itself,
  and m < k is impossible).  The proxy itself may lie in this span (pca does).
* ``cov_matched`` — QR of ``Σ_A^{1/2} Z`` with ``Σ_A`` the unbiased activation covariance:
  random directions distributed like the activations.  Needs ``rank(Σ_A) >= k``.

Z is standard Gaussian, drawn in float64 from a CPU ``torch.Generator`` seeded with ``seed``
and then moved to the proxy basis' device, so the random numbers are identical on every device.
Kinds share the generator stream: the same seed gives the same Z for every kind (use distinct
seeds per kind when independence across kinds matters).  QR is batched (no loop over n) and
sign-fixed (``R`` with non-negative diagonal), which makes the ``haar`` draws exactly Haar.
Controls come back in the proxy basis' dtype promoted to at least float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import vocabulary as vocab
from ._util import as_tensor, cpu_generator, output_dtype, qr_positive

__all__ = ["CONTROL_DRAWS", "CONTROL_KINDS", "complement_basis", "draw_controls", "principal_subspace"]


def principal_subspace(activations: Any, m: int) -> torch.Tensor:
    """Top-m principal directions (d, m) of the centred activations (float64, right singular
    vectors by decreasing singular value).

    Parameters
    ----------
    activations : array_like of shape (N, d)
        The activations.
    m : int
        The number of directions.

    Returns
    -------
    Tensor of shape (d, m), float64
        The top-m principal directions of the centred activations.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> u = geometry.principal_subspace(g, 3)
    >>> tuple(u.shape)
    (8, 3)
    """
    a = as_tensor(activations, name="activations").to(torch.float64)
    if a.ndim != 2:
        raise ValueError(f"activations must be (N, d), got {tuple(a.shape)}")
    d = a.shape[1]
    if not 1 <= m <= d:
        raise ValueError(f"m must satisfy 1 <= m <= d = {d}, got {m}")
    xc = a - a.mean(dim=0, keepdim=True)
    if a.shape[0] - 1 < m:
        warnings.warn(
            f"pca_span: only {a.shape[0]} activation rows for a {m}-dimensional principal subspace; "
            "directions beyond the data's rank are arbitrary",
            UserWarning,
            stacklevel=3,
        )
    # eigendecomposition of the d×d scatter always yields d directions (also when N < d)
    ev, vec = torch.linalg.eigh(xc.T @ xc)
    return vec.flip(-1)[:, :m]


def complement_basis(basis: Any) -> torch.Tensor:
    """An orthonormal basis (d, d − k) of the orthogonal complement of span(basis) (float64).

    Parameters
    ----------
    basis : array_like of shape (d, k)
        A basis of the subspace (orthonormality not required).

    Returns
    -------
    Tensor of shape (d, d − k), float64
        Orthonormal columns spanning the orthogonal complement of ``span(basis)``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> c = geometry.complement_basis(basis)
    >>> tuple(c.shape), float((basis.T @ c).abs().max())
    ((8, 6), 0.0)
    """
    b = as_tensor(basis, name="basis").to(torch.float64)
    q, _ = torch.linalg.qr(b, mode="complete")
    return q[:, b.shape[1] :]


def draw_controls(
    kind: str,
    proxy_basis: Any,
    n: int,
    seed: int,
    *,
    activations: Any = None,
    pca_span_dim: int | None = None,
) -> torch.Tensor:
    """Draw ``n`` random orthonormal (d, k) control bases of the given ``kind`` → (n, d, k).

    ``proxy_basis`` (d, k) fixes d, k, device and dtype (and the excluded span for ``normal``).
    ``activations`` (N, d) are required for ``pca_span`` and ``cov_matched``.

    Parameters
    ----------
    kind : {"normal", "haar", "pca_span", "cov_matched"}
        The control kind (:data:`CONTROL_KINDS`; see the module docstring).
    proxy_basis : array_like of shape (d, k)
        The proxy's orthonormal basis.
    n : int
        The number of controls.
    seed : int
        Seed of the CPU generator of the Gaussians.
    activations : array_like of shape (N, d), optional
        Required for ``pca_span`` and ``cov_matched``.
    pca_span_dim : int, optional
        ``m`` of ``pca_span`` (default ``min(4k, d)``; must exceed ``k``).

    Returns
    -------
    Tensor of shape (n, d, k)
        Orthonormal control bases, in ``proxy_basis``' dtype (at least float32) and device.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> basis = torch.eye(8, dtype=torch.float64)[:, :2]
    >>> controls = geometry.draw_controls('haar', basis, n=4, seed=0)
    >>> tuple(controls.shape)
    (4, 8, 2)
    >>> bool(torch.allclose(controls[0].T @ controls[0], torch.eye(2, dtype=controls.dtype), atol=1e-5))
    True
    """
    if kind not in CONTROL_DRAWS:
        raise ValueError(f"unknown control kind {kind!r}; expected one of {CONTROL_KINDS}")
    u_in = as_tensor(proxy_basis, name="proxy_basis")
    if u_in.ndim != 2:
        raise ValueError(f"proxy_basis must be (d, k), got {tuple(u_in.shape)}")
    d, k = u_in.shape
    if not 1 <= k < d:
        raise ValueError(f"proxy rank must satisfy 1 <= k < d = {d}, got {k}")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    device = u_in.device
    acts = None
    if vocab.CONTROL_KINDS[kind].needs_activations:
        if activations is None:
            raise ValueError(f"control kind {kind!r} needs activations")
        acts = as_tensor(activations, name="activations").to(torch.float64).to(device)
        if acts.ndim != 2 or acts.shape[1] != d:
            raise ValueError(f"activations must be (N, {d}), got {tuple(acts.shape)}")
        if acts.shape[0] < 2:
            raise ValueError("need at least 2 activation rows")
    draw = ControlDraw(
        u=u_in.to(torch.float64), n=int(n), generator=cpu_generator(seed), activations=acts, pca_span_dim=pca_span_dim
    )
    return CONTROL_DRAWS[kind](draw).to(output_dtype(u_in.dtype))


@dataclass(frozen=True, kw_only=True)
class ControlDraw:
    """What a control kind's draw reads: the proxy basis ``u`` (d, k) in float64 on its device,
    the number of draws, the seeded CPU generator of the Gaussians, and (kinds that need them)
    the activations (N, d) in float64 and ``pca_span``'s ``m``."""

    u: torch.Tensor
    n: int
    generator: torch.Generator
    activations: torch.Tensor | None = None
    pca_span_dim: int | None = None

    def gaussian(self, rows: int) -> torch.Tensor:
        """``n`` standard Gaussian ``(rows, k)`` matrices, drawn on the CPU, on the basis' device."""
        return torch.randn(self.n, rows, self.u.shape[1], generator=self.generator, dtype=torch.float64).to(
            self.u.device
        )


def _haar(draw: ControlDraw) -> torch.Tensor:
    return qr_positive(draw.gaussian(draw.u.shape[0]))


def _normal(draw: ControlDraw) -> torch.Tensor:
    u = draw.u
    d, k = u.shape
    if 2 * k > d:
        raise ValueError(f"normal controls need 2k <= d (complement of dimension d-k >= k); got k={k}, d={d}")
    z = draw.gaussian(d)
    z = z - u @ (u.T @ z)  # (I − UUᵀ) Z, broadcast over n
    q = qr_positive(z)
    return q - u @ (u.T @ q)  # remove rounding residue along U (keeps orthonormality to ~1e-16)


def _pca_span(draw: ControlDraw) -> torch.Tensor:
    d, k = draw.u.shape
    m = min(4 * k, d) if draw.pca_span_dim is None else int(draw.pca_span_dim)
    if m > d:
        raise ValueError(f"pca_span_dim must be <= d = {d}, got {m}")
    if m <= k:
        raise ValueError(
            f"pca_span_dim must exceed the rank (got m={m}, k={k}): with m = k every control "
            "would be the top-k PCA subspace itself"
        )
    v = principal_subspace(draw.activations, m)  # (d, m)
    return v @ qr_positive(draw.gaussian(m))  # orthonormal: V has orthonormal columns


def _cov_matched(draw: ControlDraw) -> torch.Tensor:
    acts = draw.activations
    assert acts is not None  # needs_activations: checked by draw_controls
    d, k = draw.u.shape
    xc = acts - acts.mean(dim=0, keepdim=True)
    cov = xc.T @ xc / (acts.shape[0] - 1)
    cov = 0.5 * (cov + cov.T)
    ev, vec = torch.linalg.eigh(cov)
    ev = ev.clamp_min(0.0)
    tol = float(ev[-1]) * d * torch.finfo(torch.float64).eps
    r = int((ev > tol).sum())
    if r < k:
        raise ValueError(f"cov_matched controls need rank(activation covariance) >= k; got rank {r} < k = {k}")
    root = (vec * ev.sqrt()) @ vec.T  # Σ^{1/2}
    return qr_positive(root @ draw.gaussian(d))


#: The draw of each control kind, by its name in :data:`anistat.vocabulary.CONTROL_KINDS`.
CONTROL_DRAWS: dict[str, Callable[[ControlDraw], torch.Tensor]] = {
    vocab.NORMAL: _normal,
    vocab.HAAR: _haar,
    vocab.PCA_SPAN: _pca_span,
    vocab.COV_MATCHED: _cov_matched,
}
CONTROL_KINDS: tuple[str, ...] = tuple(CONTROL_DRAWS)
