"""The exact tests of every unit, from Haar draws shared by all units of one width.

A unit's exact tests compare its proxy ``U`` with uniformly random ``k``-subspaces on two
statistics (one test each per proxy and rank):

* the energy fraction ``E(Q) = tr(QᵀMQ) / tr M`` (``M`` the gradient second moment);
* ``ΔIsoScore*(Q)``, a function of ``tr(QᵀCQ)``, ``‖CQ‖_F²`` and ``‖QᵀCQ‖_F²`` (``C`` the
  gradient covariance; :func:`anistat.geometry.isoscore_star_from_traces`).

Both are read off Haar draws made once per width (:class:`anistat.geometry.HaarDiagonalStream`):
in a unit's eigen-coordinates the first two traces are ``diag(P)`` against ``λ`` and ``λ²``, so
every unit's energies and ``(t1, t2)`` are products ``(c × d) · (d × units)`` per chunk of draws.
The third trace ``t3 = ‖QᵀCQ‖_F²`` needs the draw's rows (``O(d k²)`` per unit and draw), so it is
computed only where a test's decision needs it: ``t1² / k ≤ t3 ≤ min(t2, t1²)``, and ΔIsoScore*
decreases in ``t3`` (it decreases in ``‖(I − P)C(I − P)‖_F² = ‖C‖_F² − 2 t2 + t3``), so the two ends
bound the draw's ΔIsoScore*; when both bounds sit on one side of the observed value the draw
counts without ``t3`` (and a value on that side stands in for it).

Counting is sequential (:class:`anistat.stats.SequentialMonteCarlo`): each test stops once
``stats.null_stop_exceedances`` draws have reached its observed value (``p = h / L``), else uses
``n`` draws (``p = (1 + #) / (1 + n)``). Tests with large p-values stop after a few dozen draws,
and the stream stops when every test has stopped, so only tests near or past their threshold pay
for the full ``n``.

Precision: draws are computed in float32 (the stream's fast path). A draw whose float32 value
lies within :data:`RELATIVE_BAND` (relative) of a test's observed value is recomputed from the same
Gaussians in float64 before it is counted, so a p-value is the one float64 arithmetic gives (the
float32 error is ~1e-6 relative, `tests/geometry/test_haar_null.py`).

Each test is exact on its own (the draws are independent of the unit's data); tests of units that
share a width share draws and so are dependent — `anistat calibrate` measures Holm's family-wise
error and BH's false discovery rate with shared draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..geometry import CHUNK, HaarDiagonalStream, isoscore_star_from_traces
from ..stats import ExactTestResult, SequentialMonteCarlo
from ..stats.resampling_risk import RiskBoundedMonteCarlo

#: Float32 draws within this relative distance of a test's observed value are recomputed in float64.
RELATIVE_BAND = 1e-4
#: ΔIsoScore* draws are counted in blocks of this many (exact ``t3`` only up to where a test stops).
DELTA_BLOCK = 16


@dataclass(frozen=True, kw_only=True)
class UnitSpectrum:
    """What the exact tests need of one unit (see the module docstring).

    ``energy_eigenvalues`` / ``covariance_eigenvalues``: ``(d,)`` eigenvalues of ``M`` and ``C``
    (``covariance_eigenvalues`` None when ΔIsoScore* is not tested); ``energy_observed`` and
    ``delta_observed``: the proxy's value per ``(proxy, rank)``, computed like the draws'."""

    unit_id: str
    dim: int
    energy_eigenvalues: np.ndarray
    energy_observed: dict[tuple[str, int], float]
    covariance_eigenvalues: np.ndarray | None = None
    delta_observed: dict[tuple[str, int], float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ExactNulls:
    """Every unit's exact tests, keyed ``(unit_id, proxy, rank)``, and the first ``n_record``
    Haar draws' values per ``(unit_id, rank)`` (float64; the paper's convention for Haar
    controls and ΔIsoScore*'s control mean and sd)."""

    energy: dict[tuple[str, str, int], ExactTestResult]
    delta: dict[tuple[str, str, int], ExactTestResult]
    recorded_energy: dict[tuple[str, int], np.ndarray]
    recorded_delta: dict[tuple[str, int], np.ndarray]
    draws_made: dict[int, int]


