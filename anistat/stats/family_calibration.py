"""Multiplicity with shared Haar draws: does Holm hold its family-wise error and BH its false
discovery rate when every unit's exact test reads the *same* draws?

anistat draws the exact tests' Haar subspaces once per hidden width and reads them in each unit's
own eigen-coordinates (:mod:`anistat.analyze.nulls`): each test is exact on its own, but the
tests of one study are dependent through the shared draws (a draw that happens to be energetic
is energetic for every unit). Holm's family-wise error bound holds under any dependence;
Benjamini–Hochberg's false discovery rate bound needs positive dependence (PRDS). This
simulation measures both, next to the same studies analysed with independent draws per unit.

A simulated study: ``n_units`` units, each with its own population second moment (the
calibration's anisotropic spectrum ``λ_j ∝ j^-2`` in a random rotation) and ``n_tokens`` sampled
gradients; a share ``effect_share`` of units carry a planted proxy (population energy ratio
``planted_ratio`` to the Haar expectation, as in :mod:`anistat.stats.calibrate`), the rest an
uninformative (Haar) proxy — the null. Per unit: ``E(U) = tr(UᵀMU)/tr M`` against ``n_null``
Haar draws, read through their projection diagonals in the unit's eigen-coordinates, counted
with the sequential rule (:class:`anistat.stats.SequentialMonteCarlo`, ``stop_after``) and with
all draws. Rates: Holm's family-wise error (any null unit rejected) and BH's false discovery
proportion ``V / max(R, 1)``, averaged over studies, with binomial / Monte-Carlo standard errors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import vocabulary as vocab
from .montecarlo import SequentialMonteCarlo
from .multiplicity import adjust_pvalues


@dataclass(frozen=True, kw_only=True)
class FamilyCalibration:
    """Result of :func:`run_family_calibration`: one dict per (draws, stopping) condition with
    ``fwer_holm``, ``fdr_bh``, their standard errors and the mean number of discoveries.

    Attributes
    ----------
    settings : dict
        The study's settings (the arguments of :func:`run_family_calibration`, with ``n_effects``).
    rows : tuple of dict
        One dict per (draws, design, stopping) condition: ``condition``, ``stop_after``,
        ``n_simulations``, ``fwer_holm``, ``fwer_holm_se``, ``fdr_bh``, ``fdr_bh_se``,
        ``mean_discoveries_bh``.
    elapsed_s : float
        Wall-clock seconds of the study.
    """

    settings: dict
    rows: tuple
    elapsed_s: float


def _haar_diagonals(rng, n: int, dim: int, rank: int) -> np.ndarray:
    """``(n, dim)`` diagonals of ``n`` Haar rank-``rank`` projections: Gram–Schmidt of Gaussian
    columns (vectorised over draws; ``rank`` is small here)."""
    z = rng.standard_normal((rank, n, dim))
    basis: list[np.ndarray] = []
    for column in z:
        for q in basis:
            column = column - np.einsum("nd,nd->n", q, column)[:, None] * q
        basis.append(column / np.linalg.norm(column, axis=1, keepdims=True))
    return sum(q * q for q in basis)


def _unit(rng, dim: int, rank: int, n_tokens: int, planted: float | None):
    """(eigenvalues of M, observed E(U)) for one unit: sampled gradients, a Haar or planted proxy."""
    lam = 1.0 / np.arange(1, dim + 1) ** 2
    full = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    if planted is None:
        sigma_root = full * np.sqrt(lam)
        u = np.linalg.qr(rng.standard_normal((dim, rank)))[0]
    else:
        u, complement = full[:, :rank], full[:, rank:]
        rest = lam[: dim - rank]
        target = planted * rank / dim
        s = target / (1.0 - target) * rest.sum() / rank
        sigma_root = np.concatenate([u * np.sqrt(s), complement * np.sqrt(rest)], axis=1)
    g = rng.standard_normal((n_tokens, dim)) @ sigma_root.T
    m = g.T @ g
    return np.clip(np.linalg.eigvalsh(m), 0.0, None), float(np.trace(u.T @ m @ u) / np.trace(m))


def _pvalues(observed, eigenvalues, diagonals, stop_after, alternative="greater"):
    """Every unit's p-value against the given draws (``diagonals`` ``(n, d)``, or one per unit)."""
    shared = diagonals.ndim == 2
    null = np.stack([(diagonals if shared else diagonals[u]) @ (lam / lam.sum()) for u, lam in enumerate(eigenvalues)])
    engine = SequentialMonteCarlo(observed, null.shape[1], stop_after, alternative)
    engine.update(null)
    return engine.p_values()


