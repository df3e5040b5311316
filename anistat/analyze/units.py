"""One unit's rows of the results table (see :mod:`anistat.analyze` for the table).

Per unit the analysis diagonalises two matrices once — the gradient second moment ``M`` (energy,
oracle) and covariance ``C`` (ΔIsoScore*), eigenvalues only — and evaluates each proxy on them
directly (``tr(UᵀMU)``, ``‖MU‖_F²``, ``‖UᵀMU‖_F²``: ``O(d²k)``). The exact tests come from the
run's shared Haar draws (:mod:`anistat.analyze.nulls`); per control kind:

* ``haar``: reference energy ``k/d · t`` (closed form), control mean and sd of ``E(Q)`` in closed
  form, ``p_value_paper`` and ΔIsoScore*'s control mean / sd / z against the first
  ``controls.n`` draws of the shared Haar stream;
* ``normal`` (the paper's control: uniform in the proxy's complement): reference
  ``k/(d − k) · (t − p)`` and control moments in closed form (:func:`anistat.stats.control_energy_moments`),
  ``p_value_paper`` and ΔIsoScore*'s control statistics against ``controls.n`` explicit draws;
* projected kinds (``pca_span``, ``cov_matched``, and every kind under
  ``stats.energy_ratio_reference: drawn``): the per-token energies of the drawn controls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import vocabulary as vocab
from ..collect import UnitArtifact
from ..geometry import (
    complement_subspaces,
    effective_rank_from_cov,
    effective_rank_from_eigenvalues,
    haar_null_check,
    isoscore_from_cov,
    isoscore_star_from_cov,
    isoscore_star_from_traces,
    oracle_fractions_of_spectrum,
    participation_ratio_from_cov,
    removal_traces,
    subspace_traces,
)
from ..protocol import Protocol
from ..seeding import derive_seed
from ..stats import (
    EXACT_TEST,
    ControlMoments,
    ExactTestResult,
    analyze_energy,
    cluster_sums,
    control_energy_moments,
    expected_control_energy,
    kish_effective_size,
    monte_carlo_pvalue,
)
from ..stats.fallbacks import NO_EXACT_TEST, SEQUENCES_RESAMPLED, ZERO_CONTROL_SD, join_fallbacks
from ..vocabulary import PROXY_METRICS
from .nulls import ExactNulls, UnitSpectrum


def unit_columns(artifact: UnitArtifact) -> dict:
    key = artifact.key
    return {
        "model": key.model,
        "objective": key.objective,
        "checkpoint": key.checkpoint,
        "step": key.step,
        "phase": key.phase,
        "layer": key.layer,
        "site": key.site,
        "dim": artifact.dim,
        "n_sequences": int(artifact.n_tokens.shape[0]),
        "n_tokens": int(artifact.n_tokens.sum()),
    }


def covariance(moments: dict) -> torch.Tensor:
    count = moments["count"]
    total = torch.as_tensor(moments["sum"], dtype=torch.float64)
    outer = torch.as_tensor(moments["outer"], dtype=torch.float64)
    mean = total / count
    return (outer - count * torch.outer(mean, mean)) / (count - 1)


def proxy_groups(artifact: UnitArtifact) -> list[tuple[str, int]]:
    """(proxy method, rank) pairs of a unit, in collection order."""
    seen: list[tuple[str, int]] = []
    for basis in artifact.bases:
        if basis.control == "proxy" and (basis.proxy, basis.rank) not in seen:
            seen.append((basis.proxy, basis.rank))
    return seen


#: Largest entry of ``|UᵀU − I|`` a proxy basis may have: the energies were measured with its
#: columns, so a basis that is not orthonormal (float32 round-off is ~1e-7) measured something else.
ORTHONORMALITY_TOLERANCE = 1e-4


def unanalysable_reason(artifact: UnitArtifact) -> str:
    """Why a collected unit cannot be analysed ('' when it can): fewer than 2 test tokens or
    sequences, zero gradient energy (no energy fraction is defined), or a proxy basis that is not
    orthonormal — with its numerical rank when its columns are dependent (``[u1, u1]``: rank 1
    of 2). Such a proxy is refused, not reduced: its per-sequence energies were measured with the
    given columns (a duplicated column counted twice) and cannot be re-projected."""
    n_sequences, n_tokens = int(artifact.n_tokens.shape[0]), int(np.sum(artifact.n_tokens))
    if n_tokens < 2 or n_sequences < 2:
        return (
            f"too little test data to analyse: {n_tokens} token(s) in {n_sequences} sequence(s) "
            "(at least 2 of each are needed); use more test data"
        )
    total = float(np.sum(artifact.total_energy))
    if not total > 0:
        return (
            "zero gradient energy: every test gradient at this site is 0, so no energy fraction is "
            "defined (a site the loss does not reach, or frozen parameters)"
        )
    for (proxy, rank), basis in artifact.proxy_bases.items():
        u = np.asarray(basis, dtype=np.float64)
        error = float(np.abs(u.T @ u - np.eye(u.shape[1])).max()) if u.size else 0.0
        if not error <= ORTHONORMALITY_TOLERANCE:
            numerical_rank = int(np.linalg.matrix_rank(u)) if np.isfinite(u).all() else 0
            return (
                f"proxy {proxy} rank {rank} is not an orthonormal basis (numerical rank {numerical_rank} of "
                f"{u.shape[1]}, max |UᵀU − I| = {error:.3g}); its energies were measured with these columns "
                "and cannot be re-projected: give orthonormal, linearly independent columns"
            )
    return ""


def screen_units(artifacts: list[UnitArtifact]) -> None:
    """Mark every collected unit that cannot be analysed as ``failed`` with its reason (on the
    artifact itself, so the run's unit records, manifest and exit code see it); the other units
    are analysed as usual."""
    for artifact in artifacts:
        if artifact.status == "ok":
            reason = unanalysable_reason(artifact)
            if reason:
                artifact.status, artifact.note = "failed", reason


def resampling_documents(artifact: UnitArtifact, protocol: Protocol) -> tuple[np.ndarray | None, str]:
    """The document ids to resample by (None: sequences), and a warning when documents cannot be used."""
    if protocol.stats.resampling_unit != "document":
        return None, ""
    documents = artifact.sequence_documents
    if len(np.unique(documents)) < 2:
        return None, f"{artifact.key.id}: all test sequences come from one document; sequences resampled instead"
    return documents, ""


@dataclass(frozen=True, kw_only=True)
class Frame:
    """A symmetric PSD matrix of a unit (``M`` or ``C``) with its trace, ``‖·‖_F²`` and eigenvalues."""

    matrix: torch.Tensor
    eigenvalues: np.ndarray
    trace: float
    frobenius: float

    @classmethod
    def of(cls, matrix) -> Frame:
        s = torch.as_tensor(matrix, dtype=torch.float64)
        s = 0.5 * (s + s.T)
        eigenvalues = torch.linalg.eigvalsh(s).clamp_min(0.0).numpy()
        return cls(matrix=s, eigenvalues=eigenvalues, trace=float(torch.trace(s)), frobenius=float(s.square().sum()))

    def traces(self, bases) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``tr(QᵀSQ)``, ``‖SQ‖_F²``, ``‖QᵀSQ‖_F²`` of a basis ``(d, k)`` or a stack ``(n, d, k)``."""
        return tuple(np.atleast_1d(x.numpy()) for x in removal_traces(self.matrix, torch.as_tensor(bases)))


@dataclass(frozen=True, kw_only=True)
class PreparedUnit:
    """A unit ready for its rows: frames, the proxies' traces in them, the oracle, the exact tests' inputs."""

    artifact: UnitArtifact
    second_moment: Frame
    covariance: Frame
    proxy_traces: dict[tuple[str, int], tuple[tuple, tuple]]  # (proxy, rank) -> (traces in M, traces in C)
    oracle: dict[int, float]
    delta_ok: bool
    spectrum: UnitSpectrum


def prepare_unit(artifact: UnitArtifact, protocol: Protocol) -> PreparedUnit:
    """Diagonalise ``M`` and ``C`` (eigenvalues only) and evaluate every proxy in both."""
    stats = protocol.stats
    second, cov = Frame.of(artifact.gradient_moments["outer"]), Frame.of(covariance(artifact.gradient_moments))
    groups = proxy_groups(artifact)
    ranks = sorted({rank for _, rank in groups})
    delta_ok = artifact.dim - max(ranks) >= 2
    traces, energy_observed, delta_observed = {}, {}, {}
    for proxy, rank in groups:
        basis = artifact.proxy_bases[(proxy, rank)]
        in_m, in_c = second.traces(basis), cov.traces(basis)
        traces[(proxy, rank)] = (in_m, in_c)
        energy_observed[(proxy, rank)] = float(in_m[0][0] / second.trace)
        if delta_ok:
            delta_observed[(proxy, rank)] = float(
                delta_from_traces(cov, rank, *in_c, stats.isoscore_c0, stats.isoscore_zeta)[0]
            )
    spectrum = UnitSpectrum(
        unit_id=artifact.key.id,
        dim=artifact.dim,
        energy_eigenvalues=second.eigenvalues,
        energy_observed=energy_observed,
        covariance_eigenvalues=cov.eigenvalues if delta_ok else None,
        delta_observed=delta_observed,
    )
    oracle = oracle_fractions_of_spectrum(torch.as_tensor(second.eigenvalues), ranks)
    return PreparedUnit(
        artifact=artifact,
        second_moment=second,
        covariance=cov,
        proxy_traces=traces,
        oracle=oracle,
        delta_ok=delta_ok,
        spectrum=spectrum,
    )


def delta_from_traces(cov: Frame, rank: int, t1, t2, t3, c0: str, zeta: float) -> np.ndarray:
    """ΔIsoScore* of removing subspaces with traces ``t1, t2, t3`` in the covariance frame."""
    d = cov.eigenvalues.size
    full = isoscore_star_from_traces(cov.trace, cov.frobenius, d, c0, zeta)
    return isoscore_star_from_traces(cov.trace - t1, cov.frobenius - 2.0 * t2 + t3, d - rank, c0, zeta) - full


def failed_rows(artifact: UnitArtifact, protocol: Protocol) -> list[dict]:
    base = unit_columns(artifact)
    return [
        {
            **base,
            "proxy": proxy,
            "rank": rank,
            "control": control,
            "metric": metric,
            "status": "failed",
            "note": artifact.note,
        }
        for proxy, rank in proxy_groups(artifact)
        for control in protocol.controls.kinds
        for metric in PROXY_METRICS
    ]


def effective_resampling_units(artifact: UnitArtifact, documents) -> float:
    """Kish's effective number of resampling units ``(Σ T_u)²/Σ T_u²`` of the per-unit total
    energies ``T_u`` (documents when ``documents`` is given, else sequences).

    The weights are the total energies because every energy estimate is a ratio of sums, an
    energy-weighted mean of the units' own ratios (``Σp/Σt = Σ_u (t_u/Σt)·(p_u/t_u)``; the haar
    reference is ``k/d·t``): a unit's share of the total energy is its weight in every interval of
    the row group, so ``n_eff`` is how many equally weighted units the intervals rest on."""
    sums, _ = cluster_sums(artifact.total_energy.sum(axis=1)[:, None], documents)
    return kish_effective_size(sums[:, 0])


def rows_of_unit(unit: PreparedUnit, nulls: ExactNulls, protocol: Protocol, settings) -> tuple[list[dict], list[str]]:
    """All rows of one unit (and its warnings): the oracle, then per (proxy, rank) and control kind
    the energy rows of `analyze_energy` and the ΔIsoScore* row, then the descriptive metrics."""
    artifact, stats = unit.artifact, protocol.stats
    base = unit_columns(artifact)
    documents, warning = resampling_documents(artifact, protocol)
    notes = [warning] if warning else []
    resampled = SEQUENCES_RESAMPLED if warning else ""  # documents asked for, sequences resampled
    n_eff = effective_resampling_units(artifact, documents)
    rows = [
        {
            **base,
            "proxy": "oracle",
            "rank": rank,
            "control": "none",
            "metric": "oracle_fraction",
            "estimate": value,
            "ci_method": "none",
            "n_controls": 0,
            "status": "ok",
            "note": "",
            "fallback": "",
        }
        for rank, value in unit.oracle.items()
    ]
    for proxy, rank in proxy_groups(artifact):
        for control in protocol.controls.kinds:
            controls = control_draws(unit, proxy, rank, control, nulls, protocol)
            analysis = energy_analysis(unit, proxy, rank, control, controls, nulls, documents, protocol, settings)
            group = {**base, "proxy": proxy, "rank": rank, "control": control, "status": "ok"}
            stream = control if control in protocol.projected_control_kinds else "expected"
            for record in analysis.to_records():
                exact = record["p_test"] == EXACT_TEST
                record["_test"] = (
                    (artifact.key.id, proxy, rank, EXACT_TEST)
                    if exact
                    else (artifact.key.id, proxy, rank, stream, record["p_test"])
                )
                if not exact:
                    record["note"] = join_notes(
                        record["note"], floor_note(record["p_value"], analysis.data_test.n_resamples)
                    )
                elif getattr(settings, "resampling_risk", None) is not None:  # the decision's interval
                    test = nulls.energy[(artifact.key.id, proxy, rank)]
                    record.update(mc_p_low=test.p_low, mc_p_high=test.p_high)
                    record["note"] = join_notes(
                        record["note"],
                        f"risk-bounded decision: {test.risk_draws} Haar "
                        f"draws, ideal p in [{test.p_low:.4g}, {test.p_high:.4g}]",
                    )
                rows.append(
                    {**group, **record, "fallback": join_fallbacks(resampled, record["fallback"]), "n_eff": n_eff}
                )
            rows.append(
                {
                    **group,
                    **delta_row(unit, proxy, rank, control, controls, nulls, stats),
                    "n_sequences": analysis.n_sequences,
                    "n_clusters": analysis.n_clusters,
                }
            )
        notes.extend(projected_haar_check(unit, proxy, rank, protocol))
    rows.extend(
        {**base, **row, "status": "ok"}
        for row in descriptive_rows(
            artifact,
            stats.isoscore_c0,
            stats.isoscore_zeta,
            gradient_covariance=(unit.covariance.matrix, unit.covariance.eigenvalues),
        )
    )
    return rows, notes


@dataclass(frozen=True, kw_only=True)
class ControlDraws:
    """The drawn controls of one (unit, proxy, rank, kind): energy fractions (the paper's
    convention) and ΔIsoScore* values, and how many."""

    energy: np.ndarray
    delta: np.ndarray


def control_draws(
    unit: PreparedUnit, proxy: str, rank: int, kind: str, nulls: ExactNulls, protocol: Protocol
) -> ControlDraws:
    """Energy fractions and ΔIsoScore* of the row's ``controls.n`` drawn controls."""
    artifact, stats = unit.artifact, protocol.stats
    if kind in protocol.projected_control_kinds:
        columns = artifact.columns_for(proxy, rank, kind)
        total = artifact.total_energy.sum()
        energy = artifact.energy.sum(axis=1)[:, columns].sum(axis=0) / total
        return ControlDraws(energy=energy, delta=np.asarray(artifact.delta_isoscore_star[columns], dtype=float))
    if kind == vocab.HAAR:
        key = (artifact.key.id, rank)
        return ControlDraws(
            energy=nulls.recorded_energy.get(key, np.empty(0)), delta=nulls.recorded_delta.get(key, np.full(1, np.nan))
        )
    # normal: uniform in the proxy's complement, drawn explicitly (controls.n of them)
    q = complement_subspaces(
        artifact.proxy_bases[(proxy, rank)],
        protocol.controls.n,
        derive_seed(protocol.seed, artifact.key.id, proxy, rank, "normal-draws"),
    )
    in_c = subspace_traces(unit.covariance.matrix, q)
    # M = (N − 1)·C + s sᵀ/N (s = Σg): a draw's trace in M follows from its trace in C and ‖Qᵀs‖²,
    # without a second d × d product (every term is non-negative: no digits cancel)
    count = float(artifact.gradient_moments["count"])
    along_sum = (q.transpose(1, 2) @ torch.as_tensor(artifact.gradient_moments["sum"]).to(q.dtype)).square().sum(-1)
    energy = ((count - 1.0) * in_c.trace + along_sum.double().numpy() / count) / unit.second_moment.trace
    delta = (
        delta_from_traces(
            unit.covariance,
            rank,
            in_c.trace,
            in_c.trace_squared,
            in_c.frobenius,
            stats.isoscore_c0,
            stats.isoscore_zeta,
        )
        if unit.delta_ok
        else np.full(1, np.nan)
    )
    return ControlDraws(energy=energy, delta=delta)


def energy_analysis(
    unit: PreparedUnit,
    proxy: str,
    rank: int,
    kind: str,
    controls: ControlDraws,
    nulls: ExactNulls,
    documents,
    protocol: Protocol,
    settings,
):
    """`analyze_energy` for one row group: the reference energy and control moments of the kind,
    the exact test from the shared draws."""
    artifact, stats = unit.artifact, protocol.stats
    total = artifact.total_energy.sum(axis=1)
    energy = artifact.energy.sum(axis=1)  # (S, n_bases): frequency buckets summed
    proxy_energy = energy[:, artifact.columns_for(proxy, rank, "proxy")[0]]
    dim = artifact.dim
    if kind in protocol.projected_control_kinds:
        reference, reference_kind = energy[:, artifact.columns_for(proxy, rank, kind)].mean(axis=1), "drawn"
        moments = ControlMoments.of_draws(controls.energy)
    else:
        reference, reference_kind = expected_control_energy(kind, proxy_energy, total, rank, dim), "expected"
        in_m = unit.proxy_traces[(proxy, rank)][0]
        moments = control_energy_moments(
            kind,
            rank,
            dim,
            unit.second_moment.trace,
            unit.second_moment.frobenius,
            float(in_m[0][0]),
            float(in_m[1][0]),
            float(in_m[2][0]),
        )
    test = nulls.energy[(artifact.key.id, proxy, rank)]
    stream = kind if kind in protocol.projected_control_kinds else "expected"
    return analyze_energy(
        proxy_energy,
        total,
        reference,
        rank=rank,
        dim=dim,
        exact=replace(test, note=exact_note(test, settings)),
        control_moments=moments,
        paper_fractions=controls.energy,
        observed_fraction=unit.spectrum.energy_observed[(proxy, rank)],
        n_paper_controls=protocol.controls.n,
        group_ids=documents,
        oracle_fraction=unit.oracle[rank],
        reference=reference_kind,
        control_kind=kind,
        n_bootstrap=stats.n_bootstrap,
        ci_level=stats.ci_level,
        ci_method=stats.ci_method,
        n_test_resamples=settings.n_test_resamples,
        alternative=stats.alternative,
        seed=derive_seed(protocol.seed, artifact.key.id, proxy, rank, stream, "analysis"),
    )


def delta_row(
    unit: PreparedUnit, proxy: str, rank: int, kind: str, controls: ControlDraws, nulls: ExactNulls, stats
) -> dict:
    """The ΔIsoScore* row: the exact test from the shared draws, the paper's convention and z
    against the row's drawn controls."""
    key = (unit.artifact.key.id, proxy, rank)
    dim = unit.artifact.dim
    observed = unit.spectrum.delta_observed.get((proxy, rank), np.nan)
    test = nulls.delta.get(key, ExactTestResult(p_value=np.nan, n_draws=0, fallback=NO_EXACT_TEST))
    values = controls.delta[np.isfinite(controls.delta)]
    mean = float(values.mean()) if values.size else np.nan
    sd = float(values.std(ddof=1)) if values.size > 1 else np.nan
    whole_complement = kind == vocab.NORMAL and 2 * rank == dim and values.size > 0
    if whole_complement:  # every draw spans the same subspace: equal up to round-off
        sd = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (observed - mean) / sd if sd > 0 else np.nan
    paper = monte_carlo_pvalue(observed, values, stats.alternative) if values.size else np.nan
    untested = ""
    if not np.isfinite(test.p_value):
        largest = max(r for _, r in proxy_groups(unit.artifact))
        untested = (
            f"no p-value: ΔIsoScore* needs at least 2 dimensions left after removing the subspace, and "
            f"d − k = {dim - largest} for the unit's largest rank {largest}"
            if not unit.delta_ok
            else "no p-value: no exact ΔIsoScore* test was run"
        )
    note = join_notes(
        f"IsoScore* C0={stats.isoscore_c0}, zeta={stats.isoscore_zeta}",
        f"control mean, sd and z: {values.size} drawn {kind} controls" if values.size else "no control values",
        "the normal control is the proxy's whole complement (k = d/2): sd exactly 0, z undefined"
        if whole_complement
        else "",
        exact_note(test, None) if np.isfinite(test.p_value) else untested,
    )
    return {
        "metric": "delta_isoscore_star",
        "estimate": observed,
        "control_mean": mean,
        "control_sd": sd,
        "ci_method": "none",
        "p_value": test.p_value,
        "p_test": EXACT_TEST,
        "p_value_paper": paper,
        "effect_size": z,
        "effect_size_kind": "z",
        "n_controls": test.n_draws,
        "note": note,
        "fallback": join_fallbacks(
            ZERO_CONTROL_SD if whole_complement else "", "" if np.isfinite(test.p_value) else NO_EXACT_TEST
        ),
        "_test": (unit.artifact.key.id, proxy, rank, "haar_monte_carlo_delta_isoscore_star"),
    }


def exact_note(test: ExactTestResult, settings) -> str:
    """How the exact test ended: stopped sequentially, or all n draws (and at its floor)."""
    if test.stopped:
        return f"exact test stopped after {test.n_draws} Haar draws (p = h/L, sequential)"
    text = f"exact test against {test.n_draws} Haar draws"
    return join_notes(text, floor_note(test.p_value, test.n_draws))


def projected_haar_check(unit: PreparedUnit, proxy: str, rank: int, protocol: Protocol) -> list[str]:
    """The Haar null check of per-token projected Haar controls (when they were projected)."""
    artifact = unit.artifact
    if vocab.HAAR not in protocol.controls.kinds or vocab.HAAR not in protocol.projected_control_kinds:
        return []
    columns = artifact.columns_for(proxy, rank, vocab.HAAR)
    if len(columns) < 2:
        return []
    total = artifact.total_energy.sum()
    check = haar_null_check(
        artifact.energy.sum(axis=1)[:, columns].sum(axis=0) / total, rank, artifact.dim, unit.second_moment.matrix
    )
    return [] if check.ok else [f"{artifact.key.id} {proxy} rank {rank}: Haar null check failed: {check.message}"]


def descriptive_rows(
    artifact: UnitArtifact, c0: str = "scaled_identity", zeta: float = 0.1, gradient_covariance=None
) -> list[dict]:
    """IsoScore, IsoScore* (protocol C0 and zeta), participation ratio, effective rank and mean
    cosine of the test-split gradients and activations (conventions in `anistat.geometry`).
    ``gradient_covariance``: the gradient covariance and its eigenvalues when already computed."""
    rows = []
    for cloud, moments, unit_sum in (
        ("gradient", artifact.gradient_moments, artifact.gradient_unit_sum),
        ("activation", artifact.activation_moments, artifact.activation_unit_sum),
    ):
        known = gradient_covariance if cloud == "gradient" else None
        cov = covariance(moments) if known is None else known[0]
        values = {
            "isoscore": isoscore_from_cov(cov),
            "isoscore_star": isoscore_star_from_cov(cov, c0, zeta),
            "participation_ratio": participation_ratio_from_cov(cov),
            "effective_rank": effective_rank_from_cov(cov)
            if known is None
            else effective_rank_from_eigenvalues(known[1]),
            "mean_cosine": mean_cosine(unit_sum, moments["count"]),
        }
        for metric, value in values.items():
            rows.append(
                {
                    "proxy": "none",
                    "control": "none",
                    "rank": None,
                    "metric": f"{cloud}_{metric}",
                    "estimate": float(value),
                    "ci_method": "none",
                    "n_controls": 0,
                    "note": "",
                }
            )
    return rows


def mean_cosine(unit_sum: np.ndarray, count: int) -> float:
    """Mean pairwise cosine over distinct pairs from Σ u_i: (‖Σu‖² − N) / (N(N − 1))."""
    return float((np.dot(unit_sum, unit_sum) - count) / (count * (count - 1)))


def floor_note(p_value: float, n: int) -> str:
    return f"p at its Monte-Carlo floor 1/({n}+1)" if np.isfinite(p_value) and p_value <= 1.0 / (n + 1) else ""


def join_notes(*parts: str) -> str:
    return "; ".join(part for part in parts if part)