@dataclass(frozen=True, kw_only=True)
class NullOptions:
    """How the exact tests run: at most ``n_max`` draws, stopping after ``stop_after`` exceedances
    (0: never), the alternative, IsoScore*'s ``c0``/``zeta``, draws recorded for the paper's
    convention, the stream's seed (per width: ``derive_seed`` of it and the width is the
    caller's job, see :func:`exact_tests`) and device. ``resampling_risk`` (None: off): the energy
    tests also run :class:`anistat.stats.resampling_risk.RiskBoundedMonteCarlo` on the same draws,
    each with risk ``resampling_risk / risk_tests`` (``risk_tests`` at least the largest family),
    stopping once its interval lies at or above ``alpha`` or below ``alpha / risk_tests``."""

    n_max: int
    stop_after: int
    alternative: str
    c0: str
    zeta: float
    n_record: int = 0
    device: str | torch.device = "cpu"
    resampling_risk: float | None = None
    alpha: float = 0.05
    risk_tests: int = 1


def exact_tests(units: list[UnitSpectrum], options: NullOptions, seed_for_width, stream_of=None) -> ExactNulls:
    """Run every unit's exact tests, one draw stream per group of units: by default the units of
    one width share a stream (seeded with ``seed_for_width(d)``); ``stream_of(unit) -> (key,
    seed)`` groups them otherwise (e.g. a stream per unit). ``draws_made`` is keyed by group."""
    stream_of = stream_of or (lambda unit: (unit.dim, seed_for_width(unit.dim)))
    groups: dict = {}
    for unit in units:
        key, seed = stream_of(unit)
        groups.setdefault(key, (seed, []))[1].append(unit)
    energy, delta, rec_e, rec_d, made = {}, {}, {}, {}, {}
    for key, (seed, group) in groups.items():
        run = _WidthRun(group, options, seed)
        run.run()
        energy.update(run.energy_results())
        delta.update(run.delta_results())
        rec_e.update(run.recorded_energy)
        rec_d.update(run.recorded_delta)
        made[key] = run.drawn
    return ExactNulls(energy=energy, delta=delta, recorded_energy=rec_e, recorded_delta=rec_d, draws_made=made)


def _energy_risk(observed_e: list, options: NullOptions) -> RiskBoundedMonteCarlo | None:
    """The risk-bounded decisions of the energy tests (``None`` without ``resampling_risk`` or
    without energy tests): each test gets ``resampling_risk / risk_tests`` of the risk and stops as
    rejected only below ``alpha / risk_tests``, where Holm, BH and Bonferroni all reject."""
    if options.resampling_risk is None or not observed_e:
        return None
    return RiskBoundedMonteCarlo(
        observed_e,
        options.alpha,
        options.resampling_risk,
        options.n_max,
        "none",
        options.alternative,
        n_split=options.risk_tests,
        stop_below=options.alpha / options.risk_tests,
    )