def run_family_calibration(
    n_simulations: int = 2000,
    seed: int = 0,
    *,
    n_units: int = 48,
    dim: int = 24,
    rank: int = 3,
    n_tokens: int = 400,
    effect_share: float = 0.25,
    planted_ratio: float = 2.5,
    n_null: int = 1999,
    stop_after: int = 10,
    alpha: float = 0.05,
) -> FamilyCalibration:
    """Holm's family-wise error (all units null) and BH's false discovery rate (a share of planted
    units) with draws shared by the study's units, against independent draws per unit; with and
    without sequential stopping. Deterministic given ``seed``.

    Parameters
    ----------
    n_simulations : int, default 2000
        Simulated studies.
    seed : int, default 0
        Seed of the whole study.
    n_units : int, default 48
        Units (tests) per study, the family's size.
    dim : int, default 24
        The dimension ``d`` of the gradients.
    rank : int, default 3
        The proxies' rank ``k``.
    n_tokens : int, default 400
        Sampled gradients per unit.
    effect_share : float, default 0.25
        Share of units with a planted proxy in the "with effects" design, in ``[0, 1)``.
    planted_ratio : float, default 2.5
        The planted units' population energy ratio to the Haar expectation ``k/d``.
    n_null : int, default 1999
        Haar draws per exact test.
    stop_after : int, default 10
        Exceedances that stop the sequential test (each condition also runs with all draws).
    alpha : float, default 0.05
        The level of Holm and BH.

    Returns
    -------
    FamilyCalibration
        The family-wise error and false discovery rates per condition.
    """
    if not 0 <= effect_share < 1:
        raise ValueError(f"effect_share must be in [0, 1), got {effect_share}")
    started = time.perf_counter()
    n_effects = int(round(effect_share * n_units))
    tallies: dict[tuple[str, int], dict[str, list[float]]] = {}
    for i in range(int(n_simulations)):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xFA, i]))
        # draws independent of both studies' data (one study per design): shared by its units, or one
        # set per unit
        per_unit = _haar_diagonals(rng, n_null * n_units, dim, rank).reshape(n_units, n_null, dim)
        draws = {"shared": _haar_diagonals(rng, n_null, dim, rank), "per unit": per_unit}
        for design, effects in (("all null", 0), ("with effects", n_effects)):
            units = [_unit(rng, dim, rank, n_tokens, planted_ratio if u < effects else None) for u in range(n_units)]
            eigenvalues = [lam for lam, _ in units]
            observed = np.array([e for _, e in units])
            for name, diagonals in draws.items():
                for stop in (stop_after, 0):
                    p = _pvalues(observed, eigenvalues, diagonals, stop)
                    null = np.arange(n_units) >= effects
                    row = tallies.setdefault((f"{name} draws, {design}", stop), {"fwer": [], "fdp": [], "r": []})
                    holm = adjust_pvalues(p, vocab.HOLM) <= alpha
                    bh = adjust_pvalues(p, vocab.FDR_BH) <= alpha
                    row["fwer"].append(float((holm & null).any()))
                    row["fdp"].append(float((bh & null).sum() / max(bh.sum(), 1)))
                    row["r"].append(float(bh.sum()))
    rows = []
    for (condition, stop), t in tallies.items():
        fwer, fdp = np.array(t["fwer"]), np.array(t["fdp"])
        rows.append(
            {
                "condition": condition,
                "stop_after": stop,
                "n_simulations": int(n_simulations),
                "fwer_holm": float(fwer.mean()),
                "fwer_holm_se": float(np.sqrt(fwer.mean() * (1 - fwer.mean()) / fwer.size)),
                vocab.FDR_BH: float(fdp.mean()),
                "fdr_bh_se": float(fdp.std(ddof=1) / np.sqrt(fdp.size)),
                "mean_discoveries_bh": float(np.mean(t["r"])),
            }
        )
    settings = dict(
        n_simulations=int(n_simulations),
        seed=int(seed),
        n_units=n_units,
        dim=dim,
        rank=rank,
        n_tokens=n_tokens,
        effect_share=effect_share,
        n_effects=n_effects,
        planted_ratio=planted_ratio,
        n_null=n_null,
        stop_after=stop_after,
        alpha=alpha,
    )
    return FamilyCalibration(settings=settings, rows=tuple(rows), elapsed_s=time.perf_counter() - started)
