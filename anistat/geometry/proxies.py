"""Activation-derived low-rank proxies ("tangent proxies") behind one pluggable interface.

``fit_proxy(activations, method, rank, seed=0, **options)`` fits a rank-k model of the
activations ``A`` (N, d) and returns a :class:`Proxy` whose ``basis`` is a (d, k) matrix with
orthonormal columns spanning the model's directions.

Methods (registered in :data:`PROXY_METHODS`; add one with ``@register_proxy("name")``; the
built-in ones are named, with the report's sentence for each, in
:data:`anistat.vocabulary.PROXY_KINDS`):

* ``pca``      — top-k right singular vectors of the centred activations (``center=False``:
  of the raw activations, i.e. the top-k eigenvectors of the second moment ``AᵀA/N``).
* ``semi_nmf`` — Ding, Li & Jordan (2010) semi-NMF of the *uncentred* activations
  ``A ≈ G Fᵀ``, codes ``G ≥ 0`` (N, k), free dictionary ``F`` (d, k); basis = QR(F).
* ``nmf``      — Lee–Seung NMF of ``ReLU(A) ≈ W H`` (W ≥ 0 codes, H ≥ 0 dictionary);
  basis = QR(Hᵀ) (``center=True``: of ``ReLU(A − mean)``).
* ``ica``      — FastICA (symmetric, log-cosh contrast) on the whitened top-k PCA
  coordinates; basis = QR of the unmixing directions mapped back to activation space.  Those
  directions span exactly the top-k PCA subspace, so ``ica`` gives the *same subspace* (and
  the same energy fractions) as ``pca``; only the axes inside it — what concept cards show —
  differ.
* ``random``   — a Haar-random k-subspace drawn from ``seed``: a deliberately uninformative
  negative control that goes through the same pipeline as a real proxy.

Centring. A method that can model the activations either centred or raw takes ``center`` and
declares its default in ``center_default`` (pca: centred; semi_nmf and nmf: raw, as in the
concept-extraction literature; ica centres by construction and random ignores the data, so
neither has the option). Centring decides whether the activation mean — often the largest
direction of a transformer's activations — can enter the span, so a comparison of methods is
one of methods *and* centring unless both are set alike; :func:`proxy_variants` names every
non-default variant in its label (``pca@uncentred``, ``semi_nmf@centred``).

All fitting is done in float64 on the activations' device (torch only, so it runs on GPU);
random initialisations use a CPU ``torch.Generator`` seeded with ``seed`` and are then moved,
so fits are deterministic and identical across devices up to floating-point reduction order.
The returned basis has the input's dtype promoted to at least float32.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .. import vocabulary as vocab
from ._util import as_tensor, check_rank, cpu_generator, output_dtype, qr_positive

__all__ = [
    "PROXY_METHODS",
    "Proxy",
    "ProxyMethod",
    "center_default",
    "fit_proxies",
    "fit_proxy",
    "project",
    "proxy_variants",
    "register_proxy",
    "top_activating",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class Proxy:
    """A fitted rank-k proxy.

    Attributes
    ----------
    method : registered method name.
    rank : k.
    basis : (d, k) tensor with orthonormal columns (input dtype promoted to ≥ float32).
    reconstruction_error : relative Frobenius error ``‖X − X̂‖_F / ‖X‖_F`` of the method's
        rank-k model of the data it models (centred activations for pca / ica / random —
        ``X̂ = X B Bᵀ``; raw activations for semi_nmf — ``X̂ = G Fᵀ``; ``ReLU(A)`` for nmf).
    info : method-specific diagnostics (objective traces, iterations, explained variance, …).
    """

    method: str
    rank: int
    basis: torch.Tensor
    reconstruction_error: float
    info: dict = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.basis.shape[0])


class ProxyMethod(abc.ABC):
    """Base class of a proxy method.  Subclasses set ``name`` (done by :func:`register_proxy`),
    take their options as constructor keyword arguments and implement :meth:`fit`."""

    name: ClassVar[str] = ""
    #: the method's own centring (None: it has no ``center`` option), see the module docstring
    center_default: ClassVar[bool | None] = None

    @abc.abstractmethod
    def fit(self, x: torch.Tensor, rank: int, seed: int) -> tuple[torch.Tensor, float, dict]:
        """Fit on float64 activations ``x`` (N, d); return ``(basis (d, k) float64 orthonormal,
        reconstruction_error, info)``."""

    def fit_ranks(self, x: torch.Tensor, ranks: list[int], seeds: dict[int, int]) -> dict[int, tuple]:
        """:meth:`fit` at every rank (``seeds[rank]``); methods whose rank-k fit is the first k
        directions of one decomposition (pca) override it to decompose once."""
        return {rank: self.fit(x, rank, seeds[rank]) for rank in ranks}


#: name → ProxyMethod subclass.
PROXY_METHODS: dict[str, type[ProxyMethod]] = {}


def register_proxy(name: str) -> Callable[[type[ProxyMethod]], type[ProxyMethod]]:
    """Class decorator registering a :class:`ProxyMethod` subclass under ``name``.

    Parameters
    ----------
    name : str
        The name the method is registered under.

    Returns
    -------
    callable
        The decorator (it returns the class, with ``name`` set).

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> sorted(geometry.PROXY_METHODS)[:3]
    ['ica', 'nmf', 'pca']
    >>> callable(geometry.register_proxy('my_method'))
    True
    """
    if not isinstance(name, str) or not name:
        raise ValueError("proxy name must be a non-empty string")

    def deco(cls: type[ProxyMethod]) -> type[ProxyMethod]:
        if not (isinstance(cls, type) and issubclass(cls, ProxyMethod)):
            raise TypeError("register_proxy decorates ProxyMethod subclasses")
        if name in PROXY_METHODS and PROXY_METHODS[name] is not cls:
            raise ValueError(f"proxy method {name!r} is already registered")
        cls.name = name
        PROXY_METHODS[name] = cls
        return cls

    return deco


def fit_proxy(activations: Any, method: str, rank: int, seed: int = 0, **options: Any) -> Proxy:
    """Fit a rank-``rank`` proxy of ``activations`` (N, d) with a registered ``method``.

    ``1 <= rank < d`` is required (``ValueError`` otherwise); N may be smaller than d.  When
    the data have fewer than ``rank`` informative directions (e.g. N ≤ rank), the basis is
    completed with seeded random orthonormal directions and ``info["completed_dims"]`` says
    how many.  ``options`` go to the method's constructor (unknown ones raise ``ValueError``).

    Parameters
    ----------
    activations : array_like of shape (N, d)
        The activations to fit on.
    method : str
        A registered method's name.
    rank : int
        The proxy's rank ``k`` (``1 <= k < d``).
    seed : int, default 0
        Seed of the method's randomness and of any completing directions.
    **options : Any
        Passed to the method's constructor.

    Returns
    -------
    Proxy
        The fitted basis with its reconstruction error and diagnostics.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> proxy = geometry.fit_proxy(g, 'pca', 2, seed=0)
    >>> proxy.method, proxy.rank, tuple(proxy.basis.shape)
    ('pca', 2, (8, 2))
    >>> bool(torch.allclose(proxy.basis.T @ proxy.basis, torch.eye(2, dtype=proxy.basis.dtype), atol=1e-10))
    True
    """
    return fit_proxies(activations, method, [rank], {int(rank): int(seed)}, **options)[int(rank)]


def fit_proxies(activations: Any, method: str, ranks, seeds: dict[int, int], **options: Any) -> dict[int, Proxy]:
    """:func:`fit_proxy` at several ranks of the same activations (``seeds[rank]`` per rank),
    validating once and letting the method share work across ranks (pca decomposes once: its
    rank-k proxy is the first k directions of the largest rank's, exactly).

    Parameters
    ----------
    activations : array_like of shape (N, d)
        The activations to fit on.
    method : str
        A registered method's name.
    ranks : iterable of int
        The ranks (each ``1 <= rank < d``).
    seeds : dict of int to int
        The seed of each rank.
    **options : Any
        Passed to the method's constructor.

    Returns
    -------
    dict of int to Proxy
        The proxy of each rank.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> proxies = geometry.fit_proxies(g, 'pca', [1, 2], {1: 0, 2: 0})
    >>> {k: tuple(p.basis.shape) for k, p in proxies.items()}
    {1: (8, 1), 2: (8, 2)}
    """
    if method not in PROXY_METHODS:
        raise ValueError(f"unknown proxy method {method!r}; registered: {sorted(PROXY_METHODS)}")
    a = as_tensor(activations, name="activations")
    if a.ndim != 2:
        raise ValueError(f"activations must be (N, d), got shape {tuple(a.shape)}")
    n, d = a.shape
    ranks = sorted({check_rank(rank, d) for rank in ranks})
    if n < 2:
        raise ValueError(f"need at least 2 activation rows, got {n}")
    x = a.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("activations contain non-finite values")
    try:
        impl = PROXY_METHODS[method](**options)
    except TypeError as exc:
        raise ValueError(f"bad options for proxy method {method!r}: {exc}") from exc
    seeds = {int(rank): int(seed) for rank, seed in seeds.items()}
    out = {}
    for rank, (basis, err, info) in impl.fit_ranks(x, ranks, seeds).items():
        info = dict(info)
        basis, completed = _ensure_orthonormal(basis.to(torch.float64), rank, seeds[rank])
        if completed:
            info["completed_dims"] = completed
        out[rank] = Proxy(
            method=method, rank=rank, basis=basis.to(output_dtype(a.dtype)), reconstruction_error=float(err), info=info
        )
    return out


def center_default(method: str) -> bool | None:
    """A registered method's default centring (None when it has no ``center`` option).

    Parameters
    ----------
    method : str
        A registered proxy method's name.

    Returns
    -------
    bool or None
        The default of its ``center`` option; None when it has none.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> geometry.center_default('pca'), geometry.center_default('random')
    (True, None)
    """
    if method not in PROXY_METHODS:
        raise ValueError(f"unknown proxy method {method!r}; registered: {sorted(PROXY_METHODS)}")
    return PROXY_METHODS[method].center_default


def proxy_variants(method: str, center: bool | str | None = None) -> list[tuple[str, dict]]:
    """The (label, fit options) pairs one protocol method expands to.

    ``center``: None (the method's default), True / False, or ``"both"`` (the default variant
    and the other one). The default variant is labelled by the method name alone; the other
    by ``METHOD@centred`` or ``METHOD@uncentred``, so results never mix the two.

    Parameters
    ----------
    method : str
        A registered method's name.
    center : bool or "both" or None, default None
        The centring asked for (None: the method's default).

    Returns
    -------
    list of tuple of (str, dict)
        ``(label, fit options)`` per variant.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> [label for label, _ in geometry.proxy_variants('pca', 'both')]
    ['pca', 'pca@uncentred']
    """
    default = center_default(method)
    if default is None:
        if center is not None:
            raise ValueError(f"proxy method {method!r} has no centring option")
        return [(method, {})]
    if center is None:
        wanted = [default]
    elif center == "both":
        wanted = [default, not default]
    elif isinstance(center, bool):
        wanted = [center]
    else:
        raise ValueError(f"center must be true, false or 'both', got {center!r}")
    return [(method if c == default else f"{method}@{'centred' if c else 'uncentred'}", {"center": c}) for c in wanted]


# ---------------------------------------------------------------------------- helpers
def _orthonormal_span(f: torch.Tensor, rtol: float = 1e-9) -> torch.Tensor:
    """Orthonormal basis of span(f) (d, k): QR with positive diagonal when f has full column
    rank; otherwise the numerically non-null left singular vectors (fewer than k columns)."""
    q, r = torch.linalg.qr(f)
    diag = torch.diagonal(r).abs()
    scale = float(torch.linalg.matrix_norm(f, ord=2)) if f.numel() else 0.0
    if scale > 0 and bool((diag > rtol * scale).all()):
        signs = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
        return q * signs  # same as qr_positive(f), without a second factorisation
    u, s, _ = torch.linalg.svd(f, full_matrices=False)
    keep = s > rtol * max(scale, 1e-300)
    return u[:, keep]


def _ensure_orthonormal(basis: torch.Tensor, rank: int, seed: int) -> tuple[torch.Tensor, int]:
    """Make ``basis`` an orthonormal (d, rank) matrix, completing a deficient span with seeded
    random directions orthogonal to it.  Returns (basis, number of completed columns)."""
    d = basis.shape[0]
    b = _orthonormal_span(basis) if basis.shape[1] else basis
    missing = rank - b.shape[1]
    if missing <= 0:
        return b[:, :rank], 0
    g = cpu_generator(seed + 7919)
    z = torch.randn(d, missing, generator=g, dtype=torch.float64).to(basis.device)
    if b.shape[1]:
        z = z - b @ (b.T @ z)
    extra = qr_positive(z)
    if b.shape[1]:
        extra = qr_positive(extra - b @ (b.T @ extra))
    return torch.cat([b, extra], dim=1), missing


def _fix_signs(v: torch.Tensor) -> torch.Tensor:
    """Deterministic sign per column: the entry of largest magnitude is positive."""
    idx = v.abs().argmax(dim=0)
    s = torch.sign(v[idx, torch.arange(v.shape[1], device=v.device)])
    s = torch.where(s == 0, torch.ones_like(s), s)
    return v * s


def _centred_projection_error(x: torch.Tensor, basis: torch.Tensor) -> float:
    xc = x - x.mean(dim=0, keepdim=True)
    tot = float(torch.linalg.matrix_norm(xc))
    if tot == 0:
        return 0.0
    res = xc - (xc @ basis) @ basis.T
    return float(torch.linalg.matrix_norm(res)) / tot


def _right_singular(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values and right singular vectors ``Vᵀ`` of ``x`` (N, d), without forming the
    N × d left factor: for a tall ``x = QR`` (Householder QR, R upper d × d), ``x`` and ``R``
    share singular values and right singular vectors, so the SVD of R is enough — what LAPACK's
    gesdd does internally for tall inputs, minus computing U (half the time at N = 4 096–20 000,
    d = 768)."""
    if x.shape[0] > x.shape[1]:
        x = torch.linalg.qr(x, mode="r").R
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    return s, vh


def _top_pcs(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean (d,), top-k right singular vectors (d, ≤k), singular values) of centred x."""
    mu = x.mean(dim=0, keepdim=True)
    s, vh = _right_singular(x - mu)
    return mu.squeeze(0), _fix_signs(vh[:k].T), s


def project(activations: Any, basis: Any, *, center: Any = None) -> torch.Tensor:
    """Coordinates ``(A − c) B`` (N, k) of activations on a basis; ``center`` is an optional
    (d,) offset (e.g. the fit-split mean for PCA-style concept scores).

    Parameters
    ----------
    activations : array_like of shape (N, d)
        The activations.
    basis : array_like of shape (d, k)
        The basis.
    center : array_like of shape (d,), optional
        An offset subtracted first.

    Returns
    -------
    Tensor of shape (N, k)
        ``(A − c) B``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> geometry.project(torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0], [0.0]])).tolist()
    [[3.0]]
    """
    a = as_tensor(activations, name="activations").to(torch.float64)
    b = as_tensor(basis, name="basis").to(torch.float64).to(a.device)
    if center is not None:
        a = a - as_tensor(center, name="center").to(torch.float64).to(a.device)
    return a @ b


def top_activating(scores: Any, m: int, *, absolute: bool = False) -> torch.Tensor:
    """Concept-card helper: indices of the ``m`` highest-scoring rows per direction.

    ``scores`` (N, r) are projections of N token activations onto r proxy directions (see
    :func:`project`).  Returns a long tensor (r, m'), m' = min(m, N), row j listing token
    indices by decreasing ``scores[:, j]`` (by decreasing ``|scores[:, j]|`` with
    ``absolute=True``; PCA / ICA axes have arbitrary sign, NMF codes do not).  Ties keep the
    lower index first.

    Parameters
    ----------
    scores : array_like of shape (N, r)
        Projections of N activations onto r directions.
    m : int
        Rows to list per direction.
    absolute : bool, default False
        Rank by ``|score|``.

    Returns
    -------
    Tensor of shape (r, min(m, N)), int64
        Row indices by decreasing score, per direction.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> geometry.top_activating(torch.tensor([0.1, -3.0, 2.0, 0.5]), 2).tolist()
    [[2, 3]]
    >>> geometry.top_activating(torch.tensor([0.1, -3.0, 2.0, 0.5]), 2, absolute=True).tolist()
    [[1, 2]]
    """
    s = as_tensor(scores, name="scores")
    if s.ndim == 1:
        s = s.unsqueeze(1)
    if s.ndim != 2:
        raise ValueError(f"scores must be (N, r), got {tuple(s.shape)}")
    if m < 1:
        raise ValueError("m must be >= 1")
    s = s.to(torch.float64)
    if absolute:
        s = s.abs()
    mm = min(int(m), s.shape[0])
    order = torch.argsort(-s, dim=0, stable=True)[:mm]
    return order.T.contiguous()


# ---------------------------------------------------------------------------- methods
@register_proxy(vocab.PCA)
class PCAProxy(ProxyMethod):
    """Top-k right singular vectors of the centred activations ``A − 1μᵀ`` (signs: largest
    entry > 0); with ``center=False`` of the raw activations ``A`` — the top-k eigenvectors of
    the second moment ``AᵀA/N = C + μμᵀ`` (C the biased covariance), which lean towards the
    mean direction when ‖μ‖² is large against C's eigenvalues.
    info: ``explained_variance_ratio`` (captured share of ‖A − 1μᵀ‖_F², or of ‖A‖_F² when
    uncentred), ``singular_values`` (top k), ``mean`` (d,), ``centered``.
    Options: ``center=True``.

    Computed as the eigenvectors of the (centred) Gram matrix ``XᵀX`` (float64, one ``d × d``
    eigen-decomposition for every rank): the right singular vectors of ``X`` with ``σ² = λ``,
    and the reconstruction error ``‖X − XVVᵀ‖_F / ‖X‖_F = sqrt(Σ_{i>k} λ_i / Σ λ_i)``."""

    center_default = True

    def __init__(self, center: bool = True):
        self.center = bool(center)

    def fit(self, x, rank, seed):
        return self.fit_ranks(x, [rank], {rank: seed})[rank]

    def fit_ranks(self, x, ranks, seeds):
        mu = x.mean(dim=0)
        xc = x - mu if self.center else x
        eigenvalues, vectors = torch.linalg.eigh(xc.T @ xc)
        eigenvalues, vectors = eigenvalues.flip(0).clamp_min(0.0), vectors.flip(1)
        total = float(eigenvalues.sum())
        # numerically null directions (N ≤ rank, or rounding of the Gram's null space at ~1e-16
        # of its largest eigenvalue): fit_proxy completes them at random
        informative = min(x.shape[0] - (1 if self.center else 0), x.shape[1])
        nonnull = eigenvalues > 1e-12 * max(float(eigenvalues[0]) if len(eigenvalues) else 0.0, 1e-300)
        nonnull[informative:] = False
        out = {}
        for rank in ranks:
            v = _fix_signs(vectors[:, :rank])[:, nonnull[:rank]]
            captured = float(eigenvalues[:rank].sum())
            evr = captured / total if total > 0 else float("nan")
            error = math.sqrt(max(total - captured, 0.0) / total) if total > 0 else 0.0
            info = {
                "explained_variance_ratio": evr,
                "singular_values": eigenvalues[:rank].sqrt().cpu().numpy(),
                "mean": mu.cpu().numpy(),
                "centered": self.center,
            }
            out[rank] = (v, error, info)
        return out


@register_proxy(vocab.RANDOM)
class RandomProxy(ProxyMethod):
    """Haar-random k-subspace from ``seed`` (QR with sign fix of a Gaussian d×k).  The
    reconstruction error is the centred projection error, as for pca."""

    def fit(self, x, rank, seed):
        g = cpu_generator(seed)
        z = torch.randn(x.shape[1], rank, generator=g, dtype=torch.float64).to(x.device)
        q = qr_positive(z)
        return q, _centred_projection_error(x, q), {}


def _kmeanspp_labels(x: torch.Tensor, k: int, gen: torch.Generator, iters: int) -> torch.Tensor:
    """Seeded k-means++ seeding + a few Lloyd iterations; returns labels (N,)."""
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=gen))
    centres = [x[first]]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        tot = float(d2.sum())
        if tot > 0:
            probs = (d2 / tot).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        else:
            nxt = int(torch.randint(n, (1,), generator=gen))
        centres.append(x[nxt])
        d2 = torch.minimum(d2, ((x - x[nxt]) ** 2).sum(1))
    c = torch.stack(centres)
    labels = torch.cdist(x, c).argmin(1)
    for _ in range(iters):
        onehot = torch.nn.functional.one_hot(labels, k).to(x.dtype)
        cnt = onehot.sum(0)
        newc = (onehot.T @ x) / cnt.clamp_min(1)[:, None]
        c = torch.where(cnt[:, None] > 0, newc, c)
        new = torch.cdist(x, c).argmin(1)
        if bool((new == labels).all()):
            break
        labels = new
    return labels


def _pos(a: torch.Tensor) -> torch.Tensor:
    return (a.abs() + a) * 0.5


def _neg(a: torch.Tensor) -> torch.Tensor:
    return (a.abs() - a) * 0.5


@register_proxy(vocab.SEMI_NMF)
class SemiNMFProxy(ProxyMethod):
    """Semi-NMF (Ding, Li & Jordan 2010) of the uncentred activations: minimise
    ``‖X − G Fᵀ‖_F²`` over codes ``G ≥ 0`` (N, k) and a free dictionary ``F`` (d, k).

    Alternating updates, each non-increasing in the objective:
    ``F ← Xᵀ G (GᵀG)⁻¹`` (exact least squares) and the multiplicative rule
    ``G ← G ∘ sqrt(((XF)⁺ + G(FᵀF)⁻) / ((XF)⁻ + G(FᵀF)⁺))`` with ``A⁺ = (|A|+A)/2``,
    ``A⁻ = (|A|−A)/2``.  Init: seeded k-means++ + Lloyd labels, ``G = indicator + 0.2`` (as in
    the paper).  Stops when the relative objective decrease is below ``tol`` or after
    ``max_iter`` iterations.  (The k-means init runs on the CPU copy so it is identical on every
    device; the updates run on the activations' device.)  Dictionary atoms are sorted by code energy ‖G_j‖·‖F_j‖
    (descending) and QR-orthonormalised (sign-fixed) into the basis.

    info: ``objective`` (list, the trace — initial value first), ``n_iter``, ``converged``,
    ``codes_nonnegative``.
    Options: ``max_iter=500``, ``tol=1e-7``, ``kmeans_iter=10``, ``center=False`` (centre the
    activations first).
    """

    center_default = False

    def __init__(self, max_iter: int = 500, tol: float = 1e-7, kmeans_iter: int = 10, center: bool = False):
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.kmeans_iter = int(kmeans_iter)
        self.center = bool(center)

    @staticmethod
    def _update_f(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        gtg = g.T @ g
        rhs = g.T @ x  # (k, d)
        try:
            sol = torch.linalg.solve(gtg, rhs)
        except RuntimeError:
            sol = torch.linalg.pinv(gtg, hermitian=True) @ rhs
        return sol.T  # (d, k)

    def fit(self, x, rank, seed):
        if self.center:
            x = x - x.mean(dim=0, keepdim=True)
        gen = cpu_generator(seed)
        n = x.shape[0]
        k = rank
        if k <= n:
            labels = _kmeanspp_labels(x.cpu(), k, gen, self.kmeans_iter).to(x.device)
            g = torch.nn.functional.one_hot(labels, k).to(x.dtype) + 0.2
        else:
            g = torch.rand(n, k, generator=gen, dtype=torch.float64).to(x.device) + 0.2
        eps = 1e-300
        f = self._update_f(x, g)
        xx = float((x * x).sum())

        def objective(xf_, f_, g_):
            # ‖X − GFᵀ‖² expanded to avoid forming the N×d residual (xf_ = X F)
            return xx - 2 * float(torch.sum(xf_ * g_)) + float(torch.sum((g_.T @ g_) * (f_.T @ f_)))

        xf = x @ f
        trace = [objective(xf, f, g)]
        converged = False
        it = 0
        for it in range(1, self.max_iter + 1):  # noqa: B007 -- `it` is read after the loop (n_iter)
            ftf = f.T @ f
            num = _pos(xf) + g @ _neg(ftf)
            den = _neg(xf) + g @ _pos(ftf)
            g = g * torch.sqrt(num / den.clamp_min(eps))
            f = self._update_f(x, g)
            xf = x @ f
            trace.append(objective(xf, f, g))
            prev = trace[-2]
            if abs(prev - trace[-1]) <= self.tol * max(abs(prev), 1e-300):
                converged = True
                break
        strength = torch.linalg.vector_norm(g, dim=0) * torch.linalg.vector_norm(f, dim=0)
        order = torch.argsort(-strength, stable=True)
        f, g = f[:, order], g[:, order]
        basis = _orthonormal_span(f)
        err = math.sqrt(max(trace[-1], 0.0) / xx) if xx > 0 else 0.0
        info = {
            "objective": trace,
            "n_iter": it,
            "converged": converged,
            "codes_nonnegative": bool((g >= 0).all()),
            "centered": self.center,
        }
        return basis, err, info


@register_proxy(vocab.NMF)
class NMFProxy(ProxyMethod):
    """NMF (Lee & Seung multiplicative updates, Frobenius loss) of ``X⁺ = ReLU(A)``:
    ``X⁺ ≈ W H`` with codes ``W ≥ 0`` (N, k) and dictionary ``H ≥ 0`` (k, d); basis = QR(Hᵀ)
    (atoms sorted by ‖W_j‖·‖H_j‖).  Seeded uniform init scaled to the data.
    info: ``objective`` trace, ``n_iter``, ``converged``, ``centered``.
    Options: ``max_iter=500``, ``tol=1e-7``, ``center=False`` (model ``ReLU(A − 1μᵀ)``: the
    positive part of the deviations from the mean)."""

    center_default = False

    def __init__(self, max_iter: int = 500, tol: float = 1e-7, center: bool = False):
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.center = bool(center)

    def fit(self, x, rank, seed):
        if self.center:
            x = x - x.mean(dim=0, keepdim=True)
        xp = x.clamp_min(0.0)
        n, d = xp.shape
        k = rank
        gen = cpu_generator(seed)
        scale = math.sqrt(max(float(xp.mean()), 1e-12) / k)
        w = (torch.rand(n, k, generator=gen, dtype=torch.float64) * scale).to(x.device) + 1e-3 * scale
        h = (torch.rand(k, d, generator=gen, dtype=torch.float64) * scale).to(x.device) + 1e-3 * scale
        eps = 1e-300
        xx = float((xp * xp).sum())

        def objective(w_, h_):
            return xx - 2 * float(torch.sum((w_.T @ xp) * h_)) + float(torch.sum((w_.T @ w_) * (h_ @ h_.T)))

        trace = [objective(w, h)]
        converged = False
        it = 0
        for it in range(1, self.max_iter + 1):  # noqa: B007 -- `it` is read after the loop (n_iter)
            h = h * (w.T @ xp) / (w.T @ w @ h).clamp_min(eps)
            w = w * (xp @ h.T) / (w @ (h @ h.T)).clamp_min(eps)
            trace.append(objective(w, h))
            prev = trace[-2]
            if abs(prev - trace[-1]) <= self.tol * max(abs(prev), 1e-300):
                converged = True
                break
        strength = torch.linalg.vector_norm(w, dim=0) * torch.linalg.vector_norm(h, dim=1)
        order = torch.argsort(-strength, stable=True)
        w, h = w[:, order], h[order]
        basis = _orthonormal_span(h.T)
        err = math.sqrt(max(trace[-1], 0.0) / xx) if xx > 0 else 0.0
        return basis, err, {"objective": trace, "n_iter": it, "converged": converged, "centered": self.center}


@register_proxy(vocab.ICA)
class ICAProxy(ProxyMethod):
    """FastICA (Hyvärinen 1999; symmetric decorrelation, log-cosh contrast ``g = tanh``) on the
    whitened top-k principal coordinates ``Z = X_c V_k diag(√(N−1)/s_k)``.

    With unmixing matrix ``W`` (k×k, orthogonal) the sources are ``S = Z Wᵀ``; the unmixing
    direction of source j in activation space is column j of ``V_k diag(√(N−1)/s_k) Wᵀ``.
    The basis is QR of those directions (after sorting the sources by kurtosis magnitude), so
    it spans exactly the top-k PCA subspace — energy fractions equal pca's; the axes differ.
    info: ``unmixing`` (d, k) directions, ``mixing`` (d, k), ``n_iter``, ``converged``.
    Options: ``max_iter=400``, ``tol=1e-8``."""

    def __init__(self, max_iter: int = 400, tol: float = 1e-8):
        self.max_iter = int(max_iter)
        self.tol = float(tol)

    @staticmethod
    def _sym_decorrelate(w: torch.Tensor) -> torch.Tensor:
        ev, vec = torch.linalg.eigh(w @ w.T)
        return vec @ torch.diag(ev.clamp_min(1e-300).rsqrt()) @ vec.T @ w

    def fit(self, x, rank, seed):
        n = x.shape[0]
        mu, v, s = _top_pcs(x, rank)
        r = v.shape[1]
        sk = s[:r]
        keep = sk > 1e-12 * max(float(s[0]) if len(s) else 0.0, 1e-300)
        v, sk = v[:, keep], sk[keep]
        r = v.shape[1]
        if r == 0:
            return v, _centred_projection_error(x, v), {"n_iter": 0, "converged": True}
        scale = math.sqrt(max(n - 1, 1)) / sk  # whitening
        z = (x - mu) @ v * scale  # (N, r), unit variance
        gen = cpu_generator(seed)
        w = self._sym_decorrelate(torch.randn(r, r, generator=gen, dtype=torch.float64).to(x.device))
        converged = False
        it = 0
        for it in range(1, self.max_iter + 1):  # noqa: B007 -- `it` is read after the loop (n_iter)
            y = z @ w.T  # (N, r)
            gy = torch.tanh(y)
            gpy = 1.0 - gy * gy
            w_new = (gy.T @ z) / n - gpy.mean(0)[:, None] * w
            w_new = self._sym_decorrelate(w_new)
            lim = float((torch.diagonal(w_new @ w.T).abs() - 1.0).abs().max())
            w = w_new
            if lim < self.tol:
                converged = True
                break
        src = z @ w.T
        kurt = (src**4).mean(0) - 3.0
        order = torch.argsort(-kurt.abs(), stable=True)
        w = w[order]
        unmix = _fix_signs(v @ torch.diag(scale) @ w.T)  # (d, r)
        mixing = v @ torch.diag(1.0 / scale) @ w.T
        basis = _orthonormal_span(unmix)
        info = {
            "unmixing": unmix.cpu().numpy(),
            "mixing": mixing.cpu().numpy(),
            "n_iter": it,
            "converged": converged,
        }
        return basis, _centred_projection_error(x, basis), info