class _WidthRun:
    """All tests of the units of one width, fed from one stream of Haar draws."""

    def __init__(self, units: list[UnitSpectrum], options: NullOptions, seed: int) -> None:
        self.units, self.options = units, options
        self.dim = units[0].dim
        self.energy_tests = [(i, key) for i, u in enumerate(units) for key in u.energy_observed]
        self.delta_tests = [
            (i, key) for i, u in enumerate(units) if u.covariance_eigenvalues is not None for key in u.delta_observed
        ]
        self.delta_unit = np.array([i for i, _ in self.delta_tests], dtype=int)
        self.delta_rank = np.array([key[1] for _, key in self.delta_tests], dtype=int)
        ranks = sorted({key[1] for _, key in self.energy_tests + self.delta_tests})
        self.ranks = ranks
        self.stream = HaarDiagonalStream(self.dim, ranks, seed, device=options.device)
        energy = np.stack([u.energy_eigenvalues for u in units], axis=1)
        self.energy_weights = torch.as_tensor(energy / energy.sum(axis=0), device=options.device)
        covariances = [
            u.covariance_eigenvalues if u.covariance_eigenvalues is not None else np.zeros(self.dim) for u in units
        ]
        self.cov = torch.as_tensor(np.stack(covariances, axis=1), device=options.device)
        self.cov_trace = self.cov.sum(dim=0).cpu().numpy()
        self.cov_frobenius = self.cov.square().sum(dim=0).cpu().numpy()
        observed_e = [units[i].energy_observed[key] for i, key in self.energy_tests]
        observed_d = [units[i].delta_observed[key] for i, key in self.delta_tests]
        self.energy_mc = SequentialMonteCarlo(observed_e, options.n_max, options.stop_after, options.alternative)
        self.delta_mc = SequentialMonteCarlo(observed_d, options.n_max, options.stop_after, options.alternative)
        self.energy_risk = _energy_risk(observed_e, options)
        # float64 recomputation bands: the float32 error of a value is ~1e-6 of its magnitude, and
        # ΔIsoScore* is a difference of two IsoScores* (each in [0, 1]) whose errors add up
        self.energy_band = RELATIVE_BAND * np.abs(np.asarray(observed_e, dtype=float))
        full = isoscore_star_from_traces(self.cov_trace, self.cov_frobenius, self.dim, options.c0, options.zeta)
        self.delta_band = RELATIVE_BAND * (
            np.abs(np.asarray(observed_d, dtype=float)) + 2.0 * np.abs(np.array([full[i] for i, _ in self.delta_tests]))
        )
        self.recorded_energy: dict[tuple[str, int], np.ndarray] = {}
        self.recorded_delta: dict[tuple[str, int], np.ndarray] = {}
        self.drawn = 0

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        index = 0
        while True:
            size = min(
                CHUNK,
                max(
                    self.energy_mc.remaining,
                    self.delta_mc.remaining,
                    self._risk_remaining(),
                    self.options.n_record - self.drawn,
                ),
            )
            if size <= 0:
                break
            chunk = self.stream.chunk(index, size)
            if self.drawn < self.options.n_record:
                self._record(chunk, min(size, self.options.n_record - self.drawn))
            if self.energy_mc.remaining or self._risk_remaining():
                values = self._energy_values(chunk)
                if self.energy_mc.remaining:
                    self.energy_mc.update(values)
                if self.energy_risk is not None and self._risk_remaining():
                    self.energy_risk.update(values)
            if self.delta_mc.remaining:
                self._count_delta(chunk)
            self.drawn += size
            index += 1

    def _risk_remaining(self) -> int:
        return self.energy_risk.remaining if self.energy_risk is not None else 0

    def energy_results(self) -> dict:
        results = self._results(self.energy_mc, self.energy_tests)
        if self.energy_risk is None:
            return results
        risk = self.energy_risk
        return {
            key: replace(
                test, p_low=float(risk.p_low[t]), p_high=float(risk.p_high[t]), risk_draws=int(risk.draws_used[t])
            )
            for t, (key, test) in enumerate(results.items())
        }

    def delta_results(self) -> dict:
        return self._results(self.delta_mc, self.delta_tests)

    def _results(self, mc: SequentialMonteCarlo, tests) -> dict:
        p = mc.p_values()
        return {
            (self.units[i].unit_id, *key): ExactTestResult(
                p_value=float(p[t]), n_draws=int(mc.draws_used[t]), stopped=bool(mc.stopped[t])
            )
            for t, (i, key) in enumerate(tests)
        }

    # -- energy ----------------------------------------------------------------------------
    def _energy_values(self, chunk) -> np.ndarray:
        """``(tests, c)`` energy fractions of the chunk's draws; near-ties recomputed in float64."""
        weights = self.energy_weights.to(chunk.rows.dtype)
        by_rank = {k: (chunk.diagonals[k] @ weights).double().cpu().numpy() for k in self.ranks}
        values = np.stack([by_rank[key[1]][:, i] for i, key in self.energy_tests])
        self._refine(
            values,
            self.energy_mc,
            self.energy_tests,
            self.energy_band,
            chunk,
            np.arange(chunk.size),
            self._energy_float64,
        )
        if self.energy_risk is not None:  # the tests the risk-bounded decisions still draw for
            self._refine(
                values,
                self.energy_risk,
                self.energy_tests,
                self.energy_band,
                chunk,
                np.arange(chunk.size),
                self._energy_float64,
            )
        return values

    def _energy_float64(self, rows: torch.Tensor, unit: int, rank: int) -> np.ndarray:
        diagonal = rows[:, :rank].square().sum(dim=1)
        return (diagonal @ self.energy_weights[:, unit]).cpu().numpy()

    # -- ΔIsoScore* ----------------------------------------------------------------------------
    def _delta_of(self, unit, rank: int, t1, t2, t3) -> np.ndarray:
        """ΔIsoScore* of draws with traces ``t1, t2, t3`` in unit ``unit``'s covariance (``unit``
        an index, with ``t*`` arrays of draws; or an index array of units, with ``t*`` of shape
        ``(units, draws)``)."""
        c0, zeta = self.options.c0, self.options.zeta
        unit = np.asarray(unit)
        trace, frob = self.cov_trace[unit], self.cov_frobenius[unit]
        full = isoscore_star_from_traces(trace, frob, self.dim, c0, zeta)
        if unit.ndim:  # one row per unit
            trace, frob, full = trace[:, None], frob[:, None], full[:, None]
        removed = isoscore_star_from_traces(trace - t1, frob - 2.0 * t2 + t3, self.dim - rank, c0, zeta)
        return removed - full

    def _count_delta(self, chunk) -> None:
        """Feed the chunk's ΔIsoScore* values to the sequential counts in blocks of
        :data:`DELTA_BLOCK` draws, so a test that stops early never pays for exact ``t3`` of the
        chunk's later draws."""
        cov = self.cov.to(chunk.rows.dtype)
        moments = {
            k: (
                (chunk.diagonals[k] @ cov).double().cpu().numpy(),
                (chunk.diagonals[k] @ cov.square()).double().cpu().numpy(),
            )
            for k in self.ranks
        }
        for start in range(0, chunk.size, DELTA_BLOCK):
            if not self.delta_mc.remaining:
                break
            draws = np.arange(start, min(start + DELTA_BLOCK, chunk.size))
            self.delta_mc.update(self._delta_values(chunk, draws, moments))

    def _delta_values(self, chunk, draws: np.ndarray, moments) -> np.ndarray:
        """``(tests, len(draws))`` ΔIsoScore* of some draws of a chunk, for the active tests:
        bounded from ``t1, t2`` where that decides the comparison, exact (``t3`` from the rows)
        elsewhere."""
        values = np.full((len(self.delta_tests), draws.size), np.nan)
        pending: list[tuple[int, int, int, np.ndarray]] = []
        union: dict[tuple[int, int], np.ndarray] = {}
        active = np.flatnonzero(self.delta_mc.active)
        for rank in np.unique(self.delta_rank[active]):
            tests = active[self.delta_rank[active] == rank]  # all active tests of this rank at once
            units = self.delta_unit[tests]
            t1, t2 = moments[rank][0][draws][:, units].T, moments[rank][1][draws][:, units].T  # (tests, draws)
            upper = self._delta_of(units, rank, t1, t2, t1 * t1 / rank)  # smallest t3: largest Δ
            lower = self._delta_of(units, rank, t1, t2, np.minimum(t2, t1 * t1))
            observed, slack = self.delta_mc.observed[tests, None], self.delta_band[tests, None]
            below, above = upper < observed - slack, lower > observed + slack
            values[tests] = np.where(below, upper, lower)  # a value on the side the bounds prove
            undecided = ~(below | above)
            for row in np.flatnonzero(undecided.any(axis=1)):
                t, i = int(tests[row]), int(units[row])
                pending.append((t, i, int(rank), undecided[row]))
                union[(i, int(rank))] = union.get((i, int(rank)), np.zeros(draws.size, bool)) | undecided[row]
        exact = {key: self._exact_delta(chunk, *key, draws[mask], moments) for key, mask in union.items()}
        for t, i, rank, undecided in pending:
            mask = union[(i, rank)]
            position = np.cumsum(mask) - 1  # where each of the union's draws sits in `exact`
            values[t, undecided] = exact[(i, rank)][position[undecided]]
        self._refine(values, self.delta_mc, self.delta_tests, self.delta_band, chunk, draws, self._delta_float64)
        return values

    def _exact_delta(self, chunk, unit: int, rank: int, draws: np.ndarray, moments) -> np.ndarray:
        """Exact (float32) ΔIsoScore* of the given draws: ``t3 = ‖W_k Λ W_kᵀ‖_F²`` from the rows."""
        rows = chunk.rows[torch.as_tensor(draws, device=chunk.rows.device), :rank]
        root = self.cov[:, unit].clamp_min(0).sqrt().to(rows.dtype)
        scaled = rows * root  # W_k Λ^½: the Gram of its rows is W_k Λ W_kᵀ
        block = scaled @ scaled.transpose(1, 2)
        t3 = block.square().sum(dim=(1, 2)).double().cpu().numpy()
        t1, t2 = moments[rank][0][draws, unit], moments[rank][1][draws, unit]
        return self._delta_of(unit, rank, t1, t2, t3)

    def _delta_float64(self, rows: torch.Tensor, unit: int, rank: int) -> np.ndarray:
        block_rows = rows[:, :rank]
        lam = self.cov[:, unit]
        diagonal = block_rows.square().sum(dim=1)
        t1, t2 = (diagonal @ lam).cpu().numpy(), (diagonal @ lam.square()).cpu().numpy()
        scaled = block_rows * lam.sqrt()
        t3 = (scaled @ scaled.transpose(1, 2)).square().sum(dim=(1, 2)).cpu().numpy()
        return self._delta_of(unit, rank, t1, t2, t3)

    # -- float64 where it matters, and the recorded draws -----------------------------------------
    def _refine(
        self,
        values: np.ndarray,
        mc: SequentialMonteCarlo | RiskBoundedMonteCarlo,
        tests,
        band: np.ndarray,
        chunk,
        draws: np.ndarray,
        float64_values,
    ) -> None:
        """Recompute in float64 (in place) every active test's values within ``band`` of its
        observed value (``values[:, j]`` is draw ``draws[j]`` of the chunk), so the float32
        error never decides a comparison."""
        near = np.abs(values - mc.observed[:, None]) <= band[:, None]
        near &= mc.active[:, None]
        if not near.any():
            return
        columns = np.flatnonzero(near.any(axis=0))
        rows = self.stream.rows(chunk, draws[columns])
        position = np.full(values.shape[1], -1)
        position[columns] = np.arange(columns.size)
        for t in np.flatnonzero(near.any(axis=1)):
            i, (_, rank) = tests[t]
            picked = np.flatnonzero(near[t])
            values[t, picked] = float64_values(rows[position[picked]], i, rank)

    def _record(self, chunk, count: int) -> None:
        """Float64 values of the first draws for every unit and rank (the paper's convention)."""
        rows = self.stream.rows(chunk, np.arange(count))
        for i, unit in enumerate(self.units):
            for rank in self.ranks:
                key = (unit.unit_id, rank)
                energy = self._energy_float64(rows, i, rank)
                self.recorded_energy[key] = np.concatenate([self.recorded_energy.get(key, np.empty(0)), energy])
                if unit.covariance_eigenvalues is not None and self.dim - rank >= 2:
                    delta = self._delta_float64(rows, i, rank)
                    self.recorded_delta[key] = np.concatenate([self.recorded_delta.get(key, np.empty(0)), delta])
