"""Closed-form null distribution of energy fractions under Haar controls.

Let ``P = QQᵀ`` be a Haar-random rank-k projection in R^m (Q uniform on the Stiefel
manifold) and ``M`` a PSD matrix (the gradient second moment GᵀG) with eigenvalues λ.

* Per token: ``‖Qᵀg‖² / ‖g‖² ~ Beta(k/2, (m − k)/2)`` (the squared length of the projection of
  a fixed unit vector on a uniform k-subspace), mean k/m, variance
  ``v = 2k(m − k) / (m²(m + 2))``.
* Pooled: ``E(Q) = tr(PM)/tr(M)`` has mean exactly k/m.  By rotation invariance take M
  diagonal, so ``tr(PM) = Σ_i λ_i P_ii`` with each ``P_ii`` ~ Beta as above.  Since
  ``Σ_i P_ii = k`` is constant, ``Cov(P_ii, P_jj) = −v/(m − 1)`` for i ≠ j, whence

      Var E(Q) = v · (m Σλ² − (Σλ)²) / ((m − 1)(Σλ)²) = v · (m / PR − 1) / (m − 1),

  with ``PR = (Σλ)²/Σλ²`` the participation ratio of M: 0 for isotropic M (PR = m), the
  per-token Beta variance v for rank-one M (PR = 1).

Controls that are Haar inside a subspace spanned by an orthonormal ``B`` (d, m) — ``normal``
controls are Haar in the complement of the proxy, ``pca_span`` controls in the top-m
principal subspace — follow the same law with M replaced by ``BᵀMB`` and fractions still
taken relative to tr(M): mean ``(k/m)·tr(BᵀMB)/tr(M)``, variance scaled by
``(tr(BᵀMB)/tr(M))²``.  :func:`haar_null_check` accepts such a ``within`` basis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from ._util import as_float64, sym_eigvalsh
from .moments import GradientMoments

__all__ = ["NullCheck", "haar_energy_moments", "haar_null_check", "haar_token_fraction_law"]


@dataclass(frozen=True, kw_only=True)
class NullCheck:
    """Observed control fractions vs the Haar closed form.

    ``z_mean = (observed_mean − expected_mean) / (expected_sd / √n)``;
    ``sd_ratio = observed_sd / expected_sd``; ``ok`` when |z_mean| < ``z_tol`` and the sd ratio
    lies in the chi-square band (see :func:`haar_null_check`).

    Attributes
    ----------
    expected_mean : float
        The Haar closed-form mean of the pooled fraction.
    expected_sd : float
        Its closed-form sd.
    observed_mean : float
        The controls' mean.
    observed_sd : float
        Their sd (ddof=1).
    z_mean : float
        ``(observed_mean − expected_mean) / (expected_sd / √n)``.
    sd_ratio : float
        ``observed_sd / expected_sd``.
    ok : bool
        Whether both checks pass.
    message : str
        Each check's outcome in words.
    n_controls : int, default 0
        The controls checked.
    sd_band : tuple of float, default (nan, nan)
        The band ``sd_ratio`` must lie in (NaN: not checked).
    """

    expected_mean: float
    expected_sd: float
    observed_mean: float
    observed_sd: float
    z_mean: float
    sd_ratio: float
    ok: bool
    message: str
    n_controls: int = 0
    sd_band: tuple[float, float] = (float("nan"), float("nan"))


def haar_token_fraction_law(k: int, d: int) -> Any:
    """Frozen ``scipy.stats.beta(k/2, (d − k)/2)``: the law of ``‖Qᵀg‖²/‖g‖²`` for one fixed
    non-zero g and a Haar rank-k Q in R^d.

    Parameters
    ----------
    k : int
        The rank (``1 <= k < d``).
    d : int
        The dimension.

    Returns
    -------
    scipy.stats frozen distribution
        ``beta(k/2, (d − k)/2)``.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> law = geometry.haar_token_fraction_law(2, 8)
    >>> round(float(law.mean()), 4)
    0.25
    """
    if not 1 <= k < d:
        raise ValueError(f"need 1 <= k < d, got k={k}, d={d}")
    return stats.beta(k / 2.0, (d - k) / 2.0)


def haar_energy_moments(second_moment: Any, k: int, *, within: Any = None) -> tuple[float, float]:
    """(mean, sd) of the pooled fraction ``tr(QᵀMQ)/tr(M)`` for Haar rank-k Q — in R^d, or in
    span(``within``) when an orthonormal (d, m) basis is given (see module docstring).

    Parameters
    ----------
    second_moment : array_like of shape (d, d)
        ``M`` (symmetric PSD).
    k : int
        The rank of the Haar subspaces.
    within : array_like of shape (d, m), optional
        An orthonormal basis the Haar law is restricted to (None: all of R^d).

    Returns
    -------
    mean : float
        Mean of ``tr(QᵀMQ)/tr(M)``.
    sd : float
        Its standard deviation.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> mean, sd = geometry.haar_energy_moments(torch.eye(4, dtype=torch.float64), 2)
    >>> round(mean, 4), round(sd, 4)
    (0.5, 0.0)
    """
    m_full = (
        second_moment.second_moment
        if isinstance(second_moment, GradientMoments)
        else as_float64(second_moment, name="second_moment", ndim=2)
    )
    total = float(torch.trace(m_full))
    if not total > 0:
        raise ValueError("second moment has zero trace")
    if within is None:
        mm = m_full
    else:
        b = as_float64(within, name="within", ndim=2).to(m_full.device)
        if b.shape[0] != m_full.shape[0]:
            raise ValueError(f"within must be (d, m) with d = {m_full.shape[0]}, got {tuple(b.shape)}")
        mm = b.T @ m_full @ b
    m = mm.shape[0]
    if not 1 <= k < m:
        raise ValueError(f"need 1 <= k < m = {m}, got k={k}")
    lam = sym_eigvalsh(mm).clamp_min(0.0)
    s1 = float(lam.sum())
    s2 = float((lam * lam).sum())
    share = s1 / total
    mean = (k / m) * share
    if s1 <= 0:
        return mean, 0.0
    v = 2.0 * k * (m - k) / (m * m * (m + 2.0))
    pr = s1 * s1 / s2
    var = v * max(m / pr - 1.0, 0.0) / (m - 1.0)
    return mean, math.sqrt(var) * share


def haar_null_check(
    control_fractions: Any,
    k: int,
    d: int,
    second_moment: Any,
    *,
    within: Any = None,
    z_tol: float = 4.0,
    alpha: float = 1e-4,
    kurtosis_slack: float = 2.0,
) -> NullCheck:
    """Check pooled energy fractions of Haar controls against the closed form.

    * mean: ``|z_mean| < z_tol`` (default 4, i.e. a false alarm rate ~6e-5 per check);
    * sd: for n ≥ 3 controls, ``sd_ratio`` must lie in
      ``[sqrt(χ²_{α/2}(ν)/ν), sqrt(χ²_{1−α/2}(ν)/ν)]`` with the effective degrees of freedom
      ``ν = (n − 1)/kurtosis_slack`` — the plain chi-square band assumes normality, and the
      pooled fraction is Beta-like (excess kurtosis), so the band is widened by
      ``kurtosis_slack`` (2 = allows excess kurtosis up to ~2).
    When the expected sd is 0 (isotropic M, every subspace captures exactly k/d) the check is
    that all fractions equal the mean to 1e-9 (relative).

    ``d`` is the ambient dimension (checked against M); ``within`` (d, m) restricts the Haar
    law to a subspace (``normal`` controls: :func:`~.controls.complement_basis` of the proxy).

    Parameters
    ----------
    control_fractions : array_like of shape (n,)
        The Haar controls' pooled energy fractions.
    k : int
        Their rank.
    d : int
        The ambient dimension (checked against ``second_moment``).
    second_moment : array_like of shape (d, d)
        ``M``.
    within : array_like of shape (d, m), optional
        The subspace the controls were drawn in (None: all of R^d).
    z_tol : float, default 4.0
        The largest ``|z_mean|`` that passes.
    alpha : float, default 1e-4
        Level of the sd ratio's chi-square band.
    kurtosis_slack : float, default 2.0
        Divides the band's degrees of freedom (allows excess kurtosis).

    Returns
    -------
    NullCheck
        The observed and expected moments, ``z_mean``, ``sd_ratio`` and the verdict.

    Examples
    --------
    >>> import torch
    >>> from anistat import geometry
    >>> g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> m = g.T @ g
    >>> fractions = [float(geometry.energy_fraction_from_moments(m, q)) for q in geometry.draw_controls('haar', torch.eye(8, dtype=torch.float64)[:, :2], n=200, seed=1)]
    >>> check = geometry.haar_null_check(fractions, k=2, d=8, second_moment=m)
    >>> check.ok
    True
    """
    x = np.asarray(
        control_fractions.detach().cpu().numpy() if isinstance(control_fractions, torch.Tensor) else control_fractions,
        dtype=np.float64,
    ).ravel()
    n = x.size
    if n < 1:
        raise ValueError("need at least one control fraction")
    msize = second_moment.dim if isinstance(second_moment, GradientMoments) else np.shape(second_moment)[0]
    if msize != d:
        raise ValueError(f"second moment is {msize}-dimensional, d = {d}")
    mu, sd = haar_energy_moments(second_moment, k, within=within)
    obs_mean = float(x.mean())
    obs_sd = float(x.std(ddof=1)) if n > 1 else float("nan")
    band = (float("nan"), float("nan"))
    if sd == 0.0:
        ok = bool(np.all(np.abs(x - mu) <= 1e-9 * max(abs(mu), 1e-300)))
        z = 0.0 if ok else float("inf")
        ratio = float("nan")
        msg = "isotropic second moment: every fraction must equal k/m" + (
            "" if ok else f"; observed spread {obs_sd:.3g}"
        )
        return NullCheck(
            expected_mean=mu,
            expected_sd=sd,
            observed_mean=obs_mean,
            observed_sd=obs_sd,
            z_mean=z,
            sd_ratio=ratio,
            ok=ok,
            message=msg,
            n_controls=n,
            sd_band=band,
        )
    z = (obs_mean - mu) / (sd / math.sqrt(n))
    ratio = obs_sd / sd if n > 1 else float("nan")
    mean_ok = abs(z) < z_tol
    sd_ok = True
    if n >= 3:
        nu = (n - 1) / kurtosis_slack
        band = (
            math.sqrt(stats.chi2.ppf(alpha / 2, nu) / nu),
            math.sqrt(stats.chi2.ppf(1 - alpha / 2, nu) / nu),
        )
        sd_ok = band[0] <= ratio <= band[1]
    ok = bool(mean_ok and sd_ok)
    parts = [f"mean {obs_mean:.6g} vs {mu:.6g} (z = {z:+.2f}, |z| < {z_tol:g}: {'ok' if mean_ok else 'FAIL'})"]
    if n >= 3:
        parts.append(f"sd ratio {ratio:.3f} in [{band[0]:.3f}, {band[1]:.3f}]: {'ok' if sd_ok else 'FAIL'}")
    else:
        parts.append("sd not checked (fewer than 3 controls)")
    return NullCheck(
        expected_mean=mu,
        expected_sd=sd,
        observed_mean=obs_mean,
        observed_sd=obs_sd,
        z_mean=float(z),
        sd_ratio=float(ratio),
        ok=ok,
        message="; ".join(parts),
        n_controls=n,
        sd_band=band,
    )
