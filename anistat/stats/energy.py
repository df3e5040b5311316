"""Analysis of one proxy basis: an exact test against random subspaces, effect sizes with CIs.

Inputs, for one (unit, proxy, rank, control kind), per test sequence ``s``::

    proxy_energy     p_s = Σ_{i∈s} ‖Uᵀg_i‖²
    total_energy     t_s = Σ_{i∈s} ‖g_i‖²
    reference_energy e_s = the control energy the proxy is compared with (see below)

plus Monte-Carlo draws of random subspaces evaluated on the whole test split (from its
gradient second moment, :class:`anistat.geometry.SpectralFrame`): ``null_fractions`` (Haar
draws, for the exact test) and ``control_fractions`` (draws of this row's control kind).

Two sources of randomness, reported separately.

**The control draw → the exact primary test.** ``p_value = (1 + #{E(Q_j) ≥ E(U)}) / (1 + n)``
against ``n`` Haar draws ``Q_j``. Under "U is a uniformly random subspace" U is exchangeable
with the Haar draws, so this p-value is exact (``P(p ≤ a) ≤ a``) whatever the gradients'
anisotropy. ``E(U)`` and every ``E(Q_j)`` are evaluated with the same formula
``tr(QᵀMQ)/tr M`` (``observed_fraction``). ``p_value_paper`` is the paper's convention: the
same statistic against the first ``n_paper_controls`` draws of the row's own control kind.
For ``normal`` controls (uniform in U's orthogonal complement) it is *not* exact: U is never
exchangeable with subspaces drawn in its own complement, and under anisotropic gradients a
random U is rejected too often (measured: P(p ≤ 0.05) ≈ 0.10; see ``benchmarks/README.md``).

**The data → CIs and the sign-flip test.** Sequences cut from one document are dependent,
so the resampling unit is the document (``group_ids``), else the sequence: per-unit sums
``P_u, T_u, E_u`` (sums are additive, so a ratio of sums is unchanged by grouping), then a
bootstrap over units. Each interval is a CI of a population quantity *for this fixed
proxy*::

    energy_fraction   E[Σp] / E[Σt]
    energy_ratio      E[Σp] / E[Σe]      (e = expected control energy, see below)

With ``reference="expected"`` (default, haar and normal) ``e_s`` is the closed-form
expectation of the control energy over the control distribution: ``k/d · t_s`` (haar) and
``k/(d − k) · (t_s − p_s)`` (normal), so the ratio's CI has no noise from particular draws.
It describes the effect size over data sampling; it is *not* a test against random
subspaces (a fixed random proxy has a true ratio ≠ 1 — the test is ``p_value``). With
``reference="drawn"`` (the paper's conditional ratio, kinds without a closed form) ``e_s``
is the mean energy of the ``n`` drawn controls in sequence ``s``, and the CI is conditional
on those draws.

The sign-flip test and Hedges' g use the headline quantity's own per-unit contribution
``d_u = P_u − E_u`` (energy units, not a mean of per-sequence ratios), so they agree in
direction with the ratio: H0 "E[Σd] = 0 with d_u symmetric", conditional on the proxy. For
the closed-form references, ``P − k/(d−k)(T − P) = d/(d−k) · (P − k/d · T)``: the haar and
normal contributions are proportional, so both kinds give the same g and the same test.

CI methods: ``studentized`` (bootstrap-t with the delta-method SE of a ratio of sums,
:func:`.bootstrap.ratio_se`; holds its level from ~100 heterogeneous units, see
``benchmarks/README.md``), ``bca`` or ``percentile``; ``hedges_g`` always uses BCa.
``log2_energy_ratio`` is the log2 of the ratio interval; ``z`` and ``anisotropy_capture``
are monotone maps of the fraction interval with the control distribution / oracle held
fixed, and the capture interval is clipped to the metric's range ``[−(k/d)/(E*−k/d), 1]``
(``E(U) ≤ E*_k`` on any data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import as_1d_float, check_alternative, check_ci_level, check_positive_int
from .bootstrap import BootstrapResult, bootstrap_weights, ci_from_replicates, ratio_se
from .effects import anisotropy_capture, hedges_correction
from .montecarlo import monte_carlo_pvalue
from .permutation import PermutationResult, sign_flip_test

METRICS = ("energy_fraction", "energy_ratio", "log2_energy_ratio", "z", "hedges_g",
           "anisotropy_capture")
#: Names of the tests behind ``p_value`` (the ``p_test`` column of the results).
EXACT_TEST = "haar_monte_carlo"
SIGN_FLIP_TEST = "sign_flip"
CLOSED_FORM_KINDS = ("haar", "normal")


@dataclass(frozen=True)
class MetricResult:
    """One metric of one analysis (one row of the tidy results table).

    ``control_mean`` / ``control_sd``: the same metric evaluated on the draws of the row's
    control kind (mean, sd with ddof=1; NaN for ``hedges_g``). ``p_value`` comes from the test
    named by ``p_test``; ``p_value_paper`` is the paper's convention (see the module
    docstring). ``effect_size`` is of kind ``effect_size_kind`` (``z`` or ``hedges_g``).
    """

    metric: str
    estimate: float
    control_mean: float
    control_sd: float
    ci_low: float
    ci_high: float
    ci_method: str
    note: str
    p_value: float
    p_test: str
    p_value_paper: float
    effect_size: float
    effect_size_kind: str
    se: float = np.nan


@dataclass(frozen=True)
class EnergyAnalysis:
    """Result of :func:`analyze_energy`. ``analysis["energy_ratio"]`` gives a metric."""

    metrics: tuple[MetricResult, ...]
    p_value: float  # exact Haar Monte-Carlo test
    p_value_paper: float
    sign_flip: PermutationResult
    n_null: int
    n_controls: int
    n_sequences: int
    n_clusters: int
    rank: int
    dim: int
    n_bootstrap: int
    ci_level: float
    alternative: str
    seed: int
    note: str = ""

    def __getitem__(self, name: str) -> MetricResult:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)

    def to_records(self) -> list[dict]:
        """One dict per metric with the results-table columns this layer knows."""
        return [{"metric": m.metric, "estimate": m.estimate, "control_mean": m.control_mean,
                 "control_sd": m.control_sd, "ci_low": m.ci_low, "ci_high": m.ci_high,
                 "ci_method": m.ci_method, "p_value": m.p_value, "p_test": m.p_test,
                 "p_value_paper": m.p_value_paper, "effect_size": m.effect_size,
                 "effect_size_kind": m.effect_size_kind, "se": m.se,
                 "n_controls": self.sign_flip.n_permutations if m.p_test == SIGN_FLIP_TEST else self.n_null,
                 "n_sequences": self.n_sequences, "n_clusters": self.n_clusters, "note": m.note}
                for m in self.metrics]


def expected_control_energy(kind: str, proxy_energy, total_energy, rank: int, dim: int) -> np.ndarray:
    """Closed-form expectation of a control's energy, per sequence, over the control draw.

    ``E[QQᵀ] = k/d · I`` for Haar Q, so ``E Σ‖Qᵀg‖² = k/d · Σ‖g‖²``; a ``normal`` control is
    uniform in the complement of U, ``E[QQᵀ] = k/(d − k) · (I − UUᵀ)``, so
    ``E Σ‖Qᵀg‖² = k/(d − k) · (Σ‖g‖² − Σ‖Uᵀg‖²)``.
    """
    p = np.asarray(proxy_energy, dtype=np.float64)
    t = np.asarray(total_energy, dtype=np.float64)
    if kind == "haar":
        return rank / dim * t
    if kind == "normal":
        return rank / (dim - rank) * np.maximum(t - p, 0.0)
    raise ValueError(f"no closed-form expectation for control kind {kind!r}; use the drawn controls' mean")


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _mean_sd(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.nan, np.nan
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else np.nan


def cluster_sums(columns: np.ndarray, group_ids) -> tuple[np.ndarray, int]:
    """Sum the rows of ``columns`` (S, m) per group (documents) → ((G, m), G); rows as they
    are when ``group_ids`` is None."""
    if group_ids is None:
        return columns, columns.shape[0]
    codes = np.unique(np.asarray(group_ids), return_inverse=True)[1].ravel()
    n_groups = int(codes.max()) + 1
    out = np.zeros((n_groups, columns.shape[1]))
    np.add.at(out, codes, columns)
    return out, n_groups


def _hedges_g(weights: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Bias-corrected standardized mean of ``d`` under each row of weights (``n = Σw``)."""
    n = weights.sum(axis=1)
    mean = (weights @ d) / n
    var = (weights @ (d * d) - n * mean**2) / (n - 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hedges_correction(n - 1.0) * mean / np.sqrt(var)


def analyze_energy(proxy_energy, total_energy, reference_energy, *, rank: int, dim: int,
                   null_fractions, control_fractions=None, observed_fraction: float | None = None,
                   n_paper_controls: int | None = None, group_ids=None,
                   oracle_fraction: float | None = None, reference: str = "expected",
                   control_kind: str = "haar", n_bootstrap: int = 2000, ci_level: float = 0.95,
                   ci_method: str = "studentized", n_permutations: int = 9999,
                   alternative: str = "greater", seed: int = 0) -> EnergyAnalysis:
    """Exact test, CIs and effect sizes of one proxy against one control kind.

    Parameters
    ----------
    proxy_energy, total_energy, reference_energy
        ``(S,)`` per-sequence energies (finite, non-negative), ``S >= 2``;
        ``reference_energy`` from :func:`expected_control_energy` or the drawn controls' mean.
    null_fractions
        ``(n,)`` energy fractions of Haar draws on the whole split (the exact test's null).
    control_fractions
        ``(n_c,)`` energy fractions of draws of this row's control kind (``control_mean``,
        ``control_sd``, ``z``, and the first ``n_paper_controls`` give ``p_value_paper``);
        defaults to ``null_fractions``.
    observed_fraction
        ``E(U)`` evaluated like the draws (``tr(UᵀMU)/tr M``); defaults to ``Σp/Σt``.
    group_ids
        ``(S,)`` document ids: the resampling unit is then the document.
    reference, control_kind
        Labels for the notes: ``"expected"`` (closed form) or ``"drawn"``, and the kind.

    See the module docstring for what every interval and test conditions on.
    """
    p = as_1d_float(proxy_energy, "proxy_energy")
    t = as_1d_float(total_energy, "total_energy")
    e = as_1d_float(reference_energy, "reference_energy")
    null = np.asarray(null_fractions, dtype=np.float64).ravel()
    s = p.size
    if t.size != s or e.size != s:
        raise ValueError(f"proxy, total and reference energies must have the same shape (S,); got "
                         f"{p.shape}, {t.shape}, {e.shape}")
    if s < 2:
        raise ValueError(f"need at least 2 sequences, got S={s}")
    if (p < 0).any() or (t < 0).any() or (e < 0).any():
        raise ValueError("energies must be non-negative")
    if not t.sum() > 0:
        raise ValueError("total_energy sums to zero")
    if null.size < 1 or not np.isfinite(null).all():
        raise ValueError("null_fractions must be a non-empty array of finite values")
    check_positive_int(rank, "rank")
    check_positive_int(dim, "dim")
    check_alternative(alternative)
    check_ci_level(ci_level)
    check_positive_int(n_bootstrap, "n_bootstrap", 2)
    if ci_method not in ("bca", "percentile", "studentized"):
        raise ValueError(f"ci_method must be 'bca', 'percentile' or 'studentized', got {ci_method!r}")
    if reference not in ("expected", "drawn"):
        raise ValueError(f"reference must be 'expected' or 'drawn', got {reference!r}")
    controls = null if control_fractions is None else np.asarray(control_fractions, dtype=np.float64).ravel()

    # ---- resampling units: documents (sums per document) or sequences ---------------
    units, n_units = cluster_sums(np.stack([p, t, e], axis=1), group_ids)
    up, ut, ue = units.T
    unit_name = "documents" if group_ids is not None else "sequences"
    if n_units < 2:
        raise ValueError(f"need at least 2 resampling units, got {n_units} {unit_name}")

    # ---- point estimates and the exact test -----------------------------------------
    fraction = up.sum() / ut.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = up.sum() / ue.sum()
    observed = fraction if observed_fraction is None else float(observed_fraction)
    p_exact = monte_carlo_pvalue(observed, null, alternative)
    p_paper = (monte_carlo_pvalue(observed, controls[:n_paper_controls], alternative)
               if n_paper_controls else np.nan)
    control_mean, control_sd = _mean_sd(controls)
    reference_fraction = ue.sum() / ut.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (fraction - control_mean) / control_sd if control_sd > 0 else np.nan
        control_ratio = controls / reference_fraction
        control_z = (controls - control_mean) / control_sd

    # ---- per-unit contributions: sign flip and Hedges' g ------------------------------
    contribution = up - ue
    sign_flip = sign_flip_test(contribution, n_permutations, seed, alternative)
    ones = np.ones((1, n_units))
    g = float(_hedges_g(ones, contribution)[0]) if n_units > 2 else np.nan

    # ---- bootstrap over units -----------------------------------------------------------
    weights = bootstrap_weights(n_units, n_bootstrap, seed)
    jackknife = 1.0 - np.eye(n_units)
    intervals = {}
    for name, numerator, denominator, estimate in (("fraction", up, ut, fraction), ("ratio", up, ue, ratio)):
        with np.errstate(invalid="ignore", divide="ignore"):
            replicates = (weights @ numerator) / (weights @ denominator)
            jack = (jackknife @ numerator) / (jackknife @ denominator)
        extra = {}
        if ci_method == "studentized":
            extra = dict(se=float(ratio_se(ones, numerator, denominator)[0]),
                         replicate_se=ratio_se(weights, numerator, denominator))
        intervals[name] = ci_from_replicates(estimate, replicates, jack, ci_level, ci_method, **extra)
    g_interval = ci_from_replicates(g, _hedges_g(weights, contribution), _hedges_g(jackknife, contribution),
                                    ci_level, "bca") if n_units > 3 else BootstrapResult(
        g, np.nan, np.nan, "none", "too few resampling units for a CI of g", np.nan, 0, ci_level)

    # ---- assemble -----------------------------------------------------------------------
    units_note = f"{n_units} {unit_name} resampled"
    if group_ids is not None and n_units < 20:
        units_note += " (few documents: CIs may undercover)"
    kind_note = (f"expected {control_kind}-control energy (closed form)" if reference == "expected"
                 else f"mean of the {controls.size} drawn {control_kind} controls (conditional on the draw)")
    ci_f, ci_r = intervals["fraction"], intervals["ratio"]

    def row(metric, estimate, control_values, lo, hi, ci: BootstrapResult, note, p_value=p_exact,
            p_test=EXACT_TEST, paper=p_paper, effect=z, effect_kind="z"):
        mean, sd = _mean_sd(np.asarray(control_values, dtype=np.float64))
        return MetricResult(metric, float(estimate), mean, sd, float(lo), float(hi), ci.method,
                            _join(note, units_note, ci.note), float(p_value), p_test, float(paper),
                            float(effect), effect_kind, ci.se)

    with np.errstate(invalid="ignore", divide="ignore"):
        log2_ratio = float(np.log2(ratio)) if ratio > 0 else np.nan
        log2_lo = float(np.log2(ci_r.ci_low)) if ci_r.ci_low > 0 else np.nan
        log2_hi = float(np.log2(ci_r.ci_high)) if ci_r.ci_high > 0 else np.nan
        z_lo, z_hi = ((ci_f.ci_low - control_mean) / control_sd, (ci_f.ci_high - control_mean) / control_sd)
    rows = [
        row("energy_fraction", fraction, controls, ci_f.ci_low, ci_f.ci_high, ci_f,
            "CI of E[Σ‖Uᵀg‖²]/E[Σ‖g‖²] for this proxy"),
        row("energy_ratio", ratio, control_ratio, ci_r.ci_low, ci_r.ci_high, ci_r,
            f"ratio to the {kind_note}; its CI is over data for this proxy, not a test against "
            "random subspaces (that is p_value)"),
        row("log2_energy_ratio", log2_ratio, np.log2(control_ratio), log2_lo, log2_hi, ci_r,
            "CI = log2 of the ratio CI"),
        row("z", z, control_z, z_lo, z_hi, ci_f,
            f"z against the {controls.size} {control_kind} draws; CI maps the fraction CI with the "
            "draws' mean and sd held fixed"),
        MetricResult("hedges_g", g, np.nan, np.nan, g_interval.ci_low, g_interval.ci_high, g_interval.method,
                     _join(f"standardized mean of per-unit contributions Σp − Σe ({kind_note})", units_note,
                           g_interval.note),
                     float(sign_flip.p_value), SIGN_FLIP_TEST, np.nan, g, "hedges_g", g_interval.se),
    ]
    base = rank / dim
    if oracle_fraction is None or not np.isfinite(oracle_fraction):
        rows.append(MetricResult("anisotropy_capture", np.nan, np.nan, np.nan, np.nan, np.nan, "none",
                                 "no oracle fraction given", float(p_exact), EXACT_TEST, float(p_paper),
                                 float(z), "z"))
    elif not oracle_fraction > base:
        rows.append(MetricResult("anisotropy_capture", np.nan, np.nan, np.nan, np.nan, np.nan, "none",
                                 f"oracle fraction {oracle_fraction:.4g} <= k/d; capture undefined",
                                 float(p_exact), EXACT_TEST, float(p_paper), float(z), "z"))
    else:
        def capture(x):
            return anisotropy_capture(x, rank, dim, oracle_fraction)
        low_bound = capture(0.0)
        lo = float(np.clip(capture(ci_f.ci_low), low_bound, 1.0))
        hi = float(np.clip(capture(ci_f.ci_high), low_bound, 1.0))
        rows.append(row("anisotropy_capture", capture(fraction), capture(controls), lo, hi, ci_f,
                        "CI = affine map of the fraction CI with the oracle held fixed, clipped to [capture(0), 1]"))
    return EnergyAnalysis(tuple(rows), float(p_exact), float(p_paper), sign_flip, int(null.size),
                          int(controls.size), int(s), int(n_units), int(rank), int(dim), int(n_bootstrap),
                          float(ci_level), alternative, int(seed))


@dataclass(frozen=True)
class ControlComparison:
    """Result of :func:`analyze_metric_vs_controls`."""

    observed: float
    control_mean: float
    control_sd: float
    z: float
    p_value: float
    n_controls: int
    alternative: str
    p_value_paper: float = np.nan


def analyze_metric_vs_controls(observed: float, control_values, alternative: str = "greater", *,
                               null_values=None, n_paper_controls: int | None = None) -> ControlComparison:
    """Compare a one-value-per-basis metric (e.g. ΔIsoScore*) with random subspaces.

    ``p_value``: Monte-Carlo p against ``null_values`` (Haar draws: exact under a random
    proxy), or against ``control_values`` when no null is given. ``p_value_paper``: against the
    first ``n_paper_controls`` control values. Control mean, sd (ddof=1, NaN dropped) and
    ``z = (observed − mean) / sd`` describe ``control_values``.
    """
    check_alternative(alternative)
    cv = np.asarray(control_values, dtype=np.float64).ravel()
    fin = cv[np.isfinite(cv)]
    mean = float(fin.mean()) if fin.size else np.nan
    sd = float(fin.std(ddof=1)) if fin.size > 1 else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (float(observed) - mean) / sd if sd > 0 else np.nan
    reference = cv if null_values is None else np.asarray(null_values, dtype=np.float64).ravel()
    p = monte_carlo_pvalue(float(observed), reference, alternative) if reference.size else np.nan
    paper = (monte_carlo_pvalue(float(observed), cv[:n_paper_controls], alternative)
             if n_paper_controls and cv.size else np.nan)
    return ControlComparison(float(observed), mean, sd, float(z), float(p), int(reference.size), alternative,
                             float(paper))
