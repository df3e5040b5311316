"""`anistat plan`: how many documents (test sequences) and Haar draws a study needs.

From a pilot bundle (a small run of the same protocol) or from stated inputs, for an effect the
user states (the population energy ratio ``R`` of the proxy to the Haar expectation ``k/d``),
per unit kind (model × site kind × rank): documents for a target half-width of the energy
ratio's CI, for a target power of the data test and of the exact Haar test (both at the family's
corrected threshold ``α/m``), and the Haar draws and bootstrap resamples that resolve it. The
power and sample-size formulas, and how far to trust them, are :mod:`anistat.stats.power`'s;
this module reads the per-document law of each unit off the pilot (:func:`laws_from_results`:
``τ̂ = √n_pilot · se / estimate`` of the ``energy_fraction`` rows, ``n_pilot`` its documents,
``cv_t = √(n/n_eff − 1)``, the Haar null's SD), plans every unit kind for its hardest unit
(:func:`plan_rows`), and writes plan.csv, plan.html (through the report's templates) and the
pilot's protocol with the planned sizes (:func:`planned_protocol`).

Only what is planned is written: a count the notes call unplanned (the data test beyond
:data:`~anistat.stats.power.MAX_TEST_RESAMPLES` resamples) leaves the pilot's setting; a planned
number of documents beyond the pilot's corpus is said on the terminal, in plan.html and in the
protocol's comment; a pilot of one document (its intervals resample sequences within it) is
refused, as the per-document law cannot be read off it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import vocabulary as vocab
from .errors import AnistatInputError
from .stats import MIN_RESAMPLING_UNITS
from .stats.power import (
    DATA_TEST_SIMULATION_LIMIT,
    DATA_TEST_STUDIES,
    DRAWS_RESOLUTION,
    MAX_TEST_RESAMPLES,
    SMALL_SAMPLE_LIMIT,
    DataTestPower,
    ExactTestPower,
    HalfWidth,
    data_test_resamples,
    haar_null_quantile,
    null_draws_needed,
    null_sd_at,
    relative_sd,
    upper_relative_sd,
)

#: The protocol's default ``stats.ci_method`` (the interval planned for stated inputs).
DEFAULT_CI_METHOD = vocab.DEFAULT_CI_METHOD
#: Multiplicity corrections the plan knows (the protocol's ``stats.multiplicity``).
CORRECTIONS = tuple(vocab.MULTIPLICITY)


@dataclass(frozen=True)
class PlanTargets:
    """What the user asks of the study.

    Attributes
    ----------
    ratio : float
        The effect: the population energy ratio ``R`` to the Haar expectation ``k/d`` (> 1).
    half_width : float or None
        Target half-width of the energy ratio's CI on the ratio scale (None: not planned).
    power : float
        Target power of the data test and of the exact test.
    alpha : float
        The family's level.
    multiplicity : str
        ``holm``, ``fdr_bh``, ``bonferroni`` or ``none``.
    family_size : int
        ``m``, the tests in the family.
    ci_level : float
        Level of the interval.
    variance_confidence : float
        ``c`` of the upper confidence limit of the pilot's variance.
    ci_method : str
        The analysis' interval method (the protocol's ``stats.ci_method``), whose small-sample
        half-width is planned.
    """

    ratio: float
    half_width: float | None = None
    power: float = 0.8
    alpha: float = 0.05
    multiplicity: str = vocab.HOLM
    family_size: int = 1
    ci_level: float = 0.95
    variance_confidence: float = 0.8
    ci_method: str = DEFAULT_CI_METHOD

    @property
    def threshold(self) -> float:
        """The corrected per-test threshold ``α/m`` (``α`` without correction): Holm's and
        Bonferroni's for a lone effect, and BH's smallest step — conservative for BH when many
        tests of the family carry effects."""
        return self.alpha if self.multiplicity == "none" else self.alpha / self.family_size


@dataclass(frozen=True)
class UnitLaw:
    """The per-document law of one unit (or one stated rank).

    Attributes
    ----------
    model, site_kind : str
        The unit kind's labels (``stated`` for stated inputs).
    rank, dim : int
        ``k`` and ``d``.
    relative_sd : float
        ``τ``: √n × the relative SE of the energy fraction (see the module docstring).
    null_sd : float
        SD of the Haar null of the energy fraction on the unit's data.
    pilot_documents : int or None
        The documents ``τ`` was estimated from (None: ``τ`` taken as known).
    sequences_per_document : float
        Test sequences per document (turns documents into ``data.n_test_sequences``).
    null_documents : int or None
        The documents whose sample second moment ``null_sd`` was measured on (a pilot's): the null
        is wider in smaller studies (fewer tokens, a noisier spectrum), so the exact test is never
        planned below this size. None: ``null_sd`` holds at every size.
    tokens_per_document : float or None
        Tokens per document: with ``null_documents``, the null's SD at another size follows from
        the spectrum's sampling noise (:meth:`null_sd_at`).
    total_cv : float or None
        ``cv_t``, the CV of the per-document total energy (a pilot row's ``√(n/n_eff − 1)``, Kish
        ``n_eff``): with ``τ`` it sets the data test's simulated law (:func:`anistat.stats.power.document_law`).
        None: not known (the law's document scale is then constant).
    """

    model: str
    site_kind: str
    rank: int
    dim: int
    relative_sd: float
    null_sd: float
    pilot_documents: int | None = None
    sequences_per_document: float = 1.0
    null_documents: int | None = None
    tokens_per_document: float | None = None
    total_cv: float | None = None

    def null_sd_at(self, n: int | None) -> float:
        """The Haar null's SD in a study of ``n`` documents (None: infinitely many), carried from
        the pilot's size (:func:`anistat.stats.power.null_sd_at`)."""
        return null_sd_at(self.null_sd, self.rank, self.dim, n, self.null_documents, self.tokens_per_document)


@dataclass(frozen=True)
class PlanRow:
    """One unit kind's plan (the rows of plan.csv). Document counts are None where the target
    cannot be reached (the exact test below its reachable ratio) or was not asked for.
    ``documents``: the most the targets asked for need (the upper-limit plan with
    ``--conservative``); ``test_sequences``: that many documents' sequences, never fewer than the
    pilot's; ``test_resamples``: the data test's bootstrap resamples, None where the data test
    has no count (not planned)."""

    model: str
    site_kind: str
    rank: int
    dim: int
    units: int
    pilot_documents: int | None
    relative_sd: float
    relative_sd_upper: float | None
    threshold: float
    null_quantile: float
    exact_ratio_needed: float
    documents_half_width: int | None
    documents_data_test: int | None
    documents_exact_test: int | None
    documents_half_width_upper: int | None
    documents_data_test_upper: int | None
    documents_exact_test_upper: int | None
    documents: int | None
    test_sequences: int | None
    null_draws: int
    test_resamples: int | None


# ------------------------------------------------------------------------------ planning
def plan_unit(law: UnitLaw, targets: PlanTargets) -> dict[str, Any]:
    """The plan of one unit: documents for the half-width and the exact test (point and upper
    variance limit; the data test is planned per kind, :func:`_kind_data_test`), the null's
    quantile and the ratio the exact test needs."""
    threshold = targets.threshold
    quantile = haar_null_quantile(law.rank, law.dim, law.null_sd_at(None), threshold)

    def quantile_at(n: int) -> float:
        return haar_null_quantile(law.rank, law.dim, law.null_sd_at(n), threshold)

    upper = upper_relative_sd(law.relative_sd, law.pilot_documents, targets.variance_confidence)

    def documents(tau: float | None) -> tuple[int | None, None, int | None]:
        if tau is None:
            return None, None, None
        width = (
            HalfWidth(tau, targets.ci_level, targets.ci_method, law.total_cv).solve_power(
                ratio=targets.ratio, half_width=targets.half_width
            )
            if targets.half_width is not None
            else None
        )
        # the null is carried up from the pilot's size, never down: i.i.d. tokens understate the
        # noise of a smaller sample's spectrum (tokens of a sequence are dependent), so below the
        # pilot the carried null would be too narrow and the plan optimistic
        exact = ExactTestPower(tau, law.rank, law.dim, quantile_at, law.null_documents or 2).solve_power(
            ratio=targets.ratio, power=targets.power
        )
        return width, None, exact  # type: ignore[return-value]

    point, high = documents(law.relative_sd), documents(upper)
    return {
        "relative_sd_upper": upper,
        "null_quantile": quantile,
        "exact_ratio_needed": quantile * law.dim / law.rank,
        "documents": point,
        "documents_upper": high,
    }


def _worst(values: Sequence[int | None]) -> int | None:
    """The most documents any unit needs (None when one cannot reach the target at all)."""
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def _kind_data_test(
    laws: Sequence[UnitLaw], uppers: Sequence[float | None], targets: PlanTargets
) -> tuple[int | None, int | None]:
    """The data test's documents for a unit kind, point and upper variance limit: planned once,
    for the law of its unit with the largest ``τ`` (its own ``cv_t``; the simulated power,
    :func:`anistat.stats.power.law_data_test_power`, is too costly to search per unit), at ``τ``
    and at the kind's largest ``τ_U`` (searched from the point count times ``(τ_U/τ)²``)."""
    hardest = max(laws, key=lambda law: law.relative_sd)

    def documents(tau: float, start: int | None = None) -> int | None:
        test = DataTestPower(
            tau, targets.threshold, total_cv=hardest.total_cv, haar_fraction=hardest.rank / hardest.dim
        )
        return test.solve_power(ratio=targets.ratio, power=targets.power, start=start)  # type: ignore[return-value]

    point = documents(hardest.relative_sd)
    if None in uppers:
        return point, None
    upper = max(u for u in uppers if u is not None)
    start = None if point is None else math.ceil(point * (upper / hardest.relative_sd) ** 2)
    return point, documents(upper, start)


def plan_rows(laws: Sequence[UnitLaw], targets: PlanTargets, use_upper: bool = False) -> list[PlanRow]:
    """One :class:`PlanRow` per unit kind (model × site kind × rank): the plan must serve every
    unit of the kind, so each count is the largest over its units (the largest ``τ`` and null
    quantile decide). ``documents``: the most documents the targets asked for need (half-width
    when given, the data test, and the exact test where reachable), the upper-limit plan with
    ``use_upper``; ``test_sequences``: that times the sequences per document, and never fewer
    than a pilot's own test sequences (its Haar null is known from its size up, and a study
    smaller than its pilot plans nothing the pilot did not measure)."""
    kinds: dict[tuple[str, str, int], list[tuple[UnitLaw, dict[str, Any]]]] = {}
    for law in laws:
        kinds.setdefault((law.model, law.site_kind, law.rank), []).append((law, plan_unit(law, targets)))
    draws = null_draws_needed(targets.threshold)
    rows = []
    for (model, site_kind, rank), members in kinds.items():
        point = [_worst([plan["documents"][i] for _, plan in members]) for i in range(3)]
        high = [_worst([plan["documents_upper"][i] for _, plan in members]) for i in range(3)]
        uppers = [plan["relative_sd_upper"] for _, plan in members]
        point[1], high[1] = _kind_data_test([law for law, _ in members], uppers, targets)
        pilots = [law.pilot_documents for law, _ in members]
        chosen = high if use_upper and None not in uppers else point
        wanted = [n for n in (chosen[0], chosen[1], chosen[2]) if n is not None]
        documents = max(wanted) if wanted else None
        spd = max(law.sequences_per_document for law, _ in members)
        # a pilot's own sequences (null_documents is set from pilot bundles only)
        measured = [round(law.null_documents * law.sequences_per_document) for law, _ in members if law.null_documents]
        rows.append(
            PlanRow(
                model=model,
                site_kind=site_kind,
                rank=rank,
                dim=members[0][0].dim,
                units=len(members),
                pilot_documents=None if None in pilots else min(p for p in pilots if p is not None),
                relative_sd=max(law.relative_sd for law, _ in members),
                relative_sd_upper=None if None in uppers else max(u for u in uppers if u is not None),
                threshold=targets.threshold,
                null_quantile=max(plan["null_quantile"] for _, plan in members),
                exact_ratio_needed=max(plan["exact_ratio_needed"] for _, plan in members),
                documents_half_width=point[0],
                documents_data_test=point[1],
                documents_exact_test=point[2],
                documents_half_width_upper=high[0],
                documents_data_test_upper=high[1],
                documents_exact_test_upper=high[2],
                documents=documents,
                test_sequences=None if documents is None else max([math.ceil(documents * spd), *measured]),
                null_draws=draws,
                test_resamples=None if chosen[1] is None else data_test_resamples(targets.threshold, chosen[1]),
            )
        )
    return rows


# ------------------------------------------------------------------------- pilot bundles
def family_size_of(results, protocol, manifest: dict | None = None) -> int:
    """``m`` of the pilot's largest multiplicity family: the analysis' own count when the manifest
    records it (``null_settings.n_tests``), else counted the same way from the results: per unit
    (checkpoint × site) and (proxy, rank) the exact energy test, the exact ΔIsoScore* test and the
    data tests (one for the closed-form control kinds together, one per projected kind); summed
    over the run (``family: run``/``claim``) or the largest model's (``family: model``)."""
    recorded = (manifest or {}).get("null_settings", {}).get("n_tests")
    if isinstance(recorded, int) and recorded >= 1:
        return recorded
    kinds = set(protocol.controls.kinds)
    projected = kinds & set(protocol.projected_control_kinds)
    per_group = 2 + len(projected) + (1 if kinds - projected else 0)
    rows = results[results["status"].astype(str) == "ok"] if "status" in results else results
    rows = rows[rows["metric"] == "energy_fraction"]
    groups = rows[["model", "checkpoint", "site", "proxy", "rank"]].drop_duplicates()
    per_model = groups.groupby("model", sort=False).size() * per_group
    if per_model.empty:
        return 1
    return int(per_model.max() if protocol.stats.family == "model" else per_model.sum())


def laws_from_results(results) -> list[UnitLaw]:
    """Each unit's :class:`UnitLaw` from a pilot's results table: ``τ`` from the haar (else any)
    ``energy_fraction`` row (``√n_clusters · se / estimate``; ``n_sequences`` without documents)
    and the null's SD from the haar row's ``control_sd`` (else from the
    ``gradient_participation_ratio`` row through :func:`anistat.stats.control_energy_moments`)."""
    from .stats import control_energy_moments

    ok = results[results["status"].astype(str) == "ok"] if "status" in results else results
    fractions = ok[ok["metric"] == "energy_fraction"]
    laws = []
    for key, rows in fractions.groupby(["model", "checkpoint", "site", "proxy", "rank"], sort=False):
        haar = rows[rows["control"] == vocab.HAAR]
        row = (haar if len(haar) else rows).iloc[0]
        documents = row.get("n_clusters")
        documents = int(documents) if _present(documents) else int(row["n_sequences"])
        estimate, se = float(row["estimate"]), float(row["se"])
        if not (documents >= 2 and estimate > 0 and np.isfinite(se) and se > 0):
            continue
        dim, rank = int(row["dim"]), int(row["rank"])
        null_sd = float(row["control_sd"]) if len(haar) else float("nan")
        if not np.isfinite(null_sd):
            pr = ok[(ok["metric"] == "gradient_participation_ratio") & (ok["site"] == key[2])]
            pr = pr[(pr["model"] == key[0]) & (pr["checkpoint"] == key[1])]["estimate"]
            frobenius = 1.0 / float(pr.iloc[0]) if len(pr) else 1.0 / dim
            null_sd = control_energy_moments(vocab.HAAR, rank, dim, 1.0, frobenius).sd
        laws.append(
            UnitLaw(
                model=str(key[0]),
                site_kind=str(key[2]).split(".")[0],
                rank=rank,
                dim=dim,
                relative_sd=math.sqrt(documents) * se / estimate,
                null_sd=null_sd,
                pilot_documents=documents,
                sequences_per_document=float(row["n_sequences"]) / documents,
                null_documents=documents,
                tokens_per_document=float(row["n_tokens"]) / documents if _present(row.get("n_tokens")) else None,
                total_cv=_total_cv(documents, row.get("n_eff")),
            )
        )
    return laws


def _total_cv(documents: int, n_eff: Any) -> float | None:
    """``cv_t = √(n/n_eff − 1)``: Kish's ``n_eff = (Σt)²/Σt²`` of ``n`` per-document total
    energies is ``n/(1 + cv_t²)`` (the CV with divisor ``n``); None without an ``n_eff``."""
    if not _present(n_eff) or not float(n_eff) > 0:
        return None
    return math.sqrt(max(documents / float(n_eff) - 1.0, 0.0))


def _present(value: Any) -> bool:
    try:
        return value is not None and not bool(np.isnan(float(value)))
    except (TypeError, ValueError):
        return False


def stated_laws(
    dim: int,
    ranks: Sequence[int],
    tau: float,
    participation_ratio: float | None = None,
    pilot_documents: int | None = None,
    sequences_per_document: float = 1.0,
    total_cv: float | None = None,
) -> list[UnitLaw]:
    """:class:`UnitLaw` per stated rank: the Haar null's SD from the gradients' participation
    ratio ``PR = (Σλ)²/Σλ²`` (None: ``d``, isotropic gradients — the null is then the point
    ``k/d``, the optimistic end for the exact test)."""
    from .stats import control_energy_moments

    if dim < 2:
        raise AnistatInputError(f"--dim must be at least 2, got {dim}")
    bad = [k for k in ranks if not 1 <= k < dim]
    if bad:
        raise AnistatInputError(f"--rank {bad[0]} must be between 1 and --dim - 1 = {dim - 1}")
    pr = float(dim if participation_ratio is None else participation_ratio)
    if not 1.0 <= pr <= dim:
        raise AnistatInputError(f"--participation-ratio must be between 1 and --dim = {dim}, got {pr:g}")
    return [
        UnitLaw(
            model="stated",
            site_kind="stated",
            rank=int(k),
            dim=int(dim),
            relative_sd=tau,
            null_sd=control_energy_moments(vocab.HAAR, int(k), int(dim), 1.0, 1.0 / pr).sd,
            pilot_documents=pilot_documents,
            sequences_per_document=sequences_per_document,
            total_cv=total_cv,
        )
        for k in ranks
    ]


def check_targets(targets: PlanTargets) -> None:
    """One line naming the flag for every impossible target (exit 2 at the command line)."""
    if not targets.ratio > 1.0:
        raise AnistatInputError(f"--ratio must be above 1 (the effect to detect), got {targets.ratio:g}")
    if targets.half_width is not None and not targets.half_width > 0:
        raise AnistatInputError(f"--half-width must be positive, got {targets.half_width:g}")
    for name, value in (("--power", targets.power), ("--alpha", targets.alpha), ("--ci-level", targets.ci_level)):
        if not 0.0 < value < 1.0:
            raise AnistatInputError(f"{name} must be in (0, 1), got {value:g}")
    if not 0.0 < targets.variance_confidence < 1.0:
        raise AnistatInputError(f"--variance-confidence must be in (0, 1), got {targets.variance_confidence:g}")
    if targets.multiplicity not in CORRECTIONS:
        raise AnistatInputError(f"--multiplicity must be one of {', '.join(CORRECTIONS)}, got '{targets.multiplicity}'")
    if targets.family_size < 1:
        raise AnistatInputError(f"--family-size must be at least 1, got {targets.family_size}")


def row_dicts(rows: Sequence[PlanRow]) -> list[dict[str, Any]]:
    """The plan's rows as plain dicts (plan.csv's columns, in order)."""
    return [asdict(row) for row in rows]


PLAN_COLUMNS = tuple(f.name for f in fields(PlanRow))


def with_targets(targets: PlanTargets, **changes: Any) -> PlanTargets:
    """``targets`` with some fields replaced (the command line fills what the pilot did not)."""
    return replace(targets, **{k: v for k, v in changes.items() if v is not None})


def read_pilot(bundle: Path):
    """The pilot's :class:`anistat.bundle.Bundle` (a missing or damaged bundle: exit 2)."""
    from .bundle import Bundle

    if not Path(bundle).is_dir():
        raise AnistatInputError(f"{bundle}: no such bundle directory; give the folder a pilot `anistat run` wrote")
    return Bundle.load(bundle)


# ------------------------------------------------------------------------------- outputs
def assumptions(targets: PlanTargets, source: str) -> list[str]:
    """What the plan assumes and how far it can be trusted, in sentences (terminal and HTML)."""
    correction = (
        "no correction" if targets.multiplicity == "none" else f"{targets.multiplicity} over m = {targets.family_size}"
    )
    return [
        f"Effect: population energy ratio R = {targets.ratio:g} to the Haar expectation k/d, in every unit "
        f"kind; tests one-sided at the corrected threshold {targets.threshold:.3g} ({correction}, alpha = "
        f"{targets.alpha:g}; for fdr_bh this is the smallest step, conservative when many tests carry effects).",
        f"Per-document law: {source}; the same relative SD tau at the stated ratio, independent documents, "
        "and log R̂ approximately normal (delta method for a ratio of means).",
        f"Data test: below {DATA_TEST_SIMULATION_LIMIT} documents the share of {DATA_TEST_STUDIES} seeded simulated "
        "studies that the real bootstrap-t test (small-sample expansion, the plan's resamples) rejects; the "
        "studies' documents: a lognormal energy scale (its CV with tau gives the pilot's total-energy CV "
        "sqrt(n/n_eff - 1)), the proxy a fixed share R k/d of it, the complement's share lognormal with the CV "
        "that gives tau — an assumed shape (documents with more energy carry a smaller proxy share), "
        "conservative in the calibration's laws (docs/plan.md). From "
        f"{DATA_TEST_SIMULATION_LIMIT} documents the one-sample t-test's power with effect size log R / tau_b, "
        f"tau_b >= tau the relative SD at which it equals the law's power at {DATA_TEST_SIMULATION_LIMIT - 1} "
        "documents. With few "
        f"documents the expanded tail at a small threshold needs more than {MAX_TEST_RESAMPLES:,} resamples, so "
        f"the count is raised until it does not. Half-width: of the analysis' {targets.ci_method} interval, "
        f"simulated below {SMALL_SAMPLE_LIMIT} documents on documents whose total energies are lognormal with "
        "the pilot's total-energy CV (constant when it is unknown) and whose residual is normal (optimistic "
        "with heavier-tailed documents: read the upper-limit column), and further, up to the first size where "
        "every simulated interval is bounded, when they are not all bounded there.",
        "Exact test: rejects when the energy fraction exceeds the Haar null's quantile at the threshold; that "
        "null is set by d, k and the gradients' spectrum, not by the number of documents, so below the ratio "
        "'exact_ratio_needed' no study size reaches the power (empty count). The quantile is a Beta moment match to the null's mean and SD, "
        "measured on the pilot's gradients and carried to the planned size through the sample spectrum's noise "
        "(about (1 − Σw²)/N for N i.i.d. tokens; dependent tokens make this conservative above the pilot's size, "
        "so the exact test is never planned below it). Half-width and data test: at least "
        f"{MIN_RESAMPLING_UNITS} documents (fewer and the analysis withholds them).",
        f"Trust: tau estimated from a pilot of n documents is uncertain ((n − 1) tau_hat²/tau² ≈ chi-square, n − 1 "
        f"df); the *_upper columns plan at its upper {targets.variance_confidence:g} confidence limit. Each unit "
        "kind takes its hardest unit (largest tau and null quantile; the data test: the law of its unit with "
        "the largest tau).",
        f"Haar draws: enough that a test whose ideal p-value is half the threshold is rejected with probability "
        f"{DRAWS_RESOLUTION:g} (the floor 1/(n + 1) alone would let one unlucky draw decide); bootstrap "
        "resamples of the data test likewise for its expanded tail at the planned documents.",
        *_unresolvable_data_test(targets),
    ]


def _unresolvable_data_test(targets: PlanTargets) -> list[str]:
    """Why the data test has no count at a threshold too small for :data:`anistat.stats.power.MAX_TEST_RESAMPLES`
    bootstrap resamples at any size ([] otherwise): its tail needs at least
    ``data_test_resamples(threshold, None)`` of them however many documents there are."""
    needed = data_test_resamples(targets.threshold, None)
    if needed <= MAX_TEST_RESAMPLES:
        return []
    return [
        f"Data test not planned (— in every row): at the threshold {targets.threshold:.3g} it needs at least "
        f"{needed:,} bootstrap resamples at any size, more than the {MAX_TEST_RESAMPLES:,} the planner allows; "
        "a smaller family (--family-size, the protocol's stats.family) or a larger alpha brings it in reach, "
        "and the exact test and the interval are planned regardless."
    ]


def _count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def table_cells(row: PlanRow) -> list[str]:
    """The terminal/HTML table's cells of one row."""
    upper = "" if row.relative_sd_upper is None else f" ({row.relative_sd_upper:.3g})"
    return [
        row.model,
        row.site_kind,
        str(row.rank),
        str(row.dim),
        f"{row.relative_sd:.3g}{upper}",
        # a half-width is always reachable with enough documents: no count means it was not asked
        "not asked"
        if row.documents_half_width is None
        else _count(row.documents_half_width) + _upper(row.documents_half_width_upper, row.relative_sd_upper),
        _count(row.documents_data_test) + _upper(row.documents_data_test_upper, row.relative_sd_upper),
        _count(row.documents_exact_test) + _upper(row.documents_exact_test_upper, row.relative_sd_upper),
        f"{row.exact_ratio_needed:.3g}",
        _count(row.test_sequences),
    ]


def _upper(value: int | None, upper_sd: float | None) -> str:
    return "" if upper_sd is None else f" ({_count(value)})"


TABLE_HEADER = (
    "model",
    "site",
    "k",
    "d",
    "tau",
    "docs: half-width",
    "docs: data test",
    "docs: exact test",
    "exact needs R ≥",
    "test sequences",
)


def terminal_table(rows: Sequence[PlanRow]) -> str:
    """The plan as an aligned text table (upper-limit plans in parentheses)."""
    cells = [list(TABLE_HEADER)] + [table_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def terminal_text(plan: Plan) -> str:
    """What `anistat plan` prints: the table, its warnings (a corpus too small for the plan), a
    legend and the notes."""
    return "\n".join(
        [
            terminal_table(plan.rows),
            *(f"warning: {warning}" for warning in plan.warnings),
            "(in parentheses: at the upper confidence limit of the per-document variance; — : not reachable, "
            "see below)",
            *(f"- {note}" for note in plan.notes),
        ]
    )


def plan_html(
    rows: Sequence[PlanRow], targets: PlanTargets, notes: Sequence[str], title: str, warnings: Sequence[str] = ()
) -> str:
    """plan.html: one self-contained section (no scripts, no network) through the report's
    autoescaped template (:func:`anistat.report.pages.render_plan_html`): the table, the
    ``warnings`` above it and the notes below."""
    from .report.pages import render_plan_html

    draws = rows[0].null_draws if rows else null_draws_needed(targets.threshold)
    width = "not planned" if targets.half_width is None else f"{targets.half_width:g}"
    summary = (
        f"Documents needed per unit kind for R = {targets.ratio:g}: CI half-width {width}, power "
        f"{targets.power:g} of the data test and of the exact test at {targets.threshold:.3g}; in parentheses at "
        f"the upper confidence limit of the pilot's variance. Haar draws: {draws:,}."
    )
    return render_plan_html(title, summary, TABLE_HEADER, [table_cells(row) for row in rows], notes, warnings)


def plan_csv(rows: Sequence[PlanRow]) -> str:
    """plan.csv's text (:data:`PLAN_COLUMNS`; an unreachable or unasked count is empty)."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(PLAN_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for record in row_dicts(rows):
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return buffer.getvalue()


def planned_protocol(protocol, rows: Sequence[PlanRow], warnings: Sequence[str] = ()) -> tuple[str, int | None]:
    """The pilot's protocol, named ``<pilot>-planned``, with what the plan planned and nothing
    else: ``data.n_test_sequences`` (the most any unit kind needs; the pilot's when no count is
    reachable), ``stats.n_null_draws`` and, where the data test has a count,
    ``stats.n_test_resamples`` (never below the pilot's); as YAML text under a comment that
    names what was set and carries the ``warnings`` (a corpus too small for the plan), and the
    planned test sequences. The result parses as a protocol (checked here)."""
    import yaml

    from .protocol import parse_protocol

    data = protocol.normalised()
    data["name"] = planned_name(protocol.name)
    changed = []
    needed = [row.test_sequences for row in rows if row.test_sequences is not None]
    sequences = max(needed) if needed else None
    if sequences is not None:
        data["data"]["n_test_sequences"] = int(max(sequences, 2))
        changed.append("data.n_test_sequences")
    draws = max(row.null_draws for row in rows) if rows else 9999
    data["stats"]["n_null_draws"] = int(min(max(draws, 99), 10_000_000))
    changed.append("stats.n_null_draws")
    planned = [row.test_resamples for row in rows if row.test_resamples is not None]
    if planned:  # the data test has a count somewhere: its resamples are planned too
        data["stats"]["n_test_resamples"] = int(min(max(*planned, data["stats"]["n_test_resamples"]), 1_000_000))
        changed.append("stats.n_test_resamples")
    parse_protocol(data, "the planned protocol")
    header = (
        f"# planned by `anistat plan` from the pilot protocol '{protocol.name}' (named {data['name']} here): "
        f"{', '.join(changed)} set by the plan (plan.csv); everything else is the pilot's\n"
        + "".join(f"# warning: {warning}\n" for warning in warnings)
    )
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), sequences


def planned_name(pilot: str) -> str:
    """The planned protocol's name: the pilot's with ``-planned`` (cut to the names' 64 characters)."""
    suffix = "-planned"
    return pilot[: 64 - len(suffix)] + suffix


def write_plan(out: Path, plan: Plan) -> list[str]:
    """plan.csv, plan.html, manifest.json and (from a pilot) protocol.yaml into ``out``, staged and
    swapped into place in one rename (nothing half-written; a folder holding files anistat did
    not write is refused). Returns the file names written."""
    from .bundle import file_digests, staged_bundle, write_json

    rows, targets = plan.rows, plan.targets
    texts = {
        "plan.csv": plan_csv(rows),
        "plan.html": plan_html(rows, targets, plan.notes, "anistat plan", plan.warnings),
    }
    if plan.protocol is not None:
        texts["protocol.yaml"] = planned_protocol(plan.protocol, rows, plan.warnings)[0]
    with staged_bundle(out) as staging:
        for name, text in texts.items():
            (staging / name).write_text(text, encoding="utf-8")
        write_json(
            staging / "manifest.json",
            {"anistat_plan": 1, "targets": asdict(targets), "files": file_digests(staging)},
        )
    return sorted([*texts, "manifest.json"])


@dataclass(frozen=True)
class StatedInputs:
    """The per-document law stated on the command line instead of a pilot bundle.

    ``relative_sd`` (τ) directly, or from ``cv_proxy``, ``cv_total`` and ``correlation``
    (:func:`anistat.stats.power.relative_sd`); ``participation_ratio`` of the gradients (None: isotropic);
    ``pilot_documents``: the documents the law was estimated from (for the upper limit)."""

    dim: int
    ranks: tuple[int, ...]
    relative_sd: float | None = None
    cv_proxy: float | None = None
    cv_total: float | None = None
    correlation: float = 0.0
    participation_ratio: float | None = None
    pilot_documents: int | None = None
    sequences_per_document: float = 1.0

    def tau(self) -> float:
        """τ, checked: stated directly or from the coefficients of variation."""
        if self.relative_sd is not None:
            tau = self.relative_sd
        elif self.cv_proxy is not None and self.cv_total is not None:
            if self.cv_proxy < 0 or self.cv_total < 0 or not -1.0 <= self.correlation <= 1.0:
                raise AnistatInputError("--cv-proxy and --cv-total must be >= 0 and --correlation in [-1, 1]")
            tau = relative_sd(self.cv_proxy, self.cv_total, self.correlation)
        else:
            raise AnistatInputError(
                "stated inputs need the per-document law: --relative-sd, or --cv-proxy and --cv-total "
                "(and --correlation)"
            )
        if not (math.isfinite(tau) and tau > 0):
            raise AnistatInputError(f"the per-document relative SD must be positive, got {tau:g}")
        return tau


@dataclass(frozen=True)
class Plan:
    """A finished plan: its rows, the targets it was made for, what it assumes, the pilot's
    protocol (None for stated inputs) and its warnings (a planned size the pilot's corpus cannot
    hold: terminal, plan.html and the planned protocol's comment)."""

    rows: tuple[PlanRow, ...]
    targets: PlanTargets
    notes: tuple[str, ...]
    protocol: Any = None
    warnings: tuple[str, ...] = ()


def plan_from_bundle(bundle: Path, given: dict[str, Any], use_upper: bool = False) -> Plan:
    """The plan from a pilot bundle: its per-unit laws (:func:`laws_from_results`), the targets in
    ``given`` (:class:`PlanTargets` fields) and, for those left None, the pilot protocol's
    ``alpha``, ``ci_level``, multiplicity and family size (:func:`family_size_of`)."""
    pilot = read_pilot(bundle)
    stats = pilot.protocol.stats
    defaults = PlanTargets(
        ratio=1.0,
        alpha=stats.alpha,
        multiplicity=stats.multiplicity,
        family_size=family_size_of(pilot.results, pilot.protocol, pilot.manifest),
        ci_level=stats.ci_level,
        ci_method=stats.ci_method,
    )
    targets = with_targets(defaults, **given)
    check_targets(targets)
    _refuse_one_document(bundle, pilot.results)
    laws = laws_from_results(pilot.results)
    if not laws:
        raise AnistatInputError(
            f"{bundle}: no energy_fraction row with a standard error (every unit failed, or the pilot had "
            f"fewer than {MIN_RESAMPLING_UNITS} documents per unit, below which the analysis withholds it); "
            "run a larger pilot"
        )
    fewest = min(law.pilot_documents or 0 for law in laws)
    source = f"estimated from the pilot {Path(bundle).name} (at least {_documents(fewest)} per unit)"
    rows = plan_rows(laws, targets, use_upper)
    corpus = (pilot.manifest.get("corpus") or {}).get("documents")
    warnings = corpus_warnings(rows, corpus if isinstance(corpus, int) else None)
    return Plan(tuple(rows), targets, tuple(assumptions(targets, source)), pilot.protocol, tuple(warnings))


def _documents(count: int) -> str:
    return f"{count:,} document" + ("" if count == 1 else "s")


def _refuse_one_document(bundle: Path, results) -> None:
    """One line, exit 2, for a pilot whose test sequences all come from one document: its rows
    resampled sequences instead (fallback ``sequences_resampled``), so their ``n_clusters`` count
    sequences and the per-document law — what every count of the plan rests on — is unknown."""
    from .stats.fallbacks import SEQUENCES_RESAMPLED

    fallback = results["fallback"].fillna("").astype(str) if "fallback" in results else None
    if fallback is None or not fallback.str.contains(SEQUENCES_RESAMPLED, regex=False).any():
        return
    sequences = int(results.loc[fallback.str.contains(SEQUENCES_RESAMPLED, regex=False), "n_sequences"].max())
    raise AnistatInputError(
        f"{bundle}: the pilot's {sequences:,} test sequences all come from 1 document (its intervals resampled "
        "sequences within it), so the per-document variability a plan of documents rests on is unknown; run a "
        f"pilot whose test sequences span at least {MIN_RESAMPLING_UNITS} documents"
    )


def corpus_warnings(rows: Sequence[PlanRow], corpus_documents: int | None) -> list[str]:
    """The warning when the plan needs more documents than the pilot's corpus holds ([] when it
    fits or the corpus' size is unknown): the intervals and the data test resample documents,
    so more sequences from the same documents do not buy the planned precision."""
    planned = [row.documents for row in rows if row.documents is not None]
    if corpus_documents is None or not planned or max(planned) <= corpus_documents:
        return []
    return [
        f"the plan needs {_documents(max(planned))} ({max(r.test_sequences or 0 for r in rows):,} test sequences) "
        f"but the pilot's corpus holds {_documents(corpus_documents)}: the intervals and the data test resample "
        "documents, so a corpus of at least that many documents is needed (more sequences from the same "
        "documents do not reach the targets)"
    ]


def plan_from_inputs(inputs: StatedInputs, given: dict[str, Any], use_upper: bool = False) -> Plan:
    """The plan from stated inputs and the targets in ``given`` (:class:`PlanTargets` fields; a
    None family size means one test per rank). No pilot, so no protocol is written."""
    targets = with_targets(PlanTargets(ratio=1.0, family_size=max(len(inputs.ranks), 1)), **given)
    check_targets(targets)
    tau = inputs.tau()
    if inputs.pilot_documents is not None and inputs.pilot_documents < 2:
        raise AnistatInputError(f"--pilot-documents must be at least 2, got {inputs.pilot_documents}")
    if not inputs.sequences_per_document >= 1.0:
        raise AnistatInputError(f"--sequences-per-document must be at least 1, got {inputs.sequences_per_document:g}")
    if not inputs.ranks:
        raise AnistatInputError("stated inputs need at least one --rank")
    laws = stated_laws(
        inputs.dim,
        inputs.ranks,
        tau,
        inputs.participation_ratio,
        inputs.pilot_documents,
        inputs.sequences_per_document,
        inputs.cv_total,
    )
    spectrum = (
        "isotropic" if inputs.participation_ratio is None else f"participation ratio {inputs.participation_ratio:g}"
    )
    spread = "unknown" if inputs.cv_total is None else f"{inputs.cv_total:.3g}"
    source = f"stated (tau = {tau:.3g}, total-energy CV {spread}, gradients {spectrum})"
    rows = plan_rows(laws, targets, use_upper)
    return Plan(tuple(rows), targets, tuple(assumptions(targets, source)), None)
