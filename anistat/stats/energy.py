"""High-level analysis of one proxy basis against its matched controls.

Inputs are the per-sequence sufficient statistics of the collection artifact, for one
(unit, proxy, rank, control kind)::

    proxy_energy   (S,)    sum_{i in s} ||U^T g_i||^2
    control_energy (S, n)  sum_{i in s} ||Q_j^T g_i||^2
    total_energy   (S,)    sum_{i in s} ||g_i||^2

Point estimates (ratios of sums over sequences)::

    E(U) = sum_s proxy_s / sum_s total_s          E(Q_j) = sum_s control_sj / sum_s total_s
    R = E(U) / mean_j E(Q_j)     z = (E(U) - mean_j E(Q_j)) / sd_j E(Q_j)    (ddof=1)

Two sources of randomness are reported separately:

* **control draw** — Monte-Carlo p-value ``(1 + #{E(Q_j) >= E(U)}) / (1 + n)`` (see
  :mod:`.montecarlo`). ``E``, ``R``, ``log2 R``, ``z`` and the anisotropy capture are
  increasing functions of ``E(U)`` for fixed controls, so they share this p-value
  (``p_value_kind="monte_carlo"``, also ``EnergyAnalysis.mc_p_value``).
* **data** — sequence bootstrap CIs (controls held fixed: each resample reweights sequences
  jointly for the proxy, every control and the total) and the paired sign-flip test of the
  per-sequence differences ``d_s = f_U(s) - f_C(s)`` (``p_value_kind="sign_flip"`` on the
  ``hedges_g`` row, also ``EnergyAnalysis.sign_flip``). The sign-flip H0 is "the mean
  per-sequence fraction of the proxy equals the controls' mean"; each sequence counts once.

CI details: ``energy_fraction``, ``energy_ratio``, ``z`` and ``hedges_g`` are bootstrapped
directly (BCa where valid). For ``z`` the control sd is by default held fixed at its
full-data value (``z_interval="fixed_sd"``): the spread of the control sums
``sd_j(sum_s w_s c_sj)`` partly comes from per-sequence noise, and duplicating sequences in a
resample inflates it (``E sum_s w_s^2 ~ 2S``), so a resampled sd biases ``z*`` towards 0 and
leaves the estimate outside its own bootstrap distribution. The sd is a Monte-Carlo scale of
the control draw; the data uncertainty is in the numerator. ``log2_energy_ratio`` is the log2 of the ratio interval and
``anisotropy_capture`` the affine map of the fraction interval (BCa and percentile are
transformation-respecting; for ``studentized`` the mapped interval keeps the coverage of the
ratio / fraction interval, being its image under a monotone map); the oracle is held fixed (it is a whole-split quantity).

``ci_method="studentized"`` (bootstrap-t) is available for ``energy_fraction``,
``energy_ratio`` (and so ``log2_energy_ratio`` / ``anisotropy_capture``) and ``z``
(``fixed_sd``): all three are ratios of sums ``sum_s a_s / sum_s b_s`` (for ``z`` up to the
fixed constant ``t_sum / sd_j(sum_s c_sj)``, with ``a = p - cbar``, ``b = t``), so each
resample is studentized by the delta-method SE ``sqrt(S/(S-1) sum_s w_s (a_s - theta* b_s)^2)
/ sum_s w_s b_s`` (:func:`.bootstrap.ratio_se`), from 8 more resampled sums — still
``O(B S)``. Per-sequence energies are heavy-tailed (a few long, energetic sequences), so a
ratio's estimate and its SE are strongly correlated; the bootstrap-t captures that and holds
its level from ~100 sequences where BCa undercovers (≈ 0.925–0.935 at S = 100, ≈ 0.94 at
S = 400 in the calibration design; see ``benchmarks/README.md``, P3). ``hedges_g``, ``z``
with ``resampled_sd`` and everything with ``group_ids`` use BCa instead (said in ``note``).

Speed: resampled sums of the 6 sums-based columns are computed in float64, so the default
analysis costs ``O(B S)`` regardless of the number of controls. With
``z_interval="resampled_sd"`` the bootstrap of ``z`` needs all per-control sums ``W @ C``
(``O(B S n)``, the dominant cost); they are computed from the
controls *centred per sequence around their mean* (``C - mean_j C``), cast to float32 when
``precision="float32"`` (default). Centring makes float32 accurate: the centred columns only
feed the control sd, whose relative error is then ~1e-6, while the mean (and everything
else) stays float64. Weights are exact small integers in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import (as_1d_float, check_alternative, check_ci_level,
                          check_positive_int)
from .bootstrap import (BootstrapResult, _group_codes, _ratio_se_from_sums, bootstrap_weights,
                        ci_from_replicates)
from .effects import anisotropy_capture, hedges_correction
from .montecarlo import monte_carlo_pvalue
from .permutation import PermutationResult, sign_flip_test

METRICS = ("energy_fraction", "energy_ratio", "log2_energy_ratio", "z", "hedges_g",
           "anisotropy_capture")
_CHUNK = 512


@dataclass(frozen=True)
class MetricResult:
    """One metric of one analysis (one row of the tidy results table).

    ``control_mean`` / ``control_sd``: the same metric evaluated for each control basis
    (e.g. for ``energy_ratio`` the controls' ``E(Q_j) / mean E(Q)``), mean and sd (ddof=1);
    NaN for ``hedges_g`` (no per-control analogue). ``p_value_kind`` is ``"monte_carlo"`` or
    ``"sign_flip"``. ``effect_size`` is ``z`` for the Monte-Carlo metrics and ``g`` for
    ``hedges_g``.
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
    p_value_kind: str
    effect_size: float
    se: float = np.nan


@dataclass(frozen=True)
class EnergyAnalysis:
    """Result of :func:`analyze_energy`. ``analysis["energy_ratio"]`` gives a metric."""

    metrics: tuple[MetricResult, ...]
    mc_p_value: float
    sign_flip: PermutationResult
    n_controls: int
    n_sequences: int
    rank: int
    dim: int
    n_bootstrap: int
    ci_level: float
    alternative: str
    seed: int
    control_fractions: np.ndarray = field(repr=False)
    note: str = ""

    def __getitem__(self, name: str) -> MetricResult:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)

    def to_records(self) -> list[dict]:
        """One dict per metric with the results-table columns this layer knows."""
        out = []
        for m in self.metrics:
            out.append({
                "metric": m.metric, "estimate": m.estimate, "control_mean": m.control_mean,
                "control_sd": m.control_sd, "ci_low": m.ci_low, "ci_high": m.ci_high,
                "ci_method": m.ci_method, "p_value": m.p_value, "p_value_kind": m.p_value_kind,
                "effect_size": m.effect_size, "n_controls": self.n_controls,
                "n_sequences": self.n_sequences, "note": m.note,
            })
        return out


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _mean_sd(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.nan, np.nan
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else np.nan


def _stats_from_sums(x: np.ndarray, sd_c: np.ndarray, n_eff_j: float):
    """Rows of sums -> (fraction, ratio, z, g). Columns of x: p, cbar, t, v, v*dc, v*dc^2."""
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = x[:, 0] / x[:, 2]
        ratio = x[:, 0] / x[:, 1]
        z = (x[:, 0] - x[:, 1]) / sd_c
        nv = x[:, 3]
        mean_c = x[:, 4] / nv
        var = (x[:, 5] - nv * mean_c**2) / (nv - 1)
        g = n_eff_j * (mean_c + x[:, 6]) / np.sqrt(var)
    return np.stack([frac, ratio, z, g], axis=1)


def analyze_energy(proxy_energy, control_energy, total_energy, *, rank: int, dim: int,
                   oracle_fraction: float | None = None, group_ids=None,
                   n_bootstrap: int = 2000, ci_level: float = 0.95, ci_method: str = "bca",
                   n_permutations: int = 9999, alternative: str = "greater", seed: int = 0,
                   z_interval: str = "fixed_sd", precision: str = "float32") -> EnergyAnalysis:
    """Full statistical analysis of one proxy basis vs its ``n`` matched controls.

    Parameters
    ----------
    proxy_energy, control_energy, total_energy
        ``(S,)``, ``(S, n)``, ``(S,)`` per-sequence energies (finite, non-negative), ``S >= 2``
        sequences, ``n >= 2`` controls.
    rank, dim
        ``k`` and ``d`` (for the isotropic baseline ``k/d`` of the anisotropy capture).
    oracle_fraction
        ``E*_k``; without it the ``anisotropy_capture`` row is NaN with a note.
    group_ids
        Optional ``(S,)`` document ids for hierarchical resampling (documents, then
        sequences within them); the BCa jackknife then leaves one document out.
    n_bootstrap, ci_level, ci_method
        Sequence bootstrap size, two-sided level, ``"bca"`` (percentile fallback with the
        reason in ``note``), ``"percentile"`` or ``"studentized"`` (bootstrap-t with the
        delta-method SE for the ratio-of-sums metrics, BCa for the others; better coverage
        with few or heterogeneous sequences — see the module docstring).
    n_permutations
        Sign-flip permutations (exact enumeration when ``2**S <= n_permutations``).
    alternative
        ``"greater"`` (proxy captures more), ``"less"`` or ``"two-sided"``; applies to both
        tests.
    seed
        Seeds the bootstrap weights and the sign matrix (results are deterministic).
    z_interval
        ``"fixed_sd"`` (default): the CI of ``z`` resamples ``E(U) - mean_j E(Q_j)`` and divides
        by the full-data control sd (held fixed, like the oracle). ``"resampled_sd"`` also
        resamples the sd (needs all ``W @ C``; biased upward — see the module docstring).
    precision
        ``"float32"`` (default) or ``"float64"`` for the per-control resampled sums
        (``z_interval="resampled_sd"`` only).

    Returns
    -------
    EnergyAnalysis with metrics ``energy_fraction, energy_ratio, log2_energy_ratio, z,
    hedges_g, anisotropy_capture`` (see the module docstring for conventions).
    """
    p = as_1d_float(proxy_energy, "proxy_energy")
    t = as_1d_float(total_energy, "total_energy")
    c = np.asarray(control_energy, dtype=np.float64)
    s = p.size
    if c.ndim != 2 or c.shape[0] != s or t.size != s:
        raise ValueError(f"shapes must be proxy (S,), control (S, n), total (S,); got "
                         f"{p.shape}, {c.shape}, {t.shape}")
    if s < 2 or c.shape[1] < 2:
        raise ValueError(f"need at least 2 sequences and 2 controls, got S={s}, n={c.shape[1]}")
    if not np.all(np.isfinite(c)):
        raise ValueError("control_energy contains non-finite values")
    if (p < 0).any() or (c < 0).any() or (t < 0).any():
        raise ValueError("energies must be non-negative")
    if not t.sum() > 0:
        raise ValueError("total_energy sums to zero")
    check_positive_int(rank, "rank")
    check_positive_int(dim, "dim")
    check_alternative(alternative)
    check_ci_level(ci_level)
    check_positive_int(n_bootstrap, "n_bootstrap", 2)
    if ci_method not in ("bca", "percentile", "studentized"):
        raise ValueError(f"ci_method must be 'bca', 'percentile' or 'studentized', "
                         f"got {ci_method!r}")
    if z_interval not in ("fixed_sd", "resampled_sd"):
        raise ValueError(f"z_interval must be 'fixed_sd' or 'resampled_sd', got {z_interval!r}")
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}")
    n = c.shape[1]
    notes = []

    # ---- point estimates on the full data -----------------------------------------
    t_sum = t.sum()
    e_u = p.sum() / t_sum
    e_q = c.sum(axis=0) / t_sum
    c_mean, c_sd = float(e_q.mean()), float(e_q.std(ddof=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = e_u / c_mean
        z = (e_u - c_mean) / c_sd if c_sd > 0 else np.nan
        q_ratio = e_q / c_mean
        q_log2 = np.log2(q_ratio)
        q_z = (e_q - c_mean) / c_sd if c_sd > 0 else np.full(n, np.nan)
    log2r = float(np.log2(ratio)) if ratio > 0 else np.nan
    mc_p = monte_carlo_pvalue(e_u, e_q, alternative)

    # ---- paired per-sequence differences ------------------------------------------
    cbar = c.mean(axis=1)
    valid = t > 0
    d = np.zeros(s)
    d[valid] = (p[valid] - cbar[valid]) / t[valid]
    n_valid = int(valid.sum())
    if n_valid < s:
        notes.append(f"{s - n_valid} sequences with zero gradient energy left out of the "
                     "per-sequence test")
    if n_valid >= 1:
        sf = sign_flip_test(d[valid], n_permutations, seed, alternative)
    else:  # pragma: no cover - excluded by the total_energy check
        sf = PermutationResult(np.nan, np.nan, 0, False, alternative)
    j_corr = hedges_correction(n_valid - 1) if n_valid > 2 else np.nan
    d_mean = d[valid].mean()
    dc = np.where(valid, d - d_mean, 0.0)
    v = valid.astype(np.float64)

    # ---- bootstrap ----------------------------------------------------------------
    table = np.stack([p, cbar, t, v, dc, dc * dc], axis=1)
    resample_sd = z_interval == "resampled_sd"
    w_all = bootstrap_weights(s, n_bootstrap, seed, group_ids)
    if resample_sd:
        cc64 = c - cbar[:, None]
        cdtype = np.float32 if precision == "float32" else np.float64
        cc = cc64.astype(cdtype)
        w_all_c = w_all if cdtype == np.float64 else bootstrap_weights(s, n_bootstrap, seed,
                                                                       group_ids, cdtype)
    # z's denominator: the controls' sd of *sums* (so z = (x_p - x_cbar) / sd_j(x_cj))
    sd_full = c_sd * t_sum  # == sd_j(sum_s c_sj)
    reps = np.empty((n_bootstrap, 4))
    # (m, S) @ (S, B) is much faster than (B, S) @ (S, m) for skinny m in OpenBLAS
    x_all = (table.T @ w_all.T).T
    for i in range(0, n_bootstrap, _CHUNK):
        x = x_all[i:i + _CHUNK]
        if resample_sd:
            y = w_all_c[i:i + _CHUNK] @ cc
            sd_c = y.std(axis=1, ddof=1, dtype=np.float64)
        else:  # hold the control sd fixed as a fraction of the total energy
            sd_c = sd_full * x[:, 2] / t_sum
        x = np.column_stack([x, np.full(x.shape[0], d_mean)])
        reps[i:i + _CHUNK] = _stats_from_sums(x, sd_c, j_corr)
    full = np.column_stack([table.sum(axis=0)[None, :], [[d_mean]]])
    est = _stats_from_sums(full, np.array([sd_full]), j_corr)[0]
    # studentized (bootstrap-t) SEs of the ratio-of-sums metrics: fraction p/t, ratio p/cbar,
    # z = kappa (p - cbar)/t with kappa = t_sum / sd_full (fixed_sd only)
    methods = [ci_method] * 4
    stud_notes = [""] * 4
    se_est = [None] * 4
    se_reps = [None] * 4
    if ci_method == "studentized":
        methods[3] = "bca"
        stud_notes[3] = "studentized CI not available for hedges_g; BCa"
        if resample_sd:
            methods[2] = "bca"
            stud_notes[2] = "studentized CI not available with z_interval='resampled_sd'; BCa"
        if group_ids is not None:
            methods = ["bca"] * 4
            stud_notes = ["studentized CI needs sequence-level resampling; BCa with "
                          "group_ids"] * 4
    if "studentized" in methods:
        with np.errstate(invalid="ignore", divide="ignore"):
            th = np.array([e_u, p.sum() / cbar.sum(), e_u - c_mean])   # fraction, ratio, z/kappa
            e_f, e_r, e_z = p - th[0] * t, p - th[1] * cbar, (p - cbar) - th[2] * t
            ext = np.stack([e_f * e_f, e_f * t, t * t, e_r * e_r, e_r * cbar, cbar * cbar,
                            e_z * e_z, e_z * t], axis=1)
            xe = (ext.T @ w_all.T).T
            xe0 = ext.sum(axis=0)
            kappa = t_sum / sd_full
            theta_z = (x_all[:, 0] - x_all[:, 1]) / x_all[:, 2]
            specs = ((0, x_all[:, 2], reps[:, 0] - th[0], (0, 1, 2), t_sum, 1.0),
                     (1, x_all[:, 1], reps[:, 1] - th[1], (3, 4, 5), cbar.sum(), 1.0),
                     (2, x_all[:, 2], theta_z - th[2], (6, 7, 2), t_sum, kappa))
            for m, den_sum, delta, cols, den0, scale in specs:
                if methods[m] != "studentized":
                    continue
                i, j, k = cols
                se_reps[m] = scale * _ratio_se_from_sums(den_sum, delta, xe[:, i], xe[:, j],
                                                         xe[:, k], float(s))
                se_est[m] = float(scale * _ratio_se_from_sums(den0, 0.0, xe0[i], xe0[j],
                                                              xe0[k], float(s)))
    jack = None
    if "bca" in methods:
        codes = _group_codes(group_ids, s)
        if codes is None:
            tab_units, cc_units = table, (cc64 if resample_sd else None)
        else:
            g = codes.max() + 1
            tab_units = np.zeros((g, table.shape[1]))
            np.add.at(tab_units, codes, table)
            if resample_sd:
                cc_units = np.zeros((g, n))
                np.add.at(cc_units, codes, cc64)
        xj = table.sum(axis=0)[None, :] - tab_units
        if resample_sd:
            sdj = (cc64.sum(axis=0)[None, :] - cc_units).std(axis=1, ddof=1)
        else:
            sdj = sd_full * xj[:, 2] / t_sum
        xj = np.column_stack([xj, np.full(xj.shape[0], d_mean)])
        jack = _stats_from_sums(xj, sdj, j_corr)
    cis: list[BootstrapResult] = []
    for m in range(4):
        ci = ci_from_replicates(est[m], reps[:, m], None if jack is None else jack[:, m],
                                ci_level, methods[m], se=se_est[m], replicate_se=se_reps[m])
        if stud_notes[m]:
            ci = BootstrapResult(ci.estimate, ci.ci_low, ci.ci_high, ci.method,
                                 _join(stud_notes[m], ci.note), ci.se, ci.n_resamples,
                                 ci.ci_level)
        cis.append(ci)
    ci_f, ci_r, ci_z, ci_g = cis

    # ---- assemble -----------------------------------------------------------------
    def mc_row(name, estimate, ctrl, lo, hi, ci: BootstrapResult, note=""):
        cm, cs = _mean_sd(np.asarray(ctrl, dtype=np.float64))
        return MetricResult(name, float(estimate), cm, cs, float(lo), float(hi), ci.method,
                            _join(ci.note, note), float(mc_p), "monte_carlo", float(z),
                            ci.se)

    with np.errstate(invalid="ignore", divide="ignore"):
        l2lo = np.log2(ci_r.ci_low) if ci_r.ci_low > 0 else np.nan
        l2hi = np.log2(ci_r.ci_high) if ci_r.ci_high > 0 else np.nan
    rows = [
        mc_row("energy_fraction", e_u, e_q, ci_f.ci_low, ci_f.ci_high, ci_f),
        mc_row("energy_ratio", ratio, q_ratio, ci_r.ci_low, ci_r.ci_high, ci_r),
        mc_row("log2_energy_ratio", log2r, q_log2, l2lo, l2hi, ci_r,
               "CI = log2 of the ratio CI"),
        mc_row("z", z, q_z, ci_z.ci_low, ci_z.ci_high, ci_z),
    ]
    g_est = est[3] if n_valid > 2 else np.nan
    rows.append(MetricResult("hedges_g", float(g_est), np.nan, np.nan, ci_g.ci_low,
                             ci_g.ci_high, ci_g.method,
                             _join(ci_g.note, "paired g_z of per-sequence fractions"),
                             float(sf.p_value), "sign_flip", float(g_est), ci_g.se))
    base = rank / dim
    if oracle_fraction is None or not np.isfinite(oracle_fraction):
        rows.append(MetricResult("anisotropy_capture", np.nan, np.nan, np.nan, np.nan, np.nan,
                                 "none", "no oracle fraction given", float(mc_p),
                                 "monte_carlo", float(z)))
    elif not oracle_fraction > base:
        rows.append(MetricResult("anisotropy_capture", np.nan, np.nan, np.nan, np.nan, np.nan,
                                 "none", f"oracle fraction {oracle_fraction:.4g} <= k/d; "
                                 "capture undefined", float(mc_p), "monte_carlo", float(z)))
    else:
        ac = lambda f: anisotropy_capture(f, rank, dim, oracle_fraction)  # noqa: E731
        rows.append(mc_row("anisotropy_capture", ac(e_u), ac(e_q), ac(ci_f.ci_low),
                           ac(ci_f.ci_high), ci_f,
                           "CI = affine map of the fraction CI; oracle held fixed"))
    return EnergyAnalysis(tuple(rows), float(mc_p), sf, n, s, int(rank), int(dim),
                          int(n_bootstrap), float(ci_level), alternative, int(seed), e_q,
                          _join(*notes))


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


def analyze_metric_vs_controls(observed: float, control_values,
                               alternative: str = "greater") -> ControlComparison:
    """Compare a one-value-per-basis metric (e.g. ΔIsoScore*) with its control values.

    Monte-Carlo p-value (see :mod:`.montecarlo`), control mean and sd (ddof=1, NaN controls
    dropped) and ``z = (observed - mean) / sd``.
    """
    check_alternative(alternative)
    cv = np.asarray(control_values, dtype=np.float64).ravel()
    fin = cv[np.isfinite(cv)]
    mean = float(fin.mean()) if fin.size else np.nan
    sd = float(fin.std(ddof=1)) if fin.size > 1 else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (float(observed) - mean) / sd if sd > 0 else np.nan
    p = monte_carlo_pvalue(float(observed), cv, alternative) if cv.size else np.nan
    return ControlComparison(float(observed), mean, sd, float(z), float(p), int(fin.size),
                             alternative)
